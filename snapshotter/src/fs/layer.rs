//! A mounted layer and the inode numbering of the one FUSE session.
//!
//! Inode numbers: `1` is the mount root (one directory per layer, named by digest hex);
//! a layer in slot `s` (stable per digest for the life of the process) owns
//! `((s + 1) << 32) | (node + 1)`, so its root directory is `((s + 1) << 32) | 1`. Numbers are
//! stable while the daemon runs and never reused for another digest.

use super::inode::LayerTable;
use crate::fetch::{BlobSource, FillProgress};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use weenv_format::{Digest, FrameIdx, Toc};

/// Inode number of the mount root.
pub const ROOT_INO: u64 = 1;

/// FUSE inode number of `node` in layer slot `slot`.
pub fn encode_ino(slot: u32, node: u32) -> u64 {
    ((u64::from(slot) + 1) << 32) | (u64::from(node) + 1)
}

/// (slot, node) of a layer inode; `None` for the mount root or invalid numbers.
pub fn decode_ino(ino: u64) -> Option<(u32, u32)> {
    let hi = ino >> 32;
    let lo = ino & 0xffff_ffff;
    if hi == 0 || lo == 0 {
        return None;
    }
    Some((u32::try_from(hi - 1).ok()?, u32::try_from(lo - 1).ok()?))
}

/// One layer exposed in the FUSE session.
pub struct Layer {
    pub digest: Digest,
    pub slot: u32,
    pub toc: Arc<Toc>,
    pub table: LayerTable,
    pub source: Arc<dyn BlobSource>,
    pub fill: Arc<FillProgress>,
    /// Per node: read-ahead (files) or directory prefetch (dirs) already issued.
    touched: Box<[AtomicBool]>,
    /// Per file node: read-ahead horizon (see [`super::readahead`]).
    ra_horizon: Box<[AtomicU32]>,
    /// Blob-order scan detection across files (see [`super::readahead::scan_step`]).
    pub scan: parking_lot::Mutex<super::readahead::ScanState>,
}

impl Layer {
    /// Builds the inode table for `toc`.
    pub fn new(digest: Digest, slot: u32, toc: Arc<Toc>, source: Arc<dyn BlobSource>) -> Self {
        let table = LayerTable::build(&toc);
        let table_len = table.nodes.len();
        let touched = (0..table_len).map(|_| AtomicBool::new(false)).collect();
        Layer {
            digest,
            slot,
            toc,
            table,
            source,
            fill: Arc::new(FillProgress::default()),
            touched,
            ra_horizon: (0..table_len).map(|_| AtomicU32::new(0)).collect(),
            scan: parking_lot::Mutex::new(super::readahead::ScanState::default()),
        }
    }

    /// Marks `node` touched; true the first time.
    pub fn first_touch(&self, node: u32) -> bool {
        self.touched
            .get(node as usize)
            .is_some_and(|t| !t.swap(true, Ordering::Relaxed))
    }

    /// Read-ahead horizon of file `node`.
    pub fn ra_horizon(&self, node: u32) -> Option<&AtomicU32> {
        self.ra_horizon.get(node as usize)
    }

    /// Root inode number of this layer.
    pub fn root_ino(&self) -> u64 {
        encode_ino(self.slot, 0)
    }

    /// Frames holding the payload of file `node`, in file order, deduplicated.
    pub fn file_frames(&self, node: u32) -> Vec<FrameIdx> {
        let mut v: Vec<FrameIdx> = Vec::new();
        if let Some(n) = self.table.node(node) {
            for c in &n.chunks {
                if v.last() != Some(&c.frame) {
                    v.push(c.frame);
                }
            }
        }
        v
    }

    /// Uncompressed bytes of all frames.
    pub fn bytes_total(&self) -> u64 {
        self.toc.frames.iter().map(|f| f.ulen).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ino_roundtrip() {
        assert_eq!(decode_ino(ROOT_INO), None);
        assert_eq!(decode_ino(encode_ino(0, 0)), Some((0, 0)));
        assert_eq!(decode_ino(encode_ino(7, 123_456)), Some((7, 123_456)));
        assert_ne!(encode_ino(0, 0), ROOT_INO);
        assert_eq!(decode_ino(1 << 32), None);
    }
}
