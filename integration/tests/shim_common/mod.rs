//! Shared helpers of the shim end-to-end tests: a private containerd with the weenv shim,
//! the busybox image, per-test status/ledger dirs, and reading the shim's records.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Output;

use anyhow::{bail, Context, Result};
use weenv_integration::containerd::{default_shim_dir, Containerd, ContainerdOptions, SHIM_BINARY};

pub const RUNTIME: &str = "io.containerd.weenv.v1";

/// A containerd with the shim and the busybox image, plus private weenv dirs.
pub struct ShimEnv {
    pub ctd: Containerd,
    pub image: &'static str,
    pub status_dir: PathBuf,
    pub ledger_dir: PathBuf,
}

pub fn require() -> Result<()> {
    weenv_integration::util::require_root_and_bins(&[
        "containerd",
        "ctr",
        "runc",
        "umoci",
        "busybox",
    ])?;
    let shim = default_shim_dir().join(SHIM_BINARY);
    if !shim.exists() {
        bail!(
            "{} missing: run `cargo build -p weenv-shim` first",
            shim.display()
        );
    }
    Ok(())
}

impl ShimEnv {
    /// `test` names the namespace (cgroup and runc state paths are global, so unique).
    pub fn start(test: &str) -> Result<ShimEnv> {
        require()?;
        let ns = format!("weenv-{test}-{}", std::process::id());
        let ctd = Containerd::start(ContainerdOptions {
            namespace: ns,
            ..Default::default()
        })?;
        let image = ctd.import_busybox("overlayfs")?;
        let status_dir = ctd.dir().join("weenv-status");
        let ledger_dir = ctd.dir().join("weenv-ledger");
        Ok(ShimEnv {
            ctd,
            image,
            status_dir,
            ledger_dir,
        })
    }

    /// Annotations that keep this test's status and ledger private.
    pub fn private_annotations(&self) -> Vec<String> {
        vec![
            format!(
                "--annotation=io.weenv.status.dir={}",
                self.status_dir.display()
            ),
            format!(
                "--annotation=io.weenv.ledger.dir={}",
                self.ledger_dir.display()
            ),
        ]
    }

    /// `ctr run --runtime weenv [flags] image id cmd...` (not detached unless `-d` in flags).
    pub fn run(&self, id: &str, flags: &[&str], cmd: &[&str]) -> Result<Output> {
        let mut args: Vec<String> = vec![
            "run".into(),
            format!("--runtime={RUNTIME}"),
            "--snapshotter=overlayfs".into(),
        ];
        args.extend(self.private_annotations());
        args.extend(flags.iter().map(|s| s.to_string()));
        args.push(self.image.into());
        args.push(id.into());
        args.extend(cmd.iter().map(|s| s.to_string()));
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        self.ctd.ctr(&a)
    }

    pub fn status_path(&self, id: &str) -> PathBuf {
        self.status_dir.join(self.ctd.namespace()).join(id)
    }

    /// `status.json` of a container.
    pub fn status(&self, id: &str) -> Result<serde_json::Value> {
        let p = self.status_path(id).join("status.json");
        let t = std::fs::read_to_string(&p).with_context(|| format!("read {}", p.display()))?;
        Ok(serde_json::from_str(&t)?)
    }

    /// The recorded quota changes of a container (may be empty).
    pub fn changes(&self, id: &str) -> Result<Vec<serde_json::Value>> {
        read_changes(&self.status_path(id).join("changes.jsonl"))
    }
}

pub fn read_changes(p: &Path) -> Result<Vec<serde_json::Value>> {
    let t = match std::fs::read_to_string(p) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => return Err(e.into()),
    };
    t.lines().map(|l| Ok(serde_json::from_str(l)?)).collect()
}

pub fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A busybox awk program that grows its anonymous memory by 1 MiB steps up to `mib`,
/// pausing 50 ms every 4 MiB (so ~400 MiB takes about 5 s), then prints `grown <mib>`.
pub fn grow_memory_cmd(mib: u32) -> Vec<String> {
    vec![
        "awk".into(),
        format!(
            "BEGIN {{ for (i = 0; i < {mib}; i++) {{ a[i] = sprintf(\"%1048576s\", \"\"); if (i % 4 == 0) system(\"sleep 0.05\") }}; print \"grown\", i }}"
        ),
    ]
}

/// Shell: two busy loops of `iters` iterations each, then `burst-done`.
pub fn burst_script(iters: u64) -> String {
    format!(
        "burn() {{ i=0; while [ $i -lt {iters} ]; do i=$((i+1)); done; }}; burn & burn & wait; echo burst-done"
    )
}
