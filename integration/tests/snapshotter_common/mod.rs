//! Helpers shared by the `snapshotter_*` end-to-end tests: the Debian+python3 test image in a
//! registry ([`PythonImage`]), `ctr` helpers, and a file-tree manifest script run inside
//! containers. The daemon harness, the conversion helpers and the [`weenv_integration::stack::Stack`]
//! builder live in `weenv_integration` (re-exported here for the tests that `use
//! snapshotter_common::*`).

#![allow(dead_code)]

use anyhow::{bail, ensure, Context, Result};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

// Each test file uses some of these.
#[allow(unused_imports)]
pub use weenv_integration::convert::{client, convert, image_layer_bytes};
#[allow(unused_imports)]
pub use weenv_integration::daemon::{Daemon, DaemonOptions};

/// A daemon under `root` (plain HTTP to `host`, no background fill) and a containerd that
/// uses it as its `weenv` proxy snapshotter. Bind them as `let (daemon, ctd) = ...`: the
/// later binding of a pattern is dropped first, containerd before the snapshotter.
pub fn lazy_stack(
    root: &Path,
    host: &str,
) -> Result<(Daemon, weenv_integration::containerd::Containerd)> {
    let daemon = Daemon::start(
        root,
        &DaemonOptions {
            plain_http: vec![host.to_string()],
            fill: false,
            fill_extra: String::new(),
        },
    )?;
    let ctd = weenv_integration::containerd::Containerd::start(
        weenv_integration::containerd::ContainerdOptions {
            proxy_snapshotter: Some(daemon.socket.clone()),
            ..Default::default()
        },
    )?;
    daemon.use_containerd(&ctd)?;
    Ok((daemon, ctd))
}

/// Binaries the tests with the Debian+python3 image need.
pub const PYTHON_BINS: &[&str] = &[
    "containerd",
    "ctr",
    "runc",
    "docker-registry",
    "skopeo",
    "debootstrap",
    "fusermount3",
];

/// A private registry with a counting proxy in front, holding the Debian+python3 test image
/// as `python:gz` and converted to weenv as `python:weenv`.
pub struct PythonImage {
    pub reg: weenv_integration::registry::LocalRegistry,
    pub proxy: weenv_integration::registry::CountingProxy,
    /// `<registry>/python:gz`.
    pub gz: String,
    /// `<registry>/python:weenv` (direct, not through the proxy).
    pub direct: String,
    pub client: weenv_registry::Client,
    pub report: weenv_converter::ImageReport,
    /// Last: removed after the registry stopped.
    pub tmp: tempfile::TempDir,
}

impl PythonImage {
    /// Checks root and [`PYTHON_BINS`], starts the registry and proxy, pushes and converts.
    pub async fn start() -> Result<PythonImage> {
        weenv_integration::util::require_root_and_bins(PYTHON_BINS)?;
        let tmp = tempfile::tempdir()?;
        let reg = weenv_integration::registry::LocalRegistry::start(tmp.path())?;
        let proxy = weenv_integration::registry::CountingProxy::start(reg.addr())?;
        let img = weenv_integration::images::python()?;
        let gz = reg.push(&img, "python:gz")?;
        let direct = format!("{}/python:weenv", reg.host());
        let client = client(&[reg.host(), proxy.host()])?;
        let report = convert(&client, &gz, &direct).await?;
        Ok(PythonImage {
            reg,
            proxy,
            gz,
            direct,
            client,
            report,
            tmp,
        })
    }

    /// Daemon options for this registry and proxy (fill off).
    pub fn daemon_options(&self) -> DaemonOptions {
        DaemonOptions {
            plain_http: vec![self.reg.host(), self.proxy.host()],
            fill: false,
            fill_extra: std::env::var("WEENV_TEST_FILL_EXTRA").unwrap_or_default(),
        }
    }

