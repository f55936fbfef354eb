//! The tonic adapter: containerd's Snapshots API (containerd-snapshots 0.3, tonic 0.9) over
//! [`SnapshotService`]. The only place that knows tonic types; errors map to gRPC codes in
//! one table ([`status_of`]).

// tonic::Status is large; it is the error type the trait demands.
#![allow(clippy::result_large_err)]

use crate::mounts::MountSpec;
use crate::service::{Info, SnapshotError, SnapshotService};
use crate::store::{Kind, StoreError};
use containerd_snapshots::api::types::Mount;
use containerd_snapshots::tonic::{self, Status};
use containerd_snapshots::{Info as CInfo, Kind as CKind, Snapshotter, Usage};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};
use thiserror::Error;
use tracing::{debug, warn};

/// Errors setting up or running the gRPC server.
#[derive(Debug, Error)]
pub enum GrpcError {
    #[error("cannot bind unix socket {path}: {error} (is another weenv-snapshotter running?)")]
    Bind {
        path: std::path::PathBuf,
        error: std::io::Error,
    },
    #[error("gRPC server failed: {0}")]
    Serve(String),
}

/// The one error -> gRPC status table.
pub fn status_of(e: &SnapshotError) -> Status {
    let msg = e.to_string();
    match e {
        SnapshotError::Store(StoreError::NotFound(_)) => Status::not_found(msg),
        SnapshotError::Store(StoreError::AlreadyExists(_)) | SnapshotError::RemoteCommitted(_) => {
            Status::already_exists(msg)
        }
        SnapshotError::Store(StoreError::FailedPrecondition(_)) => Status::failed_precondition(msg),
        SnapshotError::Remount {
            error: crate::remote::RemoteError::Limit(_),
            ..
        } => Status::resource_exhausted(msg),
        SnapshotError::Store(StoreError::InvalidArgument(_)) | SnapshotError::Filter(_) => {
            Status::invalid_argument(msg)
        }
        SnapshotError::Store(StoreError::Db { .. } | StoreError::Corrupt { .. })
        | SnapshotError::Io { .. }
        | SnapshotError::Remount { .. } => Status::internal(msg),
    }
}

fn st<'a>(op: &'static str, key: &'a str) -> impl FnOnce(SnapshotError) -> Status + 'a {
    move |e| {
        let s = status_of(&e);
        if matches!(s.code(), tonic::Code::Internal) {
            warn!(op, key, error = %e, "snapshot operation failed");
        } else {
            debug!(op, key, error = %e, "snapshot operation refused");
        }
        s
    }
}

fn to_mounts(m: Vec<MountSpec>) -> Vec<Mount> {
    m.into_iter()
        .map(|m| Mount {
            r#type: m.kind,
            source: m.source,
            target: String::new(),
            options: m.options,
        })
        .collect()
}

fn to_info(r: Info) -> CInfo {
    CInfo {
        kind: match r.kind {
            Kind::View => CKind::View,
            Kind::Active => CKind::Active,
            Kind::Committed => CKind::Committed,
        },
        name: r.key,
        parent: r.parent,
        labels: r.labels.into_iter().collect(),
        created_at: UNIX_EPOCH + Duration::from_nanos(r.created_nanos),
        updated_at: UNIX_EPOCH + Duration::from_nanos(r.updated_nanos),
    }
}

/// Adapter implementing containerd-snapshots' `Snapshotter`.
pub struct Grpc {
    svc: Arc<SnapshotService>,
}

impl Grpc {
    pub fn new(svc: Arc<SnapshotService>) -> Self {
        Self { svc }
    }
}

/// Walk results as a stream.
pub type InfoStream = futures::stream::Iter<std::vec::IntoIter<Result<CInfo, Status>>>;

#[tonic::async_trait]
impl Snapshotter for Grpc {
    type Error = Status;
    type InfoStream = InfoStream;

    async fn stat(&self, key: String) -> Result<CInfo, Status> {
        self.svc.stat(&key).map(to_info).map_err(st("stat", &key))
    }

