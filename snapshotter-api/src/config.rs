//! Daemon configuration: a versioned, strict TOML file (`/etc/weenv/config.toml` by default).
//!
//! Every field has a documented default; unknown fields are rejected; [`Config::validate`]
//! returns a [`ConfigError`] naming the offending field. Paths left empty derive from `root_dir`.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use thiserror::Error;

mod peers;
mod trust;
pub use peers::PeersSection;
pub use trust::TrustSection;

/// Default location of the config file.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/weenv/config.toml";
/// The only config version this build understands.
pub const CONFIG_VERSION: u32 = 1;

/// Errors loading or validating the config.
#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {error}")]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("cannot parse config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("config field `{field}`: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
}

fn invalid(field: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field,
        message: message.into(),
    }
}

/// Log output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines (default).
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Top-level config.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Config schema version; must be 1.
    pub version: u32,
    /// State directory: metadata db, snapshot dirs, TOC cache. Default `/var/lib/weenv-snapshotter`.
    #[serde(default = "default_root")]
    pub root_dir: PathBuf,
    /// Unix socket serving containerd's Snapshots API. Default `/run/weenv/snapshotter.sock`.
    #[serde(default = "default_socket")]
    pub socket: PathBuf,
    /// Log format: `text` (default) or `json`.
    #[serde(default)]
    pub log_format: LogFormat,
    /// Log filter (tracing `EnvFilter` syntax). Default `info`.
    #[serde(default = "default_log_level")]
    pub log_level: String,
    #[serde(default)]
    pub registry: RegistrySection,
    #[serde(default)]
    pub cache: CacheSection,
    #[serde(default)]
    pub fill: FillSection,
    #[serde(default)]
    pub prefetch: PrefetchSection,
    #[serde(default)]
    pub fuse: FuseSection,
    #[serde(default)]
    pub observability: ObservabilitySection,
    #[serde(default)]
    pub limits: LimitsSection,
    #[serde(default)]
    pub peers: PeersSection,
    #[serde(default)]
    pub trust: TrustSection,
    #[serde(default)]
    pub plans: PlansSection,
}

/// Plans by reference: the node's read-only OCI distribution endpoint that containerd reaches
/// as a registry mirror (`hosts.toml`); it composes plan artifacts on the node
/// (docs/kubernetes.md, "Plans by reference").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlansSection {
    /// `ip:port` to listen on (TCP; keep it on loopback: it serves whatever the daemon's
    /// registry credentials can read). Empty (the default) disables the endpoint.
    #[serde(default)]
    pub listen: String,
    /// Seconds a resolved group tag stays valid before it is resolved again (digest references
    /// never are). Default 300.
    #[serde(default = "default_plans_ttl")]
    pub ttl_secs: u64,
}

fn default_plans_ttl() -> u64 {
    300
}

impl Default for PlansSection {
    fn default() -> Self {
        Self {
            listen: String::new(),
            ttl_secs: default_plans_ttl(),
        }
    }
}

/// Registry access.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistrySection {
    /// Directory of containerd-style `hosts.toml` files (`<dir>/<host>/hosts.toml`).
    /// Default `/etc/containerd/certs.d`; a missing directory means "no mirrors".
    #[serde(default = "default_hosts_dir")]
    pub hosts_dir: PathBuf,
    /// Docker `config.json` for credentials. Default: `$DOCKER_CONFIG` or `~/.docker`.
    #[serde(default)]
    pub docker_config: Option<PathBuf>,
    /// Hosts (`host[:port]`) reached over plain HTTP. Default none.
    #[serde(default)]
    pub plain_http: Vec<String>,
    /// Per-request timeout in seconds. Default 30.
    #[serde(default = "default_timeout")]
    pub timeout_secs: u64,
    /// containerd's socket. When a Prepare names a weenv layer but not its image (stock
    /// clients: nerdctl, the Go client, CRI without snapshot annotations), the daemon finds the
    /// registry and repository in containerd's content store (the
    /// `containerd.io/distribution.source.<host>` label of the manifest listing the layer).
    /// Default `/run/containerd/containerd.sock`; `""` turns this off (such layers are then
    /// pulled the ordinary way).
    #[serde(default = "default_containerd_socket")]
    pub containerd_socket: PathBuf,
}

