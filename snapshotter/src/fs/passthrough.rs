//! FUSE passthrough for files whose frames are all on disk.
//!
//! Such a file is materialised once as `<cache_dir>/files/<layer hex>/<node>` (assembled from
//! L2 frames, temp + rename; a copy counts against the disk cache's cap, is evictable like a
//! frame and pinned while a passthrough handle has it open, see [`crate::cache::disk`]; `cache_dir` must be on a non-stacked fs such as ext4, because the
//! FUSE fs is itself an overlayfs lower), then opened with `reply.opened_passthrough`: the
//! kernel reads the backing file directly and the FUSE read handler is not called.
//!
//! Kernel facts: passthrough needs `FUSE_PASSTHROUGH` in `init` (6.9+, CAP_SYS_ADMIN) and
//! `max_stack_depth = 1` so the fs can still be an overlay lower. All concurrent opens of one
//! inode must share ONE `BackingId` (a second id for a live inode makes the open fail with
//! EIO): ids are kept per inode as `Weak<BackingId>`; each open holds a strong ref until release.
//! The kernel also fixes an inode's io mode while it is open (fs/fuse/iomode.c): while any
//! cached (non-passthrough) open of an inode is live, a passthrough open fails with EIO, and
//! while a passthrough open is live, a cached open fails with EIO. So the mode of each open is
//! chosen by [`decide_open_mode`] from the live opens of the inode, reserved under a lock.
//! A passthrough open reply may not carry `FOPEN_KEEP_CACHE` (outside FOPEN_PASSTHROUGH_MASK:
//! the open fails with EIO); the page cache is the backing file's anyway.
//!
//! Across a daemon takeover ([`crate::handover`]) the kernel keeps the predecessor's opens and
//! their modes and backing files, so every change of an inode's live opens (counts and raw
//! backing id) is also sent to the keeper ([`OpenRecord`], through a channel: never on the
//! request path), and a successor starts from that table: a new open of an inode the
//! predecessor still has open gets the same mode and, for passthrough, the same backing id.

use super::layer::Layer;
use crate::cache::disk::FileReservation;
use crate::cache::DiskCache;
use crate::handover::OpenRecord;
use fuser::{BackingId, FileHandle, FopenFlags, ReplyOpen};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::fs::{self, File};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use weenv_format::Digest;

/// How one open of a regular file is answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    /// Through FUSE reads, page cache kept (`FOPEN_KEEP_CACHE`).
    Cached,
    /// FUSE passthrough to the complete file.
    Passthrough,
}

/// Mode for a new open of an inode with `cached`/`passthrough` opens live. Pure.
pub fn decide_open_mode(complete: bool, cached: u32, passthrough: u32) -> OpenMode {
    if passthrough > 0 {
        OpenMode::Passthrough
    } else if cached > 0 || !complete {
        OpenMode::Cached
    } else {
        OpenMode::Passthrough
    }
}

#[derive(Default)]
struct InoState {
    cached: u32,
    passthrough: u32,
    backing: Weak<BackingId>,
    /// Raw id of `backing` (what a successor re-wraps).
    raw: Option<u32>,
    /// Passthrough opens left by a predecessor daemon, and the backing id they use (held
    /// while any of them is live).
    inherited_pt: u32,
    inherited: Option<Arc<BackingId>>,
}

fn record(ino: u64, st: &InoState) -> OpenRecord {
    OpenRecord {
        ino,
        cached: st.cached,
        passthrough: st.passthrough,
        backing: st.raw.filter(|_| st.passthrough > 0),
    }
}

/// A live passthrough handle: its backing id and the copy (layer, node) it pins.
type OpenHandle = (Arc<BackingId>, Option<(Digest, u32)>);

