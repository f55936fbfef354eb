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

use super::layer::Layer;
use crate::cache::disk::FileReservation;
use crate::cache::DiskCache;
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
        let id = match (st.backing.upgrade(), file) {
            (Some(id), _) => Some(id),
            (None, Some(f)) => match reply.open_backing(&f) {
                Ok(id) => {
                    let id = Arc::new(id);
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
                drop(g);
                reply.error(fuser::Errno::EIO);
                return false;
            }
            st.cached += 1;
            drop(g);
            self.reply_cached(reply);
            return false;
        };
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
        if fh != 0 && handle.is_none() {
            // A handle of the daemon this one took the session over from: its open state
            // and pinned copy died with it.
            return;
        }
        let was_pt = handle.is_some();
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
            if st.cached == 0 && st.passthrough == 0 {
                g.remove(&ino);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
