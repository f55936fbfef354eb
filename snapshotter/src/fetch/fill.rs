//! Background fill: fetch every frame of a layer that is not on disk yet, in blob order,
//! off the critical path.
//!
//! Priority: each fill request waits for the node's link scheduler ([`super::link`]) to admit
//! it: after queued start-up prefetch, only while no on-demand or read-ahead fetch is in flight
//! and none was for `FillConfig::quiet_ms`, within `FillConfig::concurrency` fill requests and
//! `FillConfig::background_bytes` background bytes in flight on the node. So a FUSE read never
//! queues behind fill traffic, and shares the link only with the fill requests sent before
//! it. The rate is a node-wide budget ([`FillShared`], [`pace`], pure); frames already in L2
//! are skipped. Progress is published in [`FillProgress`].

use super::cpu::{CpuPolicy, CpuPriority};
use super::frames::{FrameStore, Priority};
use super::link::LinkPolicy;
use super::RangeSource;
use futures::StreamExt;
use parking_lot::Mutex;
use serde::Deserialize;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use weenv_format::{FrameIdx, Toc};

/// Fetch tuning: background fill, read-ahead and coalescing.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FillConfig {
    /// Fill layers in the background after they are added. Default: true.
    pub enabled: bool,
    /// Concurrent fill requests on the node (all layers together). Default: 2.
    pub concurrency: usize,
    /// Background (start-up prefetch + fill) bytes in flight on the node at most; a demand
    /// read shares the link with no more than this (a single larger request may go alone).
    /// Default: 4 MiB (one fill request).
    pub background_bytes: u64,
    /// Start-up prefetch requests are sent only after on-demand fetches have been idle for
    /// this long (ms); reads of frames the prefetch was about to send (`LinkQueue::predicted`)
    /// do not count. Default: 100.
    pub prefetch_quiet_ms: u64,
    /// A reader that takes a frame out of a queued prefetch request with no more than this
    /// many bytes of its layer's prefetch still to be sent before it follows the profile (the
    /// command it was recorded for): its read starts no quiet time (`LinkQueue::predicted`).
    /// Default: 1 MiB (the harness import's own profile: at most 0.8 MB still ahead of a
    /// read; a command reading in another order: up to tens of MB).
    pub prefetch_follow_bytes: u64,
    /// Priority of background CPU and disk work (see `fetch::cpu`). Default: idle.
    pub cpu_priority: CpuPriority,
    /// The fill sends its next request only after no FUSE read came for this long (ms).
    /// Default: 500.
    pub busy_ms: u64,
    /// Longest single pause of the fill while FUSE reads keep coming (ms). Default: 5000.
    pub busy_max_pause_ms: u64,
    /// Percent of the time the fill still runs on a node that stays busy: a pause that
    /// lasted `busy_max_pause_ms` is followed by a window without pauses of
    /// `busy_max_pause_ms * share / (100 - share)`, so a busy node completes its layers
    /// within a bounded time (0: one request per full pause, which let a 700 MB image take
    /// many minutes). Default: 25.
    pub busy_min_share_percent: u32,
    /// An interval (250 ms) in which other processes used at least this share of the node's
    /// CPU time counts as a FUSE read for `busy_ms` (containers on a warm node read from
    /// the page cache or native trees); 0 = off. Default: 50.
    pub busy_cpu_percent: u32,
    /// Fill rate limit of the node in (compressed) bytes per second; 0 = unlimited.
    /// Default: 0.
    pub rate_limit_bytes_per_sec: u64,
    /// The fill sends a request only after on-demand and read-ahead fetches have been idle
    /// for this long (ms; counted from the layer's addition too). 0 = only while none is in
    /// flight. Default: 1000: a program starting up misses, computes for a few ms, misses
    /// again; fill requests sent into those gaps delayed each next miss by their transfer
    /// time (python3 start-up over 200 Mbit: 1.44 s with fill vs 0.87 s without, bench).
    pub quiet_ms: u64,
    /// After a layer's fill, regular files of at least this size are copied out of L2 as
    /// complete files for FUSE passthrough (else the first open of each copies it, inside the
    /// reader's time: warm sequential reads ran at 0.42x native). `u64::MAX` = off.
    /// Default: 256 KiB (costs their size again on disk).
    pub materialise_min_bytes: u64,
    /// Compressed bytes per fill request. Default: 4 MiB.
    pub batch_bytes: u64,
    /// Read-ahead window per file (sliding for sequential readers, see `fs::readahead`);
    /// 0 = off. Default: 8 MiB (a cold 64 MiB sequential read: 9 range requests instead of 64).
    pub read_ahead_bytes: u64,
    /// A layer read in blob order across files for this many frames in a row gets the next
    /// `read_ahead_bytes` of the blob prefetched (sliding); 0 = off. Default: 6 (python3
    /// start-up, bench: 3 fetched 27% more than without it; `find | xargs cat` runs on).
    pub scan_min_frames: u32,
    /// On the first read of a small file in a directory, prefetch up to this many frames
    /// holding the directory's small files; 0 = off. Default: 0 (off): on python3 start-up
    /// (Debian image, `integration/tests/fuse_image.rs`) 2/4/8 frames fetched 9%/20%/33% more
    /// bytes for at most 3 fewer requests out of ~30, and bytes dominate the start time.
    pub dir_prefetch_frames: usize,
    /// Files up to this size count as small for the directory prefetch. Default: 256 KiB.
    pub small_file_bytes: u64,
    /// Largest hole bridged when coalescing misses. Default: 256 KiB.
    pub max_gap_bytes: u64,
    /// Largest coalesced request. Default: 16 MiB.
    pub max_request_bytes: u64,
    /// Start-up prefetch: when a layer is mounted for an image whose manifest carries a
    /// profile (`io.weenv.prefetch.frames` on the layer descriptor, written by
    /// `weenv-convert prefetch`), fetch those frames at once. Default: true.
    pub prefetch: bool,
    /// Concurrent start-up prefetch requests on the node. Default: 4.
    pub prefetch_concurrency: usize,
    /// Compressed bytes per start-up prefetch request (small: an on-demand read shares the
    /// link with at most one such request per prefetch connection). Default: 256 KiB.
    pub prefetch_batch_bytes: u64,
    /// Check each entry's tar header against its TOC entry before serving any byte of the
    /// file, and before exposing an entry that can raise privilege (setuid/setgid, devices,
    /// `security.capability`); a mismatch quarantines the layer. Off only to measure what the
    /// checks cost (the completion check still runs). Default: true.
    pub check_headers: bool,
    /// After a layer's fill and completion check, write it out as a native directory tree
    /// and mount it in place of its FUSE directory (see `fs::native`). Default: true.
    pub native: bool,
}

