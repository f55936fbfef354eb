//! weenv environments: how independently evolving parts (an OS base, a repository at a
//! commit, a harness, an evaluator) are published and composed into runnable images.
//!
//! Pure: no network, no async runtime (it uses `weenv-registry` only for the workspace's one
//! OCI model, e.g. [`weenv_registry::Platform`]). The registry I/O (resolve, fetch, push, mount) is in
//! `weenv-converter` (`group.rs`, `plan.rs`, `mutate.rs`), which drives these parts.
//!
//! Parts:
//! - [`group`]: the layer-group artifact (an OCI manifest with its own artifact type and a
//!   [`group::GroupConfig`] blob), its canonical JSON and [`group::build_group`].
//! - [`fragment`]: the image-config fragment a group contributes, taken from an image or a
//!   group config, merged with command-line values.
//! - [`plan`]: the strict, versioned plan file and [`plan::compose`], the pure composition of
//!   resolved groups into one OCI image manifest + config (metadata only).
//! - [`plan_ref`]: a plan published as an OCI artifact (plan JSON + patch blob) and its
//!   composition with the mutation synthesised as a layer (plans by reference).
//! - [`mutation`]: a per-task patch pre-applied over a base group's layers (union view with
//!   whiteouts, range reads through the TOC) into a tiny layer tar.
//! - [`patch`]: the unified-diff parser and all-or-nothing applier (in memory or on a
//!   directory).
//! - [`stats`]: artifact accounting of packaging strategies (`weenv-convert plan stats`).

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod fragment;
pub mod group;
pub mod mutation;
pub mod patch;
pub mod plan;
pub mod plan_ref;
pub mod stats;
