//! Record types persisted in the metadata store (JSON values).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Snapshot kind, as in containerd.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    View,
    Active,
    Committed,
}

impl Kind {
    /// containerd's filter spelling (`kind==committed`).
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::View => "view",
            Kind::Active => "active",
            Kind::Committed => "committed",
        }
    }
}

/// A committed snapshot backed by a FUSE layer directory instead of its own dir: the identity
/// of the layer it was made from. A Prepare reuses it only for the same layer (blob digest and
/// TOC digest), never because its chain id alone matches.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteLayerRef {
    /// Layer (blob) digest, `sha256:...`.
    pub digest: String,
    /// FUSE directory of the layer (`<mountpoint>/<hex>`).
    pub dir: PathBuf,
    /// Digest of the layer's TOC (absent in records of older daemons).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toc_digest: Option<String>,
    /// The diff_id the image claimed for the layer: unverified until the layer is complete
    /// (see [`LayerRecord::verified`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diff_id: Option<String>,
}

/// One snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    pub key: String,
    /// Directory id: `<root>/snapshots/<id>/{fs,work}` (unused for remote snapshots).
    pub id: u64,
    pub kind: Kind,
    /// Parent key, empty for none.
    pub parent: String,
    pub labels: BTreeMap<String, String>,
    pub created_nanos: u64,
    pub updated_nanos: u64,
    /// Bytes used (committed snapshots; computed at commit).
    pub size: i64,
    /// Inodes used (committed snapshots).
    pub inodes: i64,
    /// Set for remote (FUSE-backed) committed snapshots.
    #[serde(default)]
    pub remote: Option<RemoteLayerRef>,
    /// Active and view snapshots: the layers (digests) whose native tree this snapshot's
    /// mount uses as lowerdir instead of the FUSE directory (decided when it was created;
    /// the trees are pinned while the snapshot lives).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub native: Vec<String>,
}

#[cfg(test)]
impl SnapshotRecord {
    /// Test fixture: committed snapshot `key` (id 1) on `parent`, every other field zero/empty.
    pub(crate) fn committed(key: &str, parent: &str) -> SnapshotRecord {
        SnapshotRecord {
            key: key.into(),
            id: 1,
            kind: Kind::Committed,
            parent: parent.into(),
            labels: BTreeMap::new(),
            created_nanos: 0,
            updated_nanos: 0,
            size: 0,
            inodes: 0,
            remote: None,
            native: Vec::new(),
        }
    }
}

/// What we know about a layer blob.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum LayerKind {
    /// A weenv layer whose verified TOC is cached at `toc_path`.
    Weenv { toc_path: PathBuf },
    /// Not a weenv layer (negative cache): take the ordinary path.
    NotWeenv,
}

/// A layer digest record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerRecord {
    pub digest: String,
    /// Image reference the layer was first seen under (used to reach the registry).
    pub reference: String,
    /// Compressed blob size.
    pub size: u64,
    #[serde(flatten)]
    pub kind: LayerKind,
    /// Digest of the TOC (from the footer, equal to the manifest's `io.weenv.toc.digest` when
    /// that named one). Absent in records of older daemons and for non-weenv layers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toc_digest: Option<String>,
    /// The diff_id claimed for this blob by the image it was first exposed for. Later images
    /// claiming another one do not get this layer lazily (their Prepare takes the ordinary
    /// path, where containerd checks the diff_id itself).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diff_id: Option<String>,
    /// The completion check (every frame, in order: tar walk against the TOC, sha256 =
    /// `diff_id`) passed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub verified: bool,
    /// Why the layer is quarantined (every read of its files fails with EIO), if it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quarantined: Option<String>,
}

impl LayerRecord {
    /// A record of a layer that is not a weenv layer (negative cache).
    pub fn not_weenv(digest: String, reference: String) -> Self {
        LayerRecord {
            digest,
            reference,
            size: 0,
            kind: LayerKind::NotWeenv,
            toc_digest: None,
            diff_id: None,
            verified: false,
            quarantined: None,
        }
    }
}
