//! The client side of the daemon's observability endpoint (`observability.listen`, TCP or a
//! unix socket): one HTTP/1.1 request per connection over hyper (the stack the daemon serves
//! it with), the body of a 200 returned. Used by `weenv status`, `weenv profile`, `weenv
//! metrics` and `weenv pull`'s verification; the server is `weenv_snapshotter::http`.

use crate::config::ListenAddr;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::{Method, Request, StatusCode};
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncWrite};

/// What a request to the endpoint can end with.
#[derive(Debug, Error)]
pub enum EndpointError {
    #[error("cannot reach the weenv-snapshotter endpoint {addr}: {source} (is the daemon running, and is this its observability.listen?)")]
    Unreachable {
        addr: String,
        source: std::io::Error,
    },
    #[error("{path}: not a request: {reason}")]
    Request { path: String, reason: String },
    #[error("{path}: the endpoint {addr} broke off: {source}")]
    Transport {
        addr: String,
        path: String,
        source: hyper::Error,
    },
    /// The daemon answered, but not with a 200 (`/nope: HTTP/1.1 404 Not Found`).
    #[error("{path}: HTTP/1.1 {status}")]
    Status { path: String, status: StatusCode },
}

/// GET `path` from `addr`, return the body (used by `weenv status/metrics`).
pub async fn get(addr: &ListenAddr, path: &str) -> Result<String, EndpointError> {
    request(addr, "GET", path).await
}

/// `method path` (no request body) to `addr`, return the body of a 200.
pub async fn request(addr: &ListenAddr, method: &str, path: &str) -> Result<String, EndpointError> {
    let unreachable = |source| EndpointError::Unreachable {
        addr: addr.to_string(),
        source,
    };
    let req = Request::builder()
        .method(
            Method::from_bytes(method.as_bytes()).map_err(|e| EndpointError::Request {
                path: path.to_string(),
                reason: e.to_string(),
            })?,
        )
        .uri(path)
        .header(hyper::header::HOST, "weenv")
        .body(Empty::<Bytes>::new())
        .map_err(|e| EndpointError::Request {
            path: path.to_string(),
            reason: e.to_string(),
        })?;
    let answer = match addr {
        ListenAddr::Tcp(a) => {
            let s = tokio::net::TcpStream::connect(a)
                .await
                .map_err(unreachable)?;
            exchange(s, req).await
        }
        ListenAddr::Unix(p) => {
            let s = tokio::net::UnixStream::connect(p)
                .await
                .map_err(unreachable)?;
            exchange(s, req).await
        }
    };
    let (status, body) = answer.map_err(|source| EndpointError::Transport {
        addr: addr.to_string(),
        path: path.to_string(),
        source,
    })?;
    if status != StatusCode::OK {
        return Err(EndpointError::Status {
            path: path.to_string(),
            status,
        });
    }
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// One request on a fresh connection; the connection ends with the request.
async fn exchange<I>(io: I, req: Request<Empty<Bytes>>) -> Result<(StatusCode, Bytes), hyper::Error>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(io)).await?;
    let ask = async move {
        let resp = sender.send_request(req).await?;
        let status = resp.status();
        let body = resp.into_body().collect().await?.to_bytes();
        Ok::<_, hyper::Error>((status, body))
    };
    // Drive the connection and the exchange together; the connection finishes once the
    // sender is dropped (at the end of `ask`).
    let (answer, conn) = tokio::join!(ask, conn);
    let answer = answer?;
    conn?;
    Ok(answer)
}
