//! [`RangeSource`]: the one async random-access source of a blob. The fetch path (snapshotter
//! frames, fill, prefetch), [`crate::Client::get_blob_range`] and the synchronous
//! [`crate::range_reader::SyncRangeReader`] (converter verify/inspect/prefetch) all read
//! through it.
//!
//! An implementation writes one method, [`RangeSource::try_read`]: a single attempt (for a
//! registry, exactly one ranged GET) that fails with a [`SourceError`] carrying its
//! [`ErrorKind`]. The provided [`RangeSource::read`] / [`RangeSource::read_with`] does, once
//! per read: the per-attempt timeout, the retry budget ([`crate::retry::next_step`] on the
//! kind: backoff for retryable errors with `Retry-After` honoured, one auth refresh, one
//! integrity refetch bypassing caches, none for terminal errors), the length check (other
//! than `len` bytes is an integrity error), optional verification of the bytes ([`Verify`])
//! and one [`ReadReport`] to the caller's [`ReadObserver`] (metrics).
//! Nothing below it retries a range read (the client sends range GETs as single attempts),
//! nothing above it either.
//!
//! [`RegistryRangeSource`] is the implementation over [`Client`] (blob `digest` in
//! `reference`'s repository; mirrors, redirects and token handling are the client's).

use crate::client::Client;
use crate::error::{RegistryError, SourceError};
use crate::reference::Reference;
use crate::retry::{next_step, random_jitter, ErrorKind, ReadState, RetryPolicy, Step};
use async_trait::async_trait;
use bytes::Bytes;
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use weenv_format::Digest;

/// `len` bytes at `offset` of a blob.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ByteRange {
    pub offset: u64,
    pub len: u64,
}

impl ByteRange {
    /// `len` bytes at `offset`.
    pub fn new(offset: u64, len: u64) -> Self {
        ByteRange { offset, len }
    }
}

impl std::fmt::Display for ByteRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} bytes at offset {}", self.len, self.offset)
    }
}

/// How [`RangeSource::try_read`] is to make this attempt.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Attempt {
    /// 1 for the first attempt of a read.
    pub number: u32,
    /// Bypass every cache on the way (origin before mirrors, `Cache-Control: no-cache`): the
    /// refetch after bytes failed verification, and any attempt after it.
    pub fresh: bool,
}

/// Errors the provided read makes itself (the source's own errors pass through unchanged).
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{source_name}: {range}: the bytes failed verification: {reason}")]
    Verification {
        source_name: String,
        range: ByteRange,
        reason: String,
    },
    #[error("{source_name}: {range}: the source returned {actual} bytes")]
    ShortRead {
        source_name: String,
        range: ByteRange,
        actual: u64,
    },
    #[error("{source_name}: {range}: attempt timed out after {after:?}")]
    Timeout {
        source_name: String,
        range: ByteRange,
        after: Duration,
    },
}

/// Checks the bytes of an attempt; a failure is an [`ErrorKind::Integrity`] error of that
/// attempt (refetched once, fresh).
#[async_trait]
pub trait Verify: Send + Sync {
    /// `Ok` if `bytes` (of `range`) are good, else why not.
    async fn verify(&self, range: ByteRange, bytes: &Bytes) -> Result<(), String>;
}

/// What one read cost, reported once per read (not per attempt).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadReport {
    pub range: ByteRange,
    /// Attempts made (requests sent, for a registry).
    pub attempts: u32,
    /// From the first attempt to the result, backoffs included.
    pub latency: Duration,
    /// Bytes returned (0 when the read failed).
    pub bytes: u64,
    /// The kind of the error the read failed with, `None` on success.
    pub error: Option<ErrorKind>,
    /// Attempts whose bytes failed [`Verify`].
    pub integrity_failures: u32,
}

/// Receives one [`ReadReport`] per read (the snapshotter's metrics implement it).
pub trait ReadObserver: Send + Sync {
    fn on_read(&self, report: &ReadReport);
}

/// Where a registry blob lives: what another node needs to fetch the same bytes (the peer
/// cache asks a peer node to fetch frames of this blob on its behalf).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlobLocator {
    /// The repository (registry host and path; a tag or digest in it is ignored).
    pub reference: Reference,
    /// The blob.
    pub digest: Digest,
    /// Its size in bytes.
    pub size: u64,
}

/// Options of one [`RangeSource::read_with`].
#[derive(Clone, Copy, Default)]
pub struct ReadOpts<'a> {
    /// Check each attempt's bytes.
    pub verify: Option<&'a dyn Verify>,
    /// Told once what the read cost.
    pub observer: Option<&'a dyn ReadObserver>,
}

