//! Test data shared by the workspace's tests (format, converter, snapshotter, integration); the
//! layer code itself does not use it.

use crate::toc::{ChunkRef, Entry, EntryKind};

/// Deterministic poorly compressible bytes (xorshift) for `seed`.
pub fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A root-owned 0644 regular file `path` of `size` bytes made of `chunks`; every other field is
/// zero or empty (override them with struct update syntax).
pub fn file_entry(path: &str, size: u64, chunks: Vec<ChunkRef>) -> Entry {
    Entry {
        path: path.to_string(),
        header: 0,
        kind: EntryKind::File,
        mode: 0o644,
        uid: 0,
        gid: 0,
        mtime: 0,
        mtime_nsec: 0,
        size,
        link: None,
        devmajor: 0,
        devminor: 0,
        xattrs: Default::default(),
        chunks,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn noise_is_deterministic_per_seed() {
        assert_eq!(noise(7, 64), noise(7, 64));
        assert_ne!(noise(7, 64), noise(8, 64));
        assert_eq!(noise(1, 10).len(), 10);
    }
}
