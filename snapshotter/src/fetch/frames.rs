//! [`FrameStore`]: verified frames by index, from L1, L2 or the layer's source.
//!
//! Contract:
//! - every frame returned or cached matched its TOC digest (`decode_frame`), checked as the
//!   [`weenv_registry::Verify`] of the range read: on a mismatch the source's provided
//!   `read_with` fetches the range once more, fresh (no cache here can hold it: only verified
//!   frames are cached; the source is asked to bypass its own, e.g. HTTP caches), and frames
//!   that verify in either attempt are served; a second mismatch fails the frame's read (the
//!   caller answers EIO). Every mismatch is counted; one log line per event names layer and
//!   frame (rate-limited); bad bytes are never cached, and the next read fetches again;
//! - retries, timeouts and the request/latency/bytes metrics are the source's provided read
//!   (`registry/src/source.rs`), once per range request ([`FetchObserver`]);
//! - single flight: concurrent misses of one frame digest cause one fetch ([`super::single_flight`]);
//! - misses claimed together are coalesced into range requests by [`plan_fetch`];
//! - every range request goes through the node's [`LinkScheduler`]: on-demand and read-ahead
//!   requests are sent at once, start-up prefetch and fill requests wait below them; an
//!   on-demand (or read-ahead) read of a frame a background call claimed but has not sent yet takes that
//!   frame ([`super::link::Carve`]): the reader fetches only it, at once, as demand, and the
//!   call's request leaves it out; a fill request claims its frames only once the link admits
//!   it (see [`super::link`]); background frames decode at low CPU priority ([`super::cpu`])
//!   until a reader waits for one of them.
//! - with a peer tier set ([`FrameStore::set_peer_tier`], `crate::peer`), claimed misses of a
//!   registry blob are first asked of the peer nodes that own them; frames the tier returns
//!   (verified against the TOC by the tier) are cached like fetched ones, the rest are fetched
//!   from the source as above.

use super::cpu::{
    background_priority, busy_step, BusyStep, CpuPolicy, CpuPriority, Lowered, Raisable,
};
use super::link::{Class, LinkPolicy, LinkScheduler, Promotion};
use super::plan::{plan_fetch, PlanLimits, RangeRequest};
use super::single_flight::{publish, Claim, Claims, Fetched, Joined, SingleFlight, Slot};
use super::{FetchError, RangeSource};
use crate::cache::{DiskCache, MemoryCache};
use crate::metrics::{LogLimit, Metrics};
use crate::peer::PeerTier;
use bytes::Bytes;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use weenv_format::{Digest, Frame, FrameIdx};
use weenv_registry::{ByteRange, ReadObserver, ReadOpts, ReadReport, Verify};

/// Why frames are wanted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Priority {
    /// A FUSE read is waiting.
    OnDemand,
    /// Prefetch ahead of reads (file tail, directory neighbours).
    ReadAhead,
    /// Start-up prefetch of the frames an image's profile names.
    Prefetch,
    /// Background fill.
    Fill,
}

/// Why a frame's bytes gave no frame: they failed verification (`Bad`, with the reason), or
/// something else failed.
enum Unverified {
    Bad(String),
    Failed(FetchError),
}
use Unverified::{Bad, Failed};

/// Frames from caches or sources, verified, single flight.
pub struct FrameStore {
    l1: MemoryCache,
    l2: Arc<DiskCache>,
    flight: SingleFlight,
    metrics: Arc<Metrics>,
    limits: PlanLimits,
    link: LinkScheduler,
    cpu: CpuPolicy,
    /// Milliseconds after `started` of the last sign that the node's containers are busy: a
    /// FUSE read, or a CPU interval other processes kept busy.
    last_busy_ms: AtomicU64,
    /// Milliseconds after `started` of the last FUSE read (containers reading lazy layers).
    last_read_ms: AtomicU64,
    /// Milliseconds after `started` until which fill requests go unpaused (a pause reached
    /// its maximum: the fill's minimum share, see [`busy_step`]).
    open_until_ms: AtomicU64,
    last_log: LogLimit,
    started: Instant,
    /// Compressed bytes of the range requests in flight.
    request_bytes: AtomicU64,
    /// Peer nodes asked before the source (set once at start-up).
    peers: OnceLock<Arc<dyn PeerTier>>,
}

/// Subtracts a request's bytes from [`FrameStore::in_flight_bytes`] when it ends.
struct RequestBytes<'a>(&'a AtomicU64, u64);

impl Drop for RequestBytes<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(self.1, Ordering::Relaxed);
    }
}

/// One [`FrameStore::get_frames`] call: what each of its fetch steps needs.
struct Call<'c> {
    /// The layer's TOC frames.
    frames: &'c [Frame],
    /// The layer's blob.
    source: &'c Arc<dyn RangeSource>,
    prio: Priority,
    /// The background call's queue of claimed frames readers may take (fill and prefetch).
    promotion: Option<&'c Promotion>,
}

impl Call<'_> {
    fn digest(&self, idx: FrameIdx) -> Option<Digest> {
        self.frames.get(idx.0 as usize).map(|f| f.digest.clone())
    }
}

