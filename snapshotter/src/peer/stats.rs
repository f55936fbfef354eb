//! Counters of the peer tier, both sides: what this node got from its peers (per peer:
//! requests, errors, latency, ejections, bytes) and what it served to them. Rendered into
//! `/metrics` ([`PeerStats::render`]) and `/status` ([`PeerStats::view`]).

use crate::metrics::Exposition;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use weenv_snapshotter_api::status::{PeerView, PeersView};

/// What this node saw of one peer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PerPeer {
    pub requests: u64,
    /// Failed, slow (past the hedge delay) or corrupt answers.
    pub errors: u64,
    /// Frames that failed verification.
    pub corrupt_frames: u64,
    pub ejections: u64,
    /// Compressed size (the TOC's `clen`) of the verified frames received.
    pub bytes: u64,
    pub latency_sum: Duration,
}

/// Counters of the peer tier.
#[derive(Debug, Default)]
pub struct PeerStats {
    peers: Mutex<BTreeMap<SocketAddr, PerPeer>>,
    /// Frames asked of peers that came from the registry instead (peer failed, slow, lied or
    /// lacked them).
    pub bypassed_frames: AtomicU64,
    /// Requests this node answered for peers, by outcome.
    pub served_requests: AtomicU64,
    pub served_bytes: AtomicU64,
    pub served_cache_misses: AtomicU64,
    pub refused_busy: AtomicU64,
    pub refused_invalid: AtomicU64,
    pub refused_auth: AtomicU64,
    pub served_errors: AtomicU64,
}

/// Reader-side events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A request answered; `bytes` of verified frames received.
    Answered {
        latency: Duration,
        bytes: u64,
    },
    /// A request failed or timed out.
    Error {
        latency: Duration,
    },
    /// Frames that failed verification in an answer.
    Corrupt {
        frames: u64,
    },
    Ejected,
}

impl PeerStats {
    /// Records `ev` for `peer`.
    pub fn record(&self, peer: SocketAddr, ev: Event) {
        let mut m = self.peers.lock();
        let p = m.entry(peer).or_default();
        match ev {
            Event::Answered { latency, bytes } => {
                p.requests += 1;
                p.bytes += bytes;
                p.latency_sum += latency;
            }
            Event::Error { latency } => {
                p.requests += 1;
                p.errors += 1;
                p.latency_sum += latency;
            }
            Event::Corrupt { frames } => {
                p.errors += 1;
                p.corrupt_frames += frames;
            }
            Event::Ejected => p.ejections += 1,
        }
    }

    /// One peer's counters.
    pub fn peer(&self, peer: SocketAddr) -> PerPeer {
        self.peers.lock().get(&peer).copied().unwrap_or_default()
    }

    /// Compressed bytes received from all peers.
    pub fn bytes_from_peers(&self) -> u64 {
        self.peers.lock().values().map(|p| p.bytes).sum()
    }

