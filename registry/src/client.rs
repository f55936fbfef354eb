//! `Client`: the request engine shared by all operations. It picks endpoints (mirrors, then
//! origin), attaches authorization, follows redirects itself (keeping `Range`, dropping
//! `Authorization` when leaving the registry host), retries per [`crate::retry`] and counts
//! every request in [`Stats`]. Operations live in `pull.rs`, `blob.rs` and `push.rs`.
//!
//! Range reads are sent as single attempts ([`Req::single_attempt`]): no retry loop and no
//! resend after a 401 here; [`crate::RangeSource::read`] owns their one retry budget.

use crate::auth::{Authenticator, CredentialSource};
use crate::config::{Capability, Endpoint, RegistryConfig};
use crate::error::{is_retryable_transport, RegistryError};
use crate::retry::{next_delay, parse_retry_after, random_jitter, Outcome};
use crate::stats::{Kind, Stats, StatsSnapshot};
use crate::tls::{build_http, tls_keys, TlsKey};
use bytes::Bytes;
use reqwest::header::{
    HeaderMap, HeaderName, HeaderValue, AUTHORIZATION, LOCATION, RETRY_AFTER, WWW_AUTHENTICATE,
};
use reqwest::{Method, Response, StatusCode, Url};
use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// Most redirects followed for one request.
const MAX_REDIRECTS: usize = 10;
/// Largest buffer reserved up front from a server-sent or caller-sent length (more grows).
pub(crate) const MAX_PREALLOC: u64 = 64 << 20;
/// Most bytes of an error body quoted in an error message.
const ERROR_BODY_QUOTE: usize = 512;

/// An OCI distribution client. Cheap to clone (shared state behind an `Arc`), `Send + Sync`.
/// Counters of all clones are shared: see [`Client::stats`].
#[derive(Clone, Debug)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) config: RegistryConfig,
    /// One HTTP client per TLS setup (skip_verify, extra CA files) found in the config.
    http: HashMap<TlsKey, reqwest::Client>,
    pub(crate) auth: Authenticator,
    pub(crate) stats: Stats,
    pub(crate) warned_full_range: AtomicBool,
}

/// Where a request goes: a path under an endpoint's API root, or an absolute URL (an upload
/// location returned by the registry).
#[derive(Clone, Debug)]
pub(crate) enum Target {
    Path(String),
    Url(Url),
}

/// One logical request (re-sendable: the body is `Bytes`).
#[derive(Clone, Debug)]
pub(crate) struct Req {
    pub method: Method,
    pub target: Target,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub body: Option<Bytes>,
    pub scopes: Vec<String>,
    pub kind: Kind,
    pub idempotent: bool,
    pub follow_redirects: bool,
    /// Ask the origin first, mirrors after it (a refetch after a mirror's bytes failed
    /// verification); any endpoint but the last falls through on a miss or an error.
    pub origin_first: bool,
    /// One attempt only: no retries, and a 401 is answered (challenge recorded, rejected
    /// token dropped) but not resent; the caller's retry budget decides (range reads).
    pub single_attempt: bool,
}

/// Marks a 401 response of a single-attempt request after which new credentials are ready
/// for the next attempt (read by [`Client::error_for`]).
#[derive(Clone, Copy, Debug)]
struct AuthRenewable;

impl Req {
    pub(crate) fn new(method: Method, target: Target, kind: Kind, scopes: Vec<String>) -> Self {
        let idempotent = matches!(method, Method::GET | Method::HEAD);
        Req {
            follow_redirects: idempotent,
            method,
            target,
            headers: Vec::new(),
            body: None,
            scopes,
            kind,
            idempotent,
            origin_first: false,
            single_attempt: false,
        }
    }

    pub(crate) fn header(mut self, name: HeaderName, value: &str) -> Result<Self, RegistryError> {
        let v = HeaderValue::from_str(value).map_err(|e| RegistryError::Protocol {
            url: format!("{:?}", self.target),
            detail: format!("bad header value for {name}: {e}"),
        })?;
        self.headers.push((name, v));
        Ok(self)
    }
}

fn host_of(url: &Url) -> String {
    match (url.host_str(), url.port()) {
        (Some(h), Some(p)) => format!("{h}:{p}"),
        (Some(h), None) => h.to_string(),
        _ => String::new(),
    }
}

