//! A fuser session over a `/dev/fuse` fd whose INIT an earlier process answered.
//!
//! fuser 0.18's `Session::from_fd` insists on reading an INIT request first; after a
//! takeover the kernel will never send one again. So the session is made over one end of a
//! `SOCK_SEQPACKET` pair carrying a synthetic INIT with the kernel's original parameters
//! (the filesystem's `init` then makes the same choices as it did, e.g. passthrough), its
//! INIT reply is read and dropped, and the taken-over fd is `dup3`ed onto the session's fd
//! number before any thread reads it: from then on the session reads, answers and
//! registers passthrough backing files on the real connection.

use super::InitParams;
use fuser::{Config, Filesystem, Session, SessionACL};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

/// FUSE opcode of INIT.
const FUSE_INIT: u32 = 26;
/// `fuse_init_in.flags` bit saying `flags2` holds the upper 32 capability bits.
const FUSE_INIT_EXT: u64 = 1 << 30;
/// Notification asking the kernel to queue again every request the server read but did not
/// answer (Linux 6.9+).
const FUSE_NOTIFY_RESEND: i32 = 7;

/// The bytes of an INIT request (`fuse_in_header` + `fuse_init_in`) with `p`. Pure.
pub fn init_request(p: &InitParams, unique: u64) -> Vec<u8> {
    let flags = p.flags | FUSE_INIT_EXT;
    let mut b = Vec::with_capacity(104);
    b.extend_from_slice(&104u32.to_ne_bytes()); // len
    b.extend_from_slice(&FUSE_INIT.to_ne_bytes()); // opcode
    b.extend_from_slice(&unique.to_ne_bytes());
    b.extend_from_slice(&0u64.to_ne_bytes()); // nodeid
    b.extend_from_slice(&[0u8; 16]); // uid, gid, pid, total_extlen + padding
    b.extend_from_slice(&p.major.to_ne_bytes());
    b.extend_from_slice(&p.minor.to_ne_bytes());
    b.extend_from_slice(&(128u32 << 10).to_ne_bytes()); // max_readahead
    b.extend_from_slice(&((flags & 0xffff_ffff) as u32).to_ne_bytes());
    b.extend_from_slice(&((flags >> 32) as u32).to_ne_bytes());
    b.extend_from_slice(&[0u8; 44]); // unused[11]
    b
}

/// Checks the INIT reply fuser wrote (`fuse_out_header`: len, error, unique). Pure.
pub fn init_reply_ok(reply: &[u8], unique: u64) -> Result<(), String> {
    let field = |r: std::ops::Range<usize>| reply.get(r).ok_or("short INIT reply");
    let error = i32::from_ne_bytes(field(4..8)?.try_into().map_err(|_| "short INIT reply")?);
    let u = u64::from_ne_bytes(field(8..16)?.try_into().map_err(|_| "short INIT reply")?);
    if u != unique {
        return Err(format!("INIT reply for request {u}"));
    }
    if error != 0 {
        return Err(format!("the filesystem refused INIT: errno {}", -error));
    }
    Ok(())
}

fn io(e: nix::errno::Errno) -> std::io::Error {
    std::io::Error::from(e)
}

/// A session serving `fs` on the already initialised connection `fd`.
pub fn resume_session<FS: Filesystem>(
    fs: FS,
    fd: OwnedFd,
    init: &InitParams,
    config: Config,
) -> std::io::Result<Session<FS>> {
    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
    let (ours, theirs) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(io)?;
    let unique = 1;
    nix::unistd::write(&theirs, &init_request(init, unique)).map_err(io)?;
    let session = Session::from_fd(fs, ours, SessionACL::All, config)?;
    let mut reply = [0u8; 512];
    let n = nix::unistd::read(&theirs, &mut reply).map_err(io)?;
    init_reply_ok(reply.get(..n).unwrap_or_default(), unique).map_err(std::io::Error::other)?;
    let target = session.as_fd().as_raw_fd();
    // SAFETY: both are open descriptors of this process; dup3 atomically makes `target`
    // (owned by the session, not yet read by any thread) refer to the FUSE connection.
    if unsafe { libc::dup3(fd.as_raw_fd(), target, libc::O_CLOEXEC) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(session)
}

/// Asks the kernel to queue again the requests an earlier server read but never answered.
pub fn notify_resend(fd: BorrowedFd<'_>) -> std::io::Result<()> {
    let mut b = Vec::with_capacity(16);
    b.extend_from_slice(&16u32.to_ne_bytes());
    b.extend_from_slice(&FUSE_NOTIFY_RESEND.to_ne_bytes());
    b.extend_from_slice(&0u64.to_ne_bytes());
    nix::unistd::write(fd, &b).map_err(io)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_request_layout() {
        let p = InitParams {
            major: 7,
            minor: 41,
            flags: (1 << 41) | 5,
        };
        let b = init_request(&p, 9);
        assert_eq!(b.len(), 104);
        assert_eq!(u32::from_ne_bytes(b[0..4].try_into().unwrap()), 104);
        assert_eq!(u32::from_ne_bytes(b[4..8].try_into().unwrap()), FUSE_INIT);
        assert_eq!(u64::from_ne_bytes(b[8..16].try_into().unwrap()), 9);
        assert_eq!(u32::from_ne_bytes(b[40..44].try_into().unwrap()), 7);
        assert_eq!(u32::from_ne_bytes(b[44..48].try_into().unwrap()), 41);
        let lo = u32::from_ne_bytes(b[52..56].try_into().unwrap());
        assert_eq!(u64::from(lo), 5 | FUSE_INIT_EXT);
        assert_eq!(u32::from_ne_bytes(b[56..60].try_into().unwrap()), 1 << 9);
    }

    #[test]
    fn init_reply_checks_error_and_unique() {
        let reply = |err: i32, unique: u64| {
            let mut b = 80u32.to_ne_bytes().to_vec();
            b.extend_from_slice(&err.to_ne_bytes());
            b.extend_from_slice(&unique.to_ne_bytes());
            b
        };
        assert!(init_reply_ok(&reply(0, 1), 1).is_ok());
        assert!(init_reply_ok(&reply(-5, 1), 1).is_err());
        assert!(init_reply_ok(&reply(0, 2), 1).is_err());
        assert!(init_reply_ok(&[0; 4], 1).is_err());
    }
}
