//! The filesystem's state and its request helpers: each returns `Result<T, Errno>` and never
//! touches a reply, so they are tested without a kernel (CONVENTIONS 7).

use super::inode::{makedev, Node, NodeKind};
use super::layer::{decode_ino, encode_ino, Layer, ROOT_INO};
use super::passthrough::Passthrough;
use super::SessionKind;
use crate::fetch::{FetchError, FillConfig, FrameStore, Priority};
use crate::metrics::Metrics;
use bytes::Bytes;
use fuser::{Errno, FileAttr, FileType, INodeNo};
use parking_lot::RwLock;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use weenv_format::{ChunkRef, Digest, FrameIdx};

/// Layers by slot; slots are stable per digest.
#[derive(Default)]
pub struct Layers {
    pub by_slot: Vec<Option<Arc<Layer>>>,
    pub slot_of: HashMap<Digest, u32>,
}

/// Everything the FUSE handlers share.
pub struct FsState {
    pub layers: RwLock<Layers>,
    pub store: Arc<FrameStore>,
    pub metrics: Arc<Metrics>,
    pub rt: tokio::runtime::Handle,
    pub fill: FillConfig,
    pub passthrough: Passthrough,
    /// Where layer quarantines are counted and persisted.
    pub quarantine: Arc<super::trust::QuarantineHook>,
    /// Entry/attr timeout for layer content (immutable).
    pub ttl: Duration,
    /// Attr timeout of the mount root (its listing changes as layers come and go).
    pub root_ttl: Duration,
    pub mounted_at: SystemTime,
}

/// What a read needs: the layer, the clipped chunks and the distinct frames.
pub struct ReadPlan {
    pub layer: Arc<Layer>,
    pub node: u32,
    pub chunks: Vec<ChunkRef>,
    pub frames: Vec<FrameIdx>,
}

/// One directory entry.
#[derive(Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub ino: u64,
    pub kind: FileType,
    pub name: String,
}

fn file_type(k: NodeKind) -> FileType {
    match k {
        NodeKind::Dir => FileType::Directory,
        NodeKind::File => FileType::RegularFile,
        NodeKind::Symlink => FileType::Symlink,
        NodeKind::Char => FileType::CharDevice,
        NodeKind::Block => FileType::BlockDevice,
        NodeKind::Fifo => FileType::NamedPipe,
    }
}

fn time_of(sec: i64, nsec: u32) -> SystemTime {
    let d = Duration::new(sec.unsigned_abs(), nsec.min(999_999_999));
    if sec >= 0 {
        UNIX_EPOCH + d
    } else {
        UNIX_EPOCH.checked_sub(d).unwrap_or(UNIX_EPOCH)
    }
}

/// FUSE attributes of `n` as inode `ino`.
pub fn node_attr(ino: u64, n: &Node) -> FileAttr {
    let t = time_of(n.mtime(), n.mtime_nsec());
    FileAttr {
        ino: INodeNo(ino),
        size: n.size(),
        blocks: n.blocks(),
        atime: t,
        mtime: t,
        ctime: t,
        crtime: t,
        kind: file_type(n.kind()),
        perm: (n.perm() & 0o7777) as u16,
        nlink: n.nlink(),
        uid: n.uid(),
        gid: n.gid(),
        rdev: if matches!(n.kind(), NodeKind::Char | NodeKind::Block) {
            let (major, minor) = n.rdev();
            makedev(major, minor)
        } else {
            0
        },
        blksize: 4096,
        flags: 0,
    }
}

/// Attributes of a negative entry (node id 0: "no such name", cached for the entry TTL).
pub fn negative_attr() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

/// The answer to OPENDIR of an inode of kind `kind`: `Ok` for a directory (replied ENOSYS,
/// see `WeenvFs::opendir`: no OPENDIR/RELEASEDIR for the rest of the session, listings cached
/// by the kernel), else the error. Pure.
pub fn opendir_answer(kind: Result<FileType, Errno>) -> Result<(), Errno> {
    match kind? {
        FileType::Directory => Ok(()),
        _ => Err(Errno::ENOTDIR),
    }
}

