//! One process in a running environment through containerd's `Tasks.Exec` (what `ctr task
//! exec` does): the container spec's `Process` as the template (user, env, cwd, capabilities),
//! argv/cwd/env of the request, FIFO stdio read by this process, output bounded per stream,
//! a timeout that kills the process, and the exit status.

use crate::error::EnvdError;
use crate::proto::{exec_event, ExecEvent, ExecExit};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use weenv_cli::run::container::Lifecycle;
use weenv_cli::run::stdio::{PipedEnds, TaskIo};

/// containerd's type URL of an OCI runtime `Process` (an exec's spec).
pub const PROCESS_TYPE_URL: &str = "types.containerd.io/opencontainers/runtime-spec/1/Process";
/// Default bytes kept per output stream.
pub const DEFAULT_OUTPUT_LIMIT: u64 = 1 << 20;
/// Largest output limit a request may ask for.
pub const MAX_OUTPUT_LIMIT: u64 = 64 << 20;
/// How long the output of an exited process may take to reach EOF (a background child still
/// holding the pipes is not waited for longer).
const DRAIN: Duration = Duration::from_secs(2);

/// The exec's process: `template` (the container spec's `process`) with `argv`, `cwd` and the
/// `env` entries (`KEY=VALUE`; a key given replaces the template's).
pub fn process_json(
    template: &serde_json::Value,
    argv: &[String],
    cwd: Option<&str>,
    env: &BTreeMap<String, String>,
) -> serde_json::Value {
    let mut p = template.clone();
    if !p.is_object() {
        p = serde_json::json!({});
    }
    p["args"] = serde_json::json!(argv);
    p["terminal"] = serde_json::json!(false);
    if p.get("cwd")
        .and_then(|c| c.as_str())
        .is_none_or(str::is_empty)
    {
        p["cwd"] = serde_json::json!("/");
    }
    if let Some(c) = cwd.filter(|c| !c.is_empty()) {
        p["cwd"] = serde_json::json!(c);
    }
    if !env.is_empty() {
        let mut vars: Vec<String> = p["env"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str())
                    .filter(|kv| {
                        let k = kv.split('=').next().unwrap_or("");
                        !env.contains_key(k)
                    })
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        vars.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
        p["env"] = serde_json::json!(vars);
    }
    p
}

/// The launcher: an exec process started ahead of a request (its `runc exec` off the
/// request's path), waiting on its stdin for one line ([`launch_line`]) that sets cwd and
/// variables and `exec`s the request's argv in its place — so the request's process is this
/// exec process (the shim's exit status, kill and timeout as for any exec), its stdin the
/// rest of the pipe. `read` takes the line byte by byte: nothing after it is consumed.
pub const LAUNCHER: &[&str] = &["/bin/sh", "-c", "IFS= read -r l || exit 126; eval \"$l\""];

/// The line a [`LAUNCHER`] runs: `cd` to `cwd`, `export` the variables, `exec` argv, each
/// word single-quoted. `None` when a variable's name is not a shell name (the ordinary
/// exec path takes it). Pure.
pub fn launch_line(
    argv: &[String],
    cwd: Option<&str>,
    env: &BTreeMap<String, String>,
) -> Option<String> {
    use crate::session::shell_quote as q;
    let name_ok = |k: &str| {
        let mut b = k.bytes();
        b.next()
            .is_some_and(|c| c == b'_' || c.is_ascii_alphabetic())
            && b.all(|c| c == b'_' || c.is_ascii_alphanumeric())
    };
    if argv.is_empty() || !env.keys().all(|k| name_ok(k)) {
        return None;
    }
    let mut line = String::new();
    if let Some(c) = cwd.filter(|c| !c.is_empty()) {
        line.push_str(&format!("cd {} || exit 126; ", q(c)));
    }
    for (k, v) in env {
        line.push_str(&format!("export {}; ", q(&format!("{k}={v}"))));
    }
    line.push_str("exec");
    for a in argv {
        line.push(' ');
        line.push_str(&q(a));
    }
    (!line.contains('\n')).then_some(line)
}

/// A started exec process: its stdio ends (and the FIFOs, removed on drop).
pub struct Started {
    pub io: TaskIo,
    pub ends: PipedEnds,
    pub exec_id: String,
}