impl Client {
    /// Build a client. Reads `hosts_dir` (if set) now; credentials are looked up lazily per host.
    pub fn new(mut config: RegistryConfig) -> Result<Client, RegistryError> {
        if let Some(dir) = config.hosts_dir.clone() {
            config.merge_hosts_dir(&dir)?;
        }
        config.validate()?;
        let source = if config.docker_credentials {
            CredentialSource::DockerConfig(config.docker_config_dir.clone())
        } else {
            CredentialSource::None
        };
        Self::with_credentials(config, source)
    }

    /// Build a client with an explicit credential source (tests, embedding).
    pub fn with_credentials(
        config: RegistryConfig,
        source: CredentialSource,
    ) -> Result<Client, RegistryError> {
        config.validate()?;
        let system = if config.system_roots {
            crate::tls::system_roots()
        } else {
            Vec::new()
        };
        Ok(Client {
            inner: Arc::new(Inner {
                http: tls_keys(&config)
                    .iter()
                    .map(|k| Ok((k.clone(), build_http(&config, k, &system)?)))
                    .collect::<Result<_, RegistryError>>()?,
                auth: Authenticator::new(source),
                stats: Stats::default(),
                warned_full_range: AtomicBool::new(false),
                config,
            }),
        })
    }

    /// The configuration in use (after merging `hosts_dir`).
    pub fn config(&self) -> &RegistryConfig {
        &self.inner.config
    }

    /// Snapshot of the request counters (shared by all clones of this client).
    pub fn stats(&self) -> StatsSnapshot {
        self.inner.stats.snapshot()
    }

    pub(crate) fn stats_ref(&self) -> &Stats {
        &self.inner.stats
    }

    fn http(&self, ep: &Endpoint) -> Result<&reqwest::Client, RegistryError> {
        let key = (ep.skip_verify, ep.ca.clone());
        self.inner
            .http
            .get(&key)
            .ok_or_else(|| RegistryError::BadConfig {
                field: format!("endpoint {}", ep.api_root),
                reason: "no HTTP client for its TLS settings (config changed after Client::new?)"
                    .into(),
            })
    }

    pub(crate) fn url_for(ep: &Endpoint, target: &Target) -> Result<Url, RegistryError> {
        match target {
            Target::Url(u) => Ok(u.clone()),
            Target::Path(p) => {
                let s = format!("{}{}", ep.api_root, p);
                let mut u = Url::parse(&s).map_err(|e| RegistryError::Protocol {
                    url: s,
                    detail: format!("cannot build URL: {e}"),
                })?;
                if let Some(ns) = &ep.ns {
                    u.query_pairs_mut().append_pair("ns", ns);
                }
                Ok(u)
            }
        }
    }

    /// Send `req` to the endpoints for `cap` on `registry`: mirrors first (falling through on
    /// 401/403/404, 5xx and errors), then the origin (origin first for `req.origin_first`). Returns the response and the endpoint that gave it.
    pub(crate) async fn execute(
        &self,
        registry: &str,
        cap: Capability,
        req: &Req,
    ) -> Result<(Response, Endpoint), RegistryError> {
        let mut endpoints = self.inner.config.endpoints(registry, cap)?;
        if req.origin_first {
            // Stable: the mirrors keep their order after the origin.
            endpoints.sort_by_key(|ep| ep.is_mirror);
        }
        let n = endpoints.len();
        for (i, ep) in endpoints.into_iter().enumerate() {
            let last = i + 1 == n;
            let may_fall_through = ep.is_mirror || req.origin_first;
            match self.execute_on(&ep, req).await {
                Ok(resp)
                    if may_fall_through
                        && !last
                        && (matches!(resp.status().as_u16(), 401 | 403 | 404)
                            || resp.status().is_server_error()) =>
                {
                    tracing::debug!(mirror = %ep.api_root, status = %resp.status(), "mirror miss, trying next endpoint");
                    self.inner.stats.count_mirror_fallback();
                }
                Err(e) if may_fall_through && !last => {
                    tracing::warn!(mirror = %ep.api_root, error = %e, "mirror failed, trying next endpoint");
                    self.inner.stats.count_mirror_fallback();
                }
                r => return r.map(|resp| (resp, ep)),
            }
        }
        Err(RegistryError::BadConfig {
            field: format!("hosts.{registry:?}"),
            reason: "no endpoint".into(),
        })
    }