/// Copies the bytes named by `chunks` out of `frames` (aligned with `idxs`) into one buffer.
/// Pure. Chunks must be clipped (see `Entry::chunks_in`) and in file order.
pub fn assemble(
    chunks: &[ChunkRef],
    idxs: &[FrameIdx],
    frames: &[Bytes],
) -> Result<Vec<u8>, Errno> {
    let total: u64 = chunks.iter().map(|c| c.len).sum();
    let mut out = Vec::with_capacity(usize::try_from(total).map_err(|_| Errno::EIO)?);
    for c in chunks {
        let pos = idxs.iter().position(|i| *i == c.frame).ok_or(Errno::EIO)?;
        let data = frames.get(pos).ok_or(Errno::EIO)?;
        let s = usize::try_from(c.frame_offset).map_err(|_| Errno::EIO)?;
        let e = s
            .checked_add(usize::try_from(c.len).map_err(|_| Errno::EIO)?)
            .ok_or(Errno::EIO)?;
        out.extend_from_slice(data.get(s..e).ok_or(Errno::EIO)?);
    }
    Ok(out)
}

impl FsState {
    /// The layer in `slot`.
    pub fn layer(&self, slot: u32) -> Result<Arc<Layer>, Errno> {
        self.layers
            .read()
            .by_slot
            .get(slot as usize)
            .and_then(Clone::clone)
            .ok_or(Errno::ENOENT)
    }

    /// Layer and node of `ino` (not the mount root).
    pub fn resolve(&self, ino: u64) -> Result<(Arc<Layer>, u32), Errno> {
        let (slot, node) = decode_ino(ino).ok_or(Errno::ENOENT)?;
        let l = self.layer(slot)?;
        if l.table.node(node).is_none() {
            return Err(Errno::ENOENT);
        }
        Ok((l, node))
    }

