//! L2: verified, uncompressed frames on the node's disk, content addressed by frame digest.
//!
//! Layout: `<dir>/<hex[0..2]>/<hex>`, so a frame shared by several layers is stored once.
//! Writes go to `<dir>/tmp/<hex>.<n>` and are renamed into place (atomic; a crash leaves only
//! temp files, removed at the next open). Frames are verified against their digest *before*
//! they are written, and trusted when loaded (only the length is checked against the TOC's
//! `ulen`): the directory is private to the daemon (0700, root), and hashing every cached
//! frame again on each read would cost ~2 ms per MiB on the hot path. A frame whose length
//! is wrong is deleted and treated as a miss.
//!
//! The size cap is enforced with [`Lru`]; entries being read or copied are pinned and never
//! evicted meanwhile. The index is rebuilt from the directory on open (oldest mtime first),
//! so the cache survives restarts.

use super::lru::Lru;
use super::CacheError;
use crate::metrics::Metrics;
use bytes::Bytes;
use parking_lot::Mutex;
use std::fs;
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use weenv_format::Digest;

/// The disk frame cache.
#[derive(Debug)]
pub struct DiskCache {
    dir: PathBuf,
    lru: Mutex<Lru<Digest>>,
    seq: AtomicU64,
    metrics: Arc<Metrics>,
}

/// Keeps a frame from being evicted while alive.
pub struct Pin<'a> {
    cache: &'a DiskCache,
    digest: Digest,
}

impl Drop for Pin<'_> {
    fn drop(&mut self) {
        let evicted = self.cache.lru.lock().unpin(&self.digest);
        self.cache.delete(evicted);
    }
}

impl Pin<'_> {
    /// Path of the pinned frame file.
    pub fn path(&self) -> PathBuf {
        self.cache.path_of(&self.digest)
    }
}

fn io_err<'a>(
    path: &'a Path,
    what: &'static str,
) -> impl FnOnce(std::io::Error) -> CacheError + 'a {
    move |source| CacheError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

impl DiskCache {
    /// Opens (creating) the cache in `dir` with a cap of `capacity` bytes, indexing the
    /// frames already there and removing leftover temp files.
    pub fn open(dir: &Path, capacity: u64, metrics: Arc<Metrics>) -> Result<Self, CacheError> {
        let mut b = fs::DirBuilder::new();
        b.recursive(true).mode(0o700);
        let tmp = dir.join("tmp");
        b.create(&tmp).map_err(io_err(&tmp, "create cache dir"))?;
        for e in fs::read_dir(&tmp)
            .map_err(io_err(&tmp, "list temp dir"))?
            .flatten()
        {
            let _ = fs::remove_file(e.path());
        }
        let mut found: Vec<(i64, Digest, u64)> = Vec::new();
        for sub in fs::read_dir(dir)
            .map_err(io_err(dir, "list cache dir"))?
            .flatten()
        {
            let name = sub.file_name();
            let name = name.to_string_lossy();
            if name.len() != 2 {
                continue;
            }
            let Ok(rd) = fs::read_dir(sub.path()) else {
                continue;
            };
            for f in rd.flatten() {
                let fname = f.file_name();
                let Ok(d) = format!("sha256:{}", fname.to_string_lossy()).parse::<Digest>() else {
                    continue;
                };
                if let Ok(md) = f.metadata() {
                    found.push((md.mtime(), d, md.len()));
                }
            }
        }
        found.sort();
        let mut lru = Lru::new(capacity);
        let mut evicted = Vec::new();
        for (_, d, len) in found {
            evicted.extend(lru.insert(d, len, false));
        }
        let c = DiskCache {
            dir: dir.to_path_buf(),
            lru: Mutex::new(lru),
            seq: AtomicU64::new(0),
            metrics,
        };
        c.delete(evicted);
        Ok(c)
    }

    /// Where the frame `d` lives.
    pub fn path_of(&self, d: &Digest) -> PathBuf {
        let hex = d.hex();
        self.dir.join(&hex[..2]).join(hex)
    }

