//! Test helpers: weenv layers built from in-memory tars, and an in-memory blob source with a
//! request log, a gate (to hold requests in flight) and tampering.

#![cfg(test)] // test-only module: the whole file compiles only under `cargo test`
#![allow(clippy::unwrap_used)]

use async_trait::async_trait;
use bytes::Bytes;
use parking_lot::Mutex;
use std::sync::Arc;
use tokio::sync::Semaphore;
use weenv_format::writer::{write_layer, WriterOptions};
use weenv_format::{Digest, Toc};
use weenv_registry::{Attempt, ByteRange, ErrorKind, RangeSource, SourceError};

/// A tar entry for [`build_layer`].
pub enum T<'a> {
    File(&'a str, Vec<u8>),
    Dir(&'a str),
    Link(&'a str, &'a str),
    Symlink(&'a str, &'a str),
}

/// A tar archive of `entries`.
pub fn tar_of(entries: &[T<'_>]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_gnu();
        h.set_mtime(1_700_000_000);
        match e {
            T::File(p, data) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(0o644);
                h.set_size(data.len() as u64);
                b.append_data(&mut h, p, &data[..]).unwrap(); // ok: test code
            }
            T::Dir(p) => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o755);
                h.set_size(0);
                b.append_data(&mut h, p, &[][..]).unwrap(); // ok: test code
            }
            T::Link(p, target) => {
                h.set_entry_type(tar::EntryType::Link);
                h.set_size(0);
                b.append_link(&mut h, p, target).unwrap(); // ok: test code
            }
            T::Symlink(p, target) => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_mode(0o777);
                h.set_size(0);
                b.append_link(&mut h, p, target).unwrap(); // ok: test code
            }
        }
    }
    b.into_inner().unwrap() // ok: test code
}

/// Converts a tar into (blob digest, TOC, blob) with small frames (`frame_size`).
pub fn build_layer(tar: &[u8], frame_size: u64) -> (Digest, Toc, Vec<u8>) {
    let mut blob = Vec::new();
    let opts = WriterOptions {
        frame_size,
        small_file_threshold: frame_size / 2,
        chunk_size: frame_size,
        ..WriterOptions::default()
    };
    let s = write_layer(tar, &mut blob, &opts).unwrap(); // ok: test code
    let toc = weenv_format::reader::LayerReader::open(blob.clone(), None)
        .unwrap() // ok: test code
        .into_toc();
    (s.blob_digest, toc, blob)
}

/// Deterministic poorly compressible bytes (one generator for every test: `weenv_format`).
pub use weenv_format::testdata::noise;

/// In-memory blob with a request log and an optional gate.
pub struct MemSource {
    pub data: Mutex<Vec<u8>>,
    pub log: Mutex<Vec<(u64, u64)>>,
    gate: Option<Arc<Semaphore>>,
}

impl MemSource {
    pub fn new(data: Vec<u8>) -> Arc<Self> {
        Arc::new(MemSource {
            data: Mutex::new(data),
            log: Mutex::new(Vec::new()),
            gate: None,
        })
    }

    /// A source whose requests wait for a permit of the returned semaphore.
    pub fn gated(data: Vec<u8>) -> (Arc<Self>, Arc<Semaphore>) {
        let g = Arc::new(Semaphore::new(0));
        (
            Arc::new(MemSource {
                data: Mutex::new(data),
                log: Mutex::new(Vec::new()),
                gate: Some(g.clone()),
            }),
            g,
        )
    }

    pub fn requests(&self) -> Vec<(u64, u64)> {
        self.log.lock().clone()
    }
}

#[async_trait]
impl RangeSource for MemSource {
    async fn try_read(&self, range: ByteRange, _: Attempt) -> Result<Bytes, SourceError> {
        let (offset, len) = (range.offset, range.len);
        self.log.lock().push((offset, len));
        if let Some(g) = &self.gate {
            g.acquire().await.unwrap().forget(); // ok: test code
        }
        let d = self.data.lock();
        let s = offset as usize;
        let e = (offset + len) as usize;
        d.get(s..e)
            .map(Bytes::copy_from_slice)
            .ok_or_else(|| SourceError::new(ErrorKind::Terminal, "past end"))
    }

    fn size(&self) -> Option<u64> {
        Some(self.data.lock().len() as u64)
    }
}

/// A source that returns bytes with one bit flipped for the first `bad` reads (a flaky
/// network, cache or mirror), and records which reads asked to bypass caches.
pub struct CorruptFirst {
    pub inner: Arc<MemSource>,
    pub bad: std::sync::atomic::AtomicUsize,
    /// `Attempt::fresh` of each attempt.
    pub fresh: Mutex<Vec<bool>>,
}

impl CorruptFirst {
    pub fn new(inner: Arc<MemSource>, bad: usize) -> Arc<Self> {
        Arc::new(CorruptFirst {
            inner,
            bad: bad.into(),
            fresh: Mutex::new(Vec::new()),
        })
    }
}

#[async_trait]
impl RangeSource for CorruptFirst {
    async fn try_read(&self, range: ByteRange, attempt: Attempt) -> Result<Bytes, SourceError> {
        use std::sync::atomic::Ordering;
        self.fresh.lock().push(attempt.fresh);
        let b = self.inner.try_read(range, attempt).await?;
        let left = self.bad.load(Ordering::SeqCst);
        if left == 0 || b.is_empty() {
            return Ok(b);
        }
        self.bad.store(left - 1, Ordering::SeqCst);
        let mut v = b.to_vec();
        let mid = v.len() / 2;
        v[mid] ^= 0x10;
        Ok(Bytes::from(v))
    }

    fn size(&self) -> Option<u64> {
        self.inner.size()
    }
    fn name(&self) -> String {
        "corrupt-first".into()
    }
}

/// A layer of six 3000-byte noise files in 4 KiB frames, and a frame store with a fresh L2
/// (in the returned temp dir) and 1 MiB L1: (toc, blob, store, metrics, dir).
pub fn six_file_store() -> (
    Arc<Toc>,
    Vec<u8>,
    Arc<super::FrameStore>,
    Arc<crate::metrics::Metrics>,
    tempfile::TempDir,
) {
    use crate::cache::{DiskCache, MemoryCache};
    let files: Vec<(String, Vec<u8>)> = (0..6).map(|i| (format!("f{i}"), noise(i, 3000))).collect();
    let entries: Vec<T<'_>> = files.iter().map(|(p, d)| T::File(p, d.clone())).collect();
    let (_, toc, blob) = build_layer(&tar_of(&entries), 4096);
    let dir = tempfile::tempdir().unwrap(); // ok: test code
    let metrics = Arc::new(crate::metrics::Metrics::new());
    let l2 = DiskCache::open(dir.path(), 1 << 30, metrics.clone()).unwrap(); // ok: test code
    let store = Arc::new(super::FrameStore::new(
        MemoryCache::new(1 << 20),
        l2,
        metrics.clone(),
        super::plan::PlanLimits::default(),
    ));
    (Arc::new(toc), blob, store, metrics, dir)
}
