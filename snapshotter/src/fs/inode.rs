//! The inode table of one layer, built from its TOC (a pure function of the TOC), in a compact
//! form: it is the only in-memory copy of a mounted layer's entries (the decoded [`Toc`] is
//! dropped once the table is built).
//!
//! What the table shows is exactly what containerd's overlayfs snapshotter would have unpacked
//! from the same OCI tar (archive.Apply with `OverlayConvertWhiteout`):
//! - `.wh.<name>` becomes a character device 0:0 named `<name>` (mode 0, uid/gid of the
//!   whiteout entry), the `.wh.*` entry itself is hidden;
//! - `.wh..wh..opq` sets `trusted.overlay.opaque=y` on its directory and is hidden; other
//!   `.wh..wh.*` (aufs metadata) are dropped;
//! - missing parent directories are created implicitly (0755, root), with the mtime of the
//!   newest entry of the layer (containerd's unpack gives them the time of the unpack: both
//!   are at least as new as anything in them, and never 1970; this one is a pure function of
//!   the TOC, so the FUSE view, the native tree and a restarted daemon agree);
//! - a later entry with the same path replaces an earlier one (a directory entry over a
//!   directory only updates its metadata);
//! - hardlinks share the node of their target (`nlink` counts the names).
//!
//! Layout (85 heap bytes per entry on a synthetic 1M-entry TOC, see
//! `compact_table_bytes_per_entry`; a mounted 300k-entry layer grows the daemon's RSS by
//! ~98 B/entry, `integration/tests/untrusted_resources.rs`): one fixed-size 48-byte record
//! per node; all names in one byte arena; the directory entries of all directories in one
//! array (each directory a run sorted by name, found by binary search); the payload chunks of
//! all files in one array of 12-byte records (the file offset is the running sum); owners
//! interned; the rare fields (link targets, device numbers, xattrs, sub-second mtimes) in side
//! tables. [`LayerTable::toc_entry`] rebuilds the TOC entry a node came from.
//!
//! Local node numbers are indices into the records; node 0 is the layer root.

use std::collections::HashMap;
use weenv_format::{ChunkRef, Entry, EntryKind, FrameIdx, Toc};

/// Whiteout prefix of OCI layers.
pub const WHITEOUT_PREFIX: &str = ".wh.";
/// Opaque directory marker of OCI layers.
pub const WHITEOUT_OPAQUE: &str = ".wh..wh..opq";
/// The xattr overlayfs reads to find opaque lower directories.
pub const OPAQUE_XATTR: &str = "trusted.overlay.opaque";

/// Type of a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum NodeKind {
    Dir,
    File,
    Symlink,
    Char,
    Block,
    Fifo,
}

/// A TOC the compact table cannot represent.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TableError {
    #[error("the layer has more than {limit} {what}")]
    TooLarge { what: &'static str, limit: u64 },
}

const NONE: u32 = u32::MAX;
/// Record flags.
const WHITEOUT: u8 = 1;
const OPAQUE: u8 = 2;
/// A directory no TOC entry describes (a missing parent, or the root).
const IMPLICIT: u8 = 4;
/// Bits 4..7 of the flags: the [`EntryKind`] a whiteout entry had in the TOC.
const WH_KIND_SHIFT: u8 = 4;
/// Tar headers start on 512-byte blocks.
const TAR_BLOCK: u64 = 512;
/// `Rec::header_block` of a header offset that is not a block multiple below 2 TiB.
const HEADER_IN_SIDE: u32 = u32::MAX;

/// One node (48 bytes).
#[derive(Clone, Copy, Debug)]
struct Rec {
    size: u64,
    mtime: i64,
    parent: u32,
    /// Stream offset of the header of the TOC entry the node came from (0: implicit dir), in
    /// 512-byte tar blocks ([`HEADER_IN_SIDE`]: see `LayerTable::headers`).
    header_block: u32,
    /// The directory entry naming this node under `parent` (NONE for the root).
    dirent: u32,
    /// Dirs: first directory entry; files: first chunk.
    first: u32,
    /// Dirs: number of directory entries; files: number of chunks.
    count: u32,
    owner: u32,
    nlink: u32,
    perm: u16,
    kind: NodeKind,
    flags: u8,
}

/// A name in a directory (12 bytes).
#[derive(Clone, Copy, Debug)]
struct Dirent {
    name: u32,
    name_len: u32,
    node: u32,
}

/// A slice of a file in a frame (12 bytes; the file offset is the sum of the lengths before).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Chunk {
    frame: u32,
    frame_offset: u32,
    len: u32,
}

/// A node's xattrs: (name, value) pairs.
type Xattrs = Box<[(Box<str>, Box<[u8]>)]>;

/// All nodes of one layer.
#[derive(Debug, Default)]
pub struct LayerTable {
    recs: Vec<Rec>,
    dirents: Vec<Dirent>,
    names: Vec<u8>,
    chunks: Vec<Chunk>,
    owners: Vec<(u32, u32)>,
    /// Symlink targets by node.
    links: HashMap<u32, (u32, u32)>,
    /// The link targets, one after the other (no allocation per link: a decoded TOC's freed
    /// pages would stay resident under them).
    link_bytes: Vec<u8>,
    /// Device numbers by node.
    devs: HashMap<u32, (u32, u32)>,
    /// Header offsets that do not fit `Rec::header_block`, by node.
    headers: HashMap<u32, u64>,
    /// Non-zero sub-second mtimes by node.
    nsecs: HashMap<u32, u32>,
    /// Xattrs (as in the TOC, without the opaque marker) by node.
    xattrs: HashMap<u32, Xattrs>,
    /// Entries that could not be represented (dangling hardlinks, paths under non-dirs).
    pub skipped: Vec<String>,
    /// The mtime implicit directories show: the newest mtime of the layer's entries.
    implicit_mtime: i64,
}

