//! A tiny HTTP/1.1 endpoint (no framework) on TCP or a unix socket:
//! `GET /metrics` (Prometheus text), `GET /status` (JSON), `GET /profile` (files read from each
//! layer, JSON) and `POST /profile/reset`. One request per connection. The client (`weenv status`, `weenv
//! profile`) is `weenv_snapshotter_api::client`.

use crate::config::ListenAddr;
use std::sync::Arc;
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tracing::debug;

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

/// The layer a `POST /verify/<digest>` request line names. Pure.
pub fn verify_target(request_line: &str) -> Option<String> {
    let mut parts = request_line.split_whitespace();
    let (method, path) = (parts.next()?, parts.next()?);
    let d = path.strip_prefix(weenv_snapshotter_api::verify::VERIFY_PATH)?;
    (method == "POST" && !d.is_empty()).then(|| d.to_string())
}

/// A response: status line, content type, body.
#[derive(Debug, PartialEq, Eq)]
pub struct Response {
    pub code: u16,
    pub content_type: &'static str,
    pub body: String,
}

/// Route one request line (`GET /metrics HTTP/1.1`). Pure.
pub fn route(request_line: &str, obs: &dyn Observable) -> Response {
    let mut parts = request_line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    match (method, path) {
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

fn reason(code: u16) -> &'static str {
    match code {
        200 => "OK",
        404 => "Not Found",
        409 => "Conflict",
        405 => "Method Not Allowed",
        _ => "Error",
    }
}

async fn handle<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, obs: Arc<dyn Observable>) {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    // Read until the end of the request head (bounded: 16 KiB).
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 16 << 10 {
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let head = String::from_utf8_lossy(&buf);
    let line = head.lines().next().unwrap_or("");
    debug!(line, "http request");
    let r = match verify_target(line) {
        Some(d) => obs.verify(d).await,
        None => route(line, obs.as_ref()),
    };
    let out = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
        r.code,
        reason(r.code),
        r.content_type,
        r.body.len(),
        r.body
    );
    let _ = s.write_all(out.as_bytes()).await;
    let _ = s.shutdown().await;
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
    match l {
        Listener::Tcp(l) => loop {
            if let Ok((s, _)) = l.accept().await {
                tokio::spawn(handle(s, obs.clone()));
            }
        },
        Listener::Unix(l) => loop {
            if let Ok((s, _)) = l.accept().await {
                tokio::spawn(handle(s, obs.clone()));
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weenv_snapshotter_api::client::get;

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
        assert_eq!(route("GET /metrics HTTP/1.1", &O).body, "m 1\n");
        assert_eq!(
            route("GET /status?x=1 HTTP/1.1", &O).content_type,
            "application/json"
        );
        assert_eq!(route("GET / HTTP/1.1", &O).code, 404);
        assert_eq!(route("POST /metrics HTTP/1.1", &O).code, 405);
        assert_eq!(route("GET /profile HTTP/1.1", &O).body, "{\"resets\":0}");
        assert_eq!(route("POST /profile/reset HTTP/1.1", &O).code, 200);
        assert_eq!(route("GET /profile HTTP/1.1", &O).body, "{\"resets\":1}");
        assert_eq!(route("", &O).code, 405);
        assert_eq!(
            verify_target("POST /verify/sha256:ab HTTP/1.1").as_deref(),
            Some("sha256:ab")
        );
        assert_eq!(verify_target("GET /verify/sha256:ab HTTP/1.1"), None);
        assert_eq!(verify_target("POST /verify/ HTTP/1.1"), None);
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
        let mut body = Err(std::io::Error::other("not started"));
        for _ in 0..100 {
            body = get(&addr, "/metrics").await;
            if body.is_ok() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(body.unwrap(), "m 1\n");
        assert!(get(&addr, "/nope").await.is_err());
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
