//! Read-ahead windows (pure): within a file ([`next_window`]) and across the files of a
//! layer read in blob order ([`scan_step`]).
//!
//! Positions index the file's distinct frames in file order; `horizon` is one past the last
//! frame already prefetched (0: nothing yet). The first read prefetches a window after the
//! frames it needs. A reader that stays inside the prefetched span gets the window extended
//! once fewer than half a window of prefetched bytes remain ahead of it (a sliding window
//! for sequential readers); a read that jumps past the horizon (random access) prefetches
//! nothing.

/// Positions `from..end` whose sizes fit in `budget` bytes.
fn fit(ulens: &[u64], from: usize, budget: u64) -> usize {
    let mut b = budget;
    let mut e = from;
    while let Some(u) = ulens.get(e) {
        if *u > b {
            break;
        }
        b -= u;
        e += 1;
    }
    e
}

/// The span `[start, end)` to prefetch after a read of positions `first..=last`, or None.
pub fn next_window(
    ulens: &[u64],
    first: usize,
    last: usize,
    horizon: usize,
    window: u64,
) -> Option<(usize, usize)> {
    if window == 0 || last >= ulens.len() {
        return None;
    }
    if horizon != 0 {
        if first > horizon {
            return None;
        }
        if fit(ulens, last + 1, window / 2) < horizon {
            return None;
        }
    }
    let start = horizon.max(last + 1);
    let end = fit(ulens, start, window);
    (start < end).then_some((start, end))
}

/// A layer read in blob order across files (`find | xargs cat`, a copy, a scanner).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScanState {
    /// Last frame of the previous read.
    last: Option<u32>,
    /// Frames advanced in blob order without a jump.
    run: u32,
    /// One past the last frame prefetched for this scan (0: none).
    horizon: usize,
}

/// Updates `s` with a read of the layer's frames `first..=last` (blob order) and returns the
/// frames `[start, end)` to prefetch, if any. A read starting at most 2 frames after the
/// previous read's last frame continues the run; anything else resets it. Once `min_run`
/// frames were crossed in order, a window of `window` bytes ahead is prefetched and slid
/// like [`next_window`]. Per-file read-ahead cannot see this: each small file is its own file
/// and touches one frame. Pure.
pub fn scan_step(
    s: &mut ScanState,
    first: u32,
    last: u32,
    ulens: &[u64],
    min_run: u32,
    window: u64,
) -> Option<(usize, usize)> {
    match s.last {
        Some(l) if first >= l && first <= l.saturating_add(2) && last >= l => {
            s.run = s.run.saturating_add(last - l);
        }
        _ => {
            s.run = 0;
            s.horizon = 0;
        }
    }
    s.last = Some(last);
    if window == 0 || min_run == 0 || s.run < min_run {
        return None;
    }
    let next = last as usize + 1;
    if s.horizon != 0 && fit(ulens, next, window / 2) < s.horizon {
        return None;
    }
    let start = s.horizon.max(next);
    let end = fit(ulens, start, window);
    s.horizon = s.horizon.max(end);
    (start < end).then_some((start, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blob_order_scan_prefetches_across_files() {
        let u = [10u64; 30];
        let mut s = ScanState::default();
        // Small files: reads of frames 0, 0, 1, 2: a run of 2, below min_run 3.
        assert_eq!(scan_step(&mut s, 0, 0, &u, 3, 40), None);
        assert_eq!(scan_step(&mut s, 0, 0, &u, 3, 40), None);
        assert_eq!(scan_step(&mut s, 1, 1, &u, 3, 40), None);
        assert_eq!(scan_step(&mut s, 2, 2, &u, 3, 40), None);
        // Frame 3 (a file spanning 3..=3): run 3: prefetch 4 frames ahead.
        assert_eq!(scan_step(&mut s, 3, 3, &u, 3, 40), Some((4, 8)));
        // Inside the window with >= half of it ahead: nothing; then slide.
        assert_eq!(scan_step(&mut s, 4, 4, &u, 3, 40), None);
        assert_eq!(scan_step(&mut s, 6, 7, &u, 3, 40), Some((8, 12)));
        // A jump (another directory far away) resets the run.
        assert_eq!(scan_step(&mut s, 20, 20, &u, 3, 40), None);
        assert_eq!(scan_step(&mut s, 21, 21, &u, 3, 40), None);
        // Going backwards resets too.
        assert_eq!(scan_step(&mut s, 2, 2, &u, 3, 40), None);
        assert_eq!(s.run, 0);
        // Disabled.
        let mut s = ScanState::default();
        for f in 0..10 {
            assert_eq!(scan_step(&mut s, f, f, &u, 0, 40), None);
        }
    }

    #[test]
    fn first_read_opens_a_window() {
        let u = [10u64; 20];
        assert_eq!(next_window(&u, 0, 0, 0, 40), Some((1, 5)));
        assert_eq!(next_window(&u, 18, 19, 0, 40), None, "end of file");
        assert_eq!(next_window(&u, 0, 0, 0, 0), None, "disabled");
    }

    #[test]
    fn sequential_reader_slides_the_window() {
        let u = [10u64; 20];
        // Prefetched 1..5; reading 1: 3 frames still ahead (>= half a window): nothing.
        assert_eq!(next_window(&u, 1, 1, 5, 40), None);
        // Reading 3: only 1 frame ahead: extend from the horizon.
        assert_eq!(next_window(&u, 3, 3, 5, 40), Some((5, 9)));
        // Reading exactly at the horizon still counts as sequential.
        assert_eq!(next_window(&u, 9, 9, 9, 40), Some((10, 14)));
    }

    #[test]
    fn random_jumps_prefetch_nothing() {
        let u = [10u64; 20];
        assert_eq!(next_window(&u, 12, 12, 5, 40), None);
        assert_eq!(next_window(&u, 3, 30, 5, 40), None, "bad positions");
    }
}
