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
//! - [`source`]: [`RangeSource`], the one async range source (single-attempt `try_read`,
//!   provided `read` with one retry budget per read, typed [`SourceError`] kinds), and
//!   [`RegistryRangeSource`] over a registry blob.
//! - [`range_reader`]: [`SyncRangeReader`], the sync `RangeRead` over any [`RangeSource`]
//!   ([`BlobRangeReader`] over a registry blob).

#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod auth;
mod blob;
mod client;
pub mod config;
pub mod error;
pub mod manifest;
mod pull;
mod push;
pub mod range_reader;
pub mod reference;
pub mod retry;
pub mod source;
pub mod stats;
#[cfg(test)]
mod tests;
mod tls;

pub use auth::{Credential, CredentialSource};
pub use blob::{parse_content_range, range_header};
pub use bytes::Bytes;
pub use client::Client;
pub use config::{Capability, Endpoint, HostConfig, MirrorConfig, RegistryConfig};
pub use error::{causes, RegistryError, SourceError};
pub use manifest::{
    platform_matches, select_platform, Descriptor, ImageIndex, ImageManifest, Manifest, Platform,
};
pub use pull::ManifestBlob;
pub use push::{finalize_url, BlobPush};
pub use range_reader::{BlobRangeReader, SyncRangeReader};
pub use reference::Reference;
pub use retry::{ErrorKind, RetryPolicy};
pub use source::{
    Attempt, BlobLocator, ByteRange, RangeSource, ReadObserver, ReadOpts, ReadReport,
    RegistryRangeSource, Verify,
};
pub use stats::StatsSnapshot;
pub use weenv_format::Digest;
