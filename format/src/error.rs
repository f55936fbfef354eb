//! `FormatError`: every way a weenv blob or TOC can be bad.

use thiserror::Error;

/// Errors from parsing, verifying or writing weenv layers.
#[derive(Debug, Error)]
pub enum FormatError {
    #[error("invalid digest {0:?}: expected sha256:<64 lowercase hex>")]
    BadDigest(String),
    #[error("I/O error while {context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}
