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

    #[error("layer {digest}: {error}")]
    Format { digest: String, error: FormatError },

    #[error(transparent)]
    Registry(#[from] RegistryError),

    #[error("{context}: {error}")]
    Io {
        context: String,
        error: std::io::Error,
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
            error: source,
        }
    }

    /// A format error for a layer.
    pub fn format(digest: impl ToString, source: FormatError) -> Self {
        ConvertError::Format {
            digest: digest.to_string(),
            error: source,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Each `": "`-separated segment once through anyhow's `{:#}` (what a chain printer shows).
    fn assert_once(e: anyhow::Error) -> String {
        let m = format!("{e:#}");
        let segs: Vec<&str> = m.split(": ").collect();
        for (i, s) in segs.iter().enumerate() {
            assert!(!segs[i + 1..].contains(s), "{s:?} repeats in: {m}");
        }
        m
    }

    #[test]
    fn messages_say_each_cause_once() {
        let e = ConvertError::io("writing /l/blobs/x", std::io::Error::other("disk full"));
        assert_once(anyhow::Error::new(e).context("converting oci:/s"));
        let e = ConvertError::format(
            "sha256:ab",
            FormatError::DotDotPath {
                path: "a/../b".into(),
            },
        );
        let m = assert_once(anyhow::Error::new(e));
        assert_eq!(m.matches("'..'").count(), 1, "{m}");
        let e = ConvertError::from(RegistryError::Io {
            context: "reading blob".into(),
            error: std::io::Error::other("short read"),
        });
        assert_once(anyhow::Error::new(e));
        let e = crate::group::GroupCmdError::Io {
            context: "reading /g.tar".into(),
            error: std::io::Error::other("gone"),
        };
        assert_once(anyhow::Error::new(e));
    }
}