/// Chunk caches.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheSection {
    /// L2 disk cache directory. Default `<root_dir>/cache`.
    #[serde(default)]
    pub dir: Option<PathBuf>,
    /// L1 memory cache cap in bytes. Default 256 MiB.
    #[serde(default = "default_memory_bytes")]
    pub memory_bytes: u64,
    /// Cap in bytes of everything the daemon writes under `dir`: frames, complete-file copies
    /// for passthrough and their directories, as `du` counts them (one LRU; `du` exceeds it
    /// by at most the frames being written). Default 10 GiB.
    #[serde(default = "default_disk_bytes")]
    pub disk_bytes: u64,
}

/// Scheduling class of the daemon's background CPU and disk work (fill decompression,
/// verification, cache writes, completion check, native trees).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CpuPriority {
    /// As the daemon's other threads.
    Normal,
    /// nice 19, I/O best-effort level 7.
    Low,
    /// `SCHED_IDLE` (a CPU runs it only when no other task wants it), I/O class idle.
    #[default]
    Idle,
}

/// Background fill.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FillSection {
    /// Fetch the rest of each mounted layer in the background. Default true.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Rate cap in bytes/second, 0 = unlimited. Default 0.
    #[serde(default)]
    pub rate_bytes_per_sec: u64,
    /// Concurrent fill requests on the node (all layers together). Default 2.
    #[serde(default = "default_fill_concurrency")]
    pub concurrency: usize,
    /// The fill sends only after on-demand fetches have been idle this long (ms). Default:
    /// the layer store's (1000).
    #[serde(default)]
    pub quiet_ms: Option<u64>,
    /// Background bytes (start-up prefetch + fill) in flight on the node at most: an
    /// on-demand read shares the registry link with no more than this (a single larger
    /// request may go alone; 0 = one background request at a time). Default: the layer
    /// store's (4 MiB).
    #[serde(default)]
    pub background_bytes: Option<u64>,
    /// Priority of background CPU and disk work (fill and prefetch decompression and
    /// verification, cache writes, completion check, native trees): `idle`, `low` or
    /// `normal`. Default `idle`. Inside the fill's unpaused window (`busy_min_share_percent`)
    /// the fill's work runs at normal priority unless a container reads through weenv, and a
    /// reader waiting for a background call raises it to normal.
    #[serde(default)]
    pub cpu_priority: CpuPriority,
    /// The fill sends its next request only after no FUSE read came for this long (ms): it
    /// pauses while the node's containers read through weenv. Default: the layer store's (500).
    #[serde(default)]
    pub busy_ms: Option<u64>,
    /// Longest single pause of the fill while reads keep coming (ms; then one request goes).
    /// Default: the layer store's (5000).
    #[serde(default)]
    pub busy_max_pause_ms: Option<u64>,
    /// A 250 ms interval in which other processes used at least this percentage of the
    /// node's CPU time pauses the fill like a FUSE read (0 = off, at most 100). Default: the
    /// layer store's (50).
    #[serde(default)]
    pub busy_cpu_percent: Option<u32>,
    /// Percent of the time the fill still runs on a node that stays busy (a full pause is
    /// followed by a window without pauses; 0 to 90, 0 = one request per full pause).
    /// Default: the layer store's (25).
    #[serde(default)]
    pub busy_min_share_percent: Option<u32>,
    /// After a layer's fill, copy files of at least this many bytes out of the cache for
    /// passthrough (disk: their size again). Default: the layer store's (262144).
    #[serde(default)]
    pub materialise_min_bytes: Option<u64>,
    /// On-demand read-ahead window per file, bytes; 0 = off. Default: the layer store's (8 MiB).
    #[serde(default)]
    pub read_ahead_bytes: Option<u64>,
    /// Frames of small files prefetched on the first read of a small file in a directory;
    /// 0 = off. Default: the layer store's (0).
    #[serde(default)]
    pub dir_prefetch_frames: Option<usize>,
    /// Check each entry's tar header against its TOC entry before serving the file's bytes or
    /// exposing a privileged entry (setuid/setgid, device, file capabilities); a mismatch
    /// quarantines the layer. Turn off only to measure the checks' cost. Default true.
    #[serde(default = "default_true")]
    pub check_headers: bool,
    /// After a layer's fill and completion check, write it out as a native directory tree
    /// (counted in `cache.disk_bytes`; its frames are dropped) that new mounts use as their
    /// lowerdir instead of the FUSE directory. Default true.
    #[serde(default = "default_true")]
    pub native: bool,
}

