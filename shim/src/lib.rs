//! `containerd-shim-weenv-v1`: a containerd shim v2 for runc containers that scales each
//! container's CPU and memory quota elastically.
//!
//! - [`service`]: the task API (ttrpc) over runc ([`runc`], [`process`], [`stats`]);
//!   its failures are [`error::ShimError`], mapped to ttrpc codes in one table.
//! - [`monitor`]: the per-container loop: sample → [`policy::decide`] → [`ledger`] →
//!   [`apply::plan`] → write, recording every change ([`status`]).
//! - [`cgroup`]: cgroup v1/v2 I/O behind [`cgroup::CgroupIo`], roots injected.
//! - [`config`]: versioned strict TOML config and `io.weenv.*` annotations.

// Test code may unwrap: a failing unwrap is a failing test; daemon paths may not.
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod apply;
pub mod bootstrap;
pub mod cgroup;
pub mod config;
pub mod error;
pub mod info;
pub mod io;
pub mod ledger;
pub mod logging;
pub mod monitor;
pub mod policy;
pub mod process;
pub mod runc;
pub mod service;
pub mod stats;
pub mod status;
pub mod stdio;
