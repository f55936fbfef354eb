//! What the image manifest says about its layers, for the daemon.
//!
//! containerd does not pass descriptor annotations to snapshotters, so on a remote Prepare
//! the daemon reads the manifest itself — by digest when the labels name it
//! (`containerd.io/snapshot/cri.manifest-digest`, sent by CRI and `weenv pull`), else by the
//! image reference — and keeps, per layer: its size, the TOC location hint
//! (`io.weenv.toc.*`: the TOC is then one ranged GET, no HEAD and no probe) and the start-up
//! profile (`io.weenv.prefetch.frames`) — and, from the image config (one more small GET), the
//! diff_id the image claims for it: unverified until the layer is complete, it is part of the
//! layer's identity (see `provider`). Manifests named by digest are fetched once (concurrent
//! Prepares of one image's layers share the request) and kept in memory.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::OnceCell;
use weenv_format::prefetch::ANNOTATION_PREFETCH;
use weenv_format::{Digest, TocHint};
use weenv_registry::{Client, ImageManifest, Reference};

/// One layer as the manifest describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerDesc {
    pub digest: Digest,
    /// Blob size.
    pub size: u64,
    /// Where the TOC is (weenv layers converted by weenv-convert carry it).
    pub hint: Option<TocHint>,
    /// Start-up profile of this image for the layer (frame ranges).
    pub prefetch: Option<String>,
    /// The diff_id the image config claims for this layer (unverified). `None` when the config
    /// could not be read, lists another number of layers, or claims two diff_ids for the
    /// same blob.
    pub diff_id: Option<Digest>,
}

/// The layers of one image manifest, bottom first.
pub type ImageInfo = Arc<Vec<LayerDesc>>;

/// The layers of `m` with their weenv annotations (malformed hints are dropped: the layer is
/// then probed as if it had none) and the diff_ids the config claims (`diff_ids`, in layer
/// order; ignored unless there is exactly one per layer and well formed). Pure.
pub fn image_info(m: &ImageManifest, diff_ids: Option<&[String]>) -> Vec<LayerDesc> {
    let claims: Option<Vec<Digest>> = diff_ids
        .filter(|d| d.len() == m.layers.len())
        .and_then(|d| d.iter().map(|x| x.parse().ok()).collect());
    let claim = |i: usize| -> Option<Digest> {
        let c = claims.as_ref()?;
        let mine = &c[i];
        // The same blob twice with two different claims: neither can be right for both.
        let consistent = m
            .layers
            .iter()
            .zip(c)
            .all(|(l, d)| l.digest != m.layers[i].digest || d == mine);
        consistent.then(|| mine.clone())
    };
    m.layers
        .iter()
        .enumerate()
        .map(|(i, l)| LayerDesc {
            digest: l.digest.clone(),
            size: l.size,
            hint: TocHint::from_annotations(&l.annotations).ok().flatten(),
            prefetch: l.annotations.get(ANNOTATION_PREFETCH).cloned(),
            diff_id: claim(i),
        })
        .collect()
}

/// The `rootfs.diff_ids` of an image config, or the `diff_ids` of a weenv layer group's config
/// (`weenv run` composes plans on the node without publishing the composed image: its layers'
/// labels name each layer's group manifest, whose config claims the same diff_ids the composed
/// config does); the parse error when it is neither. Pure.
pub fn config_diff_ids(config: &[u8]) -> Result<Vec<String>, String> {
    #[derive(serde::Deserialize)]
    struct GroupConfig {
        #[serde(rename = "diffIds")]
        diff_ids: Vec<String>,
    }
    match serde_json::from_slice::<weenv_registry::manifest::ImageConfig>(config) {
        Ok(c) => Ok(c.rootfs.diff_ids),
        Err(e) => serde_json::from_slice::<GroupConfig>(config)
            .map(|g| g.diff_ids)
            .map_err(|_| e.to_string()),
    }
}

/// Manifests kept in [`ImageCache`]; past this the cache starts over (a node that pulls
/// thousands of composed images must not grow without bound; a miss costs one small GET).
pub const IMAGE_CACHE_ENTRIES: usize = 1024;

/// Image manifests' layer descriptions, by manifest digest.
#[derive(Default)]
pub struct ImageCache {
    by_manifest: Mutex<HashMap<String, Arc<OnceCell<ImageInfo>>>>,
}

impl ImageCache {
    /// The layers of the image `reference` (manifest `manifest` when known: cached).
    pub async fn get(
        &self,
        registry: &Client,
        reference: &str,
        manifest: Option<&str>,
    ) -> Result<ImageInfo, String> {
        let r: Reference = reference.parse().map_err(|e| format!("{e}"))?;
        match manifest.and_then(|m| m.parse::<Digest>().ok()) {
            Some(md) => {
                let cell = {
                    let mut map = self.by_manifest.lock();
                    if map.len() >= IMAGE_CACHE_ENTRIES && !map.contains_key(md.as_str()) {
                        map.clear();
                    }
                    map.entry(md.to_string()).or_default().clone()
                };
                cell.get_or_try_init(|| fetch(registry, r.with_digest(md)))
                    .await
                    .cloned()
            }
            None => fetch(registry, r).await,
        }
    }
}

