//! Retry policy: which failures are retried and how long to wait (pure functions).
//!
//! Retried, for idempotent requests only: HTTP 5xx except 501/505, HTTP 429 (honouring
//! `Retry-After` up to the maximum delay) and transport failures (connect errors, resets,
//! timeouts). Never retried: other 4xx; a 401 is handled once by the auth layer instead.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Exponential backoff settings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryPolicy {
    /// Attempts after the first one (default 4; 0 disables retries).
    pub max_retries: u32,
    /// Delay before the first retry in milliseconds (default 200).
    pub base_delay_ms: u64,
    /// Upper bound of any delay in milliseconds (default 5000).
    pub max_delay_ms: u64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_retries: 4,
            base_delay_ms: 200,
            max_delay_ms: 5000,
        }
    }
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
    let max = Duration::from_millis(policy.max_delay_ms);
    if let Outcome::Status {
        retry_after: Some(after),
        ..
    } = outcome
    {
        return Some(after.min(max));
    }
    let exp = policy.base_delay_ms.saturating_mul(1u64 << retry.min(30));
    let delay = exp.min(policy.max_delay_ms);
    let jitter = jitter.clamp(0.0, 1.0);
    let jittered = (delay as f64) * (0.5 + jitter / 2.0);
    Some(Duration::from_millis(jittered as u64).min(max))
}

/// Parse a `Retry-After` header in its delay-seconds form (the HTTP-date form is ignored).
pub fn parse_retry_after(value: &str) -> Option<Duration> {
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

/// A jitter value in `[0, 1)` from the process's random hasher keys (no RNG dependency).
pub(crate) fn random_jitter() -> f64 {
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
}
