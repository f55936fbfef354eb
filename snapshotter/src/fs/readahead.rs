//! Read-ahead window within a file (pure).
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

#[cfg(test)]
mod tests {
    use super::*;

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
