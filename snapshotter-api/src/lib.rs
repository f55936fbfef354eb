//! The weenv-snapshotter daemon's published contract, for the daemon and its clients (the
//! `weenv` CLI) alike, so that neither links the other:
//!
//! - [`config`]: the daemon's versioned, strict TOML config (`/etc/weenv/config.toml`); the
//!   CLI reads the same file for registry settings and the endpoint address.
//! - [`labels`]: the remote-snapshot labels of a Prepare, written by `weenv pull` and read by
//!   the daemon.
//! - [`status`]: the `GET /status` and `GET /profile` documents and their text renderings.
//! - [`client`]: the client of the observability endpoint (`weenv status/profile/metrics`).

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod client;
pub mod config;
pub mod labels;
pub mod status;
pub mod verify;
