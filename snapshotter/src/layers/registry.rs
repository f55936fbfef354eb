//! The layer registry of [`LayerStore`]: exposing a layer (slot, inode table, keeper record,
//! background fill or native tree), the start-up prefetch, removing a layer, looking layers up
//! and reporting their state.
//!
//! Invariants: a digest keeps its slot for the life of the sessions (inode numbers encode the
//! slot, see [`crate::fs::layer`]); a new slot reaches the keepers before any inode of the
//! layer reaches the kernel; a layer's TOC must fit its blob ([`LayerError::TocMismatch`]).

use super::alloc::release_free_heap;
use super::post_fill::PostFill;
use super::{LayerError, LayerStore, TocReload};
use crate::fetch::fill::run_fill;
use crate::fetch::{run_prefetch, FillState, RangeSource};
use crate::fs::layer::{Layer, ROOT_INO};
use fuser::INodeNo;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use weenv_format::{Digest, FrameIdx, Toc};

/// State of one mounted layer.
#[derive(Clone, Debug, serde::Serialize)]
pub struct LayerStatus {
    pub digest: Digest,
    pub path: PathBuf,
    /// TOC entries.
    pub entries: usize,
    /// Heap bytes of the layer's in-memory TOC (compact table, frames, read state).
    pub toc_bytes: u64,
    /// Uncompressed bytes of all frames.
    pub bytes_total: u64,
    /// Uncompressed bytes of the frames in L2.
    pub bytes_cached: u64,
    /// Compressed (blob) bytes of the frames in L2: what fetching them cost on the link.
    pub bytes_fetched: u64,
    /// Of those, compressed bytes the background fill fetched.
    pub bytes_filled: u64,
    /// Of those, compressed bytes the start-up prefetch fetched.
    pub bytes_prefetched: u64,
    /// File bytes read from the layer since it was added or the access log was reset
    /// (chunk granularity, see [`Layer::bytes_read`]).
    pub bytes_read: u64,
    pub frames_total: usize,
    pub frames_cached: usize,
    pub fill: FillState,
    pub fill_error: Option<String>,
    /// Frames named by the image's start-up profile (0: none).
    pub prefetch_frames: u64,
    /// Of those, frames in L2.
    pub prefetch_done: u64,
    pub prefetch_error: Option<String>,
    /// The diff_id the image claims for the layer.
    pub claimed_diff_id: Option<Digest>,
    /// The completion check (stream sha256 = claimed diff_id) passed.
    pub verified: bool,
    /// New mounts use the layer's native tree (see `fs::native`).
    pub native: bool,
    /// Why the layer is quarantined (reads fail with EIO), if it is.
    pub quarantined: Option<String>,
}

impl LayerStore {
    /// The directory of layer `digest` (whether or not it is mounted): on the plain session
    /// when there is one and the layer has no xattrs, else on the full session.
    pub fn layer_path(&self, digest: &Digest) -> PathBuf {
        let mount = match &self.plain {
            Some(p) if self.layer(digest).is_some_and(|l| self.on_plain(&l)) => p,
            _ => &self.full,
        };
        mount.mountpoint.join(digest.hex())
    }

    /// True if new mounts see `layer` on the plain session (mounted, and the layer has no
    /// xattrs).
    pub(super) fn on_plain(&self, layer: &Layer) -> bool {
        layer.plain && self.plain.is_some()
    }

    /// True if `dir` is a directory of layer `digest` on one of the sessions (the full session
    /// lists every layer: a snapshot made before the plain session existed keeps working).
    pub fn serves_dir(&self, digest: &Digest, dir: &Path) -> bool {
        let Some(l) = self.layer(digest) else {
            return false;
        };
        self.mounts()
            .any(|m| m.kind().serves(&l) && m.mountpoint.join(digest.hex()) == dir)
    }

    /// Exposes a layer (idempotent) and starts its background fill. The returned directory
    /// is immediately usable as an overlayfs lowerdir; no file content is fetched.
    pub fn add_layer(
        &self,
        digest: &Digest,
        toc: Toc,
        source: Arc<dyn RangeSource>,
    ) -> Result<PathBuf, LayerError> {
        self.add_layer_claimed(digest, toc, source, None, None)
    }

