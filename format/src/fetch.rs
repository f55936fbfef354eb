//! Pure fetch planning: which blob byte ranges to request for a set of frames.
//!
//! [`plan_fetch`] sorts and de-duplicates the wanted frames and coalesces neighbours into one
//! range when the bytes between them are at most `max_gap` and the merged range stays within
//! `max_request` (a single frame larger than `max_request` still gets its own range). Because
//! frames tile the blob, a gap consists of whole frames; they are fetched anyway and listed in
//! the range's `frames` too, so callers can verify and cache them (filter against the wanted set
//! if they only want those).

use crate::toc::{Entry, Frame, FrameIdx, Toc};

/// One range request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchRange {
    /// Blob offset.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
    /// Every frame wholly inside the range, in blob order.
    pub frames: Vec<FrameIdx>,
}

/// Coalesce `frames` (any order, duplicates allowed; indices not in the TOC are ignored) into
/// range requests, in blob order.
pub fn plan_fetch(
    toc: &Toc,
    frames: &[FrameIdx],
    max_gap: u64,
    max_request: u64,
) -> Vec<FetchRange> {
    plan_frames(&toc.frames, frames, max_gap, max_request)
}

/// [`plan_fetch`] over a frame table (`frames` tile the blob in index order, as in a validated
/// TOC): for callers that hold the frames without the whole TOC.
pub fn plan_frames(
    table: &[Frame],
    frames: &[FrameIdx],
    max_gap: u64,
    max_request: u64,
) -> Vec<FetchRange> {
    let mut want: Vec<FrameIdx> = frames
        .iter()
        .copied()
        .filter(|i| (i.0 as usize) < table.len())
        .collect();
    want.sort_unstable();
    want.dedup();
    let mut out: Vec<FetchRange> = Vec::new();
    for idx in want {
        let f = &table[idx.0 as usize];
        let f_end = f.offset.saturating_add(f.clen);
        if let Some(cur) = out.last_mut() {
            let cur_end = cur.offset + cur.len;
            let last = cur.frames.last().map_or(0, |l| l.0);
            if f.offset >= cur_end
                && f.offset - cur_end <= max_gap
                && f_end - cur.offset <= max_request
            {
                cur.frames.extend((last + 1..=idx.0).map(FrameIdx));
                cur.len = f_end - cur.offset;
                continue;
            }
        }
        out.push(FetchRange {
            offset: f.offset,
            len: f_end - f.offset,
            frames: vec![idx],
        });
    }
    out
}

/// The frames holding `offset..offset+len` of `entry`, in order, without duplicates.
pub fn frames_for_range(entry: &Entry, offset: u64, len: u64) -> Vec<FrameIdx> {
    let mut v: Vec<FrameIdx> = Vec::new();
    for c in entry.chunks_in(offset, len) {
        if v.last() != Some(&c.frame) {
            v.push(c.frame);
        }
    }
    v
}

