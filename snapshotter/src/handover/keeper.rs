//! The keeper: a small process that holds a FUSE session's `/dev/fuse` fd while no daemon
//! serves it, so that the kernel keeps the connection (and every container's mounts on it)
//! alive across a daemon restart, crash or upgrade.
//!
//! It serves [`super::wire`] requests on a unix socket (one thread per connection). It keeps
//! at most one session. While no daemon is connected for `timeout`, it aborts the session it
//! holds (lazy unmount, fd closed: reads fail as they would without a keeper); a keeper the
//! daemon started then exits, one started on its own keeps listening ([`decide`]). `Stop`
//! aborts the session and exits at once.

use super::wire::{self, Reply, Request};
use super::SessionMeta;
use parking_lot::Mutex;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use thiserror::Error;

/// Errors that stop the keeper.
#[derive(Debug, Error)]
pub enum KeeperError {
    #[error("a keeper already answers on {0}")]
    Running(PathBuf),
    #[error("keeper socket {path}: {error}")]
    Socket {
        path: PathBuf,
        error: std::io::Error,
    },
}

/// What the keeper's watchdog does now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Watch {
    Wait,
    /// No daemon took the session over in time: abort it.
    Abort,
    /// Nothing to keep and nobody connected for the timeout: exit.
    Exit,
}

/// The watchdog's decision (pure): `idle_for` is how long no daemon has been connected
/// (`None` while one is); `exit_when_idle` for a keeper the daemon started.
pub fn decide(
    held: bool,
    idle_for: Option<Duration>,
    timeout: Duration,
    exit_when_idle: bool,
) -> Watch {
    match idle_for {
        Some(d) if d >= timeout => {
            if held {
                Watch::Abort
            } else if exit_when_idle {
                Watch::Exit
            } else {
                Watch::Wait
            }
        }
        _ => Watch::Wait,
    }
}

struct Held {
    fd: OwnedFd,
    meta: SessionMeta,
}

#[derive(Default)]
struct State {
    held: Option<Held>,
    /// Live opens of the held session, by inode.
    opens: std::collections::HashMap<u64, super::OpenRecord>,
    clients: usize,
    idle_since: Option<Instant>,
}

/// Forgets a session for good: lazy unmount, then the fd is closed (the last one: the
/// kernel aborts the connection).
fn abort(h: Held, why: &str) {
    tracing::warn!(mountpoint = %h.meta.mountpoint.display(), why, "aborting the kept FUSE session");
    if let Err(e) = nix::mount::umount2(&h.meta.mountpoint, nix::mount::MntFlags::MNT_DETACH) {
        tracing::warn!(error = %e, "lazy unmount failed");
    }
    drop(h.fd);
}

