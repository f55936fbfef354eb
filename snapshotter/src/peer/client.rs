//! [`PeerClient`]: the reader side of the peer tier, the [`PeerTier`] the frame store asks
//! before the registry.
//!
//! Per fetch: take the live members (ejected peers left out, see [`super::health`]); each
//! wanted frame goes to its rendezvous owner ([`plan_batches`]); a frame this node owns itself
//! is asked of its runner-up with `cache_only` (after a membership change the runner-up is the
//! previous owner and may hold it; it never fetches for such a request). One request per peer
//! (split at `max_request_bytes`), all at once; an answer must arrive within the hedge delay.
//! Every frame received is verified against the TOC (length and digest) before it is returned;
//! a peer that fails, is slow or lies is ejected with backoff, and whatever it did not deliver
//! is left to the caller, which fetches it from the registry.

use super::health::{EjectPolicy, Health, Outcome};
use super::protocol::{split_body, BlobRef, FrameRequest, WirePriority, FRAMES_PATH, VERSION};
use super::rendezvous::ranked;
use super::stats::{Event, PeerStats};
use super::{wire_priority, PeerTier};
use crate::fetch::Priority;
use crate::metrics::LogLimit;
use async_trait::async_trait;
use bytes::Bytes;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use weenv_format::{Digest, Frame, FrameIdx};
use weenv_registry::BlobLocator;

use super::members::Membership;

/// Frames to ask of one peer in one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    pub peer: SocketAddr,
    /// Ask only for cached frames (this node owns them; `peer` is the runner-up).
    pub cache_only: bool,
    /// In blob order.
    pub frames: Vec<FrameIdx>,
}

/// Which peer is asked for which of the `wanted` frames. Frames this node owns with no
/// runner-up, and frames larger than `max_bytes`, are asked of nobody. Pure.
pub fn plan_batches(
    frames: &[Frame],
    wanted: &[FrameIdx],
    live: &[SocketAddr],
    me: Option<SocketAddr>,
    max_bytes: u64,
) -> Vec<Batch> {
    let mut want: Vec<(FrameIdx, &Frame)> = wanted
        .iter()
        .filter_map(|i| frames.get(i.0 as usize).map(|f| (*i, f)))
        .filter(|(_, f)| f.ulen <= max_bytes)
        .collect();
    want.sort_by_key(|(i, f)| (f.offset, *i));
    want.dedup_by_key(|(i, _)| *i);
    let mut open: HashMap<(SocketAddr, bool), (Batch, u64)> = HashMap::new();
    let mut done = Vec::new();
    for (idx, f) in want {
        let r = ranked(live, &f.digest);
        let target = match (r.first(), r.get(1)) {
            (Some(owner), _) if Some(*owner) != me => (*owner, false),
            (Some(_), Some(runner_up)) => (*runner_up, true),
            _ => continue,
        };
        let (batch, bytes) = open.entry(target).or_insert_with(|| {
            (
                Batch {
                    peer: target.0,
                    cache_only: target.1,
                    frames: Vec::new(),
                },
                0,
            )
        });
        if *bytes + f.ulen > max_bytes {
            let full = std::mem::replace(
                batch,
                Batch {
                    peer: target.0,
                    cache_only: target.1,
                    frames: Vec::new(),
                },
            );
            done.push(full);
            *bytes = 0;
        }
        batch.frames.push(idx);
        *bytes += f.ulen;
    }
    done.extend(open.into_values().map(|(b, _)| b));
    done.sort_by(|a, b| {
        (a.peer, a.cache_only, a.frames.first()).cmp(&(b.peer, b.cache_only, b.frames.first()))
    });
    done
}

/// Checks a frame received from a peer against its TOC entry. Pure.
pub fn check_frame(f: &Frame, bytes: &[u8]) -> Result<(), String> {
    if bytes.len() as u64 != f.ulen {
        return Err(format!("{} bytes, TOC says {}", bytes.len(), f.ulen));
    }
    let d = Digest::sha256(bytes);
    if d != f.digest {
        return Err(format!("digest {d}, TOC says {}", f.digest));
    }
    Ok(())
}

/// Settings of a [`PeerClient`].
#[derive(Clone, Debug)]
pub struct ClientConfig {
    pub hedge: Duration,
    pub eject: EjectPolicy,
    pub max_request_bytes: u64,
    pub token: Option<String>,
}

