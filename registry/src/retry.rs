//! Retry policy: which failures are retried and how long to wait (pure functions).
//!
//! Two users, one [`RetryPolicy`] (the `retry` section of [`crate::RegistryConfig`]):
//! - range reads ([`crate::RangeSource::read`]): one budget per read, decided by
//!   [`next_step`] on the [`ErrorKind`] of each failed attempt;
//! - the client's other requests (HEAD, manifests, whole blobs, uploads) retry inside the
//!   client per [`next_delay`].
//!
//! Retried, for idempotent requests only: HTTP 5xx except 501/505, HTTP 429 (honouring
//! `Retry-After` up to the maximum delay) and transport failures (connect errors, resets,
//! timeouts). Never retried: other 4xx; a 401 gets one token refresh instead.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Exponential backoff settings: the one place the retry numbers live.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryPolicy {
    /// Attempts after the first one after retryable errors (default 4; 0 disables retries).
    /// A range read adds at most one auth refresh and one integrity refetch to that
    /// ([`next_step`]).
    pub max_retries: u32,
    /// Delay before the first retry in milliseconds (default 200); doubles per retry,
    /// jittered into `[delay/2, delay)`.
    pub base_delay_ms: u64,
    /// Upper bound of any delay in milliseconds, `Retry-After` included (default 5000).
    pub max_delay_ms: u64,
    /// Longest one range-read attempt may take in milliseconds before it counts as a
    /// (retryable) timeout; 0 = no limit (default 300000: 16 MiB at ~0.5 Mbit/s).
    pub attempt_timeout_ms: u64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_retries: 4,
            base_delay_ms: 200,
            max_delay_ms: 5000,
            attempt_timeout_ms: 300_000,
        }
    }
}

/// What kind of failure one attempt of a range read ended with; the retry decision is made
/// on it alone ([`next_step`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// Worth another attempt after a backoff: connection refused/reset, timeout, broken body,
    /// HTTP 5xx (not 501/505), HTTP 429 (with its `Retry-After`).
    Retryable,
    /// The registry refused the credentials (HTTP 401, failed token request): one refresh of
    /// the token, one more attempt, then terminal.
    Auth,
    /// Retrying cannot help: 404, 416 range not satisfiable, 400, 403, a bad configuration.
    Terminal,
    /// The bytes arrived but failed verification: one refetch bypassing caches, then the
    /// caller gets the error (a FUSE read answers EIO).
    Integrity,
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ErrorKind::Retryable => "retryable",
            ErrorKind::Auth => "auth",
            ErrorKind::Terminal => "terminal",
            ErrorKind::Integrity => "integrity",
        })
    }
}

/// What a read has used of its budget so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadState {
    /// Attempts made, the failed one included.
    pub attempts: u32,
    /// Backoffs taken after retryable errors.
    pub retries: u32,
    /// The one token refresh was used.
    pub auth_refreshed: bool,
    /// The one integrity refetch was used.
    pub refetched: bool,
}

/// What a read does after a failed attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Sleep this long, then attempt again.
    Retry(Duration),
    /// Refresh the credentials once, then attempt again at once.
    RefreshAuth,
    /// Attempt again at once, bypassing caches on the way.
    Refetch,
    /// Return the error.
    GiveUp,
}

/// The retry decision of a range read (pure): after a failed attempt of `kind` in `state`,
/// what next? The budget of one read: up to `policy.max_retries` backoffs after retryable
/// errors ([`backoff`], or `retry_after` capped at `max_delay_ms`), one auth refresh and one
/// integrity refetch; terminal errors stop at once. So a read makes at most
/// `max_retries + 3` attempts (`max_retries + 1` if only retryable errors occur).
pub fn next_step(
    policy: &RetryPolicy,
    state: ReadState,
    kind: ErrorKind,
    retry_after: Option<Duration>,
    jitter: f64,
) -> Step {
    match kind {
        ErrorKind::Terminal => Step::GiveUp,
        ErrorKind::Auth if state.auth_refreshed => Step::GiveUp,
        ErrorKind::Auth => Step::RefreshAuth,
        ErrorKind::Integrity if state.refetched => Step::GiveUp,
        ErrorKind::Integrity => Step::Refetch,
        ErrorKind::Retryable if state.retries >= policy.max_retries => Step::GiveUp,
        ErrorKind::Retryable => Step::Retry(match retry_after {
            Some(after) => after.min(Duration::from_millis(policy.max_delay_ms)),
            None => backoff(policy, state.retries, jitter),
        }),
    }
}

/// Jittered exponential delay before retry number `retry` (0-based): `base * 2^retry` capped
/// at `max_delay_ms`, scaled by `jitter` in `[0, 1)` into `[delay/2, delay)`.
pub fn backoff(policy: &RetryPolicy, retry: u32, jitter: f64) -> Duration {
    let exp = policy.base_delay_ms.saturating_mul(1u64 << retry.min(30));
    let delay = exp.min(policy.max_delay_ms);
    let jitter = jitter.clamp(0.0, 1.0);
    let jittered = (delay as f64) * (0.5 + jitter / 2.0);
    Duration::from_millis(jittered as u64).min(Duration::from_millis(policy.max_delay_ms))
}

/// What happened on one attempt, as far as retrying is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// An HTTP response with this status; `retry_after` from the header, if any.
    Status {
        status: u16,
        retry_after: Option<Duration>,
    },
    /// Connection refused/reset, timeout, broken body.
    Transport,
}