fn handle(st: &Mutex<State>, req: Request, fd: Option<OwnedFd>) -> (Reply, Option<OwnedFd>) {
    let mut g = st.lock();
    match req {
        Request::Put { meta } => {
            let Some(fd) = fd else {
                return (
                    Reply::Error {
                        message: "put without a fd".into(),
                    },
                    None,
                );
            };
            tracing::info!(mountpoint = %meta.mountpoint.display(), slots = meta.slots.len(), "keeping a FUSE session");
            // A replaced session was given up by its daemon (it mounted a new one).
            g.held = Some(Held { fd, meta });
            g.opens.clear();
            (Reply::Ok, None)
        }
        Request::Slot { digest, slot } => match g.held.as_mut() {
            Some(h) => {
                h.meta.slots.insert(digest, slot);
                (Reply::Ok, None)
            }
            None => (
                Reply::Error {
                    message: "no session kept".into(),
                },
                None,
            ),
        },
        Request::Opens { set } => {
            for r in set {
                if r.cached == 0 && r.passthrough == 0 {
                    g.opens.remove(&r.ino);
                } else {
                    g.opens.insert(r.ino, r);
                }
            }
            (Reply::Ok, None)
        }
        Request::Take => match g.held.take() {
            Some(mut h) => {
                let fd = match h.fd.as_fd().try_clone_to_owned() {
                    Ok(fd) => fd,
                    Err(e) => {
                        return (
                            Reply::Error {
                                message: format!("dup: {e}"),
                            },
                            None,
                        )
                    }
                };
                h.meta.takeovers += 1;
                tracing::info!(mountpoint = %h.meta.mountpoint.display(), takeovers = h.meta.takeovers, opens = g.opens.len(), "handing the FUSE session over");
                let mut meta = h.meta.clone();
                meta.opens = g.opens.values().copied().collect();
                g.held = Some(h);
                (Reply::Session { meta }, Some(fd))
            }
            None => (Reply::Empty, None),
        },
        Request::Release => {
            g.opens.clear();
            if g.held.take().is_some() {
                tracing::info!("the daemon unmounted its session; nothing kept");
            }
            (Reply::Ok, None)
        }
        Request::Stop => {
            if let Some(h) = g.held.take() {
                abort(h, "stop requested");
            }
            (Reply::Ok, None)
        }
        Request::Status => (
            Reply::Status {
                pid: std::process::id(),
                held: g.held.is_some(),
                clients: g.clients,
            },
            None,
        ),
    }
}

fn serve_conn(st: Arc<Mutex<State>>, s: UnixStream) {
    st.lock().clients += 1;
    loop {
        let (req, fd) = match wire::recv::<Request>(&s) {
            Ok(Some(m)) => m,
            Ok(None) => break,
            Err(e) => {
                tracing::debug!(error = %e, "keeper connection failed");
                break;
            }
        };
        let stop = req == Request::Stop;
        let quiet = matches!(req, Request::Opens { .. });
        let (reply, out) = handle(&st, req, fd);
        if quiet {
            continue;
        }
        if let Err(e) = wire::send(&s, &reply, out.as_ref().map(|f| f.as_fd())) {
            tracing::debug!(error = %e, "keeper reply failed");
            break;
        }
        if stop {
            tracing::info!("keeper stopped");
            std::process::exit(0);
        }
    }
    let mut g = st.lock();
    g.clients = g.clients.saturating_sub(1);
    if g.clients == 0 {
        g.idle_since = Some(Instant::now());
        if g.held.is_some() {
            tracing::info!("no daemon connected; holding the FUSE session for the next one");
        }
    }
}

/// Binds `socket` (0600; a stale socket file is replaced, a live keeper is an error).
pub fn bind(socket: &Path) -> Result<UnixListener, KeeperError> {
    let err = |error| KeeperError::Socket {
        path: socket.to_path_buf(),
        error,
    };
    if socket.exists() {
        if UnixStream::connect(socket).is_ok() {
            return Err(KeeperError::Running(socket.to_path_buf()));
        }
        std::fs::remove_file(socket).map_err(err)?;
    }
    if let Some(d) = socket.parent() {
        std::fs::create_dir_all(d).map_err(err)?;
    }
    let l = UnixListener::bind(socket).map_err(err)?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
    Ok(l)
}

