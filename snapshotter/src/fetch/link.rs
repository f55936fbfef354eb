//! The registry link's scheduler: on-demand reads first, background work (start-up prefetch,
//! fill) below them, node-wide (every layer's requests share the node's link).
//!
//! Policy ([`LinkQueue`], pure; time is passed in):
//! - **demand** (a FUSE read waiting, read-ahead) is never queued: it is sent at once and
//!   counted in flight;
//! - **background** requests wait in one queue, prefetch before fill, FIFO within a class.
//!   The head is sent only when (1) no demand request is in flight, (2) its class's quiet time
//!   since the last demand activity has passed (`prefetch_quiet`, `fill_quiet`: a program
//!   starting up misses, computes a few ms, misses again; a background request sent into such
//!   a gap delays the next miss), (3) the background bytes in flight plus its own stay within
//!   `background_bytes` (a request alone may exceed it) and (4) its class has fewer than its
//!   cap in flight. Nothing behind a waiting head is sent (strict priority). So a demand read
//!   shares the link with at most `background_bytes` of background requests, all sent before
//!   it started;
//! - **carving** (single flight): a demand read that wants a frame claimed by a background
//!   call whose request is not on the wire yet *takes* that frame ([`Carve`]): the reader
//!   fetches just that frame itself, as demand, and the background request sends only the
//!   frames left when the link admits it. A reader never waits for a queued background
//!   request, nor for bytes it did not ask for (a start-up profile recorded for another command
//!   names the frames this command reads, in another order, in batches). A frame whose request
//!   is on the wire already is waited for (its decode is raised to normal CPU priority,
//!   [`Promotion::raise`]). Background requests wait while a carved read is in flight. After
//!   it, the quiet time starts unless the read was *predicted*: its request had no more than
//!   `follow_bytes` still to send queued before it among the requests of its own layer
//!   ([`LinkQueue::predicted`]; frames readers took no longer count, [`LinkQueue::took`]):
//!   the reader's command follows the profile (the one it was recorded for), just ahead of
//!   the prefetch, which goes on; a read far down its layer's
//!   queue comes from a command reading in another order (a profile recorded for another
//!   command), and the prefetch pauses for it like for any unpredicted read. Layers are
//!   counted apart because a profile is stored per layer: each layer's part is queued when
//!   the layer is mounted (bottom layer first), so a command that reads two layers in turn
//!   (python's standard library below, a harness venv above) reads the upper layer's part
//!   while the lower one's is still queued ahead of it, in the profile's order all the same.
//!
//! [`LinkScheduler`] is the async shell: waiters pump the queue themselves (on every change
//! and when a quiet time ends), permits release on drop (also when a waiter is cancelled).

use super::cpu::Raisable;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use weenv_format::Digest;

/// Background request classes, in priority order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Class {
    /// Start-up prefetch of an image's profile.
    Prefetch,
    /// Background fill of whole layers.
    Fill,
}

/// Limits of the background classes on the link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkPolicy {
    /// Background bytes in flight at most (a single larger request may go alone).
    pub background_bytes: u64,
    /// A reader taking a frame out of a queued request follows the prefetch
    /// ([`LinkQueue::predicted`]) if at most this many bytes of its layer are still to be
    /// sent before that request.
    pub follow_bytes: u64,
    /// Prefetch waits this long after the last demand activity.
    pub prefetch_quiet: Duration,
    /// Fill waits this long after the last demand activity.
    pub fill_quiet: Duration,
    /// Prefetch requests in flight at most.
    pub prefetch_concurrency: usize,
    /// Fill requests in flight at most.
    pub fill_concurrency: usize,
}

impl Default for LinkPolicy {
    fn default() -> Self {
        LinkPolicy {
            background_bytes: 4 << 20,
            follow_bytes: 1 << 20,
            prefetch_quiet: Duration::from_millis(100),
            fill_quiet: Duration::from_millis(1000),
            prefetch_concurrency: 4,
            fill_concurrency: 2,
        }
    }
}

impl LinkPolicy {
    /// A reader with `ahead` bytes of its group still to be sent before its request follows
    /// the prefetch (see [`LinkQueue::predicted`]).
    fn follows(&self, ahead: Option<u64>) -> bool {
        ahead.is_some_and(|a| a <= self.follow_bytes)
    }
    fn quiet(&self, c: Class) -> Duration {
        match c {
            Class::Prefetch => self.prefetch_quiet,
            Class::Fill => self.fill_quiet,
        }
    }
    fn cap(&self, c: Class) -> usize {
        match c {
            Class::Prefetch => self.prefetch_concurrency,
            Class::Fill => self.fill_concurrency,
        }
        .max(1)
    }
}