/// Passthrough state of the session.
pub struct Passthrough {
    /// Configured on.
    pub enabled: bool,
    /// The kernel accepted `FUSE_PASSTHROUGH` in init.
    pub available: AtomicBool,
    inos: Mutex<HashMap<u64, InoState>>,
    /// Live passthrough handles: the backing id and the copy they pin in the disk cache.
    open: Mutex<HashMap<u64, OpenHandle>>,
    next_fh: AtomicU64,
    /// Inodes being materialised in the background.
    materialising: Mutex<std::collections::HashSet<u64>>,
    /// Where changes of live opens go (to the keeper), if a keeper holds the session.
    open_log: Mutex<Option<std::sync::mpsc::Sender<OpenRecord>>>,
}

fn cache_io(e: crate::cache::CacheError) -> std::io::Error {
    std::io::Error::other(e)
}

impl Passthrough {
    /// Passthrough state; the complete copies live in the disk cache.
    pub fn new(enabled: bool) -> Self {
        Passthrough {
            enabled,
            available: AtomicBool::new(false),
            inos: Mutex::new(HashMap::new()),
            open: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            materialising: Mutex::new(std::collections::HashSet::new()),
            open_log: Mutex::new(None),
        }
    }

    /// Sends every later change of live opens to `tx`.
    pub fn set_open_log(&self, tx: std::sync::mpsc::Sender<OpenRecord>) {
        *self.open_log.lock() = Some(tx);
    }

    /// Stops sending changes of live opens (the sender thread ends once it sent the rest).
    pub fn close_open_log(&self) {
        *self.open_log.lock() = None;
    }

    /// Called with the `inos` lock held, so records leave in the order of the changes.
    fn log_record(&self, r: OpenRecord) {
        if let Some(tx) = self.open_log.lock().as_ref() {
            let _ = tx.send(r);
        }
    }

    /// Starts from the live opens a predecessor daemon left (after a takeover).
    pub fn restore_opens(&self, opens: &[OpenRecord]) {
        let mut g = self.inos.lock();
        for r in opens.iter().filter(|r| r.cached > 0 || r.passthrough > 0) {
            g.insert(
                r.ino,
                InoState {
                    cached: r.cached,
                    passthrough: r.passthrough,
                    backing: Weak::new(),
                    raw: r.backing,
                    inherited_pt: if r.backing.is_some() {
                        r.passthrough
                    } else {
                        0
                    },
                    inherited: None,
                },
            );
        }
    }

    /// Before the process exits with the session left to a successor: the backing ids of
    /// live passthrough opens are never closed (the successor reuses them).
    pub fn leak_backing_ids(&self) {
        for (_, (id, _)) in self.open.lock().drain() {
            std::mem::forget(id);
        }
        for st in self.inos.lock().values_mut() {
            if let Some(id) = st.inherited.take() {
                std::mem::forget(id);
            }
        }
    }

    /// File handles count on from `base` (a successor starts above its predecessor's
    /// handles, which the kernel may still release).
    pub fn set_fh_base(&self, base: u64) {
        self.next_fh.store(base.max(1), Ordering::Relaxed);
    }

    /// Passthrough is configured and supported.
    pub fn active(&self) -> bool {
        self.enabled && self.available.load(Ordering::Relaxed)
    }

    /// True if the complete copy of `node` is in the disk cache (e.g. from before a
    /// restart, even if its frames were evicted from L2 since).
    pub fn has_complete(&self, l2: &DiskCache, layer: &Layer, node: u32) -> bool {
        l2.has_file(&layer.digest, node)
    }

    /// The complete copy of file `node`, materialising it from L2 if every frame is there.
    /// `Ok(None)` if some frame is not on disk or the copy does not fit in the cache.
    pub fn materialise(
        &self,
        l2: &DiskCache,
        layer: &Layer,
        node: u32,
    ) -> std::io::Result<Option<PathBuf>> {
        if l2.has_file(&layer.digest, node) {
            return Ok(Some(l2.file_path(&layer.digest, node)));
        }
        match self.write_temp(l2, layer, node, true)? {
            Some(r) => r.commit().map(Some),
            None => Ok(None),
        }
    }