/// A view of one node.
#[derive(Clone, Copy)]
pub struct Node<'a> {
    t: &'a LayerTable,
    id: u32,
    r: &'a Rec,
}

impl<'a> Node<'a> {
    /// Type as the filesystem shows it (a whiteout is a character device).
    pub fn kind(&self) -> NodeKind {
        if self.is_whiteout() {
            NodeKind::Char
        } else {
            self.r.kind
        }
    }

    fn is_whiteout(&self) -> bool {
        self.r.flags & WHITEOUT != 0
    }

    /// Permission bits (incl. setuid/setgid/sticky).
    pub fn perm(&self) -> u32 {
        if self.is_whiteout() {
            0
        } else {
            u32::from(self.r.perm)
        }
    }

    pub fn uid(&self) -> u32 {
        self.t.owners.get(self.r.owner as usize).map_or(0, |o| o.0)
    }

    pub fn gid(&self) -> u32 {
        self.t.owners.get(self.r.owner as usize).map_or(0, |o| o.1)
    }

    pub fn mtime(&self) -> i64 {
        if self.r.flags & IMPLICIT != 0 {
            self.t.implicit_mtime
        } else {
            self.r.mtime
        }
    }

    pub fn mtime_nsec(&self) -> u32 {
        self.t.nsecs.get(&self.id).copied().unwrap_or(0)
    }

    /// File size (regular files), target length (symlinks), the size ext4 would give
    /// (dirs, [`ext4_dir_size`]).
    pub fn size(&self) -> u64 {
        if self.is_whiteout() {
            0
        } else {
            self.r.size
        }
    }

    pub fn nlink(&self) -> u32 {
        self.r.nlink
    }

    /// Parent node (the root is its own parent).
    pub fn parent(&self) -> u32 {
        self.r.parent
    }

    /// Device numbers (0:0 for whiteouts and non-devices).
    pub fn rdev(&self) -> (u32, u32) {
        if self.is_whiteout() {
            return (0, 0);
        }
        self.t.devs.get(&self.id).copied().unwrap_or((0, 0))
    }

    /// Symlink target.
    pub fn link(&self) -> Option<&'a str> {
        if self.kind() != NodeKind::Symlink {
            return None;
        }
        self.t.link_of(self.id)
    }

    /// The value of xattr `name` (a whiteout has none).
    pub fn xattr(&self, name: &str) -> Option<&'a [u8]> {
        if name == OPAQUE_XATTR && self.r.flags & OPAQUE != 0 {
            return Some(b"y");
        }
        if self.is_whiteout() {
            return None;
        }
        self.t
            .xattrs
            .get(&self.id)?
            .iter()
            .find(|(n, _)| &**n == name)
            .map(|(_, v)| &**v)
    }

    /// Names of the xattrs.
    pub fn xattr_names(&self) -> Vec<&'a str> {
        let mut v: Vec<&str> = self
            .t
            .xattrs
            .get(&self.id)
            .filter(|_| !self.is_whiteout())
            .map(|x| x.iter().map(|(n, _)| &**n).collect())
            .unwrap_or_default();
        if self.r.flags & OPAQUE != 0 {
            v.push(OPAQUE_XATTR);
        }
        v
    }

    /// Payload chunks in file order (regular files).
    pub fn chunks(&self) -> Vec<ChunkRef> {
        if self.kind() != NodeKind::File {
            return Vec::new();
        }
        self.t.chunks_of(self.r)
    }

    /// Number of payload chunks.
    pub fn chunk_count(&self) -> usize {
        if self.kind() == NodeKind::File {
            self.r.count as usize
        } else {
            0
        }
    }

    /// Children in name order (dirs): (name, node).
    pub fn children(&self) -> impl Iterator<Item = (&'a str, u32)> + 'a {
        let t = self.t;
        let run: &'a [Dirent] = if self.r.kind == NodeKind::Dir {
            t.run(self.r)
        } else {
            &[]
        };
        run.iter().map(move |d| (t.name(d), d.node))
    }

    /// Child number `i` in name order (dirs).
    pub fn child(&self, i: usize) -> Option<(&'a str, u32)> {
        if self.r.kind != NodeKind::Dir {
            return None;
        }
        self.t.run(self.r).get(i).map(|d| (self.t.name(d), d.node))
    }

    /// 512-byte blocks, as ext4 would allocate them (4 KiB granularity).
    pub fn blocks(&self) -> u64 {
        match self.kind() {
            NodeKind::File => self.size().div_ceil(4096) * 8,
            NodeKind::Dir => self.size() / 512,
            _ => 0,
        }
    }
}

impl LayerTable {
    /// Builds the table from `toc` (pure).
    pub fn build(toc: &Toc) -> Result<Self, TableError> {
        let mut b = Builder::default();
        b.push(Rec {
            size: 4096,
            mtime: 0,
            parent: 0,
            header_block: 0,
            dirent: NONE,
            first: 0,
            count: 0,
            owner: 0,
            nlink: 2,
            perm: 0o755,
            kind: NodeKind::Dir,
            flags: IMPLICIT,
        })?;
        for e in &toc.entries {
            b.add_entry(e)?;
        }
        b.finish()
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.recs.len()
    }

    /// True if the table has only... never: the root always exists.
    pub fn is_empty(&self) -> bool {
        self.recs.is_empty()
    }

    /// True if some node has an xattr or is an opaque directory (overlayfs reads the
    /// `trusted.overlay.opaque` xattr): the layer needs a session that answers GETXATTR (see
    /// [`crate::fs::SessionKind`]). Whiteouts' xattrs count too, to err on the safe side.
    pub fn has_xattrs(&self) -> bool {
        !self.xattrs.is_empty() || self.recs.iter().any(|r| r.flags & OPAQUE != 0)
    }

