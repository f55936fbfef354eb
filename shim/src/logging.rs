//! One tracing subscriber for the shim: containerd's log FIFO (`log` in the bundle dir,
//! the shim's cwd), which containerd copies into its own log; stderr when it is missing.

use std::sync::Mutex;

use tracing_subscriber::EnvFilter;

/// Installs the subscriber (once; later calls are no-ops).
pub fn init_fifo_logger() {
    let filter =
        EnvFilter::try_from_env("WEENV_SHIM_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let fifo = std::fs::OpenOptions::new().write(true).open("log");
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false);
    let _ = match fifo {
        Ok(f) => b.with_writer(Mutex::new(f)).try_init(),
        Err(_) => b.with_writer(std::io::stderr).try_init(),
    };
}