/// Random read access to one immutable blob, with one retry budget per read.
#[async_trait]
pub trait RangeSource: Send + Sync {
    /// One attempt at exactly `range.len` bytes at `range.offset` (an error if the blob is
    /// shorter); no retries inside.
    async fn try_read(&self, range: ByteRange, attempt: Attempt) -> Result<Bytes, SourceError>;

    /// Blob size in bytes, if known without a request.
    fn size(&self) -> Option<u64>;

    /// Blob size in bytes, asking the backend if needed. Default: [`RangeSource::size`].
    async fn resolve_size(&self) -> Result<u64, SourceError> {
        self.size().ok_or_else(|| {
            SourceError::new(
                ErrorKind::Terminal,
                format!("{}: size unknown", self.name()),
            )
        })
    }

    /// Human-readable name for errors and logs (e.g. `registry/repo@sha256:..`).
    fn name(&self) -> String {
        "blob".to_string()
    }

    /// Where the blob lives in a registry, if it does and its size is known (other nodes can
    /// then fetch the same bytes). Default: `None` (a local or private source).
    fn locator(&self) -> Option<BlobLocator> {
        None
    }

    /// The retry policy of this source's reads. Default: [`RetryPolicy::default`].
    fn policy(&self) -> RetryPolicy {
        RetryPolicy::default()
    }

    /// Refresh credentials after an [`ErrorKind::Auth`] error; `true` if another attempt may
    /// now succeed. Called at most once per read. Default: `false` (no credentials).
    async fn refresh_auth(&self) -> bool {
        false
    }

    /// Told before each backoff after a retryable error (counters). Default: nothing.
    fn note_retry(&self, _kind: ErrorKind) {}

    /// `range` with this source's retry budget.
    async fn read(&self, range: ByteRange) -> Result<Bytes, SourceError> {
        self.read_with(range, ReadOpts::default()).await
    }

    /// `range` with this source's retry budget, each attempt's bytes checked by
    /// `opts.verify`, one report to `opts.observer`.
    async fn read_with(&self, range: ByteRange, opts: ReadOpts<'_>) -> Result<Bytes, SourceError> {
        let policy = self.policy();
        let t0 = Instant::now();
        let mut state = ReadState::default();
        let mut fresh = false;
        let mut integrity_failures = 0;
        let result = loop {
            state.attempts += 1;
            let attempt = Attempt {
                number: state.attempts,
                fresh,
            };
            let res = match policy.attempt_timeout_ms {
                0 => self.try_read(range, attempt).await,
                ms => {
                    let after = Duration::from_millis(ms);
                    match tokio::time::timeout(after, self.try_read(range, attempt)).await {
                        Ok(r) => r,
                        Err(_) => Err(SourceError::new(
                            ErrorKind::Retryable,
                            ReadError::Timeout {
                                source_name: self.name(),
                                range,
                                after,
                            },
                        )),
                    }
                }
            };
            let res = match (res, opts.verify) {
                (Ok(b), _) if b.len() as u64 != range.len => Err(SourceError::new(
                    ErrorKind::Integrity,
                    ReadError::ShortRead {
                        source_name: self.name(),
                        range,
                        actual: b.len() as u64,
                    },
                )),
                (Ok(b), Some(v)) => match v.verify(range, &b).await {
                    Ok(()) => Ok(b),
                    Err(reason) => {
                        integrity_failures += 1;
                        Err(SourceError::new(
                            ErrorKind::Integrity,
                            ReadError::Verification {
                                source_name: self.name(),
                                range,
                                reason,
                            },
                        ))
                    }
                },
                (res, _) => res,
            };
            let err = match res {
                Ok(b) => break Ok(b),
                Err(e) => e,
            };
            match next_step(
                &policy,
                state,
                err.kind(),
                err.retry_after(),
                random_jitter(),
            ) {
                Step::GiveUp => break Err(err),
                Step::Retry(delay) => {
                    tracing::debug!(source = %self.name(), %range, error = %err, ?delay, attempt = state.attempts, "range read failed; retrying");
                    state.retries += 1;
                    self.note_retry(err.kind());
                    tokio::time::sleep(delay).await;
                }
                Step::RefreshAuth => {
                    state.auth_refreshed = true;
                    if !self.refresh_auth().await {
                        break Err(err);
                    }
                }
                Step::Refetch => {
                    tracing::debug!(source = %self.name(), %range, error = %err, "refetching bypassing caches");
                    state.refetched = true;
                    fresh = true;
                }
            }
        };
        if let Some(o) = opts.observer {
            o.on_read(&ReadReport {
                range,
                attempts: state.attempts,
                latency: t0.elapsed(),
                bytes: result.as_ref().map_or(0, |b| b.len() as u64),
                error: result.as_ref().err().map(SourceError::kind),
                integrity_failures,
            });
        }
        result
    }
}