impl Default for FillConfig {
    fn default() -> Self {
        FillConfig {
            enabled: true,
            concurrency: 2,
            background_bytes: 4 << 20,
            prefetch_quiet_ms: 100,
            prefetch_follow_bytes: 1 << 20,
            cpu_priority: CpuPriority::Idle,
            busy_ms: 500,
            busy_max_pause_ms: 5000,
            busy_min_share_percent: 25,
            busy_cpu_percent: 50,
            rate_limit_bytes_per_sec: 0,
            quiet_ms: 1000,
            materialise_min_bytes: 256 << 10,
            batch_bytes: 4 << 20,
            read_ahead_bytes: 8 << 20,
            scan_min_frames: 6,
            dir_prefetch_frames: 0,
            small_file_bytes: 256 << 10,
            max_gap_bytes: 256 << 10,
            max_request_bytes: 16 << 20,
            prefetch: true,
            prefetch_concurrency: 4,
            prefetch_batch_bytes: 256 << 10,
            check_headers: true,
            native: true,
        }
    }
}

/// State of a layer's fill.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FillState {
    Disabled,
    Pending,
    Running,
    Done,
    Failed,
}

/// Progress of one layer's fill (shared with `status()`).
#[derive(Debug, Default)]
pub struct FillProgress {
    state: AtomicU8,
    /// Frames in the layer.
    pub frames_total: AtomicU64,
    /// Frames known to be in L2.
    pub frames_done: AtomicU64,
    /// Compressed bytes fetched by the fill.
    pub bytes_fetched: AtomicU64,
    last_error: Mutex<Option<String>>,
}

impl FillProgress {
    /// Current state.
    pub fn state(&self) -> FillState {
        match self.state.load(Ordering::Relaxed) {
            0 => FillState::Pending,
            1 => FillState::Running,
            2 => FillState::Done,
            3 => FillState::Failed,
            _ => FillState::Disabled,
        }
    }

    /// Sets the state.
    pub fn set_state(&self, s: FillState) {
        let v = match s {
            FillState::Pending => 0,
            FillState::Running => 1,
            FillState::Done => 2,
            FillState::Failed => 3,
            FillState::Disabled => 4,
        };
        self.state.store(v, Ordering::Relaxed);
    }

    /// Last fill error, if any.
    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().clone()
    }
}

/// How long to wait before sending more, so that `sent` bytes over `elapsed` stay within
/// `rate` bytes/s (0 = unlimited). Pure.
pub fn pace(sent: u64, rate: u64, elapsed: Duration) -> Duration {
    if rate == 0 {
        return Duration::ZERO;
    }
    let due = Duration::from_secs_f64(sent as f64 / rate as f64);
    due.saturating_sub(elapsed)
}