/// Why one request to a peer gave nothing.
#[derive(Debug, thiserror::Error)]
enum AskError {
    #[error("answered HTTP {0}")]
    Status(u16),
    #[error("{0}")]
    Transport(#[from] reqwest::Error),
    #[error("answer of {got:?} bytes, {want} expected")]
    Length { got: Option<u64>, want: u64 },
}

/// The reader side of the peer tier.
pub struct PeerClient {
    http: reqwest::Client,
    members: Arc<Membership>,
    health: Mutex<HashMap<SocketAddr, Health>>,
    cfg: ClientConfig,
    started: Instant,
    stats: Arc<PeerStats>,
    last_log: LogLimit,
}

impl PeerClient {
    /// A client over `members`, counting into `stats`.
    pub fn new(
        members: Arc<Membership>,
        cfg: ClientConfig,
        stats: Arc<PeerStats>,
    ) -> Result<Self, reqwest::Error> {
        let http = reqwest::Client::builder()
            .connect_timeout(cfg.hedge.min(Duration::from_secs(1)))
            .pool_idle_timeout(Duration::from_secs(30))
            .no_proxy()
            .build()?;
        Ok(PeerClient {
            http,
            members,
            health: Mutex::new(HashMap::new()),
            cfg,
            started: Instant::now(),
            stats,
            last_log: LogLimit::default(),
        })
    }

    fn now(&self) -> Duration {
        self.started.elapsed()
    }

    /// Is `peer` not ejected now?
    pub fn is_live(&self, peer: SocketAddr) -> bool {
        let now = self.now();
        self.health.lock().get(&peer).is_none_or(|h| h.is_live(now))
    }

    /// The membership this client uses.
    pub fn membership(&self) -> &Arc<Membership> {
        &self.members
    }

    fn live_members(&self) -> Vec<SocketAddr> {
        let now = self.now();
        let me = self.members.me();
        let h = self.health.lock();
        self.members
            .members()
            .iter()
            .copied()
            .filter(|m| Some(*m) == me || h.get(m).is_none_or(|x| x.is_live(now)))
            .collect()
    }

    /// At most one log line per second.
    fn may_log(&self) -> bool {
        self.last_log.allow()
    }

    async fn send(
        &self,
        peer: SocketAddr,
        req: &FrameRequest,
        want: u64,
    ) -> Result<Bytes, AskError> {
        let mut rb = self
            .http
            .post(format!("http://{peer}{FRAMES_PATH}"))
            .json(req);
        if let Some(t) = &self.cfg.token {
            rb = rb.bearer_auth(t);
        }
        let resp = rb.send().await?;
        let status = resp.status().as_u16();
        if status != 200 {
            return Err(AskError::Status(status));
        }
        if resp.content_length() != Some(want) {
            return Err(AskError::Length {
                got: resp.content_length(),
                want,
            });
        }
        Ok(resp.bytes().await?)
    }

    fn note(&self, peer: SocketAddr, outcome: Outcome) {
        let now = self.now();
        let (before, after) = {
            let mut h = self.health.lock();
            let e = h.entry(peer).or_default();
            let before = *e;
            *e = before.after(outcome, now, &self.cfg.eject);
            (before, *e)
        };
        if after.ejections > before.ejections {
            self.stats.record(peer, Event::Ejected);
            let until = after.ejected_until.unwrap_or(now).saturating_sub(now);
            tracing::warn!(%peer, ?outcome, failures = after.failures, ejected_for = ?until, "peer ejected; its frames go to their runner-up or the registry");
        }
    }

