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
//! - **promotion** (single flight): a demand read that wants a frame claimed by a *queued*
//!   prefetch request promotes that request: it leaves the queue and is sent at once as
//!   demand; the reader waits for it, nothing is fetched twice. Promoted requests do not
//!   restart the quiet time: the profile predicted that read, so the prefetch is useful and
//!   goes on. (A fill request claims its frames only once admitted, so demand never waits for
//!   a queued fill request: it fetches the frame itself.)
//!
//! [`LinkScheduler`] is the async shell: waiters pump the queue themselves (on every change
//! and when a quiet time ends), permits release on drop (also when a waiter is cancelled).

use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

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
            prefetch_quiet: Duration::from_millis(100),
            fill_quiet: Duration::from_millis(1000),
            prefetch_concurrency: 4,
            fill_concurrency: 2,
        }
    }
}

impl LinkPolicy {
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
    /// Promoted: sent as demand.
    Promoted,
}

/// What one pump admitted, and when to pump again if the head waits for a quiet time.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Pump {
    pub admitted: Vec<TicketId>,
    pub recheck_in: Option<Duration>,
}

/// The link's state: demand in flight, background queued and in flight. Pure.
#[derive(Debug, Default)]
pub struct LinkQueue {
    demand: usize,
    last_demand: Duration,
    queue: BTreeMap<(Class, TicketId), u64>,
    running: HashMap<TicketId, (Class, u64)>,
    promoted: HashSet<TicketId>,
    next: TicketId,
}