    /// Send `req` to one endpoint with auth, redirects and retries (one try and no 401
    /// resend for [`Req::single_attempt`]).
    pub(crate) async fn execute_on(
        &self,
        ep: &Endpoint,
        req: &Req,
    ) -> Result<Response, RegistryError> {
        let http = self.http(ep)?;
        let url = Self::url_for(ep, &req.target)?;
        let policy = &self.inner.config.retry;
        let mut retry = 0u32;
        let mut auth_refreshed = false;
        loop {
            let authz = self
                .inner
                .auth
                .authorize(http, &ep.host, &req.scopes, &self.inner.stats)
                .await?;
            match self
                .send_following(http, ep, url.clone(), req, authz.as_deref())
                .await
            {
                Ok(mut resp) if resp.status() == StatusCode::UNAUTHORIZED && !auth_refreshed => {
                    let www = resp
                        .headers()
                        .get(WWW_AUTHENTICATE)
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_string);
                    let renewable = self
                        .inner
                        .auth
                        .on_unauthorized(&ep.host, www.as_deref(), &req.scopes, authz.as_deref())
                        .await;
                    if renewable && req.single_attempt {
                        resp.extensions_mut().insert(AuthRenewable);
                        return Ok(resp);
                    }
                    if renewable {
                        drain(resp).await;
                        auth_refreshed = true;
                        self.inner.stats.count_auth_retry();
                        continue;
                    }
                    return Ok(resp);
                }
                Ok(resp) => {
                    let outcome = Outcome::Status {
                        status: resp.status().as_u16(),
                        retry_after: resp
                            .headers()
                            .get(RETRY_AFTER)
                            .and_then(|v| v.to_str().ok())
                            .and_then(parse_retry_after),
                    };
                    let retryable = req.idempotent && !req.single_attempt;
                    match next_delay(policy, retry, retryable, outcome, random_jitter()) {
                        Some(delay) => {
                            tracing::debug!(url = %url, status = %resp.status(), ?delay, "retrying");
                            drain(resp).await;
                            retry += 1;
                            self.inner.stats.count_retry();
                            tokio::time::sleep(delay).await;
                        }
                        None => return Ok(resp),
                    }
                }
                Err(RegistryError::Transport {
                    method,
                    url: u,
                    error: source,
                }) => {
                    let d = if is_retryable_transport(&source) && !req.single_attempt {
                        next_delay(
                            policy,
                            retry,
                            req.idempotent,
                            Outcome::Transport,
                            random_jitter(),
                        )
                    } else {
                        None
                    };
                    match d {
                        Some(delay) => {
                            tracing::debug!(url = %u, error = %source, ?delay, "retrying after transport error");
                            retry += 1;
                            self.inner.stats.count_retry();
                            tokio::time::sleep(delay).await;
                        }
                        None => {
                            return Err(RegistryError::Transport {
                                method,
                                url: u,
                                error: source,
                            })
                        }
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn send_following(
        &self,
        http: &reqwest::Client,
        ep: &Endpoint,
        mut url: Url,
        req: &Req,
        authz: Option<&str>,
    ) -> Result<Response, RegistryError> {
        let mut hops = 0;
        loop {
            let mut rb = http.request(req.method.clone(), url.clone());
            for (k, v) in &req.headers {
                rb = rb.header(k.clone(), v.clone());
            }
            if let Some(a) = authz {
                if host_of(&url) == ep.host {
                    rb = rb.header(AUTHORIZATION, a);
                }
            }
            let body_len = req.body.as_ref().map_or(0, |b| b.len() as u64);
            if let Some(b) = &req.body {
                if b.is_empty() {
                    // hyper omits `Content-Length: 0`; some front proxies answer 411 without it
                    rb = rb.header(reqwest::header::CONTENT_LENGTH, "0");
                }
                rb = rb.body(b.clone());
            }
            self.inner.stats.count_request(req.kind, body_len);
            let resp = rb.send().await.map_err(|source| RegistryError::Transport {
                method: req.method.to_string(),
                url: url.to_string(),
                error: source,
            })?;
            if req.follow_redirects
                && resp.status().is_redirection()
                && resp.status() != StatusCode::NOT_MODIFIED
            {
                let loc = resp.headers().get(LOCATION).and_then(|v| v.to_str().ok());
                if let Some(loc) = loc {
                    if hops >= MAX_REDIRECTS {
                        return Err(RegistryError::Protocol {
                            url: url.to_string(),
                            detail: format!("more than {MAX_REDIRECTS} redirects"),
                        });
                    }
                    let next = url.join(loc).map_err(|e| RegistryError::Protocol {
                        url: url.to_string(),
                        detail: format!("bad redirect Location {loc:?}: {e}"),
                    })?;
                    tracing::debug!(from = %url, to = %next, "following redirect");
                    drain(resp).await;
                    self.inner.stats.count_redirect();
                    url = next;
                    hops += 1;
                    continue;
                }
            }
            return Ok(resp);
        }
    }

    /// Read a whole body (at most `limit` bytes), counting received bytes.
    pub(crate) async fn read_body(
        &self,
        mut resp: Response,
        limit: u64,
    ) -> Result<Bytes, RegistryError> {
        let url = resp.url().to_string();
        if let Some(len) = resp.content_length() {
            if len > limit {
                return Err(RegistryError::TooLarge {
                    url,
                    size: len,
                    limit,
                });
            }
        }
        let mut buf =
            Vec::with_capacity(resp.content_length().unwrap_or(0).min(MAX_PREALLOC) as usize);
        while let Some(chunk) = next_chunk(&mut resp, &url).await? {
            self.inner.stats.count_received(chunk.len() as u64);
            if (buf.len() + chunk.len()) as u64 > limit {
                return Err(RegistryError::TooLarge {
                    url,
                    size: (buf.len() + chunk.len()) as u64,
                    limit,
                });
            }
            buf.extend_from_slice(&chunk);
        }
        Ok(Bytes::from(buf))
    }

    /// Turn a non-success response into an error (404 -> `NotFound`, 401 -> `Unauthorized`).
    pub(crate) async fn error_for(
        &self,
        resp: Response,
        method: &str,
        what: &str,
        host: &str,
    ) -> RegistryError {
        let status = resp.status().as_u16();
        let url = resp.url().to_string();
        let renewable = resp.extensions().get::<AuthRenewable>().is_some();
        let retry_after =
            header_str(resp.headers(), RETRY_AFTER.as_str()).and_then(parse_retry_after);
        let body = match self.read_body(resp, 64 << 10).await {
            Ok(b) => String::from_utf8_lossy(&b[..b.len().min(ERROR_BODY_QUOTE)])
                .trim()
                .to_string(),
            Err(e) => format!("<body unreadable: {e}>"),
        };
        match status {
            404 => RegistryError::NotFound {
                reference: what.to_string(),
                url,
            },
            401 => RegistryError::Unauthorized {
                method: method.to_string(),
                url,
                host: host.to_string(),
                detail: body,
                renewable,
            },
            _ => RegistryError::Status {
                method: method.to_string(),
                url,
                status,
                body,
                hint: RegistryError::hint_for(status),
                retry_after,
            },
        }
    }
}

/// Read and discard a (small) body so the connection can be reused.
async fn drain(resp: Response) {
    if resp.content_length().is_some_and(|l| l <= 64 << 10) {
        let _ = resp.bytes().await;
    }
}

/// The `Content-Length` header itself (reqwest's `content_length()` is the body size hint,
/// which is 0 for HEAD responses).
pub(crate) fn header_content_length(h: &HeaderMap) -> Option<u64> {
    header_str(h, "content-length").and_then(|v| v.trim().parse().ok())
}

/// The next chunk of a response body (`None` at its end); a transport failure names `url`.
pub(crate) async fn next_chunk(
    resp: &mut Response,
    url: &str,
) -> Result<Option<Bytes>, RegistryError> {
    resp.chunk()
        .await
        .map_err(|source| RegistryError::Transport {
            method: "GET (body)".into(),
            url: url.to_string(),
            error: source,
        })
}

/// A header as a string, if present and ASCII.
pub(crate) fn header_str<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}
