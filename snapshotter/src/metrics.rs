//! Process-wide counters of the lazy data path, rendered in the Prometheus text format
//! (version 0.0.4) by `prometheus-client`.
//!
//! Counters are relaxed atomics (monotonic, read only for exposition and tests); the fetch
//! latency is a prometheus-client [`Histogram`]. [`Exposition`] reads them at scrape time and is
//! what every `/metrics` family of the daemon goes through (also the service's and the store's).
//! FUSE operations are counted by [`OpGuard`] (RAII) so early returns are counted too; the
//! guard counts an error when [`OpGuard::fail`] was called before it drops. A read answered
//! from a spawned task takes its guard along ([`Metrics::op_owned`]), so it is counted when its
//! reply is sent.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{prometheus_text, DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

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
#[derive(Debug)]
pub struct Metrics {
    /// Compressed bytes fetched from a source for on-demand reads (incl. read-ahead).
    pub bytes_fetched_on_demand: AtomicU64,
    /// Compressed bytes fetched from a source by the background fill.
    pub bytes_fetched_fill: AtomicU64,
    /// Compressed bytes fetched by start-up prefetch (the image's profile).
    pub bytes_fetched_prefetch: AtomicU64,
    /// Frames readers took out of queued background (prefetch, fill) requests and fetched
    /// themselves, as demand (`fetch::link::Carve`).
    pub link_promotions: AtomicU64,
    /// Demand requests (on-demand reads, read-ahead) that held background requests back and
    /// started their quiet time (`fetch::link`): the reader's command is not the one the
    /// queued prefetch is for, or reads frames nobody queued.
    pub link_demand_unpredicted: AtomicU64,
    /// Demand requests of frames taken out of queued prefetch requests that follow the
    /// prefetch (`fetch::link::LinkQueue::predicted`): no quiet time.
    pub link_demand_predicted: AtomicU64,
    /// Range requests sent to sources.
    pub range_requests: AtomicU64,
    /// Source range requests that failed.
    pub range_request_errors: AtomicU64,
    pub l1_hits: AtomicU64,
    pub l1_misses: AtomicU64,
    pub l2_hits: AtomicU64,
    pub l2_misses: AtomicU64,
    /// Uncompressed frame bytes read from the disk cache.
    pub l2_hit_bytes: AtomicU64,
    /// Frames evicted from L2.
    pub l2_evictions: AtomicU64,
    /// Frames whose content did not match the TOC digest.
    pub verification_failures: AtomicU64,
    /// Reads answered from frames (not passthrough).
    pub read_bytes_served: AtomicU64,
    /// Opens answered with FUSE passthrough.
    pub passthrough_opens: AtomicU64,
    /// CPU sampling intervals in which other processes kept the node busy (the fill paused).
    pub cpu_busy_intervals: AtomicU64,
    /// Windows without pauses the fill got after a full pause (its minimum share of a busy
    /// node, `fill.busy_min_share_percent`).
    pub fill_share_windows: AtomicU64,
    /// Layers quarantined (their TOC disagreed with their tar, or their diff_id with the
    /// image's claim): reads of their files fail with EIO.
    pub layers_quarantined: AtomicU64,
    /// TOC entries whose tar header was checked before being served.
    pub header_checks: AtomicU64,
    /// Layers whose completion check (full tar walk + diff_id) passed.
    pub layers_verified: AtomicU64,
    /// Layers switched to a native tree (built, or found after a restart).
    pub native_layers: AtomicU64,
    fuse_ops: [AtomicU64; 13],
    fuse_errors: [AtomicU64; 13],
    /// Per operation: microseconds from the request's handler to its reply (async reads
    /// included: the time the kernel's caller waited in the daemon).
    fuse_micros: [AtomicU64; 13],
    /// Fetch latency (seconds), a prometheus-client histogram (shared, cheap to clone).
    latency: Histogram,
    /// Observations of `latency` (its count is not readable outside prometheus-client tests).
    latency_count: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            bytes_fetched_on_demand: AtomicU64::default(),
            bytes_fetched_fill: AtomicU64::default(),
            bytes_fetched_prefetch: AtomicU64::default(),
            link_promotions: AtomicU64::default(),
            link_demand_unpredicted: AtomicU64::default(),
            link_demand_predicted: AtomicU64::default(),
            range_requests: AtomicU64::default(),
            range_request_errors: AtomicU64::default(),
            l1_hits: AtomicU64::default(),
            l1_misses: AtomicU64::default(),
            l2_hits: AtomicU64::default(),
            l2_misses: AtomicU64::default(),
            l2_hit_bytes: AtomicU64::default(),
            l2_evictions: AtomicU64::default(),
            verification_failures: AtomicU64::default(),
            read_bytes_served: AtomicU64::default(),
            passthrough_opens: AtomicU64::default(),
            cpu_busy_intervals: AtomicU64::default(),
            fill_share_windows: AtomicU64::default(),
            layers_quarantined: AtomicU64::default(),
            header_checks: AtomicU64::default(),
            layers_verified: AtomicU64::default(),
            native_layers: AtomicU64::default(),
            fuse_ops: Default::default(),
            fuse_errors: Default::default(),
            fuse_micros: Default::default(),
            latency: Histogram::new(LATENCY_BUCKETS),
            latency_count: AtomicU64::default(),
        }
    }
}

