//! TTY support: the console socket runc sends the pty master to (`--console-socket`,
//! one `SCM_RIGHTS` message), copy loops between containerd's FIFOs and the master, and
//! window resizing.
//!
//! Stdin follows the Go runc shim: the shim keeps its own writer on the stdin FIFO (the
//! "stdin closer") so the copy loop does not see EOF before containerd's writer is open;
//! `CloseIO` drops it, and the loop ends when containerd closes its side too.

use std::fs::File;
use std::io::IoSliceMut;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::pty::Winsize;
use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
use tracing::warn;

static SEQ: AtomicU64 = AtomicU64::new(0);

/// A listening console socket in a private temp dir (removed on drop).
pub struct ConsoleSocket {
    dir: PathBuf,
    path: PathBuf,
    listener: tokio::net::UnixListener,
}

impl ConsoleSocket {
    pub fn new() -> std::io::Result<ConsoleSocket> {
        let dir = std::env::temp_dir().join(format!(
            "weenv-pty-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir)?;
        let path = dir.join("pty.sock");
        let listener = tokio::net::UnixListener::bind(&path)?;
        Ok(ConsoleSocket {
            dir,
            path,
            listener,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Accepts runc's connection and receives the pty master.
    pub async fn receive(self, timeout: Duration) -> std::io::Result<File> {
        let (stream, _) = tokio::time::timeout(timeout, self.listener.accept())
            .await
            .map_err(|_| std::io::Error::other("runc did not connect to the console socket"))??;
        let stream = stream.into_std()?;
        stream.set_nonblocking(false)?;
        let fd = tokio::task::spawn_blocking(move || recv_fd(stream.as_raw_fd()))
            .await
            .map_err(std::io::Error::other)??;
        Ok(File::from(fd))
    }
}

impl Drop for ConsoleSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn recv_fd(sock: RawFd) -> std::io::Result<OwnedFd> {
    let mut buf = [0u8; 4096];
    let mut iov = [IoSliceMut::new(&mut buf)];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let msg = recvmsg::<()>(sock, &mut iov, Some(&mut space), MsgFlags::empty())
        .map_err(std::io::Error::from)?;
    for c in msg.cmsgs().map_err(std::io::Error::from)? {
        if let ControlMessageOwned::ScmRights(fds) = c {
            if let Some(fd) = fds.first() {
                // nix's ScmRights hands out raw descriptors; taking ownership is ours to do.
                // SAFETY: the kernel just installed this descriptor for us via SCM_RIGHTS;
                // nothing else owns it.
                return Ok(unsafe { OwnedFd::from_raw_fd(*fd) });
            }
        }
    }
    Err(std::io::Error::other(
        "console socket message carried no descriptor",
    ))
}

/// Opens a FIFO for reading without blocking on a missing writer, then makes it blocking.
pub fn open_fifo_read(path: &Path) -> std::io::Result<File> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(OFlag::O_NONBLOCK.bits())
        .open(path)?;
    let fl = OFlag::from_bits_retain(fcntl(&f, FcntlArg::F_GETFL)?);
    fcntl(&f, FcntlArg::F_SETFL(fl.difference(OFlag::O_NONBLOCK)))?;
    Ok(f)
}

/// Starts the copy loops for a pty master; returns the stdin closer (if stdin is used).
pub fn start_copy(
    master: &File,
    stdin: Option<&Path>,
    stdout: Option<&Path>,
) -> std::io::Result<Option<File>> {
    let mut closer = None;
    if let Some(p) = stdin {
        let mut reader = open_fifo_read(p)?;
        // Our own writer keeps the FIFO from reporting EOF before containerd's opens.
        closer = Some(std::fs::OpenOptions::new().write(true).open(p)?);
        let mut to_master = master.try_clone()?;
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut reader, &mut to_master);
        });
    }
    if let Some(p) = stdout {
        let mut from_master = master.try_clone()?;
        let p = p.to_path_buf();
        std::thread::spawn(
            move || match std::fs::OpenOptions::new().write(true).open(&p) {
                // Ends with EIO once every process holding the pty slave has exited.
                Ok(mut out) => {
                    let _ = std::io::copy(&mut from_master, &mut out);
                }
                Err(e) => warn!(path = %p.display(), error = %e, "open stdout FIFO for the pty"),
            },
        );
    }
    Ok(closer)
}

// `set_winsize(fd, *const Winsize)`: TIOCSWINSZ through nix's ioctl macro (errno to a nix
// error). nix has no safe wrapper for it (no `tcsetwinsize`), so the call stays unsafe.
nix::ioctl_write_ptr_bad!(set_winsize, libc::TIOCSWINSZ, Winsize);

/// Sets the pty window size.
pub fn resize(master: &File, width: u32, height: u32) -> std::io::Result<()> {
    let ws = Winsize {
        ws_row: height.min(u16::MAX as u32) as u16,
        ws_col: width.min(u16::MAX as u32) as u16,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: `master` is an open descriptor; TIOCSWINSZ only reads the winsize we own for
    // the duration of the call.
    unsafe { set_winsize(master.as_raw_fd(), &ws) }?;
    Ok(())
}