async fn fetch(registry: &Client, r: Reference) -> Result<ImageInfo, String> {
    // An index: this host's entry (one GET for the index, one for the entry).
    let host = weenv_registry::manifest::host_platform();
    let (m, _) = registry
        .get_image_manifest(&r, &host.os, &host.architecture, None)
        .await
        .map_err(|e| e.to_string())?;
    let diff_ids = match registry.get_blob(&r, &m.config.digest).await {
        Ok(b) => config_diff_ids(&b).ok(),
        Err(e) => {
            tracing::debug!(reference = %r, error = %e, "image config unreadable: no diff_id claims, no lazy layers");
            None
        }
    };
    Ok(Arc::new(image_info(&m, diff_ids.as_deref())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_with_hints_and_profiles() {
        let d1 = Digest::sha256(b"1");
        let d2 = Digest::sha256(b"2");
        let toc = Digest::sha256(b"toc");
        let mut l1 = weenv_registry::Descriptor::new("application/x", d1.clone(), 1000);
        l1.annotations
            .insert(ANNOTATION_PREFETCH.into(), "0-3".into());
        l1.annotations
            .insert(weenv_format::ANNOTATION_TOC_DIGEST.into(), toc.to_string());
        l1.annotations
            .insert(weenv_format::ANNOTATION_TOC_OFFSET.into(), "900".into());
        l1.annotations
            .insert(weenv_format::ANNOTATION_TOC_LENGTH.into(), "100".into());
        let mut l2 = weenv_registry::Descriptor::new("application/x", d2.clone(), 7);
        l2.annotations
            .insert(weenv_format::ANNOTATION_TOC_OFFSET.into(), "x".into());
        let m: ImageManifest = serde_json::from_value(serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": weenv_registry::Descriptor::new("application/vnd.oci.image.config.v1+json", Digest::sha256(b"c"), 1),
            "layers": [l1, l2],
        }))
        .unwrap();
        let info = image_info(&m, None);
        assert_eq!(info.len(), 2);
        assert_eq!(info[0].diff_id, None);
        assert_eq!(info[0].prefetch.as_deref(), Some("0-3"));
        let h = info[0].hint.as_ref().unwrap();
        assert_eq!((h.offset, h.length, &h.digest), (900, 100, &toc));
        assert_eq!(info[0].size, 1000);
        assert_eq!(
            (info[1].hint.as_ref(), info[1].prefetch.as_ref()),
            (None, None)
        );
        let (a, b) = (
            Digest::sha256(b"a").to_string(),
            Digest::sha256(b"b").to_string(),
        );
        let info = image_info(&m, Some(&[a.clone(), b.clone()]));
        assert_eq!(
            info[0].diff_id.as_ref().map(|d| d.to_string()),
            Some(a.clone())
        );
        assert_eq!(
            info[1].diff_id.as_ref().map(|d| d.to_string()),
            Some(b.clone())
        );
        // wrong count or malformed: no claims
        assert!(image_info(&m, Some(std::slice::from_ref(&a)))
            .iter()
            .all(|l| l.diff_id.is_none()));
        assert!(image_info(&m, Some(&[a.clone(), "x".into()]))
            .iter()
            .all(|l| l.diff_id.is_none()));
        let cfg = format!(r#"{{"rootfs":{{"type":"layers","diff_ids":["{a}"]}}}}"#);
        assert_eq!(config_diff_ids(cfg.as_bytes()), Ok(vec![a.clone()]));
        assert!(config_diff_ids(b"{}").is_err());
        // a layer group's config (weenv-env's GroupConfig) claims its layers' diff_ids too
        let group = format!(
            r#"{{"version":1,"kind":"base","name":"b","platform":{{"os":"linux","architecture":"amd64"}},"diffIds":["{a}"]}}"#
        );
        assert_eq!(config_diff_ids(group.as_bytes()), Ok(vec![a]));
    }

    #[test]
    fn one_blob_with_two_claims_has_none() {
        let d1 = Digest::sha256(b"1");
        let l = weenv_registry::Descriptor::new("application/x", d1, 10);
        let m: ImageManifest = serde_json::from_value(serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": weenv_registry::Descriptor::new("application/vnd.oci.image.config.v1+json", Digest::sha256(b"c"), 1),
            "layers": [l.clone(), l],
        }))
        .unwrap();
        let (a, b) = (
            Digest::sha256(b"a").to_string(),
            Digest::sha256(b"b").to_string(),
        );
        assert!(image_info(&m, Some(&[a.clone(), b]))
            .iter()
            .all(|l| l.diff_id.is_none()));
        assert!(image_info(&m, Some(&[a.clone(), a]))
            .iter()
            .all(|l| l.diff_id.is_some()));
    }
}
