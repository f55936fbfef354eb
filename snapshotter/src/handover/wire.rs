//! Messages on the keeper's unix socket: a little-endian `u32` length, then a JSON
//! [`Request`] or [`Reply`]; a fd travels as `SCM_RIGHTS` with the message's first bytes.

use super::SessionMeta;
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

/// Largest message accepted (a session with 100,000 layer slots is ~10 MB).
pub const MAX_MESSAGE: u32 = 64 << 20;

/// A daemon's request to the keeper.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Keep this session (the fd comes with the message), replacing any other.
    Put { meta: SessionMeta },
    /// Layer `digest` got slot `slot` (sent before the layer becomes visible).
    Slot { digest: String, slot: u32 },
    /// Changes of live opens (no reply).
    Opens { set: Vec<super::OpenRecord> },
    /// Hand the kept session over (the keeper keeps its copy until the next `Put`).
    Take,
    /// The daemon unmounted the session: forget it.
    Release,
    /// Forget the session (unmounting it lazily) and exit.
    Stop,
    /// Who is the keeper.
    Status,
}

/// The keeper's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum Reply {
    Ok,
    /// The kept session (the fd comes with the message).
    Session {
        meta: SessionMeta,
    },
    /// No session kept.
    Empty,
    Status {
        pid: u32,
        held: bool,
        clients: usize,
    },
    Error {
        message: String,
    },
}

fn bad(msg: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, msg)
}

/// Sends `msg` (and `fd`) on `s`.
pub fn send<T: Serialize>(
    s: &UnixStream,
    msg: &T,
    fd: Option<BorrowedFd<'_>>,
) -> std::io::Result<()> {
    let body = serde_json::to_vec(msg).map_err(|e| bad(e.to_string()))?;
    let len = u32::try_from(body.len())
        .ok()
        .filter(|l| *l <= MAX_MESSAGE)
        .ok_or_else(|| bad(format!("message of {} bytes", body.len())))?;
    let mut buf = Vec::with_capacity(4 + body.len());
    buf.extend_from_slice(&len.to_le_bytes());
    buf.extend_from_slice(&body);
    let fds: Vec<RawFd> = fd.iter().map(|f| f.as_raw_fd()).collect();
    let cmsgs: Vec<ControlMessage<'_>> = if fds.is_empty() {
        Vec::new()
    } else {
        vec![ControlMessage::ScmRights(&fds)]
    };
    let iov = [IoSlice::new(&buf)];
    let n = sendmsg::<()>(s.as_raw_fd(), &iov, &cmsgs, MsgFlags::MSG_NOSIGNAL, None)?;
    if let Some(rest) = buf.get(n..) {
        (&mut &*s).write_all(rest)?;
    }
    Ok(())
}

/// Receives one message (and its fd, if any) from `s`; `None` at end of stream.
pub fn recv<T: DeserializeOwned>(s: &UnixStream) -> std::io::Result<Option<(T, Option<OwnedFd>)>> {
    let mut hdr = [0u8; 4];
    let mut space = nix::cmsg_space!([RawFd; 4]);
    let (n, fds) = {
        let mut iov = [IoSliceMut::new(&mut hdr)];
        let m = recvmsg::<()>(
            s.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )?;
        let mut fds = Vec::new();
        for c in m.cmsgs()? {
            if let ControlMessageOwned::ScmRights(v) = c {
                fds.extend(v);
            }
        }
        (m.bytes, fds)
    };
    // SAFETY: the kernel installed these descriptors in this process for this message;
    // nothing else owns them.
    let mut fds: Vec<OwnedFd> = fds
        .into_iter()
        .map(|f| unsafe { OwnedFd::from_raw_fd(f) })
        .collect();
    if n == 0 {
        return Ok(None);
    }
    if let Some(rest) = hdr.get_mut(n..) {
        (&mut &*s).read_exact(rest)?;
    }
    let len = u32::from_le_bytes(hdr);
    if len > MAX_MESSAGE {
        return Err(bad(format!("message of {len} bytes")));
    }
    let mut body = vec![0u8; len as usize];
    (&mut &*s).read_exact(&mut body)?;
    let msg = serde_json::from_slice(&body).map_err(|e| bad(e.to_string()))?;
    let fd = if fds.is_empty() {
        None
    } else {
        Some(fds.swap_remove(0))
    };
    Ok(Some((msg, fd)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn meta() -> SessionMeta {
        SessionMeta {
            version: super::super::META_VERSION,
            mountpoint: "/m".into(),
            init: super::super::InitParams {
                major: 7,
                minor: 41,
                flags: 1 << 40 | 3,
            },
            slots: BTreeMap::from([("sha256:ab".to_string(), 3)]),
            takeovers: 2,
            opens: vec![],
        }
    }

    #[test]
    fn messages_and_fds_cross_the_socket() {
        let (a, b) = UnixStream::pair().unwrap();
        let f = tempfile::tempfile().unwrap();
        send(
            &a,
            &Request::Put { meta: meta() },
            Some(std::os::fd::AsFd::as_fd(&f)),
        )
        .unwrap();
        send(&a, &Request::Take, None).unwrap();
        let (m, fd): (Request, _) = recv(&b).unwrap().unwrap();
        assert_eq!(m, Request::Put { meta: meta() });
        let fd = fd.expect("the fd came along");
        let st = nix::sys::stat::fstat(&fd).unwrap();
        assert_eq!(st.st_ino, nix::sys::stat::fstat(&f).unwrap().st_ino);
        let (m, fd): (Request, _) = recv(&b).unwrap().unwrap();
        assert_eq!((m, fd.is_none()), (Request::Take, true));
        drop(a);
        assert!(recv::<Request>(&b).unwrap().is_none());
    }

    #[test]
    fn oversized_length_is_refused() {
        let (a, b) = UnixStream::pair().unwrap();
        (&a).write_all(&(MAX_MESSAGE + 1).to_le_bytes()).unwrap();
        assert!(recv::<Request>(&b).is_err());
    }
}
