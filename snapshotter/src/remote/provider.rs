//! [`WeenvLayers`]: the real [`LayerProvider`]: detects weenv layers in the registry, fetches
//! and caches their TOCs, and exposes them through the node's FUSE [`LayerStore`].
//!
//! Per layer digest, once per node: one ranged GET of the TOC when the image manifest carries
//! the TOC hint (`io.weenv.toc.*`, see [`super::image`]), else one HEAD (size) and one or two
//! tail reads (footer + TOC). The result is recorded in the metadata store (`layers` table): a
//! weenv layer with its cached TOC, or a negative entry so non-weenv layers are probed once
//! only. Layers are keyed by digest, so the same layer under any chain or image reuses the
//! same FUSE dir; a per-digest lock makes concurrent requests for one layer fetch it once.
//!
//! Image warm-up: the first Prepare of an image whose labels name its manifest reads the
//! manifest (one small GET) and then, in the background, exposes every weenv layer of the
//! image and starts each one's start-up prefetch (the image's profile) — so the TOCs and the
//! profile's frames travel while containerd is still preparing the other layers and creating
//! the container, and the Prepares that follow find their layer already there. A layer warmed
//! up for a pull that is then abandoned stays exposed (no snapshot refers to it) until the
//! daemon restarts.

use super::image::{ImageCache, ImageInfo, LayerDesc, Local, LocalBlobs};
use super::probe::{classify_tail, probe_range, TailVerdict};
use super::toc_cache::TocCache;
use super::{LayerProvider, MountedLayer, RemoteError, RemoteLayerRequest};
use crate::layers::LayerStore;
use crate::store::{LayerKind, LayerRecord, MetaStore};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use tracing::{debug, info, warn};
use weenv_format::{Digest, EntryKind, Toc};
use weenv_registry::RegistryRangeSource;
use weenv_registry::{Client, Reference};

/// Registry-backed weenv layers on one FUSE session.
pub struct WeenvLayers {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<MetaStore>,
    layers: Arc<LayerStore>,
    registry: Client,
    tocs: TocCache,
    images: ImageCache,
    /// containerd's content store: manifests and configs `weenv run` already wrote there.
    local: Option<Arc<dyn LocalBlobs>>,
    /// Per layer digest: held while the layer is detected/exposed (entry dropped after).
    locks: Mutex<HashMap<Digest, Arc<tokio::sync::Mutex<()>>>>,
    /// Manifests whose warm-up was started.
    warmed: Mutex<HashSet<String>>,
}

/// (size, inodes) reported as usage of a remote snapshot.
pub fn toc_usage(toc: &Toc) -> (i64, i64) {
    let size: u64 = toc
        .entries
        .iter()
        .filter(|e| e.kind == EntryKind::File)
        .map(|e| e.size)
        .sum();
    (size as i64, toc.entries.len() as i64)
}

impl WeenvLayers {
    pub fn new(
        store: Arc<MetaStore>,
        layers: Arc<LayerStore>,
        registry: Client,
        tocs: TocCache,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                layers,
                registry,
                tocs,
                images: ImageCache::default(),
                local: None,
                locks: Mutex::new(HashMap::new()),
                warmed: Mutex::new(HashSet::new()),
            }),
        }
    }

    /// Reads image manifests and configs from `local` (containerd's content store) before the
    /// registry; only bytes matching their digest are used.
    pub fn with_local(mut self, local: Arc<dyn LocalBlobs>) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.local = Some(local);
        }
        self
    }

    /// The FUSE layer store (status, shutdown).
    pub fn layer_store(&self) -> &Arc<LayerStore> {
        &self.inner.layers
    }
}

impl Inner {
    /// The layers of the image `req` names (cache, content store, registry).
    async fn image(&self, req: &RemoteLayerRequest) -> Result<ImageInfo, String> {
        let local = match (&self.local, req.namespace.as_deref()) {
            (Some(blobs), Some(namespace)) => Some(Local {
                blobs: blobs.as_ref(),
                namespace,
            }),
            _ => None,
        };
        self.images
            .get(
                &self.registry,
                local,
                &req.reference,
                req.manifest.as_deref(),
            )
            .await
    }