enum Plan<'a> {
    Have(Bytes),
    Fetch(Claim<'a>),
    /// Taken out of a queued background request; predicted (see `LinkQueue::predicted`)?
    Take(Claim<'a>, bool),
    Wait(watch::Receiver<Slot>, Option<Arc<Promotion>>),
}

/// Verifies the frames of one range request in each attempt's bytes, caching each frame
/// that verifies (the source's `read_with` refetches the range once, fresh, if any frame is
/// bad). Remembers each frame's first failure.
struct FrameCheck<'a> {
    store: &'a FrameStore,
    frames: Vec<(FrameIdx, &'a Frame)>,
    prio: Priority,
    promotion: Option<&'a Promotion>,
    state: Mutex<CheckState>,
}

#[derive(Default)]
struct CheckState {
    /// Frames that verified (in any attempt).
    good: HashMap<FrameIdx, Bytes>,
    /// First verification failure of each frame that failed.
    bad: HashMap<FrameIdx, String>,
    /// Frames that could not be checked (a local failure, not the bytes).
    failed: HashMap<FrameIdx, FetchError>,
}

#[async_trait::async_trait]
impl Verify for FrameCheck<'_> {
    async fn verify(&self, range: ByteRange, bytes: &Bytes) -> Result<(), String> {
        let mut first = None;
        for (idx, f) in &self.frames {
            let known = self.state.lock().good.contains_key(idx);
            if known {
                continue;
            }
            // Background work decodes at low priority until a reader waits for it (which
            // raises the decode running then too), at normal inside the fill's window.
            let cpu = match (self.prio, self.promotion) {
                (Priority::Fill | Priority::Prefetch, p) if !p.is_some_and(Promotion::promoted) => {
                    self.store.background_priority()
                }
                _ => CpuPriority::Normal,
            };
            let raise = self.promotion.map(Promotion::decoders);
            let res = self
                .store
                .verify_and_cache(f, bytes, range.offset, self.prio, (cpu, raise))
                .await;
            let mut st = self.state.lock();
            match res {
                Ok(b) => {
                    st.failed.remove(idx);
                    st.good.insert(*idx, b);
                }
                Err(Bad(reason)) => {
                    first = first.or_else(|| Some(format!("frame {}: {reason}", idx.0)));
                    st.bad.entry(*idx).or_insert(reason);
                }
                Err(Failed(e)) => {
                    st.failed.insert(*idx, e);
                }
            }
        }
        first.map_or(Ok(()), Err)
    }
}

/// Records one range read in the metrics: requests (attempts), latency, bytes by priority,
/// errors.
struct FetchObserver<'a> {
    metrics: &'a Metrics,
    prio: Priority,
}

impl ReadObserver for FetchObserver<'_> {
    fn on_read(&self, r: &ReadReport) {
        let m = self.metrics;
        m.range_requests
            .fetch_add(u64::from(r.attempts), Ordering::Relaxed);
        m.observe_fetch_latency(r.latency);
        if r.error.is_some() {
            m.range_request_errors.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let counter = match self.prio {
            Priority::Fill => &m.bytes_fetched_fill,
            Priority::Prefetch => &m.bytes_fetched_prefetch,
            Priority::OnDemand | Priority::ReadAhead => &m.bytes_fetched_on_demand,
        };
        counter.fetch_add(r.bytes, Ordering::Relaxed);
    }
}

impl FrameStore {
    /// A store over the two caches, with the default [`LinkPolicy`] and [`CpuPolicy`].
    pub fn new(l1: MemoryCache, l2: DiskCache, metrics: Arc<Metrics>, limits: PlanLimits) -> Self {
        FrameStore {
            l1,
            l2: Arc::new(l2),
            flight: SingleFlight::default(),
            metrics,
            limits,
            link: LinkScheduler::new(LinkPolicy::default()),
            cpu: CpuPolicy::default(),
            last_busy_ms: AtomicU64::new(0),
            last_read_ms: AtomicU64::new(0),
            open_until_ms: AtomicU64::new(0),
            last_log: LogLimit::default(),
            started: Instant::now(),
            request_bytes: AtomicU64::new(0),
            peers: OnceLock::new(),
        }
    }

    /// Ask `tier` for claimed misses of registry blobs before their source (once; a second
    /// call is ignored).
    pub fn set_peer_tier(&self, tier: Arc<dyn PeerTier>) {
        let _ = self.peers.set(tier);
    }

    /// The same store with link policy `policy`.
    pub fn with_link_policy(mut self, policy: LinkPolicy) -> Self {
        self.link = LinkScheduler::new(policy);
        self
    }

    /// The same store with background CPU policy `policy`.
    pub fn with_cpu_policy(mut self, policy: CpuPolicy) -> Self {
        self.cpu = policy;
        self
    }

    /// The node's link scheduler.
    pub fn link(&self) -> &LinkScheduler {
        &self.link
    }

    /// The background CPU policy.
    pub fn cpu_policy(&self) -> &CpuPolicy {
        &self.cpu
    }

    /// A FUSE read came now (the fill pauses while they keep coming).
    pub fn note_read(&self) {
        let now = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_read_ms.fetch_max(now, Ordering::Relaxed);
        self.note_busy();
    }

    /// Other processes kept the node's CPUs busy (see [`super::cpu::watch_cpu`]): the fill
    /// pauses as it does for a read.
    pub fn note_cpu_busy(&self) {
        self.metrics
            .cpu_busy_intervals
            .fetch_add(1, Ordering::Relaxed);
        self.note_busy();
    }

    fn note_busy(&self) {
        let now = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_busy_ms.fetch_max(now, Ordering::Relaxed);
    }