/// A background request's id.
pub type TicketId = u64;

/// Where a background request is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TicketState {
    /// Waiting in the queue.
    Queued,
    /// Admitted as background.
    Running,
}

/// What one pump admitted, and when to pump again if the head waits for a quiet time.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Pump {
    pub admitted: Vec<TicketId>,
    pub recheck_in: Option<Duration>,
}

/// A queued background request: bytes still to send (less what readers took), and its group
/// (one layer's prefetch requests, [`LinkQueue::enqueue_in`]).
#[derive(Debug, Clone, Copy)]
struct Queued {
    bytes: u64,
    group: Option<u64>,
}

/// The link's state: demand in flight, background queued and in flight. Pure.
#[derive(Debug, Default)]
pub struct LinkQueue {
    demand: usize,
    last_demand: Duration,
    /// When a layer was last added ([`LinkQueue::note_layer_added`]).
    last_added: Duration,
    queue: BTreeMap<(Class, TicketId), Queued>,
    running: HashMap<TicketId, (Class, u64)>,
    next: TicketId,
}

impl LinkQueue {
    /// Demand activity at `now` (a fetch started or ended, or a layer is about to be used).
    pub fn note_demand(&mut self, now: Duration) {
        self.last_demand = self.last_demand.max(now);
    }

    /// A layer was added at `now`: its first reads are coming. The fill counts its quiet time
    /// from here; the start-up prefetch does not (it exists to fetch the profile's frames
    /// while containerd creates the container, before those reads).
    pub fn note_layer_added(&mut self, now: Duration) {
        self.last_added = self.last_added.max(now);
    }

    /// A demand request is sent at `now`.
    pub fn demand_started(&mut self, now: Duration) {
        self.demand += 1;
        self.note_demand(now);
    }

    /// A demand request ended at `now`.
    pub fn demand_ended(&mut self, now: Duration) {
        self.demand = self.demand.saturating_sub(1);
        self.note_demand(now);
    }

    /// A predicted demand request is sent: frames a reader took out of a background request
    /// the link was about to send ([`LinkQueue::predicted`]). Background requests wait for it,
    /// but it starts no quiet time: the prefetch is just behind its command, and goes on.
    pub fn predicted_started(&mut self) {
        self.demand += 1;
    }

    /// A predicted demand request ended.
    pub fn predicted_ended(&mut self) {
        self.demand = self.demand.saturating_sub(1);
    }

    /// Whether a reader taking frames out of queued request `id` follows the background work
    /// (the command the profile was recorded for, reading in its order): no more than
    /// `follow_bytes` of background requests of its own group (layer) are still to be sent
    /// before it. A command that reads in the profile's order has taken (or had sent)
    /// everything before its read, however far behind the prefetch fell, so only what it
    /// skipped counts. Far ahead of what its group still sends, the reader's command reads in
    /// another order (a profile recorded for another command): its reads are demand like any
    /// other.
    pub fn predicted(&self, id: TicketId, p: &LinkPolicy) -> bool {
        p.follows(self.ahead(id))
    }

    /// Bytes of its group still to be sent before queued request `id` (`None`: not queued).
    pub fn ahead(&self, id: TicketId) -> Option<u64> {
        let (&(class, _), me) = self.queue.iter().find(|((_, i), _)| *i == id)?;
        Some(
            self.queue
                .range(..(class, id))
                .filter(|(_, q)| q.group == me.group)
                .map(|(_, q)| q.bytes)
                .sum(),
        )
    }

    /// Demand requests in flight.
    pub fn demand_in_flight(&self) -> usize {
        self.demand
    }

    /// Background bytes in flight.
    pub fn background_bytes(&self) -> u64 {
        self.running.values().map(|(_, b)| b).sum()
    }

    /// Queues a background request of `bytes`.
    pub fn enqueue(&mut self, class: Class, bytes: u64) -> TicketId {
        self.push(class, Queued { bytes, group: None })
    }

    fn push(&mut self, class: Class, q: Queued) -> TicketId {
        self.next += 1;
        self.queue.insert((class, self.next), q);
        self.next
    }