    /// Records a start-up profile on a cold node (a daemon under `root` with
    /// [`Self::daemon_options`] and its own containerd): pulls `image` into namespace `a`,
    /// resets the profile, calls `run`; the profile, and what `run` returned.
    pub fn record_profile<T>(
        &self,
        root: &Path,
        image: &str,
        run: impl FnOnce(&weenv_integration::containerd::Containerd) -> Result<T>,
    ) -> Result<(String, T)> {
        use weenv_integration::containerd::{Containerd, ContainerdOptions};
        let d = Daemon::start(root, &self.daemon_options())?;
        let ctd = Containerd::start(ContainerdOptions {
            proxy_snapshotter: Some(d.socket.clone()),
            ..Default::default()
        })?;
        d.pull(ctd.address(), "a", image)?;
        d.weenv(&["profile", "--reset"])?;
        let out = run(&ctd)?;
        Ok((d.weenv(&["profile"])?, out))
    }
}

/// `ctr run --rm --snapshotter SNAPSHOTTER IMAGE ID CMD...` in namespace `ns`; its stdout.
pub fn ctr_run(
    ctd: &weenv_integration::containerd::Containerd,
    ns: &str,
    snapshotter: &str,
    image: &str,
    id: &str,
    cmd: &[&str],
) -> Result<String> {
    let mut args = vec!["run", "--rm", "--snapshotter", snapshotter, image, id];
    args.extend_from_slice(cmd);
    let o = ctd.ctr_ns(ns, &args)?;
    if !o.status.success() {
        bail!(
            "ctr run {id} failed: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// A python script printing one line per file of the root filesystem (excluding /proc,
/// /sys, /dev and the runtime-mounted /etc files): path, type, mode, uid, gid, size,
/// sha256 or link target, sorted xattrs, and the hardlink group (first path with that inode).
pub const TREE_SCRIPT: &str = r#"
import os, hashlib, stat, sys
skip = {'/proc', '/sys', '/dev', '/etc/resolv.conf', '/etc/hosts', '/etc/hostname', '/run', '/tmp/tree'}
first = {}
out = []
for d, dirs, files in os.walk('/', topdown=True):
    dirs[:] = sorted(x for x in dirs if os.path.join(d, x) not in skip)
    for n in sorted(dirs + files):
        p = os.path.join(d, n)
        if p in skip: continue
        st = os.lstat(p)
        kind = stat.S_IFMT(st.st_mode)
        if stat.S_ISREG(st.st_mode):
            h = hashlib.sha256()
            with open(p, 'rb') as f:
                for b in iter(lambda: f.read(1 << 20), b''): h.update(b)
            extra = h.hexdigest()
            link = first.setdefault((st.st_dev, st.st_ino), p) if st.st_nlink > 1 else ''
        elif stat.S_ISLNK(st.st_mode):
            extra, link = os.readlink(p), ''
        elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
            extra, link = '%d,%d' % (os.major(st.st_rdev), os.minor(st.st_rdev)), ''
        else:
            extra, link = '', ''
        try:
            xs = sorted((k, os.getxattr(p, k, follow_symlinks=False).hex()) for k in os.listxattr(p, follow_symlinks=False))
        except OSError:
            xs = []
        size = st.st_size if not stat.S_ISDIR(st.st_mode) else 0
        out.append('%s %o %o %d %d %d %s %s %s' % (p, kind, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, size, extra, xs, link))
sys.stdout.write('\n'.join(out) + '\n')
"#;

/// `base` with the layer tars `layers` appended (`umoci raw add-layer`), as an OCI layout
/// under `dir`.
pub fn image_with_layers(
    dir: &Path,
    base: &weenv_integration::images::OciImage,
    layers: &[Vec<u8>],
) -> Result<weenv_integration::images::OciImage> {
    let layout = dir.join("oci");
    let o = Command::new("cp")
        .arg("-a")
        .arg(&base.layout)
        .arg(&layout)
        .output()?;
    ensure!(
        o.status.success(),
        "cp: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    for (i, layer) in layers.iter().enumerate() {
        let tar = dir.join(format!("extra{i}.tar"));
        std::fs::write(&tar, layer)?;
        let o = Command::new("umoci")
            .args(["raw", "add-layer", "--image"])
            .arg(format!("{}:{}", layout.display(), base.tag))
            .arg(&tar)
            .output()?;
        ensure!(
            o.status.success(),
            "umoci raw add-layer: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    Ok(weenv_integration::images::OciImage {
        layout,
        tag: base.tag.clone(),
    })
}

/// The lowerdirs of the overlay mounted for task `id`'s rootfs, and its other options.
pub fn overlay_options(id: &str) -> Result<(Vec<String>, Vec<String>)> {
    let mounts = std::fs::read_to_string("/proc/mounts")?;
    let line = mounts
        .lines()
        .find(|l| l.starts_with("overlay ") && l.contains(&format!("/{id}/rootfs ")))
        .with_context(|| format!("no overlay mount for {id} in /proc/mounts"))?;
    let opts: Vec<String> = line
        .split(' ')
        .nth(3)
        .unwrap_or("")
        .split(',')
        .map(str::to_string)
        .collect();
    let lower = opts
        .iter()
        .find_map(|o| o.strip_prefix("lowerdir="))
        .context("overlay without lowerdir")?;
    let lower = lower.split(':').map(str::to_string).collect();
    Ok((lower, opts))
}

/// The lowerdirs of the overlay mounted for task `id`'s rootfs.
pub fn lowerdirs(id: &str) -> Result<Vec<String>> {
    Ok(overlay_options(id)?.0)
}

/// Starts a detached container `id` of `image` on `snapshotter`, sleeping 10 min.
pub fn start_sleeper_on(
    ctd: &weenv_integration::containerd::Containerd,
    ns: &str,
    snapshotter: &str,
    image: &str,
    id: &str,
) -> Result<()> {
    let args = [
        "run",
        "-d",
        "--snapshotter",
        snapshotter,
        image,
        id,
        "sleep",
        "600",
    ];
    let o = ctd.ctr_ns(ns, &args)?;
    ensure!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    Ok(())
}

/// Starts a detached container `id` of `image` on the weenv snapshotter, sleeping 10 min.
pub fn start_sleeper(
    ctd: &weenv_integration::containerd::Containerd,
    ns: &str,
    image: &str,
    id: &str,
) -> Result<()> {
    start_sleeper_on(ctd, ns, "weenv", image, id)
}

/// `ctr task exec` of `cmd` in task `id`; its stdout.
pub fn exec(
    ctd: &weenv_integration::containerd::Containerd,
    ns: &str,
    id: &str,
    exec_id: &str,
    cmd: &[&str],
) -> Result<String> {
    let mut args = vec!["task", "exec", "--exec-id", exec_id, id];
    args.extend_from_slice(cmd);
    let o = ctd.ctr_ns(ns, &args)?;
    if !o.status.success() {
        bail!(
            "exec in {id}: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// Kills and removes the containers `ids` (best effort).
pub fn remove_containers(ctd: &weenv_integration::containerd::Containerd, ns: &str, ids: &[&str]) {
    for id in ids {
        let _ = ctd.ctr_ns(ns, &["task", "kill", "-s", "KILL", id]);
    }
    std::thread::sleep(Duration::from_millis(500));
    for id in ids {
        let _ = ctd.ctr_ns(ns, &["task", "rm", "-f", id]);
        let _ = ctd.ctr_ns(ns, &["container", "rm", id]);
    }
}

/// (layers, native layers) from `weenv status --json`.
pub fn native_layers(d: &Daemon) -> Result<(usize, usize)> {
    let s: serde_json::Value = serde_json::from_str(&d.weenv(&["status", "--json"])?)?;
    let layers = s["layers"].as_array().context("status has no layers")?;
    let native = layers
        .iter()
        .filter(|l| l["native"].as_bool() == Some(true))
        .count();
    Ok((layers.len(), native))
}
