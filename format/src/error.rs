//! `FormatError`: every way a tar stream, a weenv blob or its TOC can be bad.
//!
//! Each variant names what failed and carries enough context (path, offset, frame) to act on it.
//! `is_malicious()` separates "this input is hostile or corrupt" from I/O trouble.

use crate::Digest;
use thiserror::Error;

/// Errors from parsing, verifying or writing weenv layers.
#[derive(Debug, Error)]
pub enum FormatError {
    #[error("invalid digest {0:?}: expected sha256:<64 lowercase hex>")]
    BadDigest(String),
    /// The cause is part of the message and deliberately not a `source()`, so chain printers
    /// (`{:#}` of anyhow) do not say it twice.
    #[error("I/O error while {context}: {error}")]
    Io {
        context: String,
        error: std::io::Error,
    },

    // ---- tar input -------------------------------------------------------------------------
    #[error("tar header at offset {offset}: checksum {stored} does not match computed {computed}; the input is not a tar stream or is corrupt")]
    TarChecksum {
        offset: u64,
        stored: u64,
        computed: u64,
    },
    #[error("tar header at offset {offset}: field {field} is not a valid number")]
    TarNumeric { offset: u64, field: &'static str },
    #[error("tar stream truncated at offset {offset} (inside {what}); the input ended early")]
    TruncatedTar { offset: u64, what: &'static str },
    #[error("tar header at offset {offset}: unsupported entry type {typeflag:?}")]
    TarUnsupportedType { offset: u64, typeflag: char },
    #[error("tar entry {path:?}: GNU sparse files are not supported; re-create the tar without --sparse")]
    GnuSparse { path: String },
    #[error("tar extension header at offset {offset}: malformed PAX/GNU record: {reason}")]
    PaxRecord { offset: u64, reason: String },
    #[error("tar extension header at offset {offset}: {size} bytes exceeds the limit of {limit}")]
    ExtensionTooLarge { offset: u64, size: u64, limit: u64 },
    #[error("tar stream has a header at offset {offset} after an end-of-archive zero block (concatenated archives?); containerd would reject it")]
    DataAfterEnd { offset: u64 },
    #[error("tar extension header at offset {offset} is not followed by an entry")]
    DanglingExtension { offset: u64 },
    #[error("tar entry {path:?} of type {typeflag:?} has a payload of {size} bytes; only regular files may carry data")]
    UnexpectedPayload {
        path: String,
        typeflag: char,
        size: u64,
    },
    #[error("tar entry {path:?}: value of {field} ({value}) is out of range")]
    FieldOutOfRange {
        path: String,
        field: &'static str,
        value: String,
    },

    // ---- paths (tar and TOC) ---------------------------------------------------------------
    #[error("entry path {path:?} is absolute; layers may only contain relative paths")]
    AbsolutePath { path: String },
    #[error("entry path {path:?} contains a '..' component")]
    DotDotPath { path: String },
    #[error("entry path {path:?} is invalid: {reason}")]
    InvalidPath { path: String, reason: &'static str },
    #[error("entry path {path:?} appears more than once")]
    DuplicatePath { path: String },
    #[error("entry {path:?} lies below {parent:?}, which is not a directory")]
    ParentNotDirectory { path: String, parent: String },
    #[error("hardlink {path:?} -> {target:?}: the target is not an earlier regular file")]
    HardlinkTarget { path: String, target: String },

    // ---- writer ----------------------------------------------------------------------------
    #[error("writer option {field} is invalid: {reason}")]
    InvalidOption { field: &'static str, reason: String },

    // ---- blob / footer / TOC ---------------------------------------------------------------
    #[error("not a weenv layer: {what} has magic {found:#x}, expected {expected:#x}")]
    BadMagic {
        what: &'static str,
        found: u64,
        expected: u64,
    },
    #[error("unsupported weenv format version {version} (this build reads version {supported}){}", version_hint(*.version, *.supported))]
    UnsupportedVersion { version: u32, supported: u32 },
    #[error("blob truncated: {what} needs {needed} bytes but only {available} are available")]
    Truncated {
        what: &'static str,
        needed: u64,
        available: u64,
    },
    #[error("TOC location is inconsistent: {reason}")]
    TocLocation { reason: String },
    #[error("TOC digest mismatch ({source_of_expected}): expected {expected}, got {actual}")]
    TocDigestMismatch {
        source_of_expected: &'static str,
        expected: Digest,
        actual: Digest,
    },
    #[error("TOC cannot be decoded: {reason}")]
    TocDecode { reason: String },
    #[error("absurd {what}: {value} exceeds the limit of {limit}")]
    AbsurdSize {
        what: &'static str,
        value: u64,
        limit: u64,
    },
    #[error("TOC frame {frame} is invalid: {reason}")]
    FrameLayout { frame: u64, reason: String },
    #[error("TOC entry {path:?} is invalid: {reason}")]
    EntryLayout { path: String, reason: String },
    #[error("TOC entry {path:?} does not match the tar stream: {field}: {toc} in the TOC, {tar} in the tar")]
    TocMismatch {
        path: String,
        field: &'static str,
        toc: String,
        tar: String,
    },
    #[error("TOC does not match the tar stream: {what}: {toc} in the TOC, {tar} in the tar")]
    StreamMismatch {
        what: &'static str,
        toc: String,
        tar: String,
    },
    #[error("TOC {what} is {value}, over the limit of {limit}")]
    TocLimit {
        what: &'static str,
        value: u64,
        limit: u64,
    },

    // ---- frames ----------------------------------------------------------------------------
    #[error("frame at blob offset {frame}: got {actual} compressed bytes, TOC says {expected}")]
    FrameLengthMismatch {
        frame: u64,
        expected: u64,
        actual: u64,
    },
    #[error("frame at blob offset {frame} cannot be decompressed: {reason}")]
    FrameDecompress { frame: u64, reason: String },
    /// `frame` is the blob offset of the frame.
    #[error("frame at blob offset {frame} failed verification: expected {expected}, got {actual}; refusing to serve it")]
    FrameDigestMismatch {
        frame: u64,
        expected: Digest,
        actual: Digest,
    },

    // ---- lookups ---------------------------------------------------------------------------
    #[error("no entry {path:?} in the layer")]
    NoSuchEntry { path: String },
    #[error("entry {path:?} is not a regular file")]
    NotAFile { path: String },
}

fn version_hint(version: u32, supported: u32) -> &'static str {
    if version < supported {
        ": the layer was converted by an older weenv-convert; re-convert it"
    } else {
        ": the layer was converted by a newer weenv-convert; upgrade weenv"
    }
}

impl FormatError {
    /// Wrap an I/O error with what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        FormatError::Io {
            context: context.into(),
            error: source,
        }
    }

    /// True when the input itself is bad (corrupt or hostile), false for I/O failures and
    /// caller mistakes (options, lookups).
    pub fn is_malicious(&self) -> bool {
        !matches!(
            self,
            FormatError::Io { .. }
                | FormatError::InvalidOption { .. }
                | FormatError::NoSuchEntry { .. }
                | FormatError::NotAFile { .. }
        )
    }
}
