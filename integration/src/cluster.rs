//! A K-node cluster on one machine, for the peer cache (issue 14).
//!
//! Topology: a switch namespace `<p>-sw` holding a bridge; the registry in `<p>-reg`
//! (`10.77.0.2`) behind a veth whose egress is shaped with `tc` HTB (netem is not available
//! here); node `i` in `<p>-n<i>` (`10.77.0.<10+i>`), each with its own `weenv-snapshotter`
//! (state, caches and FUSE mount under its own root) and its own containerd. Processes enter a
//! namespace with `nsenter --net=/run/netns/<name>` (not `ip netns exec`, which would give them
//! a private mount namespace and hide the snapshotter's FUSE mounts from containerd).
//!
//! The registry's storage is filled beforehand by a [`crate::registry::LocalRegistry`] on
//! loopback (push and conversion run in this process), then served by a second
//! `docker-registry` on the same storage inside `<p>-reg`.
//! [`Cluster::registry_sent_bytes`] reads what the registry sent on its link (HTB counter).
//!
//! Drop stops everything it started (containerd and its shims, the daemons with their mounts,
//! fake peers, the registry, any process left in the namespaces) and deletes the namespaces.

use crate::containerd::{unmount_below, Containerd, ContainerdOptions};
use crate::util::{wait_for_unix_socket, workspace_bin, ChildGuard};
use anyhow::{bail, ensure, Context, Result};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The registry's address inside the cluster.
pub const REGISTRY: &str = "10.77.0.2:5000";
/// Port every node serves peers on.
pub const PEER_PORT: u16 = 7470;

/// What a container runs: read every file of `/data` and check it against the image's own
/// checksums (0 wrong bytes), then print `ALLOK`.
pub const CHECK: &str = "cd /data && sha256sum -c SHA256SUMS >/dev/null && echo ALLOK";

/// The test image ([`crate::images::busybox_data`], 96 files of 256 KiB: 24 MiB) converted to
/// weenv in a loopback registry under `tmp`, which is then stopped: returns the registry
/// storage to give [`Cluster::start`] and the image's reference inside the cluster.
pub async fn prepare_image(tmp: &Path) -> Result<(PathBuf, String)> {
    let img = crate::images::busybox_data(96, 256)?;
    let reg = crate::registry::LocalRegistry::start(tmp)?;
    let gz = reg.push(&img, "data:gz")?;
    let client = weenv_registry::Client::new(weenv_converter::registry_config(&[reg.host()]))?;
    weenv_converter::convert_image(
        &client,
        &weenv_converter::ImageLocation::parse(&gz)?,
        &weenv_converter::ImageLocation::parse(&format!("{}/data:weenv", reg.host()))?,
        &weenv_converter::ConvertOptions::default(),
        Arc::new(weenv_converter::NoProgress),
    )
    .await?;
    Ok((reg.root().join("data"), format!("{REGISTRY}/data:weenv")))
}

/// Tools the cluster needs besides the e2e ones.
pub const CLUSTER_BINS: &[&str] = &["ip", "tc", "nsenter"];

/// Settings of a [`Cluster`].
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    /// Registry egress rate (`tc` syntax). Default `200mbit`.
    pub rate: String,
    /// Nodes serve and ask peers. Default true.
    pub peers: bool,
    /// `peers.hedge_ms`. Default 5000 (the machine is shared by every node).
    pub hedge_ms: u64,
    /// Background fill. Default false (bytes are then exactly what containers read).
    pub fill: bool,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        Self {
            rate: "200mbit".into(),
            peers: true,
            hedge_ms: 5000,
            fill: false,
        }
    }
}

