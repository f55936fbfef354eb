//! `weenv-snapshotter`: containerd proxy snapshotter daemon (thin wiring over the library).

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use weenv_snapshotter::config::{Config, LogFormat, DEFAULT_CONFIG_PATH};

#[derive(Parser)]
#[command(version, about = "weenv remote snapshotter for containerd")]
struct Args {
    /// Config file.
    #[arg(short, long, default_value = DEFAULT_CONFIG_PATH)]
    config: PathBuf,
    /// Override the socket path from the config.
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Override root_dir from the config.
    #[arg(long)]
    root: Option<PathBuf>,
    /// Check the config and exit.
    #[arg(long)]
    check_config: bool,
    #[command(subcommand)]
    cmd: Option<Cmd>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Hold the daemon's FUSE session across its restarts (started by the daemon when
    /// `fuse.handover` is on, or on its own, e.g. as a DaemonSet of its own).
    Keeper {
        /// The keeper's socket; repeated, one process keeps one session per socket (the
        /// full and the plain session). Default: `fuse.keeper_socket` of the config, and
        /// the plain session's socket beside it when `fuse.plain_session` is on.
        #[arg(long)]
        socket: Vec<PathBuf>,
        /// Abort the kept session after this many seconds without a daemon. Default:
        /// `fuse.keeper_timeout_secs` of the config.
        #[arg(long)]
        timeout_secs: Option<u64>,
        /// Exit once nothing is kept and no daemon connected for the timeout (a keeper the
        /// daemon started); without it the keeper stays (a keeper run by a supervisor).
        #[arg(long)]
        exit_when_idle: bool,
    },
}

/// A keeper that is its container's pid 1 (the weenv-fuse-keeper DaemonSet) ends on SIGTERM
/// and SIGINT as it does elsewhere by their default action: the kernel ignores signals that
/// pid 1 does not handle, so a deleted keeper pod would otherwise wait its grace period for
/// SIGKILL. Either way the session it holds ends with the process.
fn exit_on_term_as_pid1() {
    use nix::sys::signal::{SigSet, Signal};
    if std::process::id() != 1 {
        return;
    }
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGINT);
    // Blocked here, before the keeper starts its threads (they inherit the mask), and taken
    // by the waiting thread below.
    if let Err(e) = set.thread_block() {
        tracing::warn!(error = %e, "cannot block SIGTERM: the keeper stops only by SIGKILL");
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("keeper-signals".into())
        .spawn(move || {
            if let Ok(sig) = set.wait() {
                tracing::info!(signal = %sig, "keeper stopped by a signal");
                std::process::exit(128 + sig as i32);
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot wait for SIGTERM: the keeper stops only by SIGKILL");
    }
}

/// Runs a keeper per socket (the config gives defaults); ends when every one has ended, or
/// at the first failure.
fn keeper(
    cfg: &Config,
    sockets: Vec<PathBuf>,
    timeout: Option<u64>,
    exit_when_idle: bool,
) -> std::process::ExitCode {
    use weenv_snapshotter::handover::keeper;
    let sockets = if sockets.is_empty() {
        let mut v = vec![cfg.keeper_socket()];
        if cfg.fuse.plain_session {
            v.push(cfg.plain_keeper_socket());
        }
        v
    } else {
        sockets
    };
    let timeout = std::time::Duration::from_secs(timeout.unwrap_or(cfg.fuse.keeper_timeout_secs));
    exit_on_term_as_pid1();
    let fail = |e: &dyn std::fmt::Display| {
        tracing::error!(error = %e, "keeper failed");
        eprintln!("weenv-snapshotter keeper: {e}");
        std::process::ExitCode::FAILURE
    };
    let mut listeners = Vec::new();
    for socket in &sockets {
        match keeper::bind(socket) {
            Ok(l) => listeners.push(l),
            Err(e) => return fail(&e),
        }
        tracing::info!(socket = %socket.display(), pid = std::process::id(), "FUSE session keeper listening");
    }
    let (tx, rx) = std::sync::mpsc::channel();
    for l in listeners {
        let tx = tx.clone();
        let spawned = std::thread::Builder::new()
            .name("keeper".into())
            .spawn(move || {
                let _ = tx.send(keeper::run(l, timeout, exit_when_idle));
            });
        if let Err(e) = spawned {
            return fail(&e);
        }
    }
    drop(tx);
    for res in rx {
        if let Err(e) = res {
            return fail(&e);
        }
    }
    std::process::ExitCode::SUCCESS
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    // A keeper told its socket needs no config file (the daemon starts it that way).
    let keeper_alone = matches!(
        &args.cmd,
        Some(Cmd::Keeper { socket, .. }) if !socket.is_empty()
    ) && !args.config.exists();
    let mut cfg = match Config::load(&args.config) {
        Ok(c) => c,
        Err(_) if keeper_alone => Config::default(),
        Err(e) => {
            eprintln!("weenv-snapshotter: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    if let Some(s) = args.socket {
        cfg.socket = s;
    }
    if let Some(r) = args.root {
        cfg.root_dir = r;
    }
    if let Err(e) = cfg.validate() {
        eprintln!("weenv-snapshotter: {e}");
        return std::process::ExitCode::from(2);
    }
    if args.check_config {
        println!("config OK");
        return std::process::ExitCode::SUCCESS;
    }
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&cfg.log_level));
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match cfg.log_format {
        LogFormat::Json => b.json().init(),
        LogFormat::Text => b.init(),
    }
    if let Some(Cmd::Keeper {
        socket,
        timeout_secs,
        exit_when_idle,
    }) = args.cmd
    {
        return keeper(&cfg, socket, timeout_secs, exit_when_idle);
    }
    weenv_snapshotter::layers::tune_allocator();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("weenv-snapshotter: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let res = rt.block_on(weenv_snapshotter::daemon::run(cfg));
    if res.is_ok() && weenv_snapshotter::daemon::handed_over() {
        // Leave in-flight FUSE requests unanswered for the next daemon (see `handed_over`).
        std::process::exit(0);
    }
    // Dropping the runtime would wait for every blocking task, and one may be parked on the
    // FUSE session that was just detached while containers still use it (seen: a daemon that
    // took SIGTERM and did not exit for 14 minutes). The process exit ends them instead.
    rt.shutdown_timeout(std::time::Duration::from_secs(5));
    match res {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "weenv-snapshotter failed");
            eprintln!("weenv-snapshotter: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
