//! The daemon's connection to the keeper. It stays open while the daemon runs: the keeper
//! counts a connected daemon as "someone serves the session" (see [`super::keeper::decide`]).

use super::wire::{self, Reply, Request};
use super::SessionMeta;
use parking_lot::Mutex;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;
use thiserror::Error;

/// Errors talking to the keeper.
#[derive(Debug, Error)]
pub enum HandoverError {
    #[error("keeper at {path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("keeper at {path} answered {reply}")]
    Unexpected { path: PathBuf, reply: String },
    #[error("starting a keeper ({exe}): {error}")]
    Spawn { exe: PathBuf, error: std::io::Error },
    #[error("the keeper started at {0} does not answer")]
    NoAnswer(PathBuf),
}

/// A connection to the keeper.
pub struct KeeperClient {
    path: PathBuf,
    conn: Mutex<UnixStream>,
}

impl KeeperClient {
    /// Connects to the keeper at `path`.
    pub fn connect(path: &Path) -> Result<Self, HandoverError> {
        let s = UnixStream::connect(path).map_err(|error| HandoverError::Io {
            path: path.to_path_buf(),
            error,
        })?;
        Ok(KeeperClient {
            path: path.to_path_buf(),
            conn: Mutex::new(s),
        })
    }

    /// Connects to the keeper at `path`; if none answers and `spawn`, starts one (this
    /// binary, `keeper` mode, in a session of its own so it outlives the daemon; its log
    /// is `<path>.log`) and connects to it.
    pub fn connect_or_spawn(
        path: &Path,
        spawn: bool,
        timeout_secs: u64,
    ) -> Result<Self, HandoverError> {
        match Self::connect(path) {
            Ok(c) => return Ok(c),
            Err(e) if !spawn => return Err(e),
            Err(_) => {}
        }
        let exe = std::env::current_exe().map_err(|error| HandoverError::Spawn {
            exe: PathBuf::from("/proc/self/exe"),
            error,
        })?;
        let spawn_err = |error| HandoverError::Spawn {
            exe: exe.clone(),
            error,
        };
        let mut log_path = path.as_os_str().to_owned();
        log_path.push(".log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(spawn_err)?;
        let mut cmd = std::process::Command::new(&exe);
        cmd.arg("keeper")
            .arg("--socket")
            .arg(path)
            .arg("--timeout-secs")
            .arg(timeout_secs.to_string())
            .arg("--exit-when-idle")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(log);
        // SAFETY: setsid is async-signal-safe and touches no memory of the parent.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                nix::unistd::setsid()
                    .map(|_| ())
                    .map_err(std::io::Error::from)
            });
        }
        let mut child = cmd.spawn().map_err(spawn_err)?;
        let pid = child.id();
        // Reaped if it exits while the daemon runs (it normally outlives the daemon).
        let _ = std::thread::Builder::new()
            .name("keeper-reaper".into())
            .spawn(move || {
                let _ = child.wait();
            });
        for _ in 0..100 {
            if let Ok(c) = Self::connect(path) {
                tracing::info!(pid, socket = %path.display(), "started a FUSE session keeper");
                return Ok(c);
            }
            std::thread::sleep(Duration::from_millis(30));
        }
        Err(HandoverError::NoAnswer(path.to_path_buf()))
    }

    fn call(
        &self,
        req: &Request,
        fd: Option<BorrowedFd<'_>>,
    ) -> Result<(Reply, Option<OwnedFd>), HandoverError> {
        let io = |error| HandoverError::Io {
            path: self.path.clone(),
            error,
        };
        let s = self.conn.lock();
        wire::send(&s, req, fd).map_err(io)?;
        match wire::recv::<Reply>(&s).map_err(io)? {
            Some((Reply::Error { message }, _)) => Err(HandoverError::Unexpected {
                path: self.path.clone(),
                reply: message,
            }),
            Some(r) => Ok(r),
            None => Err(io(std::io::ErrorKind::UnexpectedEof.into())),
        }
    }

    fn unexpected(&self, r: Reply) -> HandoverError {
        HandoverError::Unexpected {
            path: self.path.clone(),
            reply: format!("{r:?}"),
        }
    }

    /// The kept session, if any (the keeper keeps its copy).
    pub fn take(&self) -> Result<Option<(OwnedFd, SessionMeta)>, HandoverError> {
        match self.call(&Request::Take, None)? {
            (Reply::Session { meta }, Some(fd)) => Ok(Some((fd, meta))),
            (Reply::Empty, _) => Ok(None),
            (r, _) => Err(self.unexpected(r)),
        }
    }

    /// Gives the keeper a copy of the session's fd.
    pub fn put(&self, fd: BorrowedFd<'_>, meta: SessionMeta) -> Result<(), HandoverError> {
        match self.call(&Request::Put { meta }, Some(fd))? {
            (Reply::Ok, _) => Ok(()),
            (r, _) => Err(self.unexpected(r)),
        }
    }

    /// Records the slot of a layer (before the layer becomes visible).
    pub fn slot(&self, digest: &str, slot: u32) -> Result<(), HandoverError> {
        let req = Request::Slot {
            digest: digest.to_string(),
            slot,
        };
        match self.call(&req, None)? {
            (Reply::Ok, _) => Ok(()),
            (r, _) => Err(self.unexpected(r)),
        }
    }

    /// Sends changes of live opens (no reply: the keeper never answers these).
    pub fn opens(&self, set: Vec<super::OpenRecord>) -> Result<(), HandoverError> {
        let s = self.conn.lock();
        wire::send(&s, &Request::Opens { set }, None).map_err(|error| HandoverError::Io {
            path: self.path.clone(),
            error,
        })
    }

    /// The session was unmounted: the keeper forgets it.
    pub fn release(&self) -> Result<(), HandoverError> {
        match self.call(&Request::Release, None)? {
            (Reply::Ok, _) => Ok(()),
            (r, _) => Err(self.unexpected(r)),
        }
    }

    /// Stops the keeper (it aborts the session it holds).
    pub fn stop(&self) -> Result<(), HandoverError> {
        match self.call(&Request::Stop, None)? {
            (Reply::Ok, _) => Ok(()),
            (r, _) => Err(self.unexpected(r)),
        }
    }

    /// (pid, holds a session) of the keeper.
    pub fn status(&self) -> Result<(u32, bool), HandoverError> {
        match self.call(&Request::Status, None)? {
            (Reply::Status { pid, held, .. }, _) => Ok((pid, held)),
            (r, _) => Err(self.unexpected(r)),
        }
    }
}