/// Start-up prefetch: the frames an image's profile names (manifest annotation
/// `io.weenv.prefetch.frames`, written by `weenv-convert prefetch`), fetched as soon as the
/// layer is mounted.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrefetchSection {
    /// Default true.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Concurrent prefetch requests on the node (all layers). Default 4.
    #[serde(default = "default_prefetch_concurrency")]
    pub concurrency: usize,
    /// Prefetch requests are sent only after on-demand fetches have been idle this long (ms),
    /// so a command the profile did not record is not slowed down by it (reads of frames the
    /// prefetch was about to send do not count). Default: the layer store's (100).
    #[serde(default)]
    pub quiet_ms: Option<u64>,
    /// A read of a frame the prefetch has queued, with at most this many bytes of its layer's
    /// prefetch still to be sent before it, follows the profile (the command it was recorded
    /// for reads in its order): the prefetch goes on instead of waiting `quiet_ms`. Default:
    /// the layer store's (1 MiB).
    #[serde(default)]
    pub follow_bytes: Option<u64>,
    /// Compressed bytes per prefetch request (a reader shares the link with at most one per
    /// prefetch connection). Default 256 KiB.
    #[serde(default = "default_prefetch_batch_bytes")]
    pub batch_bytes: u64,
}

fn default_prefetch_concurrency() -> usize {
    4
}
fn default_prefetch_batch_bytes() -> u64 {
    256 << 10
}

impl Default for PrefetchSection {
    fn default() -> Self {
        Self {
            enabled: true,
            concurrency: default_prefetch_concurrency(),
            quiet_ms: None,
            follow_bytes: None,
            batch_bytes: default_prefetch_batch_bytes(),
        }
    }
}

/// FUSE session.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FuseSection {
    /// Mountpoint of the full FUSE session; each layer is `<mountpoint>/<digest hex>`.
    /// Default `<root_dir>/mnt`.
    #[serde(default)]
    pub mountpoint: Option<PathBuf>,
    /// A second FUSE session, at `<mountpoint>-plain`, for the layers without any xattr (no
    /// file capabilities, no opaque directories): it tells the kernel once that it has no
    /// xattrs and no open/release, so overlayfs stops asking for `trusted.overlay.*` on every
    /// lookup and files open without a round trip (no passthrough on it). Overlay mounts
    /// name those layers there. With `handover` it needs a keeper of its own, on
    /// `<keeper_socket stem>-plain.sock` (spawned like the first, or run beside it).
    /// Default true.
    #[serde(default = "default_true")]
    pub plain_session: bool,
    /// FUSE request threads. Default 4.
    #[serde(default = "default_fuse_threads")]
    pub threads: usize,
    /// Use FUSE passthrough for fully cached files when the kernel supports it. Default true.
    #[serde(default = "default_true")]
    pub passthrough: bool,
    /// Keep the FUSE session across daemon restarts, crashes and upgrades: the session's
    /// `/dev/fuse` fd is held by a small keeper process (`weenv-snapshotter keeper`), and a
    /// new daemon takes it over instead of mounting a new session, so running containers keep
    /// reading. Default true (a keeper is spawned unless `spawn_keeper = false`; with no
    /// keeper the daemon logs an error and runs without handover).
    #[serde(default = "default_true")]
    pub handover: bool,
    /// The keeper's unix socket. Default `<root_dir>/fuse-keeper.sock`.
    #[serde(default)]
    pub keeper_socket: Option<PathBuf>,
    /// Start a keeper (in its own session, outliving the daemon) when none answers on the
    /// socket. Off when the keeper runs on its own (a Kubernetes DaemonSet of its own).
    /// Default true.
    #[serde(default = "default_true")]
    pub spawn_keeper: bool,
    /// Seconds a keeper waits for a daemon to take a session over after the last one went
    /// away; then it aborts the session (reads fail as without a keeper) and unmounts it.
    /// Default 600.
    #[serde(default = "default_keeper_timeout")]
    pub keeper_timeout_secs: u64,
}

