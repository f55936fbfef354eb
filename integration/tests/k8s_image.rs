//! The daemon's own OCI image, built by `scripts/build-image.sh` (here from the debug
//! binaries), run the way the DaemonSets of `config/k8s/` run it on a node, in a private
//! containerd that also uses it as its `weenv` proxy snapshotter (the node's set-up,
//! docs/kubernetes.md):
//!
//! - the image: entrypoint, `org.opencontainers.image.*` labels, the OCI archive that
//!   `ctr images import` takes, under the name the DaemonSets use;
//! - the weenv-fuse-keeper DaemonSet's container (its args, unprivileged, host network) and the
//!   weenv-snapshotter DaemonSet's container (its args, privileged, host network, the ConfigMap
//!   as `/etc/weenv`, `/dev/fuse`, rootfs propagation `rshared` and an `rshared` bind for the
//!   Bidirectional state dir — what containerd's CRI plugin does for them), each hostPath
//!   volume a dir under a temp "host" dir that is a shared mount, as `/` is on a systemd node.
//!   hostPaths the daemon's config names are mounted at their temp host path and the config
//!   is the ConfigMap's with those paths (and the probe port) replaced, because the daemon gives
//!   containerd paths that must resolve on the host;
//! - the daemon serves the probes' `/status`; its FUSE mount shows on the host (Bidirectional);
//!   the host's containerd lists, creates and mounts snapshots through its socket (busybox
//!   imported and run with `--snapshotter weenv`); a weenv image pulled with `weenv pull` on the
//!   node (registry from a `hosts.toml` in the certs.d hostPath) runs lazily, reading through
//!   the FUSE mount made in the daemon's container; it hands its FUSE session to the keeper's
//!   container on SIGTERM;
//! - teardown leaves no task, mount or process.

mod k8s_common;
mod snapshotter_common;

use anyhow::{bail, ensure, Context, Result};
use k8s_common::*;
use serde_json::Value;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use weenv_integration::containerd::{unmount_below, Containerd, ContainerdOptions};
use weenv_integration::images;
use weenv_integration::registry::LocalRegistry;
use weenv_integration::util::{
    free_port, require_root_and_bins, wait_for_unix_socket, workspace_bin, E2E_FUSE_BINS,
};
use weenv_snapshotter::config::Config;

fn run_ok(cmd: &mut Command) -> Result<String> {
    let o = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("spawn {cmd:?}"))?;
    if !o.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}{}",
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

fn build_script() -> Command {
    let mut c = Command::new("bash");
    c.arg(repo_file("scripts/build-image.sh"));
    c
}

/// The image built from the workspace's debug `weenv-snapshotter` into `out`: its reference,
/// its OCI archive and its config (checked).
fn build_image(out: &Path) -> Result<(String, PathBuf, Value)> {
    let bin = workspace_bin("weenv-snapshotter")?;
    let bin_dir = bin.parent().context("binary dir")?;
    let log = run_ok(
        build_script()
            .arg("--bin-dir")
            .arg(bin_dir)
            .arg("--out")
            .arg(out),
    )?;
    let reference = run_ok(build_script().arg("--print-ref"))?
        .trim()
        .to_string();
    let tag = reference.rsplit(':').next().context("tag")?;
    ensure!(
        log.contains(&format!("image:    {reference} (sha256:")),
        "build-image.sh did not report {reference}: {log}"
    );
    let archive = out.join(format!("weenv-snapshotter-{tag}.oci.tar"));
    ensure!(archive.is_file(), "no archive {}", archive.display());
    let layout = format!("oci:{}:{tag}", out.join("oci").display());
    let config: Value = serde_json::from_str(&run_ok(
        Command::new("skopeo").args(["inspect", "--config", &layout]),
    )?)?;
    let c = &config["config"];
    assert_eq!(
        c["Entrypoint"],
        serde_json::json!(["/usr/local/bin/weenv-snapshotter"]),
        "entrypoint"
    );
    assert_eq!(
        c["Cmd"],
        serde_json::json!(["--config", "/etc/weenv/config.toml"]),
        "cmd"
    );
    assert_eq!(config["os"], "linux");
    let labels = &c["Labels"];
    assert_eq!(
        labels["org.opencontainers.image.title"],
        "weenv-snapshotter"
    );
    assert_eq!(
        labels["org.opencontainers.image.version"],
        env!("CARGO_PKG_VERSION"),
        "version label"
    );
    for l in ["revision", "created", "licenses", "description"] {
        let v = labels[format!("org.opencontainers.image.{l}")].as_str();
        assert!(
            v.is_some_and(|v| !v.is_empty()),
            "label org.opencontainers.image.{l} missing: {labels}"
        );
    }
    Ok((reference, archive, config))
}

