//! weenv-cli: the `weenv` user CLI. It speaks to containerd over its gRPC API
//! (`containerd-client`) and to the weenv-snapshotter daemon over its published contract
//! (`weenv-snapshotter-api`: config file, remote-snapshot labels, `/status` and `/profile`);
//! it does not link the daemon, and the daemon does not link it.
//!
//! Parts:
//! - [`commands`]: argument parsing and dispatch (`pull`, `run`, `status`, `profile`, `metrics`).
//! - [`pull`]: `weenv pull`: manifest and config into containerd's content store, every layer
//!   prepared through containerd with the remote-snapshot labels (a weenv layer becomes a lazy
//!   remote snapshot, any other layer is fetched and applied).
//! - [`progress`]: what `weenv pull` prints per layer on a terminal (nothing in a pipe).
//! - [`run`]: `weenv run PLAN`: compose the plan's image on the node (content store + image
//!   record, no registry write), prepare its layers lazily, apply the at-init mutation into the
//!   container's rootfs, run the task — all
//!   through containerd's Leases/Snapshots/Containers/Tasks API and `nix` mounts, no `ctr`,
//!   `mount` or `umount` process.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod commands;
pub mod progress;
pub mod pull;
pub mod run;
pub mod trust;
