//! Credentials from docker credential helpers (`credHelpers` and `credsStore` in config.json)
//! reach the token server. One test per binary: it puts a fake `docker-credential-*` helper on
//! `PATH` before any thread starts.
#![allow(clippy::unwrap_used)]

use std::os::unix::fs::PermissionsExt;
use weenv_integration::registry::{CountingProxy, LocalRegistry, ProxyOptions, TokenAuth};
use weenv_registry::{Client, Digest, HostConfig, Reference, RegistryConfig};

#[test]
#[ignore = "needs docker-registry"]
fn credential_helpers_supply_basic_credentials() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = tmp.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for (name, user) in [("weenvtest", "alice"), ("weenvstore", "bob")] {
        let p = bin.join(format!("docker-credential-{name}"));
        // `get` reads the server URL on stdin and prints the credentials
        std::fs::write(
            &p,
            format!("#!/bin/sh\nread server\necho \"$server\" >> {}/asked-{name}\necho '{{\"ServerURL\":\"'$server'\",\"Username\":\"{user}\",\"Secret\":\"secret\"}}'\n", tmp.path().display()),
        )
        .unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // Single-threaded here: no other thread reads the environment yet.
    std::env::set_var("PATH", path);

    let reg = LocalRegistry::start(tmp.path()).unwrap();
    let front = |user: &str| {
        CountingProxy::start_with(
            reg.addr(),
            ProxyOptions {
                auth: Some(TokenAuth {
                    user: user.into(),
                    password: "secret".into(),
                    service: "svc".into(),
                    allow_anonymous: false,
                }),
                ..Default::default()
            },
        )
        .unwrap()
    };
    let (p_alice, p_bob) = (front("alice"), front("bob"));
    let docker = tmp.path().join("docker");
    std::fs::create_dir_all(&docker).unwrap();
    std::fs::write(
        docker.join("config.json"),
        format!(
            r#"{{"credHelpers":{{"{}":"weenvtest"}},"credsStore":"weenvstore"}}"#,
            p_alice.host()
        ),
    )
    .unwrap();
    let mut cfg = RegistryConfig {
        docker_config_dir: Some(docker),
        ..RegistryConfig::default()
    };
    for h in [p_alice.host(), p_bob.host()] {
        cfg.hosts.insert(
            h,
            HostConfig {
                plain_http: true,
                ..HostConfig::default()
            },
        );
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let client = Client::new(cfg).unwrap();
    let d = Digest::sha256(b"absent");
    for p in [&p_alice, &p_bob] {
        let r: Reference = format!("{}/x/y:1", p.host()).parse().unwrap();
        // 404 after a successful token exchange proves the helper's credentials were accepted
        assert_eq!(rt.block_on(client.head_blob(&r, &d)).unwrap(), None);
        let token_auth: Vec<_> = p
            .stats()
            .requests()
            .into_iter()
            .filter(|q| q.path.starts_with("/token"))
            .map(|q| (q.status, q.authorization.is_some()))
            .collect();
        assert_eq!(token_auth, vec![(200, true)]);
    }
    let asked = |n: &str| std::fs::read_to_string(tmp.path().join(format!("asked-{n}"))).unwrap();
    assert!(
        asked("weenvtest").contains(&p_alice.host()),
        "credHelpers entry used for its host"
    );
    assert!(
        asked("weenvstore").contains(&p_bob.host()),
        "credsStore used for other hosts"
    );
}
