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
//! EIO): ids are kept in `ino -> Weak<BackingId>`; each open holds a strong ref until release.

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

/// Passthrough state of the session.
pub struct Passthrough {
    /// Configured on.
    pub enabled: bool,
    /// The kernel accepted `FUSE_PASSTHROUGH` in init.
    pub available: AtomicBool,
    files_dir: PathBuf,
    backing: Mutex<HashMap<u64, Weak<BackingId>>>,
    open: Mutex<HashMap<u64, Arc<BackingId>>>,
    next_fh: AtomicU64,
    seq: AtomicU64,
}

impl Passthrough {
    /// State for `files_dir` (`<cache_dir>/files`).
    pub fn new(enabled: bool, files_dir: PathBuf) -> Self {
        Passthrough {
            enabled,
            available: AtomicBool::new(false),
            files_dir,
            backing: Mutex::new(HashMap::new()),
            open: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            seq: AtomicU64::new(0),
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
                let e = s + c.len as usize;
                out.write_all(
                    data.get(s..e)
                        .ok_or_else(|| std::io::Error::other("chunk outside frame"))?,
                )?;
            }
            out.sync_data()?;
            fs::rename(&tmp, &path)
        })();
        if let Err(e) = res {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        Ok(Some(path))
    }

    /// Answers an open of `ino` with passthrough to `path`; falls back to a normal open.
    pub fn open(&self, reply: ReplyOpen, ino: u64, path: &Path) -> bool {
        let file = match File::open(path) {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(error = %e, path = %path.display(), "cannot open complete file; serving through FUSE");
                reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE);
                return false;
            }
        };
        let id = {
            // Held across open_backing so two opens never create two ids for one inode.
            let mut map = self.backing.lock();
            match map.get(&ino).and_then(Weak::upgrade) {
                Some(id) => id,
                None => match reply.open_backing(&file) {
                    Ok(id) => {
                        let id = Arc::new(id);
                        map.insert(ino, Arc::downgrade(&id));
                        id
                    }
                    Err(e) => {
                        drop(map);
                        tracing::warn!(error = %e, "FUSE_DEV_IOC_BACKING_OPEN failed; serving through FUSE");
                        reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE);
                        return false;
                    }
                },
            }
        };
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        // Registered before the reply: a release may arrive on another thread right after it.
        self.open.lock().insert(fh, id.clone());
        reply.opened_passthrough(FileHandle(fh), FopenFlags::FOPEN_KEEP_CACHE, &id);
        true
    }

    /// Drops the backing reference of handle `fh` (from release).
    pub fn release(&self, ino: u64, fh: u64) {
        if fh == 0 {
            return;
        }
        if self.open.lock().remove(&fh).is_some() {
            let mut map = self.backing.lock();
            if map.get(&ino).is_some_and(|w| w.strong_count() == 0) {
                map.remove(&ino);
            }
        }
    }

    /// Removes the complete files of a layer.
    pub fn remove_layer(&self, layer_hex: &str) {
        let _ = fs::remove_dir_all(self.layer_dir(layer_hex));
    }
}
