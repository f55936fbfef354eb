//! Bearer-token auth end to end: the counting proxy plays a token-auth registry front
//! (401 + `WWW-Authenticate: Bearer realm=...`, `/token` with Basic credentials), the client
//! reads credentials from a temp docker `config.json`.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use weenv_integration::registry::{
    base64_encode, CountingProxy, LocalRegistry, ProxyOptions, TokenAuth,
};
use weenv_registry::{Bytes, Client, Digest, HostConfig, Reference, RegistryConfig, RegistryError};

fn config(host: &str, docker_dir: &Path) -> RegistryConfig {
    let mut c = RegistryConfig {
        docker_config_dir: Some(docker_dir.to_path_buf()),
        ..RegistryConfig::default()
    };
    c.hosts.insert(
        host.to_string(),
        HostConfig {
            plain_http: true,
            ..HostConfig::default()
        },
    );
    c
}

/// Writes a docker `config.json` under `dir` (created) with `user:password` for `host`;
/// returns `dir`.
fn docker_config(dir: &Path, host: &str, user_password: &[u8]) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join("config.json"),
        format!(
            r#"{{"auths":{{"{host}":{{"auth":"{}"}}}}}}"#,
            base64_encode(user_password)
        ),
    )
    .unwrap();
    dir.to_path_buf()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs docker-registry"]
async fn bearer_token_flow_with_docker_config_credentials() {
    let tmp = tempfile::tempdir().unwrap();
    let reg = LocalRegistry::start(tmp.path()).unwrap();
    let proxy = CountingProxy::start_with(
        reg.addr(),
        ProxyOptions {
            auth: Some(TokenAuth {
                user: "alice".into(),
                password: "secret".into(),
                service: "weenv-test".into(),
                allow_anonymous: false,
            }),
            ..Default::default()
        },
    )
    .unwrap();
    let host = proxy.host();
    let docker = docker_config(&tmp.path().join("docker"), &host, b"alice:secret");
    let client = Client::new(config(&host, &docker)).unwrap();
    let r: Reference = format!("{host}/team/app:1").parse().unwrap();
    let blob = b"hello token auth".to_vec();
    let d = Digest::sha256(&blob);
    let st = proxy.stats();

    // push: anonymous HEAD -> 401 -> token (Basic, scope pull,push) -> HEAD -> POST -> PUT
    client
        .push_blob(&r, &d, Bytes::from(blob.clone()))
        .await
        .unwrap();
    let seen: Vec<_> = st
        .requests()
        .into_iter()
        .map(|q| {
            (
                q.method,
                q.path
                    .split('?')
                    .next()
                    .unwrap()
                    .split("/uploads/")
                    .next()
                    .unwrap()
                    .to_string(),
                q.status,
                q.authorization,
            )
        })
        .collect();
    let blob_path = format!("/v2/team/app/blobs/{d}");
    assert_eq!(seen.len(), 5, "{seen:#?}");
    assert_eq!(
        (
            seen[0].0.as_str(),
            seen[0].1.as_str(),
            seen[0].2,
            seen[0].3.as_deref()
        ),
        ("HEAD", blob_path.as_str(), 401, None)
    );
    assert_eq!(
        (seen[1].0.as_str(), seen[1].1.as_str(), seen[1].2),
        ("GET", "/token", 200)
    );
    assert_eq!(seen[1].3.as_deref(), Some("Basic YWxpY2U6c2VjcmV0"));
    let token_req = &st.requests()[1].path;
    assert!(
        token_req.contains("service=weenv-test")
            && token_req.contains("scope=repository%3Ateam%2Fapp%3Apull%2Cpush"),
        "{token_req}"
    );
    assert_eq!(
        (seen[2].0.as_str(), seen[2].2, seen[2].3.as_deref()),
        ("HEAD", 404, Some("Bearer tok-1"))
    );
    assert_eq!(
        (seen[3].0.as_str(), seen[3].2, seen[3].3.as_deref()),
        ("POST", 202, Some("Bearer tok-1"))
    );
    assert_eq!(
        (seen[4].0.as_str(), seen[4].2, seen[4].3.as_deref()),
        ("PUT", 201, Some("Bearer tok-1"))
    );
    assert_eq!(client.stats().token_requests, 1);
    assert_eq!(client.stats().auth_retries, 1);

    // pull scope: the challenge is known, so the token is fetched before the request (no 401)
    st.clear();
    assert_eq!(
        client.get_blob(&r, &d).await.unwrap(),
        Bytes::from(blob.clone())
    );
    let seen: Vec<_> = st
        .requests()
        .into_iter()
        .map(|q| (q.method, q.status, q.authorization))
        .collect();
    assert_eq!(
        seen,
        vec![
            (
                "GET".to_string(),
                200,
                Some("Basic YWxpY2U6c2VjcmV0".to_string())
            ),
            ("GET".to_string(), 200, Some("Bearer tok-2".to_string())),
        ]
    );
    // cached: no more token requests for either scope
    st.clear();
    client.get_blob_range(&r, &d, 6, 5).await.unwrap();
    assert_eq!(
        client.head_blob(&r, &d).await.unwrap(),
        Some(blob.len() as u64)
    );
    client
        .push_blob(&r, &d, Bytes::from(blob.clone()))
        .await
        .unwrap();
    assert!(st
        .requests()
        .iter()
        .all(|q| !q.path.starts_with("/token") && q.status != 401));
    assert_eq!(client.stats().token_requests, 2);

    // wrong credentials: a typed error naming the realm
    let bad_docker = docker_config(&tmp.path().join("bad"), &host, b"alice:wrong");
    let bad = Client::new(config(&host, &bad_docker)).unwrap();
    match bad.get_blob(&r, &d).await {
        Err(RegistryError::Token { realm, .. }) => assert!(realm.ends_with("/token")),
        other => panic!("expected a token error, got {other:?}"),
    }
    // no credentials at all: the anonymous token request is refused too
    let anon = Client::new(RegistryConfig {
        docker_credentials: false,
        ..config(&host, &bad_docker)
    })
    .unwrap();
    assert!(matches!(
        anon.head_blob(&r, &d).await,
        Err(RegistryError::Token { .. })
    ));
}