/// Metrics and status endpoint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObservabilitySection {
    /// `host:port` (TCP) or `unix:/path` for `/metrics` and `/status`; empty disables.
    /// Default `127.0.0.1:9123`.
    #[serde(default = "default_listen")]
    pub listen: String,
}

/// Bounds on what one layer may cost the daemon. A layer over a limit fails its Prepare with
/// an error naming the layer, the limit and the key to raise; the daemon stays up.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsSection {
    /// Most entries a layer's TOC may list (enforced while the TOC is parsed). A mounted
    /// layer costs ≈ 100 bytes of memory per entry. Default 1,000,000 (the largest images
    /// seen list ~300,000); between 1 and 100,000,000.
    #[serde(default = "default_max_toc_entries")]
    pub max_toc_entries: u64,
    /// Most bytes a layer's TOC may decompress to (its JSON; ~150 bytes per entry). Default
    /// 128 MiB; between 1 MiB and 1 GiB.
    #[serde(default = "default_max_toc_bytes")]
    pub max_toc_bytes: u64,
}

fn default_max_toc_entries() -> u64 {
    1_000_000
}
fn default_max_toc_bytes() -> u64 {
    128 << 20
}

impl Default for LimitsSection {
    fn default() -> Self {
        Self {
            max_toc_entries: default_max_toc_entries(),
            max_toc_bytes: default_max_toc_bytes(),
        }
    }
}

impl LimitsSection {
    /// The TOC decoding limits.
    pub fn toc_limits(&self) -> weenv_format::TocLimits {
        weenv_format::TocLimits {
            max_entries: self.max_toc_entries,
            max_decoded_bytes: self.max_toc_bytes,
        }
    }
}

fn default_root() -> PathBuf {
    PathBuf::from("/var/lib/weenv-snapshotter")
}
fn default_containerd_socket() -> PathBuf {
    PathBuf::from("/run/containerd/containerd.sock")
}

fn default_socket() -> PathBuf {
    PathBuf::from("/run/weenv/snapshotter.sock")
}
fn default_log_level() -> String {
    "info".into()
}
fn default_hosts_dir() -> PathBuf {
    PathBuf::from("/etc/containerd/certs.d")
}
fn default_timeout() -> u64 {
    30
}
fn default_memory_bytes() -> u64 {
    256 << 20
}
fn default_disk_bytes() -> u64 {
    10 << 30
}
fn default_true() -> bool {
    true
}
fn default_fill_concurrency() -> usize {
    2
}
fn default_fuse_threads() -> usize {
    4
}
fn default_keeper_timeout() -> u64 {
    600
}
fn default_listen() -> String {
    "127.0.0.1:9123".into()
}

impl Default for RegistrySection {
    fn default() -> Self {
        Self {
            hosts_dir: default_hosts_dir(),
            docker_config: None,
            plain_http: Vec::new(),
            timeout_secs: default_timeout(),
            containerd_socket: default_containerd_socket(),
        }
    }
}
impl Default for CacheSection {
    fn default() -> Self {
        Self {
            dir: None,
            memory_bytes: default_memory_bytes(),
            disk_bytes: default_disk_bytes(),
        }
    }
}
impl Default for FillSection {
    fn default() -> Self {
        Self {
            enabled: true,
            rate_bytes_per_sec: 0,
            concurrency: default_fill_concurrency(),
            quiet_ms: None,
            background_bytes: None,
            cpu_priority: CpuPriority::Idle,
            busy_ms: None,
            busy_max_pause_ms: None,
            busy_cpu_percent: None,
            busy_min_share_percent: None,
            materialise_min_bytes: None,
            read_ahead_bytes: None,
            dir_prefetch_frames: None,
            check_headers: true,
            native: true,
        }
    }
}
impl Default for FuseSection {
    fn default() -> Self {
        Self {
            mountpoint: None,
            plain_session: true,
            threads: default_fuse_threads(),
            passthrough: true,
            handover: true,
            keeper_socket: None,
            spawn_keeper: true,
            keeper_timeout_secs: default_keeper_timeout(),
        }
    }
}
impl Default for ObservabilitySection {
    fn default() -> Self {
        Self {
            listen: default_listen(),
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            version: CONFIG_VERSION,
            root_dir: default_root(),
            socket: default_socket(),
            log_format: LogFormat::default(),
            log_level: default_log_level(),
            registry: RegistrySection::default(),
            cache: CacheSection::default(),
            fill: FillSection::default(),
            prefetch: PrefetchSection::default(),
            fuse: FuseSection::default(),
            observability: ObservabilitySection::default(),
            limits: LimitsSection::default(),
            peers: PeersSection::default(),
            trust: TrustSection::default(),
            plans: PlansSection::default(),
        }
    }
}