    /// Node numbers, in order.
    pub fn ids(&self) -> std::ops::Range<u32> {
        0..u32::try_from(self.recs.len()).unwrap_or(u32::MAX)
    }

    /// Bytes this table holds on the heap (for `/status`).
    pub fn heap_bytes(&self) -> u64 {
        use std::mem::size_of;
        let side = |n: usize, each: usize| (n * (each + 8)) as u64; // hashbrown: entry + ctrl/slack
        let mut b = (self.recs.capacity() * size_of::<Rec>()
            + self.dirents.capacity() * size_of::<Dirent>()
            + self.names.capacity()
            + self.chunks.capacity() * size_of::<Chunk>()
            + self.owners.capacity() * 8) as u64;
        b += side(self.links.capacity(), 12) + self.link_bytes.capacity() as u64;
        b += side(self.devs.capacity(), 12) + side(self.nsecs.capacity(), 8);
        b += side(self.headers.capacity(), 16);
        b += side(self.xattrs.capacity(), 4 + 16);
        for x in self.xattrs.values() {
            b += x
                .iter()
                .map(|(k, v)| 32 + (k.len() + v.len()) as u64)
                .sum::<u64>();
        }
        b + self
            .skipped
            .iter()
            .map(|s| 24 + s.len() as u64)
            .sum::<u64>()
    }

    fn link_of(&self, n: u32) -> Option<&str> {
        let &(off, len) = self.links.get(&n)?;
        let s = off as usize;
        self.link_bytes
            .get(s..s + len as usize)
            .and_then(|b| std::str::from_utf8(b).ok())
    }

    fn name(&self, d: &Dirent) -> &str {
        let s = d.name as usize;
        self.names
            .get(s..s + d.name_len as usize)
            .and_then(|b| std::str::from_utf8(b).ok())
            .unwrap_or("")
    }

    fn run(&self, r: &Rec) -> &[Dirent] {
        let s = r.first as usize;
        self.dirents.get(s..s + r.count as usize).unwrap_or(&[])
    }

    fn chunks_of(&self, r: &Rec) -> Vec<ChunkRef> {
        let s = r.first as usize;
        let mut off = 0u64;
        self.chunks
            .get(s..s + r.count as usize)
            .unwrap_or(&[])
            .iter()
            .map(|c| {
                let cr = ChunkRef {
                    file_offset: off,
                    frame: FrameIdx(c.frame),
                    frame_offset: u64::from(c.frame_offset),
                    len: u64::from(c.len),
                };
                off += u64::from(c.len);
                cr
            })
            .collect()
    }

    /// Child `name` of directory `dir` (binary search).
    pub fn lookup(&self, dir: u32, name: &str) -> Option<u32> {
        let r = self.recs.get(dir as usize)?;
        if r.kind != NodeKind::Dir {
            return None;
        }
        let run = self.run(r);
        run.binary_search_by(|d| self.name(d).as_bytes().cmp(name.as_bytes()))
            .ok()
            .map(|i| run[i].node)
    }

    /// The node `n`.
    pub fn node(&self, n: u32) -> Option<Node<'_>> {
        self.recs
            .get(n as usize)
            .map(|r| Node { t: self, id: n, r })
    }

    /// Relative path of `n` ("" for the root). A hardlinked file has several; this is the one
    /// under its first parent.
    pub fn path_of(&self, n: u32) -> Option<String> {
        let mut comps = Vec::new();
        let mut cur = n;
        for _ in 0..4096 {
            if cur == 0 {
                comps.reverse();
                return Some(comps.join("/"));
            }
            let r = self.recs.get(cur as usize)?;
            comps.push(self.name(self.dirents.get(r.dirent as usize)?));
            cur = r.parent;
        }
        None
    }

    /// Node at a slash-separated relative path ("" is the root).
    pub fn resolve(&self, path: &str) -> Option<u32> {
        let mut cur = 0;
        for comp in path.split('/').filter(|c| !c.is_empty()) {
            cur = self.lookup(cur, comp)?;
        }
        Some(cur)
    }

    /// The TOC entry node `n` was made from, rebuilt (implicit directories and the root get
    /// the entry a `Dir` of their metadata would have; a whiteout gets its `.wh.` entry).
    pub fn toc_entry(&self, n: u32) -> Option<Entry> {
        let node = self.node(n)?;
        let r = node.r;
        let mut path = self.path_of(n)?;
        let kind = if r.flags & WHITEOUT != 0 {
            if let Some(i) = path.rfind('/') {
                path.insert_str(i + 1, WHITEOUT_PREFIX);
            } else {
                path.insert_str(0, WHITEOUT_PREFIX);
            }
            entry_kind_from_bits(r.flags >> WH_KIND_SHIFT)
        } else {
            match r.kind {
                NodeKind::Dir => EntryKind::Dir,
                NodeKind::File => EntryKind::File,
                NodeKind::Symlink => EntryKind::Symlink,
                NodeKind::Char => EntryKind::Char,
                NodeKind::Block => EntryKind::Block,
                NodeKind::Fifo => EntryKind::Fifo,
            }
        };
        let (devmajor, devminor) = self.devs.get(&n).copied().unwrap_or((0, 0));
        let file = kind == EntryKind::File;
        Some(Entry {
            path,
            header: match r.header_block {
                HEADER_IN_SIDE => self.headers.get(&n).copied().unwrap_or(0),
                b => u64::from(b) * TAR_BLOCK,
            },
            kind,
            mode: u32::from(r.perm),
            uid: node.uid(),
            gid: node.gid(),
            mtime: r.mtime,
            mtime_nsec: node.mtime_nsec(),
            size: if file { r.size } else { 0 },
            link: self.link_of(n).map(str::to_string),
            devmajor,
            devminor,
            xattrs: self
                .xattrs
                .get(&n)
                .map(|x| x.iter().map(|(k, v)| (k.to_string(), v.to_vec())).collect())
                .unwrap_or_default(),
            chunks: if file { self.chunks_of(r) } else { Vec::new() },
        })
    }
}