    /// Claims the background materialisation of `ino`; false if one is running.
    pub fn claim_materialise(&self, ino: u64) -> bool {
        self.materialising.lock().insert(ino)
    }

    /// Ends a claim of [`claim_materialise`](Self::claim_materialise).
    pub fn release_materialise(&self, ino: u64) {
        self.materialising.lock().remove(&ino);
    }

    /// Materialises every regular file of `layer` of at least `min_bytes` whose frames are all
    /// in L2 and that has no complete copy yet (after the layer's fill, off the read path: the
    /// first open of a big file then needs no copy). The copies are written, made durable
    /// with one `syncfs`, then renamed into place (not one fsync per file). Copies that do not
    /// fit in the disk cache are skipped. Returns how many files were materialised.
    pub fn materialise_layer(
        &self,
        l2: &DiskCache,
        layer: &Layer,
        min_bytes: u64,
    ) -> std::io::Result<usize> {
        let mut temps = Vec::new();
        for node in layer.table.ids() {
            let Some(n) = layer.table.node(node) else {
                break;
            };
            if n.kind() != super::inode::NodeKind::File
                || n.size() == 0
                || n.size() < min_bytes
                || l2.has_file(&layer.digest, node)
            {
                continue;
            }
            if let Some(r) = self.write_temp(l2, layer, node, false)? {
                temps.push(r);
            }
        }
        if !temps.is_empty() {
            let dir = File::open(l2.layer_dir(&layer.digest))?;
            nix::unistd::syncfs(&dir)?;
        }
        let n = temps.len();
        for r in temps {
            r.commit()?;
        }
        Ok(n)
    }

