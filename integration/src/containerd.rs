//! A private containerd for end-to-end tests.
//!
//! [`Containerd::start`] writes a config under a fresh temp dir (own root, state, gRPC and
//! ttrpc sockets; CRI disabled unless [`ContainerdOptions::cri`] asks for it, see
//! [`crate::cri`]; optionally the weenv proxy snapshotter), starts `containerd`
//! with `PATH` prefixed by the directory holding `containerd-shim-weenv-v1`, and waits until
//! it answers. [`Containerd::ctr`] runs `ctr -a <sock> -n <namespace> ...`.
//!
//! Drop tears everything down that this instance created: the shims it started (found by
//! their `-address <our socket>` argument), runc containers left in its namespaces, mounts
//! under its temp dir, the shim sockets in `/run/containerd/s/` recorded in its bundles,
//! and containerd itself. Nothing of a system containerd is touched: shim sockets are only
//! removed when one of our bundles names them.
//!
//! [`build_busybox_oci_tar`] builds a busybox-static OCI image archive offline (umoci) that
//! `ctr images import` accepts; [`Containerd::import_busybox`] imports it as
//! [`BUSYBOX_REF`].

use std::ffi::OsString;
use std::fs;
use std::io::Write;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::sys::signal::Signal;

/// Name under which [`Containerd::import_busybox`] imports the busybox test image.
pub const BUSYBOX_REF: &str = "localhost/busybox:busybox";

/// Name of the weenv runtime shim binary (`--runtime io.containerd.weenv.v1`).
pub const SHIM_BINARY: &str = "containerd-shim-weenv-v1";

/// Options for [`Containerd::start`].
#[derive(Debug, Clone)]
pub struct ContainerdOptions {
    /// Socket of a weenv snapshotter to register as `[proxy_plugins.weenv]` (type snapshot).
    pub proxy_snapshotter: Option<PathBuf>,
    /// Directory holding `containerd-shim-weenv-v1`, prepended to containerd's `PATH`.
    /// `None`: [`default_shim_dir`] (the workspace `target/debug`), if the binary is there.
    pub shim_dir: Option<PathBuf>,
    /// Default namespace for [`Containerd::ctr`]. Default: `weenv-test-<pid>-<n>`, unique per
    /// options value, because runc's state root (`/run/containerd/runc/<ns>`) and the container
    /// cgroups (`/<ns>/<id>`) are keyed by namespace and shared by every containerd on the node:
    /// two tests running at once with one namespace would clash on container ids.
    pub namespace: String,
    /// Extra TOML appended verbatim to the generated config.
    pub extra_config: String,
    /// Run containerd's CRI plugin with these settings ([`crate::cri::CriOptions`]).
    /// Default `None`: the CRI plugin is disabled.
    pub cri: Option<crate::cri::CriOptions>,
    /// How long to wait for the gRPC socket to answer. Default 30 s.
    pub start_timeout: Duration,
    /// Which containerd: Debian's 1.6 on `PATH` (config version 2) or a 2.x build from
    /// `scripts/go-tools.sh` (config version 3). Default [`Release::Debian`].
    pub release: Release,
    /// Run containerd (and so its shims) in this named network namespace
    /// (`/run/netns/<name>`, entered with `nsenter --net`, which keeps the mount namespace:
    /// FUSE mounts stay visible). Default `None`: the caller's.
    pub netns: Option<String>,
}

/// A namespace no other test process or test in this process uses.
pub fn unique_namespace() -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("weenv-test-{}-{n}", std::process::id())
}

impl Default for ContainerdOptions {
    fn default() -> Self {
        Self {
            proxy_snapshotter: None,
            shim_dir: None,
            namespace: unique_namespace(),
            extra_config: String::new(),
            cri: None,
            start_timeout: Duration::from_secs(30),
            netns: None,
            release: Release::Debian,
        }
    }
}

/// Which containerd a test runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Release {
    /// Debian's containerd 1.6 (`containerd`, `ctr`, runc on `PATH`), config version 2.
    Debian,
    /// containerd 2.x built by `scripts/go-tools.sh` ([`crate::gotools::GoTools::containerd2`]):
    /// `bin_dir` holds `containerd`, `ctr` and `containerd-shim-runc-v2` (put on containerd's
    /// `PATH` before the system's), `runc` is the runc its runc runtime execs. Config version 3.
    V2 { bin_dir: PathBuf, runc: PathBuf },
    /// containerd 1.7 built by `scripts/go-tools.sh` (`WEENV_GO_TOOLS_ONLY=containerd17`): its
    /// `containerd` binary with Debian's `ctr`, runc shim and runc (1.7 speaks the same APIs),
    /// config version 2 as 1.6.
    V17 { containerd: PathBuf },
}