/// Create and start exec process `exec_id` of container `id` from `process`.
pub async fn start(
    lc: &Lifecycle,
    io_dir: &Path,
    id: &str,
    exec_id: &str,
    process: &serde_json::Value,
    stdin: bool,
) -> Result<Started, EnvdError> {
    let (mut io, ends) = TaskIo::piped(io_dir, &format!("{id}-{exec_id}"), stdin)
        .map_err(EnvdError::io("creating the exec's FIFOs"))?;
    let any = prost_types::Any {
        type_url: PROCESS_TYPE_URL.to_string(),
        value: serde_json::to_vec(process).map_err(|e| EnvdError::Internal(e.to_string()))?,
    };
    let created = lc.exec_process(id, exec_id, any, &io.paths).await;
    io.created();
    created?;
    if let Err(e) = lc.start_process(id, exec_id).await {
        let _ = lc.delete_process(id, exec_id).await;
        return Err(e.into());
    }
    Ok(Started {
        io,
        ends,
        exec_id: exec_id.to_string(),
    })
}

/// Whether starting a process failed because its executable does not exist (runc's
/// "executable file not found" / "no such file or directory").
pub fn is_not_found(e: &EnvdError) -> bool {
    let m = e.to_string();
    m.contains("executable file not found") || m.contains("no such file or directory")
}

/// Which stream a chunk came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// What one stream kept: the first `limit` bytes (only when not streamed) and the count of
/// bytes dropped beyond the limit.
#[derive(Debug, Default)]
pub struct Kept {
    pub data: Vec<u8>,
    pub dropped: u64,
}

/// Read `r` to EOF: each chunk within `limit` is sent on `tx` (when given) or kept.
pub async fn read_stream(
    mut r: tokio::net::unix::pipe::Receiver,
    stream: Stream,
    limit: u64,
    tx: Option<mpsc::Sender<Result<ExecEvent, tonic::Status>>>,
) -> Kept {
    let mut kept = Kept::default();
    let mut seen = 0u64;
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) => {
                tracing::debug!(error = %e, "reading exec output");
                break;
            }
        };
        let room = limit.saturating_sub(seen) as usize;
        let take = n.min(room);
        seen += n as u64;
        kept.dropped += (n - take) as u64;
        if take == 0 {
            continue;
        }
        let chunk = &buf[..take];
        match &tx {
            Some(tx) => {
                let ev = match stream {
                    Stream::Stdout => exec_event::Event::Stdout(chunk.to_vec()),
                    Stream::Stderr => exec_event::Event::Stderr(chunk.to_vec()),
                };
                // A client that went away still lets the process run to its end.
                let _ = tx.send(Ok(ExecEvent { event: Some(ev) })).await;
            }
            None => kept.data.extend_from_slice(chunk),
        }
    }
    kept
}

/// What [`run`] needs besides the process.
pub struct RunParams {
    pub stdin: Vec<u8>,
    pub timeout: Option<Duration>,
    pub output_limit: u64,
    /// Stream chunks here (else keep them for the exit message).
    pub tx: Option<mpsc::Sender<Result<ExecEvent, tonic::Status>>>,
}

