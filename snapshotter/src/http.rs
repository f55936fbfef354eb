//! The observability endpoint on TCP or a unix socket (`observability.listen`), served with
//! hyper like the peer and plan endpoints: `GET /metrics` (Prometheus text), `GET /status`
//! (JSON), `GET /profile` (files read from each layer, JSON), `POST /profile/reset` and `POST
//! /verify/<layer digest>`. [`route`] decides the answer (pure), [`serve`] runs hyper. The
//! client (`weenv status`, `weenv profile`, `weenv metrics`) is `weenv_snapshotter_api::client`.

use crate::config::ListenAddr;
use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, StatusCode};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncWrite};
use tracing::{debug, warn};

/// Endpoint errors.
#[derive(Debug, Error)]
pub enum HttpError {
    #[error("cannot serve /status and /metrics on {addr} (config observability.listen): {reason}; stop what holds it, or set observability.listen to a free address (\"\" disables the endpoint)")]
    Bind { addr: String, reason: String },
}

/// What the endpoint exposes.
pub trait Observable: Send + Sync + 'static {
    /// Prometheus text exposition.
    fn metrics_text(&self) -> String;
    /// Status as JSON.
    fn status_json(&self) -> String;
    /// Files read from each mounted layer since it was mounted or the last reset, as JSON
    /// (a [`crate::status::ProfileReport`]).
    fn profile_json(&self) -> String;
    /// Forget the files read so far (start recording a new workload).
    fn reset_profile(&self);
    /// `POST /verify/<layer digest>`: fetch the layer in full now and check it (a
    /// `weenv_snapshotter_api::verify::VerifyReport`, JSON).
    fn verify(&self, digest: String) -> futures::future::BoxFuture<'static, Response> {
        Box::pin(async move {
            Response {
                code: 404,
                content_type: "text/plain",
                body: format!("layer {digest}: verification is not served here\n"),
            }
        })
    }
}

/// The layer a `POST /verify/<digest>` request names. Pure.
pub fn verify_target(method: &Method, path: &str) -> Option<String> {
    let d = path.strip_prefix(weenv_snapshotter_api::verify::VERIFY_PATH)?;
    (method == Method::POST && !d.is_empty()).then(|| d.to_string())
}

/// A response: status line, content type, body.
#[derive(Debug, PartialEq, Eq)]
pub struct Response {
    pub code: u16,
    pub content_type: &'static str,
    pub body: String,
}

/// Route one request (method and path, without the query). Pure but for what `obs` reads.
pub fn route(method: &Method, path: &str, obs: &dyn Observable) -> Response {
    match (method.as_str(), path) {
        ("GET", "/metrics") => Response {
            code: 200,
            content_type: "text/plain; version=0.0.4",
            body: obs.metrics_text(),
        },
        ("GET", "/status") => Response {
            code: 200,
            content_type: "application/json",
            body: obs.status_json(),
        },
        ("GET", "/profile") => Response {
            code: 200,
            content_type: "application/json",
            body: obs.profile_json(),
        },
        ("POST", "/profile/reset") => {
            obs.reset_profile();
            Response {
                code: 200,
                content_type: "text/plain",
                body: "profile reset\n".into(),
            }
        }
        ("GET", _) => Response {
            code: 404,
            content_type: "text/plain",
            body: "not found: try /metrics, /status or /profile\n".into(),
        },
        _ => Response {
            code: 405,
            content_type: "text/plain",
            body: "only GET (and POST /profile/reset) is supported\n".into(),
        },
    }
}

/// The answer to one request: `POST /verify/<digest>` goes to the layer provider, the rest to
/// [`route`].
async fn answer(
    req: Request<hyper::body::Incoming>,
    obs: Arc<dyn Observable>,
) -> hyper::Response<Full<Bytes>> {
    let (method, path) = (req.method(), req.uri().path());
    debug!(%method, path, "http request");
    let r = match verify_target(method, path) {
        Some(d) => obs.verify(d).await,
        None => route(method, path, obs.as_ref()),
    };
    let mut resp = hyper::Response::new(Full::new(Bytes::from(r.body)));
    *resp.status_mut() = StatusCode::from_u16(r.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if let Ok(v) = HeaderValue::from_str(r.content_type) {
        resp.headers_mut().insert(CONTENT_TYPE, v);
    }
    resp
}

/// Serve the requests of one connection (HTTP/1.1, keep-alive).
async fn serve_connection<S>(s: S, obs: Arc<dyn Observable>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |req| {
        let obs = obs.clone();
        async move { Ok::<_, Infallible>(answer(req, obs).await) }
    });
    serve_http1(s, svc).await;
}

/// How long a client may take to send a request head.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Serve the HTTP/1.1 requests of one connection with `svc` (keep-alive; each request head
/// must arrive within 30 s). The one way the daemon's HTTP endpoints (this one, the peer
/// endpoint `peer::serve` and the plan endpoint `plans::serve`) run hyper.
pub(crate) async fn serve_http1<I, S, B>(io: I, svc: S)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: hyper::service::HttpService<hyper::body::Incoming, ResBody = B>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: hyper::body::Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(hyper_util::rt::TokioIo::new(io), svc)
        .await;
}

