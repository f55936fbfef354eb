//! `weenv-envd`: the environment service of a node (wiring only; see the library).

use anyhow::{bail, Context, Result};
use clap::Parser;
use std::path::PathBuf;
use std::time::Duration;
use weenv_envd::service::{Config, Service};

/// weenv-envd: create environments from plans or images, exec / sessions / files in them,
/// list / stats / events / delete, over gRPC (proto/weenv/envd/v1/envd.proto).
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Unix socket to serve on.
    #[arg(long, default_value = "/run/weenv/envd.sock")]
    socket: PathBuf,
    /// Also serve on TCP (e.g. 127.0.0.1:7480); needs --token-file.
    #[arg(long)]
    tcp: Option<std::net::SocketAddr>,
    /// File holding the bearer token TCP clients must send.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// containerd's socket.
    #[arg(short, long, default_value = "/run/containerd/containerd.sock")]
    address: PathBuf,
    /// containerd namespace of the environments.
    #[arg(short, long, default_value = "weenv-envd")]
    namespace: String,
    /// Default snapshotter (a request may name another, e.g. overlayfs).
    #[arg(long, default_value = "weenv")]
    snapshotter: String,
    /// Default runtime (a request may name another).
    #[arg(long, default_value = "io.containerd.weenv.v1")]
    runtime: String,
    /// FIFOs of execs and sessions, the group resolution cache.
    #[arg(long, default_value = "/var/lib/weenv-envd")]
    state_dir: PathBuf,
    /// The weenv daemon's config (registry settings: hosts, plain HTTP, credentials).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Talk plain HTTP to this registry host (repeatable).
    #[arg(long = "plain-http")]
    plain_http: Vec<String>,
    /// Time to live of an environment whose request gives none (seconds).
    #[arg(long, default_value_t = 3600)]
    default_ttl: u64,
    /// Largest time to live a request may ask for (seconds).
    #[arg(long, default_value_t = 7 * 24 * 3600)]
    max_ttl: u64,
    /// Seconds between two garbage-collection rounds (expired environments).
    #[arg(long, default_value_t = 5)]
    gc_interval: u64,
    /// The weenv shim's status directory (io.weenv.status.dir of every environment).
    #[arg(long)]
    shim_status_dir: Option<PathBuf>,
    /// The weenv shim's node ledger directory (io.weenv.ledger.dir of every environment).
    #[arg(long)]
    shim_ledger_dir: Option<PathBuf>,
    /// Seconds a resolved group tag stays valid.
    #[arg(long, default_value_t = 300)]
    resolve_ttl: u64,
    /// Creations at once when a request does not say.
    #[arg(long, default_value_t = 8)]
    parallelism: usize,
    /// Warm pool: at most this many spare environments per pool key (image, snapshotter,
    /// runtime, resources, mounts, init, name), refilled to the last batch's size; 0: off.
    #[arg(long, default_value_t = 0)]
    pool: usize,
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let a = Args::parse();
    let token = match (&a.tcp, &a.token_file) {
        (Some(_), None) => bail!("--tcp needs --token-file (TCP clients must send a bearer token)"),
        (_, Some(f)) => Some(
            std::fs::read_to_string(f)
                .with_context(|| format!("reading the token file {}", f.display()))?
                .trim()
                .to_string(),
        ),
        _ => None,
    };
    if token.as_deref() == Some("") {
        bail!("the token file is empty");
    }
    let cfg = match &a.config {
        Some(p) => weenv_snapshotter_api::config::Config::load(p)
            .with_context(|| format!("loading {}", p.display()))?,
        None => weenv_snapshotter_api::config::Config::default(),
    };
    // The daemon's endpoint comes from its config (only when one is given).
    let daemon = a.config.as_ref().and_then(|_| {
        weenv_snapshotter_api::config::parse_listen(&cfg.observability.listen)
            .ok()
            .flatten()
    });
    let mut rc = cfg.registry_config();
    for h in &a.plain_http {
        rc.hosts.entry(h.clone()).or_default().plain_http = true;
    }
    let registry = weenv_registry::Client::new(rc)?;
    let ch = weenv_cli::run::connect(&a.address).await?;
    let svc = Service::new(
        Config {
            namespace: a.namespace,
            snapshotter: a.snapshotter,
            runtime: a.runtime,
            state_dir: a.state_dir,
            default_ttl: Duration::from_secs(a.default_ttl),
            max_ttl: Duration::from_secs(a.max_ttl),
            gc_interval: Duration::from_secs(a.gc_interval.max(1)),
            shim_status_dir: a.shim_status_dir,
            shim_ledger_dir: a.shim_ledger_dir,
            policy: weenv_converter::resolve_cache::ResolvePolicy {
                ttl: Duration::from_secs(a.resolve_ttl),
                refresh: false,
            },
            parallelism: a.parallelism.max(1),
            daemon,
            pool: a.pool,
        },
        ch,
        registry,
    )?;
    let found = svc.reconcile().await?;
    tracing::info!(found, "environments found again");
    svc.spawn_gc();
    svc.spawn_pool();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|v| *v).await;
    };
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        if let (Ok(mut t), Ok(mut i)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            tokio::select! { _ = t.recv() => {}, _ = i.recv() => {} }
        }
        let _ = stop_tx.send(true);
    });
    tracing::info!(socket = %a.socket.display(), tcp = ?a.tcp, "weenv-envd serving");
    let unix = weenv_envd::server::serve_unix(svc.clone(), &a.socket, stopped(stop_rx.clone()));
    match (a.tcp, token) {
        (Some(addr), Some(token)) => {
            let tcp = weenv_envd::server::serve_tcp(svc.clone(), addr, token, stopped(stop_rx));
            tokio::try_join!(unix, tcp)?;
        }
        _ => unix.await?,
    }
    // Spares are not environments: they go with the service (a killed service's are removed
    // by the next one's reconcile).
    svc.drain_pool().await;
    Ok(())
}
