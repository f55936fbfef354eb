//! Builds the endpoint's documents from the daemon's state: [`report`] (`GET /status`) and
//! [`profile`] (`GET /profile`). The document types and their text renderings are the
//! daemon's published contract and live in `weenv_snapshotter_api::status` (re-exported here).

use crate::layers::LayerStore;
use crate::metrics::Metrics;
use crate::peer::Peers;
use crate::store::{Kind, MetaStore, StoreError};
use std::sync::atomic::Ordering;
pub use weenv_snapshotter_api::status::{
    render_profile, render_text, CacheView, FileRead, LayerProfile, LayerView, MemoryView,
    PeerView, PeersView, ProfileReport, SnapshotCounts, StatusReport, TierBytes,
};

/// Resident set size of this process in bytes (0 if unknown).
pub fn process_rss() -> u64 {
    // statm: size resident shared text lib data dt, in pages.
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0);
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|p| u64::try_from(p).ok())
        .unwrap_or(4096);
    pages * page
}

/// Count snapshots by kind.
pub fn count_snapshots(store: &MetaStore) -> Result<SnapshotCounts, StoreError> {
    let mut c = SnapshotCounts::default();
    for r in store.list()? {
        match r.kind {
            Kind::Active => c.active += 1,
            Kind::View => c.view += 1,
            Kind::Committed => c.committed += 1,
        }
        if r.remote.is_some() {
            c.remote += 1;
        }
    }
    Ok(c)
}

/// Where frames came from, from the data path's counters and the peer tier's.
pub fn tiers(metrics: &Metrics, peers: Option<&Peers>) -> TierBytes {
    let c = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    TierBytes {
        local_disk: c(&metrics.l2_hit_bytes),
        peers: peers.map_or(0, |p| p.stats.bytes_from_peers()),
        registry: c(&metrics.bytes_fetched_on_demand)
            + c(&metrics.bytes_fetched_prefetch)
            + c(&metrics.bytes_fetched_fill),
    }
}

/// Build the report from the live layer store, the metadata store, the data path's counters
/// and the peer tier (if on).
pub fn report(
    store: &MetaStore,
    layers: &LayerStore,
    metrics: &Metrics,
    peers: Option<&Peers>,
) -> StatusReport {
    let ((mu, mc), (du, dc)) = layers.cache_usage();
    let mut lv: Vec<LayerView> = layers
        .status()
        .into_iter()
        .map(|l| LayerView {
            digest: l.digest.to_string(),
            path: l.path.display().to_string(),
            entries: l.entries as u64,
            toc_bytes: l.toc_bytes,
            bytes_total: l.bytes_total,
            bytes_cached: l.bytes_cached,
            bytes_fetched: l.bytes_fetched,
            bytes_filled: l.bytes_filled,
            bytes_prefetched: l.bytes_prefetched,
            bytes_read: l.bytes_read,
            frames_total: l.frames_total as u64,
            frames_cached: l.frames_cached as u64,
            fill: serde_json::to_value(l.fill)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default(),
            fill_error: l.fill_error,
            prefetch_frames: l.prefetch_frames,
            prefetch_done: l.prefetch_done,
            prefetch_error: l.prefetch_error,
            claimed_diff_id: l.claimed_diff_id.map(|d| d.to_string()),
            verified: l.verified,
            native: l.native,
            quarantined: l.quarantined,
        })
        .collect();
    lv.sort_by(|a, b| a.digest.cmp(&b.digest));
    StatusReport {
        version: env!("CARGO_PKG_VERSION").to_string(),
        mountpoint: layers.mountpoint().display().to_string(),
        passthrough: layers.passthrough_active(),
        snapshots: count_snapshots(store).unwrap_or_default(),
        layers: lv,
        cache: CacheView {
            memory_used: mu,
            memory_capacity: mc,
            disk_used: du,
            disk_capacity: dc,
        },
        memory: {
            let (tocs, frame_cache, in_flight) = layers.memory_usage();
            MemoryView {
                rss: process_rss(),
                tocs,
                frame_cache,
                in_flight,
            }
        },
        tiers: tiers(metrics, peers),
        peers: peers.map(Peers::view),
    }
}

/// The profile document of `layers`.
pub fn profile(layers: &LayerStore) -> ProfileReport {
    ProfileReport {
        layers: layers
            .accessed()
            .into_iter()
            .map(|(d, files)| LayerProfile {
                digest: d.to_string(),
                files: files
                    .into_iter()
                    .map(|(path, ranges)| FileRead { path, ranges })
                    .collect(),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resident_set_is_read() {
        assert!(process_rss() > 0);
    }
}
