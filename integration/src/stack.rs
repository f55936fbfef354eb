//! [`Stack`]: the usual end-to-end set-up in one builder. Under a fresh temp dir: a private
//! registry (optionally behind a counting proxy), a `weenv-snapshotter` daemon
//! ([`crate::daemon`]) with plain HTTP to it, and a containerd that uses the daemon as its
//! `weenv` proxy snapshotter. [`Stack::push_converted`] pushes a test image and converts it.
//!
//! ```text
//! let s = Stack::builder().proxy().start()?;
//! let img = s.push_converted(&images::busybox()?, "busybox").await?;
//! s.daemon.pull(s.ctd.address(), "lazy", &img.weenv)?;
//! ```
//!
//! The fields drop in order: containerd (and its containers) before the daemon, the daemon
//! (and its mounts) before the registry, the temp dir last.

use anyhow::Result;
use std::path::{Path, PathBuf};
use weenv_snapshotter_api::config::Config;

use crate::containerd::{Containerd, ContainerdOptions};
use crate::daemon::{Daemon, DaemonOptions};
use crate::images::OciImage;
use crate::registry::{CountingProxy, LocalRegistry};
use crate::util::{require_root_and_bins, E2E_FUSE_BINS};

type Configure = Box<dyn FnOnce(&mut Config)>;

/// How to build a [`Stack`]; [`Stack::builder`].
pub struct StackBuilder {
    bins: Vec<&'static str>,
    proxy: bool,
    fill: bool,
    fill_extra: String,
    hosts_toml: bool,
    use_containerd: bool,
    containerd: ContainerdOptions,
    configure: Vec<Configure>,
}

/// A registry, a daemon and a containerd using it.
pub struct Stack {
    pub ctd: Containerd,
    pub daemon: Daemon,
    pub proxy: Option<CountingProxy>,
    pub reg: LocalRegistry,
    pub tmp: tempfile::TempDir,
}

/// A test image in the stack's registry: the original and its weenv conversion.
pub struct Converted {
    /// `<host>/<repo>:gz`.
    pub gz: String,
    /// `<host>/<repo>:weenv`.
    pub weenv: String,
    pub report: weenv_converter::ImageReport,
}

impl StackBuilder {
    /// Binaries to require (with root) instead of [`E2E_FUSE_BINS`].
    pub fn require(mut self, bins: &[&'static str]) -> Self {
        self.bins = bins.to_vec();
        self
    }

    /// Put a [`CountingProxy`] in front of the registry; the daemon and the images use it.
    pub fn proxy(mut self) -> Self {
        self.proxy = true;
        self
    }

    /// Background fill on (default off: tests count the bytes a workload fetches).
    pub fn fill(mut self, on: bool) -> Self {
        self.fill = on;
        self
    }

    /// TOML keys merged into the daemon's `[fill]` table (see [`DaemonOptions::fill_extra`]).
    pub fn fill_extra(mut self, toml: &str) -> Self {
        self.fill_extra = toml.to_string();
        self
    }

    /// Tell the daemon about plain HTTP with a containerd-style `hosts.toml`
    /// (`server = "http://<host>"`) instead of `registry.plain_http`.
    pub fn via_hosts_toml(mut self) -> Self {
        self.hosts_toml = true;
        self
    }

    /// Point the daemon's `registry.containerd_socket` at the stack's containerd
    /// ([`Daemon::use_containerd`]).
    pub fn use_containerd(mut self) -> Self {
        self.use_containerd = true;
        self
    }

    /// containerd's options (its `proxy_snapshotter` is set to the daemon's socket).
    pub fn containerd(mut self, opts: ContainerdOptions) -> Self {
        self.containerd = opts;
        self
    }

    /// Change the daemon's config before it is written.
    pub fn configure(mut self, f: impl FnOnce(&mut Config) + 'static) -> Self {
        self.configure.push(Box::new(f));
        self
    }

    /// Check root and the binaries, start the registry (and proxy), the daemon under
    /// `<tmp>/snap`, and containerd.
    pub fn start(self) -> Result<Stack> {
        require_root_and_bins(&self.bins)?;
        let tmp = tempfile::tempdir()?;
        let reg = LocalRegistry::start(tmp.path())?;
        let proxy = if self.proxy {
            Some(CountingProxy::start(reg.addr())?)
        } else {
            None
        };
        let host = proxy
            .as_ref()
            .map_or_else(|| reg.host(), CountingProxy::host);
        let (plain_http, hosts_toml) = if self.hosts_toml {
            let toml = format!("server = \"http://{host}\"\n");
            (Vec::new(), vec![(host.clone(), toml)])
        } else {
            (vec![host.clone()], Vec::new())
        };
        let opts = DaemonOptions {
            plain_http,
            fill: self.fill,
            fill_extra: self.fill_extra,
        };
        let configure = self.configure;
        let daemon = Daemon::start_with(&tmp.path().join("snap"), &opts, &hosts_toml, |c| {
            for f in configure {
                f(c);
            }
        })?;
        let ctd = Containerd::start(ContainerdOptions {
            proxy_snapshotter: Some(daemon.socket.clone()),
            ..self.containerd
        })?;
        if self.use_containerd {
            daemon.use_containerd(&ctd)?;
        }
        Ok(Stack {
            ctd,
            daemon,
            proxy,
            reg,
            tmp,
        })
    }
}

impl Stack {
    /// The defaults: [`E2E_FUSE_BINS`], no proxy, fill off, plain HTTP by config.
    pub fn builder() -> StackBuilder {
        StackBuilder {
            bins: E2E_FUSE_BINS.to_vec(),
            proxy: false,
            fill: false,
            fill_extra: String::new(),
            hosts_toml: false,
            use_containerd: false,
            containerd: ContainerdOptions::default(),
            configure: Vec::new(),
        }
    }

    /// The registry host the daemon and the images use (the proxy's if there is one).
    pub fn host(&self) -> String {
        self.proxy
            .as_ref()
            .map_or_else(|| self.reg.host(), CountingProxy::host)
    }

    /// The proxy (fails if the stack was built without one).
    pub fn counting_proxy(&self) -> Result<&CountingProxy> {
        self.proxy
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("this stack has no counting proxy"))
    }

    /// A registry client with plain HTTP to the registry (and the proxy).
    pub fn client(&self) -> Result<weenv_registry::Client> {
        let mut hosts = vec![self.reg.host()];
        if let Some(p) = &self.proxy {
            hosts.push(p.host());
        }
        crate::convert::client(&hosts)
    }

    /// Push `image` as `<host>/<repo>:gz` and convert it to `<host>/<repo>:weenv`.
    pub async fn push_converted(&self, image: &OciImage, repo: &str) -> Result<Converted> {
        let host = self.host();
        let gz = format!("{host}/{repo}:gz");
        crate::images::push_oci_layout(image, &gz)?;
        let weenv = format!("{host}/{repo}:weenv");
        let report = crate::convert::convert(&self.client()?, &gz, &weenv).await?;
        Ok(Converted { gz, weenv, report })
    }

    /// A directory under the stack's temp dir (created).
    pub fn dir(&self, name: &str) -> Result<PathBuf> {
        let d = self.tmp.path().join(name);
        std::fs::create_dir_all(&d)?;
        Ok(d)
    }

    /// The temp dir everything lives under.
    pub fn root(&self) -> &Path {
        self.tmp.path()
    }
}
