//! Go test programs built offline against Debian's packaged Go libraries (GOPATH mode,
//! `GOPROXY=off`): containerd 1.6's client, snapshotters and test suite from
//! `golang-github-containerd-containerd-dev` (`scripts/deps.sh`). The Go build cache is the
//! default one (the first build of containerd's packages ≈ 1.5–2.5 min, later ones seconds).

use crate::util::require_bins;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Debian's GOPATH of packaged Go libraries.
pub const DEBIAN_GOPATH: &str = "/usr/share/gocode";

/// What to build from a package directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Build {
    /// `go build`: the package's program.
    Program,
    /// `go test -c`: the package's test binary.
    Tests,
}

/// Builds the Go package in `source` into `out_dir/<name>`; returns the binary's path.
pub fn build(source: &Path, out_dir: &Path, name: &str, what: Build) -> Result<PathBuf> {
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
    let bin = out_dir.join(name);
    let mut cmd = Command::new("go");
    match what {
        Build::Program => cmd.arg("build"),
        Build::Tests => cmd.args(["test", "-c"]),
    };
    let o = cmd
        .arg("-o")
        .arg(&bin)
        .arg(".")
        .current_dir(source)
        .env("GO111MODULE", "off")
        .env("GOPROXY", "off")
        .env("GOFLAGS", "")
        .env("GOPATH", format!("{}:{DEBIAN_GOPATH}", gopath.display()))
        .output()
        .with_context(|| format!("running go for {}", source.display()))?;
    if !o.status.success() {
        bail!(
            "go build of {} failed:\n{}{}",
            source.display(),
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    Ok(bin)
}
