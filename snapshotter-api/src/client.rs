//! The client side of the daemon's observability endpoint (`observability.listen`, TCP or a
//! unix socket): one HTTP/1.1 request per connection, the body of a 200 returned. Used by
//! `weenv status`, `weenv profile` and `weenv metrics`; the server is
//! `weenv_snapshotter::http`.

use crate::config::ListenAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Minimal client: GET `path` from `addr`, return the body (used by `weenv status/metrics`).
pub async fn get(addr: &ListenAddr, path: &str) -> std::io::Result<String> {
    request(addr, "GET", path).await
}

/// Minimal client: `method path` (no request body) to `addr`, return the body of a 200.
pub async fn request(addr: &ListenAddr, method: &str, path: &str) -> std::io::Result<String> {
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: weenv\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    let mut out = Vec::new();
    let unreachable = |e: std::io::Error| {
        std::io::Error::new(
            e.kind(),
            format!(
                "cannot reach the weenv-snapshotter endpoint {addr}: {e} \
                 (is the daemon running, and is this its observability.listen?)"
            ),
        )
    };
    match addr {
        ListenAddr::Tcp(a) => {
            let mut s = tokio::net::TcpStream::connect(a)
                .await
                .map_err(unreachable)?;
            s.write_all(req.as_bytes()).await?;
            s.read_to_end(&mut out).await?;
        }
        ListenAddr::Unix(p) => {
            let mut s = tokio::net::UnixStream::connect(p)
                .await
                .map_err(unreachable)?;
            s.write_all(req.as_bytes()).await?;
            s.read_to_end(&mut out).await?;
        }
    }
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    if !head.starts_with("HTTP/1.1 200") {
        return Err(std::io::Error::other(format!(
            "{path}: {}",
            head.lines().next().unwrap_or("no response")
        )));
    }
    Ok(body.to_string())
}
