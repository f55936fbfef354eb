//! `stockrun` (`integration/go/stockrun`): containerd's own Go client making nerdctl's calls
//! (pull with unpack and a snapshotter, new container with a snapshot, task start/wait), built
//! offline in GOPATH mode against Debian's `golang-github-containerd-containerd-dev`.
//! [`build`] compiles it into a directory; [`Report`] is the JSON line it prints to stderr.

use crate::util::require_bins;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Debian's GOPATH of packaged Go libraries.
pub const DEBIAN_GOPATH: &str = "/usr/share/gocode";

/// Source directory of `stockrun`.
pub fn source_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("go/stockrun")
}

/// Builds `stockrun` into `out_dir` (GOPATH mode against [`DEBIAN_GOPATH`], offline:
/// `GOPROXY=off`); returns the binary's path. The Go build cache is the default one (first
/// build ≈ 1.5 min, later ones seconds).
pub fn build(out_dir: &Path) -> Result<PathBuf> {
    require_bins(&["go"])?;
    let client = Path::new(DEBIAN_GOPATH).join("src/github.com/containerd/containerd/client.go");
    if !client.is_file() {
        bail!(
            "{} missing: install golang-github-containerd-containerd-dev (scripts/deps.sh)",
            client.display()
        );
    }
    let gopath = out_dir.join("gopath");
    std::fs::create_dir_all(&gopath)?;
    let bin = out_dir.join("stockrun");
    let o = Command::new("go")
        .arg("build")
        .arg("-o")
        .arg(&bin)
        .arg(".")
        .current_dir(source_dir())
        .env("GO111MODULE", "off")
        .env("GOPROXY", "off")
        .env("GOFLAGS", "")
        .env("GOPATH", format!("{}:{DEBIAN_GOPATH}", gopath.display()))
        .output()
        .context("running go build")?;
    if !o.status.success() {
        bail!(
            "go build of {} failed:\n{}{}",
            source_dir().display(),
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    Ok(bin)
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