impl Release {
    /// The `containerd` binary.
    pub fn containerd(&self) -> PathBuf {
        match self {
            Release::Debian => PathBuf::from("containerd"),
            Release::V2 { bin_dir, .. } => bin_dir.join("containerd"),
            Release::V17 { containerd } => containerd.clone(),
        }
    }
    /// The `ctr` binary of the same release.
    pub fn ctr(&self) -> PathBuf {
        match self {
            Release::Debian | Release::V17 { .. } => PathBuf::from("ctr"),
            Release::V2 { bin_dir, .. } => bin_dir.join("ctr"),
        }
    }
    /// The config file's `version`.
    pub fn config_version(&self) -> u32 {
        match self {
            Release::Debian | Release::V17 { .. } => 2,
            Release::V2 { .. } => 3,
        }
    }
}

/// The top of a containerd config (version 2 or 3, as `release` reads): root, state, sockets,
/// the CRI plugins disabled unless `cri`, the weenv proxy snapshotter. For version 3 also the
/// transfer service's unpack platforms (`ctr`/nerdctl pulls through the transfer service unpack
/// only into snapshotters listed there) and runc's binary. Pure.
pub fn base_config(
    release: &Release,
    base: &Path,
    cri: bool,
    proxy_snapshotter: Option<&Path>,
) -> String {
    let root = base.join("root");
    let state = base.join("state");
    let socket = base.join("containerd.sock");
    let disabled = match (cri, release) {
        (true, _) => "",
        (false, Release::Debian | Release::V17 { .. }) => "\"io.containerd.grpc.v1.cri\"",
        (false, Release::V2 { .. }) => {
            "\"io.containerd.grpc.v1.cri\", \"io.containerd.cri.v1.images\", \"io.containerd.cri.v1.runtime\""
        }
    };
    let mut cfg = format!(
        "version = {v}\nroot = {root:?}\nstate = {state:?}\n\
         disabled_plugins = [{disabled}]\n\
         [grpc]\n  address = {sock:?}\n[ttrpc]\n  address = {ttrpc:?}\n",
        v = release.config_version(),
        root = root.display().to_string(),
        state = state.display().to_string(),
        sock = socket.display().to_string(),
        ttrpc = format!("{}.ttrpc", socket.display()),
    );
    if let Some(snap) = proxy_snapshotter {
        cfg.push_str(&format!(
            "[proxy_plugins]\n  [proxy_plugins.weenv]\n    type = \"snapshot\"\n    address = {:?}\n",
            snap.display().to_string()
        ));
    }
    if let Release::V2 { .. } = release {
        let t = "[[plugins.\"io.containerd.transfer.v1.local\".unpack_config]]";
        cfg.push_str(&format!(
            "{t}\n  platform = \"linux/amd64\"\n  snapshotter = \"overlayfs\"\n  differ = \"walking\"\n"
        ));
        if proxy_snapshotter.is_some() {
            cfg.push_str(&format!(
                "{t}\n  platform = \"linux/amd64\"\n  snapshotter = \"weenv\"\n  differ = \"walking\"\n"
            ));
        }
    }
    cfg
}

/// A running private containerd; stopped and cleaned up on drop.
pub struct Containerd {
    dir: tempfile::TempDir,
    child: Option<Child>,
    socket: PathBuf,
    namespace: String,
    release: Release,
}

/// The workspace's `target/debug` (or `$CARGO_TARGET_DIR/debug`), or `$WEENV_SHIM_DIR`.
pub fn default_shim_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("WEENV_SHIM_DIR") {
        return PathBuf::from(d);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("debug")
}

