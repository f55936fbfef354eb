//! `ConvertError`: what can go wrong reading, converting, verifying or writing an image. Every
//! variant names the image, blob or path involved and, where useful, what to do.

use thiserror::Error;
use weenv_format::FormatError;
use weenv_registry::RegistryError;

/// Errors of the converter library.
#[derive(Debug, Error)]
pub enum ConvertError {
    #[error("invalid image location {input:?}: {reason} (expected reg/repo:tag, oci:DIR[:tag] or docker-archive:FILE)")]
    BadLocation { input: String, reason: String },

    #[error("{location}: no image named {tag:?} (available: {available})")]
    MissingReference {
        location: String,
        tag: String,
        available: String,
    },

    #[error("{location}: {reason}")]
    BadImage { location: String, reason: String },

    #[error("blob {digest} (layer {index}) has media type {media_type:?}, which weenv-convert does not support (supported: tar, tar+gzip, tar+zstd, OCI and Docker variants)")]
    UnsupportedMediaType {
        index: usize,
        digest: String,
        media_type: String,
    },

    #[error("layer {index} ({digest}) decompresses to {actual}, but the image config lists diff_id {expected}: the source image is corrupt")]
    DiffIdMismatch {
        index: usize,
        digest: String,
        expected: String,
        actual: String,
    },

    #[error("blob {digest} is corrupt: {reason}")]
    CorruptBlob { digest: String, reason: String },

    #[error("layer {digest}: {source}")]
    Format {
        digest: String,
        #[source]
        source: FormatError,
    },

    #[error(transparent)]
    Registry(#[from] RegistryError),

    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },

    #[error("invalid option {field}: {reason}")]
    BadOption { field: &'static str, reason: String },

    #[error("verification failed for {failed} of {total} layers (see the report above)")]
    VerifyFailed { failed: usize, total: usize },

    #[error("{location}: no weenv layer in the image, so a prefetch profile has nothing to annotate (convert it first: weenv-convert image SRC DST)")]
    NotWeenv { location: String },

    #[error("{location}: none of the profile's {paths} paths names a regular file in the image (first: {first:?}); wrong image or wrong profile? Nothing was written")]
    ProfileUnresolved {
        location: String,
        paths: usize,
        first: String,
    },

    #[error("internal task failed: {0}")]
    Task(String),
}

impl ConvertError {
    /// An I/O error with context.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        ConvertError::Io {
            context: context.into(),
            source,
        }
    }

    /// A format error for a layer.
    pub fn format(digest: impl ToString, source: FormatError) -> Self {
        ConvertError::Format {
            digest: digest.to_string(),
            source,
        }
    }
}
