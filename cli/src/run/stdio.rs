//! The task's stdio through FIFOs, like containerd's `cio.WithStdio` for `ctr`: FIFOs in a
//! private temp dir, named in `Tasks.Create`; the shim opens them while creating the task.
//! This side opens its ends first (a FIFO's writer needs a reader) and holds a keep-alive end
//! of each until `Create` returns, so no side sees EOF before the other is open; after that,
//! EOF on stdout/stderr means every process of the task closed them.

use super::container::TaskStdio;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::net::unix::pipe;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Where the task's stdio goes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StdioMode {
    /// Stdout/stderr printed on this process's stdout/stderr, this process's stdin forwarded
    /// (what `ctr run` does without `-t`; one such task per process).
    Inherit,
    /// Stdout/stderr printed on this process's stdout/stderr, no stdin.
    #[default]
    Output,
    /// No stdio (`/dev/null` in the container).
    Null,
}

/// Stdio of one task.
pub struct TaskIo {
    _dir: Option<tempfile::TempDir>,
    /// The paths `Tasks.Create` names (empty: none).
    pub paths: TaskStdio,
    /// Keep-alive ends, dropped by [`TaskIo::created`].
    keep: Vec<Box<dyn Send>>,
    copies: Vec<JoinHandle<std::io::Result<u64>>>,
    /// Fires when the stdin copy ended (EOF or error) and closed its end of the FIFO.
    stdin_done: Option<oneshot::Receiver<()>>,
    /// FIFOs removed on drop ([`TaskIo::piped`]: not in a temp dir of their own).
    files: Vec<PathBuf>,
}

/// This side's ends of a [`TaskIo::piped`] process's stdio.
pub struct PipedEnds {
    pub stdin: Option<pipe::Sender>,
    pub stdout: pipe::Receiver,
    pub stderr: pipe::Receiver,
}

fn fifo(dir: &Path, name: &str) -> std::io::Result<PathBuf> {
    let p = dir.join(name);
    nix::unistd::mkfifo(
        &p,
        nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR,
    )
    .map_err(std::io::Error::from)?;
    Ok(p)
}

impl TaskIo {
    /// Set up stdio for task `id` (must run inside a tokio runtime).
    pub fn new(mode: StdioMode, id: &str) -> std::io::Result<TaskIo> {
        if mode == StdioMode::Null {
            return Ok(TaskIo {
                _dir: None,
                paths: TaskStdio::default(),
                keep: Vec::new(),
                copies: Vec::new(),
                stdin_done: None,
                files: Vec::new(),
            });
        }
        let dir = tempfile::Builder::new().prefix("weenv-run-io-").tempdir()?;
        let out = fifo(dir.path(), &format!("{id}-stdout"))?;
        let err = fifo(dir.path(), &format!("{id}-stderr"))?;
        let mut keep: Vec<Box<dyn Send>> = Vec::new();
        let mut copies = Vec::new();
        for (path, is_out) in [(&out, true), (&err, false)] {
            let mut rx = pipe::OpenOptions::new().open_receiver(path)?;
            keep.push(Box::new(pipe::OpenOptions::new().open_sender(path)?));
            copies.push(tokio::spawn(async move {
                let n = if is_out {
                    let mut w = tokio::io::stdout();
                    let n = tokio::io::copy(&mut rx, &mut w).await?;
                    tokio::io::AsyncWriteExt::flush(&mut w).await?;
                    n
                } else {
                    let mut w = tokio::io::stderr();
                    let n = tokio::io::copy(&mut rx, &mut w).await?;
                    tokio::io::AsyncWriteExt::flush(&mut w).await?;
                    n
                };
                Ok(n)
            }));
        }
        if mode == StdioMode::Output {
            return Ok(TaskIo {
                _dir: Some(dir),
                paths: TaskStdio {
                    stdin: String::new(),
                    stdout: out.display().to_string(),
                    stderr: err.display().to_string(),
                },
                keep,
                copies,
                stdin_done: None,
                files: Vec::new(),
            });
        }
        // stdin: a keep-alive reader lets the writer open now; a thread copies this process's
        // stdin (blocking, possibly forever on a terminal: not joined), closes at EOF and says
        // so ([`TaskIo::take_stdin_done`]: the caller then has the shim close its end too).
        let inp = fifo(dir.path(), &format!("{id}-stdin"))?;
        keep.push(Box::new(pipe::OpenOptions::new().open_receiver(&inp)?));
        let w = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
            .open(&inp)?;
        let fl = nix::fcntl::OFlag::from_bits_retain(
            nix::fcntl::fcntl(&w, nix::fcntl::FcntlArg::F_GETFL).map_err(std::io::Error::from)?,
        );
        nix::fcntl::fcntl(
            &w,
            nix::fcntl::FcntlArg::F_SETFL(fl.difference(nix::fcntl::OFlag::O_NONBLOCK)),
        )
        .map_err(std::io::Error::from)?;
        let (done_tx, done_rx) = oneshot::channel();
        std::thread::spawn(move || {
            let mut w = w;
            if let Err(e) = std::io::copy(&mut std::io::stdin().lock(), &mut w) {
                tracing::debug!(error = %e, "copying stdin to the task");
            }
            drop(w);
            let _ = done_tx.send(());
        });
        Ok(TaskIo {
            _dir: Some(dir),
            paths: TaskStdio {
                stdin: inp.display().to_string(),
                stdout: out.display().to_string(),
                stderr: err.display().to_string(),
            },
            keep,
            copies,
            stdin_done: Some(done_rx),
            files: Vec::new(),
        })
    }

