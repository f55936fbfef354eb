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
//!
//! A manifest named by digest, and its config, are first looked up in containerd's content
//! store of the Prepare's namespace ([`LocalBlobs`]): `weenv run` writes every group manifest
//! and config it resolved there before it prepares the layers, so a cold node fetches each of
//! them from the registry once (by the CLI), not twice. What is read there is used only if
//! its bytes hash to the digest asked for ([`verified`]); anything absent, unreadable or not
//! matching is fetched from the registry as before.

use bytes::Bytes;
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

/// Blobs already on the node: containerd's content store (see [`super::source`]).
#[async_trait::async_trait]
pub trait LocalBlobs: Send + Sync + 'static {
    /// The bytes of blob `digest` in the content store of `namespace`, if present and
    /// readable (at most `max` bytes). Callers verify them with [`verified`].
    async fn blob(&self, namespace: &str, digest: &Digest, max: usize) -> Option<Bytes>;
}

/// Largest manifest or config read from the content store (a group's are ~1 KB).
pub const LOCAL_BLOB_MAX: usize = 4 << 20;

/// `bytes` if they hash to `digest` (a sha256 digest; other algorithms never match). Pure.
pub fn verified(digest: &Digest, bytes: Bytes) -> Option<Bytes> {
    (Digest::sha256(&bytes) == *digest).then_some(bytes)
}

/// Where [`ImageCache::get`] may find a manifest and its config before the registry.
#[derive(Clone, Copy)]
pub struct Local<'a> {
    pub blobs: &'a dyn LocalBlobs,
    pub namespace: &'a str,
}

impl Local<'_> {
    /// Blob `d` from the content store, verified; `None` otherwise (logged).
    async fn get(&self, d: &Digest) -> Option<Bytes> {
        let b = self.blobs.blob(self.namespace, d, LOCAL_BLOB_MAX).await?;
        let v = verified(d, b);
        if v.is_none() {
            tracing::warn!(namespace = self.namespace, digest = %d, "content store blob does not match its digest; reading the registry");
        }
        v
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
    /// The layers of the image `reference` (manifest `manifest` when known: cached, and read
    /// from `local` when there).
    pub async fn get(
        &self,
        registry: &Client,
        local: Option<Local<'_>>,
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
                cell.get_or_try_init(|| async {
                    if let Some(l) = local {
                        if let Some(i) = fetch_local(registry, l, &r, &md).await {
                            return Ok(i);
                        }
                    }
                    fetch(registry, r.with_digest(md.clone()), None).await
                })
                .await
                .cloned()
            }
            None => fetch(registry, r, None).await,
        }
    }
}

/// Manifest `md` (an image manifest, not an index) from the content store, with the diff_ids
/// of its config (content store, else registry); `None` when the manifest is not there.
async fn fetch_local(
    registry: &Client,
    local: Local<'_>,
    r: &Reference,
    md: &Digest,
) -> Option<ImageInfo> {
    let bytes = local.get(md).await?;
    let m: ImageManifest = match serde_json::from_slice(&bytes) {
        Ok(m) => m,
        Err(e) => {
            tracing::debug!(digest = %md, error = %e, "content store manifest is no image manifest; reading the registry");
            return None;
        }
    };
    let config = local.get(&m.config.digest).await;
    tracing::debug!(digest = %md, config_local = config.is_some(), "image manifest from containerd's content store");
    let r = r.with_digest(md.clone());
    fetch(registry, r, Some((m, config))).await.ok()
}

/// The layers of the manifest `r` names, with its config's diff_id claims; `known`: the
/// manifest (and maybe its config) already read and verified.
async fn fetch(
    registry: &Client,
    r: Reference,
    known: Option<(ImageManifest, Option<Bytes>)>,
) -> Result<ImageInfo, String> {
    let (m, config) = match known {
        Some(k) => k,
        None => {
            // An index: this host's entry (one GET for the index, one for the entry).
            let host = weenv_registry::manifest::host_platform();
            let (m, _) = registry
                .get_image_manifest(&r, &host.os, &host.architecture, None)
                .await
                .map_err(|e| e.to_string())?;
            (m, None)
        }
    };
    let config = match config {
        Some(c) => Ok::<_, weenv_registry::RegistryError>(c),
        None => registry.get_blob(&r, &m.config.digest).await,
    };
    let diff_ids = match config {
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

    /// A content store holding some blobs (maybe under another digest: tampered).
    struct FakeStore(HashMap<Digest, Bytes>);

    #[async_trait::async_trait]
    impl LocalBlobs for FakeStore {
        async fn blob(&self, namespace: &str, digest: &Digest, max: usize) -> Option<Bytes> {
            assert_eq!(namespace, "ns");
            self.0.get(digest).filter(|b| b.len() <= max).cloned()
        }
    }

    #[test]
    fn only_bytes_matching_their_digest_are_verified() {
        let b = Bytes::from_static(b"manifest");
        assert_eq!(verified(&Digest::sha256(&b), b.clone()), Some(b.clone()));
        assert_eq!(verified(&Digest::sha256(b"other"), b), None);
    }

    #[tokio::test]
    async fn manifest_and_config_from_the_content_store_without_the_registry() {
        let a = Digest::sha256(b"a").to_string();
        let config = Bytes::from(format!(
            r#"{{"version":1,"kind":"base","name":"b","platform":{{"os":"linux","architecture":"amd64"}},"diffIds":["{a}"]}}"#
        ));
        let cd = Digest::sha256(&config);
        let layer = weenv_registry::Descriptor::new("application/x", Digest::sha256(b"1"), 10);
        let manifest = Bytes::from(
            serde_json::to_vec(&serde_json::json!({
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": weenv_registry::Descriptor::new("application/vnd.weenv.group.config.v1+json", cd.clone(), config.len() as u64),
                "layers": [layer],
            }))
            .unwrap(),
        );
        let md = Digest::sha256(&manifest);
        // nothing listens there: any registry request fails
        let registry = Client::new(weenv_registry::RegistryConfig::default()).unwrap();
        let reference = "127.0.0.1:1/weenv/base:1";
        let get = |store: FakeStore| {
            let registry = registry.clone();
            let md = md.to_string();
            async move {
                let local = Local {
                    blobs: &store,
                    namespace: "ns",
                };
                ImageCache::default()
                    .get(&registry, Some(local), reference, Some(&md))
                    .await
            }
        };
        let both = FakeStore(HashMap::from([
            (md.clone(), manifest.clone()),
            (cd.clone(), config.clone()),
        ]));
        let info = get(both).await.unwrap();
        assert_eq!(info.len(), 1);
        assert_eq!(info[0].diff_id.as_ref().map(|d| d.to_string()), Some(a));
        // the manifest without its config: the config is asked of the registry (unreachable
        // here: no claims), the manifest is not
        let info = get(FakeStore(HashMap::from([(md.clone(), manifest.clone())])))
            .await
            .unwrap();
        assert_eq!((info.len(), info[0].diff_id.as_ref()), (1, None));
        // tampered or absent manifest: the registry is asked (and fails here)
        let tampered = FakeStore(HashMap::from([
            (md.clone(), Bytes::from_static(b"{}")),
            (cd, config),
        ]));
        assert!(get(tampered).await.is_err());
        assert!(get(FakeStore(HashMap::new())).await.is_err());
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