/// Groups `missing` frames (blob order) into batches of about `batch_bytes` compressed bytes.
/// Pure.
pub fn batches(toc: &Toc, missing: &[FrameIdx], batch_bytes: u64) -> Vec<Vec<FrameIdx>> {
    let mut out: Vec<Vec<FrameIdx>> = Vec::new();
    let mut cur_bytes = 0u64;
    for idx in missing {
        let Some(f) = toc.frames.get(idx.0 as usize) else {
            continue;
        };
        match out.last_mut() {
            Some(b) if cur_bytes + f.clen <= batch_bytes.max(1) => {
                b.push(*idx);
                cur_bytes += f.clen;
            }
            _ => {
                out.push(vec![*idx]);
                cur_bytes = f.clen;
            }
        }
    }
    out
}

impl From<&FillConfig> for LinkPolicy {
    fn from(c: &FillConfig) -> Self {
        LinkPolicy {
            background_bytes: c.background_bytes,
            follow_bytes: c.prefetch_follow_bytes,
            prefetch_quiet: Duration::from_millis(c.prefetch_quiet_ms),
            fill_quiet: Duration::from_millis(c.quiet_ms),
            prefetch_concurrency: c.prefetch_concurrency,
            fill_concurrency: c.concurrency,
        }
    }
}

impl From<&FillConfig> for CpuPolicy {
    fn from(c: &FillConfig) -> Self {
        CpuPolicy {
            priority: c.cpu_priority,
            busy: Duration::from_millis(c.busy_ms),
            max_pause: Duration::from_millis(c.busy_max_pause_ms),
            min_share: c.busy_min_share_percent,
        }
    }
}

/// The node-wide fill rate budget, shared by the fills of all layers:
/// `rate_limit_bytes_per_sec` applies per node, not per layer (after a restart every layer
/// refills at once). Concurrency is the link scheduler's (`LinkPolicy::fill_concurrency`).
pub struct FillShared {
    sent: AtomicU64,
    started: Instant,
}

impl Default for FillShared {
    fn default() -> Self {
        FillShared {
            sent: AtomicU64::new(0),
            started: Instant::now(),
        }
    }
}

/// Work run (blocking) after a layer's frames are all in L2, before its fill is `Done`.
pub type AfterFill = Box<dyn FnOnce() + Send + 'static>;