    /// [`Self::add_layer`] for a layer whose image claims diff_id `claim`: the completion
    /// check compares the stream's sha256 with it and quarantines the layer on a mismatch.
    /// `reload` reads the full TOC again for that check; without one a copy of the decoded
    /// TOC is kept in memory (tests).
    pub fn add_layer_claimed(
        &self,
        digest: &Digest,
        toc: Toc,
        source: Arc<dyn RangeSource>,
        claim: Option<Digest>,
        reload: Option<TocReload>,
    ) -> Result<PathBuf, LayerError> {
        if !self.full.live() {
            return Err(LayerError::ShutDown);
        }
        if self.has_layer(digest) {
            return Ok(self.layer_path(digest));
        }
        let size = source.size().unwrap_or(u64::MAX);
        for (index, f) in toc.frames.iter().enumerate() {
            let end = f.offset.saturating_add(f.clen);
            if end > size {
                return Err(LayerError::TocMismatch {
                    digest: digest.clone(),
                    index,
                    end,
                    size,
                });
            }
        }
        let (slot, new) = {
            let mut g = self.st.layers.write();
            match g.slot_of.get(digest) {
                Some(s) => (*s, false),
                None => {
                    let s = u32::try_from(g.by_slot.len())
                        .ok()
                        .filter(|s| *s < crate::fs::layer::MAX_SLOTS)
                        .ok_or_else(|| LayerError::TooManyLayers {
                            digest: digest.clone(),
                            max: crate::fs::layer::MAX_SLOTS,
                        })?;
                    g.slot_of.insert(digest.clone(), s);
                    g.by_slot.push(None);
                    (s, true)
                }
            }
        };
        if new {
            // Recorded before the layer is visible: no inode of it reaches the kernel first.
            for k in self.mounts().filter_map(|m| m.keeper.as_ref()) {
                if let Err(e) = k.slot(digest.as_str(), slot) {
                    tracing::warn!(error = %e, layer = %digest, "the keeper did not record the layer's slot; a successor cannot serve it");
                }
            }
        }
        let reload: TocReload = match reload {
            Some(r) => r,
            None => {
                let kept = Arc::new(toc.clone());
                Arc::new(move || Ok((*kept).clone()))
            }
        };
        self.reloads.lock().insert(digest.clone(), reload.clone());
        // Built outside the lock (a large TOC takes a while); the decoded TOC is dropped here.
        let built =
            Layer::new(digest.clone(), slot, toc, source).map_err(|source| LayerError::Table {
                digest: digest.clone(),
                error: source,
            })?;
        release_free_heap();
        let layer = {
            let mut g = self.st.layers.write();
            match g.by_slot.get(slot as usize) {
                Some(Some(l)) => l.clone(), // raced with another add_layer
                _ => {
                    let l = Arc::new(built);
                    l.trust.bind(self.st.quarantine.clone(), claim);
                    if let Some(s) = g.by_slot.get_mut(slot as usize) {
                        *s = Some(l.clone());
                    }
                    l
                }
            }
        };
        self.root_changed();
        let native = self.cfg.fill.native && self.st.store.l2().has_native(digest);
        if native {
            // Built before a restart: the layer was complete and verified (the store's
            // record restores `verified`; until then the tree is not used).
            layer.native.store(true, Ordering::Release);
            layer.fill.set_state(FillState::Done);
            self.st
                .metrics
                .native_layers
                .fetch_add(1, Ordering::Relaxed);
        } else if self.cfg.fill.enabled {
            let mut fills = self.fills.lock();
            if !fills.contains_key(digest) {
                // Copies serve passthrough, which only the full session has: a layer
                // new mounts see on the plain session gets none (an older snapshot on the
                // full session still copies a file at its first open).
                let materialise_min = (self.cfg.passthrough
                    && self.cfg.fill.materialise_min_bytes != u64::MAX
                    && !self.on_plain(&layer))
                .then_some(self.cfg.fill.materialise_min_bytes);
                let after = PostFill {
                    st: self.st.clone(),
                    layer: layer.clone(),
                    reload: reload.clone(),
                    materialise_min,
                    native: self.cfg.fill.native,
                };
                let h = self.st.rt.spawn(run_fill(
                    self.st.store.clone(),
                    layer.frames.clone(),
                    layer.source.clone(),
                    self.cfg.fill.clone(),
                    layer.fill.clone(),
                    self.fill_budget.clone(),
                    Some(after.into_after_fill()),
                ));
                fills.insert(digest.clone(), h);
            }
        } else {
            layer.fill.set_state(FillState::Disabled);
        }
        tracing::info!(layer = %digest, entries = layer.entries, frames = layer.frames.frames.len(), toc_bytes = layer.toc_bytes(), "layer added");
        Ok(self.layer_path(digest))
    }

    /// Starts the start-up prefetch of `frames` of layer `digest` (no-op when the layer is
    /// not exposed, the list is empty or prefetch is off in the config).
    pub fn prefetch(&self, digest: &Digest, frames: Vec<FrameIdx>) {
        if !self.cfg.fill.prefetch || frames.is_empty() {
            return;
        }
        let Some(layer) = self.layer(digest) else {
            return;
        };
        // The header checks will want the frames holding the headers of the profile's files.
        let frames = if self.cfg.fill.check_headers && !layer.trust.walked() {
            crate::fs::trust::with_header_frames(&layer, frames)
        } else {
            frames
        };
        // Another image (or a second Prepare) may name the same frames: only new ones.
        let frames = layer.claim_prefetch(&frames);
        if frames.is_empty() {
            return;
        }
        tracing::debug!(layer = %digest, frames = frames.len(), "start-up prefetch");
        self.st.rt.spawn(run_prefetch(
            self.st.store.clone(),
            layer.frames.clone(),
            layer.source.clone(),
            frames,
            self.cfg.fill.prefetch_batch_bytes,
            layer.prefetch.clone(),
        ));
    }

