//! A mounted layer and the inode numbering of the one FUSE session.
//!
//! Inode numbers: `1` is the mount root (one directory per layer, named by digest hex);
//! a layer in slot `s` (stable per digest for the life of the process) owns
//! `((s + 1) << 32) | (node + 1)`, so its root directory is `((s + 1) << 32) | 1`. Numbers are
//! stable while the daemon runs and never reused for another digest; with `fuse.handover`
//! the keepers record every slot, so they stay the same across daemon restarts.
//!
//! Every number is below 2^[`INO_BITS`] (slots below [`MAX_SLOTS`]): overlayfs with `xino=on`
//! (see [`crate::mounts::OverlayFeatures`]) puts its filesystem id into the top bits of a
//! lower's inode numbers, and maps only numbers whose top bits are free; a number that uses
//! them falls back to a non-persistent directory inode number, which readdir does not report.

use super::inode::{LayerTable, TableError};
use crate::fetch::{FillProgress, PrefetchProgress, RangeSource};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use weenv_format::{ChunkRef, Digest, Entry, FrameIdx, Toc};

/// Inode number of the mount root.
pub const ROOT_INO: u64 = 1;

/// FUSE inode numbers use the low `INO_BITS` bits: overlayfs takes the top
/// [`overlay_xino_bits`] bits, at most 10 (for [`OVL_MAX_STACK`] lowers on as many
/// filesystems).
pub const INO_BITS: u32 = 54;

/// Layer slots a session can hand out: `(MAX_SLOTS << 32) | u32::MAX < 2^INO_BITS`.
pub const MAX_SLOTS: u32 = (1 << (INO_BITS - 32)) - 1;

/// Lower layers one overlay mount may have (`OVL_MAX_STACK`, `fs/overlayfs/params.h`).
pub const OVL_MAX_STACK: u32 = 500;

/// Top inode bits overlayfs takes with `xino=on` for an overlay whose layers lie on `numfs`
/// filesystems (the upper's counted, present or not) when a lower is not a 32-bit-inode
/// filesystem, as FUSE is: `ilog2(numfs - 1) + 2` (`ovl_get_layers`, Linux 5.7+; 4.17–5.6
/// took one bit less). Pure.
pub fn overlay_xino_bits(numfs: u32) -> u32 {
    if numfs <= 1 {
        return 0;
    }
    (numfs - 1).ilog2() + 2
}

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

/// A file read: path relative to the layer root and the byte ranges read (empty: all).
pub type FileRanges = (String, Vec<(u64, u64)>);

/// Files in first-read order, and per file the chunk indices read.
type AccessLog = (
    Vec<u32>,
    std::collections::HashMap<u32, std::collections::BTreeSet<u32>>,
);

/// Byte ranges `(offset, len)` covered by chunks `read` (indices into `chunks`), adjacent
/// chunks merged; empty when every chunk was read (the whole file). Pure.
pub fn chunk_ranges(
    chunks: &[ChunkRef],
    read: &std::collections::BTreeSet<u32>,
) -> Vec<(u64, u64)> {
    if read.len() >= chunks.len() {
        return Vec::new();
    }
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &i in read {
        let Some(c) = chunks.get(i as usize) else {
            continue;
        };
        match out.last_mut() {
            Some((o, l)) if *o + *l == c.file_offset => *l += c.len,
            _ => out.push((c.file_offset, c.len)),
        }
    }
    out
}

/// One layer exposed in the FUSE session.
pub struct Layer {
    pub digest: Digest,
    pub slot: u32,
    /// The TOC's frames (the stream mapping) and nothing else: its `entries` are EMPTY, the
    /// entries live in `table` only (compact; see [`Layer::toc_entry`]).
    pub frames: Arc<Toc>,
    pub table: LayerTable,
    /// Entries the TOC listed.
    pub entries: usize,
    /// Sum of the sizes of the TOC's regular files.
    pub file_bytes: u64,
    pub source: Arc<dyn RangeSource>,
    pub fill: Arc<FillProgress>,
    /// Per node: read-ahead (files) or directory prefetch (dirs) already issued.
    touched: Box<[AtomicBool]>,
    /// Per file node: read-ahead horizon (see [`super::readahead`]).
    ra_horizon: Box<[AtomicU32]>,
    /// Blob-order scan detection across files (see [`super::readahead::scan_step`]).
    pub scan: parking_lot::Mutex<super::readahead::ScanState>,
    /// File nodes in the order they were first read (or opened with passthrough), and the
    /// chunk indices read of each: the start-up profile `weenv profile` prints.
    access_log: parking_lot::Mutex<AccessLog>,
    /// Start-up prefetch of this layer (frames named by the image manifest).
    pub prefetch: Arc<PrefetchProgress>,
    /// Frames a start-up prefetch was started for.
    prefetch_claimed: parking_lot::Mutex<std::collections::BTreeSet<FrameIdx>>,
    /// Quarantine, claimed diff_id, checks done (see [`super::trust`]).
    pub trust: super::trust::LayerTrust,
    /// The layer's native tree exists in the disk cache (see [`super::native`]).
    pub native: AtomicBool,
    /// No node has an xattr (nor is an opaque directory): the layer may be served by the
    /// plain session (see [`super::SessionKind::Plain`]).
    pub plain: bool,
}

