//! Start-up prefetch: fetch the frames an image's profile names (manifest annotation
//! `io.weenv.prefetch.frames`, see `weenv_format::prefetch`) as soon as a layer is mounted,
//! so the bytes the container reads first arrive while containerd is still creating it.
//!
//! It runs below on-demand reads and above the fill on the node's link ([`super::link`]): all
//! of a profile's requests are claimed and queued at once, in the profile's order; the link
//! sends them while no on-demand fetch is in flight (nor was for
//! `FillConfig::prefetch_quiet_ms`), a few at a time (`FillConfig::prefetch_concurrency`,
//! `FillConfig::background_bytes`), so a command the profile did not record is not slowed
//! down by it. An on-demand read of a frame a queued request claimed takes that frame out of
//! the request ([`super::link::Carve`]): the reader fetches only it, at once, as demand, and
//! the request sends the rest when the link admits it (single flight: nothing is fetched
//! twice). A frame whose request is on the wire is waited for; requests are small
//! (`FillConfig::prefetch_batch_bytes`), so that wait is short. Frames already in L2 are
//! skipped.

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

/// Fetches `wanted` frames of a layer into L2 (and L1): every request is queued at once on
/// the link, which sends them below on-demand reads. Failures are recorded in `progress`
/// (the frames are then fetched on demand as usual).
pub async fn run_prefetch(
    store: Arc<FrameStore>,
    toc: Arc<Toc>,
    source: Arc<dyn RangeSource>,
    wanted: Vec<FrameIdx>,
    batch_bytes: u64,
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
        // No limit here: every batch claims its frames and queues at once (profile order);
        // the link scheduler decides what is sent.
        .for_each_concurrent(None, |batch| {
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
    use crate::fetch::FetchError;

    /// A reader's on-demand read of frame `i`, running in the background.
    fn demand_read(
        store: &Arc<FrameStore>,
        toc: &Arc<Toc>,
        s: &Arc<dyn RangeSource>,
        i: u32,
    ) -> tokio::task::JoinHandle<Result<Vec<bytes::Bytes>, FetchError>> {
        let (store, toc, s) = (store.clone(), toc.clone(), s.clone());
        tokio::spawn(async move {
            store
                .get_frames(&toc.frames, &s, &[FrameIdx(i)], Priority::OnDemand)
                .await
        })
    }

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
        run_prefetch(store, toc, s, want, 1, progress.clone()).await;
        assert_eq!(src.requests().len(), before);
        assert_eq!(progress.frames_total.load(Ordering::Relaxed), 4);
        assert_eq!(progress.frames_done.load(Ordering::Relaxed), 4);
    }

    /// The link's order, end to end through the store: a demand read goes while prefetch
    /// requests are queued; a reader of a frame a queued prefetch request claimed takes it
    /// (sent at once, fetched once); the rest of the prefetch waits.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn demand_goes_first_and_takes_the_frame_it_waits_for_out_of_the_prefetch() {
        let (toc, blob, store, metrics, _dir) = six_file_store();
        let (src, gate) = MemSource::gated(blob);
        let s: Arc<dyn RangeSource> = src.clone();
        let range = |i: usize| (toc.frames[i].offset, toc.frames[i].clen);
        let read = |i: u32| demand_read(&store, &toc, &s, i);
        let first = read(0);
        while src.requests().is_empty() {
            tokio::task::yield_now().await;
        }
        let progress = Arc::new(PrefetchProgress::default());
        let prefetch = tokio::spawn(run_prefetch(
            store.clone(),
            toc.clone(),
            s.clone(),
            vec![FrameIdx(1), FrameIdx(2), FrameIdx(3)],
            1,
            progress.clone(),
        ));
        // The prefetch claims its frames and queues; nothing is sent while demand is in flight.
        while store.claimed() < 4 {
            tokio::task::yield_now().await;
        }
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert_eq!(src.requests(), vec![range(0)]);
        // A reader of frame 3 takes it: sent now, ahead of frames 1 and 2.
        let third = read(3);
        while src.requests().len() < 2 {
            tokio::task::yield_now().await;
        }
        assert_eq!(src.requests(), vec![range(0), range(3)]);
        assert_eq!(metrics.link_promotions.load(Ordering::Relaxed), 1);
        gate.add_permits(1000);
        first.await.unwrap().unwrap();
        third.await.unwrap().unwrap();
        prefetch.await.unwrap();
        let reqs = src.requests();
        assert_eq!(reqs.len(), 4, "each frame fetched once: {reqs:?}");
        assert_eq!(&reqs[..2], &[range(0), range(3)]);
        assert_eq!(progress.frames_done.load(Ordering::Relaxed), 3);
        assert_eq!(store.demand_in_flight(), 0);
    }

    /// A reader of a frame inside a queued multi-frame prefetch request gets that frame alone,
    /// at once; the request, when the link admits it, sends only the frames left, without
    /// bridging the hole where the reader's frame was.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reader_takes_its_frame_out_of_a_queued_batch() {
        let (toc, blob, store, metrics, _dir) = six_file_store();
        let (src, gate) = MemSource::gated(blob);
        let s: Arc<dyn RangeSource> = src.clone();
        let range = |i: usize| (toc.frames[i].offset, toc.frames[i].clen);
        let span = |a: usize, b: usize| {
            (
                toc.frames[a].offset,
                toc.frames[b].offset + toc.frames[b].clen - toc.frames[a].offset,
            )
        };
        let read = |i: u32| demand_read(&store, &toc, &s, i);
        // Demand in flight: the prefetch's one batch (frames 1..=4, one request) queues.
        let first = read(0);
        while src.requests().is_empty() {
            tokio::task::yield_now().await;
        }
        let progress = Arc::new(PrefetchProgress::default());
        let prefetch = tokio::spawn(run_prefetch(
            store.clone(),
            toc.clone(),
            s.clone(),
            vec![FrameIdx(1), FrameIdx(2), FrameIdx(3), FrameIdx(4)],
            u64::MAX,
            progress.clone(),
        ));
        while store.claimed() < 5 {
            tokio::task::yield_now().await;
        }
        // A reader of frame 3 fetches frame 3 only, now.
        let third = read(3);
        while src.requests().len() < 2 {
            tokio::task::yield_now().await;
        }
        assert_eq!(src.requests(), vec![range(0), range(3)]);
        assert_eq!(metrics.link_promotions.load(Ordering::Relaxed), 1);
        gate.add_permits(1000);
        first.await.unwrap().unwrap();
        third.await.unwrap().unwrap();
        prefetch.await.unwrap();
        // Then the batch without frame 3: two requests, nothing fetched twice.
        let reqs = src.requests();
        assert_eq!(reqs[..2], [range(0), range(3)]);
        let mut rest = reqs[2..].to_vec();
        rest.sort_unstable();
        assert_eq!(rest, vec![span(1, 2), range(4)], "{reqs:?}");
        assert_eq!(progress.frames_done.load(Ordering::Relaxed), 4);
        for i in 0..5 {
            assert!(store.l2().contains(&toc.frames[i].digest), "frame {i}");
        }
        assert_eq!(store.demand_in_flight(), 0);
        assert_eq!(store.claimed(), 0);
    }
}
