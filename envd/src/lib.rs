//! weenv-envd: the environment service of a node. It creates environments from plans (composed
//! on the node, lazy layers, mutation at init: `weenv_cli::run`) or images, keeps each one
//! running under a long-lived init, runs commands and persistent shell sessions in it, moves
//! files in and out, reports the weenv shim's quotas and causes, and deletes it — over the gRPC
//! API of `proto/weenv/envd/v1/envd.proto`, on a unix socket (and optionally TCP with a bearer
//! token).
//!
//! Parts:
//! - [`service`]: the gRPC service (request validation, create fan-out, TTL and GC).
//! - [`state`]: the environments it knows; their state lives in containerd container labels
//!   ([`state::labels`]) and is reconciled at start ([`service::Service::reconcile`]).
//! - [`exec`]: one command through containerd's `Tasks.Exec` with FIFO stdio, bounded output,
//!   timeout and kill causes.
//! - [`session`]: a persistent shell per session (one exec process; a sentinel line ends each
//!   command's output), so a command costs no new `runc exec`.
//! - [`files`]: files read and written through `/proc/<init pid>/root` resolved inside the
//!   container's root (`openat2(RESOLVE_IN_ROOT)`); tar trees through `tar` in the container.
//! - [`pool`]: the warm pool (spares created ahead of demand per pool key, claimed by a
//!   create: labels updated, the task's mutation applied through the init's root).
//! - [`server`]: serving on a unix socket / TCP, the bearer-token check.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod error;
pub mod exec;
pub mod files;
pub mod pool;
pub mod server;
pub mod service;
pub mod session;
pub mod state;

/// The generated gRPC code (`weenv.envd.v1`).
pub mod proto {
    #![allow(clippy::all, clippy::pedantic)]
    tonic::include_proto!("weenv.envd.v1");
}
