//! The Go tools built by `scripts/go-tools.sh` (pinned versions, cached under
//! `$WEENV_GO_TOOLS`, default `/var/tmp/weenv-go-tools`): containerd 2.x (`containerd`, `ctr`,
//! `containerd-shim-runc-v2`), containerd 1.7, runc, nerdctl, crictl, critest and the CNI
//! plugins. [`require`] reads where each tool is from the script's `--list` (so the versions
//! live in one place, the script) and never builds: a cold build takes minutes, so CI builds the
//! tools before the tests (`.ci/run`) and a developer runs `scripts/go-tools.sh` once.
//!
//! A missing tool fails the test in CI (the `CI` environment variable set, as `.ci/run` does)
//! and skips it loudly elsewhere: a `SKIPPED` line on the test process's stderr, which cargo's
//! output capture does not swallow.

use anyhow::{bail, Context, Result};
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// One pinned tool: its version and the directory holding its binaries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tool {
    pub version: String,
    pub dir: PathBuf,
}

/// Where each pinned Go tool is.
#[derive(Clone, Debug)]
pub struct GoTools {
    tools: HashMap<String, Tool>,
}

/// The script that builds the tools.
pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/go-tools.sh")
}

/// Parses `go-tools.sh --list` (`name version dir` per line). Pure.
pub fn parse_list(text: &str) -> HashMap<String, Tool> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (name, version, dir) = (f.next()?, f.next()?, f.next()?);
            Some((
                name.to_string(),
                Tool {
                    version: version.to_string(),
                    dir: PathBuf::from(dir),
                },
            ))
        })
        .collect()
}

/// Whether this is a CI run (`CI` set to anything but empty, `0` or `false`). Pure on its input.
pub fn is_ci(var: Option<&str>) -> bool {
    !matches!(var.map(str::trim), None | Some("" | "0" | "false"))
}

/// The tools `names` for test `test`: `Some` when all are built; in CI an error when one is
/// missing; outside CI `None` after a `SKIPPED` line on stderr (the test then returns `Ok`).
pub fn require(test: &str, names: &[&str]) -> Result<Option<&'static GoTools>> {
    let missing = match GoTools::find() {
        Ok(t) => match names.iter().find_map(|n| t.tool(n).err()) {
            None => return Ok(Some(t)),
            Some(e) => e,
        },
        Err(e) => e,
    };
    if is_ci(std::env::var("CI").ok().as_deref()) {
        return Err(missing.context(format!(
            "{test}: a Go tool is missing in CI (.ci/run builds them with scripts/go-tools.sh)"
        )));
    }
    // Straight to the process's stderr: the test harness captures eprintln!, not this.
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED {test}: {missing:#} (build the tools with scripts/go-tools.sh; in CI this fails)"
    );
    Ok(None)
}

impl GoTools {
    /// Where the tools are (read once per test process from `go-tools.sh --list`); whether each
    /// is built is checked by [`GoTools::tool`].
    pub fn find() -> Result<&'static GoTools> {
        static TOOLS: OnceLock<std::result::Result<GoTools, String>> = OnceLock::new();
        TOOLS
            .get_or_init(|| Self::list().map_err(|e| format!("{e:#}")))
            .as_ref()
            .map_err(|e| anyhow::anyhow!("{e}"))
    }

    fn list() -> Result<GoTools> {
        let list = Command::new("bash")
            .arg(script())
            .arg("--list")
            .output()
            .context("running scripts/go-tools.sh --list")?;
        if !list.status.success() {
            bail!(
                "scripts/go-tools.sh --list failed ({}): {}",
                list.status,
                String::from_utf8_lossy(&list.stderr)
            );
        }
        let tools = parse_list(&String::from_utf8_lossy(&list.stdout));
        if tools.is_empty() {
            bail!("scripts/go-tools.sh --list printed no tool");
        }
        Ok(GoTools { tools })
    }

    /// The pinned tool `name` (`containerd2`, `runc`, `nerdctl`, `crictl`, `critest`, `cni`,
    /// `containerd17`).
    pub fn tool(&self, name: &str) -> Result<&Tool> {
        let t = self
            .tools
            .get(name)
            .with_context(|| format!("scripts/go-tools.sh pins no tool named {name}"))?;
        if !t.dir.join(".done").is_file() {
            bail!(
                "{name} {} is not built in {} (run scripts/go-tools.sh)",
                t.version,
                t.dir.display()
            );
        }
        Ok(t)
    }

    /// The binary `bin` of tool `name`.
    pub fn bin(&self, name: &str, bin: &str) -> Result<PathBuf> {
        let p = self.tool(name)?.dir.join(bin);
        if !p.is_file() {
            bail!("{} missing (run scripts/go-tools.sh)", p.display());
        }
        Ok(p)
    }

    /// containerd 1.7 ([`crate::containerd::Release::V17`]), if built.
    pub fn containerd17(&self) -> Result<crate::containerd::Release> {
        Ok(crate::containerd::Release::V17 {
            containerd: self.bin("containerd17", "containerd")?,
        })
    }

    /// containerd 2.x: its binaries' dir (`containerd`, `ctr`, `containerd-shim-runc-v2`) and
    /// the runc it runs.
    pub fn containerd2(&self) -> Result<crate::containerd::Release> {
        Ok(crate::containerd::Release::V2 {
            bin_dir: self.tool("containerd2")?.dir.clone(),
            runc: self.bin("runc", "runc")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ci_variable() {
        assert!(is_ci(Some("true")));
        assert!(is_ci(Some("1")));
        assert!(!is_ci(None));
        assert!(!is_ci(Some("")));
        assert!(!is_ci(Some("false")));
        assert!(!is_ci(Some("0")));
    }

    #[test]
    fn list_lines() {
        let t = parse_list("containerd2 v2.4.2 /var/tmp/x/containerd2-v2.4.2\nbad\n");
        assert_eq!(t.len(), 1);
        assert_eq!(t["containerd2"].version, "v2.4.2");
        assert_eq!(
            t["containerd2"].dir,
            PathBuf::from("/var/tmp/x/containerd2-v2.4.2")
        );
    }
}
