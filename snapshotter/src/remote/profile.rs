//! Where a layer's start-up prefetch comes from: the image manifest.
//!
//! containerd does not pass descriptor annotations to snapshotters, so on a remote Prepare
//! the daemon reads the manifest itself — by digest when the labels name it
//! (`containerd.io/snapshot/cri.manifest-digest`, sent by CRI and `weenv pull`), else by the
//! image reference (then only if that manifest really lists the layer) — and takes the
//! layer descriptor's `io.weenv.prefetch.frames` annotation. Manifests are fetched once per
//! digest (concurrent Prepares of one image's layers share the request) and kept in memory.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::OnceCell;
use weenv_format::prefetch::ANNOTATION_PREFETCH;
use weenv_format::Digest;
use weenv_registry::{Client, ImageManifest, Manifest, Reference};

/// layer digest -> prefetch annotation value, for one image manifest.
pub type Profiles = Arc<HashMap<String, String>>;

/// The prefetch annotations of every layer of `m`. Pure.
pub fn profiles_of(m: &ImageManifest) -> HashMap<String, String> {
    m.layers
        .iter()
        .filter_map(|l| {
            l.annotations
                .get(ANNOTATION_PREFETCH)
                .map(|v| (l.digest.to_string(), v.clone()))
        })
        .collect()
}

/// Manifests' prefetch annotations, by manifest digest.
#[derive(Default)]
pub struct ProfileCache {
    by_manifest: Mutex<HashMap<String, Arc<OnceCell<Profiles>>>>,
}

impl ProfileCache {
    /// The prefetch annotation of `layer` in the image `reference` (manifest `manifest` when
    /// known). `Ok(None)`: the image has no profile for this layer.
    pub async fn annotation(
        &self,
        registry: &Client,
        reference: &str,
        manifest: Option<&str>,
        layer: &Digest,
    ) -> Result<Option<String>, String> {
        let r: Reference = reference.parse().map_err(|e| format!("{e}"))?;
        let profiles = match manifest.and_then(|m| m.parse::<Digest>().ok()) {
            Some(md) => {
                let cell = self
                    .by_manifest
                    .lock()
                    .entry(md.to_string())
                    .or_default()
                    .clone();
                cell.get_or_try_init(|| fetch(registry, r.with_digest(md)))
                    .await?
                    .clone()
            }
            None => fetch(registry, r).await?,
        };
        Ok(profiles.get(layer.as_str()).cloned())
    }
}

async fn fetch(registry: &Client, r: Reference) -> Result<Profiles, String> {
    let (os, arch) = weenv_registry::manifest::host_platform();
    let blob = registry.get_manifest(&r).await.map_err(|e| e.to_string())?;
    let m = match blob.parse().map_err(|e| e.to_string())? {
        Manifest::Image(m) => m,
        Manifest::Index(_) => {
            registry
                .get_image_manifest(&r, os, arch, None)
                .await
                .map_err(|e| e.to_string())?
                .0
        }
    };
    Ok(Arc::new(profiles_of(&m)))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn annotations_by_layer() {
        let d1 = Digest::sha256(b"1");
        let d2 = Digest::sha256(b"2");
        let mut l1 = weenv_registry::Descriptor::new("application/x", d1.clone(), 1);
        l1.annotations
            .insert(ANNOTATION_PREFETCH.into(), "0-3".into());
        let l2 = weenv_registry::Descriptor::new("application/x", d2.clone(), 1);
        let m: ImageManifest = serde_json::from_value(serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": weenv_registry::Descriptor::new("application/vnd.oci.image.config.v1+json", Digest::sha256(b"c"), 1),
            "layers": [l1, l2],
        }))
        .unwrap();
        let p = profiles_of(&m);
        assert_eq!(p.get(d1.as_str()).map(String::as_str), Some("0-3"));
        assert!(!p.contains_key(d2.as_str()));
    }
}