/// Blob `digest` in `reference`'s repository, one ranged GET per attempt
/// ([`Client::try_get_blob_range`]). Bytes are not verified here: pass a [`Verify`] (the
/// snapshotter verifies every frame against the TOC).
#[derive(Debug)]
pub struct RegistryRangeSource {
    client: Client,
    reference: Reference,
    digest: Digest,
    size: OnceLock<u64>,
}

impl RegistryRangeSource {
    /// Blob `digest` of `size` bytes (from the descriptor; `None`: one HEAD when asked).
    pub fn new(client: Client, reference: Reference, digest: Digest, size: Option<u64>) -> Self {
        let s = OnceLock::new();
        if let Some(n) = size {
            let _ = s.set(n);
        }
        RegistryRangeSource {
            client,
            reference,
            digest,
            size: s,
        }
    }

    /// The blob digest.
    pub fn digest(&self) -> &Digest {
        &self.digest
    }

    /// Use a known size so [`RangeSource::resolve_size`] sends no HEAD.
    pub(crate) fn set_size(&self, size: u64) {
        let _ = self.size.set(size);
    }
}

#[async_trait]
impl RangeSource for RegistryRangeSource {
    async fn try_read(&self, range: ByteRange, attempt: Attempt) -> Result<Bytes, SourceError> {
        self.client
            .try_get_blob_range(
                &self.reference,
                &self.digest,
                range.offset,
                range.len,
                attempt.fresh,
            )
            .await
            .map_err(SourceError::from)
    }

    fn size(&self) -> Option<u64> {
        self.size.get().copied()
    }

    /// One HEAD (with the client's own retries), cached.
    async fn resolve_size(&self) -> Result<u64, SourceError> {
        if let Some(s) = self.size.get() {
            return Ok(*s);
        }
        match self.client.head_blob(&self.reference, &self.digest).await {
            Ok(Some(s)) => {
                let _ = self.size.set(s);
                Ok(s)
            }
            Ok(None) => Err(RegistryError::NotFound {
                reference: format!("{} blob {}", self.reference, self.digest),
                url: String::new(),
            }
            .into()),
            Err(e) => Err(e.into()),
        }
    }

    fn name(&self) -> String {
        format!("{}@{}", self.reference, self.digest)
    }

    fn locator(&self) -> Option<BlobLocator> {
        Some(BlobLocator {
            reference: self.reference.clone(),
            digest: self.digest.clone(),
            size: *self.size.get()?,
        })
    }

    fn policy(&self) -> RetryPolicy {
        self.client.config().retry.clone()
    }

    /// The failed attempt's 401 already recorded the registry's challenge and dropped the
    /// rejected token; the next attempt fetches a new one.
    async fn refresh_auth(&self) -> bool {
        self.client.stats_ref().count_auth_retry();
        true
    }

    fn note_retry(&self, _kind: ErrorKind) {
        self.client.stats_ref().count_retry();
    }
}

