//! [`WeenvLayers`]: the real [`LayerProvider`]: detects weenv layers in the registry, fetches
//! and caches their TOCs, and exposes them through the node's FUSE [`LayerStore`].
//!
//! Per layer digest, at most: one HEAD (size) and one or two tail reads (footer + TOC), once
//! per node. The result is recorded in the metadata store (`layers` table): a weenv layer with
//! its cached TOC, or a negative entry so non-weenv layers are probed once only. Layers are
//! keyed by digest, so the same layer under any chain or image reuses the same FUSE dir.

use super::probe::{classify_tail, probe_range, TailVerdict};
use super::profile::ProfileCache;
use super::toc_cache::TocCache;
use super::{LayerProvider, MountedLayer, RemoteError, RemoteLayerRequest};
use crate::fetch::RegistryBlobSource;
use crate::layers::LayerStore;
use crate::store::{LayerKind, LayerRecord, MetaStore};
use std::sync::Arc;
use tracing::{debug, info, warn};
use weenv_format::{Digest, EntryKind, Toc};
use weenv_registry::{Client, Reference};

/// Registry-backed weenv layers on one FUSE session.
pub struct WeenvLayers {
    store: Arc<MetaStore>,
    layers: Arc<LayerStore>,
    registry: Client,
    tocs: TocCache,
    profiles: Arc<ProfileCache>,
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
            store,
            layers,
            registry,
            tocs,
            profiles: Arc::new(ProfileCache::default()),
        }
    }

    /// The FUSE layer store (status, shutdown).
    pub fn layer_store(&self) -> &Arc<LayerStore> {
        &self.layers
    }

    fn reg_err(&self, reference: &str, d: &Digest, m: impl ToString) -> RemoteError {
        RemoteError::Registry {
            reference: reference.to_string(),
            digest: d.to_string(),
            message: m.to_string(),
        }
    }

    fn expose(
        &self,
        d: &Digest,
        reference: &str,
        size: u64,
        toc: Toc,
    ) -> Result<MountedLayer, RemoteError> {
        let r: Reference = reference
            .parse()
            .map_err(|e| self.reg_err(reference, d, e))?;
        let (usize_, inodes) = toc_usage(&toc);
        let src = Arc::new(RegistryBlobSource::new(
            self.registry.clone(),
            r,
            d.clone(),
            size,
        ));
        let dir = self
            .layers
            .add_layer(d, Arc::new(toc), src)
            .map_err(|e| RemoteError::Mount {
                digest: d.to_string(),
                message: e.to_string(),
            })?;
        Ok(MountedLayer {
            dir,
            size: usize_,
            inodes,
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
}

fn store_err(d: &Digest, e: impl ToString) -> RemoteError {
    RemoteError::Toc {
        digest: d.to_string(),
        message: format!("metadata store: {}", e.to_string()),
    }
}

#[async_trait::async_trait]
impl LayerProvider for WeenvLayers {
    async fn mount(&self, req: &RemoteLayerRequest) -> Result<Option<MountedLayer>, RemoteError> {
        let d = &req.digest;
        match self.store.layer(d.as_str()).map_err(|e| store_err(d, e))? {
            Some(LayerRecord {
                kind: LayerKind::NotWeenv,
                ..
            }) => return Ok(None),
            Some(rec) => match self.tocs.get(d, rec.size) {
                Ok(toc) => {
                    let m = self.expose(d, &rec.reference, rec.size, toc)?;
                    self.prefetch(req);
                    return Ok(Some(m));
                }
                Err(e) => info!(digest = %d, error = %e, "cached TOC unusable; fetching it again"),
            },
            None => {}
        }
        let r: Reference = req
            .reference
            .parse()
            .map_err(|e| self.reg_err(&req.reference, d, e))?;
        let Some((size, tail)) = self.probe(&r, &req.reference, d).await? else {
            self.store
                .put_layer(&LayerRecord {
                    digest: d.to_string(),
                    reference: req.reference.clone(),
                    size: 0,
                    kind: LayerKind::NotWeenv,
                })
                .map_err(|e| store_err(d, e))?;
            return Ok(None);
        };
        let toc = self
            .tocs
            .put(d, &tail, size)
            .map_err(|e| RemoteError::Toc {
                digest: d.to_string(),
                message: e.to_string(),
            })?;
        self.store
            .put_layer(&LayerRecord {
                digest: d.to_string(),
                reference: req.reference.clone(),
                size,
                kind: LayerKind::Weenv {
                    toc_path: self.tocs.path(d),
                },
            })
            .map_err(|e| store_err(d, e))?;
        info!(digest = %d, reference = %req.reference, entries = toc.entries.len(), "weenv layer detected");
        let m = self.expose(d, &req.reference, size, toc)?;
        self.prefetch(req);
        Ok(Some(m))
    }

    async fn remount(&self, d: &Digest) -> Result<MountedLayer, RemoteError> {
        let rec = self
            .store
            .layer(d.as_str())
            .map_err(|e| store_err(d, e))?
            .filter(|r| matches!(r.kind, LayerKind::Weenv { .. }))
            .ok_or_else(|| RemoteError::NotCached {
                digest: d.to_string(),
            })?;
        match self.tocs.get(d, rec.size) {
            Ok(toc) => self.expose(d, &rec.reference, rec.size, toc),
            Err(e) => {
                // Lost or damaged cache file: fetch the TOC again from the registry.
                info!(digest = %d, error = %e, "cached TOC unusable; refetching it");
                let r: Reference = rec
                    .reference
                    .parse()
                    .map_err(|e| self.reg_err(&rec.reference, d, e))?;
                let (size, tail) =
                    self.probe(&r, &rec.reference, d)
                        .await?
                        .ok_or_else(|| RemoteError::Toc {
                            digest: d.to_string(),
                            message: "the registry blob is no longer a weenv layer".into(),
                        })?;
                let toc = self
                    .tocs
                    .put(d, &tail, size)
                    .map_err(|e| RemoteError::Toc {
                        digest: d.to_string(),
                        message: e.to_string(),
                    })?;
                self.expose(d, &rec.reference, size, toc)
            }
        }
    }

    fn prefetch(&self, req: &RemoteLayerRequest) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (registry, layers, profiles, req) = (
            self.registry.clone(),
            self.layers.clone(),
            self.profiles.clone(),
            req.clone(),
        );
        rt.spawn(async move {
            let d = &req.digest;
            let Some(frames) = layers.frame_count(d) else {
                return;
            };
            let value = match profiles
                .annotation(&registry, &req.reference, req.manifest.as_deref(), d)
                .await
            {
                Ok(Some(v)) => v,
                Ok(None) => return,
                Err(e) => {
                    warn!(digest = %d, reference = %req.reference, error = %e, "cannot read the image manifest for its start-up profile; no prefetch");
                    return;
                }
            };
            match weenv_format::prefetch::decode_frames(&value, frames) {
                Ok(f) => layers.prefetch(d, f),
                Err(e) => {
                    warn!(digest = %d, reference = %req.reference, error = %e, "bad start-up profile in the image manifest; no prefetch")
                }
            }
        });
    }

    fn release(&self, d: &Digest) -> Result<(), RemoteError> {
        if !self.layers.has_layer(d) {
            return Ok(());
        }
        self.layers.remove_layer(d).map_err(|e| RemoteError::Mount {
            digest: d.to_string(),
            message: e.to_string(),
        })
    }
}