fn entry_kind_bits(k: EntryKind) -> u8 {
    match k {
        EntryKind::File => 0,
        EntryKind::Dir => 1,
        EntryKind::Symlink => 2,
        EntryKind::Hardlink => 3,
        EntryKind::Char => 4,
        EntryKind::Block => 5,
        EntryKind::Fifo => 6,
    }
}

fn entry_kind_from_bits(b: u8) -> EntryKind {
    match b & 7 {
        1 => EntryKind::Dir,
        2 => EntryKind::Symlink,
        3 => EntryKind::Hardlink,
        4 => EntryKind::Char,
        5 => EntryKind::Block,
        6 => EntryKind::Fifo,
        _ => EntryKind::File,
    }
}

/// The mutable form used while reading the TOC: children in per-directory lists and a name
/// index borrowing the TOC's paths; [`Builder::finish`] packs them.
#[derive(Default)]
struct Builder<'a> {
    t: LayerTable,
    children: HashMap<u32, Vec<(&'a str, u32)>>,
    names: HashMap<(u32, &'a str), u32>,
    owners: HashMap<(u32, u32), u32>,
    /// The name (directory, name) a hardlinked node was made under: its tar header, the
    /// one its TOC entry points at, carries that path (the other names' headers are links).
    origin: HashMap<u32, (u32, &'a str)>,
}

fn too_large(what: &'static str) -> TableError {
    TableError::TooLarge {
        what,
        limit: u32::MAX.into(),
    }
}

fn small(v: u64, what: &'static str) -> Result<u32, TableError> {
    u32::try_from(v).map_err(|_| too_large(what))
}

impl<'a> Builder<'a> {
    fn push(&mut self, r: Rec) -> Result<u32, TableError> {
        let id = small(self.t.recs.len() as u64, "nodes")?;
        if id == NONE {
            return Err(too_large("nodes"));
        }
        self.t.recs.push(r);
        Ok(id)
    }

    fn rec(&mut self, n: u32) -> &mut Rec {
        &mut self.t.recs[n as usize]
    }

    fn kind(&self, n: u32) -> NodeKind {
        let r = &self.t.recs[n as usize];
        if r.flags & WHITEOUT != 0 {
            NodeKind::Char
        } else {
            r.kind
        }
    }

    fn owner(&mut self, uid: u32, gid: u32) -> u32 {
        let next = self.t.owners.len() as u32;
        *self.owners.entry((uid, gid)).or_insert_with(|| {
            self.t.owners.push((uid, gid));
            next
        })
    }

    fn new_rec(&mut self, kind: NodeKind, parent: u32) -> Rec {
        Rec {
            size: if kind == NodeKind::Dir { 4096 } else { 0 },
            mtime: 0,
            parent,
            header_block: 0,
            dirent: NONE,
            first: 0,
            count: 0,
            owner: self.owner(0, 0),
            nlink: if kind == NodeKind::Dir { 2 } else { 1 },
            perm: 0o755,
            kind,
            flags: 0,
        }
    }

    /// Makes sure every directory of `comps` exists under the root; returns the last one.
    fn ensure_dirs(&mut self, comps: &[&'a str]) -> Result<Option<u32>, TableError> {
        let mut cur = 0u32;
        for c in comps {
            cur = match self.names.get(&(cur, *c)).copied() {
                Some(n) if self.kind(n) == NodeKind::Dir => n,
                Some(_) => return Ok(None),
                None => {
                    let mut r = self.new_rec(NodeKind::Dir, cur);
                    r.flags |= IMPLICIT;
                    self.insert_child(cur, c, r)?
                }
            };
        }
        Ok(Some(cur))
    }

    fn insert_child(&mut self, dir: u32, name: &'a str, r: Rec) -> Result<u32, TableError> {
        let is_dir = r.kind == NodeKind::Dir && r.flags & WHITEOUT == 0;
        let id = self.push(r)?;
        self.link_name(dir, name, id, is_dir);
        Ok(id)
    }

    fn link_name(&mut self, dir: u32, name: &'a str, id: u32, is_dir: bool) {
        self.unlink_name(dir, name);
        self.names.insert((dir, name), id);
        self.children.entry(dir).or_default().push((name, id));
        if is_dir {
            self.rec(dir).nlink += 1;
        }
    }

    fn unlink_name(&mut self, dir: u32, name: &'a str) {
        if let Some(old) = self.names.remove(&(dir, name)) {
            let old_is_dir = self.kind(old) == NodeKind::Dir;
            let o = self.rec(old);
            o.nlink = o.nlink.saturating_sub(1);
            if let Some(c) = self.children.get_mut(&dir) {
                c.retain(|(n, _)| *n != name);
            }
            if old_is_dir {
                let d = self.rec(dir);
                d.nlink = d.nlink.saturating_sub(1);
            }
        }
    }

    fn apply_meta(&mut self, n: u32, e: &Entry) {
        let owner = self.owner(e.uid, e.gid);
        let r = self.rec(n);
        // The TOC is validated (mode <= 0o7777); the mask only keeps the type honest.
        r.perm = (e.mode & 0o7777) as u16;
        r.owner = owner;
        r.mtime = e.mtime;
        r.flags &= !IMPLICIT;
        r.header_block = match u32::try_from(e.header / TAR_BLOCK) {
            Ok(b) if e.header.is_multiple_of(TAR_BLOCK) && b != HEADER_IN_SIDE => b,
            _ => HEADER_IN_SIDE,
        };
        if r.header_block == HEADER_IN_SIDE {
            self.t.headers.insert(n, e.header);
        } else {
            self.t.headers.remove(&n);
        }
        if e.mtime_nsec != 0 {
            self.t.nsecs.insert(n, e.mtime_nsec);
        } else {
            self.t.nsecs.remove(&n);
        }
        if e.xattrs.is_empty() {
            self.t.xattrs.remove(&n);
        } else {
            self.t.xattrs.insert(
                n,
                e.xattrs
                    .iter()
                    .map(|(k, v)| (k.as_str().into(), v.as_slice().into()))
                    .collect(),
            );
        }
    }

    fn add_chunks(&mut self, n: u32, e: &Entry) -> Result<(), TableError> {
        let first = small(self.t.chunks.len() as u64, "chunks")?;
        for c in &e.chunks {
            self.t.chunks.push(Chunk {
                frame: c.frame.0,
                frame_offset: small(c.frame_offset, "bytes in a frame")?,
                len: small(c.len, "bytes in a chunk")?,
            });
        }
        let r = self.rec(n);
        r.first = first;
        r.count = small(e.chunks.len() as u64, "chunks")?;
        Ok(())
    }

    fn add_entry(&mut self, e: &'a Entry) -> Result<(), TableError> {
        let comps: Vec<&'a str> = e
            .path
            .split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .collect();
        let Some((name, parents)) = comps.split_last() else {
            // The layer root itself.
            if e.kind == EntryKind::Dir {
                self.apply_meta(0, e);
            }
            return Ok(());
        };
        let Some(dir) = self.ensure_dirs(parents)? else {
            self.t.skipped.push(e.path.clone());
            return Ok(());
        };
        if *name == WHITEOUT_OPAQUE {
            self.rec(dir).flags |= OPAQUE;
            return Ok(());
        }
        if let Some(hidden) = name.strip_prefix(WHITEOUT_PREFIX) {
            if hidden.starts_with(WHITEOUT_PREFIX) || hidden.is_empty() {
                return Ok(()); // aufs metadata (.wh..wh.plnk, ...): not materialised by containerd.
            }
            let mut r = self.new_rec(NodeKind::Char, dir);
            r.flags = WHITEOUT | (entry_kind_bits(e.kind) << WH_KIND_SHIFT);
            r.size = e.size;
            let n = self.insert_child(dir, hidden, r)?;
            self.apply_meta(n, e);
            self.keep_rare(n, e);
            if e.kind == EntryKind::File {
                self.add_chunks(n, e)?;
            }
            return Ok(());
        }
        match e.kind {
            EntryKind::Dir => {
                if let Some(existing) = self.names.get(&(dir, *name)).copied() {
                    if self.kind(existing) == NodeKind::Dir {
                        self.apply_meta(existing, e);
                        return Ok(());
                    }
                }
                let r = self.new_rec(NodeKind::Dir, dir);
                let n = self.insert_child(dir, name, r)?;
                self.apply_meta(n, e);
            }
            EntryKind::Hardlink => {
                let target = e.link.as_deref().and_then(|l| self.resolve(l));
                match target {
                    Some(t) if self.kind(t) != NodeKind::Dir => {
                        if self.rec(t).nlink == 1 {
                            // Its first link: the target path is still its only name.
                            if let Some((d, n)) = e.link.as_deref().and_then(|l| self.split(l)) {
                                self.origin.insert(t, (d, n));
                            }
                        }
                        self.link_name(dir, name, t, false);
                        self.rec(t).nlink += 1;
                    }
                    _ => self.t.skipped.push(e.path.clone()),
                }
            }
            kind => {
                let nk = match kind {
                    EntryKind::File => NodeKind::File,
                    EntryKind::Symlink => NodeKind::Symlink,
                    EntryKind::Char => NodeKind::Char,
                    EntryKind::Block => NodeKind::Block,
                    _ => NodeKind::Fifo,
                };
                let mut r = self.new_rec(nk, dir);
                r.size = match nk {
                    NodeKind::File => e.size,
                    NodeKind::Symlink => e.link.as_ref().map_or(0, |l| l.len() as u64),
                    _ => 0,
                };
                let n = self.insert_child(dir, name, r)?;
                self.apply_meta(n, e);
                self.keep_rare(n, e);
                if nk == NodeKind::File {
                    self.add_chunks(n, e)?;
                }
            }
        }
        Ok(())
    }

    /// Link target and device numbers, kept in side tables.
    fn keep_rare(&mut self, n: u32, e: &Entry) {
        if let Some(l) = &e.link {
            if let (Ok(off), Ok(len)) = (
                u32::try_from(self.t.link_bytes.len()),
                u32::try_from(l.len()),
            ) {
                self.t.link_bytes.extend_from_slice(l.as_bytes());
                self.t.links.insert(n, (off, len));
            }
        }
        if e.devmajor != 0 || e.devminor != 0 {
            self.t.devs.insert(n, (e.devmajor, e.devminor));
        }
    }

    fn resolve(&self, path: &str) -> Option<u32> {
        let mut cur = 0;
        for comp in path.split('/').filter(|c| !c.is_empty() && *c != ".") {
            cur = *self.names.get(&(cur, comp))?;
        }
        Some(cur)
    }

    /// The directory node and last name of `path` (which must exist).
    fn split(&self, path: &'a str) -> Option<(u32, &'a str)> {
        let path = path.trim_end_matches('/');
        let (dir, last) = path.rsplit_once('/').unwrap_or(("", path));
        Some((self.resolve(dir)?, last))
    }

    /// Packs the directory lists into the sorted dirent array and the name arena.
    fn finish(mut self) -> Result<LayerTable, TableError> {
        let mut t = std::mem::take(&mut self.t);
        t.implicit_mtime = t
            .recs
            .iter()
            .filter(|r| r.flags & IMPLICIT == 0)
            .map(|r| r.mtime)
            .max()
            .unwrap_or(0);
        let mut dirs: Vec<(u32, Vec<(&str, u32)>)> = self.children.into_iter().collect();
        dirs.sort_unstable_by_key(|(d, _)| *d);
        let total: usize = dirs.iter().map(|(_, c)| c.len()).sum();
        t.dirents.reserve_exact(total);
        t.names.reserve_exact(
            dirs.iter()
                .flat_map(|(_, c)| c.iter().map(|(n, _)| n.len()))
                .sum(),
        );
        for (dir, mut kids) in dirs {
            kids.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            let first = small(t.dirents.len() as u64, "directory entries")?;
            for (name, node) in &kids {
                let at = small(t.dirents.len() as u64, "directory entries")?;
                let off = small(t.names.len() as u64, "bytes of names")?;
                t.names.extend_from_slice(name.as_bytes());
                t.dirents.push(Dirent {
                    name: off,
                    name_len: small(name.len() as u64, "bytes in a name")?,
                    node: *node,
                });
                if let Some(r) = t.recs.get_mut(*node as usize) {
                    // A hardlinked file's path is the name it was made under, not the first
                    // of its names in sorted order (its header check compares the path).
                    let origin = self.origin.get(node);
                    if r.parent == dir && (r.dirent == NONE || origin == Some(&(dir, *name))) {
                        r.dirent = at;
                    }
                }
            }
            let r = &mut t.recs[dir as usize];
            r.first = first;
            r.count = small(kids.len() as u64, "directory entries")?;
            r.size = ext4_dir_size(kids.iter().map(|(n, _)| n.len()));
        }
        t.recs.shrink_to_fit();
        t.chunks.shrink_to_fit();
        t.owners.shrink_to_fit();
        t.links.shrink_to_fit();
        t.link_bytes.shrink_to_fit();
        t.devs.shrink_to_fit();
        t.nsecs.shrink_to_fit();
        t.headers.shrink_to_fit();
        t.xattrs.shrink_to_fit();
        Ok(t)
    }
}

/// The size ext4 gives a directory made by creating entries named `names` (lengths): one
/// 4 KiB block while `.`, `..` and the entries fit in it linearly (8 bytes + the name rounded
/// up to 4 each); beyond that ext4 turns it into an htree (a root block plus leaf blocks that
/// split when full: about 3/4 full on average), so the estimate is `1 + ceil(4/3 · linear /
/// 4 KiB)` blocks. The exact size of a large directory depends on the filesystem's hash seed
/// (two ext4 unpacks differ too); what matters to programs is that it is not a constant.
/// Pure.
pub fn ext4_dir_size(names: impl Iterator<Item = usize>) -> u64 {
    const BLOCK: u64 = 4096;
    let linear: u64 = 24 + names.map(|n| (8 + n as u64 + 3) & !3).sum::<u64>();
    if linear <= BLOCK {
        return BLOCK;
    }
    BLOCK * (1 + (linear * 4).div_ceil(3 * BLOCK).max(2))
}

/// Linux `makedev` for the FUSE `rdev` field.
pub fn makedev(major: u32, minor: u32) -> u32 {
    // Kernel's new_encode_dev (32-bit dev_t as FUSE carries it).
    (minor & 0xff) | ((major & 0xfff) << 8) | ((minor & !0xff) << 12)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::collections::BTreeMap;

    pub fn entry(path: &str, kind: EntryKind) -> Entry {
        Entry {
            path: path.to_string(),
            header: 0,
            kind,
            mode: if kind == EntryKind::Dir { 0o755 } else { 0o644 },
            uid: 0,
            gid: 0,
            mtime: 1_700_000_000,
            mtime_nsec: 0,
            size: 0,
            link: None,
            devmajor: 0,
            devminor: 0,
            xattrs: BTreeMap::new(),
            chunks: Vec::new(),
        }
    }

    fn toc(entries: Vec<Entry>) -> Toc {
        Toc {
            version: 1,
            frames: Vec::new(),
            entries,
        }
    }

    fn build(entries: Vec<Entry>) -> LayerTable {
        LayerTable::build(&toc(entries)).unwrap()
    }

    fn names(t: &LayerTable, n: u32) -> Vec<&str> {
        t.node(n).unwrap().children().map(|(n, _)| n).collect()
    }

    #[test]
    fn implicit_dirs_and_dir_nlink() {
        let t = build(vec![
            entry("a/d", EntryKind::Dir),
            entry("a/b/c.txt", EntryKind::File),
            entry("a", EntryKind::Dir),
        ]);
        let a = t.resolve("a").unwrap();
        assert_eq!(t.node(a).unwrap().kind(), NodeKind::Dir);
        assert_eq!(t.node(a).unwrap().nlink(), 4, "2 + subdirs b and d");
        assert_eq!(t.node(0).unwrap().nlink(), 3);
        assert_eq!(names(&t, a), ["b", "d"], "name order");
        assert!(t.resolve("a/b/c.txt").is_some());
        assert_eq!(
            t.path_of(t.resolve("a/b/c.txt").unwrap()).unwrap(),
            "a/b/c.txt"
        );
        assert_eq!(t.node(a).unwrap().child(1).map(|c| c.0), Some("d"));
    }

    #[test]
    fn implicit_dirs_take_the_newest_mtime_of_the_layer() {
        let mut f = entry("x/y/f", EntryKind::File);
        f.mtime = 1_700_000_500;
        let mut old = entry("x/old", EntryKind::File);
        old.mtime = 1_600_000_000;
        let mut d = entry("z", EntryKind::Dir);
        d.mtime = 1_500_000_000;
        let t = build(vec![f, old, d, entry("z/k/l", EntryKind::File)]);
        let mtime = |p: &str| t.node(t.resolve(p).unwrap()).unwrap().mtime();
        // Implicit: the root, x, x/y, z/k; explicit ones keep their own.
        for p in ["", "x", "x/y", "z/k"] {
            assert_eq!(mtime(p), 1_700_000_500, "{p:?}");
        }
        assert_eq!(mtime("z"), 1_500_000_000);
        assert_eq!(mtime("x/old"), 1_600_000_000);
        // The rebuilt TOC entry of an implicit directory is still the zero entry.
        assert_eq!(t.toc_entry(t.resolve("x").unwrap()).unwrap().mtime, 0);
        // A directory entry after its children makes the directory explicit.
        let mut late = entry("x", EntryKind::Dir);
        late.mtime = 1_000;
        let t = build(vec![entry("x/f", EntryKind::File), late]);
        assert_eq!(t.node(t.resolve("x").unwrap()).unwrap().mtime(), 1_000);
        assert_eq!(t.node(0).unwrap().mtime(), 1_700_000_000);
    }

    #[test]
    fn directory_sizes_grow_like_ext4() {
        assert_eq!(ext4_dir_size(std::iter::empty()), 4096);
        // 24 + 255 · 16 = 4104 > 4096: an htree of a root and 2 leaves at least.
        assert_eq!(ext4_dir_size(std::iter::repeat_n(8, 254)), 4096);
        assert_eq!(ext4_dir_size(std::iter::repeat_n(8, 255)), 3 * 4096);
        // 2,000 names of 20 bytes: 24 + 2000 · 28 = 56,024 linear bytes, 19 leaves + root.
        assert_eq!(ext4_dir_size(std::iter::repeat_n(20, 2000)), 20 * 4096);
        let entries: Vec<Entry> = (0..300)
            .map(|i| entry(&format!("big/file-{i:04}"), EntryKind::File))
            .collect();
        let t = build(entries);
        let big = t.node(t.resolve("big").unwrap()).unwrap();
        assert_eq!(big.size(), ext4_dir_size(std::iter::repeat_n(9, 300)));
        assert!(big.size() > 4096);
        assert_eq!(t.node(0).unwrap().size(), 4096);
    }

    #[test]
    fn hardlinks_share_a_node() {
        let mut f = entry("bin/busybox", EntryKind::File);
        f.size = 10;
        let mut h = entry("bin/sh", EntryKind::Hardlink);
        h.link = Some("bin/busybox".into());
        let mut dangling = entry("bin/x", EntryKind::Hardlink);
        dangling.link = Some("nope".into());
        let t = build(vec![f, h, dangling]);
        let a = t.resolve("bin/busybox").unwrap();
        assert_eq!(t.resolve("bin/sh"), Some(a));
        assert_eq!(t.node(a).unwrap().nlink(), 2);
        assert_eq!(t.skipped, ["bin/x"]);
        assert_eq!(t.path_of(a).unwrap(), "bin/busybox");
    }

    #[test]
    fn a_hardlinked_file_keeps_the_path_it_was_made_under() {
        // Its TOC entry (header check, profiles, native tree) must name the entry that holds
        // the data, even when a link's name sorts before it or lives in another directory.
        let mut f = entry("etc/hostname", EntryKind::File);
        f.size = 6;
        f.header = 1536;
        let mut same_dir = entry("etc/hard", EntryKind::Hardlink);
        same_dir.link = Some("etc/hostname".into());
        let mut other_dir = entry("a/first", EntryKind::Hardlink);
        other_dir.link = Some("./etc/hard".into());
        let t = build(vec![entry("etc", EntryKind::Dir), f, same_dir, other_dir]);
        let n = t.resolve("etc/hostname").unwrap();
        assert_eq!(t.resolve("etc/hard"), Some(n));
        assert_eq!(t.resolve("a/first"), Some(n));
        assert_eq!(t.node(n).unwrap().nlink(), 3);
        assert_eq!(t.path_of(n).unwrap(), "etc/hostname");
        let e = t.toc_entry(n).unwrap();
        assert_eq!((e.path.as_str(), e.header), ("etc/hostname", 1536));
    }

    #[test]
    fn whiteouts_and_opaque_dirs() {
        let mut wh = entry("etc/.wh.passwd", EntryKind::File);
        wh.uid = 7;
        let t = build(vec![
            entry("etc", EntryKind::Dir),
            wh.clone(),
            entry("var/lib/.wh..wh..opq", EntryKind::File),
            entry("var/lib/.wh..wh.plnk", EntryKind::File),
            entry("var/lib/x", EntryKind::File),
        ]);
        let wn = t.resolve("etc/passwd").unwrap();
        let w = t.node(wn).unwrap();
        assert_eq!(
            (w.kind(), w.rdev(), w.perm(), w.uid()),
            (NodeKind::Char, (0, 0), 0, 7)
        );
        assert_eq!(
            t.toc_entry(wn),
            Some(wh.clone()),
            "the whiteout's own entry"
        );
        assert!(t.resolve("etc/.wh.passwd").is_none());
        let lib = t.node(t.resolve("var/lib").unwrap()).unwrap();
        assert_eq!(lib.xattr(OPAQUE_XATTR), Some(&b"y"[..]));
        assert_eq!(lib.xattr_names(), [OPAQUE_XATTR]);
        assert_eq!(names(&t, t.resolve("var/lib").unwrap()), ["x"]);
        assert!(
            t.has_xattrs(),
            "an opaque directory needs the xattr session"
        );
        let plain = build(vec![entry("etc", EntryKind::Dir), wh]);
        assert!(!plain.has_xattrs(), "whiteouts alone need no xattr");
        assert_eq!(
            t.node(t.resolve("var").unwrap())
                .unwrap()
                .xattr(OPAQUE_XATTR),
            None
        );
    }

    #[test]
    fn opaque_marker_survives_later_dir_entry_and_replacement_works() {
        let mut d = entry("d", EntryKind::Dir);
        d.xattrs.insert("user.k".into(), b"v".to_vec());
        let mut s = entry("d/f", EntryKind::Symlink);
        s.link = Some("target".into());
        let t = build(vec![
            entry("d/.wh..wh..opq", EntryKind::File),
            d.clone(),
            entry("d/f", EntryKind::File),
            s.clone(),
            entry("", EntryKind::Dir),
        ]);
        let dnode = t.resolve("d").unwrap();
        let dn = t.node(dnode).unwrap();
        assert_eq!(dn.xattr(OPAQUE_XATTR), Some(&b"y"[..]));
        assert_eq!(dn.xattr("user.k"), Some(&b"v"[..]));
        let fnode = t.resolve("d/f").unwrap();
        let f = t.node(fnode).unwrap();
        assert_eq!(
            (f.kind(), f.size(), f.link()),
            (NodeKind::Symlink, 6, Some("target"))
        );
        assert_eq!(dn.children().count(), 1);
        assert_eq!(
            t.toc_entry(dnode),
            Some(d.clone()),
            "xattrs without the opaque marker"
        );
        assert_eq!(t.toc_entry(fnode), Some(s));
        let only_xattr = build(vec![d]);
        assert!(only_xattr.has_xattrs(), "an xattr needs the xattr session");
    }

    #[test]
    fn devices_and_makedev() {
        let mut c = entry("dev/null", EntryKind::Char);
        c.devmajor = 1;
        c.devminor = 3;
        c.header = 1000; // not on a tar block: kept in the side table
        let mut p = entry("p", EntryKind::Fifo);
        p.header = 5 << 40; // past 2 TiB: side table too
        let t = build(vec![c.clone(), p.clone()]);
        assert_eq!(t.toc_entry(t.resolve("p").unwrap()), Some(p));
        let nn = t.resolve("dev/null").unwrap();
        let (ma, mi) = t.node(nn).unwrap().rdev();
        assert_eq!(makedev(ma, mi), 0x103);
        assert_eq!(t.toc_entry(nn), Some(c));
        assert_eq!(
            t.node(t.resolve("p").unwrap()).unwrap().kind(),
            NodeKind::Fifo
        );
        assert_eq!(
            makedev(259, 300),
            (300 & 0xff) | (259 << 8) | ((300 & !0xff) << 12)
        );
    }

    #[test]
    fn table_from_a_converted_tar() {
        use crate::fetch::testutil::{build_layer, tar_of, T};
        let tar = tar_of(&[
            T::Dir("d"),
            T::File("d/f", b"hello".to_vec()),
            T::Link("d/g", "d/f"),
            T::Symlink("s", "d/f"),
            T::File("x/.wh.gone", Vec::new()),
        ]);
        let (_, toc, _) = build_layer(&tar, 4096);
        let t = LayerTable::build(&toc).unwrap();
        let f = t.resolve("d/f").unwrap();
        assert_eq!(t.resolve("d/g"), Some(f));
        let n = t.node(f).unwrap();
        assert_eq!((n.size(), n.nlink(), n.chunks().len()), (5, 2, 1));
        let s = t.node(t.resolve("s").unwrap()).unwrap();
        assert_eq!(s.link(), Some("d/f"));
        assert_eq!(
            t.node(t.resolve("x/gone").unwrap()).unwrap().kind(),
            NodeKind::Char
        );
        assert!(t.skipped.is_empty());
        // every entry that made a node comes back as it was in the TOC
        for e in toc.entries.iter().filter(|e| e.kind != EntryKind::Hardlink) {
            let n = t.resolve(&e.path.replace(".wh.", "")).unwrap();
            assert_eq!(t.toc_entry(n).as_ref(), Some(e), "{}", e.path);
        }
    }

    /// A synthetic TOC of 1M entries (Debian-like: 10% dirs, 10% symlinks, files of one chunk,
    /// names of ~12 bytes): the table's heap plus the 5 bytes of per-node read state a
    /// [`super::layer::Layer`] adds must stay under 100 bytes per entry.
    #[test]
    fn compact_table_bytes_per_entry() {
        const N: usize = 1_000_000;
        let mut entries = Vec::with_capacity(N);
        let mut dirs = vec![String::new()];
        for i in 0..N {
            let parent = &dirs[(i / 37) % dirs.len()];
            let path = format!(
                "{parent}{}entry{i:07}",
                if parent.is_empty() { "" } else { "/" }
            );
            let kind = match i % 10 {
                0 => EntryKind::Dir,
                1 => EntryKind::Symlink,
                _ => EntryKind::File,
            };
            let mut e = entry(&path, kind);
            e.mtime += i as i64;
            e.header = i as u64 * 1536;
            match kind {
                EntryKind::Dir => dirs.push(path),
                EntryKind::Symlink => e.link = Some(format!("../lib/x{i}")),
                _ => {
                    e.size = 1000 + i as u64 % 5000;
                    e.chunks = vec![ChunkRef {
                        file_offset: 0,
                        frame: FrameIdx((i / 300) as u32),
                        frame_offset: (i % 300) as u64 * 3000,
                        len: e.size,
                    }];
                }
            }
            entries.push(e);
        }
        assert_eq!(std::mem::size_of::<Rec>(), 48);
        let t = build(entries);
        assert_eq!(t.len(), N + 1);
        let per_entry = t.heap_bytes() as f64 / N as f64;
        println!("compact inode table: {per_entry:.1} heap bytes per entry ({N} entries)");
        assert!(per_entry + 5.0 <= 100.0, "{per_entry:.1} B/entry");
    }
}