/// Run a started process to its end: stdin written (then closed), output read, timeout
/// enforced (SIGKILL), exit status waited for, the process deleted. The exit message has
/// `cause` empty: the caller adds the environment's (e.g. the shim's OOM reason).
pub async fn run(
    lc: &Lifecycle,
    id: &str,
    started: Started,
    p: RunParams,
    t0: Instant,
) -> Result<ExecExit, EnvdError> {
    let Started { io, ends, exec_id } = started;
    let stdin_task = ends.stdin.map(|mut w| {
        let (lc, id, exec_id, data) = (lc.clone(), id.to_string(), exec_id.clone(), p.stdin);
        tokio::spawn(async move {
            if let Err(e) = w.write_all(&data).await {
                tracing::debug!(error = %e, "writing the exec's stdin");
            }
            drop(w);
            if let Err(e) = lc.close_process_stdin(&id, &exec_id).await {
                tracing::debug!(error = %e, "closing the exec's stdin");
            }
        })
    });
    let out = tokio::spawn(read_stream(
        ends.stdout,
        Stream::Stdout,
        p.output_limit,
        p.tx.clone(),
    ));
    let err = tokio::spawn(read_stream(
        ends.stderr,
        Stream::Stderr,
        p.output_limit,
        p.tx.clone(),
    ));
    let mut timed_out = false;
    let status = {
        let wait = lc.wait_process(id, &exec_id);
        tokio::pin!(wait);
        match p.timeout {
            Some(t) => {
                tokio::select! {
                    r = &mut wait => r,
                    _ = tokio::time::sleep(t) => {
                        timed_out = true;
                        if let Err(e) = lc.kill_process(id, &exec_id, 9, false).await {
                            tracing::warn!(error = %e, "killing a timed-out exec");
                        }
                        wait.await
                    }
                }
            }
            None => wait.await,
        }
    };
    let duration_ms = t0.elapsed().as_secs_f64() * 1e3;
    // The output reaches EOF when every holder of the pipes exited; a background child
    // still holding them is not waited for longer than DRAIN.
    let mut out = out;
    let mut err = err;
    let deadline = tokio::time::Instant::now() + DRAIN;
    let o = match tokio::time::timeout_at(deadline, &mut out).await {
        Ok(r) => r.unwrap_or_default(),
        Err(_) => {
            out.abort();
            Kept::default()
        }
    };
    let e = match tokio::time::timeout_at(deadline, &mut err).await {
        Ok(r) => r.unwrap_or_default(),
        Err(_) => {
            err.abort();
            Kept::default()
        }
    };
    if let Some(s) = stdin_task {
        s.abort();
    }
    // Forgetting the exited process is the shim's bookkeeping, not the caller's answer: it
    // runs after the exit went out (the FIFOs go with it).
    let (lc2, id2) = (lc.clone(), id.to_string());
    tokio::spawn(async move {
        if let Err(e) = lc2.delete_process(&id2, &exec_id).await {
            tracing::debug!(error = %e, "deleting an exec process");
        }
        drop(io);
    });
    let status = status? as i32;
    Ok(ExecExit {
        exit_code: status,
        duration_ms,
        timed_out,
        killed: timed_out || status > 128,
        cause: if timed_out {
            format!(
                "timed out after {:.3} s: killed (SIGKILL)",
                p.timeout.map(|t| t.as_secs_f64()).unwrap_or(0.0)
            )
        } else if status > 128 && status < 128 + 65 {
            format!("killed by signal {}", status - 128)
        } else {
            String::new()
        },
        stdout_dropped: o.dropped,
        stderr_dropped: e.dropped,
        stdout: o.data,
        stderr: e.data,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_takes_argv_cwd_and_overrides_env_keys() {
        let t = serde_json::json!({"args": ["old"], "cwd": "/src", "env": ["PATH=/bin", "A=1"],
            "user": {"uid": 0, "gid": 0}, "terminal": true});
        let env = BTreeMap::from([("A".to_string(), "2".to_string())]);
        let p = process_json(&t, &["ls".into(), "-l".into()], None, &env);
        assert_eq!(p["args"], serde_json::json!(["ls", "-l"]));
        assert_eq!(p["cwd"], "/src");
        assert_eq!(p["terminal"], false);
        assert_eq!(p["env"], serde_json::json!(["PATH=/bin", "A=2"]));
        assert_eq!(p["user"]["uid"], 0);
        let p = process_json(&t, &["pwd".into()], Some("/tmp"), &BTreeMap::new());
        assert_eq!(p["cwd"], "/tmp");
        assert_eq!(p["env"], serde_json::json!(["PATH=/bin", "A=1"]));
    }

    #[test]
    fn launch_lines_quote_every_word() {
        let env = BTreeMap::from([("A_1".to_string(), "x y'z".to_string())]);
        let argv = vec!["printf".to_string(), "%s\\n".to_string(), "a b".to_string()];
        let l = launch_line(&argv, Some("/src dir"), &env).unwrap();
        assert_eq!(
            l,
            "cd '/src dir' || exit 126; export 'A_1=x y'\\''z'; exec 'printf' '%s\\n' 'a b'"
        );
        // run by a real shell: the words arrive intact
        let out = std::process::Command::new("/bin/sh")
            .args(["-c", &format!("cd /; {}", l.replace("/src dir", "/"))])
            .output()
            .unwrap();
        assert_eq!(out.stdout, b"a b\n");
        assert_eq!(
            launch_line(&argv, None, &BTreeMap::new()).unwrap(),
            "exec 'printf' '%s\\n' 'a b'"
        );
        // not a shell name, or a newline: the ordinary path
        let bad = BTreeMap::from([("A-B".to_string(), "1".to_string())]);
        assert_eq!(launch_line(&argv, None, &bad), None);
        assert_eq!(
            launch_line(&["a\nb".to_string()], None, &BTreeMap::new()),
            None
        );
        assert_eq!(launch_line(&[], None, &BTreeMap::new()), None);
    }

    #[test]
    fn the_launcher_leaves_the_rest_of_stdin_to_the_program() {
        use std::io::Write;
        let line = launch_line(
            &["wc".to_string(), "-c".to_string()],
            None,
            &BTreeMap::new(),
        )
        .unwrap();
        let mut c = std::process::Command::new(LAUNCHER[0])
            .args(&LAUNCHER[1..])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut i = c.stdin.take().unwrap();
        i.write_all(format!("{line}\n12345").as_bytes()).unwrap();
        drop(i);
        let out = c.wait_with_output().unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "5");
    }

    #[test]
    fn a_template_without_cwd_runs_in_root() {
        let p = process_json(
            &serde_json::json!({}),
            &["true".into()],
            None,
            &BTreeMap::new(),
        );
        assert_eq!(p["cwd"], "/");
    }
}
