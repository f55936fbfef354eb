//! Processes of a task: the init process and execs, their status and exit.
//!
//! An exit is delivered once through a `watch` channel so any number of `Wait` calls see
//! it. Exits that arrive before the pid is known (a short exec) are parked in
//! [`EarlyExits`] and claimed when the pid is registered.

use std::collections::VecDeque;

use containerd_shim::api::Status as TaskStatus;
use containerd_shim::protos::protobuf::well_known_types::timestamp::Timestamp;
use tokio::sync::watch;

use std::sync::Arc;

use crate::runc::{FifoIo, Output};
use crate::stdio::{self, BinaryLogger, StdioError, Target};

/// Exit of a process: status and time.
#[derive(Debug, Clone, PartialEq)]
pub struct Exit {
    pub status: u32,
    pub at: Timestamp,
}

/// One process of a task.
#[derive(Debug)]
pub struct Process {
    pub exec_id: String,
    pub pid: i32,
    pub status: TaskStatus,
    pub stdio: FifoIo,
    pub stdin: String,
    pub stdout: String,
    pub stderr: String,
    pub terminal: bool,
    /// Exec only: the OCI process JSON.
    pub spec: Option<Vec<u8>>,
    pub exit: Option<Exit>,
    /// TTY: the pty master (for resize).
    pub console: Option<std::fs::File>,
    /// TTY: the shim's writer on the stdin FIFO; dropped by `CloseIO`.
    pub stdin_closer: Option<std::fs::File>,
    /// The logging binary of a `binary://` stdout (SIGTERM when the process is dropped).
    pub logger: Option<BinaryLogger>,
    tx: watch::Sender<Option<Exit>>,
}

impl Process {
    pub fn new(exec_id: &str, stdin: &str, stdout: &str, stderr: &str, terminal: bool) -> Process {
        let (tx, _) = watch::channel(None);
        Process {
            exec_id: exec_id.to_string(),
            pid: 0,
            status: TaskStatus::CREATED,
            stdio: FifoIo::new(stdin, stdout, stderr),
            stdin: stdin.to_string(),
            stdout: stdout.to_string(),
            stderr: stderr.to_string(),
            terminal,
            spec: None,
            exit: None,
            console: None,
            stdin_closer: None,
            logger: None,
            tx,
        }
    }

    /// Opens a `file://` or `binary://` stdout (containerd passes the same URI for stderr):
    /// both streams go to the file, or to the logging binary started here.
    pub fn open_logs(&mut self, id: &str, namespace: &str) -> Result<(), StdioError> {
        let (out, err) = match stdio::parse(&self.stdout)? {
            Target::File(p) => {
                let f = Arc::new(stdio::open_log_file(&p)?);
                (f.clone(), f)
            }
            Target::Binary { path, args } => {
                let l = BinaryLogger::start(&path, &args, id, namespace)?;
                let out = l.stdout.try_clone().map_err(|source| StdioError::Binary {
                    path: path.display().to_string(),
                    source,
                })?;
                let err = l.stderr.try_clone().map_err(|source| StdioError::Binary {
                    path: path.display().to_string(),
                    source,
                })?;
                self.logger = Some(l);
                (Arc::new(out), Arc::new(err))
            }
            Target::None | Target::Fifo(_) => return Ok(()),
        };
        self.stdio.stdout = Output::Open(out);
        self.stdio.stderr = Output::Open(err);
        Ok(())
    }

    /// Marks the process stopped and wakes waiters.
    pub fn set_exited(&mut self, status: u32, at: Timestamp) {
        let e = Exit { status, at };
        self.status = TaskStatus::STOPPED;
        self.exit = Some(e.clone());
        self.tx.send_replace(Some(e));
    }

    pub fn subscribe(&self) -> watch::Receiver<Option<Exit>> {
        self.tx.subscribe()
    }
}

/// Waits until the process behind `rx` has exited.
pub async fn wait_exit(mut rx: watch::Receiver<Option<Exit>>) -> Option<Exit> {
    loop {
        if let Some(e) = rx.borrow().clone() {
            return Some(e);
        }
        if rx.changed().await.is_err() {
            return rx.borrow().clone();
        }
    }
}

/// Exits of pids not (yet) known to the service; bounded.
#[derive(Debug, Default)]
pub struct EarlyExits {
    items: VecDeque<(i32, i32)>,
}

impl EarlyExits {
    const CAP: usize = 256;
    pub fn push(&mut self, pid: i32, code: i32) {
        if self.items.len() == Self::CAP {
            self.items.pop_front();
        }
        self.items.push_back((pid, code));
    }
    pub fn take(&mut self, pid: i32) -> Option<i32> {
        let i = self.items.iter().position(|(p, _)| *p == pid)?;
        self.items.remove(i).map(|(_, c)| c)
    }
}
