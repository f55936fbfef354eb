//! The peer tier: the node disk cache shared with peer nodes (DESIGN.md "Caches", issue 14).
//!
//! - [`rendezvous`]: which member owns a frame digest (pure).
//! - [`health`]: ejection with backoff of failing, slow or lying peers (pure).
//! - [`protocol`]: the one request (`POST /peer/v1/frames`), its validation (pure), the answer.
//! - [`members`]: static or DNS membership, re-resolved without restarts; which member is us.
//! - [`client`]: [`PeerClient`], the [`PeerTier`] the frame store asks before the registry.
//! - [`serve`]: [`PeerServer`], answering peers from the caches or the registry.
//! - [`stats`]: counters for `/metrics` and `/status`.
//!
//! Trust: a peer is never trusted. The client verifies every frame it receives against the
//! reader's TOC (length and sha256 of the uncompressed bytes) before returning it; the server
//! verifies what it fetches for a peer against the digests the request names. A lying peer
//! costs a registry fetch and an ejection, never a wrong byte.

pub mod client;
pub mod health;
pub mod members;
pub mod protocol;
pub mod rendezvous;
pub mod serve;
pub mod stats;

pub use client::{ClientConfig, PeerClient};
pub use members::Membership;
pub use serve::{PeerServer, ServerConfig};
pub use stats::PeerStats;

use crate::fetch::{FrameStore, Priority};
use async_trait::async_trait;
use bytes::Bytes;
use protocol::{RequestLimits, WirePriority};
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;
use weenv_format::{Frame, FrameIdx};
use weenv_registry::BlobLocator;
use weenv_snapshotter_api::config::PeersSection;

/// Frames from other nodes, asked by the frame store before a registry blob's source.
#[async_trait]
pub trait PeerTier: Send + Sync {
    /// The frames of `wanted` this node fetches from the source itself (it owns them, or no
    /// live peer does); [`PeerTier::fetch`] only asks their previous owner's cache for them.
    fn self_owned(&self, frames: &[Frame], wanted: &[FrameIdx]) -> Vec<FrameIdx>;

    /// The frames of `wanted` (indices into `frames`, the blob's TOC frames) this tier got
    /// from peers, each verified against its TOC entry. Frames not returned are the caller's
    /// to fetch; the tier never fails a read.
    async fn fetch(
        &self,
        blob: &BlobLocator,
        frames: &[Frame],
        wanted: &[FrameIdx],
        prio: Priority,
    ) -> Vec<(FrameIdx, Bytes)>;
}

/// Start-up failures of the peer tier.
#[derive(Debug, Error)]
pub enum PeerError {
    #[error("cannot serve peers on {addr} (config peers.listen): {error}")]
    Bind { addr: String, error: std::io::Error },
    #[error("cannot read the peer token {path} (config peers.token_file): {error}")]
    Token {
        path: std::path::PathBuf,
        error: std::io::Error,
    },
    #[error("peer token file {0} is empty (config peers.token_file)")]
    EmptyToken(std::path::PathBuf),
    #[error("peer HTTP client: {0}")]
    Client(String),
    #[error(transparent)]
    Config(#[from] weenv_snapshotter_api::config::ConfigError),
}

/// The wire name of a fetch priority (on-demand and read-ahead are both "demand").
pub fn wire_priority(p: Priority) -> WirePriority {
    match p {
        Priority::OnDemand | Priority::ReadAhead => WirePriority::Demand,
        Priority::Prefetch => WirePriority::Prefetch,
        Priority::Fill => WirePriority::Fill,
    }
}

/// The priority an owner fetches a peer's frames at.
pub fn fetch_priority(p: WirePriority) -> Priority {
    match p {
        WirePriority::Demand => Priority::OnDemand,
        WirePriority::Prefetch => Priority::Prefetch,
        WirePriority::Fill => Priority::Fill,
    }
}

/// The running peer tier of a daemon (for `/metrics` and `/status`).
pub struct Peers {
    pub client: Arc<PeerClient>,
    pub stats: Arc<PeerStats>,
}

impl Peers {
    /// The `/status` view.
    pub fn view(&self) -> weenv_snapshotter_api::status::PeersView {
        let m = self.client.membership();
        self.stats
            .view(m.me(), &m.members(), |a| self.client.is_live(a))
    }
}

fn read_token(cfg: &PeersSection) -> Result<Option<String>, PeerError> {
    let Some(path) = &cfg.token_file else {
        return Ok(None);
    };
    let t = std::fs::read_to_string(path).map_err(|error| PeerError::Token {
        path: path.clone(),
        error,
    })?;
    let t = t.trim().to_string();
    if t.is_empty() {
        return Err(PeerError::EmptyToken(path.clone()));
    }
    Ok(Some(t))
}

/// Binds `peers.listen`, starts serving `store` to peers and membership upkeep, and sets the
/// client as `store`'s peer tier. `Ok(None)` when the peer cache is off.
pub async fn start(
    cfg: &PeersSection,
    store: &Arc<FrameStore>,
    registry: weenv_registry::Client,
) -> Result<Option<Peers>, PeerError> {
    let Some(listen) = cfg.listen_addr()? else {
        return Ok(None);
    };
    let token = read_token(cfg)?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|error| PeerError::Bind {
            addr: listen.to_string(),
            error,
        })?;
    let members = Arc::new(Membership::new(
        cfg.member_addrs()?,
        cfg.advertise_addr()?,
        listen,
    ));
    if !cfg.dns.trim().is_empty() {
        tokio::spawn(members.clone().run_dns(
            cfg.dns.trim().to_string(),
            Duration::from_millis(cfg.dns_refresh_ms),
        ));
    }
    let stats = Arc::new(PeerStats::default());
    let client = Arc::new(
        PeerClient::new(
            members,
            ClientConfig {
                hedge: Duration::from_millis(cfg.hedge_ms),
                eject: health::EjectPolicy {
                    base: Duration::from_millis(cfg.eject_base_ms),
                    max: Duration::from_millis(cfg.eject_max_ms),
                },
                max_request_bytes: cfg.max_request_bytes,
                token: token.clone(),
            },
            stats.clone(),
        )
        .map_err(|e| PeerError::Client(e.to_string()))?,
    );
    let server = Arc::new(PeerServer::new(
        store.clone(),
        registry,
        ServerConfig {
            limits: RequestLimits {
                max_request_bytes: cfg.max_request_bytes,
                registries: cfg.registries.clone(),
            },
            token,
            max_concurrent: cfg.max_concurrent,
            max_bytes_in_flight: cfg.max_bytes_in_flight,
        },
        stats.clone(),
    ));
    tokio::spawn(server.serve(listener));
    store.set_peer_tier(client.clone());
    tracing::info!(%listen, me = ?client.membership().me(), members = client.membership().members().len(), "serving the disk cache to peers");
    Ok(Some(Peers { client, stats }))
}