    async fn update(&self, info: CInfo, fieldpaths: Option<Vec<String>>) -> Result<CInfo, Status> {
        let key = info.name.clone();
        self.svc
            .update(&key, info.labels, &fieldpaths.unwrap_or_default())
            .map(to_info)
            .map_err(st("update", &key))
    }

    async fn usage(&self, key: String) -> Result<Usage, Status> {
        let svc = self.svc.clone();
        let k = key.clone();
        let r = tokio::task::spawn_blocking(move || svc.usage(&k))
            .await
            .map_err(|e| Status::internal(format!("usage task: {e}")))?;
        let (size, inodes) = r.map_err(st("usage", &key))?;
        Ok(Usage { size, inodes })
    }

    async fn mounts(&self, key: String) -> Result<Vec<Mount>, Status> {
        self.svc
            .mounts(&key)
            .map(to_mounts)
            .map_err(st("mounts", &key))
    }

    async fn prepare(
        &self,
        key: String,
        parent: String,
        labels: HashMap<String, String>,
    ) -> Result<Vec<Mount>, Status> {
        debug!(key, parent, ?labels, "prepare");
        self.svc
            .prepare(&key, &parent, labels)
            .await
            .map(to_mounts)
            .map_err(st("prepare", &key))
    }

    async fn view(
        &self,
        key: String,
        parent: String,
        labels: HashMap<String, String>,
    ) -> Result<Vec<Mount>, Status> {
        debug!(key, parent, "view");
        self.svc
            .view(&key, &parent, labels)
            .map(to_mounts)
            .map_err(st("view", &key))
    }

    async fn commit(
        &self,
        name: String,
        key: String,
        labels: HashMap<String, String>,
    ) -> Result<(), Status> {
        debug!(name, key, "commit");
        let svc = self.svc.clone();
        let k = key.clone();
        tokio::task::spawn_blocking(move || svc.commit(&name, &k, labels))
            .await
            .map_err(|e| Status::internal(format!("commit task: {e}")))?
            .map_err(st("commit", &key))
    }

    async fn remove(&self, key: String) -> Result<(), Status> {
        debug!(key, "remove");
        let svc = self.svc.clone();
        let k = key.clone();
        tokio::task::spawn_blocking(move || svc.remove(&k))
            .await
            .map_err(|e| Status::internal(format!("remove task: {e}")))?
            .map_err(st("remove", &key))
    }

    async fn clear(&self) -> Result<(), Status> {
        let svc = self.svc.clone();
        tokio::task::spawn_blocking(move || svc.cleanup())
            .await
            .map_err(|e| Status::internal(format!("cleanup task: {e}")))?
            .map_err(st("cleanup", ""))
    }

    async fn list(&self, _snapshotter: String, filters: Vec<String>) -> Result<InfoStream, Status> {
        debug!(?filters, "walk");
        let infos = self.svc.walk(&filters).map_err(st("walk", ""))?;
        Ok(futures::stream::iter(
            infos
                .into_iter()
                .map(|i| Ok(to_info(i)))
                .collect::<Vec<_>>(),
        ))
    }
}

