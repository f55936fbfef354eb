//! The Go tools built by `scripts/go-tools.sh` (pinned versions, cached under
//! `$WEENV_GO_TOOLS`, default `/var/tmp/weenv-go-tools`): containerd 2.x (`containerd`, `ctr`,
//! `containerd-shim-runc-v2`), containerd 1.7, runc, nerdctl, crictl, critest and the CNI
//! plugins. [`GoTools::ensure`] runs the script (it builds only what is missing: a cold build
//! takes minutes, a warm call returns at once) and reads where each tool is from its `--list`,
//! so the versions live in one place, the script.

use anyhow::{bail, Context, Result};
use std::collections::HashMap;
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

impl GoTools {
    /// Builds what is missing (once per test process) and returns where the tools are.
    pub fn ensure() -> Result<&'static GoTools> {
        static TOOLS: OnceLock<std::result::Result<GoTools, String>> = OnceLock::new();
        TOOLS
            .get_or_init(|| Self::build().map_err(|e| format!("{e:#}")))
            .as_ref()
            .map_err(|e| anyhow::anyhow!("{e}"))
    }

    fn build() -> Result<GoTools> {
        let o = Command::new("bash")
            .arg(script())
            .output()
            .context("running scripts/go-tools.sh")?;
        if !o.status.success() {
            bail!(
                "scripts/go-tools.sh failed ({}): it needs Go >= 1.26 (/usr/local/go/bin/go) and the \
                 Go module proxy\n{}{}",
                o.status,
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        let list = Command::new("bash")
            .arg(script())
            .arg("--list")
            .output()
            .context("running scripts/go-tools.sh --list")?;
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
