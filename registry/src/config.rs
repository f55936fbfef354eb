//! `RegistryConfig`: per-host transport settings (TLS, plain HTTP, mirrors), timeouts, retries
//! and where credentials come from; plus a loader for containerd-style `hosts.toml` directories
//! (`<dir>/<host>/hosts.toml`, as in `/etc/containerd/certs.d`).
//!
//! Endpoint selection is the pure function [`RegistryConfig::endpoints`]: for an operation
//! needing a [`Capability`], the mirrors that have it, in configured order, then the origin.
//! TLS is the default (built-in web roots plus per-host `ca` files; `skip_verify` per host);
//! plain HTTP is used only for a host configured with `plain_http = true` or an `http://`
//! server/mirror URL (never a silent downgrade, not even for 127.0.0.1). Mirrors get
//! containerd's `?ns=<registry>` query parameter.

use crate::error::RegistryError;
use crate::reference::{DOCKER_HUB, DOCKER_HUB_API};
use crate::retry::RetryPolicy;
use reqwest::Url;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// What an endpoint may be used for (containerd's `capabilities`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Capability {
    /// Fetch blobs and manifests by digest.
    Pull,
    /// Resolve tags to digests.
    Resolve,
    /// Upload.
    Push,
}

fn default_mirror_caps() -> Vec<Capability> {
    vec![Capability::Pull, Capability::Resolve]
}

/// A mirror tried before the origin.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MirrorConfig {
    /// `http://host:port` or `https://host[/path]`; `/v2` is appended unless `override_path`.
    pub url: String,
    /// Operations this mirror serves (default `["pull", "resolve"]`).
    #[serde(default = "default_mirror_caps")]
    pub capabilities: Vec<Capability>,
    /// Accept any TLS certificate from this mirror (default false).
    #[serde(default)]
    pub skip_verify: bool,
    /// Use the URL path as the API root instead of appending `/v2` (default false).
    #[serde(default)]
    pub override_path: bool,
    /// Extra CA certificates (PEM files) trusted for this mirror, besides the built-in roots.
    #[serde(default)]
    pub ca: Vec<PathBuf>,
}

/// Settings of one registry host (keyed by the registry name as written in references,
/// `127.0.0.1:5000`, `docker.io`; `_default` applies to hosts without an entry).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostConfig {
    /// Origin URL; default `https://<host>` (`https://registry-1.docker.io` for docker.io), or
    /// `http://<host>` with `plain_http`.
    #[serde(default)]
    pub server: Option<String>,
    /// Talk plain HTTP to the origin (default false).
    #[serde(default)]
    pub plain_http: bool,
    /// Accept any TLS certificate from the origin (default false).
    #[serde(default)]
    pub skip_verify: bool,
    /// Extra CA certificates (PEM files) trusted for the origin, besides the built-in roots.
    #[serde(default)]
    pub ca: Vec<PathBuf>,
    /// Mirrors tried in order before the origin (default none).
    #[serde(default)]
    pub mirrors: Vec<MirrorConfig>,
}

/// Client configuration (TOML/JSON, strict).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RegistryConfig {
    /// Config format version (must be 1).
    pub version: u32,
    /// Per-host settings; entries here win over `hosts_dir`.
    pub hosts: BTreeMap<String, HostConfig>,
    /// containerd `certs.d`-style directory read by [`RegistryConfig::load_hosts_dir`] at client
    /// creation (default none).
    pub hosts_dir: Option<PathBuf>,
    /// Read credentials from docker's `config.json` (default true).
    pub docker_credentials: bool,
    /// Trust the OS CA bundle (`/etc/ssl/certs/ca-certificates.crt`, ...) in addition to the
    /// built-in web roots, as containerd does (default true).
    pub system_roots: bool,
    /// Directory containing `config.json` (default `$DOCKER_CONFIG`, else `~/.docker`).
    pub docker_config_dir: Option<PathBuf>,
    /// Retry/backoff settings.
    pub retry: RetryPolicy,
    /// TCP+TLS connect timeout in milliseconds (default 10000).
    pub connect_timeout_ms: u64,
    /// Timeout for any single read from the connection in milliseconds (default 60000).
    pub read_timeout_ms: u64,
    /// User-Agent header (default `weenv/<version>`).
    pub user_agent: Option<String>,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        RegistryConfig {
            version: 1,
            hosts: BTreeMap::new(),
            hosts_dir: None,
            docker_credentials: true,
            system_roots: true,
            docker_config_dir: None,
            retry: RetryPolicy::default(),
            connect_timeout_ms: 10_000,
            read_timeout_ms: 60_000,
            user_agent: None,
        }
    }
}