impl Metrics {
    /// New zeroed metrics.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one observation to the fetch latency histogram.
    pub fn observe_fetch_latency(&self, d: Duration) {
        self.latency.observe(d.as_secs_f64());
        self.latency_count.fetch_add(1, Ordering::Relaxed);
    }

    /// Starts counting one FUSE operation.
    pub fn op(&self, op: FuseOp) -> OpGuard<'_> {
        self.fuse_ops[op.index()].fetch_add(1, Ordering::Relaxed);
        OpGuard {
            metrics: Holder::Borrowed(self),
            op,
            failed: false,
            started: std::time::Instant::now(),
        }
    }

    /// Starts counting one FUSE operation whose reply is sent from a spawned task (async
    /// reads): the guard owns a handle on the metrics and moves into the task.
    pub fn op_owned(self: &Arc<Self>, op: FuseOp) -> OpGuard<'static> {
        self.fuse_ops[op.index()].fetch_add(1, Ordering::Relaxed);
        OpGuard {
            metrics: Holder::Owned(Arc::clone(self)),
            op,
            failed: false,
            started: std::time::Instant::now(),
        }
    }

    /// Counts a FUSE error for `op` (for replies sent outside an [`OpGuard`]).
    pub fn op_error(&self, op: FuseOp) {
        self.fuse_errors[op.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Number of `op` requests so far.
    pub fn fuse_op_count(&self, op: FuseOp) -> u64 {
        self.fuse_ops[op.index()].load(Ordering::Relaxed)
    }

    /// Microseconds spent answering `op` requests so far.
    pub fn fuse_op_micros(&self, op: FuseOp) -> u64 {
        self.fuse_micros[op.index()].load(Ordering::Relaxed)
    }

    /// Number of `op` errors so far.
    pub fn fuse_error_count(&self, op: FuseOp) -> u64 {
        self.fuse_errors[op.index()].load(Ordering::Relaxed)
    }

    /// Prometheus text exposition (version 0.0.4), encoded by prometheus-client.
    pub fn render(&self) -> String {
        let mut e = Exposition::new();
        let counters: [(&'static str, &'static str, &AtomicU64); 24] = [
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
                "weenv_fetch_link_promotions_total",
                "Frames readers took out of queued background requests (fetched alone, as demand).",
                &self.link_promotions,
            ),
            (
                "weenv_fetch_link_demand_unpredicted_total",
                "Demand requests that started the background quiet time.",
                &self.link_demand_unpredicted,
            ),
            (
                "weenv_fetch_link_demand_predicted_total",
                "Demand requests of frames just ahead of the prefetch (no quiet time).",
                &self.link_demand_predicted,
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
                "weenv_cache_l2_hit_bytes_total",
                "Uncompressed frame bytes read from the disk cache.",
                &self.l2_hit_bytes,
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
                "weenv_fill_cpu_busy_intervals_total",
                "CPU sampling intervals (250 ms) in which other processes used at least fill.busy_cpu_percent of the node's CPU time: the fill paused.",
                &self.cpu_busy_intervals,
            ),
            (
                "weenv_fill_share_windows_total",
                "Windows without pauses the fill got after a pause of fill.busy_max_pause_ms (its minimum share of a busy node, fill.busy_min_share_percent).",
                &self.fill_share_windows,
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
                "weenv_native_layers_total",
                "Layers switched to a native tree (new mounts use it as their lowerdir).",
                &self.native_layers,
            ),
            (
                "weenv_fetch_latency_observations_total",
                "Fetches timed (same as histogram count).",
                &self.latency_count,
            ),
        ];
        for (name, help, v) in counters {
            e.counter(name, help, v.load(Ordering::Relaxed));
        }
        let by_op = |counts: &[AtomicU64; 13]| {
            FuseOp::ALL
                .map(|op| (op.name(), counts[op.index()].load(Ordering::Relaxed)))
                .to_vec()
        };
        e.counter_family(
            "weenv_fuse_ops_total",
            "FUSE requests by operation.",
            "op",
            by_op(&self.fuse_ops),
        );
        e.counter_family(
            "weenv_fuse_errors_total",
            "FUSE requests answered with an error.",
            "op",
            by_op(&self.fuse_errors),
        );
        e.counter_family(
            "weenv_fuse_op_microseconds_total",
            "Time from a FUSE request's handler to its reply, by operation (async reads: until their frames arrived).",
            "op",
            by_op(&self.fuse_micros),
        );
        e.histogram(
            "weenv_fetch_latency_seconds",
            "Latency of source range requests.",
            self.latency.clone(),
        );
        e.render()
    }
}

