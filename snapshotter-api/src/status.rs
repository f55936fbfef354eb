//! The documents of the daemon's observability endpoint: `GET /status` ([`StatusReport`]:
//! mounted layers with fill progress, cache usage, snapshot counts, memory) and `GET /profile`
//! ([`ProfileReport`]: files read per layer), with their text renderings. Built and
//! serialized by the daemon (`weenv_snapshotter::status`), parsed and printed by `weenv status`
//! and `weenv profile`. Fields added later carry `#[serde(default)]` so a newer CLI reads an
//! older daemon's document.

use serde::{Deserialize, Serialize};

/// Snapshot counts by kind.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotCounts {
    pub active: u64,
    pub view: u64,
    pub committed: u64,
    /// Committed snapshots backed by a FUSE layer.
    pub remote: u64,
}

/// One mounted layer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerView {
    pub digest: String,
    pub path: String,
    pub entries: u64,
    /// Heap bytes of the layer's in-memory TOC.
    #[serde(default)]
    pub toc_bytes: u64,
    pub bytes_total: u64,
    pub bytes_cached: u64,
    /// Compressed bytes of the cached frames (what fetching them cost on the link).
    #[serde(default)]
    pub bytes_fetched: u64,
    /// Of `bytes_fetched`, what the background fill fetched.
    #[serde(default)]
    pub bytes_filled: u64,
    /// Of `bytes_fetched`, what the start-up prefetch (image profile) fetched.
    #[serde(default)]
    pub bytes_prefetched: u64,
    /// File bytes read from the layer since it was mounted or the profile was last reset
    /// (chunk granularity; a passthrough open counts the whole file).
    #[serde(default)]
    pub bytes_read: u64,
    pub frames_total: u64,
    pub frames_cached: u64,
    /// `disabled`, `pending`, `running`, `done`, `failed`.
    pub fill: String,
    pub fill_error: Option<String>,
    /// Start-up prefetch: frames the image profile names, and how many are cached.
    #[serde(default)]
    pub prefetch_frames: u64,
    #[serde(default)]
    pub prefetch_done: u64,
    #[serde(default)]
    pub prefetch_error: Option<String>,
    /// The diff_id the image claims for the layer (unverified until `verified`).
    #[serde(default)]
    pub claimed_diff_id: Option<String>,
    /// The completion check passed: the whole tar stream hashes to the claimed diff_id.
    #[serde(default)]
    pub verified: bool,
    /// New mounts use the layer's native tree instead of its FUSE directory.
    #[serde(default)]
    pub native: bool,
    /// Why the layer is quarantined (every read of its files fails with EIO), if it is.
    #[serde(default)]
    pub quarantined: Option<String>,
}

/// Cache usage in bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheView {
    pub memory_used: u64,
    pub memory_capacity: u64,
    pub disk_used: u64,
    pub disk_capacity: u64,
}

/// Daemon memory in bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryView {
    /// Resident set of the process (`/proc/self/statm`).
    pub rss: u64,
    /// In-memory TOCs of all layers (compact tables, frames, read state).
    pub tocs: u64,
    /// Frames in the memory cache (L1).
    pub frame_cache: u64,
    /// Compressed bytes of range requests in flight.
    pub in_flight: u64,
}

/// Where the frames this node read came from, in bytes since start.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TierBytes {
    /// Uncompressed frame bytes read from the node's disk cache.
    pub local_disk: u64,
    /// Compressed size of verified frames received from peer nodes.
    pub peers: u64,
    /// Compressed bytes fetched from the registry (on demand, prefetch and fill, including the
    /// frames fetched on a peer's behalf).
    pub registry: u64,
}

/// One peer node as this node sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeerView {
    pub addr: String,
    /// In the current membership (a former member keeps its counters).
    pub member: bool,
    /// Not ejected now.
    pub live: bool,
    pub requests: u64,
    /// Failed, slow (past the hedge delay) or corrupt answers.
    pub errors: u64,
    /// Frames that failed verification (never used).
    pub corrupt_frames: u64,
    pub ejections: u64,
    /// Compressed size of the verified frames received.
    pub bytes: u64,
    pub mean_latency_ms: f64,
}

/// The peer cache (issue 14).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PeersView {
    /// This node's member address, if known.
    pub me: Option<String>,
    /// Members, this node included.
    pub members: u64,
    pub peers: Vec<PeerView>,
    /// Frames asked of peers that came from the registry instead.
    pub bypassed_frames: u64,
    /// Requests answered for peers, and the uncompressed bytes sent.
    pub served_requests: u64,
    pub served_bytes: u64,
    /// Peer requests refused (busy, invalid, unauthorised, fetch failed).
    pub refused: u64,
}

/// The whole status document.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StatusReport {
    pub version: String,
    pub mountpoint: String,
    pub passthrough: bool,
    pub snapshots: SnapshotCounts,
    pub layers: Vec<LayerView>,
    pub cache: CacheView,
    #[serde(default)]
    pub memory: MemoryView,
    #[serde(default)]
    pub tiers: TierBytes,
    /// `None` when the peer cache is off.
    #[serde(default)]
    pub peers: Option<PeersView>,
}