/// One resolved place to send requests to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// API root, e.g. `http://127.0.0.1:5000/v2` (no trailing slash).
    pub api_root: String,
    /// `host[:port]` of the endpoint, used for credentials and token caching.
    pub host: String,
    /// Accept invalid TLS certificates.
    pub skip_verify: bool,
    /// Extra trusted CA certificate files.
    pub ca: Vec<PathBuf>,
    /// A mirror (fall through to the next endpoint on 404/5xx/transport errors).
    pub is_mirror: bool,
    /// For mirrors: the registry being mirrored, sent as `?ns=<registry>` like containerd
    /// does, so one pull-through cache (spegel, dragonfly, Harbor) can serve several upstreams.
    pub ns: Option<String>,
}

fn bad(field: impl Into<String>, reason: impl Into<String>) -> RegistryError {
    RegistryError::BadConfig {
        field: field.into(),
        reason: reason.into(),
    }
}

/// Parse an `http(s)://host[:port][/path]` URL into (api_root, host).
fn api_root(
    field: &str,
    url: &str,
    override_path: bool,
) -> Result<(String, String), RegistryError> {
    let u = Url::parse(url).map_err(|e| bad(field, format!("{url:?} is not a URL: {e}")))?;
    if u.scheme() != "http" && u.scheme() != "https" {
        return Err(bad(field, format!("{url:?}: scheme must be http or https")));
    }
    let host = u
        .host_str()
        .ok_or_else(|| bad(field, format!("{url:?} has no host")))?;
    let host = match u.port() {
        Some(p) => format!("{host}:{p}"),
        None => host.to_string(),
    };
    let path = u.path().trim_end_matches('/');
    let path = if override_path {
        path.to_string()
    } else {
        format!("{path}/v2")
    };
    Ok((format!("{}://{}{}", u.scheme(), host, path), host))
}

impl RegistryConfig {
    /// Parse a TOML config and validate it.
    pub fn from_toml(text: &str) -> Result<Self, RegistryError> {
        let c: RegistryConfig = toml::from_str(text).map_err(|e| bad("<toml>", e.to_string()))?;
        c.validate()?;
        Ok(c)
    }

    /// Check every field; the error names the offending one.
    pub fn validate(&self) -> Result<(), RegistryError> {
        if self.version != 1 {
            return Err(bad(
                "version",
                format!("unsupported version {} (expected 1)", self.version),
            ));
        }
        if self.connect_timeout_ms == 0 || self.read_timeout_ms == 0 {
            return Err(bad("connect_timeout_ms/read_timeout_ms", "must be > 0"));
        }
        if self.retry.base_delay_ms > self.retry.max_delay_ms {
            return Err(bad("retry.base_delay_ms", "must be <= retry.max_delay_ms"));
        }
        for (host, hc) in &self.hosts {
            if let Some(s) = &hc.server {
                let field = format!("hosts.{host:?}.server");
                api_root(&field, s, false)?;
                if hc.plain_http && s.starts_with("https://") {
                    return Err(bad(
                        field,
                        "plain_http = true conflicts with an https:// server",
                    ));
                }
            }
            for (i, m) in hc.mirrors.iter().enumerate() {
                api_root(
                    &format!("hosts.{host:?}.mirrors[{i}].url"),
                    &m.url,
                    m.override_path,
                )?;
                if m.capabilities.is_empty() {
                    return Err(bad(
                        format!("hosts.{host:?}.mirrors[{i}].capabilities"),
                        "empty",
                    ));
                }
            }
        }
        Ok(())
    }

    /// Host settings for `registry` (exact entry, else `_default`, else defaults).
    pub fn host(&self, registry: &str) -> HostConfig {
        self.hosts
            .get(registry)
            .or_else(|| self.hosts.get("_default"))
            .cloned()
            .unwrap_or_default()
    }

