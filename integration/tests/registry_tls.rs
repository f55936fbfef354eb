//! TLS is the default and is verified; a registry with a private CA works when the host is
//! configured with that `ca` or with `skip_verify` (directly or through a containerd
//! `hosts.toml`), and plain HTTP is never tried unless configured.
#![allow(clippy::unwrap_used)]

use weenv_integration::registry::LocalRegistry;
use weenv_registry::{Bytes, Client, Digest, HostConfig, Reference, RegistryConfig, RegistryError};

fn cfg(host: Option<(&str, HostConfig)>) -> RegistryConfig {
    let mut c = RegistryConfig {
        docker_credentials: false,
        ..RegistryConfig::default()
    };
    c.retry.max_retries = 0;
    if let Some((h, hc)) = host {
        c.hosts.insert(h.to_string(), hc);
    }
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs docker-registry and openssl"]
async fn tls_verified_by_default_skip_verify_per_host() {
    let tmp = tempfile::tempdir().unwrap();
    let reg = LocalRegistry::start_tls(tmp.path()).unwrap();
    let host = reg.host();
    let r: Reference = format!("{host}/tls/app:1").parse().unwrap();
    let blob = b"over tls".to_vec();
    let d = Digest::sha256(&blob);

    // default: https with verification -> the self-signed certificate is rejected
    let strict = Client::new(cfg(None)).unwrap();
    match strict.head_blob(&r, &d).await {
        Err(RegistryError::Transport { url, .. }) => assert!(url.starts_with("https://"), "{url}"),
        other => panic!("expected a TLS verification failure, got {other:?}"),
    }
    // plain_http against a TLS server is an HTTP error, not a silent switch to TLS
    let plain = Client::new(cfg(Some((
        &host,
        HostConfig {
            plain_http: true,
            ..HostConfig::default()
        },
    ))))
    .unwrap();
    assert!(plain.head_blob(&r, &d).await.is_err());

    // skip_verify: works
    let insecure = Client::new(cfg(Some((
        &host,
        HostConfig {
            skip_verify: true,
            ..HostConfig::default()
        },
    ))))
    .unwrap();
    insecure
        .push_blob(&r, &d, Bytes::from(blob.clone()))
        .await
        .unwrap();
    assert_eq!(
        insecure.get_blob(&r, &d).await.unwrap(),
        Bytes::from(blob.clone())
    );
    assert_eq!(
        insecure.get_blob_range(&r, &d, 5, 3).await.unwrap(),
        Bytes::from_static(b"tls")
    );

    // the test CA configured for the host: verified TLS works
    let ca = reg.ca_cert().unwrap();
    let trusted = Client::new(cfg(Some((
        &host,
        HostConfig {
            ca: vec![ca.clone()],
            ..HostConfig::default()
        },
    ))))
    .unwrap();
    assert_eq!(
        trusted.get_blob(&r, &d).await.unwrap(),
        Bytes::from(blob.clone())
    );

    // a ca path that is not PEM is a config error naming the file
    let junk = tmp.path().join("junk.pem");
    std::fs::write(&junk, "not pem").unwrap();
    let err = Client::new(cfg(Some((
        &host,
        HostConfig {
            ca: vec![junk],
            ..HostConfig::default()
        },
    ))));
    assert!(
        matches!(
            err,
            Err(RegistryError::BadConfig { .. }) | Err(RegistryError::ConfigIo { .. })
        ),
        "{err:?}"
    );

    // the same through a containerd hosts.toml (relative ca path)
    let certs = tmp.path().join("certs.d");
    std::fs::create_dir_all(certs.join(&host)).unwrap();
    std::fs::copy(&ca, certs.join(&host).join("ca.crt")).unwrap();
    std::fs::write(
        certs.join(&host).join("hosts.toml"),
        format!("server = \"https://{host}\"\nca = \"ca.crt\"\n"),
    )
    .unwrap();
    let via_hosts = Client::new(RegistryConfig {
        hosts_dir: Some(certs.clone()),
        ..cfg(None)
    })
    .unwrap();
    assert_eq!(
        via_hosts.head_blob(&r, &d).await.unwrap(),
        Some(blob.len() as u64)
    );

    // and skip_verify through hosts.toml
    std::fs::write(
        certs.join(&host).join("hosts.toml"),
        format!("server = \"https://{host}\"\nskip_verify = true\n"),
    )
    .unwrap();
    let via_hosts = Client::new(RegistryConfig {
        hosts_dir: Some(certs),
        ..cfg(None)
    })
    .unwrap();
    assert_eq!(
        via_hosts.head_blob(&r, &d).await.unwrap(),
        Some(blob.len() as u64)
    );
}