    /// (file bytes, TOC entries) of exposed layer `digest`, as reported for its snapshot usage.
    pub fn usage(&self, digest: &Digest) -> Option<(i64, i64)> {
        self.layer(digest)
            .map(|l| (l.file_bytes as i64, l.entries as i64))
    }

    /// Frames in the TOC of exposed layer `digest`.
    pub fn frame_count(&self, digest: &Digest) -> Option<usize> {
        self.layer(digest).map(|l| l.frames.frames.len())
    }

    pub(super) fn layer(&self, digest: &Digest) -> Option<Arc<Layer>> {
        let g = self.st.layers.read();
        let slot = *g.slot_of.get(digest)?;
        g.by_slot.get(slot as usize).cloned().flatten()
    }

    /// Files read from each exposed layer since it was added or [`LayerStore::reset_access`],
    /// in first-read order (paths relative to the layer root, byte ranges read; empty = all).
    pub fn accessed(&self) -> Vec<(Digest, Vec<crate::fs::layer::FileRanges>)> {
        self.all_layers()
            .iter()
            .map(|l| (l.digest.clone(), l.accessed()))
            .collect()
    }

    /// Forgets every layer's access log.
    pub fn reset_access(&self) {
        for l in self.all_layers() {
            l.reset_access();
        }
    }

    pub(super) fn all_layers(&self) -> Vec<Arc<Layer>> {
        self.st
            .layers
            .read()
            .by_slot
            .iter()
            .flatten()
            .cloned()
            .collect()
    }

    /// The mount root's listing changed (a layer came or went): the kernel caches directory
    /// listings for the whole session (see `WeenvFs::opendir`), so the root inode's cached
    /// listing and attributes are dropped.
    pub(super) fn root_changed(&self) {
        for m in self.mounts() {
            m.root_changed();
        }
    }

    /// True if `digest` is exposed.
    pub fn has_layer(&self, digest: &Digest) -> bool {
        let g = self.st.layers.read();
        g.slot_of
            .get(digest)
            .is_some_and(|s| matches!(g.by_slot.get(*s as usize), Some(Some(_))))
    }

    /// Stops exposing a layer (its directory disappears; cached frames stay in L2 until
    /// evicted). The caller must have unmounted every overlay that uses it.
    pub fn remove_layer(&self, digest: &Digest) -> Result<(), LayerError> {
        {
            let mut g = self.st.layers.write();
            let slot = *g
                .slot_of
                .get(digest)
                .ok_or_else(|| LayerError::NotFound(digest.clone()))?;
            match g.by_slot.get_mut(slot as usize) {
                Some(s @ Some(_)) => *s = None,
                _ => return Err(LayerError::NotFound(digest.clone())),
            }
        }
        if let Some(h) = self.fills.lock().remove(digest) {
            h.abort();
        }
        self.reloads.lock().remove(digest);
        for n in self.mounts().filter_map(|m| m.notifier.as_ref()) {
            let _ = n.inval_entry(INodeNo(ROOT_INO), OsStr::new(digest.hex()));
        }
        self.root_changed();
        self.st.store.l2().remove_layer_files(digest);
        // No snapshot names the layer any more (the caller checked), so neither its tree.
        self.st.store.l2().remove_native(digest);
        tracing::info!(layer = %digest, "layer removed");
        Ok(())
    }

    /// Mounted layers with cache and fill state.
    pub fn status(&self) -> Vec<LayerStatus> {
        let layers = self.all_layers();
        let l2 = self.st.store.l2();
        layers
            .iter()
            .map(|l| {
                let (mut frames_cached, mut bytes_cached, mut bytes_fetched) = (0, 0, 0);
                let native = l.native_ok() && l2.has_native(&l.digest);
                for f in &l.frames.frames {
                    // A native layer holds every byte in its tree (its frames are dropped).
                    if native || l2.contains(&f.digest) {
                        frames_cached += 1;
                        bytes_cached += f.ulen;
                        bytes_fetched += f.clen;
                    }
                }
                LayerStatus {
                    digest: l.digest.clone(),
                    path: self.layer_path(&l.digest),
                    entries: l.entries,
                    toc_bytes: l.toc_bytes(),
                    bytes_total: l.bytes_total(),
                    bytes_cached,
                    bytes_fetched,
                    bytes_filled: l.fill.bytes_fetched.load(Ordering::Relaxed),
                    bytes_prefetched: l.prefetch.bytes_fetched.load(Ordering::Relaxed),
                    bytes_read: l.bytes_read(),
                    frames_total: l.frames.frames.len(),
                    frames_cached,
                    fill: l.fill.state(),
                    fill_error: l.fill.last_error(),
                    prefetch_frames: l.prefetch.frames_total.load(Ordering::Relaxed),
                    prefetch_done: l.prefetch.frames_done.load(Ordering::Relaxed),
                    prefetch_error: l.prefetch.last_error(),
                    claimed_diff_id: l.trust.claim(),
                    verified: l.trust.verified(),
                    native,
                    quarantined: l.trust.reason(),
                }
            })
            .collect()
    }
}
