//! weenv-convert: turns OCI/Docker images into weenv images.
//!
//! Parts:
//! - [`location`]: parse `reg/repo:tag`, `oci:DIR[:tag]`, `docker-archive:FILE`.
//! - [`source`] / [`archive`]: read manifests, configs and layer blobs from a registry, an OCI
//!   layout or a docker-archive tarball (in place, no extraction).
//! - [`layer`]: media types, weenv detection, one layer -> weenv layer (streaming);
//!   [`readahead`] decodes the source on a second thread.
//! - [`convert`]: the image pipeline (parallel layers, configs untouched, manifests rewritten,
//!   indexes per platform, deterministic output).
//! - [`sink`]: write to a registry (skip/mount/chunked upload) or an OCI layout, atomically
//!   ([`stage`]: staged in scratch, committed by renames, `index.json` last); [`scratch`]: the
//!   run's locked scratch dir, and removal of the ones killed runs left.
//! - [`verify`]: TOC, every frame digest and diff_id of every weenv layer.
//! - [`inspect`]: layer sizes, entry counts, compression ratios, prefetch profile sizes.
//! - [`prefetch`]: attach a start-up prefetch profile to an image (rewrites manifests only).
//! - [`summary`]: reports and their tables.
//! - groups and plans, the registry side of [`weenv_env`]: [`group`] (`group create`: layers
//!   from a directory, tarball or image, written as weenv layers and pushed with the group
//!   manifest), [`plan`] (resolve group references, publish a composed image by cross-repository
//!   mounts), [`mutate`] (`group mutate`, and the at-init mutation of a container rootfs used by
//!   `weenv run`), [`resolve_cache`] (the persisted reference → digest cache).
//!
//! Errors: [`ConvertError`] (error.rs), one enum for the crate's modules.

pub mod archive;
pub mod convert;
pub mod error;
pub mod group;
pub mod inspect;
pub mod layer;
pub mod location;
pub mod mutate;
pub mod plan;
pub mod prefetch;
pub mod readahead;
pub mod resolve_cache;
pub mod scratch;
pub mod sink;
pub mod source;
pub mod stage;
pub mod summary;
pub mod verify;

pub use convert::{convert_image, parse_platform, ConvertOptions, NoProgress, Progress};
pub use error::ConvertError;
pub use inspect::{inspect_image, LayerInfo};
pub use location::ImageLocation;
pub use prefetch::{
    apply_annotations, apply_profile, read_profile, PrefetchLayer, PrefetchManifest, ProfileReport,
};
pub use summary::{ImageReport, LayerAction, LayerReport, ManifestReport};
pub use verify::{verify_image, LayerVerdict};

use std::collections::BTreeMap;
use weenv_registry::{HostConfig, RegistryConfig};

/// A registry configuration with plain HTTP for `plain_http_hosts` (e.g. `127.0.0.1:5000`).
pub fn registry_config(plain_http_hosts: &[String]) -> RegistryConfig {
    let mut c = RegistryConfig::default();
    let mut hosts = BTreeMap::new();
    for h in plain_http_hosts {
        hosts.insert(
            h.clone(),
            HostConfig {
                plain_http: true,
                ..HostConfig::default()
            },
        );
    }
    c.hosts = hosts;
    c
}