impl Containerd {
    /// Writes the config, starts containerd and waits for its socket to answer.
    pub fn start(opts: ContainerdOptions) -> Result<Containerd> {
        let dir = tempfile::Builder::new()
            .prefix("weenv-ctd-")
            .tempdir()
            .context("create containerd temp dir")?;
        let base = dir.path();
        let root = base.join("root");
        let state = base.join("state");
        fs::create_dir_all(&root)?;
        fs::create_dir_all(&state)?;
        let socket = base.join("containerd.sock");
        let mut cfg = base_config(
            &opts.release,
            base,
            opts.cri.is_some(),
            opts.proxy_snapshotter.as_deref(),
        );
        if let Some(cri) = &opts.cri {
            cfg.push_str(&match &opts.release {
                Release::Debian | Release::V17 { .. } => cri.config_toml(base)?,
                Release::V2 { runc, .. } => cri.config_toml_v3(base, runc)?,
            });
        }
        cfg.push_str(&opts.extra_config);
        let cfg_path = base.join("config.toml");
        fs::write(&cfg_path, cfg).context("write containerd config")?;

        let shim_dir = opts.shim_dir.clone().unwrap_or_else(default_shim_dir);
        let mut path = OsString::from(shim_dir.as_os_str());
        path.push(":");
        if let Release::V2 { bin_dir, runc } = &opts.release {
            // 2.x's runc shim first; its runc's dir too (the weenv shim runs `runc` from PATH).
            path.push(bin_dir.as_os_str());
            path.push(":");
            if let Some(d) = runc.parent() {
                path.push(d.as_os_str());
                path.push(":");
            }
        }
        path.push(
            std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into()),
        );
        let log = fs::File::create(base.join("containerd.log"))?;
        let mut cmd = match &opts.netns {
            Some(ns) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net=/run/netns/{ns}"))
                    .arg(opts.release.containerd());
                c
            }
            None => Command::new(opts.release.containerd()),
        };
        let child = cmd
            .arg("--config")
            .arg(&cfg_path)
            .env("PATH", path)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("spawn containerd (is it installed?)")?;
        let me = Containerd {
            dir,
            child: Some(child),
            socket,
            namespace: opts.namespace.clone(),
            release: opts.release.clone(),
        };
        let deadline = Instant::now() + opts.start_timeout;
        loop {
            if me.socket.exists() {
                if let Ok(o) = me.ctr(&["version"]) {
                    if o.status.success() {
                        break;
                    }
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "containerd did not answer on {} within {:?}; log:\n{}",
                    me.socket.display(),
                    opts.start_timeout,
                    me.log()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(me)
    }

    /// The gRPC socket (`ctr -a`).
    pub fn address(&self) -> &Path {
        &self.socket
    }
    /// Which containerd this is.
    pub fn release(&self) -> &Release {
        &self.release
    }
    /// containerd's `root` dir.
    pub fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }
    /// containerd's `state` dir; shim bundles are in `state/io.containerd.runtime.v2.task/<ns>/<id>`.
    pub fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }
    /// The temp dir holding everything of this instance (free for tests to put files in).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
    /// The default namespace used by [`Containerd::ctr`].
    pub fn namespace(&self) -> &str {
        &self.namespace
    }
    /// Bundle dir of a task (where the shim keeps its per-task files).
    pub fn bundle(&self, namespace: &str, id: &str) -> PathBuf {
        self.state()
            .join("io.containerd.runtime.v2.task")
            .join(namespace)
            .join(id)
    }
    /// containerd's own log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("containerd.log")).unwrap_or_default()
    }

    /// Runs `ctr -a <sock> -n <default namespace> args...` and returns its output.
    pub fn ctr(&self, args: &[&str]) -> Result<Output> {
        self.ctr_ns(&self.namespace, args)
    }

    /// Runs `ctr -a <sock> -n <namespace> args...` and returns its output.
    pub fn ctr_ns(&self, namespace: &str, args: &[&str]) -> Result<Output> {
        self.ctr_command(namespace, args)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("run ctr {args:?}"))
    }

    /// A `ctr -a <sock> -n <namespace>` command to customise (stdin, spawn in background).
    pub fn ctr_command(&self, namespace: &str, args: &[&str]) -> Command {
        let mut c = Command::new(self.release.ctr());
        c.arg("-a")
            .arg(&self.socket)
            .arg("-n")
            .arg(namespace)
            .args(args);
        c
    }

    /// `ctr run --rm --snapshotter weenv IMAGE ID /bin/sh -c SCRIPT` in `namespace` (the
    /// caller checks the exit status).
    pub fn run_weenv_sh(
        &self,
        namespace: &str,
        image: &str,
        id: &str,
        script: &str,
    ) -> Result<Output> {
        self.ctr_ns(
            namespace,
            &[
                "run",
                "--rm",
                "--snapshotter",
                "weenv",
                image,
                id,
                "/bin/sh",
                "-c",
                script,
            ],
        )
    }

    /// Like [`Containerd::ctr`] but fails with stdout/stderr when ctr exits non-zero.
    pub fn ctr_ok(&self, args: &[&str]) -> Result<String> {
        let o = self.ctr(args)?;
        if !o.status.success() {
            bail!(
                "ctr {args:?} failed ({}): stdout: {} stderr: {}",
                o.status,
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    }

    /// Builds (once per instance) and imports the busybox test image as [`BUSYBOX_REF`]
    /// into the default namespace, unpacked for `snapshotter`.
    pub fn import_busybox(&self, snapshotter: &str) -> Result<&'static str> {
        let tar = self.dir.path().join("busybox-oci.tar");
        if !tar.exists() {
            build_busybox_oci_tar(&self.dir.path().join("busybox-build"), &tar)?;
        }
        let tar_s = tar.display().to_string();
        let snap = format!("--snapshotter={snapshotter}");
        self.ctr_ok(&[
            "images",
            "import",
            "--base-name",
            "localhost/busybox",
            &snap,
            &tar_s,
        ])?;
        Ok(BUSYBOX_REF)
    }

    fn shim_sockets(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        let tasks = self.state().join("io.containerd.runtime.v2.task");
        for ns in read_dir_paths(&tasks) {
            for b in read_dir_paths(&ns) {
                if let Ok(a) = fs::read_to_string(b.join("address")) {
                    let p = a.trim().trim_start_matches("unix://").to_string();
                    if p.starts_with("/run/containerd/s/") {
                        out.push(PathBuf::from(p));
                    }
                }
            }
        }
        out
    }

    fn runc_leftovers(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let tasks = self.state().join("io.containerd.runtime.v2.task");
        for ns in read_dir_paths(&tasks) {
            for b in read_dir_paths(&ns) {
                if let (Some(n), Some(i)) = (ns.file_name(), b.file_name()) {
                    out.push((
                        n.to_string_lossy().into_owned(),
                        i.to_string_lossy().into_owned(),
                    ));
                }
            }
        }
        out
    }
}

