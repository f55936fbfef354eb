//! [`SyncRangeReader`]: the synchronous [`weenv_format::RangeRead`] over any async
//! [`RangeSource`], for code without a runtime (CLIs, the format reader, FUSE worker threads).
//! [`BlobRangeReader`] is it over a registry blob ([`RegistryRangeSource`]). It adds no retry
//! of its own: each call is one [`RangeSource::read`] (one retry budget).
//!
//! Each call spawns the read on the runtime behind the stored [`tokio::runtime::Handle`]
//! and blocks the calling thread on a channel until it completes. Allowed callers:
//! - plain threads outside any runtime (std::thread, rayon, FUSE loops): just block;
//! - tasks on a **multi-thread** runtime: the wait runs inside `block_in_place`, so the
//!   worker's other tasks move to another worker (no deadlock);
//! - `spawn_blocking` closures of a multi-thread runtime.
//!
//! Not allowed: the thread driving a **current-thread** runtime (it would wait for a task
//! only it can run); such calls fail with `io::ErrorKind::Unsupported` instead of hanging.
//! The stored handle should belong to a multi-thread runtime.
//!
//! `size()` is [`RangeSource::resolve_size`]: for a registry blob one HEAD the first time
//! (cached), unless a size was given with [`BlobRangeReader::with_size`] (e.g. from the layer
//! descriptor). `read_at` is one [`RangeSource::read`].

use crate::client::Client;
use crate::error::SourceError;
use crate::reference::Reference;
use crate::source::{ByteRange, RangeSource, RegistryRangeSource};
use std::future::Future;
use std::io;
use std::sync::Arc;
use tokio::runtime::{Handle, RuntimeFlavor};
use weenv_format::{Digest, RangeRead};

/// Blocking random access over an async [`RangeSource`].
#[derive(Debug)]
pub struct SyncRangeReader<S: ?Sized> {
    handle: Handle,
    source: Arc<S>,
}

impl<S: ?Sized> Clone for SyncRangeReader<S> {
    fn clone(&self) -> Self {
        SyncRangeReader {
            handle: self.handle.clone(),
            source: self.source.clone(),
        }
    }
}

/// Random access to one registry blob.
pub type BlobRangeReader = SyncRangeReader<RegistryRangeSource>;

impl BlobRangeReader {
    /// Reader for blob `digest` in `reference`'s repository; requests run on `handle`.
    pub fn new(client: Client, handle: Handle, reference: Reference, digest: Digest) -> Self {
        SyncRangeReader::over(
            Arc::new(RegistryRangeSource::new(client, reference, digest, None)),
            handle,
        )
    }

    /// Use a known size (from the descriptor) so `size()` sends no HEAD.
    pub fn with_size(self, size: u64) -> Self {
        self.source.set_size(size);
        self
    }

    /// The blob digest.
    pub fn digest(&self) -> &Digest {
        self.source.digest()
    }
}

impl<S: RangeSource + ?Sized + 'static> SyncRangeReader<S> {
    /// Blocking reads of `source`, run on `handle`.
    pub fn over(source: Arc<S>, handle: Handle) -> Self {
        SyncRangeReader { handle, source }
    }

    /// The async source.
    pub fn source(&self) -> &Arc<S> {
        &self.source
    }

    fn block<T: Send + 'static>(
        &self,
        fut: impl Future<Output = Result<T, SourceError>> + Send + 'static,
    ) -> io::Result<T> {
        let in_current_thread_rt = Handle::try_current().map(|h| h.runtime_flavor());
        if let Ok(RuntimeFlavor::CurrentThread) = in_current_thread_rt {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "SyncRangeReader called on a current-thread tokio runtime; call it from a plain thread, spawn_blocking or a multi-thread runtime",
            ));
        }
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.handle.spawn(async move {
            let _ = tx.send(fut.await.map_err(|e| io::Error::new(e.io_kind(), e)));
        });
        let wait = move || {
            rx.recv().unwrap_or_else(|_| {
                Err(io::Error::other(
                    "range read task was dropped (runtime shut down?)",
                ))
            })
        };
        match in_current_thread_rt {
            Ok(_) => tokio::task::block_in_place(wait),
            Err(_) => wait(),
        }
    }
}

impl<S: RangeSource + ?Sized + 'static> RangeRead for SyncRangeReader<S> {
    fn size(&self) -> io::Result<u64> {
        if let Some(s) = self.source.size() {
            return Ok(s);
        }
        let src = self.source.clone();
        self.block(async move { src.resolve_size().await })
    }

    fn read_at(&self, offset: u64, len: u64) -> io::Result<Vec<u8>> {
        let src = self.source.clone();
        self.block(async move {
            src.read(ByteRange::new(offset, len))
                .await
                .map(|b| b.to_vec())
        })
    }
}
