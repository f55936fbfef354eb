//! `stockrun` (`integration/go/stockrun`): containerd's own Go client making nerdctl's calls
//! (pull with unpack and a snapshotter, new container with a snapshot, task start/wait), built
//! offline in GOPATH mode against Debian's `golang-github-containerd-containerd-dev`.
//! [`build`] compiles it into a directory; [`Report`] is the JSON line it prints to stderr.

use crate::debian_go::{self, Build};
use anyhow::Result;
use std::path::{Path, PathBuf};

/// Source directory of `stockrun`.
pub fn source_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("go/stockrun")
}

/// Builds `stockrun` into `out_dir` ([`debian_go::build`]); returns the binary's path.
pub fn build(out_dir: &Path) -> Result<PathBuf> {
    debian_go::build(&source_dir(), out_dir, "stockrun", Build::Program)
}

/// What `stockrun` reports (its `stockrun: {...}` stderr line).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report {
    pub pull_secs: f64,
    pub first_output_secs: f64,
    pub total_secs: f64,
    pub exit_code: i64,
}

impl Report {
    /// The report in `stderr` (the last `stockrun: {` line). Pure.
    pub fn parse(stderr: &str) -> Option<Report> {
        let line = stderr
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix("stockrun: {").map(|r| format!("{{{r}")))?;
        let v: serde_json::Value = serde_json::from_str(&line).ok()?;
        Some(Report {
            pull_secs: v["pull_secs"].as_f64()?,
            first_output_secs: v["first_output_secs"].as_f64()?,
            total_secs: v["total_secs"].as_f64()?,
            exit_code: v["exit_code"].as_i64()?,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn report_line() {
        let e = "noise\nstockrun: {\"pull_secs\":1.5,\"first_output_secs\":2,\"total_secs\":3,\"exit_code\":7}\n";
        assert_eq!(
            Report::parse(e),
            Some(Report {
                pull_secs: 1.5,
                first_output_secs: 2.0,
                total_secs: 3.0,
                exit_code: 7
            })
        );
        assert_eq!(Report::parse("stockrun: pull: boom"), None);
    }
}
