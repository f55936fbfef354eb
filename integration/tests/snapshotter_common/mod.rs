//! Helpers shared by the `snapshotter_*` end-to-end tests: a `weenv-snapshotter` daemon under
//! a temp root (stopped with SIGTERM and unmounted on drop, restartable on the same root), the
//! `weenv` CLI, image conversion, and a file-tree manifest script run inside containers.

#![allow(dead_code)]

use anyhow::{bail, ensure, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use weenv_integration::containerd::unmount_below;
use weenv_integration::util::{free_port, wait_for_unix_socket, workspace_bin};

/// Daemon settings used by the tests.
#[derive(Clone, Debug)]
pub struct DaemonOptions {
    /// Registries reached over plain HTTP (the test registry and proxy).
    pub plain_http: Vec<String>,
    /// Background fill (off when a test counts bytes fetched for a workload).
    pub fill: bool,
    /// Extra lines appended to the `[fill]` section (tuning).
    pub fill_extra: String,
}

/// A running `weenv-snapshotter`.
pub struct Daemon {
    pub root: PathBuf,
    pub socket: PathBuf,
    pub config: PathBuf,
    pub status_addr: String,
    child: Option<Child>,
    log_n: u32,
}

impl Daemon {
    /// Write a config under `root` and start the daemon; waits for its socket.
    pub fn start(root: &Path, opts: &DaemonOptions) -> Result<Daemon> {
        Self::start_with_hosts_toml(root, opts, &[])
    }

    /// Like [`Daemon::start`], plus containerd-style `hosts.toml` files: (registry host, file
    /// text) written to `<root>/certs.d/<host>/hosts.toml`, the daemon's `registry.hosts_dir`.
    pub fn start_with_hosts_toml(
        root: &Path,
        opts: &DaemonOptions,
        hosts_toml: &[(String, String)],
    ) -> Result<Daemon> {
        Self::start_with_extra(root, opts, hosts_toml, "")
    }

    /// Like [`Daemon::start_with_hosts_toml`], plus `extra` appended to the config (whole
    /// sections, e.g. `[fuse]\nhandover = true\n`).
    pub fn start_with_extra(
        root: &Path,
        opts: &DaemonOptions,
        hosts_toml: &[(String, String)],
        extra: &str,
    ) -> Result<Daemon> {
        std::fs::create_dir_all(root)?;
        let socket = root.join("snap.sock");
        let port = free_port()?;
        let status_addr = format!("127.0.0.1:{port}");
        let hosts: Vec<String> = opts.plain_http.iter().map(|h| format!("{h:?}")).collect();
        let hosts_dir = root.join("certs.d");
        for (host, text) in hosts_toml {
            std::fs::create_dir_all(hosts_dir.join(host))?;
            std::fs::write(hosts_dir.join(host).join("hosts.toml"), text)?;
        }
        let cfg = format!(
            "version = 1\nroot_dir = {root:?}\nsocket = {sock:?}\nlog_level = \"info,weenv_snapshotter=debug\"\n\
             [registry]\nplain_http = [{hosts}]\nhosts_dir = {hd:?}\ncontainerd_socket = {cs:?}\n\
             [cache]\nmemory_bytes = 67108864\ndisk_bytes = 4294967296\n\
             [fill]\nenabled = {fill}\n{fill_extra}\n[observability]\nlisten = {status_addr:?}\n{extra}",
            root = root.join("state").display().to_string(),
            sock = socket.display().to_string(),
            hosts = hosts.join(", "),
            hd = hosts_dir.display().to_string(),
            cs = root.join("containerd.sock").display().to_string(),
            fill = opts.fill,
            fill_extra = opts.fill_extra,
        );
        // The code's default keeps the FUSE session in a keeper that outlives the daemon; test
        // daemons leave none behind unless a test asks for handover (snapshotter_restart.rs).
        let cfg = if extra.contains("[fuse]") {
            cfg
        } else {
            format!("{cfg}\n[fuse]\nhandover = false\n")
        };
        let config = root.join("config.toml");
        std::fs::write(&config, cfg)?;
        let mut d = Daemon {
            root: root.to_path_buf(),
            socket,
            config,
            status_addr,
            child: None,
            log_n: 0,
        };
        d.spawn()?;
        Ok(d)
    }

    fn spawn(&mut self) -> Result<()> {
        let _ = std::fs::remove_file(&self.socket);
        self.log_n += 1;
        let log = std::fs::File::create(self.root.join(format!("daemon-{}.log", self.log_n)))?;
        let child = Command::new(workspace_bin("weenv-snapshotter")?)
            .arg("--config")
            .arg(&self.config)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("spawn weenv-snapshotter")?;
        self.child = Some(child);
        if let Err(e) = wait_for_unix_socket(&self.socket, Duration::from_secs(30)) {
            bail!("snapshotter did not start: {e}; log:\n{}", self.log());
        }
        Ok(())
    }

    /// Points the daemon's `registry.containerd_socket` (`<root>/containerd.sock`, a symlink)
    /// at `ctd`: Prepares from stock clients (only the layer named) then find their image in
    /// that containerd's content store. Without it they take the ordinary path.
    pub fn use_containerd(&self, ctd: &weenv_integration::containerd::Containerd) -> Result<()> {
        let link = self.root.join("containerd.sock");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(ctd.address(), &link)?;
        Ok(())
    }

    /// All daemon logs so far.
    pub fn log(&self) -> String {
        (1..=self.log_n)
            .map(|n| {
                std::fs::read_to_string(self.root.join(format!("daemon-{n}.log")))
                    .unwrap_or_default()
            })
            .collect::<Vec<_>>()
            .join("\n--- restart ---\n")
    }

    /// SIGTERM, wait (SIGKILL after 20 s), and detach anything left mounted under the root.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let pid = nix::unistd::Pid::from_raw(c.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                match c.try_wait() {
                    Ok(Some(_)) => break,
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(50))
                    }
                    _ => {
                        let _ = c.kill();
                        let _ = c.wait();
                        break;
                    }
                }
            }
        }
        unmount_below(&self.root);
    }

    /// Stop and start again on the same root (metadata, TOCs and caches persist).
    pub fn restart(&mut self) -> Result<()> {
        self.stop();
        self.spawn()
    }

    /// `kill -9` the daemon (its FUSE mount is left dead: ENOTCONN) and start it again; the new
    /// daemon must clear the stale mount itself.
    pub fn crash_and_restart(&mut self) -> Result<()> {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.spawn()
    }

    /// SIGTERM the daemon, wait for it to exit (no unmount: with `fuse.handover` the keeper
    /// keeps the session) and start it again; returns the time from the signal until the
    /// new daemon's socket answered.
    pub fn term_and_restart(&mut self) -> Result<Duration> {
        let t = Instant::now();
        if let Some(mut c) = self.child.take() {
            let pid = nix::unistd::Pid::from_raw(c.id() as i32);
            nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)?;
            c.wait()?;
        }
        self.spawn()?;
        Ok(t.elapsed())
    }

    /// `kill -9` the daemon and start it again right away (without clearing its mount);
    /// returns the time from the kill until the new daemon's socket answered.
    pub fn kill_and_restart(&mut self) -> Result<Duration> {
        let t = Instant::now();
        self.crash_and_restart()?;
        Ok(t.elapsed())
    }

    /// Run the `weenv` CLI with this daemon's config; fails on a non-zero exit.
    pub fn weenv(&self, args: &[&str]) -> Result<String> {
        let o = Command::new(workspace_bin("weenv")?)
            .arg("--config")
            .arg(&self.config)
            .args(args)
            .stdin(Stdio::null())
            .output()?;
        if !o.status.success() {
            bail!(
                "weenv {args:?} failed: {}{}\ndaemon log:\n{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr),
                self.log()
            );
        }
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    }

    /// The value of metric `name` (with its labels, e.g.
    /// `weenv_remote_prepares_total{outcome="remote"}`) in `weenv metrics`.
    pub fn metric(&self, name: &str) -> Result<u64> {
        let m = self.weenv(&["metrics"])?;
        m.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.trim().parse().ok())
            .with_context(|| format!("{name} in /metrics:\n{m}"))
    }

    /// `weenv pull` into containerd at `ctd_sock`, namespace `ns`.
    pub fn pull(&self, ctd_sock: &Path, ns: &str, reference: &str) -> Result<String> {
        let sock = ctd_sock.display().to_string();
        self.weenv(&["pull", "-a", &sock, "-n", ns, "--plain-http", reference])
    }
}

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

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
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

/// A registry client with plain HTTP for `hosts`.
pub fn client(hosts: &[String]) -> Result<weenv_registry::Client> {
    Ok(weenv_registry::Client::new(
        weenv_converter::registry_config(hosts),
    )?)
}

/// Convert `src` to weenv at `dst` (registry to registry).
pub async fn convert(
    client: &weenv_registry::Client,
    src: &str,
    dst: &str,
) -> Result<weenv_converter::ImageReport> {
    Ok(weenv_converter::convert_image(
        client,
        &weenv_converter::ImageLocation::parse(src)?,
        &weenv_converter::ImageLocation::parse(dst)?,
        &weenv_converter::ConvertOptions::default(),
        Arc::new(weenv_converter::NoProgress),
    )
    .await?)
}

/// Sum of the layer sizes of `reference` (the image's bytes in the registry).
pub async fn image_layer_bytes(client: &weenv_registry::Client, reference: &str) -> Result<u64> {
    let r: weenv_registry::Reference = reference.parse()?;
    let (m, _) = client
        .get_image_manifest(
            &r,
            "linux",
            &weenv_registry::manifest::host_platform().architecture,
            None,
        )
        .await?;
    Ok(m.layers.iter().map(|l| l.size).sum())
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
