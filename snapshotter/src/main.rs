//! `weenv-snapshotter`: containerd proxy snapshotter daemon (thin wiring over the library).

use clap::Parser;
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
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let mut cfg = match Config::load(&args.config) {
        Ok(c) => c,
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
    match rt.block_on(weenv_snapshotter::daemon::run(cfg)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "weenv-snapshotter failed");
            eprintln!("weenv-snapshotter: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