    fn reg_err(&self, reference: &str, d: &Digest, m: impl ToString) -> RemoteError {
        RemoteError::Registry {
            reference: reference.to_string(),
            digest: d.to_string(),
            message: m.to_string(),
        }
    }

    fn lock_for(&self, d: &Digest) -> Arc<tokio::sync::Mutex<()>> {
        self.locks.lock().entry(d.clone()).or_default().clone()
    }

    /// Drops the lock entry of `d` when nobody else holds or waits for it.
    fn unlock(&self, d: &Digest, lock: Arc<tokio::sync::Mutex<()>>) {
        let mut locks = self.locks.lock();
        // Ours and the map's: no other task has it.
        if Arc::strong_count(&lock) == 2 {
            locks.remove(d);
        }
    }

    /// Exposes layer `d` in the FUSE session; `claim`: the diff_id its completion check must
    /// find. The returned layer names no TOC digest or claim (the caller knows them).
    fn expose(
        &self,
        d: &Digest,
        reference: &str,
        size: u64,
        toc: Toc,
        claim: Option<&Digest>,
    ) -> Result<MountedLayer, RemoteError> {
        let r: Reference = reference
            .parse()
            .map_err(|e| self.reg_err(reference, d, e))?;
        let (usize_, inodes) = toc_usage(&toc);
        let src = Arc::new(RegistryRangeSource::new(
            self.registry.clone(),
            r,
            d.clone(),
            Some(size),
        ));
        // The full TOC is kept on disk only (verified again when read back).
        let reload: crate::layers::TocReload = {
            let (tocs, d) = (self.tocs.clone(), d.clone());
            Arc::new(move || {
                tocs.get(&d, size, None)
                    .map(|(_, toc)| toc)
                    .map_err(|e| e.to_string())
            })
        };
        let dir = self
            .layers
            .add_layer_claimed(d, toc, src, claim.cloned(), Some(reload))
            .map_err(|e| RemoteError::Mount {
                digest: d.to_string(),
                message: e.to_string(),
            })?;
        Ok(MountedLayer {
            dir,
            size: usize_,
            inodes,
            toc_digest: None,
            diff_id: None,
        })
    }

    /// HEAD + tail read(s); `Ok(None)` for a non-weenv blob.
    async fn probe(
        &self,
        r: &Reference,
        reference: &str,
        d: &Digest,
    ) -> Result<Option<(u64, Vec<u8>)>, RemoteError> {
        let size = self
            .registry
            .head_blob(r, d)
            .await
            .map_err(|e| self.reg_err(reference, d, e))?
            .ok_or_else(|| self.reg_err(reference, d, "blob not found in the registry"))?;
        let (off, len) = probe_range(size);
        let tail = self
            .registry
            .get_blob_range(r, d, off, len)
            .await
            .map_err(|e| self.reg_err(reference, d, e))?;
        let toc_err = |e: weenv_format::FormatError| RemoteError::Toc {
            digest: d.to_string(),
            message: e.to_string(),
        };
        match classify_tail(&tail, size).map_err(toc_err)? {
            TailVerdict::NotWeenv { reason } => {
                debug!(digest = %d, reason, "not a weenv layer");
                Ok(None)
            }
            TailVerdict::Complete { len } => {
                Ok(Some((size, tail[tail.len() - len as usize..].to_vec())))
            }
            TailVerdict::Need { offset, len } => {
                let t = self
                    .registry
                    .get_blob_range(r, d, offset, len)
                    .await
                    .map_err(|e| self.reg_err(reference, d, e))?;
                Ok(Some((size, t.to_vec())))
            }
        }
    }

    /// Detects (once) and exposes layer `d` of image `reference`; `Ok(None)` for a layer that
    /// is not a weenv layer. `desc`: what the manifest and config say about it (size, TOC hint:
    /// one ranged GET instead of a probe; the claimed diff_id, without which the layer is not
    /// exposed: see [`super::identity`]).
    async fn mount_one(
        &self,
        reference: &str,
        d: &Digest,
        desc: Option<&LayerDesc>,
    ) -> Result<Option<MountedLayer>, RemoteError> {
        let lock = self.lock_for(d);
        let res = {
            let _held = lock.lock().await;
            self.mount_locked(reference, d, desc).await
        };
        self.unlock(d, lock);
        res
    }

