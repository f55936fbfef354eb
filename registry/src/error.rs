//! `RegistryError`: every way talking to a registry can fail, with the URL, reference or digest
//! involved and a hint what to do about it.

use crate::retry::ErrorKind;
use std::time::Duration;
use thiserror::Error;

/// Errors of the registry client.
#[derive(Debug, Error)]
pub enum RegistryError {
    #[error("invalid image reference {input:?}: {reason} (expected [registry[:port]/]repo[:tag][@sha256:<hex>])")]
    BadReference { input: String, reason: String },

    #[error("invalid registry configuration: {field}: {reason}")]
    BadConfig { field: String, reason: String },

    #[error("cannot read registry configuration {path}: {error}")]
    ConfigIo { path: String, error: std::io::Error },

    #[error("{method} {url}: {} (hint: check that the registry is reachable; plain HTTP must be configured per host with plain_http = true)", causes(.error))]
    Transport {
        method: String,
        url: String,
        error: reqwest::Error,
    },

    #[error("{method} {url}: HTTP {status}: {body} ({hint})")]
    Status {
        method: String,
        url: String,
        status: u16,
        body: String,
        hint: &'static str,
        /// The response's `Retry-After` (delay-seconds form), if any.
        retry_after: Option<Duration>,
    },

    #[error("{method} {url}: unauthorized after fetching credentials: {detail} (hint: check the credentials for {host} in $DOCKER_CONFIG/config.json or ~/.docker/config.json)")]
    Unauthorized {
        method: String,
        url: String,
        host: String,
        detail: String,
        /// The 401 carried a challenge the client can answer with new credentials on the
        /// next attempt (single-attempt range reads leave that attempt to the caller).
        renewable: bool,
    },

    #[error("token request to {realm} failed: {detail} (hint: check the credentials for {host})")]
    Token {
        realm: String,
        host: String,
        detail: String,
    },

    #[error("credential lookup for {host} failed: {detail} (hint: fix config.json or the credential helper)")]
    Credentials { host: String, detail: String },

    #[error("{what} {url}: content digest mismatch: expected {expected}, got {actual} (the registry or a mirror served corrupt data; retry or report it)")]
    DigestMismatch {
        what: &'static str,
        url: String,
        expected: String,
        actual: String,
    },

    #[error("{url}: {detail}")]
    Protocol { url: String, detail: String },

    #[error("{url}: content of {size} bytes exceeds the limit of {limit} bytes")]
    TooLarge { url: String, size: u64, limit: u64 },

    #[error("manifest {reference}: {detail}")]
    BadManifest { reference: String, detail: String },

    #[error("{reference}: not found (HTTP 404 at {url})")]
    NotFound { reference: String, url: String },

    #[error("range {offset}+{len} of blob {digest}: {detail}")]
    BadRange {
        digest: String,
        offset: u64,
        len: u64,
        detail: String,
    },

    #[error("I/O error while {context}: {error}")]
    Io {
        context: String,
        error: std::io::Error,
    },
}

/// `e` and its causes, each said once (reqwest's own message leaves out the cause, e.g.
/// "Connection refused"). The causes are part of this crate's messages, not `source()`s, so
/// chain printers (anyhow's `{:#}`) do not repeat them.
pub fn causes(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut next = e.source();
    while let Some(c) = next {
        let t = c.to_string();
        if !msg.contains(&t) {
            msg.push_str(": ");
            msg.push_str(&t);
        }
        next = c.source();
    }
    msg
}

