//! Counting HTTP/1.1 proxy: records every request (method, path, Range, status, bytes, when
//! its response started and ended) and can play a bearer-token auth front, redirect blob GETs,
//! drop Range headers, or send every body through one shared link of a fixed rate. Runs on its
//! own thread with its own tokio runtime; dropping it stops it.

use anyhow::Result;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// One request seen by the proxy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxyRequest {
    pub method: String,
    /// Request target (path and query).
    pub path: String,
    /// `Range` header, if any.
    pub range: Option<String>,
    /// `Authorization` header, if any.
    pub authorization: Option<String>,
    /// Response status (0 if the upstream failed).
    pub status: u16,
    /// Response body bytes sent to the client.
    pub response_bytes: u64,
    /// Request body bytes received from the client.
    pub request_bytes: u64,
    /// When the response started / ended, in µs since the proxy started (end 0: not yet).
    pub start_us: u64,
    pub end_us: u64,
}

/// What the proxy saw.
#[derive(Debug, Default)]
pub struct ProxyStats {
    requests: Mutex<Vec<ProxyRequest>>,
    bytes_served: AtomicU64,
}

impl ProxyStats {
    /// All requests so far, in completion order.
    pub fn requests(&self) -> Vec<ProxyRequest> {
        self.requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
    /// Total response body bytes served.
    pub fn bytes_served(&self) -> u64 {
        self.bytes_served.load(Ordering::SeqCst)
    }
    /// Forget everything recorded so far.
    pub fn clear(&self) {
        self.requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        self.bytes_served.store(0, Ordering::SeqCst);
    }
    /// `(method, path-without-query)` of every request, for exact assertions.
    pub fn summary(&self) -> Vec<(String, String)> {
        self.requests()
            .into_iter()
            .map(|r| (r.method, r.path.split('?').next().unwrap_or("").to_string()))
            .collect()
    }
    /// Records `r`; returns its index for [`ProxyStats::finish`].
    fn record(&self, r: ProxyRequest) -> usize {
        self.bytes_served
            .fetch_add(r.response_bytes, Ordering::SeqCst);
        let mut g = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        g.push(r);
        g.len() - 1
    }
    /// Request `i` (of [`ProxyStats::record`]) ended at `end_us`.
    fn finish(&self, i: usize, end_us: u64) {
        let mut g = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(r) = g.get_mut(i) {
            r.end_us = end_us;
        }
    }
}

/// Bearer-token auth played by the proxy: `/token` issues tokens for Basic `user:password`
/// (or anonymously when `allow_anonymous`); `/v2/...` requires a token whose scope covers
/// the repository and action (pull for GET/HEAD, push otherwise).
#[derive(Clone, Debug)]
pub struct TokenAuth {
    pub user: String,
    pub password: String,
    pub service: String,
    pub allow_anonymous: bool,
}

/// Proxy behaviours.
#[derive(Clone, Debug, Default)]
pub struct ProxyOptions {
    /// Act as a token-auth registry front.
    pub auth: Option<TokenAuth>,
    /// Answer blob GETs with a 307 to the same URL plus `?redirected=1`.
    pub redirect_blob_gets: bool,
    /// Drop `Range` headers before forwarding (a server that ignores Range).
    pub ignore_range: bool,
    /// Send all response bodies through one link of this many bytes per second (64 KiB
    /// chunks, first come first served across connections); 0 = unlimited.
    pub rate_bytes_per_sec: u64,
}

/// Counting proxy in front of an upstream HTTP/1.1 server (stops on drop).
#[derive(Debug)]
pub struct CountingProxy {
    addr: SocketAddr,
    stats: Arc<ProxyStats>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl CountingProxy {
    /// Plain counting proxy to `upstream`.
    pub fn start(upstream: SocketAddr) -> Result<CountingProxy> {
        Self::start_with(upstream, ProxyOptions::default())
    }

    /// Proxy with options.
    pub fn start_with(upstream: SocketAddr, opts: ProxyOptions) -> Result<CountingProxy> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stats = Arc::new(ProxyStats::default());
        let (tx, mut rx) = tokio::sync::oneshot::channel::<()>();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let st = stats.clone();
        let thread = std::thread::spawn(move || {
            rt.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                    return;
                };
                let state = Arc::new(ProxyState {
                    upstream,
                    opts,
                    addr,
                    stats: st,
                    tokens: Mutex::new(Vec::new()),
                    started: std::time::Instant::now(),
                    link_free: Mutex::new(tokio::time::Instant::now()),
                });
                loop {
                    tokio::select! {
                        _ = &mut rx => break,
                        acc = listener.accept() => {
                            if let Ok((sock, _)) = acc {
                                let state = state.clone();
                                tokio::spawn(async move {
                                    let _ = serve_conn(sock, state).await;
                                });
                            }
                        }
                    }
                }
            });
            rt.shutdown_background();
        });
        Ok(CountingProxy {
            addr,
            stats,
            shutdown: Some(tx),
            thread: Some(thread),
        })
    }

    /// Listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `127.0.0.1:PORT` for references.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    /// Recorded requests and bytes.
    pub fn stats(&self) -> Arc<ProxyStats> {
        self.stats.clone()
    }
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct ProxyState {
    upstream: SocketAddr,
    opts: ProxyOptions,
    addr: SocketAddr,
    stats: Arc<ProxyStats>,
    /// Issued tokens and their scopes.
    tokens: Mutex<Vec<(String, Vec<String>)>>,
    started: std::time::Instant,
    /// When the shaped link is free again (`ProxyOptions::rate_bytes_per_sec`).
    link_free: Mutex<tokio::time::Instant>,
}

