//! OCI distribution client for weenv: a thin layer over `reqwest` (rustls) with exact control
//! of the requests sent, because the snapshotter's hot path needs "one HEAD + one ranged GET",
//! the converter needs chunked upload and cross-repository mounts, and nodes need
//! containerd-style mirrors.
//!
//! Parts:
//! - [`reference`]: [`Reference`] parsing (`reg:port/repo:tag@sha256:..`, Docker Hub defaults).
//! - [`config`]: [`RegistryConfig`] (TLS/plain HTTP per host, mirrors, `hosts.toml` loader).
//! - [`auth`]: `WWW-Authenticate`, docker `config.json` credentials, bearer tokens.
//! - [`retry`]: backoff schedule and what is retryable (pure).
//! - [`manifest`]: manifest/index/descriptor types, media types, platform selection.
//! - [`Client`] (client.rs): endpoints, auth, redirects, retries, [`StatsSnapshot`] counters;
//!   operations in pull.rs (resolve, manifests), blob.rs (HEAD, GET, range GET, stream) and
//!   push.rs (monolithic/chunked upload, mount, manifest push).
//! - [`range_reader`]: [`BlobRangeReader`], the sync `RangeRead` over a blob.

#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod auth;
mod blob;
mod client;
pub mod config;
pub mod error;
pub mod manifest;
#[cfg(test)]
mod mock_tests;
#[cfg(test)]
mod prop_tests;
mod pull;
mod push;
pub mod range_reader;
pub mod reference;
pub mod retry;
pub mod stats;
mod tls;

pub use auth::{Credential, CredentialSource};
pub use blob::{parse_content_range, range_header};
pub use bytes::Bytes;
pub use client::Client;
pub use config::{Capability, Endpoint, HostConfig, MirrorConfig, RegistryConfig};
pub use error::{causes, RegistryError};
pub use manifest::{
    platform_matches, select_platform, Descriptor, ImageIndex, ImageManifest, Manifest, Platform,
};
pub use pull::ManifestBlob;
pub use push::{finalize_url, BlobPush};
pub use range_reader::BlobRangeReader;
pub use reference::Reference;
pub use retry::RetryPolicy;
pub use stats::StatsSnapshot;
pub use weenv_format::Digest;
