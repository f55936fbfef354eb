//! Remote-snapshot labels and the [`LayerProvider`] seam between the snapshot service and the
//! lazy layer machinery.
//!
//! - [`probe`]: pure classification of a blob tail (weenv or not, what else to read).
//! - [`toc_cache`]: verified TOC tails cached on disk by layer digest.
//! - [`image`]: what the image manifest says about its layers (size, TOC hint, profile).
//! - [`identity`]: which known layer a Prepare may be served from (pure).
//! - [`contest`]: chains another image claims with another layer (their snapshots wait for
//!   verification).
//! - [`provider`]: [`WeenvLayers`], the real [`LayerProvider`] (registry + FUSE layer store).
//! - [`source`]: where a layer comes from when the Prepare names only the layer (stock
//!   clients): containerd's content store.
//!
//! containerd passes `containerd.io/snapshot.ref=<target chainID>` plus one of two label
//! families naming the image and the layer:
//! - CRI / Go client handler wrapper: `containerd.io/snapshot/cri.image-ref`,
//!   `containerd.io/snapshot/cri.layer-digest`;
//! - `ctr-remote image rpull` (stargz): `containerd.io/snapshot/remote/stargz.reference`,
//!   `containerd.io/snapshot/remote/stargz.digest`;
//! - containerd's own unpacker (nerdctl, the Go client, CRI without snapshot annotations):
//!   only the layer descriptor's inherited `containerd.io/snapshot/*` annotations, which
//!   weenv-convert writes (`containerd.io/snapshot/weenv.layer-digest` + TOC hint); the image
//!   is then found through [`source`].

pub mod contest;
pub mod identity;
pub mod image;
pub mod probe;
pub mod provider;
pub mod source;
pub mod toc_cache;

pub use provider::WeenvLayers;

use std::path::PathBuf;
use thiserror::Error;
use weenv_format::Digest;

pub use crate::fs::verify::Verdict;

pub use weenv_snapshotter_api::labels::{
    RemoteLayerRequest, UnsourcedLayerRequest, LABEL_CRI_IMAGE_REF, LABEL_CRI_LAYER_DIGEST,
    LABEL_CRI_MANIFEST_DIGEST, LABEL_STARGZ_DIGEST, LABEL_STARGZ_REFERENCE, LABEL_TARGET,
    LABEL_WEENV_LAYER,
};

/// Errors of the remote path. None of them fails a Prepare: the service falls back to the
/// ordinary path and logs the error.
#[derive(Debug, Error)]
pub enum RemoteError {
    #[error("registry access for layer {digest} of {reference}: {message}")]
    Registry {
        reference: String,
        digest: String,
        message: String,
    },
    #[error("TOC of layer {digest}: {message}")]
    Toc { digest: String, message: String },
    #[error("mounting layer {digest}: {message}")]
    Mount { digest: String, message: String },
    #[error("no cached TOC for layer {digest}: pull the image again")]
    NotCached { digest: String },
    #[error("lazy layers are unavailable: {0}")]
    Unsupported(String),
    /// The Prepare names the layer differently from what this node bound it to (another
    /// claimed diff_id or TOC digest), names no claim at all, or the layer is quarantined:
    /// it must not get this layer lazily.
    #[error("layer {digest} cannot be shared: {reason}")]
    Identity { digest: String, reason: String },
    /// A verification on request concluded nothing (a frame or the TOC could not be read).
    #[error("verifying layer {digest}: {message}")]
    Verify { digest: String, message: String },
    /// The layer is over a configured limit (`[limits]`); the message names the limit and the
    /// config key (the caller names the layer). The Prepare fails (no silent ordinary pull).
    #[error("{0}")]
    Limit(String),
}

/// A mounted layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountedLayer {
    /// Directory exposing the layer's tree (`<mountpoint>/<hex>`).
    pub dir: PathBuf,
    /// Uncompressed size of the layer's files (reported as usage).
    pub size: i64,
    /// Number of TOC entries (reported as inodes).
    pub inodes: i64,
    /// Digest of the layer's TOC.
    pub toc_digest: Option<Digest>,
    /// The diff_id the image claims for the layer (unverified until the layer is complete).
    pub diff_id: Option<Digest>,
}

/// The lazy layer machinery as the snapshot service sees it.
#[async_trait::async_trait]
pub trait LayerProvider: Send + Sync + 'static {
    /// Mount `req.digest` if it is a weenv layer (fetching and caching its TOC; no file
    /// content). `Ok(None)` when the layer is not a weenv layer.
    async fn mount(&self, req: &RemoteLayerRequest) -> Result<Option<MountedLayer>, RemoteError>;
    /// Re-expose a layer from its cached TOC (on restart, before gRPC is served).
    async fn remount(&self, digest: &Digest) -> Result<MountedLayer, RemoteError>;
    /// Stop exposing a layer that no snapshot refers to any more.
    fn release(&self, digest: &Digest) -> Result<(), RemoteError>;
    /// Start the start-up prefetch of an exposed layer for the image `req` names (in the
    /// background; no-op without a profile).
    fn prefetch(&self, _req: &RemoteLayerRequest) {}
    /// Fetches layer `digest` in full now and checks it against its claimed diff_id (a
    /// mismatch quarantines it); a verdict concluded before is returned at once.
    async fn verify(&self, digest: &Digest) -> Result<Verdict, RemoteError> {
        Err(RemoteError::Unsupported(format!(
            "cannot verify layer {digest} on request"
        )))
    }
    /// The verdict of layer `digest` if one is known (no check is started).
    fn verdict(&self, _digest: &Digest) -> Option<Verdict> {
        None
    }
    /// Why layer `digest` is quarantined, if it is (its snapshots are not handed out again).
    fn quarantined(&self, _digest: &Digest) -> Option<String> {
        None
    }
    /// The native tree of layer `digest` if new mounts may use it (see `fs::native`).
    fn native_dir(&self, _digest: &Digest) -> Option<std::path::PathBuf> {
        None
    }
    /// Where layer `digest`'s native tree lives (whether or not it exists).
    fn native_path(&self, _digest: &Digest) -> Option<std::path::PathBuf> {
        None
    }
    /// Pins (`hold`) or releases layer `digest`'s native tree for one snapshot whose mount
    /// names it; false if there is no tree to pin.
    fn hold_native(&self, _digest: &Digest, _hold: bool) -> bool {
        false
    }
    /// Called once the live snapshots pinned their trees again after a restart.
    fn native_restored(&self) {}
    /// True if `dir` still serves layer `digest`, though [`LayerProvider::remount`] names
    /// another directory (a snapshot made before the layer moved to the plain FUSE session).
    fn serves_dir(&self, _digest: &Digest, _dir: &std::path::Path) -> bool {
        false
    }
}
