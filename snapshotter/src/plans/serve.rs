//! The HTTP side of the plan endpoint: the read-only subset of the OCI distribution API a
//! puller uses (`GET /v2/`, `GET|HEAD /v2/<name>/manifests/<ref>`, `GET|HEAD
//! /v2/<name>/blobs/<digest>`), `?ns=<registry>` naming the registry as containerd's mirror
//! requests do. [`route`] decodes a request into a [`Route`] (pure); [`serve`] runs hyper.

use super::{BlobAnswer, ManifestAnswer, PlanServeError, PlanServer};
use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tracing::{debug, warn};
use weenv_format::Digest;

/// A decoded request.
#[derive(Debug, PartialEq, Eq)]
pub enum Route {
    /// `GET /v2/`: the API version check.
    Base,
    Manifest {
        ns: String,
        name: String,
        reference: String,
    },
    Blob {
        ns: String,
        name: String,
        digest: Digest,
    },
    /// Anything else: status and message.
    Refuse(u16, &'static str, String),
}

/// Decodes method, path and query (pure).
pub fn route(method: &Method, path: &str, query: Option<&str>) -> Route {
    if method != Method::GET && method != Method::HEAD {
        return Route::Refuse(
            405,
            "UNSUPPORTED",
            "this endpoint is read-only (pulls only)".into(),
        );
    }
    let Some(rest) = path.strip_prefix("/v2/") else {
        return Route::Refuse(
            404,
            "NAME_UNKNOWN",
            format!("not an OCI distribution path: {path}"),
        );
    };
    if rest.is_empty() {
        return Route::Base;
    }
    let ns = query
        .unwrap_or("")
        .split('&')
        .find_map(|kv| kv.strip_prefix("ns="))
        .map(|v| v.replace("%3A", ":").replace("%3a", ":"));
    let Some(ns) = ns.filter(|n| !n.is_empty()) else {
        return Route::Refuse(
            400,
            "UNSUPPORTED",
            "no ?ns=<registry>: reach this endpoint as a registry mirror (containerd hosts.toml), \
             which names the registry on every request"
                .into(),
        );
    };
    let split = |kind: &str| {
        rest.rsplit_once(kind)
            .filter(|(name, last)| !name.is_empty() && !last.is_empty() && !last.contains('/'))
            .map(|(name, last)| (name.to_string(), last.to_string()))
    };
    if let Some((name, reference)) = split("/manifests/") {
        return Route::Manifest {
            ns,
            name,
            reference,
        };
    }
    if let Some((name, d)) = split("/blobs/") {
        return match d.parse::<Digest>() {
            Ok(digest) => Route::Blob { ns, name, digest },
            Err(e) => Route::Refuse(400, "DIGEST_INVALID", format!("{d}: {e}")),
        };
    }
    Route::Refuse(404, "NAME_UNKNOWN", format!("not served here: {path}"))
}

/// A registry error response (`{"errors":[{"code","message"}]}`).
pub fn error_body(code: &str, message: &str) -> Bytes {
    Bytes::from(
        serde_json::json!({ "errors": [ { "code": code, "message": message } ] }).to_string(),
    )
}

fn response(status: u16, headers: &[(&str, String)], body: Bytes) -> Response<Full<Bytes>> {
    let mut b = Response::builder()
        .status(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header("Docker-Distribution-API-Version", "registry/2.0");
    for (k, v) in headers {
        b = b.header(*k, v);
    }
    b.body(Full::new(body))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

fn refuse(head: bool, status: u16, code: &str, msg: &str) -> Response<Full<Bytes>> {
    // A HEAD response has no body: containerd repeats a manifest HEAD answered 405 as a GET,
    // whose body carries the message.
    let status = if head && status != 404 { 405 } else { status };
    let body = if head {
        Bytes::new()
    } else {
        error_body(code, msg)
    };
    let mut r = response(status, &[("Content-Type", "application/json".into())], body);
    // Clients that print only the status line (containerd 1.6) show the message too.
    if let Ok(p) = hyper::ext::ReasonPhrase::try_from(reason_phrase(msg)) {
        r.extensions_mut().insert(p);
    }
    r
}

/// `msg` as an HTTP reason phrase: visible ASCII and spaces only, at most 400 bytes (pure).
pub fn reason_phrase(msg: &str) -> String {
    let mut s: String = msg
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                ' '
            }
        })
        .collect();
    s.truncate(400);
    s
}

fn failed(head: bool, e: &PlanServeError) -> Response<Full<Bytes>> {
    let (status, code) = e.status_code();
    warn!(error = %e, status, "plan endpoint request failed");
    refuse(head, status, code, &e.to_string())
}

impl PlanServer {
    /// Answers one request.
    pub async fn handle(
        &self,
        method: &Method,
        path: &str,
        query: Option<&str>,
    ) -> Response<Full<Bytes>> {
        let head = method == Method::HEAD;
        let body = |b: Bytes| if head { Bytes::new() } else { b };
        match route(method, path, query) {
            Route::Base => response(
                200,
                &[("Content-Type", "application/json".into())],
                body(Bytes::from_static(b"{}")),
            ),
            Route::Refuse(status, code, msg) => refuse(head, status, code, &msg),
            Route::Manifest {
                ns,
                name,
                reference,
            } => match self.manifest(&ns, &name, &reference).await {
                Ok(ManifestAnswer::Plan(p)) => response(
                    200,
                    &[
                        ("Content-Type", Self::MANIFEST_MEDIA_TYPE.into()),
                        ("Content-Length", p.manifest_json.len().to_string()),
                        ("Docker-Content-Digest", p.manifest_digest.to_string()),
                    ],
                    body(p.manifest_json.clone()),
                ),
                Ok(ManifestAnswer::Passthrough(m)) => response(
                    200,
                    &[
                        ("Content-Type", m.media_type.clone()),
                        ("Content-Length", m.bytes.len().to_string()),
                        ("Docker-Content-Digest", m.digest.to_string()),
                    ],
                    body(m.bytes),
                ),
                Err(e) => failed(head, &e),
            },
            Route::Blob { ns, name, digest } => match self.blob(&ns, &name, &digest) {
                Ok(BlobAnswer::Bytes(media_type, b)) => response(
                    200,
                    &[
                        ("Content-Type", media_type.into()),
                        ("Content-Length", b.len().to_string()),
                        ("Docker-Content-Digest", digest.to_string()),
                    ],
                    body(b),
                ),
                Ok(BlobAnswer::Redirect(url)) => {
                    debug!(%digest, %url, "blob redirected to its registry");
                    response(307, &[("Location", url)], Bytes::new())
                }
                Err(e) => failed(head, &e),
            },
        }
    }
}

/// Serves `listener` forever (spawned by the daemon).
pub async fn serve(server: Arc<PlanServer>, listener: TcpListener) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                warn!(error = %e, "plan endpoint: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let me = server.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let me = me.clone();
                async move {
                    let (m, p, q) = (
                        req.method().clone(),
                        req.uri().path().to_string(),
                        req.uri().query().map(str::to_string),
                    );
                    Ok::<_, Infallible>(me.handle(&m, &p, q.as_deref()).await)
                }
            });
            crate::http::serve_http1(stream, svc).await;
        });
    }
}