    async fn mount_locked(
        &self,
        reference: &str,
        d: &Digest,
        desc: Option<&LayerDesc>,
    ) -> Result<Option<MountedLayer>, RemoteError> {
        let identity_err = |reason: String| RemoteError::Identity {
            digest: d.to_string(),
            reason,
        };
        let known = self.store.layer(d.as_str()).map_err(|e| store_err(d, e))?;
        if let Some(LayerRecord {
            kind: LayerKind::NotWeenv,
            ..
        }) = known
        {
            return Ok(None);
        }
        let claim = desc.and_then(|x| x.diff_id.clone()).ok_or_else(|| {
            identity_err(
                "the image config's diff_id for this layer is unknown (config unreadable, or \
                 the manifest does not list the layer once with one claim)"
                    .into(),
            )
        })?;
        let hint_toc = desc.and_then(|x| x.hint.as_ref()).map(|h| &h.digest);
        if let Some(rec) = known {
            super::identity::reuse_verdict(&rec, &claim, hint_toc).map_err(identity_err)?;
            let bound_toc: Option<Digest> = rec.toc_digest.as_deref().and_then(|t| t.parse().ok());
            let mounted = match self.layers.usage(d) {
                Some((size, inodes)) => Some(MountedLayer {
                    dir: self.layers.layer_path(d),
                    size,
                    inodes,
                    toc_digest: bound_toc.clone(),
                    diff_id: None,
                }),
                None => match self.tocs.get(d, rec.size, bound_toc.as_ref()) {
                    Ok((td, toc)) => {
                        let mut m = self.expose(d, &rec.reference, rec.size, toc, Some(&claim))?;
                        m.toc_digest = Some(td);
                        Some(m)
                    }
                    Err(e) => {
                        info!(digest = %d, error = %e, "cached TOC unusable; fetching it again");
                        None
                    }
                },
            };
            if let Some(mut m) = mounted {
                if rec.diff_id.is_none() || rec.toc_digest.is_none() {
                    // A record of an older daemon: bound now, to the first claim.
                    let (c, t) = (
                        claim.to_string(),
                        m.toc_digest.as_ref().map(|t| t.to_string()),
                    );
                    self.store
                        .update_layer(d.as_str(), |r| {
                            r.diff_id.get_or_insert(c);
                            if r.toc_digest.is_none() {
                                r.toc_digest = t;
                            }
                        })
                        .map_err(|e| store_err(d, e))?;
                    self.layers.set_claim(d, &claim);
                }
                m.diff_id = Some(claim);
                return Ok(Some(m));
            }
        }
        let r: Reference = reference
            .parse()
            .map_err(|e| self.reg_err(reference, d, e))?;
        let hinted = desc.and_then(|x| {
            x.hint
                .as_ref()
                .filter(|h| h.offset.checked_add(h.length) == Some(x.size))
                .map(|h| (x.size, h))
        });
        let (size, tail) = match hinted {
            Some((size, h)) => {
                let t = self
                    .registry
                    .get_blob_range(&r, d, h.offset, h.length)
                    .await
                    .map_err(|e| self.reg_err(reference, d, e))?;
                (size, t.to_vec())
            }
            None => {
                let Some(found) = self.probe(&r, reference, d).await? else {
                    self.store
                        .put_layer(&LayerRecord::not_weenv(
                            d.to_string(),
                            reference.to_string(),
                        ))
                        .map_err(|e| store_err(d, e))?;
                    return Ok(None);
                };
                found
            }
        };
        let (toc_digest, toc) = self
            .tocs
            .put(d, &tail, size, hint_toc)
            .map_err(|e| toc_put_err(d, e))?;
        self.store
            .put_layer(&LayerRecord {
                digest: d.to_string(),
                reference: reference.to_string(),
                size,
                kind: LayerKind::Weenv {
                    toc_path: self.tocs.path(d),
                },
                toc_digest: Some(toc_digest.to_string()),
                diff_id: Some(claim.to_string()),
                verified: false,
                quarantined: None,
            })
            .map_err(|e| store_err(d, e))?;
        info!(digest = %d, reference, entries = toc.entries.len(), hinted = hinted.is_some(),
            toc = %toc_digest, claimed_diff_id = %claim, "weenv layer detected");
        let mut m = self.expose(d, reference, size, toc, Some(&claim))?;
        m.toc_digest = Some(toc_digest);
        m.diff_id = Some(claim);
        Ok(Some(m))
    }