impl Layer {
    /// Builds the compact inode table for `toc`, then drops the TOC's entries (only its
    /// frames are kept).
    pub fn new(
        digest: Digest,
        slot: u32,
        mut toc: Toc,
        source: Arc<dyn RangeSource>,
    ) -> Result<Self, TableError> {
        let table = LayerTable::build(&toc)?;
        let entries = toc.entries.len();
        let file_bytes = toc
            .entries
            .iter()
            .filter(|e| e.kind == weenv_format::EntryKind::File)
            .map(|e| e.size)
            .sum();
        toc.entries = Vec::new();
        let table_len = table.len();
        let plain = !table.has_xattrs();
        let touched = (0..table_len).map(|_| AtomicBool::new(false)).collect();
        Ok(Layer {
            digest,
            slot,
            frames: Arc::new(toc),
            table,
            entries,
            file_bytes,
            source,
            fill: Arc::new(FillProgress::default()),
            touched,
            ra_horizon: (0..table_len).map(|_| AtomicU32::new(0)).collect(),
            scan: parking_lot::Mutex::new(super::readahead::ScanState::default()),
            access_log: parking_lot::Mutex::new(AccessLog::default()),
            prefetch: Arc::new(PrefetchProgress::default()),
            prefetch_claimed: parking_lot::Mutex::new(std::collections::BTreeSet::new()),
            trust: super::trust::LayerTrust::new(table_len),
            native: AtomicBool::new(false),
            plain,
        })
    }

    /// True if reads and new mounts may use the layer's native tree: it exists, the layer
    /// passed its completion check and is not quarantined.
    pub fn native_ok(&self) -> bool {
        self.native.load(std::sync::atomic::Ordering::Acquire)
            && self.trust.verified()
            && !self.quarantined()
    }

    /// The TOC entry node `node` was made from, rebuilt from the compact table (for checks
    /// against the tar header and rare paths; allocates).
    pub fn toc_entry(&self, node: u32) -> Option<Entry> {
        self.table.toc_entry(node)
    }

    /// Heap bytes of this layer's in-memory TOC: the compact table, the frames and the
    /// per-node read state.
    pub fn toc_bytes(&self) -> u64 {
        let per_node = std::mem::size_of::<AtomicBool>() + std::mem::size_of::<AtomicU32>();
        self.table.heap_bytes()
            + (self.frames.frames.capacity() * std::mem::size_of::<weenv_format::Frame>()) as u64
            + (self.touched.len() * per_node) as u64
    }

    /// Quarantines the layer: from now on every read of its files fails with EIO; the reason
    /// is logged with the layer digest, counted and persisted (first reason wins).
    pub fn quarantine(&self, reason: String) {
        self.trust.quarantine(&self.digest, reason);
    }

    /// True once the layer is quarantined.
    pub fn quarantined(&self) -> bool {
        self.trust.quarantined()
    }

    /// The frames of `wanted` no start-up prefetch was started for yet (now claimed).
    pub fn claim_prefetch(&self, wanted: &[FrameIdx]) -> Vec<FrameIdx> {
        let mut claimed = self.prefetch_claimed.lock();
        wanted
            .iter()
            .copied()
            .filter(|f| claimed.insert(*f))
            .collect()
    }

    /// Records that `len` bytes at `offset` of file `node` were read: the file joins the
    /// access log the first time, and the chunks the range touches are remembered.
    pub fn note_read(&self, node: u32, offset: u64, len: u64) {
        let Some(n) = self.table.node(node) else {
            return;
        };
        let chunks = n.chunks();
        let end = offset.saturating_add(len).min(n.size());
        let first = chunks.partition_point(|c| c.file_offset.saturating_add(c.len) <= offset);
        let last = chunks.partition_point(|c| c.file_offset < end);
        self.log_chunks(node, first..last.max(first));
    }

    /// Records that file `node` was opened for passthrough (the kernel reads it without us):
    /// the whole file counts as read.
    pub fn note_open(&self, node: u32) {
        let chunks = self.table.node(node).map_or(0, |n| n.chunk_count());
        self.log_chunks(node, 0..chunks);
    }

    fn log_chunks(&self, node: u32, chunks: std::ops::Range<usize>) {
        let mut log = self.access_log.lock();
        if !log.1.contains_key(&node) {
            log.0.push(node);
        }
        let set = log.1.entry(node).or_default();
        for c in chunks {
            set.insert(c as u32);
        }
    }

