//! The remote-snapshot labels: what `weenv pull` (and CRI, and `ctr-remote`) put on a
//! layer's Prepare, and what the daemon reads from them. Writer ([`layer_labels`]) and reader
//! ([`RemoteLayerRequest::from_labels`]) share one set of names.
//!
//! containerd passes `containerd.io/snapshot.ref=<target chainID>` plus one of two label
//! families naming the image and the layer:
//! - CRI / Go client handler wrapper (and `weenv pull`): `containerd.io/snapshot/cri.image-ref`,
//!   `containerd.io/snapshot/cri.layer-digest` (+ `cri.manifest-digest`, `cri.image-layers`);
//! - `ctr-remote image rpull` (stargz): `containerd.io/snapshot/remote/stargz.reference`,
//!   `containerd.io/snapshot/remote/stargz.digest`.

use std::collections::HashMap;
use weenv_format::Digest;

/// Target chain id of a remote-snapshot Prepare.
pub const LABEL_TARGET: &str = "containerd.io/snapshot.ref";
/// CRI image reference label.
pub const LABEL_CRI_IMAGE_REF: &str = "containerd.io/snapshot/cri.image-ref";
/// CRI layer digest label.
pub const LABEL_CRI_LAYER_DIGEST: &str = "containerd.io/snapshot/cri.layer-digest";
/// CRI manifest digest label (also sent by `weenv pull`).
pub const LABEL_CRI_MANIFEST_DIGEST: &str = "containerd.io/snapshot/cri.manifest-digest";
/// stargz (`ctr-remote`) image reference label.
pub const LABEL_STARGZ_REFERENCE: &str = "containerd.io/snapshot/remote/stargz.reference";
/// stargz (`ctr-remote`) layer digest label.
pub const LABEL_STARGZ_DIGEST: &str = "containerd.io/snapshot/remote/stargz.digest";
/// Label we put on remote committed snapshots: the layer digest they expose.
pub const LABEL_WEENV_LAYER: &str = "containerd.io/snapshot/weenv.layer";
/// Label of every remote snapshot's `Stat`/`Walk` answer: the layer (blob) digest the snapshot
/// is bound to. Outside the `containerd.io/snapshot/` prefix on purpose: containerd passes an
/// image's layer annotations with that prefix to Prepare and keeps them as the snapshot's
/// labels in its metadata (where they win over the snapshotter's), so an image could forge
/// `LABEL_WEENV_LAYER`, but never this one. `weenv pull` and `weenv run` compare it with the
/// layer their manifest names.
pub const LABEL_BOUND_LAYER: &str = "weenv.io/bound-layer";

/// Label: CRI comma-separated layer digests (capped like containerd's, 4 KiB).
pub const LABEL_CRI_IMAGE_LAYERS: &str = "containerd.io/snapshot/cri.image-layers";

/// What a remote-snapshot Prepare asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteLayerRequest {
    /// The committed snapshot to create (chain id).
    pub target: String,
    /// Image reference, used to reach the registry.
    pub reference: String,
    /// Layer blob digest.
    pub digest: Digest,
    /// Image manifest digest, when the labels name it (CRI, `weenv pull`): where the layer's
    /// start-up prefetch profile is read from.
    pub manifest: Option<String>,
    /// The containerd namespace of the Prepare (set by the daemon, not by the labels): whose
    /// content store may already hold the manifest and config (`weenv run` writes them).
    pub namespace: Option<String>,
}

impl RemoteLayerRequest {
    /// Extract a request from Prepare labels. `None` when the labels do not ask for a remote
    /// snapshot (no target, or neither label family, or a malformed digest).
    pub fn from_labels(labels: &HashMap<String, String>) -> Option<Self> {
        let target = labels.get(LABEL_TARGET).filter(|t| !t.is_empty())?;
        let (reference, digest) = match (
            labels.get(LABEL_CRI_IMAGE_REF),
            labels.get(LABEL_CRI_LAYER_DIGEST),
        ) {
            (Some(r), Some(d)) => (r, d),
            _ => (
                labels.get(LABEL_STARGZ_REFERENCE)?,
                labels.get(LABEL_STARGZ_DIGEST)?,
            ),
        };
        Some(Self {
            target: target.clone(),
            reference: reference.clone(),
            digest: digest.parse().ok()?,
            manifest: labels.get(LABEL_CRI_MANIFEST_DIGEST).cloned(),
            namespace: None,
        })
    }
}

/// A Prepare from containerd's own unpacker (nerdctl, the Go client's `Pull` with unpack, CRI
/// with `disable_snapshot_annotations`): only the target and the layer descriptor's inherited
/// annotations ([`weenv_format::snapshot_labels`]) — no image reference. The daemon finds where
/// the layer comes from itself (containerd's content store).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnsourcedLayerRequest {
    /// The committed snapshot to create (chain id).
    pub target: String,
    /// The layer the inherited labels name.
    pub layer: weenv_format::snapshot_labels::LabeledLayer,
}

impl UnsourcedLayerRequest {
    /// `None` when the labels name an image ([`RemoteLayerRequest::from_labels`] applies), have
    /// no target, or carry no weenv layer digest.
    pub fn from_labels(labels: &HashMap<String, String>) -> Option<Self> {
        if RemoteLayerRequest::from_labels(labels).is_some() {
            return None;
        }
        let target = labels.get(LABEL_TARGET).filter(|t| !t.is_empty())?;
        Some(Self {
            target: target.clone(),
            layer: weenv_format::snapshot_labels::layer_from_labels(labels)?,
        })
    }

