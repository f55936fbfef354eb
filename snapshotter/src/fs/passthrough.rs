//! FUSE passthrough for files whose frames are all on disk.
//!
//! Such a file is materialised once as `<cache_dir>/files/<layer hex>/<node>` (assembled from
//! L2 frames, temp + rename; `cache_dir` must be on a non-stacked fs such as ext4, because the
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
use crate::cache::DiskCache;
use fuser::{BackingId, FileHandle, FopenFlags, ReplyOpen};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::fs::{self, File};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

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

/// Passthrough state of the session.
pub struct Passthrough {
    /// Configured on.
    pub enabled: bool,
    /// The kernel accepted `FUSE_PASSTHROUGH` in init.
    pub available: AtomicBool,
    files_dir: PathBuf,
    inos: Mutex<HashMap<u64, InoState>>,
    open: Mutex<HashMap<u64, Arc<BackingId>>>,
    next_fh: AtomicU64,
    seq: AtomicU64,
    /// Inodes being materialised in the background.
    materialising: Mutex<std::collections::HashSet<u64>>,
}

impl Passthrough {
    /// State for `files_dir` (`<cache_dir>/files`).
    pub fn new(enabled: bool, files_dir: PathBuf) -> Self {
        Passthrough {
            enabled,
            available: AtomicBool::new(false),
            files_dir,
            inos: Mutex::new(HashMap::new()),
            open: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            seq: AtomicU64::new(0),
            materialising: Mutex::new(std::collections::HashSet::new()),
        }
    }

    /// Removes temp files a crash left in the complete-files tree.
    pub fn clean_temp_files(&self) {
        let Ok(layers) = fs::read_dir(&self.files_dir) else {
            return;
        };
        for l in layers.flatten() {
            let Ok(files) = fs::read_dir(l.path()) else {
                continue;
            };
            for f in files.flatten() {
                if f.file_name().to_string_lossy().starts_with(".tmp.") {
                    let _ = fs::remove_file(f.path());
                }
            }
        }
    }

    /// Passthrough is configured and supported.
    pub fn active(&self) -> bool {
        self.enabled && self.available.load(Ordering::Relaxed)
    }

    /// Directory of the complete files of a layer.
    pub fn layer_dir(&self, layer_hex: &str) -> PathBuf {
        self.files_dir.join(layer_hex)
    }

    /// Path of the complete copy of `node` of `layer`.
    pub fn complete_path(&self, layer: &Layer, node: u32) -> PathBuf {
        self.layer_dir(layer.digest.hex()).join(node.to_string())
    }

    /// True if the complete copy of `node` (of `size` bytes) exists (e.g. from before a
    /// restart, even if its frames were evicted from L2 since).
    pub fn has_complete(&self, layer: &Layer, node: u32, size: u64) -> bool {
        fs::metadata(self.complete_path(layer, node)).is_ok_and(|m| m.len() == size)
    }

    /// The complete copy of file `node`, materialising it from L2 if every frame is there.
    /// `Ok(None)` if some frame is not on disk.
    pub fn materialise(
        &self,
        l2: &DiskCache,
        layer: &Layer,
        node: u32,
    ) -> std::io::Result<Option<PathBuf>> {
        let Some(n) = layer.table.node(node) else {
            return Ok(None);
        };
        let path = self.complete_path(layer, node);
        if fs::metadata(&path).is_ok_and(|m| m.len() == n.size) {
            return Ok(Some(path));
        }
        let Some(tmp) = self.write_temp(l2, layer, node, true)? else {
            return Ok(None);
        };
        if let Err(e) = fs::rename(&tmp, &path) {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        Ok(Some(path))
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
    /// with one `syncfs`, then renamed into place (not one fsync per file). Returns how many
    /// files were materialised.
    pub fn materialise_layer(
        &self,
        l2: &DiskCache,
        layer: &Layer,
        min_bytes: u64,
    ) -> std::io::Result<usize> {
        let mut temps = Vec::new();
        let res = (|| -> std::io::Result<()> {
            for (node, n) in layer.table.nodes.iter().enumerate() {
                let Ok(node) = u32::try_from(node) else {
                    break;
                };
                if n.kind != super::inode::NodeKind::File
                    || n.size == 0
                    || n.size < min_bytes
                    || self.has_complete(layer, node, n.size)
                {
                    continue;
                }
                if let Some(tmp) = self.write_temp(l2, layer, node, false)? {
                    temps.push((tmp, self.complete_path(layer, node)));
                }
            }
            if !temps.is_empty() {
                let dir = File::open(self.layer_dir(layer.digest.hex()))?;
                // SAFETY: syncfs on a valid, open descriptor; no memory is passed.
                if unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&dir)) } != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            for (tmp, path) in &temps {
                fs::rename(tmp, path)?;
            }
            Ok(())
        })();
        if let Err(e) = res {
            for (tmp, _) in &temps {
                let _ = fs::remove_file(tmp);
            }
            return Err(e);
        }
        Ok(temps.len())
    }

    /// Writes file `node` from its pinned L2 frames to a temp file next to its complete path
    /// (`sync`: fsync it). `Ok(None)` if some frame is not on disk.
    fn write_temp(
        &self,
        l2: &DiskCache,
        layer: &Layer,
        node: u32,
        sync: bool,
    ) -> std::io::Result<Option<PathBuf>> {
        let Some(n) = layer.table.node(node) else {
            return Ok(None);
        };
        let frames = layer.file_frames(node);
        let mut pins = Vec::new();
        for idx in &frames {
            let Some(f) = layer.toc.frames.get(idx.0 as usize) else {
                return Ok(None);
            };
            match l2.pin(&f.digest) {
                Some(p) => pins.push((*idx, p)),
                None => return Ok(None),
            }
        }
        let dir = self.layer_dir(layer.digest.hex());
        fs::create_dir_all(&dir)?;
        let tmp = dir.join(format!(
            ".tmp.{node}.{}",
            self.seq.fetch_add(1, Ordering::Relaxed)
        ));
        let res = (|| -> std::io::Result<()> {
            let mut out = File::create(&tmp)?;
            let mut cur: Option<(weenv_format::FrameIdx, Vec<u8>)> = None;
            for c in &n.chunks {
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
            Ok(())
        })();
        if let Err(e) = res {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        Ok(Some(tmp))
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

    /// Answers a reserved passthrough open with the complete file at `path` (None: it could
    /// not be made). Falls back to a cached open when the kernel refuses the backing file.
    pub fn reply_passthrough(&self, reply: ReplyOpen, ino: u64, path: Option<&Path>) -> bool {
        let file = match path.map(File::open) {
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
        self.open.lock().insert(fh, id.clone());
        reply.opened_passthrough(FileHandle(fh), FopenFlags::empty(), &id);
        true
    }

    /// Accounts the release of handle `fh` of `ino` (0 = cached open).
    pub fn release(&self, ino: u64, fh: u64) {
        if !self.active() {
            return;
        }
        let was_pt = fh != 0 && self.open.lock().remove(&fh).is_some();
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

    /// Removes the complete files of a layer.
    pub fn remove_layer(&self, layer_hex: &str) {
        let _ = fs::remove_dir_all(self.layer_dir(layer_hex));
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