    /// Starts the prefetch of layer `d` from its manifest description (no-op without one).
    fn start_prefetch(&self, reference: &str, desc: &LayerDesc) {
        let Some(value) = desc.prefetch.as_deref() else {
            return;
        };
        let Some(frames) = self.layers.frame_count(&desc.digest) else {
            return;
        };
        match weenv_format::prefetch::decode_frames(value, frames) {
            Ok(f) => self.layers.prefetch(&desc.digest, f),
            Err(e) => {
                warn!(digest = %desc.digest, reference, error = %e, "bad start-up profile in the image manifest; no prefetch")
            }
        }
    }

    /// Exposes every weenv layer of the image and starts their prefetch (once per manifest).
    async fn warm_up(self: Arc<Self>, reference: String, manifest: String, info: ImageInfo) {
        {
            let mut warmed = self.warmed.lock();
            if warmed.len() >= super::image::IMAGE_CACHE_ENTRIES {
                warmed.clear(); // bounded; warming an image again only finds its layers there
            }
            if !warmed.insert(manifest) {
                return;
            }
        }
        let jobs = info.iter().filter(|l| l.hint.is_some()).map(|l| {
            let (me, reference) = (self.clone(), reference.clone());
            async move {
                match me.mount_one(&reference, &l.digest, Some(l)).await {
                    Ok(Some(_)) => me.start_prefetch(&reference, l),
                    Ok(None) => {}
                    Err(e) => {
                        debug!(digest = %l.digest, error = %e, "warm-up of a layer failed; its Prepare will try again")
                    }
                }
            }
        });
        futures::future::join_all(jobs).await;
    }
}

#[async_trait::async_trait]
impl LayerProvider for WeenvLayers {
    async fn mount(&self, req: &RemoteLayerRequest) -> Result<Option<MountedLayer>, RemoteError> {
        let me = &self.inner;
        let d = &req.digest;
        // What the manifest and config say (cached per manifest digest): TOC hint, profile
        // and the claimed diff_id.
        let info = match req.manifest.as_deref() {
            Some(m) => match me.image(req).await {
                Ok(info) => {
                    if let Ok(rt) = tokio::runtime::Handle::try_current() {
                        rt.spawn(me.clone().warm_up(
                            req.reference.clone(),
                            m.to_string(),
                            info.clone(),
                        ));
                    }
                    Some(info)
                }
                Err(e) => {
                    debug!(reference = %req.reference, error = %e, "image manifest unreadable");
                    None
                }
            },
            // No manifest digest in the labels: the manifest the reference names now.
            None => me.image(req).await.ok(),
        };
        let desc = info
            .as_ref()
            .and_then(|i| i.iter().find(|l| &l.digest == d));
        let m = me.mount_one(&req.reference, d, desc).await?;
        if m.is_some() {
            match desc {
                Some(desc) => me.start_prefetch(&req.reference, desc),
                None => self.prefetch(req),
            }
        }
        Ok(m)
    }

    async fn remount(&self, d: &Digest) -> Result<MountedLayer, RemoteError> {
        let me = &self.inner;
        let rec = me
            .store
            .layer(d.as_str())
            .map_err(|e| store_err(d, e))?
            .filter(|r| matches!(r.kind, LayerKind::Weenv { .. }))
            .ok_or_else(|| RemoteError::NotCached {
                digest: d.to_string(),
            })?;
        let bound_toc: Option<Digest> = rec.toc_digest.as_deref().and_then(|t| t.parse().ok());
        let claim: Option<Digest> = rec.diff_id.as_deref().and_then(|t| t.parse().ok());
        let mut m = match me.tocs.get(d, rec.size, bound_toc.as_ref()) {
            Ok((_, toc)) => me.expose(d, &rec.reference, rec.size, toc, claim.as_ref())?,
            Err(e) => {
                // Lost or damaged cache file: fetch the TOC again from the registry (it must
                // be the TOC the layer was bound to).
                info!(digest = %d, error = %e, "cached TOC unusable; refetching it");
                let r: Reference = rec
                    .reference
                    .parse()
                    .map_err(|e| me.reg_err(&rec.reference, d, e))?;
                let (size, tail) =
                    me.probe(&r, &rec.reference, d)
                        .await?
                        .ok_or_else(|| RemoteError::Toc {
                            digest: d.to_string(),
                            message: "the registry blob is no longer a weenv layer".into(),
                        })?;
                let (_, toc) = me
                    .tocs
                    .put(d, &tail, size, bound_toc.as_ref())
                    .map_err(|e| toc_put_err(d, e))?;
                me.expose(d, &rec.reference, size, toc, claim.as_ref())?
            }
        };
        if let Some(reason) = &rec.quarantined {
            me.layers.restore_quarantine(d, reason.clone());
        } else if rec.verified && bound_toc.is_some() {
            me.layers.restore_verified(d);
        }
        m.toc_digest = bound_toc;
        m.diff_id = claim;
        Ok(m)
    }

