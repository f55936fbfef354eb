//! `weenv`: the user CLI (pull with remote-snapshot labels, run a plan, status, profile and
//! metrics of the snapshotter). Wiring only: the commands are in the `weenv_cli` library.

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
    match weenv_cli::commands::run(weenv_cli::commands::Cli::parse()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // Each cause once (messages that already say their cause are not repeated).
            eprintln!("weenv: {}", weenv_registry::causes(e.as_ref()));
            std::process::ExitCode::FAILURE
        }
    }
}
