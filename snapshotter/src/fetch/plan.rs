//! Coalescing frame misses into range requests (pure), with the snapshotter's limits.
//!
//! Frames sit back to back in the blob. Misses are merged into one request while the hole
//! between them is at most `max_gap` bytes (fetching a small hole is cheaper than a round trip)
//! and the request stays within `max_request` bytes (so one slow request does not hold up
//! everything, and memory stays bounded). A single frame larger than `max_request` is still one
//! request. The coalescing itself is `weenv_format::fetch::plan_frames`.

use weenv_format::fetch::{plan_frames, FetchRange};
use weenv_format::{Frame, FrameIdx};

/// Limits of [`plan_fetch`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanLimits {
    /// Largest hole (bytes) bridged between two wanted frames.
    pub max_gap: u64,
    /// Largest request (bytes), unless a single frame is larger.
    pub max_request: u64,
}

impl Default for PlanLimits {
    fn default() -> Self {
        PlanLimits {
            max_gap: 256 << 10,
            max_request: 16 << 20,
        }
    }
}

/// One ranged read covering `frames` (in blob order): the format crate's [`FetchRange`].
pub type RangeRequest = FetchRange;

/// Plans the requests for `wanted` frames of `frames` with the format crate's coalescing
/// ([`weenv_format::fetch::plan_frames`]). Indices out of range are ignored (callers check them
/// first). Each request lists only the wanted frames: whole frames inside a bridged gap are
/// fetched but not verified or cached here.
pub fn plan_fetch(frames: &[Frame], wanted: &[FrameIdx], limits: PlanLimits) -> Vec<RangeRequest> {
    let mut want = wanted.to_vec();
    want.sort_unstable();
    let mut plan = plan_frames(frames, wanted, limits.max_gap, limits.max_request);
    for r in &mut plan {
        r.frames.retain(|f| want.binary_search(f).is_ok());
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use weenv_format::Digest;

    fn frames(lens: &[u64]) -> Vec<Frame> {
        let mut off = 0;
        lens.iter()
            .map(|l| {
                let f = Frame {
                    offset: off,
                    clen: *l,
                    ulen: *l * 2,
                    digest: Digest::sha256(&off.to_le_bytes()),
                };
                off += l;
                f
            })
            .collect()
    }

    #[test]
    fn adjacent_misses_become_one_request() {
        let fr = frames(&[100, 100, 100, 100]);
        let p = plan_fetch(
            &fr,
            &[FrameIdx(2), FrameIdx(0), FrameIdx(1)],
            PlanLimits {
                max_gap: 0,
                max_request: 1000,
            },
        );
        assert_eq!(
            p,
            vec![RangeRequest {
                offset: 0,
                len: 300,
                frames: vec![FrameIdx(0), FrameIdx(1), FrameIdx(2)]
            }]
        );
    }

    #[test]
    fn gaps_bridged_only_up_to_max_gap() {
        let fr = frames(&[100, 100, 100, 100, 100]);
        let w = [FrameIdx(0), FrameIdx(2), FrameIdx(4), FrameIdx(4)];
        let p = plan_fetch(
            &fr,
            &w,
            PlanLimits {
                max_gap: 100,
                max_request: 1000,
            },
        );
        assert_eq!(p.len(), 1);
        assert_eq!((p[0].offset, p[0].len), (0, 500));
        assert_eq!(p[0].frames, vec![FrameIdx(0), FrameIdx(2), FrameIdx(4)]);
        let p = plan_fetch(
            &fr,
            &w,
            PlanLimits {
                max_gap: 99,
                max_request: 1000,
            },
        );
        assert_eq!(p.len(), 3);
    }

    #[test]
    fn max_request_splits_but_big_frames_pass() {
        let fr = frames(&[100, 100, 500, 100]);
        let all: Vec<_> = (0..4).map(FrameIdx).collect();
        let p = plan_fetch(
            &fr,
            &all,
            PlanLimits {
                max_gap: 0,
                max_request: 250,
            },
        );
        let spans: Vec<_> = p.iter().map(|r| (r.offset, r.len)).collect();
        assert_eq!(spans, vec![(0, 200), (200, 500), (700, 100)]);
        assert!(plan_fetch(&fr, &[FrameIdx(9)], PlanLimits::default()).is_empty());
    }

    proptest::proptest! {
        #[test]
        fn plan_covers_each_wanted_frame_once(
            lens in proptest::collection::vec(1u64..500, 1..40),
            picks in proptest::collection::vec(0u32..40, 0..60),
            max_gap in 0u64..600,
            max_request in 1u64..2000,
        ) {
            let fr = frames(&lens);
            let plan = plan_fetch(&fr, &picks.iter().map(|p| FrameIdx(*p)).collect::<Vec<_>>(), PlanLimits { max_gap, max_request });
            let mut wanted: Vec<u32> = picks.iter().copied().filter(|p| (*p as usize) < fr.len()).collect();
            wanted.sort();
            wanted.dedup();
            let mut got: Vec<u32> = plan.iter().flat_map(|r| r.frames.iter().map(|f| f.0)).collect();
            got.sort();
            proptest::prop_assert_eq!(got, wanted);
            let mut prev_end = 0;
            for r in &plan {
                proptest::prop_assert!(r.offset >= prev_end, "sorted, disjoint");
                prev_end = r.offset + r.len;
                proptest::prop_assert!(r.len <= max_request || r.frames.len() == 1);
                for f in &r.frames {
                    let f = &fr[f.0 as usize];
                    proptest::prop_assert!(r.offset <= f.offset && f.offset + f.clen <= r.offset + r.len);
                }
            }
        }
    }
}