impl ProxyState {
    fn now_us(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// Copies `len` body bytes from `r` to `w`, through the shaped link if there is one.
    async fn copy_body<R, W>(&self, r: &mut R, w: &mut W, len: u64) -> Result<u64>
    where
        R: tokio::io::AsyncRead + Unpin,
        W: tokio::io::AsyncWrite + Unpin,
    {
        let rate = self.opts.rate_bytes_per_sec;
        if rate == 0 {
            return Ok(tokio::io::copy(&mut r.take(len), w).await?);
        }
        let mut buf = vec![0u8; 64 << 10];
        let mut done = 0u64;
        while done < len {
            let want = usize::try_from((len - done).min(buf.len() as u64))?;
            let n = r.read(&mut buf[..want]).await?;
            if n == 0 {
                break;
            }
            let due = {
                let mut free = self.link_free.lock().unwrap_or_else(|p| p.into_inner());
                let start = (*free).max(tokio::time::Instant::now());
                *free = start + std::time::Duration::from_secs_f64(n as f64 / rate as f64);
                *free
            };
            tokio::time::sleep_until(due).await;
            w.write_all(&buf[..n]).await?;
            done += n as u64;
        }
        Ok(done)
    }
}

struct Head {
    start_line: String,
    headers: Vec<(String, String)>,
}

impl Head {
    fn get(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    fn encode(&self) -> Vec<u8> {
        let mut s = format!("{}\r\n", self.start_line);
        for (k, v) in &self.headers {
            s.push_str(&format!("{k}: {v}\r\n"));
        }
        s.push_str("\r\n");
        s.into_bytes()
    }
}

async fn read_head<R: AsyncBufReadExt + Unpin>(r: &mut R) -> Result<Option<Head>> {
    let mut line = String::new();
    if r.read_line(&mut line).await? == 0 {
        return Ok(None);
    }
    let start_line = line.trim_end().to_string();
    let mut headers = Vec::new();
    loop {
        line.clear();
        if r.read_line(&mut line).await? == 0 {
            anyhow::bail!("connection closed inside headers");
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    Ok(Some(Head {
        start_line,
        headers,
    }))
}

/// Read a body framed per `head` (Content-Length or chunked); returns raw bytes (framing
/// kept, for forwarding) and the payload length.
async fn read_body<R: AsyncBufReadExt + Unpin>(
    r: &mut R,
    head: &Head,
    to_eof: bool,
) -> Result<(Vec<u8>, u64)> {
    if head
        .get("transfer-encoding")
        .is_some_and(|t| t.eq_ignore_ascii_case("chunked"))
    {
        let mut raw = Vec::new();
        let mut payload = 0u64;
        loop {
            let mut line = String::new();
            r.read_line(&mut line).await?;
            raw.extend_from_slice(line.as_bytes());
            let n = u64::from_str_radix(line.trim().split(';').next().unwrap_or("0"), 16)?;
            let mut chunk = vec![0u8; n as usize + 2];
            r.read_exact(&mut chunk).await?;
            raw.extend_from_slice(&chunk);
            payload += n;
            if n == 0 {
                break;
            }
        }
        return Ok((raw, payload));
    }
    if let Some(len) = head.get("content-length") {
        let n: usize = len.parse()?;
        let mut buf = vec![0u8; n];
        r.read_exact(&mut buf).await?;
        return Ok((buf, n as u64));
    }
    let mut buf = Vec::new();
    if to_eof {
        r.read_to_end(&mut buf).await?;
    }
    let n = buf.len() as u64;
    Ok((buf, n))
}

fn simple_response(status: &str, headers: &[(&str, String)], body: &[u8]) -> Vec<u8> {
    let mut s = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\n", body.len());
    for (k, v) in headers {
        s.push_str(&format!("{k}: {v}\r\n"));
    }
    s.push_str("\r\n");
    let mut out = s.into_bytes();
    out.extend_from_slice(body);
    out
}

/// Standard base64 with padding (for checking Basic credentials).
pub fn base64_encode(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in data.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// `(repository, needed action)` for a `/v2/<repo>/(blobs|manifests|tags)/...` path.
fn needed_scope(method: &str, path: &str) -> Option<(String, &'static str)> {
    let p = path.split('?').next()?.strip_prefix("/v2/")?;
    let idx = ["/blobs/", "/manifests/", "/tags/"]
        .iter()
        .filter_map(|m| p.find(m))
        .min()?;
    let action = if matches!(method, "GET" | "HEAD") {
        "pull"
    } else {
        "push"
    };
    Some((p[..idx].to_string(), action))
}

fn scope_covers(scopes: &[String], repo: &str, action: &str) -> bool {
    scopes.iter().any(|s| {
        let mut it = s.splitn(3, ':');
        it.next() == Some("repository")
            && it.next() == Some(repo)
            && it.next().is_some_and(|a| a.split(',').any(|x| x == action))
    })
}

fn query_params(path: &str) -> Vec<(String, String)> {
    let q = path.split_once('?').map(|x| x.1).unwrap_or("");
    q.split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (pct_decode(k), pct_decode(v))
        })
        .collect()
}

fn pct_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Answer locally (auth or redirect) instead of forwarding, if the options say so.
fn local_answer(
    state: &ProxyState,
    method: &str,
    path: &str,
    head: &Head,
) -> Option<(u16, Vec<u8>)> {
    if let Some(auth) = &state.opts.auth {
        if path.starts_with("/token") {
            let params = query_params(path);
            let basic = head
                .get("authorization")
                .and_then(|a| a.strip_prefix("Basic "));
            let expected = base64_encode(format!("{}:{}", auth.user, auth.password).as_bytes());
            let ok = match basic {
                Some(b) => b == expected,
                None => auth.allow_anonymous,
            };
            if !ok {
                return Some((
                    401,
                    simple_response(
                        "401 Unauthorized",
                        &[],
                        b"{\"details\":\"bad credentials\"}",
                    ),
                ));
            }
            let scopes: Vec<String> = params
                .iter()
                .filter(|(k, _)| k == "scope")
                .map(|(_, v)| v.clone())
                .collect();
            let mut tokens = state.tokens.lock().unwrap_or_else(|p| p.into_inner());
            let tok = format!("tok-{}", tokens.len() + 1);
            tokens.push((tok.clone(), scopes));
            let body = format!("{{\"token\":\"{tok}\",\"expires_in\":300}}");
            return Some((
                200,
                simple_response(
                    "200 OK",
                    &[("Content-Type", "application/json".into())],
                    body.as_bytes(),
                ),
            ));
        }
        if let Some((repo, action)) = needed_scope(method, path) {
            let token = head
                .get("authorization")
                .and_then(|a| a.strip_prefix("Bearer "));
            let tokens = state.tokens.lock().unwrap_or_else(|p| p.into_inner());
            let valid = token.is_some_and(|t| {
                tokens
                    .iter()
                    .any(|(tk, sc)| tk == t && scope_covers(sc, &repo, action))
            });
            if !valid {
                let scope = if action == "pull" {
                    "pull".to_string()
                } else {
                    "pull,push".to_string()
                };
                let www = format!(
                    "Bearer realm=\"http://{}/token\",service=\"{}\",scope=\"repository:{repo}:{scope}\"",
                    state.addr, auth.service
                );
                let body = b"{\"errors\":[{\"code\":\"UNAUTHORIZED\"}]}";
                return Some((
                    401,
                    simple_response("401 Unauthorized", &[("WWW-Authenticate", www)], body),
                ));
            }
        }
    }
    if state.opts.redirect_blob_gets
        && method == "GET"
        && path.contains("/blobs/sha256:")
        && !path.contains("redirected=1")
    {
        let loc = format!("{path}?redirected=1");
        return Some((
            307,
            simple_response("307 Temporary Redirect", &[("Location", loc)], b""),
        ));
    }
    None
}

async fn serve_conn(sock: TcpStream, state: Arc<ProxyState>) -> Result<()> {
    let (cr, mut cw) = sock.into_split();
    let mut cr = BufReader::new(cr);
    let mut upstream: Option<(
        BufReader<tokio::net::tcp::OwnedReadHalf>,
        tokio::net::tcp::OwnedWriteHalf,
    )> = None;
    while let Some(mut head) = read_head(&mut cr).await? {
        let mut parts = head.start_line.split_whitespace();
        let method = parts.next().unwrap_or("").to_string();
        let path = parts.next().unwrap_or("").to_string();
        let (req_body, req_len) = read_body(&mut cr, &head, false).await?;
        let mut rec = ProxyRequest {
            method: method.clone(),
            path: path.clone(),
            range: head.get("range").map(str::to_string),
            authorization: head.get("authorization").map(str::to_string),
            status: 0,
            response_bytes: 0,
            request_bytes: req_len,
            start_us: state.now_us(),
            end_us: 0,
        };
        if let Some((status, resp)) = local_answer(&state, &method, &path, &head) {
            rec.status = status;
            // record before answering, so a client that got the answer sees the record
            state.stats.record(rec);
            cw.write_all(&resp).await?;
            continue;
        }
        if state.opts.ignore_range {
            head.headers
                .retain(|(k, _)| !k.eq_ignore_ascii_case("range"));
        }
        if upstream.is_none() {
            let s = TcpStream::connect(state.upstream).await?;
            let (r, w) = s.into_split();
            upstream = Some((BufReader::new(r), w));
        }
        let Some((ur, uw)) = upstream.as_mut() else {
            break;
        };
        uw.write_all(&head.encode()).await?;
        uw.write_all(&req_body).await?;
        let Some(resp_head) = read_head(ur).await? else {
            state.stats.record(rec);
            break;
        };
        let status: u16 = resp_head
            .start_line
            .split_whitespace()
            .nth(1)
            .unwrap_or("0")
            .parse()
            .unwrap_or(0);
        // distribution 2.8 answers 416 with `Content-Length: <blob size>` and no body: forward
        // the head only and close both connections.
        let broken_416 = status == 416;
        let no_body = method == "HEAD"
            || status == 204
            || status == 304
            || broken_416
            || (100..200).contains(&status);
        let close = broken_416
            || resp_head
                .get("connection")
                .is_some_and(|c| c.eq_ignore_ascii_case("close"));
        let chunked = resp_head
            .get("transfer-encoding")
            .is_some_and(|t| t.eq_ignore_ascii_case("chunked"));
        let length = resp_head
            .get("content-length")
            .and_then(|l| l.parse::<u64>().ok());
        rec.status = status;
        match length {
            // Stream sized bodies (blobs) without buffering them; the record is made first
            // (with the announced size) so a client that has the response sees its record.
            Some(len) if !no_body && !chunked => {
                rec.response_bytes = len;
                rec.start_us = state.now_us();
                let i = state.stats.record(rec);
                cw.write_all(&resp_head.encode()).await?;
                let copied = state.copy_body(&mut *ur, &mut cw, len).await?;
                state.stats.finish(i, state.now_us());
                anyhow::ensure!(
                    copied == len,
                    "upstream body ended after {copied} of {len} bytes"
                );
            }
            _ => {
                let (body, n) = if no_body {
                    (Vec::new(), 0)
                } else {
                    read_body(ur, &resp_head, true).await?
                };
                rec.response_bytes = n;
                state.stats.record(rec);
                cw.write_all(&resp_head.encode()).await?;
                cw.write_all(&body).await?;
            }
        }
        let framed = resp_head.get("content-length").is_some()
            || resp_head.get("transfer-encoding").is_some();
        if close || (!no_body && !framed) {
            break;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64() {
        assert_eq!(base64_encode(b"alice:secret"), "YWxpY2U6c2VjcmV0");
        assert_eq!(base64_encode(b"a"), "YQ==");
        assert_eq!(base64_encode(b"ab"), "YWI=");
    }

    #[test]
    fn scopes() {
        assert_eq!(
            needed_scope("GET", "/v2/a/b/blobs/sha256:x"),
            Some(("a/b".into(), "pull"))
        );
        assert_eq!(
            needed_scope("PATCH", "/v2/a/blobs/uploads/u?x=1"),
            Some(("a".into(), "push"))
        );
        assert_eq!(needed_scope("GET", "/v2/"), None);
        assert!(scope_covers(
            &["repository:a:pull,push".into()],
            "a",
            "push"
        ));
        assert!(!scope_covers(&["repository:a:pull".into()], "a", "push"));
        assert!(!scope_covers(&["repository:ab:pull".into()], "a", "pull"));
        assert_eq!(
            query_params("/token?service=s&scope=repository%3Aa%3Apull&scope=x"),
            vec![
                ("service".into(), "s".into()),
                ("scope".into(), "repository:a:pull".into()),
                ("scope".into(), "x".into())
            ]
        );
    }
}
