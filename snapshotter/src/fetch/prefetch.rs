//! Start-up prefetch: fetch the frames an image's profile names (manifest annotation
//! `io.weenv.prefetch.frames`, see `weenv_format::prefetch`) as soon as a layer is mounted,
//! so the bytes the container reads first arrive while containerd is still creating it.
//!
//! Unlike the background fill it does not wait for a quiet link: it *is* the start-up
//! traffic, and it counts as demand (the fill waits for it). Requests are small
//! (`FillConfig::prefetch_batch_bytes`) and a few run at once, so a frame a reader waits for
//! is published after its own request, not after the whole profile. Frames already in L2 are
//! skipped; single flight makes a concurrent on-demand read of the same frame wait for the
//! prefetch's copy instead of fetching it twice.

use super::fill::batches;
use super::frames::{FrameStore, Priority};
use super::RangeSource;
use futures::StreamExt;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use weenv_format::{FrameIdx, Toc};

/// Progress of one layer's start-up prefetch (shared with `status()`).
#[derive(Debug, Default)]
pub struct PrefetchProgress {
    /// Frames the profiles name (all prefetches of this layer).
    pub frames_total: AtomicU64,
    /// Of those, frames in L2 (present before, or fetched).
    pub frames_done: AtomicU64,
    /// Compressed bytes fetched by the prefetch.
    pub bytes_fetched: AtomicU64,
    last_error: Mutex<Option<String>>,
}

impl PrefetchProgress {
    /// Last prefetch error, if any.
    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().clone()
    }
}

/// The requests of a prefetch: `wanted` minus frames already cached (`present`), in the
/// profile's order (the order the workload first needed them; duplicates dropped), grouped
/// into batches of about `batch_bytes` compressed bytes. Pure.
pub fn prefetch_work(
    toc: &Toc,
    wanted: &[FrameIdx],
    batch_bytes: u64,
    present: impl Fn(FrameIdx) -> bool,
) -> Vec<Vec<FrameIdx>> {
    let mut seen = std::collections::HashSet::new();
    let missing: Vec<FrameIdx> = wanted
        .iter()
        .copied()
        .filter(|i| (i.0 as usize) < toc.frames.len() && !present(*i) && seen.insert(*i))
        .collect();
    batches(toc, &missing, batch_bytes)
}

/// Fetches `wanted` frames of a layer into L2 (and L1) with `concurrency` requests at once.
/// Failures are recorded in `progress` (the frames are then fetched on demand as usual).
pub async fn run_prefetch(
    store: Arc<FrameStore>,
    toc: Arc<Toc>,
    source: Arc<dyn RangeSource>,
    wanted: Vec<FrameIdx>,
    batch_bytes: u64,
    concurrency: usize,
    progress: Arc<PrefetchProgress>,
) {
    let l2 = store.l2();
    let work = prefetch_work(&toc, &wanted, batch_bytes, |i| {
        toc.frames
            .get(i.0 as usize)
            .is_some_and(|f| l2.contains(&f.digest))
    });
    let missing: usize = work.iter().map(Vec::len).sum();
    // A layer may get several prefetches (one per image profile naming new frames): add up.
    progress
        .frames_total
        .fetch_add(wanted.len() as u64, Ordering::Relaxed);
    progress.frames_done.fetch_add(
        wanted.len().saturating_sub(missing) as u64,
        Ordering::Relaxed,
    );
    let t0 = std::time::Instant::now();
    futures::stream::iter(work)
        .for_each_concurrent(concurrency.max(1), |batch| {
            let (store, toc, source, progress) =
                (store.clone(), toc.clone(), source.clone(), progress.clone());
            async move {
                let bytes: u64 = batch
                    .iter()
                    .filter_map(|i| toc.frame(*i))
                    .map(|f| f.clen)
                    .sum();
                match store
                    .get_frames(&toc.frames, &source, &batch, Priority::Prefetch)
                    .await
                {
                    Ok(_) => {
                        progress
                            .frames_done
                            .fetch_add(batch.len() as u64, Ordering::Relaxed);
                        progress.bytes_fetched.fetch_add(bytes, Ordering::Relaxed);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "start-up prefetch request failed; those frames are fetched on demand");
                        *progress.last_error.lock() = Some(e.to_string());
                    }
                }
            }
        })
        .await;
    tracing::debug!(
        frames = wanted.len(),
        fetched = missing,
        ms = t0.elapsed().as_millis() as u64,
        "start-up prefetch done"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fetch::testutil::{six_file_store, MemSource};

    #[test]
    fn work_skips_present_and_out_of_range_frames() {
        let (toc, _, _, _, _dir) = six_file_store();
        assert!(toc.frames.len() >= 4, "{} frames", toc.frames.len());
        let w = prefetch_work(
            &toc,
            &[
                FrameIdx(3),
                FrameIdx(1),
                FrameIdx(0),
                FrameIdx(3),
                FrameIdx(999),
            ],
            u64::MAX,
            |i| i == FrameIdx(1),
        );
        assert_eq!(w, vec![vec![FrameIdx(3), FrameIdx(0)]]);
        let w = prefetch_work(&toc, &[FrameIdx(0), FrameIdx(2)], 1, |_| false);
        assert_eq!(w, vec![vec![FrameIdx(0)], vec![FrameIdx(2)]]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn prefetch_fetches_only_the_profile_frames() {
        let (toc, blob, store, metrics, _dir) = six_file_store();
        let (src, gate) = MemSource::gated(blob);
        gate.add_permits(1000);
        let s: Arc<dyn RangeSource> = src.clone();
        let want = vec![FrameIdx(1), FrameIdx(2)];
        let progress = Arc::new(PrefetchProgress::default());
        run_prefetch(
            store.clone(),
            toc.clone(),
            s.clone(),
            want.clone(),
            1,
            2,
            progress.clone(),
        )
        .await;
        for (i, f) in toc.frames.iter().enumerate() {
            assert_eq!(
                store.l2().contains(&f.digest),
                want.contains(&FrameIdx(i as u32)),
                "frame {i}"
            );
        }
        assert_eq!(progress.frames_done.load(Ordering::Relaxed), 2);
        let expect: u64 = want.iter().map(|i| toc.frames[i.0 as usize].clen).sum();
        assert_eq!(progress.bytes_fetched.load(Ordering::Relaxed), expect);
        assert_eq!(
            metrics.bytes_fetched_prefetch.load(Ordering::Relaxed),
            expect
        );
        assert_eq!(metrics.bytes_fetched_on_demand.load(Ordering::Relaxed), 0);
        // Again: everything present, nothing sent.
        let before = src.requests().len();
        run_prefetch(store, toc, s, want, 1, 2, progress.clone()).await;
        assert_eq!(src.requests().len(), before);
        assert_eq!(progress.frames_total.load(Ordering::Relaxed), 4);
        assert_eq!(progress.frames_done.load(Ordering::Relaxed), 4);
    }
}
