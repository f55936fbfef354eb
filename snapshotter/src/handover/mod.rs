//! The FUSE session outlives the daemon: a keeper process holds the session's `/dev/fuse`
//! fd, and a new daemon takes the session over instead of mounting a new one.
//!
//! - [`keeper`]: the keeper (`weenv-snapshotter keeper`): holds one session's fd and its
//!   [`SessionMeta`] and hands both to the next daemon; aborts the session after a timeout
//!   with no daemon ([`keeper::decide`]).
//! - [`client`]: the daemon's side of the keeper's socket (connect or spawn the keeper).
//! - [`wire`]: the socket's messages (length-prefixed JSON, the fd as `SCM_RIGHTS`).
//! - [`resume`]: a fuser session over an fd whose FUSE INIT was answered by an earlier
//!   process, and `FUSE_NOTIFY_RESEND`.
//!
//! What keeps the kernel's view valid across the takeover:
//! - the connection: the keeper's fd is the same open file as the daemon's, so the kernel
//!   never sees the last fd close (which would abort the connection);
//! - inode numbers: `((slot + 1) << 32) | (node + 1)` (see [`crate::fs::layer`]); node
//!   numbers follow from the layer's TOC (the same TOC from the TOC cache gives the same
//!   table), and the slot of each digest is recorded in the keeper before the layer becomes
//!   visible, so the successor gives every layer its old slot;
//! - requests: those the old process read but never answered are re-queued by
//!   `FUSE_NOTIFY_RESEND` (Linux 6.9+); those that arrive meanwhile wait in the kernel's
//!   queue until the successor reads them (it reads only once every layer is back).

pub mod client;
pub mod keeper;
pub mod resume;
pub mod wire;

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Version of [`SessionMeta`] and of the keeper protocol.
pub const META_VERSION: u32 = 1;

/// The INIT parameters the kernel offered when the session was mounted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InitParams {
    pub major: u32,
    pub minor: u32,
    /// The kernel's capability bits (`flags | flags2 << 32`).
    pub flags: u64,
}

/// The live opens of one inode (as the daemon counted them; both counts 0: none). The
/// kernel keeps an inode's I/O mode and backing file while it is open, so a successor must
/// answer new opens of it alike (see [`crate::fs::passthrough`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenRecord {
    pub ino: u64,
    pub cached: u32,
    pub passthrough: u32,
    /// Raw backing id of the passthrough opens.
    pub backing: Option<u32>,
}

/// What a successor needs besides the fd to serve the session like its predecessor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionMeta {
    pub version: u32,
    pub mountpoint: PathBuf,
    pub init: InitParams,
    /// Slot of every layer digest the session ever exposed.
    pub slots: BTreeMap<String, u32>,
    /// Takeovers of this session so far (the successor's passthrough file handles start at
    /// `takeovers << 40` so they never collide with a predecessor's live ones).
    pub takeovers: u64,
    /// Inodes with live opens (filled by the keeper when it hands the session over).
    #[serde(default)]
    pub opens: Vec<OpenRecord>,
}
