//! Frame caches: [`memory`] (L1) and [`disk`] (L2), both keyed by frame digest and bounded by
//! the pure [`lru`] policy. Only verified frames are ever inserted.

pub mod disk;
pub mod lru;
pub mod memory;

pub use disk::DiskCache;
pub use memory::MemoryCache;

use std::path::PathBuf;
use thiserror::Error;

/// Errors of the frame caches.
#[derive(Debug, Error)]
pub enum CacheError {
    #[error("cache: {what} {path}: {error} (check the cache_dir's permissions and free space)")]
    Io {
        what: &'static str,
        path: PathBuf,
        error: std::io::Error,
    },
}