/// A file read from a layer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRead {
    /// Path relative to the image root.
    pub path: String,
    /// `(offset, length)` ranges read (chunk granularity); empty: the whole file.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranges: Vec<(u64, u64)>,
}

/// Files read from one layer (`GET /profile`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerProfile {
    pub digest: String,
    /// First-read order.
    pub files: Vec<FileRead>,
}

/// `GET /profile`: per mounted layer, the files read since it was mounted or the last reset.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProfileReport {
    pub layers: Vec<LayerProfile>,
}

/// The profile file `weenv profile` prints (see `weenv_format::prefetch`): `/path` lines, or
/// `/path<TAB>off+len,...` when only part of the file was read; files of the `only` layers
/// (all when empty), deduplicated, in layer order then first-read order. Pure.
pub fn render_profile(r: &ProfileReport, only: &[String]) -> String {
    let mut seen = std::collections::HashSet::new();
    let mut s = String::new();
    for l in r.layers.iter().filter(|l| {
        only.is_empty()
            || only
                .iter()
                .any(|o| l.digest.ends_with(o.trim_start_matches("sha256:")))
    }) {
        for f in &l.files {
            if seen.insert(f.path.as_str()) {
                let line = weenv_format::prefetch::ProfileLine {
                    path: format!("/{}", f.path),
                    ranges: f.ranges.clone(),
                };
                s.push_str(&line.render());
                s.push('\n');
            }
        }
    }
    s
}