    fn prefetch(&self, req: &RemoteLayerRequest) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (me, req) = (self.inner.clone(), req.clone());
        rt.spawn(async move {
            let info = match me.image(&req).await {
                Ok(i) => i,
                Err(e) => {
                    warn!(digest = %req.digest, reference = %req.reference, error = %e, "cannot read the image manifest for its start-up profile; no prefetch");
                    return;
                }
            };
            if let Some(desc) = info.iter().find(|l| l.digest == req.digest) {
                me.start_prefetch(&req.reference, desc);
            }
        });
    }

    fn native_dir(&self, d: &Digest) -> Option<std::path::PathBuf> {
        self.inner.layers.native_dir(d)
    }

    fn native_path(&self, d: &Digest) -> Option<std::path::PathBuf> {
        Some(self.inner.layers.native_path(d))
    }

    fn hold_native(&self, d: &Digest, hold: bool) -> bool {
        self.inner.layers.hold_native(d, hold)
    }

    fn native_restored(&self) {
        self.inner.layers.native_restored();
    }

    fn serves_dir(&self, d: &Digest, dir: &std::path::Path) -> bool {
        self.inner.layers.serves_dir(d, dir)
    }

    fn verdict(&self, d: &Digest) -> Option<super::Verdict> {
        let me = &self.inner;
        if let Some(v) = me.layers.verdict(d) {
            return Some(v);
        }
        let rec = me.store.layer(d.as_str()).ok().flatten()?;
        if let Some(r) = rec.quarantined {
            return Some(super::Verdict::Quarantined(r));
        }
        rec.verified.then_some(super::Verdict::Verified)
    }

    async fn verify(&self, d: &Digest) -> Result<super::Verdict, RemoteError> {
        if let Some(v) = self.verdict(d) {
            return Ok(v);
        }
        self.inner
            .layers
            .verify_now(d)
            .await
            .map_err(|e| RemoteError::Verify {
                digest: d.to_string(),
                message: e.to_string(),
            })
    }

    fn quarantined(&self, d: &Digest) -> Option<String> {
        let me = &self.inner;
        if let Some(r) = me.layers.quarantine_reason(d) {
            return Some(r);
        }
        me.store.layer(d.as_str()).ok().flatten()?.quarantined
    }

    fn release(&self, d: &Digest) -> Result<(), RemoteError> {
        let me = &self.inner;
        if !me.layers.has_layer(d) {
            return Ok(());
        }
        me.layers.remove_layer(d).map_err(|e| RemoteError::Mount {
            digest: d.to_string(),
            message: e.to_string(),
        })
    }
}

/// A TOC over the configured limits is [`RemoteError::Limit`]; any other failure `Toc`.
fn toc_put_err(d: &Digest, e: super::toc_cache::TocCacheError) -> RemoteError {
    match e {
        super::toc_cache::TocCacheError::Limit {
            what,
            value,
            limit,
            key,
            ..
        } => RemoteError::Limit(format!(
            "its TOC {what} is {value}, over the limit of {limit}; the layer is refused \
             (raise `limits.{key}` in the daemon config to accept it)"
        )),
        e => RemoteError::Toc {
            digest: d.to_string(),
            message: e.to_string(),
        },
    }
}

fn store_err(d: &Digest, e: impl ToString) -> RemoteError {
    RemoteError::Toc {
        digest: d.to_string(),
        message: format!("metadata store: {}", e.to_string()),
    }
}
