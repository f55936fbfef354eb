//! Harness utilities: free loopback ports, precondition checks, process guards, waiting for
//! sockets, and locating binaries built by cargo in this workspace.

use anyhow::{bail, Context, Result};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

/// A TCP port on 127.0.0.1 that was free a moment ago, chosen below the kernel's ephemeral
/// range (`net.ipv4.ip_local_port_range`): a port from that range, once released, can be taken
/// by any outgoing connection's source port (or another `bind(0)`) before the service we start
/// binds it, and the registry or daemon then fails to listen. Ports below the range are only
/// ever taken by an explicit bind, so the remaining race is with another test choosing the same
/// random port in the same instant, which the bind check below narrows further.
pub fn free_port() -> Result<u16> {
    use std::hash::BuildHasher;
    let low = ephemeral_low().unwrap_or(32768);
    let (lo, hi) = (10_000u16, low.max(10_001));
    // Every RandomState differs (random keys per process, bumped per instance).
    let random = std::collections::hash_map::RandomState::new();
    for attempt in 0..256u32 {
        let port = lo + (random.hash_one(attempt) % u64::from(hi - lo)) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    let l = TcpListener::bind("127.0.0.1:0").context("binding 127.0.0.1:0 to find a free port")?;
    Ok(l.local_addr()?.port())
}

fn ephemeral_low() -> Option<u16> {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    range.split_whitespace().next()?.parse().ok()
}

/// True when running as root (effective uid 0).
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Find `name` on `$PATH`.
pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Fail (not skip) unless the binaries are on `$PATH`.
pub fn require_bins(bins: &[&str]) -> Result<()> {
    let missing: Vec<&str> = bins
        .iter()
        .copied()
        .filter(|b| which(b).is_none())
        .collect();
    if !missing.is_empty() {
        bail!(
            "this test needs {} on PATH (Debian packages: see scripts/deps.sh); missing: {}",
            bins.join(", "),
            missing.join(", ")
        );
    }
    Ok(())
}

/// What an end-to-end test with a private registry, containerd and the busybox test image needs
/// on `$PATH` (for [`require_root_and_bins`]): [`E2E_FUSE_BINS`] without `fusermount3`.
pub const E2E_BINS: &[&str] = E2E_FUSE_BINS.split_at(E2E_FUSE_BINS.len() - 1).0;

/// [`E2E_BINS`] plus `fusermount3` (last), for tests that also start the FUSE snapshotter.
pub const E2E_FUSE_BINS: &[&str] = &[
    "containerd",
    "ctr",
    "runc",
    "docker-registry",
    "skopeo",
    "umoci",
    "fusermount3",
];

/// Fail (not skip) unless running as root and the binaries are on `$PATH`.
pub fn require_root_and_bins(bins: &[&str]) -> Result<()> {
    if !is_root() {
        bail!(
            "this test needs root (run the ignored tests as root: cargo test -- --include-ignored)"
        );
    }
    require_bins(bins)
}

/// Owns a child process: kills (SIGKILL) and reaps it on drop.
#[derive(Debug)]
pub struct ChildGuard {
    child: Option<Child>,
    name: String,
}

impl ChildGuard {
    /// Guard `child`, named `name` in messages.
    pub fn new(name: &str, child: Child) -> Self {
        ChildGuard {
            child: Some(child),
            name: name.to_string(),
        }
    }

    /// Process id.
    pub fn id(&self) -> u32 {
        self.child.as_ref().map_or(0, |c| c.id())
    }

    /// Error if the process has already exited (e.g. failed to start).
    pub fn check_running(&mut self) -> Result<()> {
        if let Some(c) = self.child.as_mut() {
            if let Some(st) = c.try_wait()? {
                bail!("{} exited early with {st}", self.name);
            }
        }
        Ok(())
    }

    /// Kill and reap now.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Poll until something accepts TCP connections at `addr` (or fail after `timeout`).
pub fn wait_for_tcp(addr: SocketAddr, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("nothing listening on {addr} after {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Poll until a unix socket at `path` accepts connections (or fail after `timeout`).
pub fn wait_for_unix_socket(path: &Path, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "unix socket {} not accepting connections after {timeout:?}",
                path.display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The cargo target directory of this workspace (`$CARGO_TARGET_DIR`, else `<workspace>/target`).
pub fn target_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(d);
    }
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("target")
}

/// Path of a binary built by cargo in this workspace (`target/debug/<name>`); fails with the
/// `cargo build -p ...` hint when it is missing. (`CARGO_BIN_EXE_*` only covers the
/// integration crate's own binaries.)
pub fn workspace_bin(name: &str) -> Result<PathBuf> {
    let profile = std::env::var("WEENV_PROFILE").unwrap_or_else(|_| "debug".to_string());
    let p = target_dir().join(profile).join(name);
    if !p.is_file() {
        bail!(
            "binary {} not found: build it first (cargo build --bin {name})",
            p.display()
        );
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_and_waits() {
        let p = free_port().unwrap();
        assert_ne!(p, 0);
        let l = TcpListener::bind(("127.0.0.1", p)).unwrap();
        wait_for_tcp(l.local_addr().unwrap(), Duration::from_secs(5)).unwrap();
        drop(l);
        let d = tempfile::tempdir().unwrap();
        assert!(wait_for_unix_socket(&d.path().join("nope"), Duration::from_millis(100)).is_err());
        let sock = d.path().join("s");
        let _u = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        wait_for_unix_socket(&sock, Duration::from_secs(5)).unwrap();
    }

    #[test]
    fn guard_kills_child() {
        let child = std::process::Command::new("sleep")
            .arg("1000")
            .spawn()
            .unwrap();
        let pid = child.id();
        let mut g = ChildGuard::new("sleep", child);
        g.check_running().unwrap();
        drop(g);
        // Signal 0 only checks existence.
        let alive = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None).is_ok();
        assert!(!alive, "child {pid} still exists after drop");
    }

    #[test]
    fn missing_bins_fail_loudly() {
        let e = require_bins(&["weenv-definitely-missing-bin"]).unwrap_err();
        assert!(e.to_string().contains("weenv-definitely-missing-bin"));
        assert!(require_bins(&["sh"]).is_ok());
    }

    #[test]
    fn e2e_bin_lists() {
        assert!(E2E_BINS.contains(&"umoci") && !E2E_BINS.contains(&"fusermount3"));
        assert_eq!(E2E_FUSE_BINS, [E2E_BINS, &["fusermount3"]].concat());
    }

    #[test]
    fn free_ports_are_below_the_ephemeral_range_and_bindable() -> Result<()> {
        let low = ephemeral_low().unwrap_or(32768);
        let ports: Vec<u16> = (0..8).map(|_| free_port()).collect::<Result<_>>()?;
        for &p in &ports {
            assert!((10_000..low).contains(&p), "port {p} not in 10000..{low}");
            TcpListener::bind(("127.0.0.1", p))?;
        }
        let distinct: std::collections::HashSet<_> = ports.iter().collect();
        assert!(distinct.len() > 1, "the same port every call: {ports:?}");
        Ok(())
    }
}
