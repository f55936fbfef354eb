//! A private registry for tests: Debian's `docker-registry` (distribution 2.8) on a free
//! loopback port with storage under a temp dir ([`LocalRegistry`]), and a counting HTTP/1.1
//! proxy in front of it ([`CountingProxy`]) that records every request (method, path, Range,
//! status, bytes) and can play a bearer-token auth server, redirect blob GETs, or ignore
//! Range, to test the client's behaviour against exactly what was sent on the wire.
//!
//! The proxy runs on its own thread with its own tokio runtime, so it works from sync and
//! async tests alike; dropping it stops it.

use crate::util::{free_port, require_bins, wait_for_tcp, ChildGuard};
use anyhow::{Context, Result};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

mod proxy;
pub use proxy::{base64_encode, CountingProxy, ProxyOptions, ProxyRequest, ProxyStats, TokenAuth};

/// A running `docker-registry serve` (killed on drop).
#[derive(Debug)]
pub struct LocalRegistry {
    addr: SocketAddr,
    root: PathBuf,
    _child: ChildGuard,
}

impl LocalRegistry {
    /// Start a registry with storage under `tmp/registry` (deletes enabled), listening on
    /// 127.0.0.1 at a free port; its log goes to `tmp/registry/registry.log`.
    pub fn start(tmp: &Path) -> Result<LocalRegistry> {
        Self::start_inner(tmp, false)
    }

    /// Like [`LocalRegistry::start`], but serving HTTPS for `127.0.0.1` with a certificate
    /// from a fresh test CA ([`LocalRegistry::ca_cert`]), made with the `openssl` CLI.
    pub fn start_tls(tmp: &Path) -> Result<LocalRegistry> {
        Self::start_inner(tmp, true)
    }

    fn start_inner(tmp: &Path, tls: bool) -> Result<LocalRegistry> {
        require_bins(&["docker-registry"])?;
        let root = tmp.join("registry");
        std::fs::create_dir_all(root.join("data"))?;
        let port = free_port()?;
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let config = format!(
            "version: 0.1\nlog:\n  level: info\n  formatter: text\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {addr}\n",
            root.join("data").display()
        );
        let config = if tls {
            let (cert, key) = make_test_pki(&root)?;
            format!(
                "{config}  tls:\n    certificate: {}\n    key: {}\n",
                cert.display(),
                key.display()
            )
        } else {
            config
        };
        let cfg_path = root.join("config.yml");
        std::fs::write(&cfg_path, config)?;
        let log = std::fs::File::create(root.join("registry.log"))?;
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&cfg_path)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("spawning docker-registry")?;
        let mut guard = ChildGuard::new("docker-registry", child);
        wait_for_tcp(addr, Duration::from_secs(20)).with_context(|| {
            format!(
                "docker-registry did not start; see {}",
                root.join("registry.log").display()
            )
        })?;
        guard.check_running()?;
        Ok(LocalRegistry {
            addr,
            root,
            _child: guard,
        })
    }

    /// Listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `127.0.0.1:PORT`, the registry part of references.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    /// The test CA certificate (PEM) of a registry from [`LocalRegistry::start_tls`].
    pub fn ca_cert(&self) -> Option<PathBuf> {
        Some(self.root.join("ca.pem")).filter(|p| p.is_file())
    }

    /// Directory holding config, data and log.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Pushes `image` (skopeo, [`crate::images::push_oci_layout`]) to this registry as
    /// `repo_tag` (`busybox:1`); returns the full reference `127.0.0.1:PORT/repo_tag`.
    pub fn push(&self, image: &crate::images::OciImage, repo_tag: &str) -> Result<String> {
        let reference = format!("{}/{repo_tag}", self.host());
        crate::images::push_oci_layout(image, &reference)?;
        Ok(reference)
    }
}

/// A test CA and a server certificate for 127.0.0.1 signed by it, under `dir`:
/// `ca.pem`, `cert.pem`, `key.pem`. Returns (cert, key).
fn make_test_pki(dir: &Path) -> Result<(PathBuf, PathBuf)> {
    require_bins(&["openssl"])?;
    let run = |args: &[&str]| -> Result<()> {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .context("running openssl")?;
        anyhow::ensure!(
            out.status.success(),
            "openssl {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut ca = vec!["req", "-x509"];
    ca.extend(ec);
    ca.extend([
        "-days",
        "2",
        "-subj",
        "/CN=weenv test CA",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    ]);
    run(&ca)?;
    let mut csr = vec!["req"];
    csr.extend(ec);
    csr.extend([
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        "key.pem",
        "-out",
        "server.csr",
    ]);
    run(&csr)?;
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
    )?;
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "server.ext",
        "-out",
        "cert.pem",
    ])?;
    Ok((dir.join("cert.pem"), dir.join("key.pem")))
}
