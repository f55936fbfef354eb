//! Client behaviour against a scripted HTTP/1.1 server on 127.0.0.1 (no registry needed):
//! retries, the 401 refresh rule, token caching, range slicing, digest checks.

use crate::auth::{Credential, CredentialSource};
use crate::config::{HostConfig, RegistryConfig};
use crate::error::RegistryError;
use crate::reference::Reference;
use crate::retry::RetryPolicy;
use crate::Client;
use bytes::Bytes;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use weenv_format::Digest;

/// A canned answer: status, headers, body; or drop the connection.
#[derive(Clone)]
enum Answer {
    Http(u16, Vec<(&'static str, String)>, Vec<u8>),
    /// 200 with `Content-Length: .0` but only the bytes `.1`, then close.
    Truncated(u64, Vec<u8>),
    Reset,
}

fn ok(body: &[u8]) -> Answer {
    Answer::Http(200, vec![], body.to_vec())
}

/// 401 asking for Basic credentials.
fn basic_challenge() -> Answer {
    Answer::Http(
        401,
        vec![("WWW-Authenticate", "Basic realm=\"r\"".into())],
        vec![],
    )
}

fn status(code: u16) -> Answer {
    Answer::Http(code, vec![], b"{\"errors\":[]}".to_vec())
}

#[derive(Clone, Debug)]
struct Seen {
    method: String,
    path: String,
    headers: HashMap<String, String>,
    body: Vec<u8>,
}

struct Mock {
    host: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

async fn mock(answers: Vec<Answer>) -> Mock {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let host = l.local_addr().unwrap().to_string();
    let queue = Arc::new(Mutex::new(VecDeque::from(answers)));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((sock, _)) = l.accept().await else {
                return;
            };
            let (q, seen) = (queue.clone(), s2.clone());
            tokio::spawn(async move {
                let (r, mut w) = sock.into_split();
                let mut r = BufReader::new(r);
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).await.unwrap_or(0) == 0 {
                        return;
                    }
                    let mut it = line.split_whitespace();
                    let (method, path) = (
                        it.next().unwrap_or("").to_string(),
                        it.next().unwrap_or("").to_string(),
                    );
                    let mut headers = HashMap::new();
                    loop {
                        let mut h = String::new();
                        r.read_line(&mut h).await.unwrap();
                        let h = h.trim_end();
                        if h.is_empty() {
                            break;
                        }
                        if let Some((k, v)) = h.split_once(':') {
                            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
                        }
                    }
                    let len: usize = headers
                        .get("content-length")
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0);
                    let mut body = vec![0; len];
                    r.read_exact(&mut body).await.unwrap();
                    seen.lock().unwrap().push(Seen {
                        method: method.clone(),
                        path,
                        headers,
                        body,
                    });
                    let answer = q.lock().unwrap().pop_front().unwrap_or(status(500));
                    match answer {
                        Answer::Reset => return,
                        Answer::Truncated(claimed, body) => {
                            let mut out =
                                format!("HTTP/1.1 200 OK\r\nContent-Length: {claimed}\r\n\r\n")
                                    .into_bytes();
                            out.extend_from_slice(&body);
                            let _ = w.write_all(&out).await;
                            return;
                        }
                        Answer::Http(code, hs, body) => {
                            let mut out =
                                format!("HTTP/1.1 {code} X\r\nContent-Length: {}\r\n", body.len());
                            for (k, v) in hs {
                                out.push_str(&format!("{k}: {v}\r\n"));
                            }
                            out.push_str("\r\n");
                            let mut out = out.into_bytes();
                            if method != "HEAD" {
                                out.extend_from_slice(&body);
                            }
                            if w.write_all(&out).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    Mock { host, seen }
}

impl Mock {
    /// `cred` for this mock's host.
    fn creds(&self, cred: Credential) -> CredentialSource {
        CredentialSource::Static(HashMap::from([(self.host.clone(), cred)]))
    }
    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
    fn client(&self, creds: CredentialSource) -> Client {
        let mut c = RegistryConfig {
            retry: RetryPolicy {
                max_retries: 3,
                base_delay_ms: 1,
                max_delay_ms: 5,
                ..RetryPolicy::default()
            },
            ..RegistryConfig::default()
        };
        c.hosts.insert(
            self.host.clone(),
            HostConfig {
                plain_http: true,
                ..HostConfig::default()
            },
        );
        Client::with_credentials(c, creds).unwrap()
    }
    fn reference(&self) -> Reference {
        format!("{}/a/b:t", self.host).parse().unwrap()
    }
}

#[tokio::test]
async fn retries_5xx_429_and_resets_but_not_4xx() {
    let blob = b"blob!".to_vec();
    let d = Digest::sha256(&blob);
    let m = mock(vec![
        status(503),
        Answer::Http(429, vec![("Retry-After", "0".into())], vec![]),
        Answer::Reset,
        ok(&blob),
        status(404),
        status(400),
    ])
    .await;
    let c = m.client(CredentialSource::None);
    assert_eq!(
        c.get_blob(&m.reference(), &d).await.unwrap(),
        Bytes::from(blob)
    );
    assert_eq!(c.stats().retries, 3);
    assert_eq!(c.stats().gets, 4);
    assert!(matches!(
        c.get_blob(&m.reference(), &d).await,
        Err(RegistryError::NotFound { .. })
    ));
    match c.get_blob(&m.reference(), &d).await {
        Err(RegistryError::Status { status: 400, .. }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(m.seen().len(), 6, "4xx are not retried");
    assert_eq!(c.stats().retries, 3);
}

#[tokio::test]
async fn gives_up_after_max_retries() {
    let m = mock(vec![
        status(500),
        status(502),
        status(503),
        status(504),
        ok(b"late"),
    ])
    .await;
    let c = m.client(CredentialSource::None);
    let r = c.get_blob(&m.reference(), &Digest::sha256(b"late")).await;
    assert!(
        matches!(r, Err(RegistryError::Status { status: 504, .. })),
        "{r:?}"
    );
    assert_eq!(m.seen().len(), 4);
}

#[tokio::test]
async fn patch_is_not_retried() {
    let m = mock(vec![
        status(404),
        Answer::Http(
            202,
            vec![("Location", "/v2/a/b/blobs/uploads/u1".into())],
            vec![],
        ),
        status(500),
    ])
    .await;
    let c = m.client(CredentialSource::None);
    let data = vec![7u8; 100];
    let r = c
        .push_blob_chunked(&m.reference(), &Digest::sha256(&data), &data[..], 64)
        .await;
    assert!(
        matches!(r, Err(RegistryError::Status { status: 500, .. })),
        "{r:?}"
    );
    let methods: Vec<_> = m.seen().into_iter().map(|s| s.method).collect();
    assert_eq!(methods, ["HEAD", "POST", "PATCH"]);
    assert_eq!(m.seen()[1].headers["content-length"], "0");
    assert_eq!(m.seen()[2].headers["content-range"], "0-63");
}

#[tokio::test]
async fn basic_auth_401_is_retried_once() {
    let basic = basic_challenge;
    let m = mock(vec![basic(), basic(), basic(), basic()]).await;
    let c = m.client(m.creds(Credential::Basic {
        username: "u".into(),
        password: "p".into(),
    }));
    let r = c.head_blob(&m.reference(), &Digest::sha256(b"x")).await;
    assert!(
        matches!(r, Err(RegistryError::Unauthorized { .. })),
        "{r:?}"
    );
    let seen = m.seen();
    assert_eq!(seen.len(), 2, "one anonymous try, one with credentials");
    assert!(!seen[0].headers.contains_key("authorization"));
    assert_eq!(seen[1].headers["authorization"], "Basic dTpw");
}

#[tokio::test]
async fn bearer_token_is_cached_per_scope() {
    let tokm = mock(vec![ok(br#"{"token":"T1","expires_in":300}"#)]).await;
    let challenge_tok = format!(
        "Bearer realm=\"http://{}/token\",service=\"svc\"",
        tokm.host
    );
    let m2 = mock(vec![
        Answer::Http(401, vec![("WWW-Authenticate", challenge_tok)], vec![]),
        ok(b"1"),
        ok(b"2"),
    ])
    .await;
    let c = m2.client(CredentialSource::None);
    let r = m2.reference();
    assert_eq!(
        &c.get_blob_range(&r, &Digest::sha256(b"z"), 0, 1)
            .await
            .unwrap()[..],
        b"1"
    );
    assert_eq!(
        &c.get_blob_range(&r, &Digest::sha256(b"z"), 0, 1)
            .await
            .unwrap()[..],
        b"2"
    );
    let seen = m2.seen();
    assert_eq!(seen.len(), 3);
    assert_eq!(seen[1].headers["authorization"], "Bearer T1");
    assert_eq!(seen[2].headers["authorization"], "Bearer T1");
    assert_eq!(seen[2].headers["range"], "bytes=0-0");
    let tok = tokm.seen();
    assert_eq!(tok.len(), 1, "token fetched once");
    assert_eq!(
        tok[0].path,
        "/token?service=svc&scope=repository%3Aa%2Fb%3Apull"
    );
    assert!(
        !tok[0].headers.contains_key("authorization"),
        "anonymous token request"
    );
    assert_eq!(c.stats().token_requests, 1);
}

#[tokio::test]
async fn full_body_for_range_is_sliced_and_digests_are_checked() {
    let m = mock(vec![ok(b"0123456789"), ok(b"0123456789"), ok(b"tampered")]).await;
    let c = m.client(CredentialSource::None);
    let r = m.reference();
    let d = Digest::sha256(b"0123456789");
    assert_eq!(&c.get_blob_range(&r, &d, 3, 4).await.unwrap()[..], b"3456");
    assert_eq!(&c.get_blob_range(&r, &d, 8, 2).await.unwrap()[..], b"89");
    assert_eq!(c.stats().full_body_for_range, 2);
    assert!(matches!(
        c.get_blob(&r, &d).await,
        Err(RegistryError::DigestMismatch { .. })
    ));
}

#[tokio::test]
async fn resolve_falls_back_to_get_without_digest_header() {
    let body = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[]}"#;
    let mt = ("Content-Type", crate::manifest::OCI_INDEX.to_string());
    let m = mock(vec![
        Answer::Http(200, vec![mt.clone()], body.to_vec()),
        Answer::Http(200, vec![mt], body.to_vec()),
    ])
    .await;
    let c = m.client(CredentialSource::None);
    let desc = c.resolve(&m.reference()).await.unwrap();
    assert_eq!(desc.digest, Digest::sha256(body));
    assert_eq!(desc.size, body.len() as u64);
    assert_eq!(desc.media_type, crate::manifest::OCI_INDEX);
    let seen = m.seen();
    assert_eq!(
        (seen[0].method.as_str(), seen[1].method.as_str()),
        ("HEAD", "GET")
    );
    assert!(seen[0].headers["accept"].contains("application/vnd.oci.image.manifest.v1+json"));
}

#[tokio::test]
async fn range_reader_refuses_current_thread_runtime() {
    use weenv_format::RangeRead;
    let c = Client::new(RegistryConfig {
        docker_credentials: false,
        ..RegistryConfig::default()
    })
    .unwrap();
    let rr = crate::BlobRangeReader::new(
        c,
        tokio::runtime::Handle::current(),
        "127.0.0.1:1/a:b".parse().unwrap(),
        Digest::sha256(b"x"),
    );
    let e = rr.read_at(0, 1).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::Unsupported);
    assert_eq!(
        rr.with_size(9).size().unwrap(),
        9,
        "a known size needs no request"
    );
}

#[tokio::test]
async fn tls_is_the_default_no_silent_downgrade() {
    let m = mock(vec![ok(b"x"), ok(b"x"), ok(b"x"), ok(b"x"), ok(b"x")]).await;
    let c = Client::new(RegistryConfig {
        docker_credentials: false,
        retry: RetryPolicy {
            max_retries: 0,
            base_delay_ms: 1,
            max_delay_ms: 1,
            ..RetryPolicy::default()
        },
        ..RegistryConfig::default()
    })
    .unwrap();
    let r = c.get_blob(&m.reference(), &Digest::sha256(b"x")).await;
    match r {
        Err(RegistryError::Transport { url, .. }) => assert!(url.starts_with("https://"), "{url}"),
        other => panic!("expected a TLS failure, got {other:?}"),
    }
}

#[tokio::test]
async fn redirect_keeps_range_and_drops_authorization_off_host() {
    let storage = mock(vec![Answer::Http(
        206,
        vec![("Content-Range", "bytes 2-4/10".into())],
        b"234".to_vec(),
    )])
    .await;
    let m = mock(vec![
        basic_challenge(),
        Answer::Http(
            307,
            vec![(
                "Location",
                format!("http://{}/bucket/blob?sig=1", storage.host),
            )],
            vec![],
        ),
    ])
    .await;
    let c = m.client(m.creds(Credential::Basic {
        username: "u".into(),
        password: "p".into(),
    }));
    let got = c
        .get_blob_range(&m.reference(), &Digest::sha256(b"0123456789"), 2, 3)
        .await
        .unwrap();
    assert_eq!(&got[..], b"234");
    let at_registry = m.seen();
    assert_eq!(at_registry[1].headers["authorization"], "Basic dTpw");
    let at_storage = storage.seen();
    assert_eq!(at_storage.len(), 1);
    assert_eq!(at_storage[0].path, "/bucket/blob?sig=1");
    assert_eq!(at_storage[0].headers["range"], "bytes=2-4");
    assert!(
        !at_storage[0].headers.contains_key("authorization"),
        "no credentials to the storage host"
    );
    assert_eq!(c.stats().redirects, 1);
}

#[tokio::test]
async fn blob_stream_resumes_after_a_broken_body() {
    let blob = b"0123456789".to_vec();
    let d = Digest::sha256(&blob);
    let m = mock(vec![
        Answer::Truncated(10, b"01234".to_vec()),
        Answer::Http(
            206,
            vec![("Content-Range", "bytes 5-9/10".into())],
            b"56789".to_vec(),
        ),
    ])
    .await;
    let c = m.client(CredentialSource::None);
    let mut out = Vec::new();
    let n = c
        .get_blob_stream(&m.reference(), &d, &mut out)
        .await
        .unwrap();
    assert_eq!((n, out), (10, blob));
    let seen = m.seen();
    assert_eq!(seen.len(), 2);
    assert!(!seen[0].headers.contains_key("range"));
    assert_eq!(seen[1].headers["range"], "bytes=5-");
}

#[tokio::test]
async fn identity_token_uses_oauth2_refresh() {
    let tokm = mock(vec![ok(br#"{"access_token":"A1"}"#)]).await;
    let challenge = format!(
        "Bearer realm=\"http://{}/oauth\",service=\"svc\"",
        tokm.host
    );
    let m = mock(vec![
        Answer::Http(401, vec![("WWW-Authenticate", challenge)], vec![]),
        ok(b"x"),
    ])
    .await;
    let c = m.client(m.creds(Credential::IdentityToken("R-1".into())));
    assert_eq!(
        c.head_blob(&m.reference(), &Digest::sha256(b"x"))
            .await
            .unwrap(),
        Some(1)
    );
    let t = tokm.seen();
    assert_eq!(
        (t[0].method.as_str(), t[0].path.as_str()),
        ("POST", "/oauth")
    );
    let body = String::from_utf8(t[0].body.clone()).unwrap();
    assert_eq!(
        body,
        "grant_type=refresh_token&client_id=weenv&refresh_token=R-1&service=svc&scope=repository%3Aa%2Fb%3Apull"
    );
    assert_eq!(m.seen()[1].headers["authorization"], "Bearer A1");
}

#[tokio::test]
async fn no_cache_range_asks_the_origin_before_the_mirror() {
    let mirror = mock(vec![ok(b"XXXXXXXXXX")]).await;
    let origin = mock(vec![ok(b"0123456789")]).await;
    let mut cfg = origin.client(CredentialSource::None).inner.config.clone();
    cfg.hosts
        .get_mut(&origin.host)
        .unwrap()
        .mirrors
        .push(crate::config::MirrorConfig {
            url: format!("http://{}", mirror.host),
            capabilities: vec![crate::config::Capability::Pull],
            skip_verify: false,
            override_path: false,
            ca: vec![],
        });
    let c = Client::with_credentials(cfg, CredentialSource::None).unwrap();
    let r = origin.reference();
    let d = Digest::sha256(b"0123456789");
    // An ordinary read is served by the mirror (its bytes are wrong here).
    assert_eq!(&c.get_blob_range(&r, &d, 2, 3).await.unwrap()[..], b"XXX");
    // The refetch goes to the origin, asking caches on the way to revalidate.
    assert_eq!(
        &c.try_get_blob_range(&r, &d, 2, 3, true).await.unwrap()[..],
        b"234"
    );
    let seen = origin.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].headers.get("cache-control").map(String::as_str),
        Some("no-cache")
    );
    assert_eq!(mirror.seen().len(), 1);
}

#[tokio::test]
async fn range_reads_have_one_budget_and_404_is_not_retried() {
    let m = mock(vec![
        status(503),
        Answer::Http(429, vec![("Retry-After", "0".into())], vec![]),
        Answer::Reset,
        Answer::Http(
            206,
            vec![("Content-Range", "bytes 2-4/10".into())],
            b"234".to_vec(),
        ),
        status(404),
        status(500),
        status(500),
        status(500),
        status(500),
        status(500),
        ok(b"never"),
    ])
    .await;
    let c = m.client(CredentialSource::None);
    let (r, d) = (m.reference(), Digest::sha256(b"0123456789"));
    assert_eq!(&c.get_blob_range(&r, &d, 2, 3).await.unwrap()[..], b"234");
    assert_eq!((m.seen().len(), c.stats().retries), (4, 3));
    assert!(matches!(
        c.get_blob_range(&r, &d, 2, 3).await,
        Err(RegistryError::NotFound { .. })
    ));
    assert_eq!(m.seen().len(), 5, "a 404 is one request");
    // always 5xx: 1 + max_retries (3 here) requests, not 4 x 4
    assert!(matches!(
        c.get_blob_range(&r, &d, 2, 3).await,
        Err(RegistryError::Status { status: 500, .. })
    ));
    assert_eq!(m.seen().len(), 9);
}