    /// True if `d` is cached.
    pub fn contains(&self, d: &Digest) -> bool {
        self.lru.lock().contains(d)
    }

    /// Pins `d` if cached.
    pub fn pin(&self, d: &Digest) -> Option<Pin<'_>> {
        let mut g = self.lru.lock();
        if !g.pin(d) {
            return None;
        }
        g.touch(d);
        Some(Pin {
            cache: self,
            digest: d.clone(),
        })
    }

    /// Loads frame `d` if cached and `expected_len` long; a wrong-length file is dropped.
    pub fn get(&self, d: &Digest, expected_len: u64) -> Result<Option<Bytes>, CacheError> {
        let Some(pin) = self.pin(d) else {
            return Ok(None);
        };
        let path = pin.path();
        match fs::read(&path) {
            Ok(v) if v.len() as u64 == expected_len => Ok(Some(Bytes::from(v))),
            Ok(v) => {
                tracing::warn!(digest = %d, len = v.len(), expected_len, "cached frame has wrong length; dropping it");
                drop(pin);
                self.remove(d);
                Ok(None)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                drop(pin);
                self.lru.lock().remove(d);
                Ok(None)
            }
            Err(e) => Err(CacheError::Io {
                what: "read frame",
                path,
                source: e,
            }),
        }
    }

    /// Stores verified frame `d` (atomic: temp file + rename).
    pub fn put(&self, d: &Digest, data: &[u8]) -> Result<(), CacheError> {
        if self.contains(d) {
            return Ok(());
        }
        let path = self.path_of(d);
        if let Some(parent) = path.parent() {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)
                .map_err(io_err(parent, "create cache subdir"))?;
        }
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        let tmp = self.dir.join("tmp").join(format!("{}.{n}", d.hex()));
        let write = || -> std::io::Result<()> {
            let mut f = fs::File::create(&tmp)?;
            f.write_all(data)?;
            fs::rename(&tmp, &path)
        };
        if let Err(e) = write() {
            let _ = fs::remove_file(&tmp);
            return Err(CacheError::Io {
                what: "write frame",
                path,
                source: e,
            });
        }
        let evicted = self.lru.lock().insert(d.clone(), data.len() as u64, false);
        self.delete(evicted);
        Ok(())
    }

    /// Drops `d` from the cache.
    pub fn remove(&self, d: &Digest) {
        if self.lru.lock().remove(d).is_some() {
            let _ = fs::remove_file(self.path_of(d));
        }
    }

    fn delete(&self, evicted: Vec<Digest>) {
        for d in evicted {
            self.metrics.l2_evictions.fetch_add(1, Ordering::Relaxed);
            let _ = fs::remove_file(self.path_of(&d));
        }
    }

    /// Bytes held.
    pub fn used(&self) -> u64 {
        self.lru.lock().used()
    }

    /// Byte cap.
    pub fn capacity(&self) -> u64 {
        self.lru.lock().capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_get_evict_and_reopen() {
        let t = tempfile::tempdir().unwrap();
        let c = DiskCache::open(t.path(), 10, Arc::default()).unwrap();
        let (a, b) = (Digest::sha256(b"a"), Digest::sha256(b"b"));
        c.put(&a, b"aaaaaa").unwrap();
        assert_eq!(c.get(&a, 6).unwrap().as_deref(), Some(&b"aaaaaa"[..]));
        {
            let _pin = c.pin(&a).unwrap();
            c.put(&b, b"bbbbbb").unwrap();
            assert!(c.contains(&a), "pinned frame survives");
            assert!(!c.contains(&b));
        }
        assert!(!c.path_of(&b).exists());
        assert!(c.get(&a, 5).unwrap().is_none(), "wrong length is a miss");
        assert!(!c.path_of(&a).exists());
        c.put(&b, b"bbbb").unwrap();
        drop(c);
        let c = DiskCache::open(t.path(), 10, Arc::default()).unwrap();
        assert_eq!(c.get(&b, 4).unwrap().as_deref(), Some(&b"bbbb"[..]));
        assert_eq!(c.used(), 4);
    }
}