    /// A reader took `bytes` (a frame) out of queued request `id`: the request sends that
    /// much less (a request every frame of which was taken sends nothing).
    pub fn took(&mut self, id: TicketId, bytes: u64) {
        if let Some((_, q)) = self.queue.iter_mut().find(|((_, i), _)| *i == id) {
            q.bytes = q.bytes.saturating_sub(bytes);
        }
    }

    /// Queues a background request of `bytes` for `group` (one layer's requests: see
    /// [`LinkQueue::predicted`]).
    pub fn enqueue_in(&mut self, class: Class, bytes: u64, group: u64) -> TicketId {
        let group = Some(group);
        self.push(class, Queued { bytes, group })
    }

    /// Where request `id` is (`None`: released or unknown).
    pub fn state(&self, id: TicketId) -> Option<TicketState> {
        if self.running.contains_key(&id) {
            Some(TicketState::Running)
        } else if self.queue.keys().any(|(_, i)| *i == id) {
            Some(TicketState::Queued)
        } else {
            None
        }
    }

    /// Request `id` ended (or its waiter went away): queued or running.
    pub fn release(&mut self, id: TicketId) {
        if self.running.remove(&id).is_none() {
            self.queue.retain(|(_, i), _| *i != id);
        }
    }

    /// Admits queued requests in order while the policy allows (see the module docs).
    pub fn pump(&mut self, now: Duration, p: &LinkPolicy) -> Pump {
        let mut out = Pump::default();
        if self.demand > 0 {
            return out;
        }
        while let Some((&(class, id), &Queued { bytes, .. })) = self.queue.iter().next() {
            let since = match class {
                Class::Prefetch => self.last_demand,
                Class::Fill => self.last_demand.max(self.last_added),
            };
            let quiet_end = since + p.quiet(class);
            if now < quiet_end {
                out.recheck_in = Some(quiet_end - now);
                break;
            }
            let in_flight = self.background_bytes();
            if !self.running.is_empty() && in_flight.saturating_add(bytes) > p.background_bytes {
                break;
            }
            if self.running.values().filter(|(c, _)| *c == class).count() >= p.cap(class) {
                break;
            }
            self.queue.remove(&(class, id));
            self.running.insert(id, (class, bytes));
            out.admitted.push(id);
        }
        out
    }
}

/// Where a frame claimed by a background call is (see [`Carve`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// Claimed, its request not sent yet: a reader may take it.
    Queued,
    /// Its request is being sent (or asked of peers): readers wait for it.
    Sending,
    /// A reader took it: the reader fetches it, the call leaves it out.
    Taken,
}

/// The frames of one background call (keys `K`), and which of them readers took out of its
/// queued requests. Pure. Every frame is fetched once: by the call (`send` returned it) or by
/// the reader that took it (`take` returned true), never both, since only a queued frame can
/// be taken or sent.
#[derive(Debug)]
pub struct Carve<K> {
    parts: HashMap<K, Part>,
    /// The queued request holding each frame.
    tickets: HashMap<K, TicketId>,
}

impl<K> Default for Carve<K> {
    fn default() -> Self {
        Carve {
            parts: HashMap::new(),
            tickets: HashMap::new(),
        }
    }
}

impl<K: Eq + Hash + Clone> Carve<K> {
    /// The call claimed `k` and will send it later.
    pub fn queue(&mut self, k: K) {
        self.parts.insert(k, Part::Queued);
    }

    /// A reader wants `k`: true if it takes it (queued, so nothing is on the wire for it);
    /// false if the call sends it already (wait for it) or `k` is not the call's.
    pub fn take(&mut self, k: &K) -> bool {
        match self.parts.get_mut(k) {
            Some(p @ Part::Queued) => {
                *p = Part::Taken;
                true
            }
            _ => false,
        }
    }

    /// The call sends `ks` now: which of them are still its to send (in order); the others
    /// were taken.
    pub fn send(&mut self, ks: impl IntoIterator<Item = K>) -> Vec<K> {
        ks.into_iter()
            .filter(|k| match self.parts.get_mut(k) {
                Some(Part::Taken) => false,
                Some(p) => {
                    *p = Part::Sending;
                    true
                }
                None => {
                    self.parts.insert(k.clone(), Part::Sending);
                    true
                }
            })
            .collect()
    }

    /// The call sent `ks` without getting them (peers did not have them) and queues them
    /// again: readers may take them until it sends them.
    pub fn requeue(&mut self, ks: impl IntoIterator<Item = K>) {
        for k in ks {
            if let Some(p @ Part::Sending) = self.parts.get_mut(&k) {
                *p = Part::Queued;
            }
        }
    }

