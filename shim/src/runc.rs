//! The runc client as the shim uses it: a [`runc::Spawner`] that cooperates with the
//! shim's reaper, container stdio wired straight to containerd's FIFOs ([`FifoIo`]), and
//! the error text of a failed runc call taken from `log.json`.
//!
//! Reaper fact: the shim is a subreaper and its SIGCHLD handler `waitpid(-1)`s every child
//! and forwards exits to the monitor; a spawner that `wait()`s its child itself would lose
//! the race. [`ReaperSpawner`] subscribes to the monitor *before* spawning and waits for
//! its child's pid there. The monitor reports an exit code (128+signal for signals).

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;

use async_trait::async_trait;
use containerd_shim::monitor::{monitor_subscribe, monitor_unsubscribe, Subject, Topic};
use runc::options::GlobalOpts;
use runc::{Command, Runc, Spawner};
use tokio::io::AsyncReadExt;

/// Spawns runc commands and collects their exits through the shim's reaper.
#[derive(Debug, Default)]
pub struct ReaperSpawner;

fn other(e: impl std::fmt::Display) -> runc::error::Error {
    runc::error::Error::Other(Box::new(std::io::Error::other(e.to_string())))
}

#[async_trait]
impl Spawner for ReaperSpawner {
    async fn execute(&self, mut cmd: Command) -> runc::Result<(ExitStatus, u32, String, String)> {
        let mut sub = monitor_subscribe(Topic::Pid).await.map_err(other)?;
        let child = cmd.spawn();
        let mut child = match child {
            Ok(c) => c,
            Err(e) => {
                let _ = monitor_unsubscribe(sub.id).await;
                return Err(runc::error::Error::ProcessSpawnFailed(e));
            }
        };
        let pid = child.id().unwrap_or(0);
        let mut out = child.stdout.take();
        let mut err = child.stderr.take();
        drop(cmd);
        let (mut o, mut e) = (Vec::new(), Vec::new());
        let ro = async {
            if let Some(s) = out.as_mut() {
                let _ = s.read_to_end(&mut o).await;
            }
        };
        let re = async {
            if let Some(s) = err.as_mut() {
                let _ = s.read_to_end(&mut e).await;
            }
        };
        tokio::join!(ro, re);
        let mut code = None;
        while let Some(ev) = sub.rx.recv().await {
            if let Subject::Pid(p) = ev.subject {
                if p as u32 == pid {
                    code = Some(ev.exit_code);
                    break;
                }
            }
        }
        let _ = monitor_unsubscribe(sub.id).await;
        drop(child);
        let code = code.ok_or_else(|| other(format!("lost the exit of runc pid {pid}")))?;
        Ok((
            ExitStatus::from_raw(code << 8),
            pid,
            String::from_utf8_lossy(&o).into_owned(),
            String::from_utf8_lossy(&e).into_owned(),
        ))
    }
}

/// Container stdio: stdin is containerd's FIFO; stdout and stderr are its FIFOs or files the
/// shim opened (`file://`, a logging binary's pipes: [`crate::stdio`]); /dev/null when not
/// given (a pipe would be inherited by the container and keep runc's output open forever).
#[derive(Debug, Clone, Default)]
pub struct FifoIo {
    pub stdin: Option<PathBuf>,
    pub stdout: Output,
    pub stderr: Output,
}

/// Where stdout or stderr goes.
#[derive(Debug, Clone, Default)]
pub enum Output {
    #[default]
    Null,
    Fifo(PathBuf),
    /// Opened by the shim (a log file, a logging binary's pipe).
    Open(Arc<std::fs::File>),
}

impl Output {
    fn stdio(&self) -> std::io::Result<Stdio> {
        Ok(match self {
            Output::Null => Stdio::null(),
            Output::Fifo(p) => Stdio::from(std::fs::OpenOptions::new().write(true).open(p)?),
            Output::Open(f) => Stdio::from(f.try_clone()?),
        })
    }
}

impl FifoIo {
    /// From containerd's strings; only FIFO paths are taken here (a URI target stays
    /// [`Output::Null`] until [`crate::process::Process::open_logs`] opens it).
    pub fn new(stdin: &str, stdout: &str, stderr: &str) -> FifoIo {
        let out = |s: &str| match crate::stdio::parse(s) {
            Ok(crate::stdio::Target::Fifo(p)) => Output::Fifo(p),
            _ => Output::Null,
        };
        FifoIo {
            stdin: (!stdin.is_empty()).then(|| PathBuf::from(stdin)),
            stdout: out(stdout),
            stderr: out(stderr),
        }
    }
}

#[async_trait]
impl runc::io::Io for FifoIo {
    async fn set(&self, cmd: &mut Command) -> std::io::Result<()> {
        match &self.stdin {
            // Open non-blocking (no writer needed yet), then make reads blocking; the
            // container sees EOF when containerd's writer closes.
            Some(p) => {
                cmd.stdin(crate::io::open_fifo_read(p)?);
            }
            None => {
                cmd.stdin(Stdio::null());
            }
        }
        cmd.stdout(self.stdout.stdio()?);
        cmd.stderr(self.stderr.stdio()?);
        Ok(())
    }

    async fn close_after_start(&self) {}
}

/// A runc client for one bundle: `runc --root <root> --log <bundle>/log.json --log-format json`.
pub fn client(binary: &str, root: &Path, bundle: &Path) -> Result<Runc, runc::error::Error> {
    let mut g = GlobalOpts::new()
        .command(binary)
        .root(root)
        .log(bundle.join("log.json"))
        .log_json();
    g.custom_spawner(Arc::new(ReaperSpawner));
    g.build()
}

/// The last error message runc wrote to `<bundle>/log.json`, if any.
pub fn last_log_error(bundle: &Path) -> Option<String> {
    let text = std::fs::read_to_string(bundle.join("log.json")).ok()?;
    text.lines().rev().find_map(|l| {
        let v: serde_json::Value = serde_json::from_str(l).ok()?;
        (v.get("level")?.as_str()? == "error").then(|| v.get("msg")?.as_str().map(String::from))?
    })
}

/// The reason of a runc failure: the error from log.json, then runc's own error.
pub fn detail(bundle: &Path, e: &runc::error::Error) -> String {
    match last_log_error(bundle) {
        Some(m) => format!("{m} ({e})"),
        None => e.to_string(),
    }
}

/// Formats a runc failure `op` with the error from log.json.
pub fn describe(op: &str, bundle: &Path, e: &runc::error::Error) -> String {
    format!("runc {op}: {}", detail(bundle, e))
}