/// Where the observability endpoint listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListenAddr {
    Tcp(std::net::SocketAddr),
    Unix(PathBuf),
}

/// As written in the config: `ip:port` or `unix:/path`.
impl std::fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ListenAddr::Tcp(a) => write!(f, "{a}"),
            ListenAddr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

impl Config {
    /// Parse and validate TOML text (`path` is only used in messages).
    pub fn from_toml(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let cfg: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Read, parse and validate a config file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            error: source,
        })?;
        Self::from_toml(&text, path)
    }

    /// Check every field; the error names the first bad one.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.version != CONFIG_VERSION {
            return Err(invalid(
                "version",
                format!(
                    "unsupported version {}, expected {CONFIG_VERSION}",
                    self.version
                ),
            ));
        }
        if !self.root_dir.is_absolute() {
            return Err(invalid("root_dir", "must be an absolute path"));
        }
        if !self.socket.is_absolute() {
            return Err(invalid("socket", "must be an absolute path"));
        }
        // sun_path is 108 bytes including the NUL.
        if self.socket.as_os_str().len() > 107 {
            return Err(invalid(
                "socket",
                "path longer than 107 bytes (unix socket limit)",
            ));
        }
        if self.log_level.trim().is_empty() {
            return Err(invalid("log_level", "must not be empty (e.g. \"info\")"));
        }
        if self.registry.timeout_secs == 0 {
            return Err(invalid("registry.timeout_secs", "must be at least 1"));
        }
        let cs = &self.registry.containerd_socket;
        if !cs.as_os_str().is_empty() && !cs.is_absolute() {
            return Err(invalid(
                "registry.containerd_socket",
                "must be an absolute path (or \"\" to turn the content-store lookup off)",
            ));
        }
        for h in &self.registry.plain_http {
            if h.is_empty() || h.contains('/') {
                return Err(invalid(
                    "registry.plain_http",
                    format!("{h:?} is not a host[:port]"),
                ));
            }
        }
        if self.prefetch.concurrency == 0 || self.prefetch.concurrency > 64 {
            return Err(invalid("prefetch.concurrency", "must be between 1 and 64"));
        }
        if self.prefetch.batch_bytes < (64 << 10) {
            return Err(invalid("prefetch.batch_bytes", "must be at least 64 KiB"));
        }
        if let Some(d) = &self.cache.dir {
            if !d.is_absolute() {
                return Err(invalid("cache.dir", "must be an absolute path"));
            }
        }
        if self.cache.memory_bytes < (4 << 20) {
            return Err(invalid("cache.memory_bytes", "must be at least 4 MiB"));
        }
        if self.cache.disk_bytes < (64 << 20) {
            return Err(invalid("cache.disk_bytes", "must be at least 64 MiB"));
        }
        if self.fill.concurrency == 0 {
            return Err(invalid("fill.concurrency", "must be at least 1"));
        }
        if self.fill.busy_cpu_percent.is_some_and(|p| p > 100) {
            return Err(invalid(
                "fill.busy_cpu_percent",
                "is a percentage of the node's CPU time: 0 (off) to 100",
            ));
        }
        if self.fill.busy_min_share_percent.is_some_and(|p| p > 90) {
            return Err(invalid(
                "fill.busy_min_share_percent",
                "is the fill's share of a busy node's time: 0 to 90",
            ));
        }
        if let Some(m) = &self.fuse.mountpoint {
            if !m.is_absolute() {
                return Err(invalid("fuse.mountpoint", "must be an absolute path"));
            }
        }
        if self.fuse.threads == 0 || self.fuse.threads > 64 {
            return Err(invalid("fuse.threads", "must be between 1 and 64"));
        }
        let keeper = self.keeper_socket();
        if !keeper.is_absolute() || keeper.as_os_str().len() > 107 {
            return Err(invalid(
                "fuse.keeper_socket",
                "must be an absolute path of at most 107 bytes (unix socket limit)",
            ));
        }
        if self.fuse.keeper_timeout_secs == 0 {
            return Err(invalid("fuse.keeper_timeout_secs", "must be at least 1"));
        }
        if !(1..=100_000_000).contains(&self.limits.max_toc_entries) {
            return Err(invalid(
                "limits.max_toc_entries",
                "must be between 1 and 100000000",
            ));
        }
        if !((1 << 20)..=(1 << 30)).contains(&self.limits.max_toc_bytes) {
            return Err(invalid(
                "limits.max_toc_bytes",
                "must be between 1 MiB and 1 GiB",
            ));
        }
        self.listen_addr()?;
        self.peers.validate()?;
        self.trust.validate()?;
        self.plans_addr()?;
        Ok(())
    }

    /// The plan endpoint's address (`None` when disabled).
    pub fn plans_addr(&self) -> Result<Option<std::net::SocketAddr>, ConfigError> {
        let s = self.plans.listen.trim();
        if s.is_empty() {
            return Ok(None);
        }
        s.parse()
            .map(Some)
            .map_err(|_| invalid("plans.listen", format!("{s:?} is not ip:port")))
    }

    /// The parsed observability address (`None` when disabled).
    pub fn listen_addr(&self) -> Result<Option<ListenAddr>, ConfigError> {
        parse_listen(&self.observability.listen)
    }

    /// Metadata database path.
    pub fn db_path(&self) -> PathBuf {
        self.root_dir.join("metadata.redb")
    }
    /// Directory holding ordinary snapshot dirs (`<id>/fs`, `<id>/work`).
    pub fn snapshots_dir(&self) -> PathBuf {
        self.root_dir.join("snapshots")
    }
    /// Directory caching verified TOCs by layer digest.
    pub fn toc_dir(&self) -> PathBuf {
        self.root_dir.join("tocs")
    }
    /// Effective chunk cache directory.
    pub fn cache_dir(&self) -> PathBuf {
        self.cache
            .dir
            .clone()
            .unwrap_or_else(|| self.root_dir.join("cache"))
    }
    /// The registry client configuration (hosts dir if it exists, plain-http hosts,
    /// docker credentials, timeouts).
    pub fn registry_config(&self) -> weenv_registry::RegistryConfig {
        let mut rc = weenv_registry::RegistryConfig {
            hosts_dir: Some(self.registry.hosts_dir.clone()).filter(|d| d.is_dir()),
            docker_config_dir: self.registry.docker_config.clone(),
            read_timeout_ms: self.registry.timeout_secs.saturating_mul(1000),
            ..Default::default()
        };
        for h in &self.registry.plain_http {
            rc.hosts.insert(
                h.clone(),
                weenv_registry::HostConfig {
                    plain_http: true,
                    ..Default::default()
                },
            );
        }
        rc
    }

    /// Effective unix socket of the FUSE session keeper.
    pub fn keeper_socket(&self) -> PathBuf {
        self.fuse
            .keeper_socket
            .clone()
            .unwrap_or_else(|| self.root_dir.join("fuse-keeper.sock"))
    }

    /// Effective FUSE mountpoint.
    pub fn mountpoint(&self) -> PathBuf {
        self.fuse
            .mountpoint
            .clone()
            .unwrap_or_else(|| self.root_dir.join("mnt"))
    }

    /// The plain session's mountpoint (`<mountpoint>-plain`), if `fuse.plain_session` is on.
    pub fn plain_mountpoint(&self) -> Option<PathBuf> {
        self.fuse
            .plain_session
            .then(|| with_suffix(&self.mountpoint(), "-plain"))
    }

    /// The plain session keeper's socket: the keeper socket's name with `-plain` before its
    /// extension (`fuse-keeper-plain.sock`).
    pub fn plain_keeper_socket(&self) -> PathBuf {
        with_suffix(&self.keeper_socket(), "-plain")
    }
}