    /// Where `k` is.
    pub fn part(&self, k: &K) -> Option<Part> {
        self.parts.get(k).copied()
    }

    /// `ks` wait in queued request `id`.
    pub fn queued_in(&mut self, ks: impl IntoIterator<Item = K>, id: TicketId) {
        for k in ks {
            self.tickets.insert(k, id);
        }
    }

    /// The queued request `k` waits in, if known.
    pub fn ticket(&self, k: &K) -> Option<TicketId> {
        self.tickets.get(k).copied()
    }
}

/// A background (prefetch, fill) call as readers see it: frames they may take out of its
/// queued requests ([`Carve`], keyed by frame digest), and whether a reader waits for a frame
/// it is sending (then the rest of the call decodes at normal CPU priority).
#[derive(Debug, Default)]
pub struct Promotion {
    raised: AtomicBool,
    carve: Mutex<Carve<Digest>>,
    /// The threads decoding this call's frames at a lowered priority (raised with it).
    decoders: Arc<Raisable>,
}

impl Promotion {
    /// A reader waits for this call's frames: decode them at normal priority.
    pub fn promoted(&self) -> bool {
        self.raised.load(Ordering::Relaxed)
    }

    /// A reader waits for a frame this call is sending: the rest of the call, and the
    /// decodes running now, go at normal priority. True the first time.
    pub fn raise(&self) -> bool {
        let first = !self.raised.swap(true, Ordering::Relaxed);
        if first {
            self.decoders.raise();
        }
        first
    }

    /// Where this call's lowered decodes register (see [`Raisable::run`]).
    pub fn decoders(&self) -> Arc<Raisable> {
        self.decoders.clone()
    }

    /// See [`Carve::queue`].
    pub fn queue(&self, k: Digest) {
        self.carve.lock().queue(k);
    }

    /// See [`Carve::take`]; with the queued request `k` waited in, if known.
    pub fn take(&self, k: &Digest) -> Option<Option<TicketId>> {
        let mut c = self.carve.lock();
        c.take(k).then(|| c.ticket(k))
    }

    /// See [`Carve::queued_in`].
    pub fn queued_in(&self, ks: impl IntoIterator<Item = Digest>, id: TicketId) {
        self.carve.lock().queued_in(ks, id);
    }

    /// See [`Carve::send`].
    pub fn send(&self, ks: impl IntoIterator<Item = Digest>) -> Vec<Digest> {
        self.carve.lock().send(ks)
    }

    /// See [`Carve::requeue`].
    pub fn requeue(&self, ks: impl IntoIterator<Item = Digest>) {
        self.carve.lock().requeue(ks);
    }
}

/// The node's link scheduler (the async shell over [`LinkQueue`]).
pub struct LinkScheduler {
    q: Mutex<LinkQueue>,
    policy: LinkPolicy,
    started: Instant,
    changed: Notify,
}

/// A demand request in flight; ends on drop.
pub struct DemandPermit<'a>(&'a LinkScheduler, bool);

impl Drop for DemandPermit<'_> {
    fn drop(&mut self) {
        let now = self.0.now();
        if self.1 {
            self.0.q.lock().predicted_ended();
        } else {
            self.0.q.lock().demand_ended(now);
        }
        self.0.changed.notify_waiters();
    }
}

/// A background request's place on the link (queued until [`LinkScheduler::background`]
/// returns it); releases on drop.
pub struct BgPermit<'a> {
    sched: &'a LinkScheduler,
    id: TicketId,
}

impl BgPermit<'_> {
    /// The request's id.
    pub fn id(&self) -> TicketId {
        self.id
    }
}

impl Drop for BgPermit<'_> {
    fn drop(&mut self) {
        self.sched.q.lock().release(self.id);
        self.sched.changed.notify_waiters();
    }
}

impl LinkScheduler {
    /// A scheduler with `policy`.
    pub fn new(policy: LinkPolicy) -> Self {
        LinkScheduler {
            q: Mutex::new(LinkQueue::default()),
            policy,
            started: Instant::now(),
            changed: Notify::new(),
        }
    }

    fn now(&self) -> Duration {
        self.started.elapsed()
    }

    /// A layer was added now ([`LinkQueue::note_layer_added`]).
    pub fn note_layer_added(&self) {
        let now = self.now();
        self.q.lock().note_layer_added(now);
    }

    /// Demand requests in flight.
    pub fn demand_in_flight(&self) -> usize {
        self.q.lock().demand_in_flight()
    }

