//! A `weenv-snapshotter` daemon for end-to-end tests, under a temp root: stopped with SIGTERM
//! and unmounted on drop, restartable on the same root (crash, kill, planned restart).
//!
//! Its config is the daemon's own typed [`Config`] (`weenv_snapshotter_api::config`):
//! [`test_config`] sets the test defaults (state under `<root>/state`, socket
//! `<root>/snap.sock`, a free loopback port for `/metrics` and `/status`, small caches, no
//! FUSE handover), a test changes fields in a closure ([`Daemon::start_with`]), and the result
//! is validated and serialized to `<root>/config.toml`. [`DaemonOptions::fill_extra`] (and so
//! `WEENV_TEST_FILL_EXTRA`) is TOML merged into the `[fill]` table, checked by the same
//! strict parser as the daemon's.
//!
//! [`Daemon::weenv`] runs the `weenv` CLI with the daemon's config; [`Daemon::metric`] reads
//! one value of `weenv metrics`.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use weenv_snapshotter_api::config::Config;

use crate::containerd::{unmount_below, Containerd};
use crate::util::{free_port, wait_for_unix_socket, workspace_bin};

/// Daemon settings used by the tests.
#[derive(Clone, Debug, Default)]
pub struct DaemonOptions {
    /// Registries reached over plain HTTP (the test registry and proxy).
    pub plain_http: Vec<String>,
    /// Background fill (off when a test counts bytes fetched for a workload).
    pub fill: bool,
    /// TOML keys merged into the `[fill]` table (tuning), e.g. `quiet_ms = 0`.
    pub fill_extra: String,
}

/// The config of a test daemon under `root` with `opts`, its observability endpoint on
/// `status_addr`. Fails if `fill_extra` is not valid for the `[fill]` table.
pub fn test_config(root: &Path, opts: &DaemonOptions, status_addr: &str) -> Result<Config> {
    let mut c = Config {
        root_dir: root.join("state"),
        socket: root.join("snap.sock"),
        log_level: "info,weenv_snapshotter=debug".into(),
        ..Config::default()
    };
    c.registry.plain_http = opts.plain_http.clone();
    c.registry.hosts_dir = root.join("certs.d");
    c.registry.containerd_socket = root.join("containerd.sock");
    c.cache.memory_bytes = 64 << 20;
    c.cache.disk_bytes = 4 << 30;
    c.fill.enabled = opts.fill;
    c.observability.listen = status_addr.to_string();
    // The code's default keeps the FUSE session in a keeper that outlives the daemon; test
    // daemons leave none behind unless a test asks for handover (snapshotter_restart.rs).
    c.fuse.handover = false;
    merge_table(&c, "fill", &opts.fill_extra)
}

/// `cfg` with the TOML keys `extra` merged into its table `section`, parsed and validated as
/// the daemon does.
pub fn merge_table(cfg: &Config, section: &str, extra: &str) -> Result<Config> {
    if extra.trim().is_empty() {
        return Ok(cfg.clone());
    }
    let mut t = toml::Table::try_from(cfg)?;
    let add: toml::Table =
        toml::from_str(extra).with_context(|| format!("[{section}] {extra:?}"))?;
    match t
        .entry(section)
        .or_insert_with(|| toml::Value::Table(toml::Table::new()))
    {
        toml::Value::Table(s) => s.extend(add),
        _ => bail!("config key {section} is not a table"),
    }
    Ok(Config::from_toml(
        &toml::to_string(&t)?,
        Path::new("test config"),
    )?)
}

/// `cfg` as the daemon reads it, checked by the daemon's parser first.
pub fn config_text(cfg: &Config) -> Result<String> {
    let text = toml::to_string(cfg)?;
    Config::from_toml(&text, Path::new("test config"))?;
    Ok(text)
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
        Self::start_with(root, opts, &[], |_| {})
    }

    /// Like [`Daemon::start`], plus containerd-style `hosts.toml` files: (registry host, file
    /// text) written to `<root>/certs.d/<host>/hosts.toml`, the daemon's `registry.hosts_dir`.
    pub fn start_with_hosts_toml(
        root: &Path,
        opts: &DaemonOptions,
        hosts_toml: &[(String, String)],
    ) -> Result<Daemon> {
        Self::start_with(root, opts, hosts_toml, |_| {})
    }

    /// Like [`Daemon::start_with_hosts_toml`], with `configure` changing the config
    /// ([`test_config`]) before it is written, e.g. `|c| c.fuse.handover = true`.
    pub fn start_with(
        root: &Path,
        opts: &DaemonOptions,
        hosts_toml: &[(String, String)],
        configure: impl FnOnce(&mut Config),
    ) -> Result<Daemon> {
        std::fs::create_dir_all(root)?;
        let status_addr = format!("127.0.0.1:{}", free_port()?);
        let mut cfg = test_config(root, opts, &status_addr)?;
        configure(&mut cfg);
        for (host, text) in hosts_toml {
            let dir = cfg.registry.hosts_dir.join(host);
            std::fs::create_dir_all(&dir)?;
            std::fs::write(dir.join("hosts.toml"), text)?;
        }
        let config = root.join("config.toml");
        std::fs::write(&config, config_text(&cfg)?)?;
        let mut d = Daemon {
            root: root.to_path_buf(),
            socket: cfg.socket.clone(),
            config,
            status_addr: cfg.observability.listen.clone(),
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
    pub fn use_containerd(&self, ctd: &Containerd) -> Result<()> {
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

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_test_config_is_what_the_daemon_parses() -> Result<()> {
        let root = Path::new("/r");
        let opts = DaemonOptions {
            plain_http: vec!["127.0.0.1:5000".into()],
            fill: true,
            fill_extra: "quiet_ms = 0\nrate_bytes_per_sec = 6000000".into(),
        };
        let c = test_config(root, &opts, "127.0.0.1:9")?;
        assert_eq!(c.socket, root.join("snap.sock"));
        assert_eq!(c.fill.quiet_ms, Some(0));
        assert_eq!(c.fill.rate_bytes_per_sec, 6_000_000);
        assert!(c.fill.enabled && !c.fuse.handover);
        let back = Config::from_toml(&config_text(&c)?, Path::new("t"))?;
        assert_eq!(back, c);
        // A key the daemon does not know is refused, naming it.
        let bad = DaemonOptions {
            fill_extra: "no_such_key = 1".into(),
            ..opts
        };
        let e = test_config(root, &bad, "127.0.0.1:9")
            .err()
            .context("an unknown key was accepted")?;
        let e = format!("{e:#}");
        assert!(e.contains("no_such_key"), "{e}");
        Ok(())
    }
}
