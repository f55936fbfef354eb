//! Serving the service: on a unix socket (access by the socket's file mode), and optionally
//! on TCP where every request must carry `authorization: Bearer TOKEN`.

use crate::proto::envd_server::EnvdServer;
use crate::service::Service;
use std::path::Path;
use std::sync::Arc;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Status};

/// Largest message a client may send (WriteFile, Exec stdin, Upload chunks).
pub const MAX_MESSAGE: usize = 256 << 20;

fn server(svc: Arc<Service>) -> EnvdServer<Arc<Service>> {
    EnvdServer::new(svc)
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE)
}

/// Serve on the unix socket `path` (replacing a stale socket file; mode 0660) until
/// `shutdown` resolves.
pub async fn serve_unix(
    svc: Arc<Service>,
    path: &Path,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    use anyhow::Context;
    use std::os::unix::fs::PermissionsExt;
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let _ = std::fs::remove_file(path);
    let uds = tokio::net::UnixListener::bind(path)
        .with_context(|| format!("binding the unix socket {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
    tonic::transport::Server::builder()
        .add_service(server(svc))
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::UnixListenerStream::new(uds),
            shutdown,
        )
        .await
        .context("serving on the unix socket")?;
    Ok(())
}

/// Whether `req` carries the bearer `token` (compared in constant time).
pub fn authorized<T>(req: &Request<T>, token: &str) -> bool {
    let Some(v) = req
        .metadata()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let Some(given) = v.strip_prefix("Bearer ") else {
        return false;
    };
    given.len() == token.len()
        && given
            .bytes()
            .zip(token.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// Serve on TCP `addr`; requests without `authorization: Bearer TOKEN` are refused.
pub async fn serve_tcp(
    svc: Arc<Service>,
    addr: std::net::SocketAddr,
    token: String,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    use anyhow::Context;
    let check = move |req: Request<()>| -> Result<Request<()>, Status> {
        if authorized(&req, &token) {
            Ok(req)
        } else {
            Err(Status::unauthenticated(
                "missing or wrong bearer token (metadata `authorization: Bearer TOKEN`)",
            ))
        }
    };
    tonic::transport::Server::builder()
        .add_service(InterceptedService::new(server(svc), check))
        .serve_with_shutdown(addr, shutdown)
        .await
        .with_context(|| format!("serving on {addr}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(h: Option<&str>) -> Request<()> {
        let mut r = Request::new(());
        if let Some(h) = h {
            r.metadata_mut().insert("authorization", h.parse().unwrap());
        }
        r
    }

    #[test]
    fn only_the_exact_bearer_token_passes() {
        assert!(authorized(&req(Some("Bearer s3cret")), "s3cret"));
        assert!(!authorized(&req(Some("Bearer s3cre")), "s3cret"));
        assert!(!authorized(&req(Some("Bearer s3creT")), "s3cret"));
        assert!(!authorized(&req(Some("s3cret")), "s3cret"));
        assert!(!authorized(&req(None), "s3cret"));
    }
}
