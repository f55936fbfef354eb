//! `weenv`: pull with remote-snapshot labels, status and metrics of the snapshotter.

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    match weenv_snapshotter::cli::run(weenv_snapshotter::cli::Cli::parse()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // Each cause once (messages that already say their cause are not repeated).
            eprintln!("weenv: {}", weenv_registry::causes(e.as_ref()));
            std::process::ExitCode::FAILURE
        }
    }
}