/// Runs the keeper on `listener` until it is stopped or (`exit_when_idle`) has had nothing
/// to keep and no daemon for `timeout`.
pub fn run(
    listener: UnixListener,
    timeout: Duration,
    exit_when_idle: bool,
) -> Result<(), KeeperError> {
    let st = Arc::new(Mutex::new(State {
        idle_since: Some(Instant::now()),
        ..State::default()
    }));
    {
        let st = st.clone();
        std::thread::Builder::new()
            .name("keeper-accept".into())
            .spawn(move || {
                for s in listener.incoming() {
                    match s {
                        Ok(s) => {
                            let st = st.clone();
                            st.lock().idle_since = None;
                            if let Err(e) = std::thread::Builder::new()
                                .name("keeper-conn".into())
                                .spawn(move || serve_conn(st, s))
                            {
                                tracing::warn!(error = %e, "cannot serve a keeper connection");
                            }
                        }
                        Err(e) => tracing::warn!(error = %e, "keeper accept failed"),
                    }
                }
            })
            .map_err(|error| KeeperError::Socket {
                path: PathBuf::new(),
                error,
            })?;
    }
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let mut g = st.lock();
        let idle = if g.clients > 0 {
            None
        } else {
            g.idle_since.map(|t| t.elapsed())
        };
        match decide(g.held.is_some(), idle, timeout, exit_when_idle) {
            Watch::Wait => {}
            Watch::Abort => {
                if let Some(h) = g.held.take() {
                    abort(h, "no daemon took the session over in time");
                }
            }
            Watch::Exit => {
                tracing::info!("nothing to keep; keeper exits");
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watchdog_waits_for_a_daemon_then_aborts_then_exits() {
        let t = Duration::from_secs(10);
        assert_eq!(
            decide(true, None, t, true),
            Watch::Wait,
            "a daemon is connected"
        );
        assert_eq!(
            decide(true, Some(Duration::from_secs(9)), t, true),
            Watch::Wait
        );
        assert_eq!(decide(true, Some(t), t, true), Watch::Abort);
        assert_eq!(decide(true, Some(t), t, false), Watch::Abort);
        assert_eq!(decide(false, Some(t), t, true), Watch::Exit);
        assert_eq!(
            decide(false, Some(t), t, false),
            Watch::Wait,
            "a keeper of its own stays"
        );
        assert_eq!(decide(false, None, t, true), Watch::Wait);
    }

    fn meta() -> SessionMeta {
        SessionMeta {
            version: super::super::META_VERSION,
            mountpoint: "/nonexistent-weenv-test".into(),
            init: super::super::InitParams {
                major: 7,
                minor: 41,
                flags: 0,
            },
            slots: Default::default(),
            takeovers: 0,
            opens: vec![],
        }
    }

    #[test]
    fn keeps_slots_and_hands_the_session_over() {
        let st = Mutex::new(State::default());
        assert_eq!(handle(&st, Request::Take, None).0, Reply::Empty);
        assert!(matches!(
            handle(&st, Request::Put { meta: meta() }, None).0,
            Reply::Error { .. }
        ));
        let f: OwnedFd = tempfile::tempfile().unwrap().into();
        assert_eq!(
            handle(&st, Request::Put { meta: meta() }, Some(f)).0,
            Reply::Ok
        );
        let slot = Request::Slot {
            digest: "sha256:aa".into(),
            slot: 4,
        };
        assert_eq!(handle(&st, slot, None).0, Reply::Ok);
        let (r, fd) = handle(&st, Request::Take, None);
        let Reply::Session { meta: m } = r else {
            panic!("{r:?}")
        };
        assert_eq!((m.takeovers, m.slots.get("sha256:aa")), (1, Some(&4)));
        assert!(fd.is_some());
        let opens = |ino, cached, passthrough| Request::Opens {
            set: vec![super::super::OpenRecord {
                ino,
                cached,
                passthrough,
                backing: Some(7).filter(|_| passthrough > 0),
            }],
        };
        handle(&st, opens(5, 1, 2), None);
        handle(&st, opens(6, 1, 0), None);
        handle(&st, opens(6, 0, 0), None);
        let Reply::Session { meta: m } = handle(&st, Request::Take, None).0 else {
            panic!()
        };
        assert_eq!(
            m.opens,
            vec![super::super::OpenRecord {
                ino: 5,
                cached: 1,
                passthrough: 2,
                backing: Some(7)
            }]
        );
        // Kept after a take: a successor that dies before serving can be replaced.
        assert!(matches!(
            handle(&st, Request::Take, None).0,
            Reply::Session { .. }
        ));
        assert_eq!(handle(&st, Request::Release, None).0, Reply::Ok);
        assert_eq!(handle(&st, Request::Take, None).0, Reply::Empty);
    }
}