/// Metric families read at scrape time, encoded in the Prometheus text format (version 0.0.4)
/// by prometheus-client, in the order they were added.
///
/// The values live where they are counted (atomics of [`Metrics`], the service's counters, the
/// metadata store); an `Exposition` takes a reading of them and is a prometheus-client
/// [`Collector`]. Names are given in full (`..._total` for counters), as scrapers see them.
#[derive(Debug, Default)]
pub struct Exposition {
    families: Vec<Family>,
}

#[derive(Debug)]
struct Family {
    name: &'static str,
    help: &'static str,
    samples: Samples,
}

#[derive(Debug)]
enum Samples {
    Counter(u64),
    CounterFamily(&'static str, Vec<(String, u64)>),
    Gauge(&'static str, Vec<(String, u64)>),
    Histogram(Histogram),
}

impl Exposition {
    /// An empty exposition.
    pub fn new() -> Self {
        Self::default()
    }

    /// A counter without labels; `name` ends in `_total`.
    pub fn counter(&mut self, name: &'static str, help: &'static str, value: u64) {
        self.push(name, help, Samples::Counter(value));
    }

    /// A counter with one label `label`, one sample per `(label value, count)`.
    pub fn counter_family<L: Into<String>>(
        &mut self,
        name: &'static str,
        help: &'static str,
        label: &'static str,
        values: Vec<(L, u64)>,
    ) {
        let values = values.into_iter().map(|(l, v)| (l.into(), v)).collect();
        self.push(name, help, Samples::CounterFamily(label, values));
    }

    /// A gauge with one label `label`, one sample per `(label value, value)`.
    pub fn gauge_family<L: Into<String>>(
        &mut self,
        name: &'static str,
        help: &'static str,
        label: &'static str,
        values: Vec<(L, u64)>,
    ) {
        let values = values.into_iter().map(|(l, v)| (l.into(), v)).collect();
        self.push(name, help, Samples::Gauge(label, values));
    }

    /// A histogram (`_bucket`, `_sum`, `_count` series).
    pub fn histogram(&mut self, name: &'static str, help: &'static str, h: Histogram) {
        self.push(name, help, Samples::Histogram(h));
    }

    fn push(&mut self, name: &'static str, help: &'static str, samples: Samples) {
        self.families.push(Family {
            name,
            help,
            samples,
        });
    }

    /// The text exposition (version 0.0.4); empty if encoding failed (it writes to a `String`,
    /// so only a broken invariant of prometheus-client could make it fail).
    pub fn render(self) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(self));
        let mut out = String::new();
        match prometheus_text::encode(&mut out, &registry) {
            Ok(()) => out,
            Err(e) => {
                tracing::warn!(error = %e, "encoding metrics failed");
                String::new()
            }
        }
    }
}

/// prometheus-client appends `_total` to counter names itself.
fn counter_name(name: &str) -> &str {
    name.strip_suffix("_total").unwrap_or(name)
}

impl Collector for Exposition {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for f in &self.families {
            match &f.samples {
                Samples::Counter(v) => {
                    let m = encoder.encode_descriptor(
                        counter_name(f.name),
                        f.help,
                        None,
                        MetricType::Counter,
                    )?;
                    ConstCounter::new(*v).encode(m)?;
                }
                Samples::CounterFamily(key, values) => {
                    let mut m = encoder.encode_descriptor(
                        counter_name(f.name),
                        f.help,
                        None,
                        MetricType::Counter,
                    )?;
                    for (value_label, v) in values {
                        ConstCounter::new(*v)
                            .encode(m.encode_family(&[(*key, value_label.as_str())])?)?;
                    }
                }
                Samples::Gauge(key, values) => {
                    let mut m =
                        encoder.encode_descriptor(f.name, f.help, None, MetricType::Gauge)?;
                    for (value_label, v) in values {
                        ConstGauge::new(*v)
                            .encode(m.encode_family(&[(*key, value_label.as_str())])?)?;
                    }
                }
                Samples::Histogram(h) => {
                    let m = encoder.encode_descriptor(f.name, f.help, None, h.metric_type())?;
                    h.encode(m)?;
                }
            }
        }
        Ok(())
    }
}

