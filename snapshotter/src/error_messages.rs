//! Every user-visible error says what failed, and each cause, once: an error whose message
//! includes its cause's text does not also expose it as `source()`, so anyhow's `{:#}` (and
//! `weenv_registry::causes`, what `weenv` and `weenv-convert` print) never repeat a segment.
//! The CLI's own errors (`weenv pull` against a registry that does not answer) are checked in
//! `weenv_cli::pull`'s tests.

#![cfg(test)] // test-only module: the whole file compiles only under `cargo test`

use crate::config::{Config, ListenAddr};
use crate::daemon::DaemonError;
use crate::layers::LayerError;
use std::path::PathBuf;

/// Panics if a `": "`-separated segment of `msg` appears twice.
pub fn assert_each_segment_once(msg: &str) {
    let segs: Vec<&str> = msg.split(": ").map(str::trim).collect();
    for (i, s) in segs.iter().enumerate() {
        assert!(
            !segs[i + 1..].contains(s),
            "segment {s:?} repeats in: {msg}"
        );
    }
}

fn io(what: &str) -> std::io::Error {
    std::io::Error::other(what.to_string())
}

fn both_renderings(e: anyhow::Error) -> String {
    let a = format!("{e:#}");
    assert_each_segment_once(&a);
    let b = weenv_registry::causes(e.as_ref());
    assert_each_segment_once(&b);
    a
}

#[tokio::test]
async fn representative_errors_say_each_cause_once() -> Result<(), Box<dyn std::error::Error>> {
    // weenv --config /nonexistent
    let e = Config::load(std::path::Path::new("/nonexistent/weenv.toml")).unwrap_err();
    let m = both_renderings(anyhow::Error::new(e));
    assert_eq!(m.matches("No such file").count(), 1, "{m}");

    // Daemon start-up failures.
    let e = DaemonError::from(LayerError::Mount {
        mountpoint: PathBuf::from("/run/weenv/mnt"),
        error: io("permission denied"),
    });
    both_renderings(anyhow::Error::new(e));
    let taken = std::net::TcpListener::bind("127.0.0.1:0")?;
    let e = crate::http::bind(&ListenAddr::Tcp(taken.local_addr()?))
        .await
        .unwrap_err();
    both_renderings(anyhow::Error::new(DaemonError::from(e)));
    let e = crate::grpc::GrpcError::Bind {
        path: "/run/weenv.sock".into(),
        error: io("address in use"),
    };
    both_renderings(anyhow::Error::new(DaemonError::from(e)));
    Ok(())
}