    /// Writes file `node` from its pinned L2 frames to the temp file of a disk-cache
    /// reservation (`sync`: fsync it). `Ok(None)` if some frame is not on disk or the copy
    /// does not fit.
    fn write_temp<'a>(
        &self,
        l2: &'a DiskCache,
        layer: &Layer,
        node: u32,
        sync: bool,
    ) -> std::io::Result<Option<FileReservation<'a>>> {
        let Some(n) = layer.table.node(node) else {
            return Ok(None);
        };
        let frames = layer.file_frames(node);
        let mut pins = Vec::new();
        for idx in &frames {
            let Some(f) = layer.frames.frames.get(idx.0 as usize) else {
                return Ok(None);
            };
            match l2.pin(&f.digest) {
                Some(p) => pins.push((*idx, p)),
                None => return Ok(None),
            }
        }
        let Some(r) = l2
            .reserve_file(&layer.digest, node, n.size())
            .map_err(cache_io)?
        else {
            return Ok(None);
        };
        let mut out = File::create(r.tmp_path())?;
        let mut cur: Option<(weenv_format::FrameIdx, Vec<u8>)> = None;
        for c in &n.chunks() {
            if cur.as_ref().map(|(i, _)| *i) != Some(c.frame) {
                let p = pins
                    .iter()
                    .find(|(i, _)| *i == c.frame)
                    .map(|(_, p)| p.path())
                    .ok_or_else(|| std::io::Error::other("frame not pinned"))?;
                cur = Some((c.frame, fs::read(p)?));
            }
            let data = &cur
                .as_ref()
                .ok_or_else(|| std::io::Error::other("no frame"))?
                .1;
            let s = c.frame_offset as usize;
            let e = s.saturating_add(c.len as usize);
            out.write_all(
                data.get(s..e)
                    .ok_or_else(|| std::io::Error::other("chunk outside frame"))?,
            )?;
        }
        if sync {
            out.sync_data()?;
        }
        Ok(Some(r))
    }

    /// Chooses and reserves the mode of a new open of regular file `ino` (`complete`: all
    /// its frames are on disk). Without active passthrough every open is cached, uncounted.
    pub fn begin_open(&self, ino: u64, complete: bool) -> OpenMode {
        if !self.active() {
            return OpenMode::Cached;
        }
        let mut g = self.inos.lock();
        let st = g.entry(ino).or_default();
        let mode = decide_open_mode(complete, st.cached, st.passthrough);
        match mode {
            OpenMode::Cached => st.cached += 1,
            OpenMode::Passthrough => st.passthrough += 1,
        }
        let r = record(ino, st);
        self.log_record(r);
        mode
    }

    /// Answers a cached open (reserved by [`begin_open`](Self::begin_open)).
    pub fn reply_cached(&self, reply: ReplyOpen) {
        reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE);
    }

    /// Answers a reserved passthrough open with the complete copy of `node` of `layer` at
    /// `path` (None: it could not be made); the copy stays pinned in the disk cache until the
    /// handle is released. `copy` None: `path` is a file of a native tree (nothing to pin).
    /// Falls back to a cached open when the copy is gone or the kernel refuses the backing
    /// file.
    pub fn reply_passthrough(
        &self,
        reply: ReplyOpen,
        l2: &DiskCache,
        copy: Option<(&Digest, u32)>,
        ino: u64,
        path: Option<&Path>,
    ) -> bool {
        let pinned = match copy {
            Some((layer, node)) => path.is_some() && l2.pin_file(layer, node),
            None => false,
        };
        let usable = pinned || (copy.is_none() && path.is_some());
        let file = match path.filter(|_| usable).map(File::open) {
            Some(Ok(f)) => Some(f),
            Some(Err(e)) => {
                tracing::warn!(error = %e, "cannot open complete file; serving through FUSE");
                None
            }
            None => None,
        };
        // Held across open_backing so two opens never create two ids for one inode.
        let mut g = self.inos.lock();
        let st = g.entry(ino).or_default();
        let inherited = st.raw.filter(|_| st.inherited_pt > 0);
        let id = match (st.backing.upgrade(), file) {
            (Some(id), _) => Some(id),
            (None, _) if inherited.is_some() => {
                // The predecessor's opens of this inode use that id: the kernel accepts no other.
                let raw = inherited.unwrap_or_default();
                // SAFETY: the id was opened on this session by a predecessor that never
                // closed it; it stays open while `inherited` holds it.
                let id = Arc::new(unsafe { reply.wrap_backing(raw) });
                st.inherited = Some(id.clone());
                st.backing = Arc::downgrade(&id);
                Some(id)
            }
            (None, Some(f)) => match reply.open_backing(&f) {
                Ok(id) => {
                    let raw = id.into_raw();
                    // SAFETY: `raw` was just opened on this session and is owned by nothing
                    // else; the new BackingId closes it when dropped.
                    let id = Arc::new(unsafe { reply.wrap_backing(raw) });
                    st.raw = Some(raw);
                    st.backing = Arc::downgrade(&id);
                    Some(id)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "FUSE_DEV_IOC_BACKING_OPEN failed; serving through FUSE");
                    None
                }
            },
            (None, None) => None,
        };
        let Some(id) = id else {
            if let (true, Some((layer, node))) = (pinned, copy) {
                l2.unpin_file(layer, node);
            }
            // Downgrade the reservation; a cached open is valid now only if no passthrough
            // open is live (then the kernel would refuse it, and EIO is all that is left).
            st.passthrough = st.passthrough.saturating_sub(1);
            if st.passthrough > 0 {
                let r = record(ino, st);
                self.log_record(r);
                drop(g);
                reply.error(fuser::Errno::EIO);
                return false;
            }
            st.cached += 1;
            let r = record(ino, st);
            self.log_record(r);
            drop(g);
            self.reply_cached(reply);
            return false;
        };
        let r = record(ino, st);
        self.log_record(r);
        drop(g);
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        // Registered before the reply: a release may arrive on another thread right after it.
        let copy = copy
            .filter(|_| pinned)
            .map(|(layer, node)| (layer.clone(), node));
        self.open.lock().insert(fh, (id.clone(), copy));
        reply.opened_passthrough(FileHandle(fh), FopenFlags::empty(), &id);
        true
    }

    /// Accounts the release of handle `fh` of `ino` (0 = cached open); a passthrough handle
    /// unpins its copy.
    pub fn release(&self, l2: &DiskCache, ino: u64, fh: u64) {
        if !self.active() {
            return;
        }
        let handle = if fh == 0 {
            None
        } else {
            self.open.lock().remove(&fh)
        };
        // fh != 0 unknown: a passthrough handle of the daemon this one took over from (its
        // pinned copy died with it; its backing id is held in `inherited`).
        let was_pt = fh != 0;
        let inherited = fh != 0 && handle.is_none();
        if let Some((_, Some((layer, node)))) = handle {
            l2.unpin_file(&layer, node);
        }
        let mut g = self.inos.lock();
        if let Some(st) = g.get_mut(&ino) {
            if was_pt {
                st.passthrough = st.passthrough.saturating_sub(1);
            } else {
                st.cached = st.cached.saturating_sub(1);
            }
            if inherited {
                st.inherited_pt = st.inherited_pt.saturating_sub(1);
                if st.inherited_pt == 0 {
                    st.inherited = None;
                }
            }
            let r = record(ino, st);
            if st.cached == 0 && st.passthrough == 0 {
                g.remove(&ino);
            }
            self.log_record(r);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_successor_answers_opens_like_its_predecessor() {
        let p = Passthrough::new(true);
        p.available.store(true, Ordering::Relaxed);
        let (tx, rx) = std::sync::mpsc::channel();
        p.set_open_log(tx);
        let rec = |ino, cached, passthrough, backing| OpenRecord {
            ino,
            cached,
            passthrough,
            backing,
        };
        p.restore_opens(&[rec(5, 1, 0, None), rec(6, 0, 2, Some(9))]);
        assert_eq!(
            p.begin_open(5, true),
            OpenMode::Cached,
            "the predecessor's cached open is live"
        );
        assert_eq!(
            p.begin_open(6, false),
            OpenMode::Passthrough,
            "the predecessor's passthrough opens are live"
        );
        assert_eq!(p.begin_open(7, true), OpenMode::Passthrough);
        let sent: Vec<_> = rx.try_iter().collect();
        assert_eq!(
            sent,
            vec![
                rec(5, 2, 0, None),
                rec(6, 0, 3, Some(9)),
                rec(7, 0, 1, None)
            ]
        );
        // Releases of the predecessor's handles (fh unknown) count down its opens.
        let dir = tempfile::tempdir().unwrap();
        let l2 = DiskCache::open(
            dir.path(),
            1 << 20,
            Arc::new(crate::metrics::Metrics::new()),
        )
        .unwrap();
        p.release(&l2, 6, 77);
        p.release(&l2, 5, 0);
        let sent: Vec<_> = rx.try_iter().collect();
        assert_eq!(sent, vec![rec(6, 0, 2, Some(9)), rec(5, 1, 0, None)]);
        let g = p.inos.lock();
        assert_eq!(g.get(&6).map(|s| s.inherited_pt), Some(1));
    }

    #[test]
    fn open_mode_follows_live_opens() {
        assert_eq!(decide_open_mode(true, 0, 0), OpenMode::Passthrough);
        assert_eq!(decide_open_mode(false, 0, 0), OpenMode::Cached);
        assert_eq!(
            decide_open_mode(true, 1, 0),
            OpenMode::Cached,
            "cached opens live"
        );
        assert_eq!(decide_open_mode(true, 0, 2), OpenMode::Passthrough);
        assert_eq!(
            decide_open_mode(false, 0, 1),
            OpenMode::Passthrough,
            "must match live mode"
        );
    }
}
