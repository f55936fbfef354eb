//! [`PeerServer`]: the serving side of the peer tier, `POST /peer/v1/frames` on `peers.listen`
//! (HTTP/1.1 with keep-alive over hyper, the HTTP stack the daemon's gRPC server already
//! runs on; a separate listener from `/metrics` and `/status`).
//!
//! Read-only: a request can only read frames (from this node's caches, or fetched from the
//! registry through the node's own single flight, verified against the frame digests the
//! request names before they are cached or sent). Bounded: at most `max_concurrent` requests
//! and `max_bytes_in_flight` uncompressed bytes are served at once, more get `503` at once
//! (the asking peer goes to the registry); request bodies are at most
//! [`super::protocol::MAX_BODY`]; the optional shared token is compared in constant time.
//! Frames fetched on a peer's behalf come from a source without a [`RangeSource::locator`],
//! so they are never forwarded to another peer (no request loops).

use super::fetch_priority;
use super::protocol::{validate, FrameRequest, RequestLimits, ValidRequest, FRAMES_PATH, MAX_BODY};
use super::stats::PeerStats;
use crate::fetch::{FetchError, FrameStore, RangeSource};
use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use weenv_format::FrameIdx;
use weenv_registry::{
    Attempt, ByteRange, Client, ErrorKind, RegistryRangeSource, RetryPolicy, SourceError,
};

/// Settings of a [`PeerServer`].
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub limits: RequestLimits,
    pub token: Option<String>,
    pub max_concurrent: usize,
    pub max_bytes_in_flight: u64,
}

/// The serving side of the peer tier.
pub struct PeerServer {
    store: Arc<FrameStore>,
    registry: Client,
    cfg: ServerConfig,
    requests: Semaphore,
    /// One permit per KiB of uncompressed frame bytes being served.
    kib: Semaphore,
    stats: Arc<PeerStats>,
}

/// A registry blob read for a peer: no locator, so the frame store never asks peers for it.
struct OnBehalf(RegistryRangeSource);

#[async_trait]
impl RangeSource for OnBehalf {
    async fn try_read(&self, range: ByteRange, attempt: Attempt) -> Result<Bytes, SourceError> {
        self.0.try_read(range, attempt).await
    }
    fn size(&self) -> Option<u64> {
        self.0.size()
    }
    fn name(&self) -> String {
        format!("{} (for a peer)", self.0.name())
    }
    fn policy(&self) -> RetryPolicy {
        self.0.policy()
    }
    async fn refresh_auth(&self) -> bool {
        self.0.refresh_auth().await
    }
    fn note_retry(&self, kind: ErrorKind) {
        self.0.note_retry(kind)
    }
}

fn text(code: StatusCode, body: impl Into<String>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body.into())));
    *r.status_mut() = code;
    r
}

/// Constant-time equality (the token must not leak through timing).
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl PeerServer {
    /// A server answering from `store`, fetching missing frames with `registry`.
    pub fn new(
        store: Arc<FrameStore>,
        registry: Client,
        cfg: ServerConfig,
        stats: Arc<PeerStats>,
    ) -> Self {
        let kib = usize::try_from(cfg.max_bytes_in_flight >> 10)
            .unwrap_or(usize::MAX)
            .min(Semaphore::MAX_PERMITS);
        PeerServer {
            store,
            registry,
            requests: Semaphore::new(cfg.max_concurrent),
            kib: Semaphore::new(kib),
            cfg,
            stats,
        }
    }

    /// Answers one request.
    pub async fn handle(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        if req.uri().path() != FRAMES_PATH {
            return text(StatusCode::NOT_FOUND, "not found: POST /peer/v1/frames\n");
        }
        if req.method() != hyper::Method::POST {
            return text(StatusCode::METHOD_NOT_ALLOWED, "only POST\n");
        }
        if let Some(t) = &self.cfg.token {
            let ok = req
                .headers()
                .get(hyper::header::AUTHORIZATION)
                .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
                .is_some_and(|v| same(v, t.as_bytes()));
            if !ok {
                self.stats.refused_auth.fetch_add(1, Ordering::Relaxed);
                return text(StatusCode::UNAUTHORIZED, "missing or wrong peer token\n");
            }
        }
        let Ok(_slot) = self.requests.try_acquire() else {
            self.stats.refused_busy.fetch_add(1, Ordering::Relaxed);
            return text(
                StatusCode::SERVICE_UNAVAILABLE,
                "busy: too many peer requests\n",
            );
        };
        let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => {
                self.stats.refused_invalid.fetch_add(1, Ordering::Relaxed);
                return text(StatusCode::BAD_REQUEST, format!("request body: {e}\n"));
            }
        };
        let parsed = serde_json::from_slice::<FrameRequest>(&body)
            .map_err(|e| e.to_string())
            .and_then(|r| validate(r, &self.cfg.limits).map_err(|e| e.to_string()));
        let v = match parsed {
            Ok(v) => v,
            Err(e) => {
                self.stats.refused_invalid.fetch_add(1, Ordering::Relaxed);
                return text(StatusCode::BAD_REQUEST, format!("{e}\n"));
            }
        };
        let kib = u32::try_from(v.total_ulen.div_ceil(1024)).unwrap_or(u32::MAX);
        let Ok(_bytes) = self.kib.try_acquire_many(kib) else {
            self.stats.refused_busy.fetch_add(1, Ordering::Relaxed);
            return text(
                StatusCode::SERVICE_UNAVAILABLE,
                "busy: too many bytes in flight\n",
            );
        };
        match self.frames(&v).await {
            Ok(Some(body)) => {
                self.stats.served_requests.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .served_bytes
                    .fetch_add(body.len() as u64, Ordering::Relaxed);
                Response::new(Full::new(body))
            }
            Ok(None) => {
                self.stats
                    .served_cache_misses
                    .fetch_add(1, Ordering::Relaxed);
                text(StatusCode::NOT_FOUND, "not cached\n")
            }
            Err(e) => {
                self.stats.served_errors.fetch_add(1, Ordering::Relaxed);
                text(StatusCode::BAD_GATEWAY, format!("{e}\n"))
            }
        }
    }

    /// The frames of `v` back to back; `None` if `cache_only` and one is not cached.
    async fn frames(&self, v: &ValidRequest) -> Result<Option<Bytes>, FetchError> {
        let mut out = BytesMut::with_capacity(usize::try_from(v.total_ulen).unwrap_or(0));
        if v.cache_only {
            for f in &v.frames {
                match self.store.cached(f) {
                    Some(b) => out.extend_from_slice(&b),
                    None => return Ok(None),
                }
            }
            return Ok(Some(out.freeze()));
        }
        let src: Arc<dyn RangeSource> = Arc::new(OnBehalf(RegistryRangeSource::new(
            self.registry.clone(),
            v.reference.clone(),
            v.digest.clone(),
            Some(v.size),
        )));
        let idxs: Vec<FrameIdx> = (0..v.frames.len() as u32).map(FrameIdx).collect();
        let prio = fetch_priority(v.priority);
        for b in self.store.get_frames(&v.frames, &src, &idxs, prio).await? {
            out.extend_from_slice(&b);
        }
        Ok(Some(out.freeze()))
    }

    /// Serves `listener` forever (spawned by the daemon).
    pub async fn serve(self: Arc<Self>, listener: TcpListener) {
        loop {
            let (stream, _) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "peer listener: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let me = self.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| {
                    let me = me.clone();
                    async move { Ok::<_, Infallible>(me.handle(req).await) }
                });
                crate::http::serve_http1(stream, svc).await;
            });
        }
    }
}