/// Should this outcome be retried at all (ignoring attempt counts)?
pub fn is_retryable(outcome: Outcome) -> bool {
    match outcome {
        Outcome::Transport => true,
        Outcome::Status { status, .. } => {
            status == 429 || (500..=599).contains(&status) && status != 501 && status != 505
        }
    }
}

/// Delay before retry number `retry` (0-based), or `None` when the request must not be retried.
/// `jitter` in `[0, 1)` scales the exponential delay into `[delay/2, delay)` (full determinism
/// with a fixed jitter in tests).
pub fn next_delay(
    policy: &RetryPolicy,
    retry: u32,
    idempotent: bool,
    outcome: Outcome,
    jitter: f64,
) -> Option<Duration> {
    if !idempotent || retry >= policy.max_retries || !is_retryable(outcome) {
        return None;
    }
    if let Outcome::Status {
        retry_after: Some(after),
        ..
    } = outcome
    {
        return Some(after.min(Duration::from_millis(policy.max_delay_ms)));
    }
    Some(backoff(policy, retry, jitter))
}

/// Parse a `Retry-After` header in its delay-seconds form (the HTTP-date form is ignored).
pub fn parse_retry_after(value: &str) -> Option<Duration> {
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

/// A jitter value in `[0, 1)` from the process's random hasher keys (no RNG dependency).
pub fn random_jitter() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0x5eed);
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    const S500: Outcome = Outcome::Status {
        status: 500,
        retry_after: None,
    };

    #[test]
    fn exponential_schedule_is_capped() {
        let p = RetryPolicy {
            max_retries: 10,
            base_delay_ms: 100,
            max_delay_ms: 1000,
            ..RetryPolicy::default()
        };
        // jitter 1.0 gives the full delay
        let full: Vec<u64> = (0..6)
            .map(|i| next_delay(&p, i, true, S500, 1.0).unwrap().as_millis() as u64)
            .collect();
        assert_eq!(full, vec![100, 200, 400, 800, 1000, 1000]);
        // jitter 0.0 gives half of it
        let half: Vec<u64> = (0..6)
            .map(|i| {
                next_delay(&p, i, true, Outcome::Transport, 0.0)
                    .unwrap()
                    .as_millis() as u64
            })
            .collect();
        assert_eq!(half, vec![50, 100, 200, 400, 500, 500]);
        assert_eq!(next_delay(&p, 10, true, S500, 0.5), None);
        assert!(next_delay(&p, 40, true, S500, 0.5).is_none());
    }

    #[test]
    fn classification() {
        let st = |status| Outcome::Status {
            status,
            retry_after: None,
        };
        for s in [500, 502, 503, 504, 429] {
            assert!(is_retryable(st(s)), "{s}");
        }
        for s in [400, 401, 403, 404, 405, 408, 416, 501, 505, 200, 302] {
            assert!(!is_retryable(st(s)), "{s}");
        }
        assert!(is_retryable(Outcome::Transport));
        let p = RetryPolicy::default();
        assert_eq!(
            next_delay(&p, 0, false, S500, 0.5),
            None,
            "non-idempotent never retried"
        );
        assert_eq!(next_delay(&p, 0, true, st(404), 0.5), None);
    }

    #[test]
    fn retry_after_is_honoured_and_capped() {
        let p = RetryPolicy::default();
        let o = |s| Outcome::Status {
            status: 429,
            retry_after: Some(Duration::from_secs(s)),
        };
        assert_eq!(
            next_delay(&p, 0, true, o(2), 0.0),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            next_delay(&p, 0, true, o(600), 0.0),
            Some(Duration::from_millis(5000))
        );
        assert_eq!(parse_retry_after(" 7 "), Some(Duration::from_secs(7)));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
        let j = random_jitter();
        assert!((0.0..1.0).contains(&j));
    }

    #[test]
    fn one_budget_per_read() {
        let p = RetryPolicy::default();
        let st = |attempts, retries, auth_refreshed, refetched| ReadState {
            attempts,
            retries,
            auth_refreshed,
            refetched,
        };
        let s = |a| {
            next_step(
                &p,
                st(a, a - 1, false, false),
                ErrorKind::Retryable,
                None,
                1.0,
            )
        };
        assert_eq!(s(1), Step::Retry(Duration::from_millis(200)));
        assert_eq!(s(4), Step::Retry(Duration::from_millis(1600)));
        assert_eq!(s(5), Step::GiveUp, "max_retries backoffs");
        let ra = Some(Duration::from_secs(60));
        assert_eq!(
            next_step(&p, st(1, 0, false, false), ErrorKind::Retryable, ra, 0.0),
            Step::Retry(Duration::from_millis(5000)),
            "Retry-After capped at max_delay_ms"
        );
        let k = |kind, auth, refetched| next_step(&p, st(1, 0, auth, refetched), kind, None, 0.0);
        assert_eq!(k(ErrorKind::Terminal, false, false), Step::GiveUp);
        assert_eq!(k(ErrorKind::Auth, false, false), Step::RefreshAuth);
        assert_eq!(k(ErrorKind::Auth, true, false), Step::GiveUp);
        assert_eq!(k(ErrorKind::Integrity, false, false), Step::Refetch);
        assert_eq!(k(ErrorKind::Integrity, false, true), Step::GiveUp);
        let none = RetryPolicy {
            max_retries: 0,
            ..p
        };
        let kind = ErrorKind::Retryable;
        assert_eq!(
            next_step(&none, st(1, 0, false, false), kind, None, 0.0),
            Step::GiveUp
        );
        let kind = ErrorKind::Auth;
        assert_eq!(
            next_step(&none, st(1, 0, false, false), kind, None, 0.0),
            Step::RefreshAuth
        );
    }
}