/// Frames holding payloads of the regular files directly inside directory `dir` (normal form,
/// `""` = root), sorted, without duplicates: the read-ahead set once a directory is touched.
/// O(entries); callers that do this often should precompute per directory.
pub fn frames_for_dir(toc: &Toc, dir: &str) -> Vec<FrameIdx> {
    let mut v: Vec<FrameIdx> = toc
        .entries
        .iter()
        .filter(|e| {
            let parent = e.path.rfind('/').map_or("", |p| &e.path[..p]);
            !e.path.is_empty() && parent == dir
        })
        .flat_map(|e| e.chunks.iter().map(|c| c.frame))
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::testdata::file_entry;
    use crate::toc::{ChunkRef, Frame};
    use crate::Digest;

    fn toc(clens: &[u64]) -> Toc {
        let mut t = Toc::new();
        let mut at = 0;
        for c in clens {
            t.frames.push(Frame {
                offset: at,
                clen: *c,
                ulen: 100,
                digest: Digest::sha256(b""),
            });
            at += c;
        }
        t
    }

    fn idx(v: &[u32]) -> Vec<FrameIdx> {
        v.iter().copied().map(FrameIdx).collect()
    }

    #[test]
    fn coalesces_adjacent_and_near() {
        let t = toc(&[10, 10, 10, 10, 10, 10]);
        // adjacent 0,1 merge; 3 is 10 bytes after 1 -> merged with gap 10 (frame 2 included)
        let p = plan_fetch(&t, &idx(&[3, 1, 0, 1]), 10, 1000);
        assert_eq!(p.len(), 1);
        assert_eq!((p[0].offset, p[0].len), (0, 40));
        assert_eq!(p[0].frames, idx(&[0, 1, 2, 3]));
        // gap too large -> two ranges
        let p = plan_fetch(&t, &idx(&[0, 3]), 5, 1000);
        assert_eq!(p.len(), 2);
        assert_eq!(
            (p[1].offset, p[1].len, p[1].frames.clone()),
            (30, 10, idx(&[3]))
        );
        // max_request splits
        let p = plan_fetch(&t, &idx(&[0, 1, 2, 3]), 0, 20);
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].frames, idx(&[0, 1]));
        assert_eq!(p[1].frames, idx(&[2, 3]));
        // out-of-range indices ignored; empty input -> empty plan
        assert!(plan_fetch(&t, &idx(&[99]), 0, 10).is_empty());
        assert!(plan_fetch(&t, &[], 0, 10).is_empty());
    }

    #[test]
    fn oversized_frame_gets_own_range() {
        let t = toc(&[10, 500, 10]);
        let p = plan_fetch(&t, &idx(&[0, 1, 2]), 0, 100);
        assert_eq!(p.len(), 3);
        assert_eq!(p[1].len, 500);
    }

    #[test]
    fn frames_for_directory() {
        let mut t = toc(&[10, 10, 10]);
        let f = |path: &str, frame: u32| {
            let chunk = ChunkRef {
                file_offset: 0,
                frame: FrameIdx(frame),
                frame_offset: 0,
                len: 1,
            };
            file_entry(path, 1, vec![chunk])
        };
        t.entries = vec![
            f("top", 0),
            f("d/a", 2),
            f("d/b", 1),
            f("d/e/deep", 0),
            f("d/c", 2),
        ];
        assert_eq!(frames_for_dir(&t, "d"), idx(&[1, 2]));
        assert_eq!(frames_for_dir(&t, ""), idx(&[0]));
        assert!(frames_for_dir(&t, "nope").is_empty());
    }

    #[test]
    fn frames_for_file_range() {
        let mut e = file_entry("f", 300, vec![]);
        for i in 0..3u32 {
            e.chunks.push(ChunkRef {
                file_offset: u64::from(i) * 100,
                frame: FrameIdx(i + 4),
                frame_offset: 0,
                len: 100,
            });
        }
        assert_eq!(frames_for_range(&e, 0, 300), idx(&[4, 5, 6]));
        assert_eq!(frames_for_range(&e, 150, 10), idx(&[5]));
        assert_eq!(frames_for_range(&e, 99, 2), idx(&[4, 5]));
        assert!(frames_for_range(&e, 300, 2).is_empty());
    }

    proptest::proptest! {
        /// Every wanted frame is fetched exactly once; ranges are in blob order, disjoint, made
        /// of whole contiguous frames, within max_request unless a single frame is larger, and
        /// gaps inside a range never exceed max_gap.
        #[test]
        fn plan_invariants(
            clens in proptest::collection::vec(1u64..5000, 1..60),
            want in proptest::collection::vec(0u32..70, 0..40),
            max_gap in 0u64..8000,
            max_request in 1u64..40000,
        ) {
            let t = toc(&clens);
            let wanted: Vec<FrameIdx> = want.iter().copied().map(FrameIdx).collect();
            let plan = plan_fetch(&t, &wanted, max_gap, max_request);
            let mut seen = std::collections::BTreeSet::new();
            let mut prev_end = 0;
            for r in &plan {
                proptest::prop_assert!(r.offset >= prev_end);
                prev_end = r.offset + r.len;
                proptest::prop_assert!(r.len <= max_request || r.frames.len() == 1);
                let mut at = r.offset;
                for f in &r.frames {
                    let fr = &t.frames[f.0 as usize];
                    proptest::prop_assert_eq!(fr.offset, at);
                    at += fr.clen;
                    proptest::prop_assert!(seen.insert(*f));
                }
                proptest::prop_assert_eq!(at, r.offset + r.len);
                // first and last frames of a range are wanted
                proptest::prop_assert!(wanted.contains(&r.frames[0]));
                proptest::prop_assert!(wanted.contains(r.frames.last().unwrap()));
                // any run of unwanted frames inside a range is at most max_gap bytes
                let mut gap = 0;
                for f in &r.frames {
                    if wanted.contains(f) { gap = 0; } else {
                        gap += t.frames[f.0 as usize].clen;
                        proptest::prop_assert!(gap <= max_gap);
                    }
                }
            }
            for w in &wanted {
                if (w.0 as usize) < clens.len() {
                    proptest::prop_assert!(seen.contains(w));
                }
            }
        }
    }
}