/// A bound endpoint, not yet serving.
#[derive(Debug)]
pub enum Listener {
    Tcp(tokio::net::TcpListener),
    Unix(tokio::net::UnixListener),
}

/// Bind `addr`; the daemon does this before anything else, so a taken address stops it at
/// start. A unix socket file is replaced only when nothing answers on it (left by a dead
/// daemon); a live one is "in use".
pub async fn bind(addr: &ListenAddr) -> Result<Listener, HttpError> {
    let fail = |reason: String| HttpError::Bind {
        addr: addr.to_string(),
        reason,
    };
    match addr {
        ListenAddr::Tcp(a) => tokio::net::TcpListener::bind(a)
            .await
            .map(Listener::Tcp)
            .map_err(|e| fail(e.to_string())),
        ListenAddr::Unix(p) => {
            if tokio::net::UnixStream::connect(p).await.is_ok() {
                return Err(fail("a running process answers on this socket".into()));
            }
            let _ = std::fs::remove_file(p);
            tokio::net::UnixListener::bind(p)
                .map(Listener::Unix)
                .map_err(|e| fail(e.to_string()))
        }
    }
}

/// Serve requests on `l` forever (spawned by the daemon).
pub async fn serve(l: Listener, obs: Arc<dyn Observable>) {
    loop {
        let accepted = match &l {
            Listener::Tcp(l) => l.accept().await.map(|(s, _)| {
                tokio::spawn(serve_connection(s, obs.clone()));
            }),
            Listener::Unix(l) => l.accept().await.map(|(s, _)| {
                tokio::spawn(serve_connection(s, obs.clone()));
            }),
        };
        if let Err(e) = accepted {
            warn!(error = %e, "observability endpoint: accept failed");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weenv_snapshotter_api::client::{get, request};

    struct Fake(std::sync::atomic::AtomicU32);
    impl Observable for Fake {
        fn metrics_text(&self) -> String {
            "m 1\n".into()
        }
        fn status_json(&self) -> String {
            "{}".into()
        }
        fn profile_json(&self) -> String {
            format!(
                "{{\"resets\":{}}}",
                self.0.load(std::sync::atomic::Ordering::Relaxed)
            )
        }
        fn reset_profile(&self) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
    static O: Fake = Fake(std::sync::atomic::AtomicU32::new(0));

    #[test]
    fn routes() {
        let (get, post) = (&Method::GET, &Method::POST);
        assert_eq!(route(get, "/metrics", &O).body, "m 1\n");
        assert_eq!(route(get, "/status", &O).content_type, "application/json");
        assert_eq!(route(get, "/", &O).code, 404);
        assert_eq!(route(post, "/metrics", &O).code, 405);
        assert_eq!(route(get, "/profile", &O).body, "{\"resets\":0}");
        assert_eq!(route(post, "/profile/reset", &O).code, 200);
        assert_eq!(route(get, "/profile", &O).body, "{\"resets\":1}");
        assert_eq!(route(&Method::PUT, "", &O).code, 405);
        assert_eq!(
            verify_target(post, "/verify/sha256:ab").as_deref(),
            Some("sha256:ab")
        );
        assert_eq!(verify_target(get, "/verify/sha256:ab"), None);
        assert_eq!(verify_target(post, "/verify/"), None);
    }

    #[tokio::test]
    async fn serves_over_unix_socket() {
        let d = tempfile::tempdir().unwrap();
        let addr = ListenAddr::Unix(d.path().join("s.sock"));
        let l = bind(&addr).await.unwrap();
        let t = tokio::spawn(serve(
            l,
            Arc::new(Fake(std::sync::atomic::AtomicU32::new(0))),
        ));
        let mut body = get(&addr, "/metrics").await;
        for _ in 0..100 {
            body = get(&addr, "/metrics").await;
            if body.is_ok() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(body.unwrap(), "m 1\n");
        assert_eq!(get(&addr, "/status?x=1").await.unwrap(), "{}");
        let err = get(&addr, "/nope").await.unwrap_err().to_string();
        assert_eq!(err, "/nope: HTTP/1.1 404 Not Found");
        let n = request(&addr, "POST", "/profile/reset").await.unwrap();
        assert_eq!(n, "profile reset\n");
        assert_eq!(get(&addr, "/profile").await.unwrap(), "{\"resets\":1}");
        // A daemon that is not there: the message names the address and the config key.
        let gone = ListenAddr::Unix(d.path().join("gone.sock"));
        let err = get(&gone, "/status").await.unwrap_err().to_string();
        assert!(err.contains("observability.listen"), "{err}");
        t.abort();
    }

    #[tokio::test]
    async fn a_taken_address_is_an_error_naming_it_and_the_config_key() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = taken.local_addr().unwrap();
        let err = bind(&ListenAddr::Tcp(a)).await.unwrap_err().to_string();
        assert!(err.contains(&a.to_string()), "{err}");
        assert!(err.contains("observability.listen"), "{err}");

        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("s.sock");
        let live = bind(&ListenAddr::Unix(p.clone())).await.unwrap();
        let err = bind(&ListenAddr::Unix(p.clone()))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains(&format!("unix:{}", p.display())), "{err}");
        drop(live);
        // The socket file of a dead listener is replaced.
        assert!(p.exists());
        bind(&ListenAddr::Unix(p)).await.unwrap();
    }
}