/// Rate limit of hot-path log lines: [`LogLimit::allow`] is true at most once per second.
#[derive(Debug)]
pub struct LogLimit {
    started: std::time::Instant,
    /// Seconds after `started` (+1) of the last allowed line.
    last: AtomicU64,
}

impl Default for LogLimit {
    fn default() -> Self {
        LogLimit {
            started: std::time::Instant::now(),
            last: AtomicU64::new(0),
        }
    }
}

impl LogLimit {
    /// True at most once per second.
    pub fn allow(&self) -> bool {
        let now = self.started.elapsed().as_secs() + 1;
        let last = self.last.load(Ordering::Relaxed);
        now > last
            && self
                .last
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}

/// Counts one FUSE operation; counts an error on drop if [`fail`](Self::fail) was called.
pub struct OpGuard<'a> {
    metrics: Holder<'a>,
    op: FuseOp,
    failed: bool,
    started: std::time::Instant,
}

/// The metrics an [`OpGuard`] counts into: borrowed for replies sent from the FUSE thread,
/// owned for replies sent from a spawned task.
enum Holder<'a> {
    Borrowed(&'a Metrics),
    Owned(Arc<Metrics>),
}

impl OpGuard<'_> {
    /// Marks the operation failed.
    pub fn fail(&mut self) {
        self.failed = true;
    }
}

impl Drop for OpGuard<'_> {
    fn drop(&mut self) {
        let m = match &self.metrics {
            Holder::Borrowed(m) => *m,
            Holder::Owned(m) => m,
        };
        if self.failed {
            m.op_error(self.op);
        }
        let us = u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX);
        m.fuse_micros[self.op.index()].fetch_add(us, Ordering::Relaxed);
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
        let shared = Arc::new(Metrics::new());
        let mut moved = shared.op_owned(FuseOp::Read);
        std::thread::spawn(move || moved.fail()).join().ok();
        assert_eq!(shared.fuse_op_count(FuseOp::Read), 1);
        assert_eq!(shared.fuse_error_count(FuseOp::Read), 1);
        {
            let _slow = shared.op(FuseOp::Getxattr);
            std::thread::sleep(Duration::from_millis(2));
        }
        assert!(shared.fuse_op_micros(FuseOp::Getxattr) >= 2000);
        assert!(shared
            .render()
            .contains("weenv_fuse_op_microseconds_total{op=\"getxattr\"}"));
        let text = m.render();
        assert!(text.contains("weenv_cache_l1_hits_total 3"));
        assert!(text.contains("weenv_fuse_errors_total{op=\"read\"} 1"));
        assert!(text.contains("weenv_fuse_ops_total{op=\"lookup\"} 1"));
        assert!(text.contains("weenv_fetch_latency_seconds_bucket{le=\"0.0025\"} 0"));
        assert!(text.contains("weenv_fetch_latency_seconds_bucket{le=\"0.005\"} 1"));
        assert!(text.contains("weenv_fetch_latency_seconds_count 1"));
        assert!(text.contains("weenv_fetch_latency_observations_total 1"));
    }

    #[test]
    fn exposition_is_prometheus_text_in_insertion_order() {
        let mut e = Exposition::new();
        e.counter("a_total", "Plain counter.", 2);
        e.counter_family("b_total", "By op.", "op", vec![("x", 1), ("y", 0)]);
        e.gauge_family("c", "By kind.", "kind", vec![("k", 7)]);
        let h = Histogram::new([0.5, 1.0]);
        h.observe(0.25);
        h.observe(0.75);
        e.histogram("d_seconds", "Latency.", h);
        assert_eq!(
            e.render(),
            "# HELP a_total Plain counter.\n# TYPE a_total counter\na_total 2\n\
             # HELP b_total By op.\n# TYPE b_total counter\n\
             b_total{op=\"x\"} 1\nb_total{op=\"y\"} 0\n\
             # HELP c By kind.\n# TYPE c gauge\nc{kind=\"k\"} 7\n\
             # HELP d_seconds Latency.\n# TYPE d_seconds histogram\n\
             d_seconds_bucket{le=\"0.5\"} 1\nd_seconds_bucket{le=\"1\"} 2\n\
             d_seconds_bucket{le=\"+Inf\"} 2\nd_seconds_sum 1.0\nd_seconds_count 2\n"
        );
    }
}