    fn root_attr(&self) -> FileAttr {
        let n = self.layers.read().by_slot.iter().flatten().count() as u32;
        FileAttr {
            ino: INodeNo(ROOT_INO),
            size: 4096,
            blocks: 8,
            atime: self.mounted_at,
            mtime: self.mounted_at,
            ctime: self.mounted_at,
            crtime: self.mounted_at,
            kind: FileType::Directory,
            // The session lists every layer; like the state dir it lives in, only root may
            // enter (overlayfs opens its lowers with the mounter's credentials).
            perm: crate::dirs::PRIVATE as u16,
            nlink: 2 + n,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    /// Attributes of `ino`, and the TTL to give them.
    pub fn attr(&self, ino: u64) -> Result<(FileAttr, Duration), Errno> {
        if ino == ROOT_INO {
            return Ok((self.root_attr(), self.root_ttl));
        }
        let (l, node) = self.resolve(ino)?;
        let n = l.table.node(node).ok_or(Errno::ENOENT)?;
        super::trust::check_exposure(self, &l, node)?;
        Ok((node_attr(ino, &n), self.ttl))
    }

    /// Looks `name` up in directory `parent`, as session `kind` shows it (its mount root
    /// lists the layers it serves).
    pub fn lookup_name(
        &self,
        kind: SessionKind,
        parent: u64,
        name: &OsStr,
    ) -> Result<(FileAttr, Duration), Errno> {
        let name = std::str::from_utf8(name.as_bytes()).map_err(|_| Errno::ENOENT)?;
        if parent == ROOT_INO {
            let d: Digest = format!("sha256:{name}")
                .parse()
                .map_err(|_| Errno::ENOENT)?;
            let slot = *self.layers.read().slot_of.get(&d).ok_or(Errno::ENOENT)?;
            let l = self.layer(slot)?;
            if !kind.serves(&l) {
                return Err(Errno::ENOENT);
            }
            return self.attr(l.root_ino());
        }
        let (l, dir) = self.resolve(parent)?;
        let dn = l.table.node(dir).ok_or(Errno::ENOENT)?;
        if dn.kind() != NodeKind::Dir {
            return Err(Errno::ENOTDIR);
        }
        let child = l.table.lookup(dir, name).ok_or(Errno::ENOENT)?;
        self.attr(encode_ino(l.slot, child))
    }

    /// Entry number `index` of directory `ino` (`.` and `..` first) as session `kind` shows
    /// it, or None past the end.
    pub fn dir_entry(
        &self,
        kind: SessionKind,
        ino: u64,
        index: u64,
    ) -> Result<Option<DirEntry>, Errno> {
        let dot = |ino, name: &str| {
            Some(DirEntry {
                ino,
                kind: FileType::Directory,
                name: name.into(),
            })
        };
        if ino == ROOT_INO {
            return Ok(match index {
                0 => dot(ROOT_INO, "."),
                1 => dot(ROOT_INO, ".."),
                i => {
                    let g = self.layers.read();
                    g.by_slot
                        .iter()
                        .flatten()
                        .filter(|l| kind.serves(l))
                        .nth((i - 2) as usize)
                        .map(|l| DirEntry {
                            ino: l.root_ino(),
                            kind: FileType::Directory,
                            name: l.digest.hex().to_string(),
                        })
                }
            });
        }
        let (l, dir) = self.resolve(ino)?;
        let dn = l.table.node(dir).ok_or(Errno::ENOENT)?;
        if dn.kind() != NodeKind::Dir {
            return Err(Errno::ENOTDIR);
        }
        Ok(match index {
            0 => dot(ino, "."),
            1 => dot(
                if dir == 0 {
                    ROOT_INO
                } else {
                    encode_ino(l.slot, dn.parent())
                },
                "..",
            ),
            i => dn.child((i - 2) as usize).and_then(|(name, c)| {
                let cn = l.table.node(c)?;
                Some(DirEntry {
                    ino: encode_ino(l.slot, c),
                    kind: file_type(cn.kind()),
                    name: name.to_string(),
                })
            }),
        })
    }

    /// Target of symlink `ino`.
    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>, Errno> {
        let (l, node) = self.resolve(ino)?;
        let n = l.table.node(node).ok_or(Errno::ENOENT)?;
        match (n.kind(), n.link()) {
            (NodeKind::Symlink, Some(t)) => Ok(t.as_bytes().to_vec()),
            _ => Err(Errno::EINVAL),
        }
    }

    /// Value of xattr `name` of `ino` (ENODATA if absent).
    pub fn getxattr(&self, ino: u64, name: &OsStr) -> Result<Vec<u8>, Errno> {
        if ino == ROOT_INO {
            return Err(Errno::NO_XATTR);
        }
        let (l, node) = self.resolve(ino)?;
        let n = l.table.node(node).ok_or(Errno::ENOENT)?;
        let name = std::str::from_utf8(name.as_bytes()).map_err(|_| Errno::NO_XATTR)?;
        n.xattr(name).map(<[u8]>::to_vec).ok_or(Errno::NO_XATTR)
    }

    /// NUL-separated xattr names of `ino`.
    pub fn listxattr(&self, ino: u64) -> Result<Vec<u8>, Errno> {
        if ino == ROOT_INO {
            return Ok(Vec::new());
        }
        let (l, node) = self.resolve(ino)?;
        let n = l.table.node(node).ok_or(Errno::ENOENT)?;
        let mut out = Vec::new();
        for k in n.xattr_names() {
            out.extend_from_slice(k.as_bytes());
            out.push(0);
        }
        Ok(out)
    }

    /// What reading `size` bytes at `offset` of file `ino` needs.
    pub fn read_plan(&self, ino: u64, offset: u64, size: u32) -> Result<ReadPlan, Errno> {
        self.store.note_read(); // the node's containers are busy: background work pauses
        let (layer, node) = self.resolve(ino)?;
        if layer.quarantined() {
            return Err(Errno::EIO);
        }
        let entry_chunks = {
            let n = layer.table.node(node).ok_or(Errno::ENOENT)?;
            match n.kind() {
                NodeKind::File => {}
                NodeKind::Dir => return Err(Errno::EISDIR),
                _ => return Err(Errno::EINVAL),
            }
            clip_chunks(&n.chunks(), n.size(), offset, u64::from(size))
        };
        let mut frames: Vec<FrameIdx> = Vec::new();
        for c in &entry_chunks {
            if !frames.contains(&c.frame) {
                frames.push(c.frame);
            }
        }
        Ok(ReadPlan {
            layer,
            node,
            chunks: entry_chunks,
            frames,
        })
    }

    /// `size` bytes at `offset` of the file of `plan`, from the layer's native tree; `None`
    /// if the tree's file cannot be read (evicted: the caller takes the frame path).
    pub fn read_native(&self, plan: &ReadPlan, offset: u64, size: u32) -> Option<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        let root = self.store.l2().native_path(&plan.layer.digest);
        let path = super::native::node_path(&plan.layer, &root, plan.node)?;
        let f = std::fs::File::open(path).ok()?;
        let mut buf = vec![0u8; size as usize];
        let mut got = 0;
        while got < buf.len() {
            match f.read_at(&mut buf[got..], offset + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return None,
            }
        }
        buf.truncate(got);
        Some(buf)
    }

    /// The bytes of `plan` if every frame is cached locally (L1, or L2 on local disk: the
    /// FUSE thread may do local I/O, as the kernel would with passthrough). `None` sends the
    /// read to the async path, which counts the misses.
    pub fn read_from_cache(&self, plan: &ReadPlan) -> Option<Vec<u8>> {
        let mut data = Vec::with_capacity(plan.frames.len());
        let (mut l1, mut l2) = (0, 0);
        for idx in &plan.frames {
            let f = plan.layer.frames.frames.get(idx.0 as usize)?;
            if let Some(b) = self.store.l1().get(&f.digest) {
                l1 += 1;
                data.push(b);
            } else if self.store.l2().contains(&f.digest) {
                let b = self.store.l2().get(&f.digest, f.ulen).ok()??;
                self.store.l1().insert(f.digest.clone(), b.clone());
                l2 += 1;
                data.push(b);
            } else {
                return None;
            }
        }
        self.metrics.l1_hits.fetch_add(l1, Ordering::Relaxed);
        self.metrics.l1_misses.fetch_add(l2, Ordering::Relaxed);
        self.metrics.l2_hits.fetch_add(l2, Ordering::Relaxed);
        assemble(&plan.chunks, &plan.frames, &data).ok()
    }

    /// The bytes of `plan`, fetching what is missing.
    pub async fn read(&self, plan: &ReadPlan) -> Result<Vec<u8>, FetchError> {
        let frames = self
            .store
            .get_frames(
                &plan.layer.frames.frames,
                &plan.layer.source,
                &plan.frames,
                Priority::OnDemand,
            )
            .await?;
        assemble(&plan.chunks, &plan.frames, &frames)
            .map_err(|_| FetchError::Stopped("chunk outside its frame (corrupt TOC)".into()))
    }

    /// Frames to read ahead after `plan` (sliding window, see [`super::readahead`]); claims
    /// the window so concurrent readers do not prefetch it twice.
    pub fn read_ahead_frames(&self, plan: &ReadPlan) -> Vec<FrameIdx> {
        let (Some(first), Some(last)) = (plan.frames.first(), plan.frames.last()) else {
            return Vec::new();
        };
        let Some(h) = plan.layer.ra_horizon(plan.node) else {
            return Vec::new();
        };
        if h.load(Ordering::Relaxed) == u32::MAX {
            return Vec::new(); // the whole file is prefetched
        }
        let all = plan.layer.file_frames(plan.node);
        let (Some(p0), Some(p1)) = (
            all.iter().position(|f| f == first),
            all.iter().rposition(|f| f == last),
        ) else {
            return Vec::new();
        };
        let ulens: Vec<u64> = all
            .iter()
            .map(|i| {
                plan.layer
                    .frames
                    .frames
                    .get(i.0 as usize)
                    .map_or(u64::MAX, |f| f.ulen)
            })
            .collect();
        let horizon = h.load(Ordering::Relaxed);
        let Some((s, e)) = super::readahead::next_window(
            &ulens,
            p0,
            p1,
            horizon as usize,
            self.fill.read_ahead_bytes,
        ) else {
            return Vec::new();
        };
        let e32 = if e >= all.len() {
            u32::MAX
        } else {
            u32::try_from(e).unwrap_or(u32::MAX)
        };
        if h.compare_exchange(horizon, e32, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return Vec::new(); // another reader moved the window
        }
        all[s..e].to_vec()
    }

    /// Frames to prefetch when the layer is being read in blob order across files (see
    /// [`super::readahead::scan_step`]); frames already on disk are left out.
    pub fn scan_frames(&self, plan: &ReadPlan) -> Vec<FrameIdx> {
        let (Some(first), Some(last)) = (
            plan.frames.iter().map(|f| f.0).min(),
            plan.frames.iter().map(|f| f.0).max(),
        ) else {
            return Vec::new();
        };
        let frames = &plan.layer.frames.frames;
        let ulens: Vec<u64> = frames.iter().map(|f| f.ulen).collect();
        let span = super::readahead::scan_step(
            &mut plan.layer.scan.lock(),
            first,
            last,
            &ulens,
            self.fill.scan_min_frames,
            self.fill.read_ahead_bytes,
        );
        let Some((s, e)) = span else {
            return Vec::new();
        };
        let l2 = self.store.l2();
        (s..e)
            .filter(|i| frames.get(*i).is_some_and(|f| !l2.contains(&f.digest)))
            .filter_map(|i| u32::try_from(i).ok().map(FrameIdx))
            .collect()
    }

    /// Frames of the small files of directory `dir`, in directory order, capped.
    pub fn dir_prefetch_frames(&self, layer: &Layer, dir: u32) -> Vec<FrameIdx> {
        let mut out: Vec<FrameIdx> = Vec::new();
        let Some(dn) = layer.table.node(dir) else {
            return out;
        };
        for (_, c) in dn.children() {
            let Some(n) = layer.table.node(c) else {
                continue;
            };
            if n.kind() != NodeKind::File || n.size() == 0 || n.size() > self.fill.small_file_bytes
            {
                continue;
            }
            for ch in &n.chunks() {
                if !out.contains(&ch.frame) {
                    if out.len() >= self.fill.dir_prefetch_frames {
                        return out;
                    }
                    out.push(ch.frame);
                }
            }
        }
        out
    }

    /// Starts fetching `frames` of `layer` in the background (read-ahead priority).
    pub fn prefetch(self: &Arc<Self>, layer: Arc<Layer>, frames: Vec<FrameIdx>) {
        if frames.is_empty() {
            return;
        }
        let st = self.clone();
        self.rt.spawn(async move {
            if let Err(e) = st
                .store
                .get_frames(
                    &layer.frames.frames,
                    &layer.source,
                    &frames,
                    Priority::ReadAhead,
                )
                .await
            {
                tracing::debug!(error = %e, layer = %layer.digest, "read-ahead failed");
            }
        });
    }

    /// statfs numbers: (blocks, files).
    pub fn totals(&self) -> (u64, u64) {
        let g = self.layers.read();
        g.by_slot.iter().flatten().fold((0, 1), |(b, f), l| {
            (b + l.bytes_total().div_ceil(4096), f + l.table.len() as u64)
        })
    }
}

/// Chunks of a file (`chunks` covering `0..size`) intersecting `offset..offset+len`, clipped.
pub fn clip_chunks(chunks: &[ChunkRef], size: u64, offset: u64, len: u64) -> Vec<ChunkRef> {
    let end = offset.saturating_add(len).min(size);
    let start_idx = chunks.partition_point(|c| c.file_offset.saturating_add(c.len) <= offset);
    chunks[start_idx..]
        .iter()
        .take_while(|c| c.file_offset < end)
        .filter_map(|c| {
            let s = c.file_offset.max(offset);
            let e = c.file_offset.saturating_add(c.len).min(end);
            (s < e).then(|| ChunkRef {
                file_offset: s,
                frame: c.frame,
                frame_offset: c.frame_offset + (s - c.file_offset),
                len: e - s,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ch(file_offset: u64, frame: u32, frame_offset: u64, len: u64) -> ChunkRef {
        ChunkRef {
            file_offset,
            frame: FrameIdx(frame),
            frame_offset,
            len,
        }
    }

    #[test]
    fn opendir_answers_directories_only() {
        assert_eq!(opendir_answer(Ok(FileType::Directory)), Ok(()));
        assert_eq!(
            opendir_answer(Ok(FileType::RegularFile)),
            Err(Errno::ENOTDIR)
        );
        assert_eq!(opendir_answer(Err(Errno::ENOENT)), Err(Errno::ENOENT));
    }

    #[test]
    fn clip_and_assemble_across_frames() {
        let chunks = vec![ch(0, 0, 10, 5), ch(5, 1, 0, 5)];
        let c = clip_chunks(&chunks, 10, 3, 4);
        assert_eq!(c, vec![ch(3, 0, 13, 2), ch(5, 1, 0, 2)]);
        let f0 = Bytes::from_static(b"..........ABCDE");
        let f1 = Bytes::from_static(b"FGHIJ");
        let out = assemble(&c, &[FrameIdx(0), FrameIdx(1)], &[f0, f1]).unwrap();
        assert_eq!(out, b"DEFG");
        assert!(clip_chunks(&chunks, 10, 10, 4).is_empty(), "EOF");
        assert_eq!(
            assemble(&[ch(0, 5, 0, 1)], &[FrameIdx(0)], &[Bytes::new()]),
            Err(Errno::EIO)
        );
    }
}
