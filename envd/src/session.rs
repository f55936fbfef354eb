//! Persistent shell sessions: one long-lived shell per session, started once with `Tasks.Exec`,
//! fed commands on its stdin and read on its stdout (stderr merged into it), so a command's
//! working directory and variables survive to the next and a command costs no new `runc exec`.
//!
//! Protocol: each command is sent as one single-quoted assignment and run with `command eval`
//! (a syntax error is reported, it does not end the shell; stdin is `/dev/null`, so a command
//! cannot read the protocol's next lines), then a `printf` writes a per-session random marker
//! and `$?`. Everything before the marker is the command's output, byte for byte.

use crate::error::EnvdError;
use crate::exec::{self, Started};
use crate::proto::RunInSessionResponse;
use crate::state::random_hex;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use weenv_cli::run::container::Lifecycle;
use weenv_cli::run::stdio::TaskIo;

/// One shell.
pub struct Session {
    pub id: String,
    container: String,
    exec_id: String,
    marker: String,
    inner: tokio::sync::Mutex<Inner>,
    closed: AtomicBool,
    lc: Lifecycle,
}

struct Inner {
    stdin: pipe::Sender,
    stdout: pipe::Receiver,
    /// Bytes read and not yet given to a command's output.
    pending: Vec<u8>,
    _io: TaskIo,
}

/// Quote `s` for a POSIX shell (single quotes).
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The text sent for one command.
pub fn command_text(cmd: &str, marker: &str) -> String {
    format!(
        "__weenv_c={}\ncommand eval \"$__weenv_c\" </dev/null\nprintf '%s%d\\n' {} \"$?\"\n",
        shell_quote(cmd),
        shell_quote(marker)
    )
}

/// Where `marker<digits>\n` ends in `buf`: (output length, exit code, bytes used).
pub fn find_marker(buf: &[u8], marker: &[u8]) -> Option<(usize, i32, usize)> {
    let at = buf.windows(marker.len()).position(|w| w == marker)?;
    let rest = &buf[at + marker.len()..];
    let nl = rest.iter().position(|b| *b == b'\n')?;
    let code = std::str::from_utf8(&rest[..nl]).ok()?.parse().ok()?;
    Some((at, code, at + marker.len() + nl + 1))
}

impl Session {
    /// The exec process of a session's shell: `shell` with stderr joined to stdout, reading
    /// commands from stdin (`template`, `cwd`, `env` as for an exec).
    pub fn process(
        template: &serde_json::Value,
        shell: &str,
        cwd: Option<&str>,
        env: &std::collections::BTreeMap<String, String>,
    ) -> serde_json::Value {
        let argv = vec![
            shell.to_string(),
            "-c".to_string(),
            format!("exec 2>&1; exec {}", shell_quote(shell)),
        ];
        exec::process_json(template, &argv, cwd, env)
    }

    /// Start the shell process `p` ([`Session::process`]) in container `container`.
    pub async fn open(
        lc: &Lifecycle,
        io_dir: &Path,
        container: &str,
        exec_id: &str,
        p: &serde_json::Value,
    ) -> Result<Session, EnvdError> {
        let Started { io, ends, .. } = exec::start(lc, io_dir, container, exec_id, p, true).await?;
        let stdin = ends
            .stdin
            .ok_or_else(|| EnvdError::Internal("session without stdin".into()))?;
        // Nothing should reach stderr after `exec 2>&1`; drain it anyway.
        let mut stderr = ends.stderr;
        tokio::spawn(async move {
            let mut b = vec![0u8; 4096];
            while let Ok(n) = stderr.read(&mut b).await {
                if n == 0 {
                    break;
                }
            }
        });
        Ok(Session {
            id: format!("s-{}", random_hex(6)),
            container: container.to_string(),
            exec_id: exec_id.to_string(),
            marker: format!("__WEENV_DONE_{}_", random_hex(8)),
            inner: tokio::sync::Mutex::new(Inner {
                stdin,
                stdout: ends.stdout,
                pending: Vec::new(),
                _io: io,
            }),
            closed: AtomicBool::new(false),
            lc: lc.clone(),
        })
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }

