//! Ejection with backoff: what one peer request's outcome does to the peer's standing. Pure;
//! time is passed in (a `Duration` since the client started).
//!
//! A peer that fails (connection refused, reset, a 5xx other than "busy"), is slow (no answer
//! within the hedge delay) or lies (a frame that fails verification) is ejected: no request is
//! sent to it until `base * 2^(failures-1)` (at most `max`) has passed; a lie counts as
//! [`CORRUPT_WEIGHT`] failures at once. While ejected it owns nothing (rendezvous hashing runs
//! over the live members, so its frames go to their runner-up). The first success after an
//! ejection forgives every failure. "Busy" (503: the peer's serving limits are full) bypasses
//! the peer for this request only.

use std::time::Duration;

/// Failures one corrupt frame counts as (a lying peer stays out longer).
pub const CORRUPT_WEIGHT: u32 = 4;

/// How long ejections last.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EjectPolicy {
    pub base: Duration,
    pub max: Duration,
}

/// What one request to a peer came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    /// Transport error or a failure status.
    Failed,
    /// No answer within the hedge delay.
    Slow,
    /// A frame that failed verification.
    Corrupt,
    /// The peer's limits were full (503).
    Busy,
}

/// One peer's standing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Health {
    /// Failures since the last success.
    pub failures: u32,
    /// Ejected until then (time since the client started).
    pub ejected_until: Option<Duration>,
    /// Ejections so far.
    pub ejections: u64,
}

impl Health {
    /// May requests be sent to the peer at `now`?
    pub fn is_live(&self, now: Duration) -> bool {
        self.ejected_until.is_none_or(|t| now >= t)
    }

    /// The standing after `outcome` at `now`.
    pub fn after(self, outcome: Outcome, now: Duration, p: &EjectPolicy) -> Health {
        let weight = match outcome {
            Outcome::Ok => {
                return Health {
                    failures: 0,
                    ejected_until: None,
                    ejections: self.ejections,
                }
            }
            Outcome::Busy => return self,
            Outcome::Failed | Outcome::Slow => 1,
            Outcome::Corrupt => CORRUPT_WEIGHT,
        };
        let failures = self.failures.saturating_add(weight);
        Health {
            failures,
            ejected_until: Some(now + backoff(failures, p)),
            ejections: self.ejections + 1,
        }
    }
}

/// Ejection after `failures` failures in a row: `base * 2^(failures-1)`, at most `max`.
pub fn backoff(failures: u32, p: &EjectPolicy) -> Duration {
    let shift = failures.saturating_sub(1).min(20);
    p.base.saturating_mul(1u32 << shift).min(p.max)
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: EjectPolicy = EjectPolicy {
        base: Duration::from_secs(1),
        max: Duration::from_secs(60),
    };
    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn failures_eject_with_doubling_backoff_capped() {
        let h = Health::default();
        assert!(h.is_live(s(0)));
        let h = h.after(Outcome::Failed, s(10), &P);
        assert_eq!(h.ejected_until, Some(s(11)));
        assert!(!h.is_live(s(10)) && h.is_live(s(11)));
        let h = h.after(Outcome::Slow, s(11), &P);
        assert_eq!(h.ejected_until, Some(s(13)));
        let h = h.after(Outcome::Failed, s(13), &P);
        assert_eq!(h.ejected_until, Some(s(17)));
        assert_eq!(h.ejections, 3);
        let mut h = h;
        for _ in 0..40 {
            h = h.after(Outcome::Failed, s(100), &P);
        }
        assert_eq!(h.ejected_until, Some(s(160)), "capped at max");
    }

    #[test]
    fn success_forgives_busy_changes_nothing_corrupt_weighs_more() {
        let h = Health::default().after(Outcome::Failed, s(0), &P);
        let h = h.after(Outcome::Ok, s(5), &P);
        assert_eq!((h.failures, h.ejected_until, h.ejections), (0, None, 1));
        assert_eq!(h.after(Outcome::Busy, s(6), &P), h);
        let c = h.after(Outcome::Corrupt, s(6), &P);
        assert_eq!(c.failures, CORRUPT_WEIGHT);
        assert_eq!(c.ejected_until, Some(s(6 + 8)));
    }

    #[test]
    fn backoff_never_overflows() {
        assert_eq!(backoff(0, &P), s(1));
        assert_eq!(backoff(u32::MAX, &P), s(60));
    }
}