impl RegistryError {
    /// Hint for an unexpected HTTP status.
    pub(crate) fn hint_for(status: u16) -> &'static str {
        match status {
            400 => "the registry rejected the request; check the reference and media type",
            401 | 403 => "check credentials and repository permissions",
            404 => "check that the repository, tag or digest exists",
            405 => "the registry does not support this operation (e.g. push to a read-only mirror)",
            413 => "the registry rejected the size; use chunked upload or raise its limit",
            416 => "the requested range is outside the blob",
            429 => "rate limited by the registry; retry later or configure a mirror",
            500..=599 => "registry-side error; retried with backoff, retry later",
            _ => "unexpected response from the registry",
        }
    }

    /// The retry kind of this error (what a range read does about it).
    pub fn kind(&self) -> ErrorKind {
        match self {
            RegistryError::Transport { error, .. } => {
                if is_retryable_transport(error) {
                    ErrorKind::Retryable
                } else {
                    ErrorKind::Terminal
                }
            }
            RegistryError::Status { status, .. } => match status {
                429 => ErrorKind::Retryable,
                501 | 505 => ErrorKind::Terminal,
                500..=599 => ErrorKind::Retryable,
                _ => ErrorKind::Terminal,
            },
            RegistryError::Unauthorized { renewable, .. } => {
                if *renewable {
                    ErrorKind::Auth
                } else {
                    ErrorKind::Terminal
                }
            }
            RegistryError::Token { .. } => ErrorKind::Auth,
            RegistryError::DigestMismatch { .. } => ErrorKind::Integrity,
            RegistryError::BadReference { .. }
            | RegistryError::BadConfig { .. }
            | RegistryError::ConfigIo { .. }
            | RegistryError::Credentials { .. }
            | RegistryError::Protocol { .. }
            | RegistryError::TooLarge { .. }
            | RegistryError::BadManifest { .. }
            | RegistryError::NotFound { .. }
            | RegistryError::BadRange { .. }
            | RegistryError::Io { .. } => ErrorKind::Terminal,
        }
    }

    /// The server's `Retry-After`, if the error carries one.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            RegistryError::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// HTTP status carried by the error, if any.
    pub fn status(&self) -> Option<u16> {
        match self {
            RegistryError::Status { status, .. } => Some(*status),
            RegistryError::NotFound { .. } => Some(404),
            _ => None,
        }
    }
}

/// Transport failures worth another attempt: connect errors, timeouts, broken requests or
/// bodies (resets).
pub(crate) fn is_retryable_transport(e: &reqwest::Error) -> bool {
    e.is_connect() || e.is_timeout() || e.is_request() || e.is_body()
}

/// The error of one failed attempt of a range read: its [`ErrorKind`] (the only thing the
/// retry decision looks at), the server's `Retry-After` if any, and the error itself.
#[derive(Debug, Error)]
#[error("{error}")]
pub struct SourceError {
    kind: ErrorKind,
    retry_after: Option<Duration>,
    error: Box<dyn std::error::Error + Send + Sync>,
}

impl SourceError {
    /// An error of `kind`.
    pub fn new(
        kind: ErrorKind,
        error: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        SourceError {
            kind,
            retry_after: None,
            error: error.into(),
        }
    }

    /// With a server-requested delay before the next attempt.
    pub fn with_retry_after(mut self, after: Option<Duration>) -> Self {
        self.retry_after = after;
        self
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The server's `Retry-After`, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// The underlying error (e.g. a [`RegistryError`]).
    pub fn error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.error
    }

    /// The underlying error, owned.
    pub fn into_error(self) -> Box<dyn std::error::Error + Send + Sync> {
        self.error
    }

    /// The underlying error as a [`RegistryError`], if it is one.
    pub fn registry_error(&self) -> Option<&RegistryError> {
        self.error.downcast_ref()
    }

    /// The `std::io::ErrorKind` a synchronous reader reports for this error.
    pub fn io_kind(&self) -> std::io::ErrorKind {
        match self.registry_error() {
            Some(RegistryError::NotFound { .. }) => std::io::ErrorKind::NotFound,
            Some(RegistryError::BadRange { .. }) => std::io::ErrorKind::UnexpectedEof,
            _ if self.kind == ErrorKind::Integrity => std::io::ErrorKind::InvalidData,
            _ => match self.error.downcast_ref::<std::io::Error>() {
                Some(e) => e.kind(),
                None => std::io::ErrorKind::Other,
            },
        }
    }
}

impl From<RegistryError> for SourceError {
    fn from(e: RegistryError) -> Self {
        let (kind, after) = (e.kind(), e.retry_after());
        SourceError::new(kind, e).with_retry_after(after)
    }
}

/// Result alias of this crate.
pub type Result<T, E = RegistryError> = std::result::Result<T, E>;
