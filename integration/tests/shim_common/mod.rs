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

    /// Annotations that keep this test's status and ledger private, and the sampling
    /// interval ([`interval_ms`]).
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
            format!("--annotation=io.weenv.interval_ms={}", interval_ms()),
        ]
    }

    /// Writes a shim config file (TOML body after `version = 1`, with this test's status
    /// and ledger dirs) and returns the annotation that makes a container use it.
    pub fn config_annotation(&self, name: &str, body: &str) -> Result<String> {
        let cfg = self.ctd.dir().join(format!("{name}.toml"));
        let dirs = format!(
            "[monitor]\nstatus_dir = {:?}\ninterval_ms = {}\n",
            self.status_dir.display().to_string(),
            interval_ms()
        );
        let body = if body.contains("[node]") {
            body.replacen(
                "[node]",
                &format!(
                    "[node]\nledger_dir = {:?}",
                    self.ledger_dir.display().to_string()
                ),
                1,
            )
        } else {
            format!(
                "{body}\n[node]\nledger_dir = {:?}\n",
                self.ledger_dir.display().to_string()
            )
        };
        std::fs::write(&cfg, format!("version = 1\n{dirs}{body}"))?;
        Ok(format!("--annotation=io.weenv.config={}", cfg.display()))
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

/// The shim's sampling interval in these tests: `$WEENV_TEST_INTERVAL_MS`, default 200 (the
/// shim's default). Timing bounds are multiples of it, so a slow machine (an emulated VM)
/// can run the same assertions with a longer interval.
pub fn interval_ms() -> u64 {
    std::env::var("WEENV_TEST_INTERVAL_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200)
}

/// The cgroup version this machine gives containers, from the kernel's mounts (the same
/// rule as the shim's detection, read independently): `v1` when a v1 `memory` hierarchy is
/// mounted, else `v2`. The elastic tests assert that the shim used this version.
pub fn machine_cgroup_version() -> &'static str {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let v1_memory = mounts.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() > 3 && f[2] == "cgroup" && f[3].split(',').any(|o| o == "memory")
    });
    if v1_memory {
        "v1"
    } else {
        "v2"
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
