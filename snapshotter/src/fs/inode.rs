//! The inode table of one layer, built from its TOC: a pure function of the TOC.
//!
//! What the table shows is exactly what containerd's overlayfs snapshotter would have unpacked
//! from the same OCI tar (archive.Apply with `OverlayConvertWhiteout`):
//! - `.wh.<name>` becomes a character device 0:0 named `<name>` (mode 0, uid/gid of the
//!   whiteout entry), the `.wh.*` entry itself is hidden;
//! - `.wh..wh..opq` sets `trusted.overlay.opaque=y` on its directory and is hidden; other
//!   `.wh..wh.*` (aufs metadata) are dropped;
//! - missing parent directories are created implicitly (0755, root);
//! - a later entry with the same path replaces an earlier one (a directory entry over a
//!   directory only updates its metadata);
//! - hardlinks share the node of their target (`nlink` counts the names).
//!
//! Local node numbers are indices into [`LayerTable::nodes`]; node 0 is the layer root.

use std::collections::HashMap;
use weenv_format::{ChunkRef, Entry, EntryKind, Toc};

/// Whiteout prefix of OCI layers.
pub const WHITEOUT_PREFIX: &str = ".wh.";
/// Opaque directory marker of OCI layers.
pub const WHITEOUT_OPAQUE: &str = ".wh..wh..opq";
/// The xattr overlayfs reads to find opaque lower directories.
pub const OPAQUE_XATTR: &str = "trusted.overlay.opaque";

/// Type of a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeKind {
    Dir,
    File,
    Symlink,
    Char,
    Block,
    Fifo,
}

/// One inode of a layer.
#[derive(Clone, Debug)]
pub struct Node {
    pub kind: NodeKind,
    /// Permission bits (incl. setuid/setgid/sticky).
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: i64,
    pub mtime_nsec: u32,
    /// File size (regular files), target length (symlinks), 4096 (dirs).
    pub size: u64,
    pub nlink: u32,
    pub rdev_major: u32,
    pub rdev_minor: u32,
    pub link: Option<String>,
    pub xattrs: Vec<(String, Vec<u8>)>,
    pub chunks: Vec<ChunkRef>,
    /// Parent node (the root is its own parent).
    pub parent: u32,
    /// Children in tar order (dirs only): (name, node).
    pub children: Vec<(String, u32)>,
}

impl Node {
    fn new(kind: NodeKind, parent: u32) -> Self {
        Node {
            kind,
            perm: 0o755,
            uid: 0,
            gid: 0,
            mtime: 0,
            mtime_nsec: 0,
            size: if kind == NodeKind::Dir { 4096 } else { 0 },
            nlink: if kind == NodeKind::Dir { 2 } else { 1 },
            rdev_major: 0,
            rdev_minor: 0,
            link: None,
            xattrs: Vec::new(),
            chunks: Vec::new(),
            parent,
            children: Vec::new(),
        }
    }

    /// 512-byte blocks, as ext4 would allocate them (4 KiB granularity).
    pub fn blocks(&self) -> u64 {
        match self.kind {
            NodeKind::File => self.size.div_ceil(4096) * 8,
            NodeKind::Dir => 8,
            _ => 0,
        }
    }

    /// The value of xattr `name`.
    pub fn xattr(&self, name: &str) -> Option<&[u8]> {
        self.xattrs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }
}

/// All nodes of one layer and a name index.
#[derive(Debug, Default)]
pub struct LayerTable {
    pub nodes: Vec<Node>,
    names: HashMap<(u32, String), u32>,
    /// Entries that could not be represented (dangling hardlinks, paths under non-dirs).
    pub skipped: Vec<String>,
}

impl LayerTable {
    /// Builds the table from `toc` (pure).
    pub fn build(toc: &Toc) -> Self {
        let mut t = LayerTable {
            nodes: vec![Node::new(NodeKind::Dir, 0)],
            ..Default::default()
        };
        for e in &toc.entries {
            t.add_entry(e);
        }
        t
    }

    /// Child `name` of directory `dir`.
    pub fn lookup(&self, dir: u32, name: &str) -> Option<u32> {
        self.names.get(&(dir, name.to_string())).copied()
    }