/// Concurrent first requests share one token fetch; a rejected token is replaced once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs docker-registry"]
async fn concurrent_requests_fetch_one_token() {
    let tmp = tempfile::tempdir().unwrap();
    let reg = LocalRegistry::start(tmp.path()).unwrap();
    let auth = TokenAuth {
        user: "u".into(),
        password: "p".into(),
        service: "svc".into(),
        allow_anonymous: true,
    };
    let proxy = CountingProxy::start_with(
        reg.addr(),
        ProxyOptions {
            auth: Some(auth),
            ..Default::default()
        },
    )
    .unwrap();
    let host = proxy.host();
    let empty = tmp.path().join("nodocker");
    let client = Client::new(config(&host, &empty)).unwrap();
    let r: Reference = format!("{host}/c/d:1").parse().unwrap();
    let blob: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    let d = Digest::sha256(&blob);
    client
        .push_blob(&r, &d, Bytes::from(blob.clone()))
        .await
        .unwrap();
    let st = proxy.stats();
    st.clear();
    let fresh = Client::new(config(&host, &empty)).unwrap();
    let mut tasks = Vec::new();
    for i in 0..16u64 {
        let (c, r, d) = (fresh.clone(), r.clone(), d.clone());
        tasks.push(tokio::spawn(async move {
            c.get_blob_range(&r, &d, i * 1000, 100).await
        }));
    }
    for (i, t) in tasks.into_iter().enumerate() {
        let got = t.await.unwrap().unwrap();
        assert_eq!(&got[..], &blob[i * 1000..i * 1000 + 100]);
    }
    let token_reqs = st
        .requests()
        .iter()
        .filter(|q| q.path.starts_with("/token"))
        .count();
    assert_eq!(
        token_reqs,
        1,
        "one token for 16 concurrent requests: {:#?}",
        st.summary()
    );
    assert_eq!(fresh.stats().token_requests, 1);
}
