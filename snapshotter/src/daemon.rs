//! Daemon wiring: open the store, mount the FUSE layer store (or, with `fuse.handover`, take
//! over the session a keeper holds), remount every committed remote snapshot, serve the
//! FUSE session, then the observability endpoint and containerd's Snapshots API until
//! SIGTERM/SIGINT. On SIGTERM with a keeper the session is left to the keeper for the next
//! daemon (running containers keep reading); otherwise (SIGINT, or no keeper) it is
//! unmounted (running containers whose rootfs stacks weenv layers lose them; new
//! containers work after a restart). See docs/restart.md.

use crate::config::Config;
use crate::fetch::FillConfig;
use crate::fs::trust::TrustEvent;
use crate::http::{self, Observable};
use crate::layers::{Keepers, LayerStore, LayerStoreConfig};
use crate::metrics::Metrics;
use crate::remote::source::ContainerdSources;
use crate::remote::toc_cache::TocCache;
use crate::remote::{LayerProvider, WeenvLayers};
use crate::service::SnapshotService;
use crate::store::MetaStore;
use std::sync::Arc;
use thiserror::Error;
use tracing::{error, info, warn};

/// Startup/runtime failures of the daemon (exit code 1 in main).
#[derive(Debug, Error)]
pub enum DaemonError {
    #[error("creating {path}: {error}")]
    Dir {
        path: std::path::PathBuf,
        error: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// The cause is part of the message, not a `source()` (said once by chain printers).
    #[error("starting the FUSE layer store: {0}")]
    Layers(crate::layers::LayerError),
    #[error(transparent)]
    Registry(#[from] weenv_registry::RegistryError),
    #[error(transparent)]
    Service(#[from] crate::service::SnapshotError),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Grpc(#[from] crate::grpc::GrpcError),
    #[error(transparent)]
    Http(#[from] crate::http::HttpError),
    #[error(transparent)]
    Peers(#[from] crate::peer::PeerError),
    #[error("cannot serve plan references on {addr} (config plans.listen): {error}; stop what holds it, or set plans.listen to a free address (\"\" disables the endpoint)")]
    PlansBind { addr: String, error: std::io::Error },
}

struct Obs {
    svc: Arc<SnapshotService>,
    store: Arc<MetaStore>,
    layers: Arc<LayerStore>,
    metrics: Arc<Metrics>,
    peers: Option<crate::peer::Peers>,
    provider: Arc<dyn LayerProvider>,
    containerd: Option<Arc<ContainerdSources>>,
}

impl Observable for Obs {
    fn metrics_text(&self) -> String {
        let mut m = self.metrics.render();
        m.push_str(&self.svc.counters().render());
        if let Some(p) = &self.peers {
            m.push_str(&p.stats.render());
        }
        if let Some(c) = &self.containerd {
            m.push_str(&c.render());
        }
        if let Ok(c) = crate::status::count_snapshots(&self.store) {
            let mut e = crate::metrics::Exposition::new();
            e.gauge_family(
                "weenv_snapshots",
                "Snapshots by kind.",
                "kind",
                [
                    ("active", c.active),
                    ("view", c.view),
                    ("committed", c.committed),
                    ("remote", c.remote),
                ]
                .to_vec(),
            );
            m.push_str(&e.render());
        }
        m
    }
    fn status_json(&self) -> String {
        serde_json::to_string_pretty(&crate::status::report(
            &self.store,
            &self.layers,
            &self.metrics,
            self.peers.as_ref(),
        ))
        .unwrap_or_default()
    }
    fn profile_json(&self) -> String {
        serde_json::to_string(&crate::status::profile(&self.layers)).unwrap_or_default()
    }
    fn reset_profile(&self) {
        self.layers.reset_access();
    }
    fn verify(&self, digest: String) -> futures::future::BoxFuture<'static, http::Response> {
        let provider = self.provider.clone();
        Box::pin(async move { verify_response(provider.as_ref(), &digest).await })
    }
}

/// The answer to `POST /verify/<digest>` (see `weenv_snapshotter_api::verify`).
async fn verify_response(provider: &dyn LayerProvider, digest: &str) -> http::Response {
    use weenv_snapshotter_api::verify::{VerifyReport, VerifyVerdict};
    let text = |code, body: String| http::Response {
        code,
        content_type: "text/plain",
        body,
    };
    let Ok(d) = digest.parse::<weenv_format::Digest>() else {
        return text(404, format!("{digest:?} is not a layer digest\n"));
    };
    let t0 = std::time::Instant::now();
    let (verdict, reason) = match provider.verify(&d).await {
        Ok(crate::remote::Verdict::Verified) => (VerifyVerdict::Verified, None),
        Ok(crate::remote::Verdict::Unclaimed) => (VerifyVerdict::Unclaimed, None),
        Ok(crate::remote::Verdict::Quarantined(r)) => (VerifyVerdict::Quarantined, Some(r)),
        Err(e) => return text(409, format!("{e}\n")),
    };
    let report = VerifyReport {
        layer: d.to_string(),
        verdict,
        reason,
        secs: t0.elapsed().as_secs_f64(),
    };
    info!(layer = %d, ?verdict, secs = report.secs, "layer verification requested");
    http::Response {
        code: 200,
        content_type: "application/json",
        body: serde_json::to_string(&report).unwrap_or_default(),
    }
}

/// The layer store configuration derived from the daemon config.
pub fn layer_store_config(cfg: &Config) -> LayerStoreConfig {
    LayerStoreConfig {
        mountpoint: cfg.mountpoint(),
        plain_mountpoint: cfg.plain_mountpoint(),
        cache_dir: cfg.cache_dir(),
        memory_cache_bytes: cfg.cache.memory_bytes,
        disk_cache_bytes: cfg.cache.disk_bytes,
        fill: {
            let d = FillConfig::default();
            FillConfig {
                enabled: cfg.fill.enabled,
                concurrency: cfg.fill.concurrency,
                rate_limit_bytes_per_sec: cfg.fill.rate_bytes_per_sec,
                quiet_ms: cfg.fill.quiet_ms.unwrap_or(d.quiet_ms),
                background_bytes: cfg.fill.background_bytes.unwrap_or(d.background_bytes),
                prefetch_quiet_ms: cfg.prefetch.quiet_ms.unwrap_or(d.prefetch_quiet_ms),
                prefetch_follow_bytes: cfg.prefetch.follow_bytes.unwrap_or(d.prefetch_follow_bytes),
                cpu_priority: cfg.fill.cpu_priority,
                busy_ms: cfg.fill.busy_ms.unwrap_or(d.busy_ms),
                busy_max_pause_ms: cfg.fill.busy_max_pause_ms.unwrap_or(d.busy_max_pause_ms),
                busy_cpu_percent: cfg.fill.busy_cpu_percent.unwrap_or(d.busy_cpu_percent),
                busy_min_share_percent: cfg
                    .fill
                    .busy_min_share_percent
                    .unwrap_or(d.busy_min_share_percent),
                materialise_min_bytes: cfg
                    .fill
                    .materialise_min_bytes
                    .unwrap_or(d.materialise_min_bytes),
                read_ahead_bytes: cfg.fill.read_ahead_bytes.unwrap_or(d.read_ahead_bytes),
                dir_prefetch_frames: cfg
                    .fill
                    .dir_prefetch_frames
                    .unwrap_or(d.dir_prefetch_frames),
                prefetch: cfg.prefetch.enabled,
                prefetch_concurrency: cfg.prefetch.concurrency,
                prefetch_batch_bytes: cfg.prefetch.batch_bytes,
                check_headers: cfg.fill.check_headers,
                native: cfg.fill.native,
                ..d
            }
        },
        fuse_threads: cfg.fuse.threads,
        passthrough: cfg.fuse.passthrough,
    }
}

impl From<crate::layers::LayerError> for DaemonError {
    fn from(e: crate::layers::LayerError) -> Self {
        DaemonError::Layers(e)
    }
}

/// Set once [`run`] has left the FUSE sessions to their keepers.
static HANDED_OVER: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether [`run`] ended by leaving the FUSE sessions to their keepers. The process must then
/// exit without dropping its runtime: a FUSE request still in flight would be answered with EIO
/// as its reply is dropped, while unanswered it is re-queued for the successor
/// (`FUSE_NOTIFY_RESEND`), so the container sees a stall, not an error.
pub fn handed_over() -> bool {
    HANDED_OVER.load(std::sync::atomic::Ordering::SeqCst)
}

/// Run the daemon until a termination signal.
pub async fn run(cfg: Config) -> Result<(), DaemonError> {
    // First, so a taken observability address stops the daemon before it mounts anything.
    let listener = match cfg.listen_addr()? {
        Some(addr) => Some(http::bind(&addr).await?),
        None => None,
    };
    let plans_listener = match cfg.plans_addr()? {
        Some(a) => Some(tokio::net::TcpListener::bind(a).await.map_err(|error| {
            DaemonError::PlansBind {
                addr: a.to_string(),
                error,
            }
        })?),
        None => None,
    };
    // Private to root whatever the umask (and narrowed if an older install left them wider);
    // the cache dir and the mountpoints are made by the layer store the same way.
    for d in [cfg.root_dir.clone(), cfg.snapshots_dir(), cfg.toc_dir()] {
        crate::dirs::ensure_private(&d).map_err(|source| DaemonError::Dir {
            path: d.clone(),
            error: source,
        })?;
    }
    let store = Arc::new(MetaStore::open(&cfg.db_path())?);
    let metrics = Arc::new(Metrics::new());
    let connect = |socket: &std::path::Path, what: &str| {
        match crate::handover::client::KeeperClient::connect_or_spawn(
            socket,
            cfg.fuse.spawn_keeper,
            cfg.fuse.keeper_timeout_secs,
        ) {
            Ok(k) => Some(k),
            Err(e) => {
                error!(error = %e, socket = %socket.display(), "no keeper for the {what} FUSE session: its containers will not survive a restart of this daemon");
                None
            }
        }
    };
    let keepers = if cfg.fuse.handover {
        let full = connect(&cfg.keeper_socket(), "full");
        let plain = match cfg.plain_mountpoint() {
            Some(_) if full.is_some() => connect(&cfg.plain_keeper_socket(), "plain"),
            _ => None,
        };
        Keepers { full, plain }
    } else {
        info!("fuse.handover is off: running containers lose their lazy layers when this daemon stops");
        Keepers::default()
    };
    let layers = LayerStore::start_with(
        layer_store_config(&cfg),
        tokio::runtime::Handle::current(),
        metrics.clone(),
        keepers,
    )?;
    {
        let store = store.clone();
        layers.set_quarantine_persist(Box::new(move |d, ev| {
            let res = store.update_layer(d.as_str(), |r| match ev {
                TrustEvent::Quarantined(reason) => r.quarantined = Some(reason.to_string()),
                TrustEvent::Verified => r.verified = true,
            });
            if let Err(e) = res {
                error!(layer = %d, error = %e, "cannot persist the layer's trust state");
            }
        }));
    }
    let registry = match cfg.plans_addr()? {
        // containerd's hosts.toml names this daemon's plan endpoint as a mirror: the daemon's
        // own requests must not go there.
        Some(a) => weenv_registry::Client::new(crate::plans::without_own_mirror(
            cfg.registry_config(),
            &a.to_string(),
        )?)?,
        None => weenv_registry::Client::new(cfg.registry_config())?,
    };
    let peers = crate::peer::start(&cfg.peers, layers.frames(), registry.clone()).await?;
    let registry_for_plans = registry.clone();
    let sources = (!cfg.registry.containerd_socket.as_os_str().is_empty()).then(|| {
        Arc::new(ContainerdSources::new(
            cfg.registry.containerd_socket.clone(),
            registry.clone(),
        ))
    });
    match &sources {
        Some(s) => {
            tokio::spawn(watch_containerd(s.clone()));
        }
        None => info!(
            "registry.containerd_socket is empty: weenv layers pulled by stock clients (nerdctl, \
             the containerd Go client, CRI without snapshot annotations) are fetched in full"
        ),
    }
    let containerd = sources.clone();
    let mut weenv_layers = WeenvLayers::new(
        store.clone(),
        layers.clone(),
        registry,
        TocCache::new(&cfg.toc_dir(), cfg.limits.toc_limits()),
    );
    if let Some(s) = &sources {
        weenv_layers = weenv_layers.with_local(s.clone());
    }
    let provider: Arc<dyn LayerProvider> = Arc::new(weenv_layers);
    let mut svc = SnapshotService::new(store.clone(), cfg.snapshots_dir(), Some(provider.clone()))?
        .with_trust(cfg.trust.clone());
    if let Some(s) = sources {
        svc = svc
            .with_claims(Arc::new(crate::remote::contest::ContainerdClaims::new(
                s.clone(),
            )))
            .with_sources(s);
    }
    let overlay = crate::mounts::OverlayFeatures::detect();
    info!(
        xino = overlay.xino,
        "overlay mounts over layers on several filesystems get xino=on: {}",
        if overlay.xino {
            "yes"
        } else {
            "no (the kernel is older than 4.17: directories' st_ino differs from readdir's d_ino)"
        }
    );
    svc = svc.with_overlay(overlay);
    let plans = plans_listener.map(|l| {
        let server = Arc::new(crate::plans::PlanServer::new(
            registry_for_plans.clone(),
            std::time::Duration::from_secs(cfg.plans.ttl_secs),
        ));
        (server, l)
    });
    if let Some((p, _)) = &plans {
        svc = svc.with_plans(p.clone());
    }
    let svc = Arc::new(svc);
    let (ok, failed) = svc.remount_all().await?;
    info!(remounted = ok, failed, "remote snapshots remounted");
    layers.serve()?;
    if let Some((p, l)) = plans {
        info!(listen = %cfg.plans.listen, "serving plan references (OCI distribution, read-only)");
        tokio::spawn(crate::plans::serve::serve(p, l));
    }

    if let Some(l) = listener {
        let obs = Arc::new(Obs {
            svc: svc.clone(),
            store: store.clone(),
            layers: layers.clone(),
            metrics,
            peers,
            provider,
            containerd,
        });
        tokio::spawn(http::serve(l, obs));
    }

    info!(socket = %cfg.socket.display(), "serving containerd Snapshots API");
    let (tx, rx) = tokio::sync::watch::channel(None);
    let signal = async move {
        let _ = tx.send(Some(shutdown_signal().await));
    };
    let res = bounded_drain(
        crate::grpc::serve(svc, &cfg.socket, signal),
        rx.clone(),
        SHUTDOWN_GRACE,
    )
    .await;
    let stop = *rx.borrow();
    let hand_over = matches!(stop, Some(Stop::Term)) && layers.can_hand_over();
    if hand_over {
        info!("shutting down: the keeper keeps the FUSE session for the next daemon");
        layers.hand_over();
        HANDED_OVER.store(true, std::sync::atomic::Ordering::SeqCst);
    } else {
        info!("shutting down: unmounting the FUSE session");
        layers.shutdown();
    }
    res?;
    Ok(())
}

/// Says at start whether containerd answers on `registry.containerd_socket` (label-free lazy
/// pulls need it: without it their weenv layers are fetched in full), then, if it does not,
/// asks again every [`CONTAINERD_RECHECK`] until it does (containerd may start after the
/// daemon: the systemd unit orders it so), warning once more after [`CONTAINERD_GRACE`].
/// `weenv_containerd_up` tells the same from then on.
async fn watch_containerd(s: Arc<ContainerdSources>) {
    let socket = s.socket().display().to_string();
    let mut waited = std::time::Duration::ZERO;
    loop {
        match s.check().await {
            Ok(version) => {
                info!(
                    socket,
                    version, "containerd answers: stock clients' pulls of weenv images are lazy"
                );
                return;
            }
            Err(e) if waited.is_zero() => warn!(socket, error = %e,
                "containerd does not answer on registry.containerd_socket: until it does, weenv \
                 layers pulled by nerdctl, the containerd Go client or CRI without snapshot \
                 annotations are fetched in full (weenv pull and CRI with annotations are not \
                 affected); see weenv_containerd_up"),
            Err(e) if waited == CONTAINERD_GRACE => {
                warn!(socket, error = %e, waited_secs = waited.as_secs(),
                "containerd still does not answer on registry.containerd_socket")
            }
            Err(_) => {}
        }
        tokio::time::sleep(CONTAINERD_RECHECK).await;
        waited += CONTAINERD_RECHECK;
    }
}

const CONTAINERD_RECHECK: std::time::Duration = std::time::Duration::from_secs(5);
const CONTAINERD_GRACE: std::time::Duration = std::time::Duration::from_secs(60);

/// How long a stopping daemon waits for in-flight Snapshots API requests (a Prepare blocked on a
/// slow registry, a client that keeps its connection open) before it stops without them.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// Runs `serve` (which starts draining when a stop is sent on `stop`) to its end, or until
/// `grace` after the stop, whichever comes first: a request stuck in a drain (a Prepare blocked on
/// a slow registry) must not keep the daemon from stopping.
async fn bounded_drain<E>(
    serve: impl std::future::Future<Output = Result<(), E>>,
    mut stop: tokio::sync::watch::Receiver<Option<Stop>>,
    grace: std::time::Duration,
) -> Result<(), E> {
    let deadline = async move {
        while stop.borrow_and_update().is_none() {
            if stop.changed().await.is_err() && stop.borrow().is_none() {
                return std::future::pending().await;
            }
        }
        tokio::time::sleep(grace).await;
    };
    tokio::select! {
        res = serve => res,
        () = deadline => {
            warn!(
                grace_secs = grace.as_secs(),
                "in-flight Snapshots API requests did not finish in time; stopping without them"
            );
            Ok(())
        }
    }
}

/// How the daemon was asked to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    /// SIGTERM (systemd, Kubernetes, an upgrade): hand the session over when a keeper holds it.
    Term,
    /// SIGINT (an operator's Ctrl-C): unmount.
    Int,
}

async fn shutdown_signal() -> Stop {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        error!("cannot install signal handlers; stop the daemon with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => { info!("SIGTERM"); Stop::Term }
        _ = int.recv() => { info!("SIGINT"); Stop::Int }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_stuck_drain_ends_at_the_grace_after_a_stop() {
        let (tx, rx) = tokio::sync::watch::channel(None);
        let stuck = std::future::pending::<Result<(), ()>>();
        let run = tokio::spawn(bounded_drain(stuck, rx, Duration::from_secs(10)));
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!run.is_finished(), "no stop yet: the server keeps running");
        tx.send(Some(Stop::Term)).unwrap();
        tokio::time::sleep(Duration::from_secs(9)).await;
        assert!(!run.is_finished(), "still inside the grace");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(run.await.unwrap(), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_server_that_ends_first_returns_its_own_result() {
        let (_tx, rx) = tokio::sync::watch::channel(None);
        let failing = async { Err::<(), _>("bind failed") };
        let r = bounded_drain(failing, rx, Duration::from_secs(10)).await;
        assert_eq!(r, Err("bind failed"));
    }

    #[tokio::test]
    async fn a_taken_status_port_stops_the_daemon_at_start() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap().to_string();
        let d = tempfile::tempdir().unwrap();
        let mut cfg = Config {
            root_dir: d.path().join("root"),
            socket: d.path().join("weenv.sock"),
            ..Config::default()
        };
        cfg.observability.listen = addr.clone();
        let r = tokio::time::timeout(std::time::Duration::from_secs(10), run(cfg))
            .await
            .unwrap();
        let err = r.unwrap_err();
        assert!(matches!(err, DaemonError::Http(_)), "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains(&addr) && msg.contains("observability.listen"),
            "{msg}"
        );
        assert!(
            !d.path().join("root").exists(),
            "nothing set up before the check"
        );
    }
}
