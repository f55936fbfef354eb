//! TOC types. (Contract shared with snapshotter/ and converter/; implementation to follow.)

use crate::Digest;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Index of a frame in [`Toc::frames`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct FrameIdx(pub u32);

/// One independent zstd frame of the blob.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Frame {
    /// Offset of the compressed frame in the blob.
    pub offset: u64,
    /// Compressed length in the blob.
    pub clen: u64,
    /// Uncompressed length.
    pub ulen: u64,
    /// sha256 of the uncompressed frame content.
    pub digest: Digest,
}

/// Type of a TOC entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
    Hardlink,
    Char,
    Block,
    Fifo,
}

/// A slice of a file's payload held in a frame.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkRef {
    /// Offset of this chunk in the file.
    pub file_offset: u64,
    /// Frame holding it.
    pub frame: FrameIdx,
    /// Offset of the chunk inside the uncompressed frame.
    pub frame_offset: u64,
    /// Uncompressed length.
    pub len: u64,
}

/// One tar entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Normalised relative path: no leading `/` or `./`, no `..`, no empty components.
    pub path: String,
    pub kind: EntryKind,
    /// Permission bits including setuid/setgid/sticky (no file-type bits).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: i64,
    pub size: u64,
    /// Symlink target, or (for hardlinks) the normalised path of the target entry.
    pub link: Option<String>,
    pub devmajor: u32,
    pub devminor: u32,
    /// Extended attributes (from PAX `SCHILY.xattr.*`), values as raw bytes.
    pub xattrs: BTreeMap<String, Vec<u8>>,
    /// Payload chunks in file order, covering `0..size` exactly (regular files only).
    pub chunks: Vec<ChunkRef>,
}

/// The table of contents of a weenv layer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Toc {
    pub version: u32,
    pub frames: Vec<Frame>,
    /// Entries in tar order.
    pub entries: Vec<Entry>,
}
