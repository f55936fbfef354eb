//! Where a process's output goes, as containerd names it in `Create`/`Exec`: a FIFO path (the
//! default), `file:///path` (stdout and stderr appended to one file) or `binary:///path?k=v`
//! (a logging binary, started by the shim: nerdctl's `run -d` logs this way). The rules follow
//! containerd's own runc shim: the binary gets the container's stdout on fd 3, stderr on fd 4
//! and a pipe on fd 5 that it closes (or writes to) once it is ready, with only
//! `CONTAINER_ID` and `CONTAINER_NAMESPACE` in its environment; at the end it gets SIGTERM.
//!
//! [`parse`] is pure; [`BinaryLogger`] starts the process.

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::time::Duration;

use tracing::warn;

/// How long a logging binary may take to say it is ready (containerd waits as long).
const READY_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum StdioError {
    #[error("stdio URI {uri:?}: {reason}")]
    Uri { uri: String, reason: String },
    #[error("logging binary {path}: {source}")]
    Binary {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("log file {path}: {source}")]
    File {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// A stdout/stderr target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Not given: /dev/null.
    None,
    /// containerd's FIFO (a plain path, or `fifo://path`).
    Fifo(PathBuf),
    /// `file:///path`: appended to, directories created.
    File(PathBuf),
    /// `binary:///path?k=v&k2`: the logging binary and its arguments (each query key, then its
    /// first value if it has one, as containerd passes them).
    Binary { path: PathBuf, args: Vec<String> },
}

/// Parses containerd's stdio string.
pub fn parse(s: &str) -> Result<Target, StdioError> {
    if s.is_empty() {
        return Ok(Target::None);
    }
    let Some((scheme, _)) = s.split_once("://") else {
        return Ok(Target::Fifo(PathBuf::from(s)));
    };
    let bad = |reason: &str| StdioError::Uri {
        uri: s.to_string(),
        reason: reason.to_string(),
    };
    if !matches!(scheme, "fifo" | "file" | "binary") {
        return Err(bad(&format!(
            "unknown scheme {scheme:?} (the weenv shim takes fifo paths, file:// and binary://)"
        )));
    }
    let u = url::Url::parse(s).map_err(|e| bad(&e.to_string()))?;
    // url decodes the path and refuses a host (other than localhost).
    let path = u
        .to_file_path()
        .map_err(|()| bad("the path must be absolute (scheme:///path)"))?;
    match scheme {
        "fifo" => Ok(Target::Fifo(path)),
        "file" => Ok(Target::File(path)),
        "binary" => {
            let mut args = Vec::new();
            for (k, v) in u.query_pairs() {
                args.push(k.into_owned());
                if !v.is_empty() {
                    args.push(v.into_owned());
                }
            }
            Ok(Target::Binary { path, args })
        }
        _ => Err(bad("unknown scheme")),
    }
}

/// Opens a `file://` target for appending (its directory created).
pub fn open_log_file(path: &std::path::Path) -> Result<File, StdioError> {
    let err = |source| StdioError::File {
        path: path.display().to_string(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(err)
}

/// A running logging binary and the write ends of its two pipes (the container's stdout and
/// stderr). Dropping it closes the shim's write ends and sends SIGTERM; the shim's reaper
/// collects the exit.
#[derive(Debug)]
pub struct BinaryLogger {
    pub stdout: File,
    pub stderr: File,
    pid: u32,
}

impl BinaryLogger {
    /// Starts `path args…` and waits (bounded) until it closes or writes to its ready pipe.
    pub fn start(
        path: &std::path::Path,
        args: &[String],
        id: &str,
        namespace: &str,
    ) -> Result<BinaryLogger, StdioError> {
        let err = |source| StdioError::Binary {
            path: path.display().to_string(),
            source,
        };
        let (out_r, out_w) = std::io::pipe().map_err(err)?;
        let (err_r, err_w) = std::io::pipe().map_err(err)?;
        let (ready_r, ready_w) = std::io::pipe().map_err(err)?;
        let fds: [OwnedFd; 3] = [out_r.into(), err_r.into(), ready_w.into()];
        let raw: Vec<i32> = fds.iter().map(|f| f.as_raw_fd()).collect();
        let mut cmd = std::process::Command::new(path);
        cmd.args(args)
            .env_clear()
            .env("CONTAINER_ID", id)
            .env("CONTAINER_NAMESPACE", namespace)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        // SAFETY: between fork and exec the closure only calls dup2 and close, which are
        // async-signal-safe; it allocates nothing.
        unsafe {
            cmd.pre_exec(move || {
                // Move the three ends out of the way first (a source may sit on 3..=5), then
                // onto 3, 4 and 5; dup2 clears close-on-exec on the targets.
                let mut high = [0i32; 3];
                for (i, fd) in raw.iter().enumerate() {
                    let h = libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, 10);
                    if h < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    high[i] = h;
                }
                for (i, h) in high.iter().enumerate() {
                    if libc::dup2(*h, 3 + i as i32) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(err)?;
        let pid = child.id();
        // The child holds its own copies; ours of the read ends and the ready pipe go.
        drop(fds);
        let logger = BinaryLogger {
            stdout: File::from(OwnedFd::from(out_w)),
            stderr: File::from(OwnedFd::from(err_w)),
            pid,
        };
        // Ready: the binary closes fd 5 (EOF) or writes a byte. Bounded: a binary that
        // never answers fails the create instead of hanging it.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut r = ready_r;
            let mut b = [0u8; 1];
            let _ = tx.send(r.read(&mut b));
        });
        match rx.recv_timeout(READY_TIMEOUT) {
            Ok(Ok(_)) => Ok(logger),
            Ok(Err(e)) => Err(err(e)),
            Err(_) => Err(err(std::io::Error::other(format!(
                "not ready within {} s (it must close fd 5 or write to it)",
                READY_TIMEOUT.as_secs()
            )))),
        }
    }
}

impl Drop for BinaryLogger {
    fn drop(&mut self) {
        // The write ends close with the fields; SIGTERM lets the logger flush and exit.
        let pid = nix::unistd::Pid::from_raw(self.pid as i32);
        if let Err(e) = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM) {
            if e != nix::errno::Errno::ESRCH {
                warn!(pid = self.pid, error = %e, "SIGTERM to the logging binary");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_paths_are_fifos_and_empty_is_none() {
        assert_eq!(parse("").unwrap(), Target::None);
        assert_eq!(
            parse("/run/containerd/fifo/1/c-stdout").unwrap(),
            Target::Fifo("/run/containerd/fifo/1/c-stdout".into())
        );
        assert_eq!(
            parse("fifo:///run/x").unwrap(),
            Target::Fifo("/run/x".into())
        );
    }

    #[test]
    fn file_and_binary_uris() {
        assert_eq!(
            parse("file:///var/log/c%20one.log").unwrap(),
            Target::File("/var/log/c one.log".into())
        );
        // nerdctl's form: the query key is a flag, its value the next argument.
        assert_eq!(
            parse("binary:///usr/local/bin/nerdctl?_NERDCTL_INTERNAL_LOGGING=%2Fvar%2Flib%2Fnerdctl%2Fab")
                .unwrap(),
            Target::Binary {
                path: "/usr/local/bin/nerdctl".into(),
                args: vec![
                    "_NERDCTL_INTERNAL_LOGGING".into(),
                    "/var/lib/nerdctl/ab".into()
                ]
            }
        );
        assert_eq!(
            parse("binary:///bin/logger?verbose").unwrap(),
            Target::Binary {
                path: "/bin/logger".into(),
                args: vec!["verbose".into()]
            }
        );
    }

    #[test]
    fn bad_uris_say_what_is_wrong() {
        let e = parse("tcp://1.2.3.4:5/x").unwrap_err().to_string();
        assert!(e.contains("unknown scheme \"tcp\""), "{e}");
        let e = parse("binary://relative/path").unwrap_err().to_string();
        assert!(e.contains("absolute"), "{e}");
    }

    #[test]
    fn a_logging_binary_gets_both_streams_and_its_environment() {
        let dir = std::env::temp_dir().join(format!("weenv-stdio-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("out");
        // Ready by closing fd 5, then copy fd 3 and fd 4 and the environment to a file.
        let script = format!(
            "exec 5>&-; {{ env | grep ^CONTAINER_; cat <&3; cat <&4; }} > {}",
            out.display()
        );
        let mut l = BinaryLogger::start(
            std::path::Path::new("/bin/sh"),
            &["-c".into(), script],
            "c1",
            "ns1",
        )
        .unwrap();
        use std::io::Write;
        l.stdout.write_all(b"to stdout\n").unwrap();
        l.stderr.write_all(b"to stderr\n").unwrap();
        // Close the write ends without the SIGTERM, so the copy runs to its end; the test
        // process is not a subreaper, so it waits for the child itself.
        drop(std::mem::replace(
            &mut l.stdout,
            File::open("/dev/null").unwrap(),
        ));
        drop(std::mem::replace(
            &mut l.stderr,
            File::open("/dev/null").unwrap(),
        ));
        let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(l.pid as i32), None);
        drop(l);
        let got = std::fs::read_to_string(&out).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(got.contains("CONTAINER_ID=c1"), "{got}");
        assert!(got.contains("CONTAINER_NAMESPACE=ns1"), "{got}");
        assert!(got.contains("to stdout\nto stderr\n"), "{got}");
    }
}
