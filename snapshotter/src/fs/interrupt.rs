//! FUSE INTERRUPT: make the kernel stop sending them, once per session.
//!
//! When a process waiting on a FUSE request gets a signal (Go programs such as containerd's
//! shim and runc receive SIGURG preemption signals all the time), the kernel sends a
//! `FUSE_INTERRUPT` for the request. fuser 0.18 does not pass interrupts to the filesystem:
//! it answers each with ENOSYS, on the fd it read the interrupt from. The kernel looks the
//! interrupted request up in the processing queue of *that* fd, and records "no interrupts"
//! (`fc->no_interrupt`) only when it finds it there, still pending. The session used one
//! cloned fd per worker, so the ENOSYS mostly went to another fd than the request's, or came
//! after the answer (the daemon answers in microseconds): the kernel refused it (`ENOENT`),
//! fuser logged `ERROR fuser::reply: Failed to send FUSE reply: No such file or directory`
//! (about four per lazy container start, measured: 7 in one run), and the kernel kept sending
//! interrupts. The workers now share one fd (`layers.rs`), and the probe below makes the
//! first interrupt arrive while its request is pending.
//!
//! Nothing here is interruptible anyway (every request is answered promptly or fails with
//! EIO), so the session tells the kernel once, deterministically, right after it is mounted:
//! a helper thread looks up [`PROBE_NAME`] in the mount root, the daemon holds that one
//! answer ([`HOLD`]), the helper thread is sent a signal while it waits, the kernel sends an
//! INTERRUPT for the held lookup, fuser answers ENOSYS while the lookup is still pending, and
//! the kernel sets `no_interrupt` for the connection. Then the lookup is answered (ENOENT).
//! From then on a signal never makes the kernel send an INTERRUPT (a fatal signal still ends
//! the waiting process as before).

use parking_lot::Mutex;
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

/// The name looked up in the mount root by the probe (never a layer: layers are digest hex).
pub const PROBE_NAME: &str = ".weenv-interrupt-probe";
/// How long the daemon holds the probe's lookup (the signal and the kernel's INTERRUPT must
/// arrive in that time; a loaded 2-core machine needs a few ms).
pub const HOLD: Duration = Duration::from_millis(300);

/// Where the filesystem reports that it holds the probe's lookup.
#[derive(Default)]
pub struct ProbeSlot(Mutex<Option<mpsc::Sender<()>>>);

impl ProbeSlot {
    /// Called by the lookup handler for [`PROBE_NAME`]: true if a probe is running (the
    /// handler then holds the answer for [`HOLD`]), false otherwise (answer at once).
    pub fn held(&self) -> bool {
        match self.0.lock().take() {
            Some(tx) => tx.send(()).is_ok(),
            None => false,
        }
    }
}

extern "C" fn no_op(_: libc::c_int) {}

/// Runs the probe against the session mounted at `mountpoint` (blocks for about [`HOLD`]).
/// Returns false if the probe could not run (the session then behaves as before).
pub fn disable_interrupts(mountpoint: &Path, slot: &ProbeSlot) -> bool {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    // SIGWINCH: ignored by default (an ignored signal is never pending, so it would not make
    // the kernel interrupt); the daemon has no terminal, so a no-op handler changes nothing.
    let act = SigAction::new(
        SigHandler::Handler(no_op),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    // SAFETY: the handler is async-signal-safe (it does nothing).
    if unsafe { sigaction(Signal::SIGWINCH, &act) }.is_err() {
        return false;
    }
    let (held_tx, held_rx) = mpsc::channel();
    *slot.0.lock() = Some(held_tx);
    let (tid_tx, tid_rx) = mpsc::channel();
    let path = mountpoint.join(PROBE_NAME);
    let waiter = std::thread::Builder::new()
        .name("fuse-interrupt-probe".into())
        .spawn(move || {
            // SAFETY: pthread_self has no preconditions.
            let _ = tid_tx.send(unsafe { libc::pthread_self() });
            let _ = std::fs::symlink_metadata(&path);
        });
    let Ok(waiter) = waiter else {
        slot.0.lock().take();
        return false;
    };
    let ok = match (tid_rx.recv(), held_rx.recv_timeout(Duration::from_secs(5))) {
        (Ok(tid), Ok(())) => {
            // SAFETY: `tid` is the waiter thread, alive until the join below.
            unsafe { libc::pthread_kill(tid, libc::SIGWINCH) == 0 }
        }
        _ => false,
    };
    slot.0.lock().take();
    let _ = waiter.join();
    ok
}