    async fn ask(
        &self,
        blob: &BlobLocator,
        frames: &[Frame],
        b: Batch,
        prio: WirePriority,
    ) -> Vec<(FrameIdx, Bytes)> {
        let fs: Vec<(FrameIdx, &Frame)> = b
            .frames
            .iter()
            .filter_map(|i| frames.get(i.0 as usize).map(|f| (*i, f)))
            .collect();
        let want: u64 = fs.iter().map(|(_, f)| f.ulen).sum();
        let req = FrameRequest {
            version: VERSION,
            blob: BlobRef {
                reference: format!(
                    "{}/{}",
                    blob.reference.registry(),
                    blob.reference.repository()
                ),
                digest: blob.digest.clone(),
                size: blob.size,
            },
            priority: prio,
            cache_only: b.cache_only,
            frames: fs.iter().map(|(_, f)| (*f).clone()).collect(),
        };
        let t0 = Instant::now();
        let res = tokio::time::timeout(self.cfg.hedge, self.send(b.peer, &req, want)).await;
        let latency = t0.elapsed();
        let mut got = Vec::new();
        let outcome = match res {
            Err(_) => {
                if self.may_log() {
                    tracing::warn!(peer = %b.peer, hedge = ?self.cfg.hedge, frames = fs.len(), "peer did not answer within the hedge delay; fetching from the registry");
                }
                Outcome::Slow
            }
            Ok(Err(AskError::Status(404))) if b.cache_only => Outcome::Ok,
            Ok(Err(AskError::Status(503))) => Outcome::Busy,
            Ok(Err(e)) => {
                if self.may_log() {
                    tracing::warn!(peer = %b.peer, error = %e, "peer request failed; fetching from the registry");
                }
                Outcome::Failed
            }
            Ok(Ok(body)) => {
                let refs: Vec<&Frame> = fs.iter().map(|(_, f)| *f).collect();
                match split_body(&body, &refs) {
                    None => Outcome::Corrupt,
                    Some(parts) => {
                        let owned: Vec<(FrameIdx, Frame, Bytes)> = fs
                            .iter()
                            .zip(parts)
                            .map(|((i, f), p)| (*i, (*f).clone(), p))
                            .collect();
                        let checked = tokio::task::spawn_blocking(move || {
                            owned
                                .into_iter()
                                .map(|(i, f, p)| (i, check_frame(&f, &p).map(|()| (f.clen, p))))
                                .collect::<Vec<_>>()
                        })
                        .await
                        .unwrap_or_default();
                        let mut bad = 0u64;
                        let mut first_bad = None;
                        for (i, r) in checked {
                            match r {
                                Ok(x) => got.push((i, x)),
                                Err(reason) => {
                                    bad += 1;
                                    first_bad.get_or_insert((i, reason));
                                }
                            }
                        }
                        if bad > 0 {
                            self.stats.record(b.peer, Event::Corrupt { frames: bad });
                            if let Some((i, reason)) = first_bad {
                                tracing::error!(peer = %b.peer, blob = %blob.digest, frame = i.0, reason, bad, "peer returned frames that fail verification; they are not used, the peer is ejected");
                            }
                            Outcome::Corrupt
                        } else {
                            Outcome::Ok
                        }
                    }
                }
            }
        };
        let bytes: u64 = got.iter().map(|(_, (clen, _))| *clen).sum();
        match outcome {
            Outcome::Ok | Outcome::Corrupt => self
                .stats
                .record(b.peer, Event::Answered { latency, bytes }),
            Outcome::Busy | Outcome::Failed | Outcome::Slow => {
                self.stats.record(b.peer, Event::Error { latency })
            }
        }
        self.note(b.peer, outcome);
        let missed = (fs.len() - got.len()) as u64;
        self.stats
            .bypassed_frames
            .fetch_add(missed, Ordering::Relaxed);
        got.into_iter().map(|(i, (_, b))| (i, b)).collect()
    }
}

#[async_trait]
impl PeerTier for PeerClient {
    fn self_owned(&self, frames: &[Frame], wanted: &[FrameIdx]) -> Vec<FrameIdx> {
        let live = self.live_members();
        let me = self.members.me();
        wanted
            .iter()
            .copied()
            .filter(|i| {
                frames.get(i.0 as usize).is_some_and(|f| {
                    let owner = super::rendezvous::owner(&live, &f.digest);
                    owner.is_none() || owner == me
                })
            })
            .collect()
    }

    async fn fetch(
        &self,
        blob: &BlobLocator,
        frames: &[Frame],
        wanted: &[FrameIdx],
        prio: Priority,
    ) -> Vec<(FrameIdx, Bytes)> {
        let live = self.live_members();
        let batches = plan_batches(
            frames,
            wanted,
            &live,
            self.members.me(),
            self.cfg.max_request_bytes,
        );
        let prio = wire_priority(prio);
        futures::future::join_all(batches.into_iter().map(|b| self.ask(blob, frames, b, prio)))
            .await
            .into_iter()
            .flatten()
            .collect()
    }
}

#[cfg(test)]
mod tests;
