//! weenv-snapshotter: a containerd proxy snapshotter with lazy, FUSE-backed weenv layers.
//!
//! Parts (daemon side):
//! - [`config`]: the versioned TOML config.
//! - [`store`]: persistent metadata (redb): snapshots, layer records, resolved references.
//! - [`service`]: containerd snapshotter semantics (domain types only).
//! - [`mounts`]: overlayfs mount shapes (pure).
//! - [`remote`]: remote-snapshot labels and the [`remote::LayerProvider`] seam.
//! - [`grpc`]: the tonic adapter serving containerd's Snapshots API on a unix socket.
//! - [`http`] + [`status`]: the observability endpoint on hyper (`/metrics`, `/status`, `/profile`, `/verify`).
//! - [`daemon`]: wiring (store, FUSE layer store, remount, servers).
//! - [`dirs`]: directory modes set explicitly (private state, overlayfs's snapshot modes).
//! - the lazy data path: [`layers`] (the FUSE sessions and the node's layer registry),
//!   [`fs`] (the FUSE filesystem), [`fetch`] (verified frames: single flight, link
//!   scheduling, fill, prefetch), [`cache`] (L1 memory, L2 disk), [`metrics`].
//! - [`handover`]: the keeper that holds the FUSE sessions across a daemon restart.
//! - [`peer`]: the node disk cache shared with peer nodes (serve, find, place, verify).
//!
//! The daemon's contract with its clients (config schema, remote-snapshot labels, the
//! `/status` and `/profile` documents) is the `weenv-snapshotter-api` crate; [`config`] is
//! re-exported from it. The `weenv` user CLI is the `weenv-cli` crate: the daemon links
//! neither it nor the converter.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod cache;
pub use weenv_snapshotter_api::config;
pub mod daemon;
pub mod dirs;
mod error_messages;
pub mod fetch;
pub mod fs;
pub mod grpc;
pub mod handover;
pub mod http;
pub mod layers;
pub mod metrics;
pub mod mounts;
pub mod peer;
pub mod plans;
pub mod remote;
pub mod service;
pub mod status;
pub mod store;