    /// The priority of background decodes now (normal inside the fill's unpaused window,
    /// see [`super::cpu::background_priority`]).
    pub fn background_priority(&self) -> CpuPriority {
        let open = Duration::from_millis(self.open_until_ms.load(Ordering::Relaxed));
        let read = Duration::from_millis(self.last_read_ms.load(Ordering::Relaxed));
        background_priority(self.started.elapsed(), open, read, &self.cpu)
    }

    /// Waits while the node's containers read through weenv or keep its CPUs busy, but
    /// leaves the fill its minimum share of a node that stays busy (see [`busy_step`]).
    pub async fn wait_not_busy(&self) {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let mut waited = Duration::ZERO;
        loop {
            let last = Duration::from_millis(self.last_busy_ms.load(Ordering::Relaxed));
            let open = Duration::from_millis(self.open_until_ms.load(Ordering::Relaxed));
            match busy_step(self.started.elapsed(), last, waited, open, &self.cpu) {
                BusyStep::Go => return,
                BusyStep::GoOpening(until) => {
                    self.open_until_ms.fetch_max(ms(until), Ordering::Relaxed);
                    self.metrics
                        .fill_share_windows
                        .fetch_add(1, Ordering::Relaxed);
                    return;
                }
                BusyStep::Wait(w) => {
                    tokio::time::sleep(w).await;
                    waited += w;
                }
            }
        }
    }

    /// Frames being fetched (claimed) now.
    #[cfg(test)]
    pub(crate) fn claimed(&self) -> usize {
        self.flight.len()
    }

    /// The disk cache.
    pub fn l2(&self) -> &DiskCache {
        &self.l2
    }

    /// The memory cache.
    pub fn l1(&self) -> &MemoryCache {
        &self.l1
    }

    /// Compressed bytes of the range requests in flight (held in memory until verified).
    pub fn in_flight_bytes(&self) -> u64 {
        self.request_bytes.load(Ordering::Relaxed)
    }