/// Fills one layer; returns when every frame is in L2 or its batch's read failed (after the
/// source's one retry budget: no retry loop here; a failed fill is `Failed`, and the frames
/// are fetched on demand or by the next fill). `after` runs
/// (on a blocking thread) once every frame is in L2, before the state becomes `Done`.
pub async fn run_fill(
    store: Arc<FrameStore>,
    toc: Arc<Toc>,
    source: Arc<dyn RangeSource>,
    cfg: FillConfig,
    progress: Arc<FillProgress>,
    shared: Arc<FillShared>,
    after: Option<AfterFill>,
) {
    progress
        .frames_total
        .store(toc.frames.len() as u64, Ordering::Relaxed);
    progress.set_state(FillState::Running);
    store.note_layer_added(); // the layer is about to be used: on-demand reads come first
    let missing: Vec<FrameIdx> = (0..toc.frames.len() as u32)
        .map(FrameIdx)
        .filter(|i| !store.l2().contains(&toc.frames[i.0 as usize].digest))
        .collect();
    progress
        .frames_done
        .store((toc.frames.len() - missing.len()) as u64, Ordering::Relaxed);
    let work = batches(&toc, &missing, cfg.batch_bytes);
    let failed = futures::stream::iter(work)
        .map(|batch| {
            let (store, toc, source, progress, shared) = (
                store.clone(),
                toc.clone(),
                source.clone(),
                progress.clone(),
                shared.clone(),
            );
            let rate = cfg.rate_limit_bytes_per_sec;
            async move {
                let bytes: u64 = batch
                    .iter()
                    .filter_map(|i| toc.frames.get(i.0 as usize))
                    .map(|f| f.clen)
                    .sum();
                // Pause while the node's containers read through weenv.
                store.wait_not_busy().await;
                let wait = pace(
                    shared.sent.fetch_add(bytes, Ordering::Relaxed),
                    rate,
                    shared.started.elapsed(),
                );
                if !wait.is_zero() {
                    tokio::time::sleep(wait).await;
                }
                // What this request fetches: the batch's frames that on-demand reads did not
                // fetch in the meantime (get_frames skips those).
                let sent = store.missing_bytes(&toc.frames, &batch);
                // One read (it waits for the link to admit it): the source's retry budget is
                // the only retrying.
                let res = store
                    .get_frames(&toc.frames, &source, &batch, Priority::Fill)
                    .await;
                match res {
                    Ok(_) => {
                        progress
                            .frames_done
                            .fetch_add(batch.len() as u64, Ordering::Relaxed);
                        progress.bytes_fetched.fetch_add(sent, Ordering::Relaxed);
                        false
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "background fill request failed");
                        *progress.last_error.lock() = Some(e.to_string());
                        true
                    }
                }
            }
        })
        .buffer_unordered(cfg.concurrency.max(1))
        .fold(0usize, |n, failed| async move { n + usize::from(failed) })
        .await;
    if failed == 0 {
        if let Some(f) = after {
            // The completion check and native tree read and write the whole layer: after the
            // containers' reads, at background priority (normal if the node stayed busy and
            // this is the fill's window: under SCHED_IDLE it would never finish there).
            store.wait_not_busy().await;
            let cpu = store.background_priority();
            let low = move || {
                let _low = super::cpu::Lowered::enter(cpu);
                f();
            };
            if let Err(e) = tokio::task::spawn_blocking(low).await {
                tracing::warn!(error = %e, "post-fill work failed");
            }
        }
    }
    progress.set_state(if failed == 0 {
        FillState::Done
    } else {
        FillState::Failed
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use weenv_format::{Digest, Frame};

    #[test]
    fn pace_limits_rate() {
        assert_eq!(pace(1000, 0, Duration::ZERO), Duration::ZERO);
        assert_eq!(
            pace(1000, 1000, Duration::from_millis(400)),
            Duration::from_millis(600)
        );
        assert_eq!(pace(1000, 1000, Duration::from_secs(2)), Duration::ZERO);
    }

    #[test]
    fn batches_respect_size() {
        let frames = (0..5u64)
            .map(|i| Frame {
                offset: i * 10,
                clen: 10,
                ulen: 20,
                digest: Digest::sha256(&[i as u8]),
            })
            .collect();
        let toc = Toc {
            version: 1,
            frames,
            entries: vec![],
        };
        let b = batches(
            &toc,
            &[FrameIdx(0), FrameIdx(1), FrameIdx(2), FrameIdx(4)],
            25,
        );
        assert_eq!(
            b,
            vec![
                vec![FrameIdx(0), FrameIdx(1)],
                vec![FrameIdx(2), FrameIdx(4)]
            ]
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn fill_waits_for_on_demand_reads_then_completes() {
        use crate::fetch::testutil::{six_file_store, MemSource};
        let (toc, blob, store, metrics, _dir) = six_file_store();
        let (src, gate) = MemSource::gated(blob);
        let s: Arc<dyn RangeSource> = src.clone();
        let on_demand = {
            let (store, toc, s) = (store.clone(), toc.clone(), s.clone());
            tokio::spawn(async move {
                store
                    .get_frames(&toc.frames, &s, &[FrameIdx(0)], Priority::OnDemand)
                    .await
            })
        };
        while src.requests().is_empty() {
            tokio::task::yield_now().await;
        }
        let progress = Arc::new(FillProgress::default());
        let cfg = FillConfig {
            batch_bytes: 1,
            ..FillConfig::default()
        };
        let fill = tokio::spawn(run_fill(
            store.clone(),
            toc.clone(),
            s.clone(),
            cfg,
            progress.clone(),
            Arc::new(FillShared::default()),
            None,
        ));
        while progress.state() != FillState::Running {
            tokio::task::yield_now().await;
        }
        for _ in 0..200 {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            src.requests().len(),
            1,
            "fill must not send while an on-demand read is in flight"
        );
        gate.add_permits(1000);
        on_demand.await.unwrap().unwrap();
        fill.await.unwrap();
        assert_eq!(progress.state(), FillState::Done);
        assert_eq!(
            progress.frames_done.load(Ordering::Relaxed),
            toc.frames.len() as u64
        );
        assert!(toc.frames.iter().all(|f| store.l2().contains(&f.digest)));
        assert!(metrics.bytes_fetched_fill.load(Ordering::Relaxed) > 0);
    }

    #[tokio::test]
    async fn a_failing_batch_is_read_once_not_three_times() {
        use crate::fetch::testutil::{six_file_store, MemSource};
        let (toc, _blob, store, metrics, _dir) = six_file_store();
        let src = MemSource::new(Vec::new()); // every range is past the end: terminal
        let progress = Arc::new(FillProgress::default());
        let cfg = FillConfig {
            batch_bytes: u64::MAX,
            quiet_ms: 0,
            ..FillConfig::default()
        };
        run_fill(
            store,
            toc,
            src.clone(),
            cfg,
            progress.clone(),
            Arc::new(FillShared::default()),
            None,
        )
        .await;
        assert_eq!(progress.state(), FillState::Failed);
        assert_eq!(
            src.requests().len(),
            1,
            "one attempt, no fill-level retries"
        );
        assert_eq!(metrics.range_request_errors.load(Ordering::Relaxed), 1);
        assert!(progress.last_error().unwrap().contains("terminal"));
    }
}