    /// FIFO stdio whose other ends this side reads and writes itself (a service capturing a
    /// process's output): `dir` holds the FIFOs (`<name>-stdout`, ...), kept until the
    /// returned [`TaskIo`] drops. `stdin`: also a stdin FIFO, whose writer is returned (the
    /// process sees EOF once it is dropped and `CloseIO` was sent).
    pub fn piped(dir: &Path, name: &str, stdin: bool) -> std::io::Result<(TaskIo, PipedEnds)> {
        let out = fifo(dir, &format!("{name}-stdout"))?;
        let err = fifo(dir, &format!("{name}-stderr"))?;
        let mut keep: Vec<Box<dyn Send>> = Vec::new();
        let stdout = pipe::OpenOptions::new().open_receiver(&out)?;
        keep.push(Box::new(pipe::OpenOptions::new().open_sender(&out)?));
        let stderr = pipe::OpenOptions::new().open_receiver(&err)?;
        keep.push(Box::new(pipe::OpenOptions::new().open_sender(&err)?));
        let mut paths = TaskStdio {
            stdin: String::new(),
            stdout: out.display().to_string(),
            stderr: err.display().to_string(),
        };
        let mut files = vec![out, err];
        let writer = if stdin {
            let inp = fifo(dir, &format!("{name}-stdin"))?;
            keep.push(Box::new(pipe::OpenOptions::new().open_receiver(&inp)?));
            let w = pipe::OpenOptions::new().open_sender(&inp)?;
            paths.stdin = inp.display().to_string();
            files.push(inp);
            Some(w)
        } else {
            None
        };
        Ok((
            TaskIo {
                _dir: None,
                paths,
                keep,
                copies: Vec::new(),
                stdin_done: None,
                files,
            },
            PipedEnds {
                stdin: writer,
                stdout,
                stderr,
            },
        ))
    }

    /// Resolves when this side's stdin copy ended (`None` without stdin).
    pub fn take_stdin_done(&mut self) -> Option<oneshot::Receiver<()>> {
        self.stdin_done.take()
    }

    /// `Tasks.Create` returned (or failed): the shim holds its ends now; drop ours.
    pub fn created(&mut self) {
        self.keep.clear();
    }

    /// Wait (at most `limit`) until the task's output is copied out.
    pub async fn finish(mut self, limit: Duration) {
        self.keep.clear();
        let all = futures::future::join_all(std::mem::take(&mut self.copies));
        match tokio::time::timeout(limit, all).await {
            Ok(res) => {
                for r in res {
                    match r {
                        Ok(Ok(_)) => {}
                        Ok(Err(e)) => tracing::warn!(error = %e, "copying the task's output"),
                        Err(e) => tracing::warn!(error = %e, "task output copy"),
                    }
                }
            }
            Err(_) => tracing::warn!(
                ?limit,
                "the task's output did not close; not waiting longer"
            ),
        }
    }
}

impl Drop for TaskIo {
    fn drop(&mut self) {
        for c in &self.copies {
            c.abort();
        }
        for f in &self.files {
            let _ = std::fs::remove_file(f);
        }
    }
}
