//! Test data shared by the workspace's tests (format, converter, snapshotter, integration); the
//! layer code itself does not use it.

use crate::toc::{ChunkRef, Entry, EntryKind, Frame, FrameIdx};
use crate::Digest;

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

/// `n` frames of `clen` compressed and `ulen` uncompressed bytes, back to back; frame `i`'s
/// digest is the sha256 of `i` (little endian).
pub fn frames(n: u32, clen: u64, ulen: u64) -> Vec<Frame> {
    (0..n)
        .map(|i| Frame {
            offset: u64::from(i) * clen,
            clen,
            ulen,
            digest: Digest::sha256(&i.to_le_bytes()),
        })
        .collect()
}

/// [`file_entry`] `path` of one `len`-byte chunk per frame of `frames` (the file's `k`-th chunk
/// at the start of frame `frames[k]`).
pub fn chunked_file(path: &str, frames: &[u32], len: u64) -> Entry {
    let chunks = frames
        .iter()
        .enumerate()
        .map(|(k, f)| ChunkRef {
            file_offset: len * k as u64,
            frame: FrameIdx(*f),
            frame_offset: 0,
            len,
        })
        .collect();
    file_entry(path, len * frames.len() as u64, chunks)
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

    #[test]
    fn chunked_files_over_frames() {
        let f = frames(3, 10, 100);
        assert_eq!(f.iter().map(|f| f.offset).collect::<Vec<_>>(), [0, 10, 20]);
        assert_ne!(f[0].digest, f[1].digest);
        let e = chunked_file("a", &[2, 0], 100);
        assert_eq!(e.size, 200);
        assert_eq!(
            e.chunks
                .iter()
                .map(|c| (c.file_offset, c.frame.0))
                .collect::<Vec<_>>(),
            [(0, 2), (100, 0)]
        );
    }
}
