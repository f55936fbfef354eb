//! Process-wide counters of the lazy data path, rendered in the Prometheus text format.
//!
//! Everything is a relaxed atomic: counters are monotonic, read only for exposition and tests.
//! FUSE operations are counted by [`OpGuard`] (RAII) so early returns are counted too; the
//! guard counts an error when [`OpGuard::fail`] was called before it drops.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// FUSE operations that are counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FuseOp {
    Lookup,
    Getattr,
    Readlink,
    Open,
    Read,
    Release,
    Opendir,
    Readdir,
    Readdirplus,
    Getxattr,
    Listxattr,
    Statfs,
    Access,
}

impl FuseOp {
    /// All counted operations, in exposition order.
    pub const ALL: [FuseOp; 13] = [
        FuseOp::Lookup,
        FuseOp::Getattr,
        FuseOp::Readlink,
        FuseOp::Open,
        FuseOp::Read,
        FuseOp::Release,
        FuseOp::Opendir,
        FuseOp::Readdir,
        FuseOp::Readdirplus,
        FuseOp::Getxattr,
        FuseOp::Listxattr,
        FuseOp::Statfs,
        FuseOp::Access,
    ];

    /// Label value.
    pub fn name(self) -> &'static str {
        match self {
            FuseOp::Lookup => "lookup",
            FuseOp::Getattr => "getattr",
            FuseOp::Readlink => "readlink",
            FuseOp::Open => "open",
            FuseOp::Read => "read",
            FuseOp::Release => "release",
            FuseOp::Opendir => "opendir",
            FuseOp::Readdir => "readdir",
            FuseOp::Readdirplus => "readdirplus",
            FuseOp::Getxattr => "getxattr",
            FuseOp::Listxattr => "listxattr",
            FuseOp::Statfs => "statfs",
            FuseOp::Access => "access",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Upper bounds (seconds) of the fetch latency histogram buckets.
pub const LATENCY_BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

/// Counters of the snapshotter data path.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Compressed bytes fetched from a source for on-demand reads (incl. read-ahead).
    pub bytes_fetched_on_demand: AtomicU64,
    /// Compressed bytes fetched from a source by the background fill.
    pub bytes_fetched_fill: AtomicU64,
    /// Compressed bytes fetched by start-up prefetch (the image's profile).
    pub bytes_fetched_prefetch: AtomicU64,
    /// Range requests sent to sources.
    pub range_requests: AtomicU64,
    /// Source range requests that failed.
    pub range_request_errors: AtomicU64,
    pub l1_hits: AtomicU64,
    pub l1_misses: AtomicU64,
    pub l2_hits: AtomicU64,
    pub l2_misses: AtomicU64,
    /// Frames evicted from L2.
    pub l2_evictions: AtomicU64,
    /// Frames whose content did not match the TOC digest.
    pub verification_failures: AtomicU64,
    /// Reads answered from frames (not passthrough).
    pub read_bytes_served: AtomicU64,
    /// Opens answered with FUSE passthrough.
    pub passthrough_opens: AtomicU64,
    /// Layers quarantined (their TOC disagreed with their tar, or their diff_id with the
    /// image's claim): reads of their files fail with EIO.
    pub layers_quarantined: AtomicU64,
    /// TOC entries whose tar header was checked before being served.
    pub header_checks: AtomicU64,
    /// Layers whose completion check (full tar walk + diff_id) passed.
    pub layers_verified: AtomicU64,
    fuse_ops: [AtomicU64; 13],
    fuse_errors: [AtomicU64; 13],
    latency_buckets: [AtomicU64; 12],
    latency_count: AtomicU64,
    latency_sum_micros: AtomicU64,
}

impl Metrics {
    /// New zeroed metrics.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one observation to the fetch latency histogram.
    pub fn observe_fetch_latency(&self, d: Duration) {
        let secs = d.as_secs_f64();
        for (i, le) in LATENCY_BUCKETS.iter().enumerate() {
            if secs <= *le {
                self.latency_buckets[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        self.latency_count.fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.latency_sum_micros.fetch_add(micros, Ordering::Relaxed);
    }

    /// Starts counting one FUSE operation.
    pub fn op(&self, op: FuseOp) -> OpGuard<'_> {
        self.fuse_ops[op.index()].fetch_add(1, Ordering::Relaxed);
        OpGuard {
            metrics: self,
            op,
            failed: false,
        }
    }

    /// Counts a FUSE error for `op` (for replies sent outside an [`OpGuard`], e.g. async reads).
    pub fn op_error(&self, op: FuseOp) {
        self.fuse_errors[op.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Number of `op` requests so far.
    pub fn fuse_op_count(&self, op: FuseOp) -> u64 {
        self.fuse_ops[op.index()].load(Ordering::Relaxed)
    }

    /// Number of `op` errors so far.
    pub fn fuse_error_count(&self, op: FuseOp) -> u64 {
        self.fuse_errors[op.index()].load(Ordering::Relaxed)
    }

    /// Prometheus text exposition (version 0.0.4).
    pub fn render(&self) -> String {
        let mut s = String::new();
        let counters: [(&str, &str, &AtomicU64); 17] = [
            (
                "weenv_fetch_bytes_on_demand_total",
                "Compressed bytes fetched for on-demand reads.",
                &self.bytes_fetched_on_demand,
            ),
            (
                "weenv_fetch_bytes_fill_total",
                "Compressed bytes fetched by background fill.",
                &self.bytes_fetched_fill,
            ),
            (
                "weenv_fetch_bytes_prefetch_total",
                "Compressed bytes fetched by start-up prefetch (image profile).",
                &self.bytes_fetched_prefetch,
            ),
            (
                "weenv_fetch_range_requests_total",
                "Range requests sent to blob sources.",
                &self.range_requests,
            ),
            (
                "weenv_fetch_range_request_errors_total",
                "Range requests that failed.",
                &self.range_request_errors,
            ),
            (
                "weenv_cache_l1_hits_total",
                "Frame hits in the memory cache.",
                &self.l1_hits,
            ),
            (
                "weenv_cache_l1_misses_total",
                "Frame misses in the memory cache.",
                &self.l1_misses,
            ),
            (
                "weenv_cache_l2_hits_total",
                "Frame hits in the disk cache.",
                &self.l2_hits,
            ),
            (
                "weenv_cache_l2_misses_total",
                "Frame misses in the disk cache.",
                &self.l2_misses,
            ),
            (
                "weenv_cache_l2_evictions_total",
                "Frames and complete-file copies evicted from the disk cache.",
                &self.l2_evictions,
            ),
            (
                "weenv_verification_failures_total",
                "Frames that failed digest verification.",
                &self.verification_failures,
            ),
            (
                "weenv_read_bytes_served_total",
                "File bytes served by the FUSE read handler.",
                &self.read_bytes_served,
            ),
            (
                "weenv_passthrough_opens_total",
                "Opens answered with FUSE passthrough.",
                &self.passthrough_opens,
            ),
            (
                "weenv_layer_quarantined_total",
                "Layers quarantined: TOC and tar disagree, or the diff_id is not the claimed one.",
                &self.layers_quarantined,
            ),
            (
                "weenv_header_checks_total",
                "TOC entries whose tar header was checked before they were served.",
                &self.header_checks,
            ),
            (
                "weenv_layer_verified_total",
                "Layers whose completion check (tar walk + diff_id) passed.",
                &self.layers_verified,
            ),
            (
                "weenv_fetch_latency_observations_total",
                "Fetches timed (same as histogram count).",
                &self.latency_count,
            ),
        ];
        for (name, help, v) in counters {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} counter");
            let _ = writeln!(s, "{name} {}", v.load(Ordering::Relaxed));
        }
        let _ = writeln!(s, "# HELP weenv_fuse_ops_total FUSE requests by operation.");
        let _ = writeln!(s, "# TYPE weenv_fuse_ops_total counter");
        for op in FuseOp::ALL {
            let _ = writeln!(
                s,
                "weenv_fuse_ops_total{{op=\"{}\"}} {}",
                op.name(),
                self.fuse_op_count(op)
            );
        }
        let _ = writeln!(
            s,
            "# HELP weenv_fuse_errors_total FUSE requests answered with an error."
        );
        let _ = writeln!(s, "# TYPE weenv_fuse_errors_total counter");
        for op in FuseOp::ALL {
            let _ = writeln!(
                s,
                "weenv_fuse_errors_total{{op=\"{}\"}} {}",
                op.name(),
                self.fuse_error_count(op)
            );
        }
        let _ = writeln!(
            s,
            "# HELP weenv_fetch_latency_seconds Latency of source range requests."
        );
        let _ = writeln!(s, "# TYPE weenv_fetch_latency_seconds histogram");
        for (i, le) in LATENCY_BUCKETS.iter().enumerate() {
            let n = self.latency_buckets[i].load(Ordering::Relaxed);
            let _ = writeln!(s, "weenv_fetch_latency_seconds_bucket{{le=\"{le}\"}} {n}");
        }
        let count = self.latency_count.load(Ordering::Relaxed);
        let _ = writeln!(
            s,
            "weenv_fetch_latency_seconds_bucket{{le=\"+Inf\"}} {count}"
        );
        let sum = self.latency_sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(s, "weenv_fetch_latency_seconds_sum {sum}");
        let _ = writeln!(s, "weenv_fetch_latency_seconds_count {count}");
        s
    }
}

/// Counts one FUSE operation; counts an error on drop if [`fail`](Self::fail) was called.
pub struct OpGuard<'a> {
    metrics: &'a Metrics,
    op: FuseOp,
    failed: bool,
}

impl OpGuard<'_> {
    /// Marks the operation failed.
    pub fn fail(&mut self) {
        self.failed = true;
    }
}

impl Drop for OpGuard<'_> {
    fn drop(&mut self) {
        if self.failed {
            self.metrics.op_error(self.op);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_has_counters_and_histogram() {
        let m = Metrics::new();
        m.l1_hits.fetch_add(3, Ordering::Relaxed);
        m.observe_fetch_latency(Duration::from_millis(3));
        {
            let mut g = m.op(FuseOp::Read);
            g.fail();
        }
        let _ok = m.op(FuseOp::Lookup);
        let text = m.render();
        assert!(text.contains("weenv_cache_l1_hits_total 3"));
        assert!(text.contains("weenv_fuse_errors_total{op=\"read\"} 1"));
        assert!(text.contains("weenv_fuse_ops_total{op=\"lookup\"} 1"));
        assert!(text.contains("weenv_fetch_latency_seconds_bucket{le=\"0.0025\"} 0"));
        assert!(text.contains("weenv_fetch_latency_seconds_bucket{le=\"0.005\"} 1"));
        assert!(text.contains("weenv_fetch_latency_seconds_count 1"));
    }
}