    /// The request once the image is known: `reference` reaches the registry, `manifest` is
    /// the image manifest listing the layer.
    pub fn with_source(self, reference: String, manifest: Option<String>) -> RemoteLayerRequest {
        RemoteLayerRequest {
            target: self.target,
            reference,
            digest: self.layer.digest,
            manifest,
            namespace: None,
        }
    }
}

/// Labels on the Prepare of layer `i`.
pub fn layer_labels(
    chain_id: &str,
    reference: &str,
    layer: &str,
    manifest: &str,
    all_layers: &[String],
) -> HashMap<String, String> {
    let mut layers = String::new();
    for l in all_layers {
        if layers.len() + l.len() + 1 > 4096 {
            break;
        }
        if !layers.is_empty() {
            layers.push(',');
        }
        layers.push_str(l);
    }
    [
        (LABEL_TARGET, chain_id),
        (LABEL_CRI_IMAGE_REF, reference),
        (LABEL_CRI_LAYER_DIGEST, layer),
        (LABEL_CRI_MANIFEST_DIGEST, manifest),
        (LABEL_CRI_IMAGE_LAYERS, layers.as_str()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const D: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn labels(kv: &[(&str, &str)]) -> HashMap<String, String> {
        kv.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn both_label_families() {
        let cri = labels(&[
            (LABEL_TARGET, "sha256:chain"),
            (LABEL_CRI_IMAGE_REF, "r.io/a:1"),
            (LABEL_CRI_LAYER_DIGEST, D),
        ]);
        let r = RemoteLayerRequest::from_labels(&cri).unwrap();
        assert_eq!(
            (r.target.as_str(), r.reference.as_str(), r.digest.as_str()),
            ("sha256:chain", "r.io/a:1", D)
        );
        let sgz = labels(&[
            (LABEL_TARGET, "sha256:chain"),
            (LABEL_STARGZ_REFERENCE, "r.io/a:2"),
            (LABEL_STARGZ_DIGEST, D),
        ]);
        assert_eq!(
            RemoteLayerRequest::from_labels(&sgz).unwrap().reference,
            "r.io/a:2"
        );
    }

    #[test]
    fn incomplete_labels_take_ordinary_path() {
        assert!(RemoteLayerRequest::from_labels(&labels(&[])).is_none());
        assert!(RemoteLayerRequest::from_labels(&labels(&[(LABEL_TARGET, "x")])).is_none());
        assert!(RemoteLayerRequest::from_labels(&labels(&[
            (LABEL_CRI_IMAGE_REF, "r"),
            (LABEL_CRI_LAYER_DIGEST, D)
        ]))
        .is_none());
        assert!(RemoteLayerRequest::from_labels(&labels(&[
            (LABEL_TARGET, "x"),
            (LABEL_CRI_IMAGE_REF, "r"),
            (LABEL_CRI_LAYER_DIGEST, "sha256:bad")
        ]))
        .is_none());
    }

    #[test]
    fn unsourced_requests_come_from_inherited_annotations_only() {
        use weenv_format::snapshot_labels::ANNOTATION_SNAPSHOT_LAYER_DIGEST;
        let mut l = labels(&[
            (LABEL_TARGET, "sha256:chain"),
            (ANNOTATION_SNAPSHOT_LAYER_DIGEST, D),
        ]);
        let u = UnsourcedLayerRequest::from_labels(&l).unwrap();
        assert_eq!(
            (u.target.as_str(), u.layer.digest.as_str()),
            ("sha256:chain", D)
        );
        let r = u.with_source("h/r@sha256:m".into(), Some("sha256:m".into()));
        assert_eq!(
            (
                r.reference.as_str(),
                r.digest.as_str(),
                r.manifest.as_deref()
            ),
            ("h/r@sha256:m", D, Some("sha256:m"))
        );
        // A client that names the image wins (its reference is used as it is).
        l.insert(LABEL_CRI_IMAGE_REF.into(), "r.io/a:1".into());
        l.insert(LABEL_CRI_LAYER_DIGEST.into(), D.into());
        assert!(UnsourcedLayerRequest::from_labels(&l).is_none());
        assert!(UnsourcedLayerRequest::from_labels(&labels(&[(
            ANNOTATION_SNAPSHOT_LAYER_DIGEST,
            D
        )]))
        .is_none());
        assert!(UnsourcedLayerRequest::from_labels(&labels(&[(LABEL_TARGET, "x")])).is_none());
    }

    #[test]
    fn labels_carry_the_cri_family_and_cap_layers() {
        let many: Vec<String> = (0..100).map(|i| format!("sha256:{i:064}")).collect();
        let l = layer_labels("sha256:c", "r/x:1", &many[0], "sha256:m", &many);
        let req = RemoteLayerRequest::from_labels(&l).unwrap();
        assert_eq!(req.target, "sha256:c");
        assert!(l[LABEL_CRI_IMAGE_LAYERS].len() <= 4096);
        assert!(l[LABEL_CRI_IMAGE_LAYERS].starts_with(&many[0]));
    }
}