/// Serve the Snapshots API on `socket` until `shutdown` resolves.
pub async fn serve(
    svc: Arc<SnapshotService>,
    socket: &Path,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), GrpcError> {
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir).map_err(|source| GrpcError::Bind {
            path: socket.to_path_buf(),
            error: source,
        })?;
    }
    match std::fs::remove_file(socket) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(GrpcError::Bind {
                path: socket.to_path_buf(),
                error: source,
            })
        }
    }
    let uds = tokio::net::UnixListener::bind(socket).map_err(|source| GrpcError::Bind {
        path: socket.to_path_buf(),
        error: source,
    })?;
    tonic::transport::Server::builder()
        .add_service(containerd_snapshots::server(Arc::new(Grpc::new(svc))))
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::UnixListenerStream::new(uds),
            shutdown,
        )
        .await
        .map_err(|e| GrpcError::Serve(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{FilterError, MetaStore};
    use containerd_client::services::v1::snapshots::snapshots_client::SnapshotsClient;
    use containerd_client::services::v1::snapshots::*;

    /// The real server on a unix socket, driven by containerd's (tonic 0.14) client: the codes
    /// containerd sees.
    #[tokio::test]
    async fn serves_snapshots_api_over_unix_socket() {
        let d = tempfile::tempdir().unwrap();
        let store = Arc::new(MetaStore::open(&d.path().join("m.redb")).unwrap());
        let svc = Arc::new(SnapshotService::new(store, d.path().join("s"), None).unwrap());
        let sock = d.path().join("snap.sock");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn({
            let sock = sock.clone();
            async move {
                serve(svc, &sock, async {
                    let _ = rx.await;
                })
                .await
            }
        });
        let mut ch = None;
        for _ in 0..100 {
            if let Ok(c) = containerd_client::connect(&sock).await {
                ch = Some(c);
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut c = SnapshotsClient::new(ch.unwrap());
        let sn = || "weenv".to_string();
        let prepare_a = PrepareSnapshotRequest {
            snapshotter: sn(),
            key: "a".into(),
            parent: String::new(),
            labels: HashMap::new(),
        };
        let stat = |key: &str| StatSnapshotRequest {
            snapshotter: sn(),
            key: key.into(),
        };
        let m = c
            .prepare(prepare_a.clone())
            .await
            .unwrap()
            .into_inner()
            .mounts;
        assert_eq!(
            (m[0].r#type.as_str(), m[0].options.clone()),
            ("bind", vec!["rw".to_string(), "rbind".to_string()])
        );
        let dup = c.prepare(prepare_a).await.unwrap_err();
        assert_eq!(dup.code(), containerd_client::tonic::Code::AlreadyExists);
        c.commit(CommitSnapshotRequest {
            snapshotter: sn(),
            name: "c".into(),
            key: "a".into(),
            labels: HashMap::new(),
        })
        .await
        .unwrap();
        let info = c.stat(stat("c")).await.unwrap().into_inner().info.unwrap();
        assert_eq!((info.name.as_str(), info.kind), ("c", 3)); // Kind::Committed = 3
        c.view(ViewSnapshotRequest {
            snapshotter: sn(),
            key: "v".into(),
            parent: "c".into(),
            labels: HashMap::new(),
        })
        .await
        .unwrap();
        let e = c
            .remove(RemoveSnapshotRequest {
                snapshotter: sn(),
                key: "c".into(),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), containerd_client::tonic::Code::FailedPrecondition);
        let e = c.stat(stat("nope")).await.unwrap_err();
        assert_eq!(e.code(), containerd_client::tonic::Code::NotFound);
        let mut w = c
            .list(ListSnapshotsRequest {
                snapshotter: sn(),
                filters: vec!["parent==c".into()],
            })
            .await
            .unwrap()
            .into_inner();
        let mut names = Vec::new();
        while let Some(r) = w.message().await.unwrap() {
            names.extend(r.info.into_iter().map(|i| i.name));
        }
        assert_eq!(names, vec!["v".to_string()]);
        let u = c
            .usage(UsageRequest {
                snapshotter: sn(),
                key: "c".into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(u.inodes >= 1);
        c.cleanup(CleanupRequest { snapshotter: sn() })
            .await
            .unwrap();
        let _ = tx.send(());
        server.await.unwrap().unwrap();
    }

    #[test]
    fn error_codes() {
        use containerd_snapshots::tonic::Code;
        let c = |e: SnapshotError| status_of(&e).code();
        assert_eq!(c(StoreError::NotFound("k".into()).into()), Code::NotFound);
        assert_eq!(
            c(StoreError::AlreadyExists("k".into()).into()),
            Code::AlreadyExists
        );
        assert_eq!(
            c(SnapshotError::RemoteCommitted("t".into())),
            Code::AlreadyExists
        );
        assert_eq!(
            c(StoreError::FailedPrecondition("c".into()).into()),
            Code::FailedPrecondition
        );
        assert_eq!(
            c(StoreError::InvalidArgument("c".into()).into()),
            Code::InvalidArgument
        );
        assert_eq!(
            c(FilterError::Syntax {
                filter: "x".into(),
                message: "y".into()
            }
            .into()),
            Code::InvalidArgument
        );
    }
}