    /// The files read since the layer was added or the log was last reset, in first-read
    /// order: path relative to the layer root, and the byte ranges read (chunk granularity;
    /// empty when every chunk was read).
    pub fn accessed(&self) -> Vec<FileRanges> {
        let (order, chunks) = {
            let log = self.access_log.lock();
            (log.0.clone(), log.1.clone())
        };
        order
            .into_iter()
            .filter_map(|n| {
                let node = self.table.node(n)?;
                let path = self.table.path_of(n)?;
                let read = chunks.get(&n).cloned().unwrap_or_default();
                Some((path, chunk_ranges(&node.chunks(), &read)))
            })
            .collect()
    }

    /// File bytes read since the layer was added or the log was last reset (chunk
    /// granularity: a chunk counts whole once any byte of it was read; a passthrough open
    /// counts the whole file).
    pub fn bytes_read(&self) -> u64 {
        let log = self.access_log.lock();
        log.1
            .iter()
            .filter_map(|(n, read)| {
                let chunks = self.table.node(*n)?.chunks();
                Some(
                    read.iter()
                        .filter_map(|i| chunks.get(*i as usize))
                        .map(|c| c.len)
                        .sum::<u64>(),
                )
            })
            .sum()
    }

    /// Forgets the access log (to record a new workload).
    pub fn reset_access(&self) {
        *self.access_log.lock() = AccessLog::default();
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
            for c in &n.chunks() {
                if v.last() != Some(&c.frame) {
                    v.push(c.frame);
                }
            }
        }
        v
    }

    /// Uncompressed bytes of all frames.
    pub fn bytes_total(&self) -> u64 {
        self.frames.frames.iter().map(|f| f.ulen).sum()
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

    #[test]
    fn inode_numbers_leave_overlayfs_its_xino_bits() {
        // An upper on the disk plus the full and the plain FUSE session: 3 bits.
        assert_eq!(overlay_xino_bits(3), 3);
        assert_eq!(overlay_xino_bits(2), 2, "upper + one FUSE session");
        assert_eq!(overlay_xino_bits(5), 4);
        // The most any overlay can take: every one of 500 lowers on its own filesystem.
        let most = overlay_xino_bits(OVL_MAX_STACK + 1);
        assert_eq!(most, 10);
        assert!(INO_BITS + most <= 64);
        // The largest number a session hands out fits below the bits overlayfs takes.
        let top = encode_ino(MAX_SLOTS - 1, u32::MAX - 1);
        assert!(top < 1u64 << INO_BITS, "{top:#x}");
        assert_eq!(top >> (64 - most), 0);
        assert_eq!(decode_ino(top), Some((MAX_SLOTS - 1, u32::MAX - 1)));
        // The numbers are a pure function of (slot, node): what a keeper records is enough
        // for a successor to hand the kernel the same numbers.
        assert_eq!(encode_ino(3, 9), (4 << 32) | 10);
    }

    #[test]
    fn access_log_keeps_first_read_order_and_resets() {
        use crate::fetch::testutil::{build_layer, tar_of, MemSource, T};
        let (_, toc, blob) = build_layer(
            &tar_of(&[
                T::Dir("usr"),
                T::File("usr/a", b"aaaa".to_vec()),
                T::File("b", b"bb".to_vec()),
            ]),
            4096,
        );
        let src: Arc<dyn RangeSource> = MemSource::gated(blob).0;
        let l = Layer::new(Digest::sha256(b"l"), 0, toc, src).unwrap();
        let a = l.table.resolve("usr/a").unwrap();
        let b = l.table.resolve("b").unwrap();
        l.note_read(b, 0, 2);
        l.note_read(a, 1, 1);
        l.note_read(b, 0, 1);
        let whole = |p: &str| (p.to_string(), Vec::new());
        assert_eq!(l.accessed(), vec![whole("b"), whole("usr/a")]);
        assert_eq!(l.bytes_read(), 6, "b whole (2) + usr/a's one chunk (4)");
        l.reset_access();
        assert!(l.accessed().is_empty());
        assert_eq!(l.bytes_read(), 0);
        l.note_open(a);
        assert_eq!(l.accessed(), vec![whole("usr/a")]);
        assert_eq!(l.bytes_read(), 4);
    }

    #[test]
    fn chunk_ranges_merge_adjacent_reads() {
        let c = |o: u64, l: u64| ChunkRef {
            file_offset: o,
            frame: FrameIdx(0),
            frame_offset: 0,
            len: l,
        };
        let chunks = vec![c(0, 10), c(10, 10), c(20, 10), c(30, 5)];
        let set = |v: &[u32]| {
            v.iter()
                .copied()
                .collect::<std::collections::BTreeSet<u32>>()
        };
        assert_eq!(
            chunk_ranges(&chunks, &set(&[0, 1, 3])),
            vec![(0, 20), (30, 5)]
        );
        assert_eq!(chunk_ranges(&chunks, &set(&[2])), vec![(20, 10)]);
        assert!(chunk_ranges(&chunks, &set(&[0, 1, 2, 3])).is_empty());
    }
}