    /// Run `cmd` in the shell (one at a time per session).
    pub async fn run(
        &self,
        cmd: &str,
        timeout: Option<Duration>,
        limit: u64,
    ) -> Result<RunInSessionResponse, EnvdError> {
        let t0 = Instant::now();
        let mut g = self.inner.lock().await;
        if self.is_closed() {
            return Ok(RunInSessionResponse {
                session_closed: true,
                exit_code: -1,
                ..Default::default()
            });
        }
        let inner = &mut *g;
        if let Err(e) = inner
            .stdin
            .write_all(command_text(cmd, &self.marker).as_bytes())
            .await
        {
            self.close_now().await;
            return Err(EnvdError::NotRunning {
                id: self.id.clone(),
                state: "closed".into(),
                cause: format!("the session's shell is gone ({e})"),
            });
        }
        let marker = self.marker.as_bytes();
        let mut out = Vec::new();
        let mut dropped = 0u64;
        let mut keep = |bytes: &[u8], out: &mut Vec<u8>| {
            let room = (limit as usize).saturating_sub(out.len());
            let take = bytes.len().min(room);
            out.extend_from_slice(&bytes[..take]);
            dropped += (bytes.len() - take) as u64;
        };
        let mut buf = vec![0u8; 64 << 10];
        let read = async {
            loop {
                if let Some((len, code, used)) = find_marker(&inner.pending, marker) {
                    let rest = inner.pending.split_off(used);
                    keep(&inner.pending[..len], &mut out);
                    inner.pending = rest;
                    return Some(code);
                }
                // Keep a marker's length (+ digits) unflushed: it may be split across reads.
                let hold = marker.len() + 16;
                if inner.pending.len() > hold {
                    let cut = inner.pending.len() - hold;
                    let tail = inner.pending.split_off(cut);
                    keep(&inner.pending, &mut out);
                    inner.pending = tail;
                }
                match inner.stdout.read(&mut buf).await {
                    Ok(0) | Err(_) => {
                        let p = std::mem::take(&mut inner.pending);
                        keep(&p, &mut out);
                        return None;
                    }
                    Ok(n) => inner.pending.extend_from_slice(&buf[..n]),
                }
            }
        };
        let res = match timeout {
            Some(t) => tokio::time::timeout(t, read).await,
            None => Ok(read.await),
        };
        drop(g);
        let mut r = RunInSessionResponse {
            duration_ms: t0.elapsed().as_secs_f64() * 1e3,
            ..Default::default()
        };
        match res {
            Ok(Some(code)) => r.exit_code = code,
            Ok(None) => {
                r.exit_code = -1;
                r.session_closed = true;
                self.close_now().await;
            }
            Err(_) => {
                r.exit_code = -1;
                r.timed_out = true;
                r.session_closed = true;
                self.close_now().await;
            }
        }
        r.output = out;
        r.output_dropped = dropped;
        Ok(r)
    }

    /// Kill the shell and forget its process.
    pub async fn close_now(&self) {
        if self.closed.swap(true, Ordering::Relaxed) {
            return;
        }
        let (lc, c, x) = (
            self.lc.clone(),
            self.container.clone(),
            self.exec_id.clone(),
        );
        if let Err(e) = lc.kill_process(&c, &x, 9, false).await {
            tracing::debug!(error = %e, "killing a session's shell");
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), lc.wait_process(&c, &x)).await;
        if let Err(e) = lc.delete_process(&c, &x).await {
            tracing::debug!(error = %e, "deleting a session's shell");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_single_quotes_and_newlines() {
        assert_eq!(shell_quote("a'b"), r"'a'\''b'");
        let t = command_text("echo 'x'\necho y", "__M_");
        assert!(
            t.starts_with("__weenv_c='echo '\\''x'\\''\necho y'\n"),
            "{t}"
        );
        assert!(t.ends_with("printf '%s%d\\n' '__M_' \"$?\"\n"), "{t}");
    }

    #[test]
    fn the_marker_ends_the_output_exactly() {
        let m = b"__M_";
        assert_eq!(find_marker(b"hello\n__M_0\nrest", m), Some((6, 0, 12)));
        assert_eq!(find_marker(b"no newline__M_127\n", m), Some((10, 127, 18)));
        assert_eq!(find_marker(b"partial __M_1", m), None);
        assert_eq!(find_marker(b"__M", m), None);
    }

    #[test]
    fn the_text_runs_in_a_real_shell_and_keeps_state() {
        // The protocol against the host's /bin/sh: state survives, a syntax error does not
        // end the shell, output is exact.
        let m = "__WEENV_DONE_test_";
        let mut script = String::new();
        for c in [
            "cd /tmp; X=5",
            "printf 'a b'",
            "if then",
            "echo $X $(pwd)",
            "false",
        ] {
            script.push_str(&command_text(c, m));
        }
        let out = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(format!("exec 2>&1; {script}"))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let parts: Vec<&str> = text.split(m).collect();
        assert_eq!(parts.len(), 6, "{text}");
        assert_eq!(parts[1], "0\na b");
        assert!(parts[2].starts_with("0\n"), "{text}");
        assert!(parts[2].to_lowercase().contains("syntax error"), "{text}");
        assert!(parts[3].starts_with("2\n5 /tmp\n"), "{text}");
        assert_eq!(parts[5], "1\n");
    }
}
