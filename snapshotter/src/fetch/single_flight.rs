//! Single flight per frame digest: concurrent misses of one frame cause one fetch.
//!
//! Contract:
//! - the first miss claims the frame ([`Vacant::claim`]); later ones join ([`Joined::Wait`]):
//!   the claimer publishes the result on a `watch` channel that waiters subscribe to;
//! - no lock is held across an await: the map is locked only to claim or join;
//! - a claim that ends without a result (cancelled claimer) leaves the map on drop, and its
//!   waiters see a closed channel and retry (no lost wakeups);
//! - a frame a background call claimed and has not sent yet may be taken by an on-demand or
//!   read-ahead reader ([`Joined::Take`], see [`super::link::Carve`]): the reader's claim takes
//!   the result channel over, and the background call's claim publishes nothing.
//!
//! Lock order: single-flight map -> the call's [`Promotion`] -> link queue -> caches.

use super::frames::Priority;
use super::link::{LinkScheduler, Promotion};
use super::FetchError;
use bytes::Bytes;
use parking_lot::{Mutex, MutexGuard};
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::watch;
use weenv_format::{Digest, Frame, FrameIdx};

/// A frame's published result (`None` until the claimer has one).
pub(super) type Slot = Option<Result<Bytes, FetchError>>;

/// Claims of one fetch by frame (one frame may be asked more than once in a call).
pub(super) type Claims<'a> = HashMap<FrameIdx, Vec<(usize, Claim<'a>)>>;

/// The results of one fetch step, by the caller's position of each frame.
pub(super) type Fetched = Vec<(usize, Result<Bytes, FetchError>)>;

/// The sending end of a frame's result channel, shared by the claim and the map so that a
/// reader taking the frame out of a queued background request takes the sender over.
type SharedTx = Arc<Mutex<Option<watch::Sender<Slot>>>>;

/// A frame being fetched: its result channel, and the background call whose request holds it
/// (`None`: a demand fetch).
struct PendingFrame {
    rx: watch::Receiver<Slot>,
    tx: SharedTx,
    promotion: Option<Arc<Promotion>>,
}

type Map = HashMap<Digest, PendingFrame>;

/// The frames being fetched, by digest.
#[derive(Default)]
pub(super) struct SingleFlight {
    map: Mutex<Map>,
}

/// What a miss found in the map.
pub(super) enum Joined<'a> {
    /// Taken out of a background call's queued request: the reader fetches it now, alone.
    /// Predicted (the link was about to send that request, see `LinkQueue::predicted`)?
    Take(Claim<'a>, bool),
    /// Being fetched: wait for the result; the background call fetching it, if one is.
    Wait(watch::Receiver<Slot>, Option<Arc<Promotion>>),
    /// Not being fetched; the map stays locked until [`Vacant::claim`] or drop.
    Vacant(Vacant<'a>),
}

/// A frame no one fetches, with the map locked.
pub(super) struct Vacant<'a> {
    flight: &'a SingleFlight,
    map: MutexGuard<'a, Map>,
    digest: Digest,
}

impl SingleFlight {
    /// Frames claimed now.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.map.lock().len()
    }

    /// Joins the fetch of `frame` if one is in flight. An on-demand or read-ahead reader takes
    /// the frame out of a background call's queued request instead (read-ahead is demand too:
    /// a read's neighbours, and waiting for a paused prefetch would lose what it is for).
    pub(super) fn join<'a>(
        &'a self,
        frame: &Frame,
        prio: Priority,
        link: &LinkScheduler,
    ) -> Joined<'a> {
        let mut map = self.map.lock();
        let Some(f) = map.get_mut(&frame.digest) else {
            return Joined::Vacant(Vacant {
                flight: self,
                map,
                digest: frame.digest.clone(),
            });
        };
        // Lock order: map -> promotion (the call's `send` takes only the latter).
        if let (Priority::OnDemand | Priority::ReadAhead, Some(p)) = (prio, &f.promotion) {
            if let Some(ticket) = p.take(&frame.digest) {
                // Lock order: map -> promotion -> link queue.
                let predicted = ticket.is_some_and(|t| link.take(t, frame.clen));
                let tx: SharedTx = Arc::new(Mutex::new(f.tx.lock().take()));
                f.tx = tx.clone();
                f.promotion = None;
                let claim = Claim {
                    flight: self,
                    digest: frame.digest.clone(),
                    tx,
                };
                return Joined::Take(claim, predicted);
            }
        }
        Joined::Wait(f.rx.clone(), f.promotion.clone())
    }
}

impl<'a> Vacant<'a> {
    /// Claims the frame. A background call (`promotion`) queues what it claims: readers may
    /// take it until its request is sent.
    pub(super) fn claim(mut self, promotion: Option<&Arc<Promotion>>) -> Claim<'a> {
        let (tx, rx) = watch::channel(None);
        let tx: SharedTx = Arc::new(Mutex::new(Some(tx)));
        if let Some(p) = promotion {
            p.queue(self.digest.clone());
        }
        self.map.insert(
            self.digest.clone(),
            PendingFrame {
                rx,
                tx: tx.clone(),
                promotion: promotion.cloned(),
            },
        );
        Claim {
            flight: self.flight,
            digest: self.digest,
            tx,
        }
    }
}

/// A claimed in-flight frame: publishes the result, releases the claim on drop (unless a
/// reader took the frame over: then the claim is the reader's).
pub(super) struct Claim<'a> {
    flight: &'a SingleFlight,
    digest: Digest,
    tx: SharedTx,
}

impl Claim<'_> {
    fn finish(self, r: Result<Bytes, FetchError>) {
        if let Some(tx) = self.tx.lock().as_ref() {
            tx.send_replace(Some(r));
        }
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        let mut map = self.flight.map.lock();
        if map
            .get(&self.digest)
            .is_some_and(|f| Arc::ptr_eq(&f.tx, &self.tx))
        {
            map.remove(&self.digest);
        }
    }
}

/// Publishes `r` to the claims of one frame and to the caller's results `out`.
pub(super) fn publish(
    claims: Vec<(usize, Claim<'_>)>,
    r: Result<Bytes, FetchError>,
    out: &mut Fetched,
) {
    let mut claims = claims.into_iter();
    if let Some((i, c)) = claims.next() {
        out.push((i, r.clone()));
        c.finish(r.clone());
    }
    for (i, c) in claims {
        // Same frame index asked twice in one call: the first claim published it.
        out.push((i, r.clone()));
        drop(c);
    }
}