/// A DaemonSet's container as `ctr run` arguments.
struct PodRun {
    args: Vec<String>,
    mounts: Vec<String>,
    privileged: bool,
    host_network: bool,
    rshared_root: bool,
}

/// The node: a temp dir whose `host/` is a shared bind mount (the node's `/` for hostPath
/// volumes) and a private containerd. Drop stops everything and unmounts what is left.
struct Node {
    ctd: Option<Containerd>,
    tmp: tempfile::TempDir,
    tasks: Vec<String>,
}

impl Node {
    fn host(&self) -> PathBuf {
        self.tmp.path().join("host")
    }
    /// Where hostPath `path` of a DaemonSet is on this node.
    fn host_path(&self, path: &str) -> PathBuf {
        self.host().join(path.trim_start_matches('/'))
    }
    fn ctd(&self) -> &Containerd {
        self.ctd.as_ref().expect("containerd runs")
    }
    /// `ctr task ls` rows for `id`: (pid, status).
    fn task(&self, id: &str) -> Result<Option<(i32, String)>> {
        let out = self.ctd().ctr_ok(&["tasks", "ls"])?;
        Ok(out.lines().skip(1).find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.first() == Some(&id)).then(|| {
                (
                    f.get(1).and_then(|p| p.parse().ok()).unwrap_or(0),
                    f.get(2).unwrap_or(&"").to_string(),
                )
            })
        }))
    }
    fn wait_status(&self, id: &str, want: &str, timeout: Duration) -> Result<i32> {
        let deadline = Instant::now() + timeout;
        loop {
            let t = self.task(id)?;
            if let Some((pid, status)) = &t {
                if status == want {
                    return Ok(*pid);
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "task {id} not {want} after {timeout:?} ({t:?}); log:\n{}",
                    self.log(id)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    fn log(&self, id: &str) -> String {
        std::fs::read_to_string(self.tmp.path().join(format!("{id}.log"))).unwrap_or_default()
    }
    /// `ctr run -d` of the image as `pod`, stdout/stderr to `<tmp>/<id>.log`.
    fn run(&mut self, image: &str, id: &str, pod: &PodRun) -> Result<i32> {
        let log = format!(
            "file://{}",
            self.tmp.path().join(format!("{id}.log")).display()
        );
        let mut args: Vec<String> = vec!["run".into(), "-d".into(), "--log-uri".into(), log];
        if pod.privileged {
            args.push("--privileged".into());
        }
        if pod.host_network {
            args.push("--net-host".into());
        }
        if pod.rshared_root {
            args.extend(["--rootfs-propagation".into(), "rshared".into()]);
        }
        for m in &pod.mounts {
            args.extend(["--mount".into(), m.clone()]);
        }
        args.extend([image.to_string(), id.to_string()]);
        args.extend(pod.args.iter().cloned());
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        self.ctd().ctr_ok(&refs)?;
        self.tasks.push(id.to_string());
        self.wait_status(id, "RUNNING", Duration::from_secs(30))
    }
    /// Stops the task as the kubelet does (SIGTERM, SIGKILL after the pod's
    /// terminationGracePeriodSeconds, `grace`), deletes task and container; whether SIGTERM
    /// alone stopped it, and its log.
    fn stop(&mut self, id: &str, grace: Duration) -> Result<(bool, String)> {
        self.ctd().ctr_ok(&["tasks", "kill", "-s", "SIGTERM", id])?;
        let by_term = self.wait_status(id, "STOPPED", grace).is_ok();
        if !by_term {
            self.ctd().ctr_ok(&["tasks", "kill", "-s", "SIGKILL", id])?;
            self.wait_status(id, "STOPPED", Duration::from_secs(10))?;
        }
        self.ctd().ctr_ok(&["tasks", "delete", id])?;
        self.ctd().ctr_ok(&["containers", "delete", id])?;
        self.tasks.retain(|t| t != id);
        Ok((by_term, self.log(id)))
    }
}

/// The pod's terminationGracePeriodSeconds (Kubernetes' default 30 s when unset).
fn grace(ds: &Value) -> Duration {
    Duration::from_secs(
        ds.pointer("/spec/template/spec/terminationGracePeriodSeconds")
            .and_then(Value::as_u64)
            .unwrap_or(30),
    )
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(ctd) = &self.ctd {
            for id in &self.tasks {
                let _ = ctd.ctr(&["tasks", "kill", "-s", "SIGKILL", id]);
            }
        }
        // containerd's drop kills its shims and deletes their runc containers.
        self.ctd.take();
        unmount_below(self.tmp.path());
    }
}

/// How the weenv-snapshotter ConfigMap's paths map onto the temp node: (mountPath of a hostPath
/// volume the config names, its host path on the node), longest first.
fn mirrored(ds: &Value, config: &str, node: &Node) -> Vec<(String, PathBuf)> {
    let what = "weenv-snapshotter DaemonSet";
    let c = only_container(ds, what);
    let volumes = array_at(ds, "/spec/template/spec/volumes", what);
    let mut out = Vec::new();
    for m in array_at(c, "/volumeMounts", what) {
        let mount_path = str_at(m, "/mountPath", what);
        let v = volumes
            .iter()
            .find(|v| v["name"] == m["name"])
            .expect("volume of a mount");
        if let Some(hp) = v.pointer("/hostPath/path").and_then(Value::as_str) {
            if config.contains(mount_path) {
                out.push((mount_path.to_string(), node.host_path(hp)));
            }
        }
    }
    out.sort_by_key(|(m, _)| std::cmp::Reverse(m.len()));
    out
}

fn render(text: &str, map: &[(String, PathBuf)]) -> String {
    map.iter().fold(text.to_string(), |t, (from, to)| {
        t.replace(from.as_str(), &to.display().to_string())
    })
}

/// The one container of `ds` as `ctr run` arguments on `node`: entrypoint + args, hostPath
/// volumes as rbind mounts of their dirs on the node (at their node path when `map` names
/// them, else at their mountPath; `/dev/fuse` as is), ConfigMap volumes as dirs of `files`.
fn pod_run(
    ds: &Value,
    entrypoint: &[String],
    map: &[(String, PathBuf)],
    configmaps: &[(String, PathBuf)],
    node: &Node,
    what: &str,
) -> Result<PodRun> {
    let c = only_container(ds, what);
    let spec = ds.pointer("/spec/template/spec").context("pod spec")?;
    let volumes = array_at(ds, "/spec/template/spec/volumes", what);
    let mut mounts = Vec::new();
    let mut rshared_root = false;
    for m in array_at(c, "/volumeMounts", what) {
        let mount_path = str_at(m, "/mountPath", what);
        let v = volumes
            .iter()
            .find(|v| v["name"] == m["name"])
            .with_context(|| format!("{what}: volume {}", m["name"]))?;
        let (src, dst) = if let Some(cm) = v.pointer("/configMap/name").and_then(Value::as_str) {
            let dir = configmaps
                .iter()
                .find(|(n, _)| n == cm)
                .with_context(|| format!("{what}: ConfigMap {cm}"))?
                .1
                .clone();
            (dir, PathBuf::from(mount_path))
        } else {
            let hp = str_at(v, "/hostPath/path", what);
            if v.pointer("/hostPath/type").and_then(Value::as_str) == Some("CharDevice") {
                (PathBuf::from(hp), PathBuf::from(mount_path))
            } else {
                let src = node.host_path(hp);
                std::fs::create_dir_all(&src)?;
                let dst = map
                    .iter()
                    .find(|(from, _)| from == mount_path)
                    .map(|(_, to)| to.clone())
                    .unwrap_or_else(|| PathBuf::from(mount_path));
                (src, dst)
            }
        };
        let mut opts = vec!["rbind"];
        opts.push(if m["readOnly"] == true { "ro" } else { "rw" });
        match m.pointer("/mountPropagation").and_then(Value::as_str) {
            Some("Bidirectional") => {
                opts.push("rshared");
                rshared_root = true;
            }
            Some("HostToContainer") => opts.push("rslave"),
            _ => opts.push("rprivate"),
        }
        mounts.push(format!(
            "type=bind,src={},dst={},options={}",
            src.display(),
            dst.display(),
            opts.join(":")
        ));
    }
    let args: Vec<String> = array_at(c, "/args", what)
        .iter()
        .map(|a| render(a.as_str().unwrap_or_default(), map))
        .collect();
    Ok(PodRun {
        args: entrypoint.iter().cloned().chain(args).collect(),
        mounts,
        privileged: c.pointer("/securityContext/privileged") == Some(&Value::Bool(true)),
        host_network: spec["hostNetwork"] == true,
        rshared_root,
    })
}

/// `GET path` on `addr`: (status code, body).
fn http_get(addr: &str, path: &str) -> Result<(u16, String)> {
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut resp = String::new();
    s.read_to_string(&mut resp)?;
    let code = resp
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("bad HTTP response: {resp:?}"))?;
    let body = resp.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    Ok((code, body.to_string()))
}

fn fuse_mounts_at(path: &Path) -> usize {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let p = path.display().to_string();
    info.lines()
        .filter(|l| l.split(' ').nth(4) == Some(p.as_str()))
        .filter(|l| l.split(" - ").nth(1).is_some_and(|r| r.starts_with("fuse")))
        .count()
}

fn mounts_below(dir: &Path) -> Vec<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let p = dir.display().to_string();
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| m.starts_with(&p))
        .map(str::to_string)
        .collect()
}

