//! HTTP clients per TLS setup: the built-in web roots, the OS CA bundle (as containerd trusts
//! it; `system_roots = true`), per-host `ca` files, and `skip_verify`.

use crate::config::RegistryConfig;
use crate::error::RegistryError;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where distributions keep the OS CA bundle (Debian/Ubuntu, Fedora/RHEL, Alpine/others).
pub const SYSTEM_CA_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

/// TLS settings that need their own HTTP client: (skip_verify, extra CA files).
pub(crate) type TlsKey = (bool, Vec<PathBuf>);

fn read_pem(path: &Path) -> Result<Vec<reqwest::Certificate>, RegistryError> {
    let pem = std::fs::read(path).map_err(|source| RegistryError::ConfigIo {
        path: path.display().to_string(),
        error: source,
    })?;
    let certs =
        reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| RegistryError::BadConfig {
            field: format!("ca {}", path.display()),
            reason: format!("not a PEM certificate bundle: {e}"),
        })?;
    if certs.is_empty() {
        return Err(RegistryError::BadConfig {
            field: format!("ca {}", path.display()),
            reason: "no PEM certificate in the file".into(),
        });
    }
    Ok(certs)
}

/// The OS CA bundle's certificates (empty, with a warning, when none is readable).
pub(crate) fn system_roots() -> Vec<reqwest::Certificate> {
    for p in SYSTEM_CA_BUNDLES {
        let p = Path::new(p);
        if p.is_file() {
            match read_pem(p) {
                Ok(c) => return c,
                Err(e) => tracing::warn!(error = %e, "ignoring the system CA bundle"),
            }
        }
    }
    Vec::new()
}

/// Build the client for one TLS setup. If the OS bundle makes the build fail (a certificate
/// rustls rejects), retry without it and warn: the built-in roots still apply.
pub(crate) fn build_http(
    config: &RegistryConfig,
    (insecure, ca): &TlsKey,
    system: &[reqwest::Certificate],
) -> Result<reqwest::Client, RegistryError> {
    let mut extra = Vec::new();
    for path in ca {
        extra.extend(read_pem(path)?);
    }
    let build = |with_system: bool| {
        let mut b = reqwest::Client::builder();
        if with_system {
            for c in system {
                b = b.add_root_certificate(c.clone());
            }
        }
        for c in &extra {
            b = b.add_root_certificate(c.clone());
        }
        b.redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_millis(config.connect_timeout_ms))
            .read_timeout(Duration::from_millis(config.read_timeout_ms))
            .user_agent(
                config
                    .user_agent
                    .clone()
                    .unwrap_or_else(|| format!("weenv/{}", env!("CARGO_PKG_VERSION"))),
            )
            .danger_accept_invalid_certs(*insecure)
            .build()
    };
    let err = |e: reqwest::Error| RegistryError::BadConfig {
        field: "http client".into(),
        reason: e.to_string(),
    };
    if system.is_empty() {
        return build(false).map_err(err);
    }
    build(true).or_else(|e| {
        tracing::warn!(error = %e, "the system CA bundle was rejected; using built-in roots only");
        build(false).map_err(err)
    })
}

/// Every TLS setup the config can produce (plus the defaults).
pub(crate) fn tls_keys(config: &RegistryConfig) -> std::collections::BTreeSet<TlsKey> {
    let mut keys = std::collections::BTreeSet::from([(false, Vec::new()), (true, Vec::new())]);
    for hc in config.hosts.values() {
        keys.insert((hc.skip_verify, hc.ca.clone()));
        for m in &hc.mirrors {
            keys.insert((m.skip_verify, m.ca.clone()));
        }
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_bundle_is_found_and_clients_build() {
        let system = system_roots();
        let on_debian = Path::new(SYSTEM_CA_BUNDLES[0]).is_file();
        assert_eq!(!system.is_empty(), on_debian);
        let c = RegistryConfig::default();
        build_http(&c, &(false, Vec::new()), &system).unwrap();
        // the OS bundle itself is accepted by rustls (no silent fallback here)
        let mut b = reqwest::Client::builder();
        for cert in &system {
            b = b.add_root_certificate(cert.clone());
        }
        b.build().unwrap();
        let d = tempfile::tempdir().unwrap();
        let junk = d.path().join("x.pem");
        std::fs::write(&junk, "junk").unwrap();
        assert!(matches!(
            build_http(&c, &(false, vec![junk]), &system),
            Err(RegistryError::BadConfig { .. })
        ));
        assert!(matches!(
            build_http(&c, &(false, vec![d.path().join("missing.pem")]), &system),
            Err(RegistryError::ConfigIo { .. })
        ));
    }
}