/// `path` with `suffix` appended to its file stem (before the extension, if any).
fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = match path.extension() {
        Some(ext) => format!("{stem}{suffix}.{}", ext.to_string_lossy()),
        None => format!("{stem}{suffix}"),
    };
    path.with_file_name(name)
}

/// Parse an observability listen address: `""` (off), `unix:/abs/path`, or `ip:port`.
pub fn parse_listen(s: &str) -> Result<Option<ListenAddr>, ConfigError> {
    let s = s.trim();
    if s.is_empty() {
        return Ok(None);
    }
    if let Some(p) = s.strip_prefix("unix:") {
        let p = PathBuf::from(p);
        if !p.is_absolute() {
            return Err(invalid(
                "observability.listen",
                "unix socket path must be absolute",
            ));
        }
        return Ok(Some(ListenAddr::Unix(p)));
    }
    s.parse().map(|a| Some(ListenAddr::Tcp(a))).map_err(|_| {
        invalid(
            "observability.listen",
            format!("{s:?} is not ip:port or unix:/path"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Config, ConfigError> {
        Config::from_toml(s, Path::new("test.toml"))
    }

    #[test]
    fn minimal_gets_defaults() {
        let c = parse("version = 1").unwrap();
        assert_eq!(c, Config::default());
        assert_eq!(
            c.mountpoint(),
            PathBuf::from("/var/lib/weenv-snapshotter/mnt")
        );
        assert_eq!(
            c.listen_addr().unwrap(),
            Some(ListenAddr::Tcp("127.0.0.1:9123".parse().unwrap()))
        );
    }

    #[test]
    fn the_shipped_config_holds_the_defaults() {
        // Its header says "the values below are the defaults": every value it sets must be.
        let text = include_str!("../../config/weenv-snapshotter.toml");
        let c = parse(text).unwrap();
        assert!(
            c.fuse.handover,
            "the shipped config keeps sessions across restarts"
        );
        assert_eq!(c, Config::default());
    }

    #[test]
    fn handover_is_on_by_default_and_the_keeper_lives_in_the_root() {
        let c = parse("version = 1\nroot_dir = \"/r\"").unwrap();
        assert!(c.fuse.handover && c.fuse.spawn_keeper);
        assert_eq!(c.fuse.keeper_timeout_secs, 600);
        assert_eq!(c.keeper_socket(), PathBuf::from("/r/fuse-keeper.sock"));
    }

    #[test]
    fn the_plain_session_sits_beside_the_full_one_with_its_own_keeper() {
        let c = parse("version = 1\nroot_dir = \"/r\"").unwrap();
        assert_eq!(c.plain_mountpoint(), Some(PathBuf::from("/r/mnt-plain")));
        assert_eq!(
            c.plain_keeper_socket(),
            PathBuf::from("/r/fuse-keeper-plain.sock")
        );
        let c = parse(
            "version = 1\n[fuse]\nmountpoint = \"/m/fs\"\nkeeper_socket = \"/k/keeper\"\nplain_session = false",
        )
        .unwrap();
        assert_eq!(c.plain_mountpoint(), None, "off when asked");
        assert_eq!(c.plain_keeper_socket(), PathBuf::from("/k/keeper-plain"));
        let c = parse("version = 1\n[fuse]\nmountpoint = \"/m/fs\"").unwrap();
        assert_eq!(c.plain_mountpoint(), Some(PathBuf::from("/m/fs-plain")));
    }

    #[test]
    fn errors_name_the_field() {
        let field = |s: &str| match parse(s) {
            Err(ConfigError::Invalid { field, .. }) => field,
            other => panic!("expected Invalid, got {other:?}"),
        };
        assert_eq!(field("version = 2"), "version");
        assert_eq!(field("version = 1\nroot_dir = \"rel\""), "root_dir");
        assert_eq!(field("version = 1\n[fuse]\nthreads = 0"), "fuse.threads");
        assert_eq!(
            field("version = 1\n[fill]\nbusy_cpu_percent = 101"),
            "fill.busy_cpu_percent"
        );
        assert_eq!(
            field("version = 1\n[fill]\nbusy_min_share_percent = 91"),
            "fill.busy_min_share_percent"
        );
        assert_eq!(
            field("version = 1\n[fuse]\nkeeper_socket = \"rel.sock\""),
            "fuse.keeper_socket"
        );
        assert_eq!(
            field("version = 1\n[fuse]\nkeeper_timeout_secs = 0"),
            "fuse.keeper_timeout_secs"
        );
        assert_eq!(
            field("version = 1\n[fill]\nconcurrency = 0"),
            "fill.concurrency"
        );
        assert_eq!(
            field("version = 1\n[observability]\nlisten = \"x\""),
            "observability.listen"
        );
        assert_eq!(
            field("version = 1\n[cache]\nmemory_bytes = 1"),
            "cache.memory_bytes"
        );
        assert_eq!(
            field("version = 1\n[prefetch]\nconcurrency = 0"),
            "prefetch.concurrency"
        );
        assert_eq!(
            field("version = 1\n[prefetch]\nbatch_bytes = 4096"),
            "prefetch.batch_bytes"
        );
        assert_eq!(
            field("version = 1\n[registry]\nplain_http = [\"a/b\"]"),
            "registry.plain_http"
        );
        assert_eq!(
            field("version = 1\n[limits]\nmax_toc_entries = 0"),
            "limits.max_toc_entries"
        );
        assert_eq!(
            field("version = 1\n[limits]\nmax_toc_bytes = 4096"),
            "limits.max_toc_bytes"
        );
        assert_eq!(
            field("version = 1\n[registry]\ncontainerd_socket = \"rel.sock\""),
            "registry.containerd_socket"
        );
        let off = parse("version = 1\n[registry]\ncontainerd_socket = \"\"").unwrap();
        assert!(off.registry.containerd_socket.as_os_str().is_empty());
        let c = parse("version = 1\n[limits]\nmax_toc_entries = 5").unwrap();
        assert_eq!(c.limits.toc_limits().max_entries, 5);
        assert_eq!(c.limits.toc_limits().max_decoded_bytes, 128 << 20);
    }

    #[test]
    fn unknown_fields_and_missing_version_rejected() {
        assert!(matches!(
            parse("version = 1\nbogus = 3"),
            Err(ConfigError::Parse { .. })
        ));
        assert!(matches!(
            parse("version = 1\n[cache]\nsize = 3"),
            Err(ConfigError::Parse { .. })
        ));
        assert!(matches!(
            parse("root_dir = \"/x\""),
            Err(ConfigError::Parse { .. })
        ));
    }

    #[test]
    fn a_config_without_a_plans_section_parses() {
        // Every config written before plans by reference has none (the benches' did not).
        let c = parse("version = 1\n[fill]\nenabled = true\n").unwrap();
        assert_eq!(c.plans, PlansSection::default());
    }

    #[test]
    fn plans_section() {
        // A config without the section keeps the endpoint off.
        assert_eq!(
            parse("version = 1\n").unwrap().plans,
            PlansSection::default()
        );
        let c = parse("version = 1\n[plans]\nlisten = \"127.0.0.1:9124\"\n").unwrap();
        assert_eq!(
            c.plans_addr().unwrap(),
            Some("127.0.0.1:9124".parse().unwrap())
        );
        assert_eq!(c.plans.ttl_secs, 300);
        assert_eq!(Config::default().plans_addr().unwrap(), None);
        let e = parse("version = 1\n[plans]\nlisten = \"nope\"").unwrap_err();
        assert!(e.to_string().contains("plans.listen"), "{e}");
    }

    #[test]
    fn listen_forms() {
        assert_eq!(parse_listen("").unwrap(), None);
        assert_eq!(
            parse_listen("unix:/run/w.sock").unwrap(),
            Some(ListenAddr::Unix("/run/w.sock".into()))
        );
        assert!(parse_listen("unix:rel").is_err());
    }
}
