//! L1: verified, uncompressed frames in memory, bounded in bytes, LRU.
//!
//! Values are [`Bytes`], so eviction only drops the cache's reference: a reader holding a
//! frame keeps it alive, which is why L1 needs no pinning.

use super::lru::Lru;
use bytes::Bytes;
use parking_lot::Mutex;
use std::collections::HashMap;
use weenv_format::Digest;

/// Memory frame cache keyed by frame digest.
#[derive(Debug)]
pub struct MemoryCache {
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    lru: Lru<Digest>,
    values: HashMap<Digest, Bytes>,
}

impl MemoryCache {
    /// A cache holding at most `capacity` bytes (0 disables it).
    pub fn new(capacity: u64) -> Self {
        MemoryCache {
            inner: Mutex::new(Inner {
                lru: Lru::new(capacity),
                values: HashMap::new(),
            }),
        }
    }

    /// The frame, if cached (marks it recently used).
    pub fn get(&self, d: &Digest) -> Option<Bytes> {
        let mut g = self.inner.lock();
        let v = g.values.get(d).cloned()?;
        g.lru.touch(d);
        Some(v)
    }

    /// True if cached (does not touch).
    pub fn contains(&self, d: &Digest) -> bool {
        self.inner.lock().values.contains_key(d)
    }

    /// Caches a verified frame.
    pub fn insert(&self, d: Digest, data: Bytes) {
        let mut g = self.inner.lock();
        if g.lru.capacity() == 0 {
            return;
        }
        let evicted = g.lru.insert(d.clone(), data.len() as u64, false);
        g.values.insert(d, data);
        for e in evicted {
            g.values.remove(&e);
        }
    }

    /// Bytes held.
    pub fn used(&self) -> u64 {
        self.inner.lock().lru.used()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_and_lru() {
        let c = MemoryCache::new(10);
        let (a, b, x) = (
            Digest::sha256(b"a"),
            Digest::sha256(b"b"),
            Digest::sha256(b"x"),
        );
        c.insert(a.clone(), Bytes::from_static(b"aaaa"));
        c.insert(b.clone(), Bytes::from_static(b"bbbb"));
        assert!(c.get(&a).is_some());
        c.insert(x.clone(), Bytes::from_static(b"xxxx"));
        assert!(c.contains(&a) && c.contains(&x) && !c.contains(&b));
        assert_eq!(c.used(), 8);
    }
}