fn read_dir_paths(p: &Path) -> Vec<PathBuf> {
    fs::read_dir(p)
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

/// Pids of processes whose command line has `needle` as one argument.
fn pids_with_arg(needle: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for p in read_dir_paths(Path::new("/proc")) {
        let Some(pid) = p
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if let Ok(cmd) = fs::read(p.join("cmdline")) {
            if cmd.split(|b| *b == 0).any(|a| a == needle.as_bytes()) {
                out.push(pid);
            }
        }
    }
    out
}

fn kill(pid: i32, sig: Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
}

/// Lazily unmounts every mount at or below `dir`, deepest first.
pub fn unmount_below(dir: &Path) {
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let prefix = dir.display().to_string();
    let mut points: Vec<String> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| m.replace("\\040", " "))
        .filter(|m| m == &prefix || m.starts_with(&format!("{prefix}/")))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    points.dedup();
    for p in points {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(&p)
            .stderr(Stdio::null())
            .status();
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let sockets = self.shim_sockets();
        let leftovers = self.runc_leftovers();
        let namespaces: Vec<String> = self
            .ctr(&["namespaces", "ls", "-q"])
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .map(|l| l.trim().to_string())
                    .filter(|l| !l.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        // Shims started by this containerd carry `-address <our socket>`.
        let sock = self.socket.display().to_string();
        for pid in pids_with_arg(&sock) {
            if Some(pid as u32) != self.child.as_ref().map(|c| c.id()) {
                kill(pid, Signal::SIGKILL);
            }
        }
        for (ns, id) in leftovers {
            let runc = match &self.release {
                Release::V2 { runc, .. } => runc.clone(),
                Release::Debian | Release::V17 { .. } => PathBuf::from("runc"),
            };
            let _ = Command::new(runc)
                .args(["--root", &format!("/run/containerd/runc/{ns}")])
                .args(["delete", "--force", &id])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        if let Some(mut c) = self.child.take() {
            kill(c.id() as i32, Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        unmount_below(self.dir.path());
        // Empty per-namespace leftovers of runc (state root, parent cgroups); rmdir only
        // succeeds when nothing of another containerd is inside.
        for ns in &namespaces {
            let _ = fs::remove_dir(Path::new("/run/containerd/runc").join(ns));
            for ctrl in read_dir_paths(Path::new("/sys/fs/cgroup")) {
                let _ = fs::remove_dir(ctrl.join(ns));
            }
        }
        for s in sockets {
            if fs::symlink_metadata(&s)
                .map(|m| m.file_type().is_socket())
                .unwrap_or(false)
            {
                let _ = fs::remove_file(&s);
            }
        }
    }
}

/// Builds a busybox-static OCI image archive at `out_tar`, working in `work` (created).
/// Needs `umoci` and `/bin/busybox` (Debian `busybox-static`); no network.
/// The image has every busybox applet linked in `/bin`, `PATH=/bin`, cmd `/bin/sh`.
pub fn build_busybox_oci_tar(work: &Path, out_tar: &Path) -> Result<()> {
    fs::create_dir_all(work)?;
    let layout = work.join("oci");
    let bundle = work.join("bundle");
    let img = crate::images::umoci_new(&layout, "busybox")?;
    run(Command::new("umoci")
        .args(["unpack", "--rootless", "--image", &img])
        .arg(&bundle))
    .or_else(|_| {
        run(Command::new("umoci")
            .args(["unpack", "--image", &img])
            .arg(&bundle))
    })?;
    let rootfs = bundle.join("rootfs");
    for d in ["bin", "tmp", "proc", "sys", "dev", "etc", "root"] {
        fs::create_dir_all(rootfs.join(d))?;
    }
    fs::copy("/bin/busybox", rootfs.join("bin/busybox")).context("copy /bin/busybox")?;
    let list = Command::new("/bin/busybox").arg("--list").output()?;
    for applet in String::from_utf8_lossy(&list.stdout).lines() {
        let applet = applet.trim();
        if applet.is_empty() || applet == "busybox" {
            continue;
        }
        let _ = std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet));
    }
    let mut passwd = fs::File::create(rootfs.join("etc/passwd"))?;
    writeln!(passwd, "root:x:0:0:root:/root:/bin/sh")?;
    crate::images::umoci_repack_sh(&img, &bundle, "PATH=/bin")?;
    run(Command::new("tar")
        .arg("-C")
        .arg(&layout)
        .arg("-cf")
        .arg(out_tar)
        .arg("."))?;
    Ok(())
}

fn run(cmd: &mut Command) -> Result<()> {
    let o = cmd.output().with_context(|| format!("spawn {cmd:?}"))?;
    if !o.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_v3_registers_weenv_for_the_transfer_service() -> Result<()> {
        let r = Release::V2 {
            bin_dir: "/x".into(),
            runc: "/x/runc".into(),
        };
        let cfg = base_config(&r, Path::new("/t"), false, Some(Path::new("/t/snap.sock")));
        let v: toml::Value = toml::from_str(&cfg)?;
        assert_eq!(v["version"].as_integer(), Some(3));
        assert_eq!(
            v["proxy_plugins"]["weenv"]["address"].as_str(),
            Some("/t/snap.sock")
        );
        let unpack = v["plugins"]["io.containerd.transfer.v1.local"]["unpack_config"]
            .as_array()
            .context("unpack_config")?;
        let snaps: Vec<&str> = unpack
            .iter()
            .filter_map(|u| u["snapshotter"].as_str())
            .collect();
        assert_eq!(snaps, ["overlayfs", "weenv"]);
        let disabled = v["disabled_plugins"].as_array().context("disabled")?;
        assert_eq!(disabled.len(), 3, "{disabled:?}");
        let v2: toml::Value =
            toml::from_str(&base_config(&Release::Debian, Path::new("/t"), true, None))?;
        assert_eq!(v2["version"].as_integer(), Some(2));
        assert!(v2.get("plugins").is_none());
        Ok(())
    }

    #[test]
    fn shipped_v3_fragment_names_the_plugins_of_containerd_2() -> Result<()> {
        let text = fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/containerd2-config.toml"),
        )?;
        let v: toml::Value = toml::from_str(&text)?;
        assert_eq!(v["version"].as_integer(), Some(3));
        let p = &v["plugins"];
        assert_eq!(
            p["io.containerd.cri.v1.images"]["snapshotter"].as_str(),
            Some("weenv")
        );
        assert_eq!(
            p["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]["weenv"]["runtime_type"]
                .as_str(),
            Some("io.containerd.weenv.v1")
        );
        assert!(p["io.containerd.transfer.v1.local"]["unpack_config"]
            .as_array()
            .is_some_and(|u| u.iter().any(|e| e["snapshotter"].as_str() == Some("weenv"))));
        Ok(())
    }
}
