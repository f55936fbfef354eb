//! Layer-descriptor annotations that containerd's own unpacker hands to the snapshotter.
//!
//! containerd's unpacker (the one `nerdctl`, the containerd Go client's
//! `Pull(.., WithPullUnpack)` and the CRI plugin use) passes every annotation of a layer
//! descriptor whose key starts with [`SNAPSHOT_LABEL_PREFIX`] to the snapshotter's `Prepare` as
//! a label (`snapshots.FilterInheritedLabels`), and nothing else about the layer: not even its
//! digest. So a weenv layer's descriptor carries, next to its `io.weenv.*` annotations:
//! - [`ANNOTATION_SNAPSHOT_LAYER_DIGEST`]: the layer's own blob digest (which layer to mount);
//! - the TOC hint again under the prefix (`containerd.io/snapshot/io.weenv.toc.digest`, ...),
//!   so a Prepare knows the TOC location without the manifest.
//!
//! [`add_snapshot_annotations`] writes them (weenv-convert), [`layer_from_labels`] reads them
//! (the daemon). Both pure.

use crate::{Digest, TocHint};
use std::collections::BTreeMap;

/// containerd's prefix of descriptor annotations inherited as snapshot labels.
pub const SNAPSHOT_LABEL_PREFIX: &str = "containerd.io/snapshot/";
/// Descriptor annotation (inherited as a Prepare label): the layer's blob digest.
pub const ANNOTATION_SNAPSHOT_LAYER_DIGEST: &str = "containerd.io/snapshot/weenv.layer-digest";

/// The `io.weenv.*` hint keys copied under [`SNAPSHOT_LABEL_PREFIX`].
const HINT_KEYS: [&str; 4] = [
    crate::ANNOTATION_TOC_DIGEST,
    crate::ANNOTATION_TOC_OFFSET,
    crate::ANNOTATION_TOC_LENGTH,
    crate::ANNOTATION_FORMAT_VERSION,
];

fn prefixed(key: &str) -> String {
    format!("{SNAPSHOT_LABEL_PREFIX}{key}")
}

/// Adds the inherited-label annotations to the annotations of the layer descriptor of blob
/// `digest` when they carry a weenv TOC hint; removes stale ones (a layer kept or made plain)
/// otherwise. Idempotent.
pub fn add_snapshot_annotations(digest: &Digest, annotations: &mut BTreeMap<String, String>) {
    let weenv = matches!(TocHint::from_annotations(annotations.iter()), Ok(Some(_)));
    annotations.remove(ANNOTATION_SNAPSHOT_LAYER_DIGEST);
    for k in HINT_KEYS {
        annotations.remove(&prefixed(k));
    }
    if !weenv {
        return;
    }
    let copies: Vec<(String, String)> = HINT_KEYS
        .iter()
        .filter_map(|k| annotations.get(*k).map(|v| (prefixed(k), v.clone())))
        .collect();
    annotations.extend(copies);
    annotations.insert(
        ANNOTATION_SNAPSHOT_LAYER_DIGEST.to_string(),
        digest.to_string(),
    );
}

/// A weenv layer as a Prepare's labels name it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabeledLayer {
    pub digest: Digest,
    /// The TOC location, when the labels carry a well-formed hint.
    pub hint: Option<TocHint>,
}

/// The layer the inherited labels name (`None` without a well-formed
/// [`ANNOTATION_SNAPSHOT_LAYER_DIGEST`]); a malformed hint is dropped (the daemon then reads the
/// manifest's or probes).
pub fn layer_from_labels<'a, I>(labels: I) -> Option<LabeledLayer>
where
    I: IntoIterator<Item = (&'a String, &'a String)>,
{
    let mut digest = None;
    let mut hint = Vec::new();
    for (k, v) in labels {
        if k == ANNOTATION_SNAPSHOT_LAYER_DIGEST {
            digest = Some(v);
        } else if let Some(rest) = k.strip_prefix(SNAPSHOT_LABEL_PREFIX) {
            if rest.starts_with("io.weenv.") {
                hint.push((rest.to_string(), v.clone()));
            }
        }
    }
    Some(LabeledLayer {
        digest: digest?.parse().ok()?,
        hint: TocHint::from_annotations(hint).ok().flatten(),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn weenv_annotations() -> BTreeMap<String, String> {
        BTreeMap::from([
            (
                crate::ANNOTATION_TOC_DIGEST.into(),
                Digest::sha256(b"toc").to_string(),
            ),
            (crate::ANNOTATION_TOC_OFFSET.into(), "900".into()),
            (crate::ANNOTATION_TOC_LENGTH.into(), "100".into()),
            (
                crate::ANNOTATION_FORMAT_VERSION.into(),
                crate::FORMAT_VERSION.to_string(),
            ),
            ("other".into(), "kept".into()),
        ])
    }

    #[test]
    fn round_trip_through_containerd_label_filter() {
        let d = Digest::sha256(b"layer");
        let mut a = weenv_annotations();
        add_snapshot_annotations(&d, &mut a);
        let once = a.clone();
        add_snapshot_annotations(&d, &mut a);
        assert_eq!(a, once, "idempotent");
        // What containerd's unpacker passes: the prefixed keys only.
        let labels: HashMap<String, String> = a
            .into_iter()
            .filter(|(k, _)| k.starts_with(SNAPSHOT_LABEL_PREFIX))
            .collect();
        assert_eq!(labels.len(), 5);
        let l = layer_from_labels(&labels).unwrap();
        assert_eq!(l.digest, d);
        let h = l.hint.unwrap();
        assert_eq!(
            (h.offset, h.length, h.digest),
            (900, 100, Digest::sha256(b"toc"))
        );
    }

    #[test]
    fn plain_layers_carry_none_and_lose_stale_ones() {
        let d = Digest::sha256(b"layer");
        let mut a = weenv_annotations();
        add_snapshot_annotations(&d, &mut a);
        a.retain(|k, _| !k.starts_with("io.weenv."));
        add_snapshot_annotations(&d, &mut a);
        assert_eq!(a, BTreeMap::from([("other".into(), "kept".into())]));
    }

    #[test]
    fn labels_without_digest_or_with_a_bad_one_name_no_layer() {
        let none: HashMap<String, String> = HashMap::new();
        assert!(layer_from_labels(&none).is_none());
        let bad = HashMap::from([(
            ANNOTATION_SNAPSHOT_LAYER_DIGEST.to_string(),
            "sha256:x".to_string(),
        )]);
        assert!(layer_from_labels(&bad).is_none());
        let mut ok = bad.clone();
        ok.insert(
            ANNOTATION_SNAPSHOT_LAYER_DIGEST.into(),
            Digest::sha256(b"l").to_string(),
        );
        ok.insert(prefixed(crate::ANNOTATION_TOC_OFFSET), "junk".into());
        assert_eq!(
            layer_from_labels(&ok),
            Some(LabeledLayer {
                digest: Digest::sha256(b"l"),
                hint: None
            })
        );
    }
}