    /// Endpoints to try, in order, for an operation needing `cap` on `registry`.
    pub fn endpoints(
        &self,
        registry: &str,
        cap: Capability,
    ) -> Result<Vec<Endpoint>, RegistryError> {
        let hc = self.host(registry);
        let mut out = Vec::new();
        for (i, m) in hc.mirrors.iter().enumerate() {
            if m.capabilities.contains(&cap) {
                let (root, host) = api_root(
                    &format!("hosts.{registry:?}.mirrors[{i}].url"),
                    &m.url,
                    m.override_path,
                )?;
                out.push(Endpoint {
                    api_root: root,
                    host,
                    skip_verify: m.skip_verify,
                    ca: m.ca.clone(),
                    is_mirror: true,
                    ns: Some(registry.to_string()),
                });
            }
        }
        let api_host = if registry == DOCKER_HUB {
            DOCKER_HUB_API
        } else {
            registry
        };
        let server = match &hc.server {
            Some(s) => s.clone(),
            None if hc.plain_http => format!("http://{api_host}"),
            None => format!("https://{api_host}"),
        };
        let (mut root, mut host) = api_root(&format!("hosts.{registry:?}.server"), &server, false)?;
        if host == DOCKER_HUB {
            // containerd's rule: `server = "https://docker.io"` means the Hub's API host
            root = root.replacen(DOCKER_HUB, DOCKER_HUB_API, 1);
            host = DOCKER_HUB_API.to_string();
        }
        out.push(Endpoint {
            api_root: root,
            host,
            skip_verify: hc.skip_verify,
            ca: hc.ca.clone(),
            is_mirror: false,
            ns: None,
        });
        Ok(out)
    }