    /// The frame if it is cached (L1, then L2), counting hits and misses. Local I/O only.
    pub fn cached(&self, frame: &Frame) -> Option<Bytes> {
        if let Some(b) = self.l1.get(&frame.digest) {
            self.metrics.l1_hits.fetch_add(1, Ordering::Relaxed);
            return Some(b);
        }
        self.metrics.l1_misses.fetch_add(1, Ordering::Relaxed);
        match self.l2.get(&frame.digest, frame.ulen) {
            Ok(Some(b)) => {
                self.metrics.l2_hits.fetch_add(1, Ordering::Relaxed);
                self.l1.insert(frame.digest.clone(), b.clone());
                Some(b)
            }
            Ok(None) => {
                self.metrics.l2_misses.fetch_add(1, Ordering::Relaxed);
                None
            }
            Err(e) => {
                self.metrics.l2_misses.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, "disk cache read failed; fetching the frame again");
                None
            }
        }
    }

    /// A layer is about to be used: the fill counts its quiet time from now (the start-up
    /// prefetch does not: it is there to fetch while the container is being created).
    pub fn note_layer_added(&self) {
        self.link.note_layer_added();
    }

    /// Number of on-demand/read-ahead requests in flight (frames readers took included).
    pub fn demand_in_flight(&self) -> usize {
        self.link.demand_in_flight()
    }

    /// Compressed bytes of `idxs` not cached (what fetching them would move).
    pub(crate) fn missing_bytes(&self, frames: &[Frame], idxs: &[FrameIdx]) -> u64 {
        idxs.iter()
            .filter_map(|i| frames.get(i.0 as usize))
            .filter(|f| !self.l1.contains(&f.digest) && !self.l2.contains(&f.digest))
            .map(|f| f.clen)
            .sum()
    }

    fn frame(frames: &[Frame], idx: FrameIdx) -> Result<&Frame, FetchError> {
        frames.get(idx.0 as usize).ok_or(FetchError::BadFrameIndex {
            index: idx.0,
            frames: frames.len(),
        })
    }

    /// Have, fetch (claimed now, or taken out of a background call's queued request by an
    /// on-demand or read-ahead reader) or wait for `frame`. A background call (`promotion`) queues what it
    /// claims: readers may take it until its request is sent.
    fn plan_one(
        &self,
        frame: &Frame,
        prio: Priority,
        promotion: Option<&Arc<Promotion>>,
    ) -> Plan<'_> {
        let mut attempts = 0;
        loop {
            if let Some(b) = self.cached(frame) {
                return Plan::Have(b);
            }
            match self.flight.join(frame, prio, &self.link) {
                Joined::Take(claim, predicted) => {
                    self.metrics.link_promotions.fetch_add(1, Ordering::Relaxed);
                    return Plan::Take(claim, predicted);
                }
                Joined::Wait(rx, p) => return Plan::Wait(rx, p),
                Joined::Vacant(vacant) => {
                    // A fetch may have completed between the cache check and the lock (it
                    // caches, then releases its claim): look again rather than fetch twice.
                    // Lock order is always single flight -> cache, never the reverse.
                    attempts += 1;
                    if attempts < 2
                        && (self.l1.contains(&frame.digest) || self.l2.contains(&frame.digest))
                    {
                        drop(vacant);
                        continue;
                    }
                    return Plan::Fetch(vacant.claim(promotion));
                }
            }
        }
    }

    /// Frames `idxs` of a layer (`frames` from its TOC, `source` its blob), in order.
    /// A fill call first waits for the link to admit it (its frames are claimed after that);
    /// a prefetch call claims its frames, then waits (readers may take frames out of its
    /// queued requests); demand goes at once.
    pub async fn get_frames(
        &self,
        frames: &[Frame],
        source: &Arc<dyn RangeSource>,
        idxs: &[FrameIdx],
        prio: Priority,
    ) -> Result<Vec<Bytes>, FetchError> {
        let _fill_permit = match prio {
            Priority::Fill => match self.missing_bytes(frames, idxs) {
                0 => None,
                bytes => Some(self.link.background(Class::Fill, bytes).await),
            },
            _ => None,
        };
        // Readers may take frames out of a background call's queued requests, and raise the
        // CPU priority of the rest when they wait for one it is sending.
        let promotion = matches!(prio, Priority::Prefetch | Priority::Fill)
            .then(|| Arc::new(Promotion::default()));
        let mut out: Vec<Option<Bytes>> = vec![None; idxs.len()];
        loop {
            let mut claims: Vec<(usize, FrameIdx, Claim<'_>)> = Vec::new();
            // Only frames taken out of requests the link was about to send (predicted).
            let mut predicted = true;
            let mut waits: Vec<(usize, watch::Receiver<Slot>)> = Vec::new();
            for (i, idx) in idxs.iter().enumerate() {
                if out[i].is_some() {
                    continue;
                }
                let f = Self::frame(frames, *idx)?;
                match self.plan_one(f, prio, promotion.as_ref()) {
                    Plan::Have(b) => out[i] = Some(b),
                    Plan::Fetch(c) => {
                        predicted = false;
                        claims.push((i, *idx, c));
                    }
                    Plan::Take(c, p) => {
                        predicted &= p;
                        claims.push((i, *idx, c));
                    }
                    Plan::Wait(rx, p) => {
                        // A reader waits for a frame a background call is sending: the rest
                        // of that call decodes at normal priority.
                        if let (Priority::OnDemand, Some(p)) = (prio, p) {
                            p.raise();
                        }
                        waits.push((i, rx));
                    }
                }
            }
            let mut first_err = None;
            if !claims.is_empty() {
                let call = Call {
                    frames,
                    source,
                    prio,
                    promotion: promotion.as_deref(),
                };
                let fetched = self.fetch_claimed(&call, claims, predicted).await;
                for (i, r) in fetched {
                    match r {
                        Ok(b) => out[i] = Some(b),
                        Err(e) => first_err = first_err.or(Some(e)),
                    }
                }
            }
            for (i, mut rx) in waits {
                let r = rx
                    .wait_for(Option::is_some)
                    .await
                    .ok()
                    .and_then(|v| v.clone());
                match r {
                    Some(Ok(b)) => out[i] = Some(b),
                    Some(Err(e)) => first_err = first_err.or(Some(e)),
                    None => {} // claimer went away without a result: retry below.
                }
            }
            if let Some(e) = first_err {
                return Err(e);
            }
            if out.iter().all(Option::is_some) {
                return Ok(out.into_iter().flatten().collect());
            }
        }
    }

    async fn fetch_claimed<'a>(
        &'a self,
        call: &Call<'_>,
        claims: Vec<(usize, FrameIdx, Claim<'a>)>,
        predicted: bool,
    ) -> Fetched {
        // Demand goes at once (and holds background requests back while in flight; only
        // unpredicted demand starts their quiet time); a fill call holds its permit already;
        // prefetch requests queue per request (run_request).
        let _demand = matches!(call.prio, Priority::OnDemand | Priority::ReadAhead).then(|| {
            if predicted {
                self.metrics
                    .link_demand_predicted
                    .fetch_add(1, Ordering::Relaxed);
                self.link.demand_predicted()
            } else {
                self.metrics
                    .link_demand_unpredicted
                    .fetch_add(1, Ordering::Relaxed);
                self.link.demand()
            }
        });
        let mut by_idx: Claims<'a> = HashMap::new();
        for (i, idx, c) in claims {
            by_idx.entry(idx).or_default().push((i, c));
        }
        let (Some(tier), Some(blob)) = (self.peers.get(), call.source.locator()) else {
            return self.fetch_from_source(call, by_idx).await;
        };
        // Peer tier. A claim is never held while waiting for another node unless that node
        // owns the frame: frames this node owns are asked only of their previous owner's
        // cache (answered without waiting on any claim), then fetched from the source while
        // the other frames are asked of their owners, so two nodes waiting on each other's
        // claims cannot stall until the hedge delay.
        let (frames, prio) = (call.frames, call.prio);
        let mut out = Vec::new();
        // Asked of peers at once: no reader takes these frames meanwhile (those already taken
        // are the readers'); what the peers do not deliver is queued again below.
        if let Some(p) = call.promotion {
            Self::send_claimed(call, p, &mut by_idx);
        }
        let keys: Vec<FrameIdx> = by_idx.keys().copied().collect();
        let mine = tier.self_owned(frames, &keys);
        let got = tier.fetch(&blob, frames, &mine, prio).await;
        self.publish_peer_frames(call, got, &mut by_idx, &mut out);
        let ours: Claims<'a> = mine.iter().filter_map(|i| by_idx.remove_entry(i)).collect();
        let theirs: Vec<FrameIdx> = by_idx.keys().copied().collect();
        if let Some(p) = call.promotion {
            p.requeue(ours.keys().filter_map(|i| call.digest(*i)));
        }
        let (got, done) = futures::future::join(
            tier.fetch(&blob, frames, &theirs, prio),
            self.fetch_from_source(call, ours),
        )
        .await;
        out.extend(done);
        self.publish_peer_frames(call, got, &mut by_idx, &mut out);
        // What the owners did not deliver.
        if let Some(p) = call.promotion {
            p.requeue(by_idx.keys().filter_map(|i| call.digest(*i)));
        }
        out.extend(self.fetch_from_source(call, by_idx).await);
        out
    }

    /// Marks the claimed frames `by_idx` of background call `p` as being sent and drops those
    /// a reader took (their claims are the readers' now: dropping ours publishes nothing).
    fn send_claimed(call: &Call<'_>, p: &Promotion, by_idx: &mut Claims<'_>) {
        let kept: std::collections::HashSet<Digest> = p
            .send(by_idx.keys().filter_map(|i| call.digest(*i)))
            .into_iter()
            .collect();
        by_idx.retain(|i, _| call.digest(*i).is_some_and(|d| kept.contains(&d)));
    }

    /// Caches and publishes frames a peer tier returned (verified by the tier).
    fn publish_peer_frames<'a>(
        &'a self,
        call: &Call<'_>,
        got: Vec<(FrameIdx, Bytes)>,
        by_idx: &mut Claims<'a>,
        out: &mut Fetched,
    ) {
        for (idx, b) in got {
            if let (Some(f), Some(claims)) = (call.frames.get(idx.0 as usize), by_idx.remove(&idx))
            {
                self.keep(f, &b, call.prio);
                publish(claims, Ok(b), out);
            }
        }
    }

    /// Fetches the claimed frames `by_idx` from the call's source: coalesced range requests,
    /// at once.
    async fn fetch_from_source<'a>(&'a self, call: &Call<'_>, mut by_idx: Claims<'a>) -> Fetched {
        if by_idx.is_empty() {
            return Vec::new();
        }
        let mut wanted: Vec<FrameIdx> = by_idx.keys().copied().collect();
        wanted.sort_unstable();
        let plan = plan_fetch(call.frames, &wanted, self.limits);
        let mut jobs = Vec::new();
        for req in plan {
            let mut group = Vec::new();
            for idx in &req.frames {
                if let Some(v) = by_idx.remove(idx) {
                    group.push((*idx, v));
                }
            }
            jobs.push(self.run_request(call, req, group));
        }
        futures::future::join_all(jobs)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    /// Sends one planned range request: a prefetch request first waits for the link; a
    /// background call then sends only the frames no reader took meanwhile (re-planned without
    /// bridging holes, so no taken frame is fetched twice).
    async fn run_request<'a>(
        &'a self,
        call: &Call<'_>,
        req: RangeRequest,
        group: Vec<(FrameIdx, Vec<(usize, Claim<'a>)>)>,
    ) -> Fetched {
        let _prefetch_permit = match call.prio {
            Priority::Prefetch => {
                // One layer's requests form a group: a layer's TOC frames are one allocation
                // for as long as the layer is mounted, so its address names the layer.
                let group = call.frames.as_ptr() as usize as u64;
                let permit = self.link.queue_in(Class::Prefetch, req.len, group);
                if let Some(p) = call.promotion {
                    let digests = req.frames.iter().filter_map(|i| call.digest(*i));
                    p.queued_in(digests, permit.id());
                }
                self.link.admitted(&permit).await;
                Some(permit)
            }
            _ => None,
        };
        let Some(p) = call.promotion else {
            return self.read_request(call, req, group).await;
        };
        let mut by_idx: Claims<'a> = group.into_iter().collect();
        let before = by_idx.len();
        Self::send_claimed(call, p, &mut by_idx);
        if by_idx.len() == before {
            let group = req
                .frames
                .iter()
                .filter_map(|i| by_idx.remove_entry(i))
                .collect();
            return self.read_request(call, req, group).await;
        }
        let mut wanted: Vec<FrameIdx> = by_idx.keys().copied().collect();
        wanted.sort_unstable();
        let limits = PlanLimits {
            max_gap: 0,
            ..self.limits
        };
        let mut out = Vec::new();
        for req in plan_fetch(call.frames, &wanted, limits) {
            let group = req
                .frames
                .iter()
                .filter_map(|i| by_idx.remove_entry(i))
                .collect();
            out.extend(self.read_request(call, req, group).await);
        }
        out
    }

    /// Reads range `req` from the call's source, verifies and caches its frames, publishes
    /// them to their claims `group`.
    async fn read_request<'a>(
        &'a self,
        call: &Call<'_>,
        req: RangeRequest,
        group: Vec<(FrameIdx, Vec<(usize, Claim<'a>)>)>,
    ) -> Fetched {
        let (frames, source, prio) = (call.frames, call.source, call.prio);
        self.request_bytes.fetch_add(req.len, Ordering::Relaxed);
        let _in_flight = RequestBytes(&self.request_bytes, req.len);
        let range = ByteRange::new(req.offset, req.len);
        let check = FrameCheck {
            store: self,
            frames: group
                .iter()
                .filter_map(|(idx, _)| frames.get(idx.0 as usize).map(|f| (*idx, f)))
                .collect(),
            prio,
            promotion: call.promotion,
            state: Mutex::new(CheckState::default()),
        };
        let observer = FetchObserver {
            metrics: &self.metrics,
            prio,
        };
        let opts = ReadOpts {
            verify: Some(&check),
            observer: Some(&observer),
        };
        let layer = source.name();
        let t0 = std::time::Instant::now();
        let err = source
            .read_with(range, opts)
            .await
            .err()
            .map(|e| FetchError::source(layer.clone(), range, e));
        tracing::debug!(
            ?prio,
            offset = req.offset,
            bytes = req.len,
            frames = req.frames.len(),
            ms = t0.elapsed().as_secs_f64() * 1e3,
            ok = err.is_none(),
            "range request done"
        );
        let st = check.state.into_inner();
        if let Some(e) = &err {
            if st.bad.is_empty() && prio != Priority::Fill && self.may_log() {
                tracing::warn!(error = %e, "range request failed; reads of these frames get EIO (further errors this second not logged)");
            }
        }
        let mut out = Vec::new();
        for (idx, claims) in group {
            let r = match frames.get(idx.0 as usize) {
                None => Err(FetchError::BadFrameIndex {
                    index: idx.0,
                    frames: frames.len(),
                }),
                Some(f) => match (st.good.get(&idx), st.bad.get(&idx), st.failed.get(&idx)) {
                    (Some(b), first, _) => {
                        if let Some(first) = first {
                            if self.may_log() {
                                tracing::warn!(layer, frame = idx.0, digest = %f.digest, offset = f.offset, reason = first, "frame failed verification; the refetch verified and is served (further messages this second not logged)");
                            }
                        }
                        Ok(b.clone())
                    }
                    (None, _, Some(e)) => Err(e.clone()),
                    (None, Some(first), None) => {
                        if self.may_log() {
                            let second = err.as_ref().map(ToString::to_string);
                            tracing::error!(layer, frame = idx.0, digest = %f.digest, offset = f.offset, first, second, "frame failed verification, and again after a refetch; reads of it get EIO (further messages this second not logged)");
                        }
                        Err(FetchError::Verify {
                            layer: layer.clone(),
                            index: idx.0,
                            frame: f.digest.clone(),
                            offset: f.offset,
                            reason: first.clone(),
                        })
                    }
                    (None, None, None) => Err(err.clone().unwrap_or_else(|| {
                        FetchError::Stopped(format!("frame {} was not verified", idx.0))
                    })),
                },
            };
            publish(claims, r, &mut out);
        }
        out
    }

    /// Caches verified frame `f` (L2; L1 unless it is for the fill).
    fn keep(&self, f: &Frame, b: &Bytes, prio: Priority) {
        if let Err(e) = self.l2.put(&f.digest, b) {
            tracing::warn!(error = %e, "could not write frame to the disk cache");
        }
        self.keep_l1(f, b, prio);
    }

    /// Caches verified frame `f` in L1 unless it is for the fill.
    fn keep_l1(&self, f: &Frame, b: &Bytes, prio: Priority) {
        if prio != Priority::Fill {
            // The fill must not push the working set out of memory.
            self.l1.insert(f.digest.clone(), b.clone());
        }
    }

    /// Decode and verify frame `f` from `blob` (which starts at blob offset `base`); cache it
    /// if it verifies. A verification failure is counted, caches nothing and is `Bad`. The
    /// decode and the disk-cache write run on a blocking thread at `cpu` priority.
    async fn verify_and_cache(
        &self,
        f: &Frame,
        blob: &Bytes,
        base: u64,
        prio: Priority,
        (cpu, raise): (CpuPriority, Option<Arc<Raisable>>),
    ) -> Result<Bytes, Unverified> {
        let start = usize::try_from(f.offset.saturating_sub(base)).unwrap_or(usize::MAX);
        let end = start.saturating_add(usize::try_from(f.clen).unwrap_or(usize::MAX));
        let Some(compressed) = blob.get(start..end) else {
            return Err(Failed(FetchError::Stopped(format!(
                "frame at {} outside its request",
                f.offset
            ))));
        };
        let compressed = blob.slice_ref(compressed);
        let (frame, l2) = (f.clone(), self.l2.clone());
        let decoded = tokio::task::spawn_blocking(move || {
            let work = || {
                let b = weenv_format::frame::decode_frame(&frame, &compressed)
                    .map(Bytes::from)
                    .map_err(|e| e.to_string())?;
                if let Err(e) = l2.put(&frame.digest, &b) {
                    tracing::warn!(error = %e, "could not write frame to the disk cache");
                }
                Ok(b)
            };
            match raise {
                // A reader that starts waiting for this call raises this thread too.
                Some(r) => r.run(cpu, work),
                None => {
                    let _low = Lowered::enter(cpu);
                    work()
                }
            }
        })
        .await
        .map_err(|e| Failed(FetchError::Stopped(e.to_string())))?;
        match decoded {
            Ok(b) => {
                self.keep_l1(f, &b, prio);
                Ok(b)
            }
            Err(reason) => {
                self.metrics
                    .verification_failures
                    .fetch_add(1, Ordering::Relaxed);
                Err(Bad(reason))
            }
        }
    }

    /// True at most once per second (hot-path logs are rate-limited).
    fn may_log(&self) -> bool {
        self.last_log.allow()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fetch::testutil::{build_layer, noise, tar_of, MemSource, T};

    struct Fixture {
        _dir: tempfile::TempDir,
        store: Arc<FrameStore>,
        metrics: Arc<Metrics>,
        toc: weenv_format::Toc,
    }

    /// A layer of four ~4 KiB files, each in its own frame.
    fn fixture(dir: Option<tempfile::TempDir>) -> (Fixture, Vec<u8>) {
        let files: Vec<(String, Vec<u8>)> =
            (0..4).map(|i| (format!("f{i}"), noise(i, 3000))).collect();
        let entries: Vec<T<'_>> = files.iter().map(|(p, d)| T::File(p, d.clone())).collect();
        let (_, toc, blob) = build_layer(&tar_of(&entries), 4096);
        let dir = dir.unwrap_or_else(|| tempfile::tempdir().unwrap());
        let metrics = Arc::new(Metrics::new());
        let l2 = DiskCache::open(dir.path(), 1 << 30, metrics.clone()).unwrap();
        let limits = PlanLimits {
            max_gap: 0,
            max_request: 1 << 20,
        };
        let store = Arc::new(FrameStore::new(
            MemoryCache::new(1 << 20),
            l2,
            metrics.clone(),
            limits,
        ));
        (
            Fixture {
                _dir: dir,
                store,
                metrics,
                toc,
            },
            blob,
        )
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_misses_cause_one_fetch() {
        let (fx, blob) = fixture(None);
        let (src, gate) = MemSource::gated(blob);
        let dyn_src: Arc<dyn RangeSource> = src.clone();
        let frames = Arc::new(fx.toc.frames.clone());
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let (store, frames, s) = (fx.store.clone(), frames.clone(), dyn_src.clone());
            tasks.push(tokio::spawn(async move {
                store
                    .get_frames(&frames, &s, &[FrameIdx(0)], Priority::OnDemand)
                    .await
            }));
        }
        // Wait until the one fetch is in flight, then let it finish.
        while src.requests().is_empty() {
            tokio::task::yield_now().await;
        }
        gate.add_permits(100);
        let mut results = Vec::new();
        for t in tasks {
            results.push(t.await.unwrap().unwrap());
        }
        assert_eq!(
            src.requests().len(),
            1,
            "one range request for eight readers"
        );
        assert!(results.iter().all(|r| r[0] == results[0][0]));
        assert!(fx.store.claimed() == 0);
    }

    #[tokio::test]
    async fn adjacent_misses_are_coalesced() {
        let (fx, blob) = fixture(None);
        let src = MemSource::new(blob);
        let s: Arc<dyn RangeSource> = src.clone();
        let n = fx.toc.frames.len() as u32;
        assert!(n >= 4, "fixture has {n} frames");
        let want: Vec<FrameIdx> = (0..n).map(FrameIdx).collect();
        let got = fx
            .store
            .get_frames(&fx.toc.frames, &s, &want, Priority::OnDemand)
            .await
            .unwrap();
        assert_eq!(got.len(), want.len());
        let reqs = src.requests();
        assert_eq!(reqs.len(), 1, "all frames in one request: {reqs:?}");
        let last = &fx.toc.frames[n as usize - 1];
        assert_eq!(reqs[0], (0, last.offset + last.clen));
        // Everything is cached now.
        fx.store
            .get_frames(&fx.toc.frames, &s, &want, Priority::OnDemand)
            .await
            .unwrap();
        assert_eq!(src.requests().len(), 1);
    }

    #[tokio::test]
    async fn tampered_frame_is_never_served_or_cached_and_repair_works() {
        let (fx, blob) = fixture(None);
        let src = MemSource::new(blob.clone());
        let s: Arc<dyn RangeSource> = src.clone();
        let f1 = fx.toc.frames[1].clone();
        let at = (f1.offset + f1.clen / 2) as usize;
        src.data.lock()[at] ^= 0x55;
        let err = fx
            .store
            .get_frames(&fx.toc.frames, &s, &[FrameIdx(1)], Priority::OnDemand)
            .await
            .unwrap_err();
        assert!(matches!(err, FetchError::Verify { index: 1, .. }), "{err}");
        assert!(!fx.store.l1().contains(&f1.digest));
        assert!(!fx.store.l2().contains(&f1.digest));
        // Fetched, refetched once, both bad.
        assert_eq!(fx.metrics.verification_failures.load(Ordering::Relaxed), 2);
        assert_eq!(src.requests().len(), 2);
        // Still bad: fetched again, fails again.
        assert!(fx
            .store
            .get_frames(&fx.toc.frames, &s, &[FrameIdx(1)], Priority::OnDemand)
            .await
            .is_err());
        src.data.lock()[at] ^= 0x55;
        let ok = fx
            .store
            .get_frames(&fx.toc.frames, &s, &[FrameIdx(1)], Priority::OnDemand)
            .await
            .unwrap();
        assert_eq!(ok[0].len() as u64, f1.ulen);
        assert_eq!(src.requests().len(), 5);
        assert!(fx.store.l2().contains(&f1.digest));
    }

    #[tokio::test]
    async fn corrupt_bytes_once_are_refetched_bypassing_caches_and_the_read_succeeds() {
        use crate::fetch::testutil::CorruptFirst;
        let (fx, blob) = fixture(None);
        let good = blob.clone();
        let src = CorruptFirst::new(MemSource::new(blob), 1);
        let s: Arc<dyn RangeSource> = src.clone();
        let f1 = fx.toc.frames[1].clone();
        let got = fx
            .store
            .get_frames(&fx.toc.frames, &s, &[FrameIdx(1)], Priority::OnDemand)
            .await
            .unwrap();
        let want = weenv_format::frame::decode_frame(
            &f1,
            &good[f1.offset as usize..(f1.offset + f1.clen) as usize],
        )
        .unwrap();
        assert_eq!(&got[0][..], &want[..], "the verified refetch is served");
        assert_eq!(*src.fresh.lock(), vec![false, true], "one refetch, fresh");
        assert_eq!(fx.metrics.verification_failures.load(Ordering::Relaxed), 1);
        assert!(
            fx.store.l2().contains(&f1.digest),
            "the good frame is cached"
        );

        // Bad twice: EIO (a Verify error), nothing cached, exactly one refetch.
        let (fx, blob) = fixture(None);
        let src = CorruptFirst::new(MemSource::new(blob), 2);
        let s: Arc<dyn RangeSource> = src.clone();
        let err = fx
            .store
            .get_frames(&fx.toc.frames, &s, &[FrameIdx(1)], Priority::OnDemand)
            .await
            .unwrap_err();
        assert_eq!(err.errno(), fuser::Errno::EIO);
        let msg = err.to_string();
        assert!(
            msg.contains("frame 1") && msg.contains("corrupt-first"),
            "{msg}"
        );
        assert_eq!(*src.fresh.lock(), vec![false, true]);
        assert!(!fx.store.l1().contains(&f1.digest) && !fx.store.l2().contains(&f1.digest));
        // The next read fetches again and succeeds.
        fx.store
            .get_frames(&fx.toc.frames, &s, &[FrameIdx(1)], Priority::OnDemand)
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn disk_cache_survives_a_new_store_and_fill_skips_l1() {
        let (fx, blob) = fixture(None);
        let s: Arc<dyn RangeSource> = MemSource::new(blob.clone());
        fx.store
            .get_frames(&fx.toc.frames, &s, &[FrameIdx(2)], Priority::Fill)
            .await
            .unwrap();
        assert!(
            !fx.store.l1().contains(&fx.toc.frames[2].digest),
            "fill does not fill L1"
        );
        let Fixture { _dir, .. } = fx;
        let (fx2, _) = fixture(Some(_dir));
        let src2 = MemSource::new(blob);
        let s2: Arc<dyn RangeSource> = src2.clone();
        fx2.store
            .get_frames(&fx2.toc.frames, &s2, &[FrameIdx(2)], Priority::OnDemand)
            .await
            .unwrap();
        assert!(src2.requests().is_empty(), "served from L2 after restart");
        assert_eq!(fx2.metrics.l2_hits.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn source_errors_fail_the_read_and_are_retried() {
        let (fx, blob) = fixture(None);
        let src = MemSource::new(Vec::new()); // every range is past the end
        let s: Arc<dyn RangeSource> = src.clone();
        let both = [FrameIdx(0), FrameIdx(1)];
        let get = || {
            fx.store
                .get_frames(&fx.toc.frames, &s, &both, Priority::OnDemand)
        };
        let err = get().await.unwrap_err();
        assert!(matches!(err, FetchError::Source { .. }), "{err}");
        assert!(fx.store.claimed() == 0, "claims released");
        assert_eq!(fx.metrics.range_request_errors.load(Ordering::Relaxed), 1);
        *src.data.lock() = blob;
        let ok = get().await.unwrap();
        assert_eq!(ok.len(), 2);
        assert_eq!(src.requests().len(), 2);
    }

    #[tokio::test]
    async fn a_bad_frame_in_a_coalesced_range_refetches_the_range_once_and_serves_the_good_ones() {
        use crate::fetch::testutil::CorruptFirst;
        let (fx, blob) = fixture(None);
        let n = fx.toc.frames.len();
        let mid_frame = fx
            .toc
            .frames
            .iter()
            .position(|f| {
                let mid = (fx.toc.frames[n - 1].offset + fx.toc.frames[n - 1].clen) / 2;
                f.offset <= mid && mid < f.offset + f.clen
            })
            .unwrap();
        // the corrupt byte sits in the middle of the one coalesced request, twice
        let src = CorruptFirst::new(MemSource::new(blob), 2);
        let s: Arc<dyn RangeSource> = src.clone();
        let want: Vec<FrameIdx> = (0..n as u32).map(FrameIdx).collect();
        let err = fx
            .store
            .get_frames(&fx.toc.frames, &s, &want, Priority::OnDemand)
            .await
            .unwrap_err();
        assert!(
            matches!(err, FetchError::Verify { index, .. } if index as usize == mid_frame),
            "{err}"
        );
        assert_eq!(*src.fresh.lock(), vec![false, true], "one refetch, fresh");
        assert_eq!(fx.metrics.range_requests.load(Ordering::Relaxed), 2);
        for (i, f) in fx.toc.frames.iter().enumerate() {
            assert_eq!(
                fx.store.l2().contains(&f.digest),
                i != mid_frame,
                "frame {i}"
            );
        }
        // the next read fetches only the bad frame, and it verifies now
        src.inner.log.lock().clear();
        let got = fx
            .store
            .get_frames(&fx.toc.frames, &s, &want, Priority::OnDemand)
            .await
            .unwrap();
        assert_eq!(got.len(), n);
        let f = &fx.toc.frames[mid_frame];
        assert_eq!(src.inner.requests(), vec![(f.offset, f.clen)]);
    }
}