    /// Prometheus families.
    pub fn render(&self) -> String {
        let peers: Vec<(String, PerPeer)> = self
            .peers
            .lock()
            .iter()
            .map(|(a, p)| (a.to_string(), *p))
            .collect();
        let fam = |f: fn(&PerPeer) -> u64| -> Vec<(String, u64)> {
            peers.iter().map(|(a, p)| (a.clone(), f(p))).collect()
        };
        let mut e = Exposition::new();
        e.counter(
            "weenv_peer_bytes_total",
            "Compressed size (TOC clen) of verified frames received from peers.",
            self.bytes_from_peers(),
        );
        e.counter_family(
            "weenv_peer_requests_total",
            "Frame requests sent to each peer.",
            "peer",
            fam(|p| p.requests),
        );
        e.counter_family(
            "weenv_peer_errors_total",
            "Peer requests that failed, timed out (hedge delay) or returned corrupt frames.",
            "peer",
            fam(|p| p.errors),
        );
        e.counter_family(
            "weenv_peer_corrupt_frames_total",
            "Frames from each peer that failed verification (never used).",
            "peer",
            fam(|p| p.corrupt_frames),
        );
        e.counter_family(
            "weenv_peer_ejections_total",
            "Times each peer was ejected.",
            "peer",
            fam(|p| p.ejections),
        );
        e.counter_family(
            "weenv_peer_request_milliseconds_total",
            "Summed latency of the requests to each peer (divide by requests for the mean).",
            "peer",
            fam(|p| u64::try_from(p.latency_sum.as_millis()).unwrap_or(u64::MAX)),
        );
        let c = |a: &AtomicU64| a.load(Ordering::Relaxed);
        e.counter(
            "weenv_peer_bypassed_frames_total",
            "Frames asked of peers that were fetched from the registry instead.",
            c(&self.bypassed_frames),
        );
        e.counter(
            "weenv_peer_served_requests_total",
            "Frame requests answered for peers.",
            c(&self.served_requests),
        );
        e.counter(
            "weenv_peer_served_bytes_total",
            "Uncompressed frame bytes served to peers.",
            c(&self.served_bytes),
        );
        e.counter_family(
            "weenv_peer_refused_total",
            "Peer requests refused, by reason.",
            "reason",
            vec![
                ("busy", c(&self.refused_busy)),
                ("invalid", c(&self.refused_invalid)),
                ("auth", c(&self.refused_auth)),
                ("not_cached", c(&self.served_cache_misses)),
                ("fetch_failed", c(&self.served_errors)),
            ],
        );
        e.render()
    }

    /// The `/status` view; `live(peer)` says whether a peer is ejected now.
    pub fn view(
        &self,
        me: Option<SocketAddr>,
        members: &[SocketAddr],
        live: impl Fn(SocketAddr) -> bool,
    ) -> PeersView {
        let c = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut addrs: Vec<SocketAddr> = members.to_vec();
        addrs.extend(self.peers.lock().keys().copied());
        addrs.sort();
        addrs.dedup();
        PeersView {
            me: me.map(|a| a.to_string()),
            members: members.len() as u64,
            peers: addrs
                .into_iter()
                .filter(|a| Some(*a) != me)
                .map(|a| {
                    let p = self.peer(a);
                    PeerView {
                        addr: a.to_string(),
                        member: members.contains(&a),
                        live: live(a),
                        requests: p.requests,
                        errors: p.errors,
                        corrupt_frames: p.corrupt_frames,
                        ejections: p.ejections,
                        bytes: p.bytes,
                        mean_latency_ms: if p.requests == 0 {
                            0.0
                        } else {
                            p.latency_sum.as_secs_f64() * 1000.0 / p.requests as f64
                        },
                    }
                })
                .collect(),
            bypassed_frames: c(&self.bypassed_frames),
            served_requests: c(&self.served_requests),
            served_bytes: c(&self.served_bytes),
            refused: c(&self.refused_busy)
                + c(&self.refused_invalid)
                + c(&self.refused_auth)
                + c(&self.served_errors),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_add_up_and_render() {
        let s = PeerStats::default();
        let a: SocketAddr = "10.0.0.2:7470".parse().unwrap();
        s.record(
            a,
            Event::Answered {
                latency: Duration::from_millis(10),
                bytes: 100,
            },
        );
        s.record(
            a,
            Event::Error {
                latency: Duration::from_millis(30),
            },
        );
        s.record(a, Event::Corrupt { frames: 2 });
        s.record(a, Event::Ejected);
        let p = s.peer(a);
        assert_eq!(
            (p.requests, p.errors, p.corrupt_frames, p.ejections, p.bytes),
            (2, 2, 2, 1, 100)
        );
        let text = s.render();
        assert!(text.contains("weenv_peer_bytes_total 100"), "{text}");
        assert!(text.contains("weenv_peer_ejections_total{peer=\"10.0.0.2:7470\"} 1"));
        assert!(text.contains("weenv_peer_request_milliseconds_total{peer=\"10.0.0.2:7470\"} 40"));
        let v = s.view(None, &[a], |_| false);
        assert_eq!(v.peers.len(), 1);
        assert_eq!(v.peers[0].mean_latency_ms, 20.0);
        assert!(!v.peers[0].live);
    }
}
