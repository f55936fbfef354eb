//! `BlobRangeReader`: the synchronous [`weenv_format::RangeRead`] over a registry blob, for
//! code without a runtime (CLIs, the format reader, FUSE worker threads).
//!
//! Each call spawns the request on the runtime behind the stored [`tokio::runtime::Handle`]
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
//! `size()` costs one HEAD the first time (cached), unless a size was given with
//! [`BlobRangeReader::with_size`] (e.g. from the layer descriptor). `read_at` is one ranged GET.

use crate::client::Client;
use crate::reference::Reference;
use std::future::Future;
use std::io;
use std::sync::OnceLock;
use tokio::runtime::{Handle, RuntimeFlavor};
use weenv_format::{Digest, RangeRead};

/// Random access to one registry blob through [`Client::get_blob_range`].
#[derive(Debug, Clone)]
pub struct BlobRangeReader {
    client: Client,
    handle: Handle,
    reference: Reference,
    digest: Digest,
    size: OnceLock<u64>,
}

impl BlobRangeReader {
    /// Reader for blob `digest` in `reference`'s repository; requests run on `handle`.
    pub fn new(client: Client, handle: Handle, reference: Reference, digest: Digest) -> Self {
        BlobRangeReader {
            client,
            handle,
            reference,
            digest,
            size: OnceLock::new(),
        }
    }

    /// Use a known size (from the descriptor) so `size()` sends no HEAD.
    pub fn with_size(self, size: u64) -> Self {
        let _ = self.size.set(size);
        self
    }

    /// The blob digest.
    pub fn digest(&self) -> &Digest {
        &self.digest
    }

    fn block<T: Send + 'static>(
        &self,
        fut: impl Future<Output = io::Result<T>> + Send + 'static,
    ) -> io::Result<T> {
        let in_current_thread_rt = Handle::try_current().map(|h| h.runtime_flavor());
        if let Ok(RuntimeFlavor::CurrentThread) = in_current_thread_rt {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "BlobRangeReader called on a current-thread tokio runtime; call it from a plain thread, spawn_blocking or a multi-thread runtime",
            ));
        }
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.handle.spawn(async move {
            let _ = tx.send(fut.await);
        });
        let wait = move || {
            rx.recv().unwrap_or_else(|_| {
                Err(io::Error::other(
                    "registry request task was dropped (runtime shut down?)",
                ))
            })
        };
        match in_current_thread_rt {
            Ok(_) => tokio::task::block_in_place(wait),
            Err(_) => wait(),
        }
    }
}

fn to_io(e: crate::RegistryError) -> io::Error {
    let kind = match &e {
        crate::RegistryError::NotFound { .. } => io::ErrorKind::NotFound,
        crate::RegistryError::BadRange { .. } => io::ErrorKind::UnexpectedEof,
        crate::RegistryError::DigestMismatch { .. } => io::ErrorKind::InvalidData,
        _ => io::ErrorKind::Other,
    };
    io::Error::new(kind, e)
}

impl RangeRead for BlobRangeReader {
    fn size(&self) -> io::Result<u64> {
        if let Some(s) = self.size.get() {
            return Ok(*s);
        }
        let (c, r, d) = (
            self.client.clone(),
            self.reference.clone(),
            self.digest.clone(),
        );
        let size = self.block(async move {
            match c.head_blob(&r, &d).await {
                Ok(Some(s)) => Ok(s),
                Ok(None) => Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("blob {d} not found in {r}"),
                )),
                Err(e) => Err(to_io(e)),
            }
        })?;
        let _ = self.size.set(size);
        Ok(size)
    }

    fn read_at(&self, offset: u64, len: u64) -> io::Result<Vec<u8>> {
        let (c, r, d) = (
            self.client.clone(),
            self.reference.clone(),
            self.digest.clone(),
        );
        self.block(async move {
            c.get_blob_range(&r, &d, offset, len)
                .await
                .map(|b| b.to_vec())
                .map_err(to_io)
        })
    }
}