/// Human-readable rendering for `weenv status`.
pub fn render_text(r: &StatusReport) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let _ = writeln!(
        s,
        "weenv-snapshotter {}  mountpoint {}  passthrough {}",
        r.version, r.mountpoint, r.passthrough
    );
    let _ = writeln!(
        s,
        "snapshots: {} active, {} view, {} committed ({} remote)",
        r.snapshots.active, r.snapshots.view, r.snapshots.committed, r.snapshots.remote
    );
    let (c, m) = (&r.cache, &r.memory);
    let _ = writeln!(
        s,
        "cache: memory {:.1}/{:.1} MiB, disk {:.1}/{:.1} MiB\n\
         memory: resident {:.1} MiB (TOCs {:.1} MiB, frame cache {:.1} MiB, in flight {:.1} MiB)",
        mib(c.memory_used),
        mib(c.memory_capacity),
        mib(c.disk_used),
        mib(c.disk_capacity),
        mib(m.rss),
        mib(m.tocs),
        mib(m.frame_cache),
        mib(m.in_flight)
    );
    let t = &r.tiers;
    let _ = writeln!(
        s,
        "frames from: local disk {:.1} MiB, peers {:.1} MiB, registry {:.1} MiB",
        mib(t.local_disk),
        mib(t.peers),
        mib(t.registry)
    );
    if let Some(p) = &r.peers {
        let _ = writeln!(
            s,
            "peers: {} members (me {}), served {} requests / {:.1} MiB to peers, {} refused, {} frames bypassed to the registry",
            p.members,
            p.me.as_deref().unwrap_or("unknown"),
            p.served_requests,
            mib(p.served_bytes),
            p.refused,
            p.bypassed_frames
        );
        for v in &p.peers {
            let _ = writeln!(
                s,
                "  {}  {}{}  {} requests, {} errors, {} corrupt frames, {} ejections, {:.1} MiB, mean {:.1} ms",
                v.addr,
                if v.live { "live" } else { "EJECTED" },
                if v.member { "" } else { " (gone)" },
                v.requests,
                v.errors,
                v.corrupt_frames,
                v.ejections,
                mib(v.bytes),
                v.mean_latency_ms
            );
        }
    }
    let quarantined = r.layers.iter().filter(|l| l.quarantined.is_some()).count();
    let native = r.layers.iter().filter(|l| l.native).count();
    let _ = writeln!(
        s,
        "layers: {} ({native} native){}",
        r.layers.len(),
        if quarantined > 0 {
            format!(" ({quarantined} QUARANTINED)")
        } else {
            String::new()
        }
    );
    for l in &r.layers {
        let pct = if l.bytes_total == 0 {
            100.0
        } else {
            100.0 * l.bytes_cached as f64 / l.bytes_total as f64
        };
        let _ = writeln!(
            s,
            "  {}  {:>6} entries (TOC {:.1} MiB)  {:>9.1} MiB  cached {:5.1}%  fill {}{}{}{}{}",
            &l.digest[..l.digest.len().min(19)],
            l.entries,
            mib(l.toc_bytes),
            mib(l.bytes_total),
            pct,
            l.fill,
            l.fill_error
                .as_deref()
                .map(|e| format!(" ({e})"))
                .unwrap_or_default(),
            if l.prefetch_frames > 0 {
                format!(
                    "  prefetch {}/{} frames{}",
                    l.prefetch_done,
                    l.prefetch_frames,
                    l.prefetch_error
                        .as_deref()
                        .map(|e| format!(" ({e})"))
                        .unwrap_or_default()
                )
            } else {
                String::new()
            },
            if l.verified { "  verified" } else { "" },
            if l.native { "  native" } else { "" }
        );
        if let Some(q) = &l.quarantined {
            let _ = writeln!(s, "    QUARANTINED (reads fail with EIO): {q}");
        }
    }
    s
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_text() {
        let r = StatusReport {
            version: "0.1.0".into(),
            mountpoint: "/m".into(),
            passthrough: true,
            snapshots: SnapshotCounts {
                active: 1,
                view: 0,
                committed: 3,
                remote: 2,
            },
            layers: vec![LayerView {
                digest: "sha256:abcdef0123456789abcdef".into(),
                path: "/m/abc".into(),
                entries: 10,
                toc_bytes: 1 << 20,
                bytes_total: 2 << 20,
                bytes_cached: 1 << 20,
                bytes_fetched: 400_000,
                bytes_filled: 100_000,
                bytes_prefetched: 50_000,
                bytes_read: 300_000,
                frames_total: 2,
                frames_cached: 1,
                fill: "running".into(),
                fill_error: None,
                prefetch_frames: 4,
                prefetch_done: 3,
                prefetch_error: None,
                claimed_diff_id: Some("sha256:d".into()),
                verified: false,
                native: false,
                quarantined: Some("diff_id mismatch: x".into()),
            }],
            cache: CacheView::default(),
            memory: MemoryView {
                rss: 30 << 20,
                tocs: 1 << 20,
                frame_cache: 2 << 20,
                in_flight: 0,
            },
            tiers: TierBytes {
                local_disk: 1 << 20,
                peers: 2 << 20,
                registry: 3 << 20,
            },
            peers: Some(PeersView {
                me: Some("10.0.0.1:7470".into()),
                members: 2,
                peers: vec![PeerView {
                    addr: "10.0.0.2:7470".into(),
                    member: true,
                    live: false,
                    requests: 4,
                    errors: 1,
                    corrupt_frames: 1,
                    ejections: 1,
                    bytes: 2 << 20,
                    mean_latency_ms: 2.5,
                }],
                ..Default::default()
            }),
        };
        let j = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<StatusReport>(&j).unwrap(), r);
        let t = render_text(&r);
        assert!(t.contains("cached  50.0%"), "{t}");
        assert!(t.contains("3 committed (2 remote)"));
        assert!(t.contains("prefetch 3/4 frames"), "{t}");
        assert!(t.contains("layers: 1 (0 native) (1 QUARANTINED)"), "{t}");
        assert!(
            t.contains("QUARANTINED (reads fail with EIO): diff_id mismatch: x"),
            "{t}"
        );
        // a document of an older daemon still parses
        let old = j
            .replace(r#","claimed_diff_id":"sha256:d""#, "")
            .replace(r#","verified":false"#, "")
            .replace(r#","quarantined":"diff_id mismatch: x""#, "");
        assert!(!old.contains("quarantined"), "{old}");
        assert!(
            serde_json::from_str::<StatusReport>(&old).unwrap().layers[0]
                .quarantined
                .is_none()
        );
        assert!(
            t.contains("memory: resident 30.0 MiB (TOCs 1.0 MiB, frame cache 2.0 MiB"),
            "{t}"
        );
        assert!(t.contains("10 entries (TOC 1.0 MiB)"), "{t}");
        assert!(
            t.contains("frames from: local disk 1.0 MiB, peers 2.0 MiB, registry 3.0 MiB"),
            "{t}"
        );
        assert!(
            t.contains(
                "10.0.0.2:7470  EJECTED  4 requests, 1 errors, 1 corrupt frames, 1 ejections"
            ),
            "{t}"
        );
        let no_peers = j.replace(r#","peers":{"#, r#","peerz":{"#);
        assert!(serde_json::from_str::<StatusReport>(&no_peers).is_ok());
    }

    fn whole(p: &str) -> FileRead {
        FileRead {
            path: p.into(),
            ranges: Vec::new(),
        }
    }

    #[test]
    fn profile_rendering() {
        let r = ProfileReport {
            layers: vec![
                LayerProfile {
                    digest: "sha256:aa".into(),
                    files: vec![
                        FileRead {
                            path: "usr/bin/python3.11".into(),
                            ranges: vec![(0, 1 << 20), (3 << 20, 1 << 20)],
                        },
                        whole("etc/ld.so.cache"),
                    ],
                },
                LayerProfile {
                    digest: "sha256:bb".into(),
                    files: vec![whole("etc/ld.so.cache"), whole("app/main.py")],
                },
            ],
        };
        assert_eq!(
            render_profile(&r, &[]),
            "/usr/bin/python3.11\t0+1048576,3145728+1048576\n/etc/ld.so.cache\n/app/main.py\n"
        );
        assert_eq!(
            render_profile(&r, &["sha256:bb".into()]),
            "/etc/ld.so.cache\n/app/main.py\n"
        );
        let j = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<ProfileReport>(&j).unwrap(), r);
    }
}