    /// Merge a `hosts.toml` directory into `hosts` (existing entries win).
    pub fn merge_hosts_dir(&mut self, dir: &Path) -> Result<(), RegistryError> {
        for (host, hc) in load_hosts_dir(dir)? {
            self.hosts.entry(host).or_insert(hc);
        }
        self.validate()
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HostsToml {
    server: Option<String>,
    capabilities: Option<Vec<Capability>>,
    skip_verify: Option<bool>,
    override_path: Option<bool>,
    ca: Option<OneOrMany>,
    #[serde(default)]
    host: toml::Table,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HostsTomlEntry {
    capabilities: Option<Vec<Capability>>,
    skip_verify: Option<bool>,
    override_path: Option<bool>,
    ca: Option<OneOrMany>,
}

/// containerd accepts `ca = "a.pem"` and `ca = ["a.pem", "b.pem"]`.
#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(PathBuf),
    Many(Vec<PathBuf>),
}

impl OneOrMany {
    fn into_vec(self) -> Vec<PathBuf> {
        match self {
            OneOrMany::One(p) => vec![p],
            OneOrMany::Many(v) => v,
        }
    }
}

/// Parse one containerd `hosts.toml` for registry `registry` into a [`HostConfig`].
/// Supported keys: `server`, `capabilities`, `skip_verify`, `ca` and `[host."URL"]` tables
/// with `capabilities` (default all three), `skip_verify`, `override_path`, `ca`, tried in
/// file order. `client` and `header` are rejected by name (client certificates and extra
/// headers are not supported). Relative `ca` paths are kept as written; [`load_hosts_dir`]
/// resolves them against the host's directory.
pub fn parse_hosts_toml(registry: &str, text: &str) -> Result<HostConfig, RegistryError> {
    let field = |f: &str| format!("hosts.toml of {registry}: {f}");
    let h: HostsToml = toml::from_str(text).map_err(|e| bad(field("syntax"), e.to_string()))?;
    let mut hc = HostConfig {
        server: h.server.clone(),
        plain_http: h
            .server
            .as_deref()
            .is_some_and(|s| s.starts_with("http://")),
        skip_verify: h.skip_verify.unwrap_or(false),
        ca: h.ca.map(OneOrMany::into_vec).unwrap_or_default(),
        mirrors: Vec::new(),
    };
    if h.override_path.unwrap_or(false) {
        return Err(bad(
            field("override_path"),
            "not supported for the server; use it on [host] entries",
        ));
    }
    if let Some(caps) = &h.capabilities {
        if !caps.contains(&Capability::Pull) {
            return Err(bad(
                field("capabilities"),
                "a server without pull is not supported",
            ));
        }
    }
    for (url, v) in h.host {
        let e: HostsTomlEntry = v
            .try_into()
            .map_err(|e: toml::de::Error| bad(field(&format!("host.{url:?}")), e.to_string()))?;
        hc.mirrors.push(MirrorConfig {
            url: url.clone(),
            capabilities: e
                .capabilities
                .unwrap_or_else(|| vec![Capability::Pull, Capability::Resolve, Capability::Push]),
            skip_verify: e.skip_verify.unwrap_or(false),
            override_path: e.override_path.unwrap_or(false),
            ca: e.ca.map(OneOrMany::into_vec).unwrap_or_default(),
        });
        api_root(&field(&format!("host.{url:?}")), &url, false)?;
    }
    Ok(hc)
}

/// Read `<dir>/<host>/hosts.toml` for every host directory under `dir`.
pub fn load_hosts_dir(dir: &Path) -> Result<BTreeMap<String, HostConfig>, RegistryError> {
    let io = |path: &Path, source| RegistryError::ConfigIo {
        path: path.display().to_string(),
        error: source,
    };
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir).map_err(|e| io(dir, e))? {
        let entry = entry.map_err(|e| io(dir, e))?;
        let file = entry.path().join("hosts.toml");
        if !file.is_file() {
            continue;
        }
        let host = entry.file_name().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&file).map_err(|e| io(&file, e))?;
        let mut hc = parse_hosts_toml(&host, &text)?;
        let base = entry.path();
        let abs = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        hc.ca.iter_mut().for_each(abs);
        hc.mirrors
            .iter_mut()
            .flat_map(|m| m.ca.iter_mut())
            .for_each(abs);
        out.insert(host.clone(), hc);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_tls_and_docker_hub_maps_to_api_host() {
        let c = RegistryConfig::default();
        let e = c.endpoints("127.0.0.1:5000", Capability::Pull).unwrap();
        assert_eq!(e.len(), 1);
        assert_eq!(
            e[0].api_root, "https://127.0.0.1:5000/v2",
            "no silent plain-http downgrade"
        );
        assert_eq!(e[0].host, "127.0.0.1:5000");
        let e = c.endpoints("docker.io", Capability::Pull).unwrap();
        assert_eq!(e[0].api_root, "https://registry-1.docker.io/v2");
    }

    #[test]
    fn toml_config_with_mirrors() {
        let c = RegistryConfig::from_toml(
            r#"
            version = 1
            [hosts."127.0.0.1:5000"]
            plain_http = true
            [[hosts."127.0.0.1:5000".mirrors]]
            url = "http://127.0.0.1:6000"
            [[hosts."127.0.0.1:5000".mirrors]]
            url = "https://m2.example/cache/"
            capabilities = ["pull"]
            skip_verify = true
            [hosts."_default"]
            skip_verify = true
            "#,
        )
        .unwrap();
        let roots = |cap| -> Vec<String> {
            c.endpoints("127.0.0.1:5000", cap)
                .unwrap()
                .into_iter()
                .map(|e| e.api_root)
                .collect()
        };
        assert_eq!(
            roots(Capability::Pull),
            [
                "http://127.0.0.1:6000/v2",
                "https://m2.example/cache/v2",
                "http://127.0.0.1:5000/v2"
            ]
        );
        assert_eq!(
            roots(Capability::Resolve),
            ["http://127.0.0.1:6000/v2", "http://127.0.0.1:5000/v2"]
        );
        assert_eq!(roots(Capability::Push), ["http://127.0.0.1:5000/v2"]);
        let e = c.endpoints("127.0.0.1:5000", Capability::Pull).unwrap();
        assert!(e[0].is_mirror && e[1].skip_verify && !e[2].is_mirror);
        assert!(
            c.endpoints("other:1", Capability::Pull).unwrap()[0].skip_verify,
            "_default applies"
        );
    }

    #[test]
    fn strict_validation_names_the_field() {
        for (text, field) in [
            ("version = 2", "version"),
            ("bogus = 1", "<toml>"),
            (
                "[hosts.\"h\"]\nplain_http = true\nserver = \"https://h\"",
                "server",
            ),
            (
                "[[hosts.\"h\".mirrors]]\nurl = \"ftp://m\"",
                "mirrors[0].url",
            ),
            ("[hosts.\"h\"]\nunknown = 1", "<toml>"),
        ] {
            match RegistryConfig::from_toml(text) {
                Err(RegistryError::BadConfig { field: f, .. }) => {
                    assert!(f.contains(field), "{text}: {f}")
                }
                other => panic!("{text}: {other:?}"),
            }
        }
    }

    #[test]
    fn hosts_toml_like_containerd() {
        let hc = parse_hosts_toml(
            "docker.io",
            r#"
            server = "https://registry-1.docker.io"
            [host."http://mirror-b:5000"]
              capabilities = ["pull", "resolve"]
            [host."https://mirror-a"]
              capabilities = ["pull"]
              skip_verify = true
            [host."https://mirror-c/some/path"]
              override_path = true
            "#,
        )
        .unwrap();
        assert_eq!(hc.mirrors.len(), 3);
        assert_eq!(
            hc.mirrors[0].url, "http://mirror-b:5000",
            "file order is kept"
        );
        assert_eq!(hc.mirrors[1].url, "https://mirror-a");
        assert!(hc.mirrors[1].skip_verify);
        assert_eq!(
            hc.mirrors[2].capabilities.len(),
            3,
            "default capabilities are all"
        );
        let mut c = RegistryConfig::default();
        c.hosts.insert("docker.io".into(), hc);
        let e = c.endpoints("docker.io", Capability::Resolve).unwrap();
        let roots: Vec<_> = e.iter().map(|e| e.api_root.as_str()).collect();
        assert_eq!(
            roots,
            [
                "http://mirror-b:5000/v2",
                "https://mirror-c/some/path",
                "https://registry-1.docker.io/v2"
            ]
        );
        let hc = parse_hosts_toml("docker.io", "server = \"https://docker.io\"").unwrap();
        c.hosts.insert("docker.io".into(), hc);
        let e = c.endpoints("docker.io", Capability::Pull).unwrap();
        assert_eq!(e[0].api_root, "https://registry-1.docker.io/v2");
        assert_eq!(e[0].host, "registry-1.docker.io");
        // plain http server
        let hc = parse_hosts_toml("r:1", "server = \"http://r:1\"").unwrap();
        assert!(hc.plain_http);
        // unsupported keys fail by name
        let err = parse_hosts_toml("r:1", "[host.\"https://m\"]\nclient = \"/x.pem\"").unwrap_err();
        assert!(err.to_string().contains("host.\"https://m\""), "{err}");
        assert!(parse_hosts_toml("r:1", "client = \"/x.pem\"").is_err());
        assert!(parse_hosts_toml("r:1", "[header]\nx = \"y\"").is_err());
        // ca: one or many
        let hc = parse_hosts_toml(
            "r:1",
            "ca = \"/a.pem\"\n[host.\"https://m\"]\nca = [\"b.pem\", \"/c.pem\"]",
        )
        .unwrap();
        assert_eq!(hc.ca, [PathBuf::from("/a.pem")]);
        assert_eq!(
            hc.mirrors[0].ca,
            [PathBuf::from("b.pem"), PathBuf::from("/c.pem")]
        );
    }

    #[test]
    fn hosts_dir_loader() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("127.0.0.1:5000")).unwrap();
        std::fs::write(
            d.path().join("127.0.0.1:5000/hosts.toml"),
            "server = \"http://127.0.0.1:5000\"\n[host.\"http://127.0.0.1:7000\"]\ncapabilities = [\"pull\"]\nca = \"m.pem\"\n",
        )
        .unwrap();
        std::fs::create_dir_all(d.path().join("empty")).unwrap();
        let mut c = RegistryConfig::default();
        c.merge_hosts_dir(d.path()).unwrap();
        assert_eq!(c.hosts.len(), 1);
        let e = c.endpoints("127.0.0.1:5000", Capability::Pull).unwrap();
        assert_eq!(e[0].api_root, "http://127.0.0.1:7000/v2");
        assert_eq!(e[1].api_root, "http://127.0.0.1:5000/v2");
        assert_eq!(
            e[0].ca,
            [d.path().join("127.0.0.1:5000/m.pem")],
            "relative to the host dir"
        );
        assert!(load_hosts_dir(&d.path().join("missing")).is_err());
    }
}