/// Runs `cmd`; fails with its output unless it succeeds.
fn sh(cmd: &mut Command) -> Result<Output> {
    let o = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {cmd:?}"))?;
    ensure!(
        o.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    Ok(o)
}

fn ip(args: &[&str]) -> Result<Output> {
    sh(Command::new("ip").args(args))
}

/// `nsenter --net=/run/netns/<ns> <program>`.
pub fn in_netns(ns: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new("nsenter");
    c.arg(format!("--net=/run/netns/{ns}")).arg(program);
    c
}

/// Sums the samples of metric `name` (every label set) in Prometheus text. Pure.
pub fn metric_sum(text: &str, name: &str) -> u64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with(' ') || r.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

/// One node: its namespace, daemon and containerd.
pub struct Node {
    pub index: usize,
    pub netns: String,
    pub ip: String,
    pub root: PathBuf,
    pub config: PathBuf,
    daemon: Option<Child>,
    ctd: Option<Containerd>,
}

impl Node {
    /// The peer address (`ip:7470`).
    pub fn peer_addr(&self) -> String {
        format!("{}:{PEER_PORT}", self.ip)
    }

    /// Its containerd.
    pub fn containerd(&self) -> Result<&Containerd> {
        self.ctd.as_ref().context("containerd stopped")
    }

    /// The daemon's log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.root.join("daemon.log")).unwrap_or_default()
    }

    /// Runs the `weenv` CLI with this node's config in its namespace.
    pub fn weenv(&self, args: &[&str]) -> Result<String> {
        let o = in_netns(&self.netns, workspace_bin("weenv")?)
            .arg("--config")
            .arg(&self.config)
            .args(args)
            .stdin(Stdio::null())
            .output()?;
        ensure!(
            o.status.success(),
            "node {}: weenv {args:?} failed: {}{}",
            self.index,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    }

    /// `weenv pull` of `reference` into this node's containerd.
    pub fn pull(&self, reference: &str) -> Result<()> {
        let ctd = self.containerd()?;
        let sock = ctd.address().display().to_string();
        self.weenv(&[
            "pull",
            "-a",
            &sock,
            "-n",
            ctd.namespace(),
            "--plain-http",
            reference,
        ])
        .map(|_| ())
    }

    /// `ctr run --rm` of `image` with `/bin/sh -c script`; its stdout.
    pub fn run(&self, image: &str, id: &str, script: &str) -> Result<String> {
        let ctd = self.containerd()?;
        let o = ctd.run_weenv_sh(ctd.namespace(), image, id, script)?;
        ensure!(
            o.status.success(),
            "node {}: ctr run {id} failed: {}{}",
            self.index,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    }

    /// The daemon's `/metrics`.
    pub fn metrics(&self) -> Result<String> {
        self.weenv(&["metrics"])
    }

    /// Compressed frame bytes this node fetched from the registry (on demand, prefetch, fill).
    pub fn registry_frame_bytes(&self) -> Result<u64> {
        let m = self.metrics()?;
        Ok([
            "weenv_fetch_bytes_on_demand_total",
            "weenv_fetch_bytes_prefetch_total",
            "weenv_fetch_bytes_fill_total",
        ]
        .iter()
        .map(|n| metric_sum(&m, n))
        .sum())
    }

    /// Pull + run of [`CHECK`]: the time from the pull to the container's exit.
    pub fn cold_start(&self, image: &str, id: &str) -> Result<Duration> {
        let t0 = Instant::now();
        self.pull(image)?;
        let out = self
            .run(image, id, CHECK)
            .with_context(|| format!("daemon log:\n{}", self.log()))?;
        ensure!(out.contains("ALLOK"), "node {}: {out}", self.index);
        Ok(t0.elapsed())
    }

    /// SIGKILL the daemon (its FUSE mount dies with it).
    pub fn kill_daemon(&mut self) {
        if let Some(mut c) = self.daemon.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn stop(&mut self) {
        drop(self.ctd.take());
        if let Some(mut c) = self.daemon.take() {
            let pid = nix::unistd::Pid::from_raw(c.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(20);
            while matches!(c.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        unmount_below(&self.root);
    }
}

/// A fake peer in its own namespace that answers every frame request with the right number of
/// wrong bytes (a lying node). Stopped on drop.
pub struct CorruptPeer {
    pub addr: String,
    pub requests: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl CorruptPeer {
    fn start(netns: &str, ip: &str) -> Result<CorruptPeer> {
        let addr: SocketAddr = format!("{ip}:{PEER_PORT}").parse()?;
        let (stop, requests) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicU64::new(0)),
        );
        let (st, rq) = (stop.clone(), requests.clone());
        let ns = std::fs::File::open(format!("/run/netns/{netns}"))?;
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            // This thread only: its sockets live in the fake peer's namespace.
            let bound = nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(anyhow::Error::from)
                .and_then(|()| Ok(std::net::TcpListener::bind(addr)?))
                .and_then(|l| {
                    l.set_nonblocking(true)?;
                    Ok(l)
                });
            let l = match bound {
                Ok(l) => {
                    let _ = tx.send(Ok(()));
                    l
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            while !st.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok((s, _)) => {
                        rq.fetch_add(1, Ordering::Relaxed);
                        let _ = lie(s);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        rx.recv().context("fake peer thread")??;
        Ok(CorruptPeer {
            addr: addr.to_string(),
            requests,
            stop,
            thread: Some(thread),
        })
    }
}

/// Answers one `POST /peer/v1/frames` (one per connection) with `0x5a` bytes of the length
/// the request's frames add up to.
fn lie(mut s: std::net::TcpStream) -> Result<()> {
    s.set_nonblocking(false)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
        let n = s.read(&mut chunk)?;
        ensure!(n > 0, "closed");
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + len {
        let n = s.read(&mut chunk)?;
        ensure!(n > 0, "closed");
        buf.extend_from_slice(&chunk[..n]);
    }
    let req: serde_json::Value = serde_json::from_slice(&buf[head_end..head_end + len])?;
    let total: u64 = req["frames"]
        .as_array()
        .map(|fs| fs.iter().filter_map(|f| f["ulen"].as_u64()).sum())
        .unwrap_or(0);
    write!(
        s,
        "HTTP/1.1 200 OK\r\nContent-Length: {total}\r\nConnection: close\r\n\r\n"
    )?;
    s.write_all(&vec![0x5a; usize::try_from(total)?])?;
    Ok(())
}

impl Drop for CorruptPeer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The cluster (see the module docs).
pub struct Cluster {
    prefix: String,
    opts: ClusterOptions,
    netns: Vec<String>,
    pub nodes: Vec<Node>,
    registry: Option<ChildGuard>,
    tmp: tempfile::TempDir,
}

impl Cluster {
    /// Builds the network and starts the registry on `storage` (a `docker-registry`
    /// filesystem root, e.g. `LocalRegistry::root()/data`). No nodes yet: [`Cluster::add_node`].
    pub fn start(storage: &Path, opts: ClusterOptions) -> Result<Cluster> {
        static N: AtomicU64 = AtomicU64::new(0);
        let prefix = format!(
            "wc{}x{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let tmp = tempfile::Builder::new()
            .prefix("weenv-cluster-")
            .tempdir()?;
        let mut c = Cluster {
            prefix,
            opts,
            netns: Vec::new(),
            nodes: Vec::new(),
            registry: None,
            tmp,
        };
        let sw = c.add_netns("sw")?;
        ip(&["-n", &sw, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &sw, "link", "set", "br0", "up"])?;
        let reg = c.attach("reg", "10.77.0.2")?;
        let rate = c.opts.rate.clone();
        sh(in_netns(&reg, "tc").args([
            "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb", "default", "10",
        ]))?;
        sh(in_netns(&reg, "tc").args([
            "class", "add", "dev", "eth0", "parent", "1:", "classid", "1:10", "htb", "rate", &rate,
            "ceil", &rate,
        ]))?;
        let dir = c.tmp.path().join("registry");
        std::fs::create_dir_all(&dir)?;
        let cfg = dir.join("config.yml");
        std::fs::write(
            &cfg,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {REGISTRY}\n",
                storage.display()
            ),
        )?;
        let log = std::fs::File::create(dir.join("registry.log"))?;
        let child = in_netns(&reg, "docker-registry")
            .arg("serve")
            .arg(&cfg)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        c.registry = Some(ChildGuard::new("docker-registry", child));
        // Wait until it answers, from inside the cluster.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ok = in_netns(&reg, "bash")
                .args(["-c", "exec 3<>/dev/tcp/10.77.0.2/5000"])
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                break;
            }
            ensure!(
                Instant::now() < deadline,
                "registry did not start: {}",
                std::fs::read_to_string(dir.join("registry.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(c)
    }

    fn add_netns(&mut self, suffix: &str) -> Result<String> {
        let name = format!("{}-{suffix}", self.prefix);
        ip(&["netns", "add", &name])?;
        self.netns.push(name.clone());
        ip(&["-n", &name, "link", "set", "lo", "up"])?;
        Ok(name)
    }

    /// A new namespace `<p>-<suffix>` with `eth0` at `addr` on the bridge.
    fn attach(&mut self, suffix: &str, addr: &str) -> Result<String> {
        let ns = self.add_netns(suffix)?;
        let sw = format!("{}-sw", self.prefix);
        ip(&[
            "link", "add", "eth0", "netns", &ns, "type", "veth", "peer", "name", suffix, "netns",
            &sw,
        ])?;
        ip(&["-n", &sw, "link", "set", suffix, "master", "br0", "up"])?;
        ip(&[
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{addr}/24"),
            "dev",
            "eth0",
        ])?;
        ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
        Ok(ns)
    }

    /// Bytes the registry has sent on its shaped link (HTB class counter: frames on the wire,
    /// headers included).
    pub fn registry_sent_bytes(&self) -> Result<u64> {
        let o = sh(in_netns(&format!("{}-reg", self.prefix), "tc")
            .args(["-s", "class", "show", "dev", "eth0"]))?;
        let text = String::from_utf8_lossy(&o.stdout);
        text.split_whitespace()
            .skip_while(|w| *w != "Sent")
            .nth(1)
            .and_then(|n| n.parse().ok())
            .with_context(|| format!("no Sent counter in tc output: {text}"))
    }

    /// Starts node `index` (1-based; address `10.77.0.<10+index>`) whose static peer list is
    /// the nodes `members` (1-based indices; may include nodes not started yet, or fake peers'
    /// addresses as `extra`).
    pub fn add_node(&mut self, index: usize, members: &[usize], extra: &[String]) -> Result<()> {
        let addr = format!("10.77.0.{}", 10 + index);
        let ns = self.attach(&format!("n{index}"), &addr)?;
        let root = self.tmp.path().join(format!("n{index}"));
        std::fs::create_dir_all(&root)?;
        let socket = root.join("snap.sock");
        let mut cfg = crate::daemon::test_config(
            &root,
            &crate::daemon::DaemonOptions {
                plain_http: vec![REGISTRY.to_string()],
                fill: self.opts.fill,
                fill_extra: String::new(),
            },
            &format!("unix:{}", root.join("obs.sock").display()),
        )?;
        // Nodes read no containerd content store (the default socket path, not a test link).
        cfg.registry.containerd_socket = weenv_snapshotter_api::config::Config::default()
            .registry
            .containerd_socket;
        if self.opts.peers {
            cfg.peers.listen = format!("{addr}:{PEER_PORT}");
            cfg.peers.members = members
                .iter()
                .map(|m| format!("10.77.0.{}:{PEER_PORT}", 10 + m))
                .chain(extra.iter().cloned())
                .collect();
            cfg.peers.hedge_ms = self.opts.hedge_ms;
        }
        let config = root.join("config.toml");
        std::fs::write(&config, crate::daemon::config_text(&cfg)?)?;
        let log = std::fs::File::create(root.join("daemon.log"))?;
        let child = in_netns(&ns, workspace_bin("weenv-snapshotter")?)
            .arg("--config")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("spawn weenv-snapshotter")?;
        let mut node = Node {
            index,
            netns: ns.clone(),
            ip: addr,
            root,
            config,
            daemon: Some(child),
            ctd: None,
        };
        if let Err(e) = wait_for_unix_socket(&socket, Duration::from_secs(30)) {
            let log = node.log();
            node.stop();
            bail!("node {index}: snapshotter did not start: {e}; log:\n{log}");
        }
        node.ctd = Some(Containerd::start(ContainerdOptions {
            proxy_snapshotter: Some(socket),
            netns: Some(ns),
            ..Default::default()
        })?);
        self.nodes.push(node);
        Ok(())
    }

    /// Node `index` (1-based).
    pub fn node(&self, index: usize) -> Result<&Node> {
        self.nodes
            .iter()
            .find(|n| n.index == index)
            .with_context(|| format!("no node {index}"))
    }

    /// Node `index`, mutable.
    pub fn node_mut(&mut self, index: usize) -> Result<&mut Node> {
        self.nodes
            .iter_mut()
            .find(|n| n.index == index)
            .with_context(|| format!("no node {index}"))
    }

    /// A lying peer at `10.77.0.<10+index>` in its own namespace.
    pub fn corrupt_peer(&mut self, index: usize) -> Result<CorruptPeer> {
        let addr = format!("10.77.0.{}", 10 + index);
        let ns = self.attach(&format!("x{index}"), &addr)?;
        CorruptPeer::start(&ns, &addr)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // `WEENV_CLUSTER_LOGS=DIR` keeps every node's daemon log as DIR/<prefix>-n<i>.log.
        let keep = std::env::var_os("WEENV_CLUSTER_LOGS").map(PathBuf::from);
        for n in &mut self.nodes {
            n.stop();
            if let Some(d) = &keep {
                let _ = std::fs::create_dir_all(d);
                let _ = std::fs::copy(
                    n.root.join("daemon.log"),
                    d.join(format!("{}-n{}.log", self.prefix, n.index)),
                );
            }
        }
        drop(self.registry.take());
        for ns in self.netns.iter().rev() {
            if let Ok(o) = Command::new("ip").args(["netns", "pids", ns]).output() {
                for pid in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                    if let Ok(p) = pid.parse::<i32>() {
                        let _ = nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(p),
                            nix::sys::signal::Signal::SIGKILL,
                        );
                    }
                }
            }
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
        unmount_below(self.tmp.path());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_sum_adds_label_sets_of_one_name_only() {
        let t =
            "# HELP a x\na_total 3\na_total_b 9\nb_total{peer=\"x\"} 2\nb_total{peer=\"y\"} 5\n";
        assert_eq!(metric_sum(t, "a_total"), 3);
        assert_eq!(metric_sum(t, "b_total"), 7);
        assert_eq!(metric_sum(t, "c_total"), 0);
    }
}