impl LinkQueue {
    /// Demand activity at `now` (a fetch started or ended, or a layer is about to be used).
    pub fn note_demand(&mut self, now: Duration) {
        self.last_demand = self.last_demand.max(now);
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

    /// Demand requests in flight (promoted ones included).
    pub fn demand_in_flight(&self) -> usize {
        self.demand
    }

    /// Background bytes in flight.
    pub fn background_bytes(&self) -> u64 {
        self.running.values().map(|(_, b)| b).sum()
    }

    /// Queues a background request of `bytes`.
    pub fn enqueue(&mut self, class: Class, bytes: u64) -> TicketId {
        self.next += 1;
        self.queue.insert((class, self.next), bytes);
        self.next
    }

    /// Where request `id` is (`None`: released or unknown).
    pub fn state(&self, id: TicketId) -> Option<TicketState> {
        if self.running.contains_key(&id) {
            Some(TicketState::Running)
        } else if self.promoted.contains(&id) {
            Some(TicketState::Promoted)
        } else if self.queue.keys().any(|(_, i)| *i == id) {
            Some(TicketState::Queued)
        } else {
            None
        }
    }

    /// Promotes queued request `id` to demand (sent at once). True if it was queued; a request
    /// already admitted stays as it is (it is on the wire).
    pub fn promote(&mut self, id: TicketId) -> bool {
        let Some(key) = self.queue.keys().find(|(_, i)| *i == id).copied() else {
            return false;
        };
        self.queue.remove(&key);
        self.promoted.insert(id);
        self.demand += 1;
        true
    }

    /// Request `id` ended (or its waiter went away): queued, running or promoted.
    pub fn release(&mut self, id: TicketId) {
        if self.running.remove(&id).is_some() {
            return;
        }
        if self.promoted.remove(&id) {
            // Predicted demand: no quiet time after it.
            self.demand = self.demand.saturating_sub(1);
            return;
        }
        self.queue.retain(|(_, i), _| *i != id);
    }

    /// Admits queued requests in order while the policy allows (see the module docs).
    pub fn pump(&mut self, now: Duration, p: &LinkPolicy) -> Pump {
        let mut out = Pump::default();
        if self.demand > 0 {
            return out;
        }
        while let Some((&(class, id), &bytes)) = self.queue.iter().next() {
            let quiet_end = self.last_demand + p.quiet(class);
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

/// A set of queued prefetch requests a demand read may promote (one per prefetch call: the
/// frames it claimed and the requests it queued for them).
#[derive(Debug, Default)]
pub struct Promotion {
    inner: Mutex<(bool, Vec<TicketId>)>,
}

impl Promotion {
    /// A demand read waits for these frames.
    pub fn promoted(&self) -> bool {
        self.inner.lock().0
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
pub struct DemandPermit<'a>(&'a LinkScheduler);

impl Drop for DemandPermit<'_> {
    fn drop(&mut self) {
        let now = self.0.now();
        self.0.q.lock().demand_ended(now);
        self.0.changed.notify_waiters();
    }
}

/// A background request's place on the link (queued until [`LinkScheduler::background`]
/// returns it); releases on drop.
pub struct BgPermit<'a> {
    sched: &'a LinkScheduler,
    id: TicketId,
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

    /// Records demand activity now.
    pub fn note_demand(&self) {
        let now = self.now();
        self.q.lock().note_demand(now);
    }

    /// Demand requests in flight.
    pub fn demand_in_flight(&self) -> usize {
        self.q.lock().demand_in_flight()
    }

    /// Sends a demand request now: hold the permit while it is in flight.
    pub fn demand(&self) -> DemandPermit<'_> {
        let now = self.now();
        self.q.lock().demand_started(now);
        DemandPermit(self)
    }

    /// Promotes every queued request of `p` (a demand read waits for its frames).
    pub fn promote(&self, p: &Promotion) {
        let mut g = p.inner.lock();
        if g.0 {
            return;
        }
        g.0 = true;
        let mut q = self.q.lock();
        let any = g.1.iter().fold(false, |any, id| q.promote(*id) | any);
        drop(q);
        drop(g);
        if any {
            self.changed.notify_waiters();
        }
    }

    /// Waits until a background request of `bytes` and `class` may be sent (or is promoted
    /// through `promotion`); hold the permit while it is in flight.
    pub async fn background(
        &self,
        class: Class,
        bytes: u64,
        promotion: Option<&Promotion>,
    ) -> BgPermit<'_> {
        let permit = {
            // Lock order: promotion, then queue (as in `promote`).
            let mut pg = promotion.map(|p| p.inner.lock());
            let mut q = self.q.lock();
            let id = q.enqueue(class, bytes);
            if let Some(pg) = pg.as_mut() {
                pg.1.push(id);
                if pg.0 {
                    q.promote(id);
                }
            }
            BgPermit { sched: self, id }
        };
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
                _ => return permit,
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
    fn promotion_sends_at_once_as_demand_and_leaves_no_quiet_time() {
        let p = policy();
        let mut q = LinkQueue::default();
        q.demand_started(MS(1000));
        let a = q.enqueue(Class::Prefetch, 1);
        let b = q.enqueue(Class::Prefetch, 1);
        assert!(q.promote(b));
        assert_eq!(q.state(b), Some(TicketState::Promoted));
        assert_eq!(q.demand_in_flight(), 2);
        q.demand_ended(MS(1000));
        assert!(q.pump(MS(2000), &p).admitted.is_empty(), "b in flight");
        q.release(b);
        assert_eq!(q.state(b), None);
        assert_eq!(
            q.pump(MS(2000), &p).admitted,
            vec![a],
            "the quiet time counts from the unpredicted demand, not the promoted one"
        );
        assert!(!q.promote(a), "admitted requests are on the wire already");
        q.release(a);
        assert_eq!(q.demand_in_flight(), 0);
        assert_eq!(q.background_bytes(), 0);
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
        fn invariants_hold(ops in proptest::collection::vec((0u8..6, 1u64..20), 1..80)) {
            let p = policy();
            let mut q = LinkQueue::default();
            let mut now = MS(0);
            let mut ids: Vec<TicketId> = Vec::new();
            let mut demand = 0;
            for (op, x) in ops {
                now += MS(x * 20);
                match op {
                    0 => ids.push(q.enqueue(Class::Prefetch, x)),
                    1 => ids.push(q.enqueue(Class::Fill, x)),
                    2 => { q.demand_started(now); demand += 1; }
                    3 if demand > 0 => { q.demand_ended(now); demand -= 1; }
                    4 if !ids.is_empty() => { let id = ids.remove(x as usize % ids.len()); q.release(id); }
                    _ => if let Some(id) = ids.get(x as usize % ids.len().max(1)) { q.promote(*id); }
                }
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

    #[tokio::test(start_paused = true)]
    async fn scheduler_wakes_background_when_demand_ends_and_promotes() {
        use std::sync::Arc;
        let s = Arc::new(LinkScheduler::new(LinkPolicy {
            prefetch_quiet: MS(50),
            ..LinkPolicy::default()
        }));
        let d = s.demand();
        let promo = Arc::new(Promotion::default());
        let bg = {
            let (s, promo) = (s.clone(), promo.clone());
            tokio::spawn(async move {
                let _p = s.background(Class::Prefetch, 1, Some(&promo)).await;
            })
        };
        let plain = {
            let s = s.clone();
            tokio::spawn(async move {
                let t0 = tokio::time::Instant::now();
                let _p = s.background(Class::Prefetch, 1, None).await;
                t0.elapsed()
            })
        };
        tokio::time::sleep(MS(500)).await;
        assert!(
            !bg.is_finished() && !plain.is_finished(),
            "demand in flight"
        );
        s.promote(&promo);
        bg.await.unwrap();
        assert!(!plain.is_finished());
        drop(d);
        let waited = plain.await.unwrap();
        assert!(waited >= MS(550), "{waited:?}: demand, then the quiet time");
        assert_eq!(s.demand_in_flight(), 0);
        assert_eq!(s.q.lock().background_bytes(), 0);
    }
}