#[test]
#[ignore = "needs root, containerd, runc, umoci, skopeo and /dev/fuse"]
fn daemonset_image_runs_on_a_node() -> Result<()> {
    require_root_and_bins(E2E_FUSE_BINS)?;
    require_root_and_bins(&["mount", "tar"])?;
    let tmp = tempfile::Builder::new()
        .prefix("weenv-k8s-image-")
        .tempdir()?;
    // A registry with busybox converted to weenv, for a lazy pull through the daemon's pod.
    let reg = LocalRegistry::start(&tmp.path().join("registry"))?;
    let reg_host = reg.host();
    let gz = format!("{reg_host}/busybox:gz");
    images::push_oci_layout(&images::busybox()?, &gz)?;
    let lazy = format!("{reg_host}/busybox:weenv");
    tokio::runtime::Runtime::new()?.block_on(snapshotter_common::convert(
        &snapshotter_common::client(std::slice::from_ref(&reg_host))?,
        &gz,
        &lazy,
    ))?;
    let (reference, archive, image_config) = build_image(&tmp.path().join("image"))?;
    let entrypoint: Vec<String> =
        serde_json::from_value(image_config["config"]["Entrypoint"].clone())?;

    let host = tmp.path().join("host");
    std::fs::create_dir_all(&host)?;
    let mut node = Node {
        ctd: None,
        tmp,
        tasks: Vec::new(),
    };

    // The manifests, rendered onto the node.
    let sdocs = documents(SNAPSHOTTER);
    let sds = find(&sdocs, "DaemonSet", "weenv-snapshotter", SNAPSHOTTER);
    let sc = only_container(sds, SNAPSHOTTER);
    let kdocs = documents(KEEPER);
    let kds = find(&kdocs, "DaemonSet", "weenv-fuse-keeper", KEEPER);
    for c in [sc, only_container(kds, KEEPER)] {
        assert_eq!(
            str_at(c, "/image", "DaemonSet"),
            reference,
            "DaemonSet image"
        );
    }
    let (config_path, config_text) = config_file(&sdocs, sds, sc, SNAPSHOTTER);
    let map = mirrored(sds, &config_text, &node);
    let probe = sc
        .pointer("/livenessProbe/httpGet")
        .context("livenessProbe")?;
    let probe_port = probe["port"].as_u64().context("probe port")?;
    let probe_path = str_at(probe, "/path", "livenessProbe");
    let listen = format!("127.0.0.1:{}", free_port()?);
    let orig_listen = format!("127.0.0.1:{probe_port}");
    ensure!(
        config_text.contains(&orig_listen),
        "ConfigMap config does not listen on the probe's {orig_listen}"
    );
    let rendered = render(&config_text, &map).replace(&orig_listen, &listen);
    let cfg = Config::from_toml(&rendered, &config_path).context("rendered ConfigMap config")?;
    let cm_name = "weenv-snapshotter";
    let cm_dir = node.tmp.path().join("configmap").join(cm_name);
    std::fs::create_dir_all(&cm_dir)?;
    let cm_config = cm_dir.join(config_path.file_name().context("config file name")?);
    std::fs::write(&cm_config, &rendered)?;
    let configmaps = vec![(cm_name.to_string(), cm_dir)];
    // The node's registry settings: a containerd-style hosts.toml in the certs.d hostPath
    // the daemon reads (`registry.hosts_dir`).
    let hosts_dir = cfg.registry.hosts_dir.clone();
    ensure!(hosts_dir.starts_with(&host), "hosts_dir is not on the node");
    std::fs::create_dir_all(hosts_dir.join(&reg_host))?;
    std::fs::write(
        hosts_dir.join(&reg_host).join("hosts.toml"),
        format!("server = \"http://{reg_host}\"\n"),
    )?;
    let snap_pod = pod_run(sds, &entrypoint, &map, &configmaps, &node, SNAPSHOTTER)?;
    let keeper_pod = pod_run(kds, &entrypoint, &map, &configmaps, &node, KEEPER)?;
    assert!(snap_pod.privileged && snap_pod.host_network && snap_pod.rshared_root);
    assert!(!keeper_pod.privileged);
    for p in [&cfg.socket, &cfg.root_dir] {
        ensure!(
            p.starts_with(&host),
            "{} of the rendered config is not on the node",
            p.display()
        );
    }

    // The node's containerd: weenv as its proxy snapshotter, its socket in the hostPath dir
    // the DaemonSet mounts as /run/containerd (a hard link: the daemon reads image labels
    // through registry.containerd_socket = /run/containerd/containerd.sock).
    let ctd = Containerd::start(ContainerdOptions {
        proxy_snapshotter: Some(cfg.socket.clone()),
        ..Default::default()
    })?;
    let run_ctd = node.host_path("/run/containerd");
    std::fs::create_dir_all(&run_ctd)?;
    std::fs::hard_link(ctd.address(), run_ctd.join("containerd.sock"))?;
    node.ctd = Some(ctd);
    // The node's `/` for hostPaths: a shared mount (as `/` is on a systemd node), so that
    // Bidirectional mounts reach it. (After the hard link: link(2) does not cross mounts.)
    let hs = host.display().to_string();
    run_ok(Command::new("mount").args(["--bind", &hs, &hs]))?;
    run_ok(Command::new("mount").args(["--make-rshared", &hs]))?;

    let archive_s = archive.display().to_string();
    node.ctd().ctr_ok(&["images", "import", &archive_s])?;
    let images = node.ctd().ctr_ok(&["images", "ls", "-q"])?;
    ensure!(
        images.lines().any(|l| l.trim() == reference),
        "ctr images import did not name the image {reference}: {images}"
    );

    // The keeper first (docs/kubernetes.md, Install), then the daemon.
    let keeper_pid = node.run(&reference, "keeper", &keeper_pod)?;
    for socket in [cfg.keeper_socket(), cfg.plain_keeper_socket()] {
        wait_for_unix_socket(&socket, Duration::from_secs(30))
            .with_context(|| format!("keeper socket; keeper log:\n{}", node.log("keeper")))?;
    }
    let snap_pid = node.run(&reference, "snapshotter", &snap_pod)?;
    wait_for_unix_socket(&cfg.socket, Duration::from_secs(60))
        .with_context(|| format!("snapshotter socket; log:\n{}", node.log("snapshotter")))?;

    // The probes' endpoint.
    let (code, body) = http_get(&listen, probe_path)?;
    assert_eq!(code, 200, "{probe_path}: {body}");
    serde_json::from_str::<Value>(&body)
        .with_context(|| format!("{probe_path} is not JSON: {body}"))?;
    // Bidirectional: the daemon's FUSE mount, made inside its container, is on the host.
    let mnt = cfg.mountpoint();
    assert_eq!(
        fuse_mounts_at(&mnt),
        1,
        "the daemon's FUSE mount at {} is not visible on the node; log:\n{}",
        mnt.display(),
        node.log("snapshotter")
    );
    if let Some(plain) = cfg.plain_mountpoint() {
        assert_eq!(
            fuse_mounts_at(&plain),
            1,
            "the daemon's plain FUSE session at {} is not visible on the node; log:\n{}",
            plain.display(),
            node.log("snapshotter")
        );
    }
    let kept = node
        .log("snapshotter")
        .matches("the keeper holds the FUSE session")
        .count();
    assert!(
        kept == 1 + usize::from(cfg.fuse.plain_session),
        "the daemon did not hand both sessions to the keeper container; log:\n{}",
        node.log("snapshotter")
    );

    // The node's containerd uses it: snapshots created (busybox unpacked through the daemon in
    // the container), listed and mounted for a container on the host. containerd started
    // before the daemon (it runs it), so its proxy-plugin connection is in reconnect backoff
    // for a moment after the daemon serves (as on a node, where the kubelet retries).
    let t = Instant::now();
    loop {
        let probe = node.ctd().ctr(&[
            "snapshots",
            "--snapshotter",
            "weenv",
            "prepare",
            "k8s-image-probe",
        ])?;
        if probe.status.success() {
            break;
        }
        ensure!(
            t.elapsed() < Duration::from_secs(30),
            "containerd cannot reach the daemon: {}; daemon log:\n{}",
            String::from_utf8_lossy(&probe.stderr),
            node.log("snapshotter")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!(
        "containerd reached the daemon after {:?} of retries",
        t.elapsed()
    );
    node.ctd().ctr_ok(&[
        "snapshots",
        "--snapshotter",
        "weenv",
        "rm",
        "k8s-image-probe",
    ])?;
    let busybox = node.ctd().import_busybox("weenv").with_context(|| {
        format!(
            "daemon log:\n{}\ncontainerd log:\n{}",
            node.log("snapshotter"),
            node.ctd().log()
        )
    })?;
    let out = node.ctd().ctr_ok(&[
        "run",
        "--rm",
        "--snapshotter",
        "weenv",
        busybox,
        "k8s-image-busybox",
        "/bin/sh",
        "-c",
        "echo hello from weenv",
    ])?;
    assert_eq!(out.trim(), "hello from weenv");
    let snaps = node
        .ctd()
        .ctr_ok(&["snapshots", "--snapshotter", "weenv", "ls"])?;
    ensure!(snaps.lines().count() > 1, "no weenv snapshots: {snaps}");
    // Lazily: `weenv pull` on the node (the CLI with the node's config) commits remote
    // snapshots; the container reads through the FUSE mount made in the daemon's pod.
    let ctd_sock = node.ctd().address().display().to_string();
    let ns = node.ctd().namespace().to_string();
    run_ok(
        Command::new(workspace_bin("weenv")?)
            .arg("--config")
            .arg(&cm_config)
            .args(["pull", "-a", &ctd_sock, "-n", &ns, "--plain-http", &lazy]),
    )
    .with_context(|| format!("weenv pull; daemon log:\n{}", node.log("snapshotter")))?;
    let out = node.ctd().ctr_ok(&[
        "run",
        "--rm",
        "--snapshotter",
        "weenv",
        &lazy,
        "k8s-image-lazy",
        "/bin/sh",
        "-c",
        "echo lazy; wc -c < /bin/busybox",
    ])?;
    ensure!(out.starts_with("lazy\n"), "lazy container printed {out:?}");
    let (code, metrics) = http_get(&listen, "/metrics")?;
    assert_eq!(code, 200);
    assert!(
        metrics.contains("weenv_remote_prepares_total{outcome=\"remote\"} 1"),
        "the weenv layer was not served lazily: {metrics}"
    );

    // Rollout-style stop: SIGTERM leaves the session to the keeper container.
    let (by_term, log) = node.stop("snapshotter", grace(sds))?;
    assert!(by_term, "the daemon did not exit on SIGTERM; log:\n{log}");
    assert!(
        node.log("keeper").contains("keeping a FUSE session"),
        "the keeper did not take the session on the daemon's SIGTERM; keeper log:\n{}\ndaemon log:\n{log}",
        node.log("keeper")
    );
    // The keeper is its container's pid 1: it must handle SIGTERM itself to end before its
    // grace period (5 s) runs out; ending, it ends the session it holds.
    let (by_term, log) = node.stop("keeper", grace(kds))?;
    assert!(
        by_term,
        "the keeper (pid 1) did not exit on SIGTERM; log:\n{log}"
    );
    node.ctd().ctr_ok(&["images", "rm", &reference])?;

    // Nothing left: tasks, processes, mounts.
    let tasks = node.ctd().ctr_ok(&["tasks", "ls", "-q"])?;
    ensure!(tasks.trim().is_empty(), "tasks left: {tasks}");
    for pid in [snap_pid, keeper_pid] {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        ensure!(
            !String::from_utf8_lossy(&cmdline).contains("weenv-snapshotter"),
            "process {pid} of a stopped container is still running"
        );
    }
    node.ctd.take();
    let tmp_path = node.tmp.path().to_path_buf();
    unmount_below(&tmp_path);
    let left = mounts_below(&tmp_path);
    ensure!(left.is_empty(), "mounts left: {left:?}");
    Ok(())
}