impl SourceError {
    /// Back to a [`RegistryError`] (the provided read's own errors become `Io`).
    pub fn into_registry_error(self) -> RegistryError {
        let kind = self.io_kind();
        match self.into_error().downcast::<RegistryError>() {
            Ok(e) => *e,
            Err(e) => RegistryError::Io {
                context: "reading a blob range".into(),
                error: std::io::Error::new(kind, e),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    //! The retry policy, proved with a scripted source (paused tokio time: no real sleeps).
    use super::*;
    use std::collections::VecDeque;
    use std::sync::Mutex;

    /// Fails with the scripted errors in order, then serves zeros; logs every attempt.
    struct Scripted {
        script: Mutex<VecDeque<(ErrorKind, Option<Duration>)>>,
        attempts: Mutex<Vec<Attempt>>,
        refreshes: Mutex<u32>,
        can_refresh: bool,
    }

    impl Scripted {
        fn new(script: &[(ErrorKind, Option<Duration>)]) -> Self {
            Scripted {
                script: Mutex::new(script.iter().copied().collect()),
                attempts: Mutex::new(Vec::new()),
                refreshes: Mutex::new(0),
                can_refresh: true,
            }
        }
        fn failing(kind: ErrorKind) -> Self {
            Self::new(&[(kind, None); 20])
        }
        fn attempts(&self) -> usize {
            self.attempts.lock().unwrap().len()
        }
    }

    #[async_trait]
    impl RangeSource for Scripted {
        async fn try_read(&self, range: ByteRange, attempt: Attempt) -> Result<Bytes, SourceError> {
            self.attempts.lock().unwrap().push(attempt);
            match self.script.lock().unwrap().pop_front() {
                Some((kind, after)) => {
                    Err(SourceError::new(kind, format!("scripted {kind}")).with_retry_after(after))
                }
                None => Ok(Bytes::from(vec![0u8; range.len as usize])),
            }
        }
        fn size(&self) -> Option<u64> {
            Some(1 << 20)
        }
        fn policy(&self) -> RetryPolicy {
            RetryPolicy::default()
        }
        async fn refresh_auth(&self) -> bool {
            *self.refreshes.lock().unwrap() += 1;
            self.can_refresh
        }
    }

    const R: ByteRange = ByteRange { offset: 10, len: 4 };

    #[tokio::test(start_paused = true)]
    async fn each_kind_gets_its_documented_number_of_attempts() {
        let max = RetryPolicy::default().max_retries as usize;
        for (kind, want) in [
            (ErrorKind::Retryable, 1 + max),
            (ErrorKind::Auth, 2),
            (ErrorKind::Terminal, 1),
            (ErrorKind::Integrity, 2),
        ] {
            let s = Scripted::failing(kind);
            let e = s.read(R).await.unwrap_err();
            assert_eq!(e.kind(), kind);
            assert_eq!(s.attempts(), want, "{kind}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_404_is_tried_once() {
        let s = Scripted::new(&[]);
        // a real 404 from the client is Terminal
        let not_found = RegistryError::NotFound {
            reference: "r".into(),
            url: "u".into(),
        };
        assert_eq!(SourceError::from(not_found).kind(), ErrorKind::Terminal);
        s.script
            .lock()
            .unwrap()
            .push_back((ErrorKind::Terminal, None));
        let t0 = tokio::time::Instant::now();
        assert!(s.read(R).await.is_err());
        assert_eq!(s.attempts(), 1);
        assert_eq!(t0.elapsed(), Duration::ZERO, "no backoff before giving up");
    }

    #[tokio::test(start_paused = true)]
    async fn auth_refreshes_once_then_stops() {
        let s = Scripted::failing(ErrorKind::Auth);
        assert_eq!(s.read(R).await.unwrap_err().kind(), ErrorKind::Auth);
        assert_eq!((s.attempts(), *s.refreshes.lock().unwrap()), (2, 1));
        // one refresh that helps: the read succeeds on the second attempt
        let s = Scripted::new(&[(ErrorKind::Auth, None)]);
        assert_eq!(s.read(R).await.unwrap().len(), 4);
        assert_eq!((s.attempts(), *s.refreshes.lock().unwrap()), (2, 1));
        // a source that cannot refresh: one attempt
        let mut s = Scripted::failing(ErrorKind::Auth);
        s.can_refresh = false;
        assert!(s.read(R).await.is_err());
        assert_eq!((s.attempts(), *s.refreshes.lock().unwrap()), (1, 1));
    }

    struct BadBytes(Mutex<u32>);

    #[async_trait]
    impl Verify for BadBytes {
        async fn verify(&self, _: ByteRange, _: &Bytes) -> Result<(), String> {
            let mut left = self.0.lock().unwrap();
            if *left == 0 {
                return Ok(());
            }
            *left -= 1;
            Err("digest mismatch".into())
        }
    }

    #[derive(Default)]
    struct Reports(Mutex<Vec<ReadReport>>);

    impl ReadObserver for Reports {
        fn on_read(&self, r: &ReadReport) {
            self.0.lock().unwrap().push(r.clone());
        }
    }

    #[tokio::test(start_paused = true)]
    async fn integrity_refetches_once_fresh_then_fails() {
        let s = Scripted::new(&[]);
        let (bad, reports) = (BadBytes(Mutex::new(5)), Reports::default());
        let opts = ReadOpts {
            verify: Some(&bad),
            observer: Some(&reports),
        };
        let e = s.read_with(R, opts).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Integrity);
        assert!(e.to_string().contains("digest mismatch"), "{e}");
        let fresh: Vec<bool> = s.attempts.lock().unwrap().iter().map(|a| a.fresh).collect();
        assert_eq!(fresh, [false, true], "one refetch, bypassing caches");
        // bad once: the refetch is served
        let s = Scripted::new(&[]);
        let bad = BadBytes(Mutex::new(1));
        let opts = ReadOpts {
            verify: Some(&bad),
            observer: Some(&reports),
        };
        assert_eq!(s.read_with(R, opts).await.unwrap().len(), 4);
        assert_eq!(s.attempts(), 2);
        // one report per read, not per attempt
        let r = reports.0.lock().unwrap().clone();
        assert_eq!(r.len(), 2);
        assert_eq!(
            (
                r[0].attempts,
                r[0].error,
                r[0].bytes,
                r[0].integrity_failures
            ),
            (2, Some(ErrorKind::Integrity), 0, 2)
        );
        assert_eq!(
            (
                r[1].attempts,
                r[1].error,
                r[1].bytes,
                r[1].integrity_failures
            ),
            (2, None, 4, 1)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn retry_after_is_honoured_and_backoff_is_bounded() {
        let s = Scripted::new(&[(ErrorKind::Retryable, Some(Duration::from_secs(3)))]);
        let t0 = tokio::time::Instant::now();
        s.read(R).await.unwrap();
        assert_eq!(s.attempts(), 2);
        assert_eq!(
            t0.elapsed(),
            Duration::from_secs(3),
            "waited exactly Retry-After"
        );
        // always failing: 4 jittered backoffs, each in [d/2, d] of 200, 400, 800, 1600 ms
        let s = Scripted::failing(ErrorKind::Retryable);
        let t0 = tokio::time::Instant::now();
        assert!(s.read(R).await.is_err());
        let waited = t0.elapsed();
        assert!(
            waited >= Duration::from_millis(1500) && waited <= Duration::from_millis(3000),
            "{waited:?}"
        );
        // mixed: retryable, auth, integrity, retryable all in one read, within one budget
        let s = Scripted::new(&[
            (ErrorKind::Retryable, None),
            (ErrorKind::Auth, None),
            (ErrorKind::Integrity, None),
            (ErrorKind::Auth, None),
        ]);
        assert_eq!(s.read(R).await.unwrap_err().kind(), ErrorKind::Auth);
        assert_eq!(s.attempts(), 4, "the second auth error is terminal");
    }

    #[tokio::test(start_paused = true)]
    async fn a_hanging_attempt_times_out_and_is_retried() {
        struct Hang(Mutex<u32>);
        #[async_trait]
        impl RangeSource for Hang {
            async fn try_read(&self, r: ByteRange, _: Attempt) -> Result<Bytes, SourceError> {
                let n = {
                    let mut n = self.0.lock().unwrap();
                    *n += 1;
                    *n
                };
                if n == 1 {
                    std::future::pending::<()>().await;
                }
                Ok(Bytes::from(vec![1u8; r.len as usize]))
            }
            fn size(&self) -> Option<u64> {
                None
            }
        }
        let h = Hang(Mutex::new(0));
        let t0 = tokio::time::Instant::now();
        assert_eq!(h.read(R).await.unwrap().len(), 4);
        assert_eq!(*h.0.lock().unwrap(), 2);
        let timeout = Duration::from_millis(RetryPolicy::default().attempt_timeout_ms);
        assert!(t0.elapsed() >= timeout);
        assert_eq!(
            h.resolve_size().await.unwrap_err().kind(),
            ErrorKind::Terminal
        );
    }

    #[test]
    fn registry_errors_have_kinds() {
        let st = |status, retry_after| RegistryError::Status {
            method: "GET".into(),
            url: "u".into(),
            status,
            body: String::new(),
            hint: "",
            retry_after,
        };
        for s in [500, 502, 503, 504, 429] {
            assert_eq!(st(s, None).kind(), ErrorKind::Retryable, "{s}");
        }
        for s in [400, 403, 405, 501, 505] {
            assert_eq!(st(s, None).kind(), ErrorKind::Terminal, "{s}");
        }
        let e = SourceError::from(st(429, Some(Duration::from_secs(2))));
        assert_eq!(e.retry_after(), Some(Duration::from_secs(2)));
        let unauth = |renewable| RegistryError::Unauthorized {
            method: "GET".into(),
            url: "u".into(),
            host: "h".into(),
            detail: String::new(),
            renewable,
        };
        assert_eq!(unauth(true).kind(), ErrorKind::Auth);
        assert_eq!(unauth(false).kind(), ErrorKind::Terminal);
        let range = RegistryError::BadRange {
            digest: "d".into(),
            offset: 0,
            len: 1,
            detail: "range not satisfiable".into(),
        };
        assert_eq!(range.kind(), ErrorKind::Terminal);
        let mismatch = RegistryError::DigestMismatch {
            what: "blob",
            url: "u".into(),
            expected: "a".into(),
            actual: "b".into(),
        };
        assert_eq!(mismatch.kind(), ErrorKind::Integrity);
    }
}
