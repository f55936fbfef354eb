//! Getting verified frames: blob sources, coalescing, single flight, read-ahead, fill.
//!
//! - [`source`]: implementations of `weenv_registry::RangeSource` (re-exported here;
//!   the network sits behind it; its provided `read` owns the one retry budget per read:
//!   `registry/src/source.rs`), and [`FileBlobSource`] (local file, tests/benches);
//!   registry blobs are `weenv_registry::RegistryRangeSource`.
//! - [`plan`]: pure coalescing of frame misses into range requests.
//! - [`link`]: the node's link scheduler: on-demand reads first, start-up prefetch and fill
//!   below them (pure queue policy + async shell); a reader takes the frames it needs out of
//!   queued background requests (`Carve`).
//! - [`frames`]: [`FrameStore`], the read path L1 -> L2 -> source with verification of
//!   every frame before it is cached or served.
//! - `single_flight`: one fetch per frame digest however many readers miss it; claims,
//!   waiters, and readers taking a frame out of a queued background request.
//! - [`cpu`]: background CPU and disk work at low priority (`SCHED_IDLE`/nice, ioprio) and
//!   the fill's pause while the node's containers read.
//! - [`fill`]: background fill of whole layers, lower priority than on-demand reads and
//!   prefetch (one read per batch, no retry loop of its own).
//! - [`prefetch`]: start-up prefetch of an image profile's frames.

pub mod cpu;
pub mod fill;
pub mod frames;
pub mod link;
pub mod plan;
pub mod prefetch;
mod single_flight;
pub mod source;
pub(crate) mod testutil;

pub use cpu::{CpuPolicy, CpuPriority};
pub use fill::{FillConfig, FillProgress, FillShared, FillState};
pub use frames::{FrameStore, Priority};
pub use link::{LinkPolicy, LinkScheduler};
pub use prefetch::{run_prefetch, PrefetchProgress};
pub use source::{CountingSource, FileBlobSource};
pub use weenv_registry::RangeSource;

use std::sync::Arc;
use thiserror::Error;
use weenv_format::Digest;
use weenv_registry::{ByteRange, ErrorKind, SourceError};

/// Errors of the fetch path. Cloneable: one failed fetch is reported to every waiter.
#[derive(Clone, Debug, Error)]
pub enum FetchError {
    /// The source's read failed (after its retry budget); `kind` says why it stopped.
    #[error("fetching {len} bytes at offset {offset} of {source_name}: {error} ({kind} error; check registry reachability and credentials)")]
    Source {
        source_name: String,
        offset: u64,
        len: u64,
        kind: ErrorKind,
        error: Arc<SourceError>,
    },
    #[error("frame {index} ({frame}, at blob offset {offset}) of {layer} failed verification twice (fetched, then refetched bypassing the caches): {reason}; nothing was cached or served, the next read fetches it again")]
    Verify {
        layer: String,
        index: u32,
        frame: Digest,
        offset: u64,
        reason: String,
    },
    #[error("frame index {index} is out of range (TOC has {frames} frames)")]
    BadFrameIndex { index: u32, frames: usize },
    #[error("disk cache: {0}")]
    Cache(String),
    #[error("fetch task stopped: {0}")]
    Stopped(String),
}

impl FetchError {
    /// The read of `range` from source `source_name` failed with `error`.
    pub fn source(source_name: String, range: ByteRange, error: SourceError) -> Self {
        FetchError::Source {
            source_name,
            offset: range.offset,
            len: range.len,
            kind: error.kind(),
            error: Arc::new(error),
        }
    }

    /// The errno a FUSE read answers with (the one mapping from fetch errors to FUSE).
    /// Every fetch failure is an I/O error to the reader: the data exists but cannot be
    /// produced right now (network, verification); a retry may succeed.
    pub fn errno(&self) -> fuser::Errno {
        fuser::Errno::EIO
    }
}
