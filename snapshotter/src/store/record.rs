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

/// A committed snapshot backed by a FUSE layer directory instead of its own dir.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteLayerRef {
    /// Layer (blob) digest, `sha256:...`.
    pub digest: String,
    /// FUSE directory of the layer (`<mountpoint>/<hex>`).
    pub dir: PathBuf,
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
}