    /// The node `n`.
    pub fn node(&self, n: u32) -> Option<&Node> {
        self.nodes.get(n as usize)
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
            let parent = self.node(cur)?.parent;
            let (name, _) = self
                .node(parent)?
                .children
                .iter()
                .find(|(_, c)| *c == cur)?;
            comps.push(name.as_str());
            cur = parent;
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

    /// Makes sure every directory of `comps` exists under the root; returns the last one.
    fn ensure_dirs(&mut self, comps: &[&str]) -> Option<u32> {
        let mut cur = 0u32;
        for c in comps {
            cur = match self.lookup(cur, c) {
                Some(n) if self.nodes[n as usize].kind == NodeKind::Dir => n,
                Some(_) => return None,
                None => self.insert_child(cur, c, Node::new(NodeKind::Dir, cur)),
            };
        }
        Some(cur)
    }

    fn insert_child(&mut self, dir: u32, name: &str, node: Node) -> u32 {
        let id = self.nodes.len() as u32;
        let is_dir = node.kind == NodeKind::Dir;
        self.nodes.push(node);
        self.link_name(dir, name, id, is_dir);
        id
    }

    fn link_name(&mut self, dir: u32, name: &str, id: u32, is_dir: bool) {
        self.unlink_name(dir, name);
        self.names.insert((dir, name.to_string()), id);
        let d = &mut self.nodes[dir as usize];
        d.children.push((name.to_string(), id));
        if is_dir {
            d.nlink += 1;
        }
    }

    fn unlink_name(&mut self, dir: u32, name: &str) {
        if let Some(old) = self.names.remove(&(dir, name.to_string())) {
            let old_is_dir = self.nodes[old as usize].kind == NodeKind::Dir;
            let o = &mut self.nodes[old as usize];
            o.nlink = o.nlink.saturating_sub(1);
            let d = &mut self.nodes[dir as usize];
            d.children.retain(|(n, _)| n != name);
            if old_is_dir {
                d.nlink = d.nlink.saturating_sub(1);
            }
        }
    }

    fn add_entry(&mut self, e: &Entry) {
        let comps: Vec<&str> = e
            .path
            .split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .collect();
        let Some((name, parents)) = comps.split_last() else {
            // The layer root itself.
            if e.kind == EntryKind::Dir {
                apply_meta(&mut self.nodes[0], e);
            }
            return;
        };
        let Some(dir) = self.ensure_dirs(parents) else {
            self.skipped.push(e.path.clone());
            return;
        };
        if *name == WHITEOUT_OPAQUE {
            let d = &mut self.nodes[dir as usize];
            d.xattrs.retain(|(n, _)| n != OPAQUE_XATTR);
            d.xattrs.push((OPAQUE_XATTR.to_string(), b"y".to_vec()));
            return;
        }
        if let Some(hidden) = name.strip_prefix(WHITEOUT_PREFIX) {
            if hidden.starts_with(WHITEOUT_PREFIX) || hidden.is_empty() {
                return; // aufs metadata (.wh..wh.plnk, ...): not materialised by containerd.
            }
            let mut n = Node::new(NodeKind::Char, dir);
            n.perm = 0;
            n.uid = e.uid;
            n.gid = e.gid;
            n.mtime = e.mtime;
            n.mtime_nsec = e.mtime_nsec;
            self.insert_child(dir, hidden, n);
            return;
        }
        match e.kind {
            EntryKind::Dir => {
                if let Some(existing) = self.lookup(dir, name) {
                    if self.nodes[existing as usize].kind == NodeKind::Dir {
                        apply_meta(&mut self.nodes[existing as usize], e);
                        return;
                    }
                }
                let mut n = Node::new(NodeKind::Dir, dir);
                apply_meta(&mut n, e);
                self.insert_child(dir, name, n);
            }
            EntryKind::Hardlink => {
                let target = e.link.as_deref().and_then(|l| self.resolve(l));
                match target {
                    Some(t) if self.nodes[t as usize].kind != NodeKind::Dir => {
                        self.link_name(dir, name, t, false);
                        self.nodes[t as usize].nlink += 1;
                    }
                    _ => self.skipped.push(e.path.clone()),
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
                let mut n = Node::new(nk, dir);
                apply_meta(&mut n, e);
                match nk {
                    NodeKind::File => {
                        n.size = e.size;
                        n.chunks = e.chunks.clone();
                    }
                    NodeKind::Symlink => {
                        n.link = e.link.clone();
                        n.size = e.link.as_ref().map_or(0, |l| l.len() as u64);
                    }
                    NodeKind::Char | NodeKind::Block => {
                        n.rdev_major = e.devmajor;
                        n.rdev_minor = e.devminor;
                    }
                    _ => {}
                }
                self.insert_child(dir, name, n);
            }
        }
    }
}

fn apply_meta(n: &mut Node, e: &Entry) {
    n.perm = e.mode & 0o7777;
    n.uid = e.uid;
    n.gid = e.gid;
    n.mtime = e.mtime;
    n.mtime_nsec = e.mtime_nsec;
    let opaque = n.xattr(OPAQUE_XATTR).map(<[u8]>::to_vec);
    n.xattrs = e
        .xattrs
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if let Some(v) = opaque {
        n.xattrs.push((OPAQUE_XATTR.to_string(), v));
    }
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

    #[test]
    fn implicit_dirs_and_dir_nlink() {
        let t = LayerTable::build(&toc(vec![
            entry("a/b/c.txt", EntryKind::File),
            entry("a/d", EntryKind::Dir),
            entry("a", EntryKind::Dir),
        ]));
        let a = t.resolve("a").unwrap();
        assert_eq!(t.node(a).unwrap().kind, NodeKind::Dir);
        assert_eq!(t.node(a).unwrap().nlink, 4, "2 + subdirs b and d");
        assert_eq!(t.node(0).unwrap().nlink, 3);
        let names: Vec<_> = t
            .node(a)
            .unwrap()
            .children
            .iter()
            .map(|(n, _)| n.as_str())
            .collect();
        assert_eq!(names, ["b", "d"]);
        assert!(t.resolve("a/b/c.txt").is_some());
    }

    #[test]
    fn hardlinks_share_a_node() {
        let mut f = entry("bin/busybox", EntryKind::File);
        f.size = 10;
        let mut h = entry("bin/sh", EntryKind::Hardlink);
        h.link = Some("bin/busybox".into());
        let mut dangling = entry("bin/x", EntryKind::Hardlink);
        dangling.link = Some("nope".into());
        let t = LayerTable::build(&toc(vec![f, h, dangling]));
        let a = t.resolve("bin/busybox").unwrap();
        assert_eq!(t.resolve("bin/sh"), Some(a));
        assert_eq!(t.node(a).unwrap().nlink, 2);
        assert_eq!(t.skipped, ["bin/x"]);
    }

    #[test]
    fn whiteouts_and_opaque_dirs() {
        let mut wh = entry("etc/.wh.passwd", EntryKind::File);
        wh.uid = 7;
        let t = LayerTable::build(&toc(vec![
            entry("etc", EntryKind::Dir),
            wh,
            entry("var/lib/.wh..wh..opq", EntryKind::File),
            entry("var/lib/.wh..wh.plnk", EntryKind::File),
            entry("var/lib/x", EntryKind::File),
        ]));
        let w = t.node(t.resolve("etc/passwd").unwrap()).unwrap();
        assert_eq!(
            (w.kind, w.rdev_major, w.rdev_minor, w.perm, w.uid),
            (NodeKind::Char, 0, 0, 0, 7)
        );
        assert!(t.resolve("etc/.wh.passwd").is_none());
        let lib = t.node(t.resolve("var/lib").unwrap()).unwrap();
        assert_eq!(lib.xattr(OPAQUE_XATTR), Some(&b"y"[..]));
        let names: Vec<_> = lib.children.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["x"]);
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
        let t = LayerTable::build(&toc(vec![
            entry("d/.wh..wh..opq", EntryKind::File),
            d,
            entry("d/f", EntryKind::File),
            s,
            entry("", EntryKind::Dir),
        ]));
        let dn = t.node(t.resolve("d").unwrap()).unwrap();
        assert_eq!(dn.xattr(OPAQUE_XATTR), Some(&b"y"[..]));
        assert_eq!(dn.xattr("user.k"), Some(&b"v"[..]));
        let f = t.node(t.resolve("d/f").unwrap()).unwrap();
        assert_eq!((f.kind, f.size), (NodeKind::Symlink, 6));
        assert_eq!(dn.children.len(), 1);
    }

    #[test]
    fn devices_and_makedev() {
        let mut c = entry("dev/null", EntryKind::Char);
        c.devmajor = 1;
        c.devminor = 3;
        let t = LayerTable::build(&toc(vec![c, entry("p", EntryKind::Fifo)]));
        let n = t.node(t.resolve("dev/null").unwrap()).unwrap();
        assert_eq!(makedev(n.rdev_major, n.rdev_minor), 0x103);
        assert_eq!(
            t.node(t.resolve("p").unwrap()).unwrap().kind,
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
        let t = LayerTable::build(&toc);
        let f = t.resolve("d/f").unwrap();
        assert_eq!(t.resolve("d/g"), Some(f));
        let n = t.node(f).unwrap();
        assert_eq!((n.size, n.nlink, n.chunks.len()), (5, 2, 1));
        let s = t.node(t.resolve("s").unwrap()).unwrap();
        assert_eq!(s.link.as_deref(), Some("d/f"));
        assert_eq!(
            t.node(t.resolve("x/gone").unwrap()).unwrap().kind,
            NodeKind::Char
        );
        assert!(t.skipped.is_empty());
    }
}