    /// Sends a demand request now: hold the permit while it is in flight.
    pub fn demand(&self) -> DemandPermit<'_> {
        let now = self.now();
        self.q.lock().demand_started(now);
        DemandPermit(self, false)
    }

    /// Sends a predicted demand request now (see [`LinkQueue::predicted_started`]).
    pub fn demand_predicted(&self) -> DemandPermit<'_> {
        self.q.lock().predicted_started();
        DemandPermit(self, true)
    }

    /// A reader took a frame of `bytes` out of queued request `id`: whether that is predicted
    /// demand ([`LinkQueue::took`], [`LinkQueue::predicted`]).
    pub fn take(&self, id: TicketId, bytes: u64) -> bool {
        let ahead = {
            let mut q = self.q.lock();
            q.took(id, bytes);
            q.ahead(id)
        };
        let predicted = self.policy.follows(ahead);
        tracing::debug!(
            id,
            ?ahead,
            predicted,
            "a reader took a frame out of a queued request"
        );
        predicted
    }

    /// Waits until a background request of `bytes` and `class` may be sent; hold the permit
    /// while it is in flight.
    pub async fn background(&self, class: Class, bytes: u64) -> BgPermit<'_> {
        let permit = self.queue(class, bytes);
        self.admitted(&permit).await;
        permit
    }

    /// Queues a background request of `bytes` and `class` (its place: the permit).
    pub fn queue(&self, class: Class, bytes: u64) -> BgPermit<'_> {
        BgPermit {
            sched: self,
            id: self.q.lock().enqueue(class, bytes),
        }
    }

    /// Queues a background request of `bytes` and `class` for `group` (one layer's requests,
    /// see [`LinkQueue::predicted`]).
    pub fn queue_in(&self, class: Class, bytes: u64, group: u64) -> BgPermit<'_> {
        BgPermit {
            sched: self,
            id: self.q.lock().enqueue_in(class, bytes, group),
        }
    }

    /// Waits until queued request `permit` may be sent.
    pub async fn admitted(&self, permit: &BgPermit<'_>) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let now = self.now();
            let (state, pump) = {
                let mut q = self.q.lock();
                let pump = q.pump(now, &self.policy);
                (q.state(permit.id), pump)
            };
            if pump.admitted.iter().any(|id| *id != permit.id) {
                self.changed.notify_waiters();
            }
            match state {
                Some(TicketState::Queued) => {}
                _ => return,
            }
            match pump.recheck_in {
                Some(d) => {
                    tokio::select! {
                        () = &mut changed => {}
                        () = tokio::time::sleep(d.max(Duration::from_millis(1))) => {}
                    }
                }
                None => changed.await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    fn policy() -> LinkPolicy {
        LinkPolicy {
            background_bytes: 10,
            follow_bytes: 10,
            prefetch_quiet: MS(100),
            fill_quiet: MS(1000),
            prefetch_concurrency: 4,
            fill_concurrency: 2,
        }
    }

    #[test]
    fn prefetch_goes_before_fill_and_in_order() {
        let mut q = LinkQueue::default();
        let f1 = q.enqueue(Class::Fill, 1);
        let p1 = q.enqueue(Class::Prefetch, 2);
        let p2 = q.enqueue(Class::Prefetch, 3);
        let pump = q.pump(MS(5000), &policy());
        assert_eq!(pump.admitted, vec![p1, p2, f1]);
        assert_eq!(q.background_bytes(), 6);
    }

    #[test]
    fn nothing_is_sent_while_demand_is_in_flight_nor_during_the_quiet_time() {
        let p = policy();
        let mut q = LinkQueue::default();
        let id = q.enqueue(Class::Prefetch, 1);
        q.demand_started(MS(1000));
        assert_eq!(q.pump(MS(5000), &p), Pump::default(), "demand in flight");
        q.demand_ended(MS(5000));
        let pump = q.pump(MS(5040), &p);
        assert!(pump.admitted.is_empty());
        assert_eq!(pump.recheck_in, Some(MS(60)), "prefetch quiet left");
        assert_eq!(q.pump(MS(5100), &p).admitted, vec![id]);
        // The fill waits its own, longer quiet time.
        let f = q.enqueue(Class::Fill, 1);
        assert_eq!(q.pump(MS(5200), &p).recheck_in, Some(MS(800)));
        assert_eq!(q.pump(MS(6000), &p).admitted, vec![f]);
    }

    #[test]
    fn background_bytes_in_flight_are_bounded_but_a_big_request_may_go_alone() {
        let p = policy();
        let mut q = LinkQueue::default();
        let big = q.enqueue(Class::Prefetch, 25);
        let small = q.enqueue(Class::Prefetch, 1);
        assert_eq!(
            q.pump(MS(5000), &p).admitted,
            vec![big],
            "alone over the bound"
        );
        assert!(q.pump(MS(5000), &p).admitted.is_empty());
        q.release(big);
        let a = q.enqueue(Class::Prefetch, 4);
        let b = q.enqueue(Class::Prefetch, 6);
        assert_eq!(q.pump(MS(5000), &p).admitted, vec![small, a]);
        assert_eq!(q.background_bytes(), 5);
        assert!(q.pump(MS(5000), &p).admitted.is_empty(), "5 + 6 > 10");
        q.release(small);
        assert_eq!(q.pump(MS(5000), &p).admitted, vec![b]);
    }

    #[test]
    fn class_caps_and_strict_order() {
        let p = LinkPolicy {
            background_bytes: u64::MAX,
            ..policy()
        };
        let mut q = LinkQueue::default();
        let f: Vec<_> = (0..3).map(|_| q.enqueue(Class::Fill, 1)).collect();
        assert_eq!(q.pump(MS(5000), &p).admitted, f[..2].to_vec());
        // A prefetch queued later still goes first, past the fill's cap.
        let pf = q.enqueue(Class::Prefetch, 1);
        assert_eq!(q.pump(MS(5000), &p).admitted, vec![pf]);
        q.release(f[0]);
        assert_eq!(q.pump(MS(5000), &p).admitted, vec![f[2]]);
    }

    #[test]
    fn a_reader_takes_only_queued_frames_and_the_call_sends_the_rest() {
        let mut c: Carve<u32> = Carve::default();
        for k in 1..=4 {
            c.queue(k);
        }
        // A reader takes frame 3 out of the queued batch: only it, at once.
        assert!(c.take(&3));
        assert_eq!(c.part(&3), Some(Part::Taken));
        assert!(!c.take(&3), "taken once");
        assert!(!c.take(&9), "not the call's");
        // The link admits the batch: the call sends the frames left, in its order.
        assert_eq!(c.send([1, 2, 3, 4]), vec![1, 2, 4]);
        assert!(!c.take(&2), "on the wire: the reader waits for it");
        // Peers did not have 4: queued again, takeable again until sent.
        c.requeue([4, 3]);
        assert_eq!(
            c.part(&3),
            Some(Part::Taken),
            "a taken frame stays the reader's"
        );
        assert!(c.take(&4));
        assert_eq!(c.send([4]), Vec::<u32>::new());
    }

    #[test]
    fn a_carved_read_is_demand_the_rest_of_the_batch_waits_for_it_and_the_quiet_time() {
        let p = policy();
        let mut q = LinkQueue::default();
        let batch = q.enqueue(Class::Prefetch, 8);
        // The reader's own frame goes as demand.
        q.demand_started(MS(1000));
        assert!(q.pump(MS(1050), &p).admitted.is_empty(), "demand in flight");
        q.demand_ended(MS(1100));
        assert_eq!(q.pump(MS(1150), &p).recheck_in, Some(MS(50)));
        assert_eq!(q.pump(MS(1200), &p).admitted, vec![batch]);
        q.release(batch);
        assert_eq!(q.demand_in_flight(), 0);
        assert_eq!(q.background_bytes(), 0);
    }

    /// One layer's (`group`) prefetch: five queued requests of 4 bytes.
    fn five_requests_of_4_bytes(q: &mut LinkQueue, group: u64) -> Vec<TicketId> {
        (0..5)
            .map(|_| q.enqueue_in(Class::Prefetch, 4, group))
            .collect()
    }

    #[test]
    fn a_read_just_ahead_of_its_own_layers_prefetch_is_predicted_behind_another_layers_queue() {
        let p = policy(); // follow_bytes 10
        let mut q = LinkQueue::default();
        // The lower layer's profile part is queued first (mounted first), then the upper's.
        let lower = five_requests_of_4_bytes(&mut q, 1);
        let upper = five_requests_of_4_bytes(&mut q, 2);
        // 20 bytes of the lower layer are queued ahead of the upper layer's head, but a read
        // of the upper layer follows its own part of the profile.
        assert!(q.predicted(upper[0], &p) && q.predicted(upper[2], &p));
        assert!(
            !q.predicted(upper[3], &p),
            "12 bytes of its own layer ahead"
        );
        assert!(q.predicted(lower[2], &p) && !q.predicted(lower[4], &p));
        // Admitted requests leave the count: the lower layer's head went out.
        q.demand_ended(MS(0));
        assert_eq!(q.pump(MS(5000), &p).admitted, vec![lower[0], lower[1]]);
        assert!(q.predicted(lower[4], &p), "8 bytes of its layer ahead now");
        q.release(lower[0]);
        q.release(upper[4]);
        assert!(q.queue.len() == 7 && q.state(upper[4]).is_none());
    }

    #[test]
    fn a_new_layer_holds_the_fill_back_but_not_the_start_up_prefetch() {
        let p = policy(); // prefetch quiet 100 ms, fill 1000 ms
        let mut q = LinkQueue::default();
        let f = q.enqueue(Class::Fill, 1);
        let pf = q.enqueue(Class::Prefetch, 1);
        q.note_layer_added(MS(5000));
        // The prefetch goes at once; the fill waits its quiet time from the addition.
        let pump = q.pump(MS(5010), &p);
        assert_eq!(pump.admitted, vec![pf]);
        assert_eq!(pump.recheck_in, Some(MS(990)));
        assert_eq!(q.pump(MS(6000), &p).admitted, vec![f]);
    }

    #[test]
    fn frames_readers_took_no_longer_count_ahead_of_a_read() {
        let p = policy(); // follow_bytes 10
        let mut q = LinkQueue::default();
        let r = five_requests_of_4_bytes(&mut q, 1);
        assert!(!q.predicted(r[4], &p), "16 bytes to send before it");
        // The profile's own command read the first three requests' frames (in its order, the
        // paused prefetch far behind): only the frame it skipped is still to be sent.
        for id in &r[..3] {
            q.took(*id, 4);
        }
        q.took(r[3], 3);
        assert!(q.predicted(r[4], &p), "1 byte left ahead");
        q.took(r[0], 4);
        q.took(999, 4); // unknown: nothing happens

        // Admitted, an emptied request takes no room of the in-flight budget.
        q.demand_ended(MS(0));
        assert_eq!(q.pump(MS(5000), &p).admitted, vec![r[0], r[1], r[2], r[3]]);
        assert_eq!(q.background_bytes(), 1);
    }

    #[test]
    fn a_read_just_ahead_of_the_prefetch_is_predicted_one_far_down_the_queue_is_not() {
        let p = policy(); // background_bytes 10
        let mut q = LinkQueue::default();
        let f = q.enqueue(Class::Fill, 100);
        let r: Vec<_> = (0..5).map(|_| q.enqueue(Class::Prefetch, 4)).collect();
        // 0, 4 and 8 bytes of prefetch queued before: the prefetch would send them next.
        assert!(q.predicted(r[0], &p) && q.predicted(r[1], &p) && q.predicted(r[2], &p));
        // 12 and 16 bytes before: the reader's command reads in another order.
        assert!(!q.predicted(r[3], &p) && !q.predicted(r[4], &p));
        assert!(!q.predicted(f, &p), "fill is behind all the prefetch");
        assert!(!q.predicted(999, &p), "unknown");
        // Predicted demand holds background requests back but starts no quiet time.
        q.demand_ended(MS(1000));
        q.predicted_started();
        assert!(q.pump(MS(5000), &p).admitted.is_empty(), "in flight");
        q.predicted_ended();
        assert_eq!(q.pump(MS(5000), &p).admitted, vec![r[0], r[1]]);
        // Unpredicted demand: the quiet time follows it.
        q.demand_started(MS(5000));
        q.release(r[0]);
        q.release(r[1]);
        q.demand_ended(MS(5010));
        assert_eq!(q.pump(MS(5050), &p).recheck_in, Some(MS(60)));
        assert!(
            q.predicted(r[4], &p),
            "the queue moved: 8 bytes before it now"
        );
    }

    #[test]
    fn released_while_queued_leaves_no_trace() {
        let mut q = LinkQueue::default();
        let a = q.enqueue(Class::Fill, 1);
        q.release(a);
        assert_eq!(q.state(a), None);
        assert!(q.pump(MS(5000), &policy()).admitted.is_empty());
    }

    proptest::proptest! {
        /// Whatever happens, nothing is admitted while demand is in flight, the bytes bound
        /// holds (a request alone excepted), and class caps hold.
        #[test]
        fn invariants_hold(ops in proptest::collection::vec((0u8..7, 1u64..20), 1..80)) {
            let p = policy();
            let mut q = LinkQueue::default();
            let mut now = MS(0);
            let mut ids: Vec<TicketId> = Vec::new();
            let (mut demand, mut predicted) = (0, 0);
            for (op, x) in ops {
                now += MS(x * 20);
                match op {
                    0 => ids.push(q.enqueue(Class::Prefetch, x)),
                    1 => ids.push(q.enqueue(Class::Fill, x)),
                    2 => { q.demand_started(now); demand += 1; }
                    3 if demand > 0 => { q.demand_ended(now); demand -= 1; }
                    4 if !ids.is_empty() => { let id = ids.remove(x as usize % ids.len()); q.release(id); }
                    5 => {
                        // A reader takes frames out of a queued request: predicted or not.
                        if let Some(id) = ids.get(x as usize % ids.len().max(1)) {
                            if q.predicted(*id, &p) { q.predicted_started(); predicted += 1; }
                            else { q.demand_started(now); demand += 1; }
                        }
                    }
                    6 if predicted > 0 => {
                        let last = q.last_demand;
                        q.predicted_ended();
                        predicted -= 1;
                        proptest::prop_assert_eq!(q.last_demand, last, "no quiet time");
                    }
                    _ => {}
                }
                proptest::prop_assert_eq!(q.demand_in_flight(), demand + predicted);
                let before = q.running.len();
                let pump = q.pump(now, &p);
                if q.demand_in_flight() > 0 {
                    proptest::prop_assert!(pump.admitted.is_empty());
                }
                if !pump.admitted.is_empty() && (before > 0 || pump.admitted.len() > 1) {
                    proptest::prop_assert!(q.background_bytes() <= p.background_bytes);
                }
                for c in [Class::Prefetch, Class::Fill] {
                    proptest::prop_assert!(q.running.values().filter(|(k, _)| *k == c).count() <= p.cap(c));
                }
            }
        }
    }

    proptest::proptest! {
        /// Readers and the call interleave in any order: every frame is fetched exactly once,
        /// by the reader that took it or by the call, and a reader takes only queued frames.
        #[test]
        fn carve_fetches_every_frame_once(ops in proptest::collection::vec((0u8..3, 0u32..6), 1..60)) {
            let mut c: Carve<u32> = Carve::default();
            for k in 0..6 {
                c.queue(k);
            }
            let (mut taken, mut sent) = (Vec::new(), Vec::new());
            let mut sending: std::collections::HashSet<u32> = Default::default();
            for (op, k) in ops {
                match op {
                    0 => {
                        let queued = c.part(&k) == Some(Part::Queued);
                        proptest::prop_assert_eq!(c.take(&k), queued);
                        if queued { taken.push(k); }
                    }
                    1 => for s in c.send([k, (k + 1) % 6]) { sending.insert(s); },
                    _ => {
                        // A send ends: got (kept) or requeued (peers did not have it).
                        if sending.remove(&k) {
                            if k % 2 == 0 { sent.push(k); } else { c.requeue([k]); }
                        }
                    }
                }
            }
            sent.extend(c.send(0..6));
            let mut all: Vec<u32> = taken.iter().chain(&sent).copied().collect();
            all.extend(sending.iter().filter(|k| !sent.contains(k)));
            all.sort_unstable();
            all.dedup();
            proptest::prop_assert_eq!(all.len(), 6);
            for k in &taken {
                proptest::prop_assert!(!sent.contains(k), "frame {} fetched twice", k);
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn scheduler_wakes_background_when_demand_ends() {
        use std::sync::Arc;
        let s = Arc::new(LinkScheduler::new(LinkPolicy {
            prefetch_quiet: MS(50),
            ..LinkPolicy::default()
        }));
        let d = s.demand();
        let waiter = || {
            let s = s.clone();
            tokio::spawn(async move {
                let t0 = tokio::time::Instant::now();
                let _p = s.background(Class::Prefetch, 1).await;
                t0.elapsed()
            })
        };
        let (a, b) = (waiter(), waiter());
        tokio::time::sleep(MS(500)).await;
        assert!(!a.is_finished() && !b.is_finished(), "demand in flight");
        drop(d);
        for w in [a, b] {
            let waited = w.await.unwrap();
            assert!(waited >= MS(550), "{waited:?}: demand, then the quiet time");
        }
        assert_eq!(s.demand_in_flight(), 0);
        assert_eq!(s.q.lock().background_bytes(), 0);
    }
}
