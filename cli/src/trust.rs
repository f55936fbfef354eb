//! What `weenv pull` and `weenv run` do with a chain their namespace already has.
//!
//! containerd keeps one snapshot per chain id and namespace, and any image whose config
//! claims the same diff_ids names the same chain. A lazily served layer proves its diff_id
//! only once all its bytes are there, so a chain committed as a remote snapshot of *another
//! blob* than the manifest being pulled names may hold another image's files. The daemon puts
//! the blob a remote snapshot is bound to on its `Stat` answer (`LABEL_BOUND_LAYER`, which no
//! image or client can set), and before such a chain is reused:
//! - bound to the manifest's own layer, or an ordinary snapshot (its diff_id was checked when
//!   it was applied): reused;
//! - bound to another blob: the daemon verifies that blob now (`POST /verify/<digest>`: full
//!   fetch + diff_id check). Verified, its content is the claimed diff_id, which is this
//!   layer's too: reused. Quarantined (or never verifiable): the chain is replaced — it and the
//!   chains built on it are removed from the namespace and the layer is prepared again (the
//!   daemon refuses to hand out a second remote snapshot of the chain, so the layer is fetched
//!   and applied with its diff_id checked);
//! - a chain the daemon already reports quarantined (its `Stat` fails so): replaced.
//!
//! A chain that cannot be verified (daemon unreachable) or replaced (a container uses it) fails
//! the pull with the reason: never silently reused.

use crate::pull::{ctd, Ctd, PullError};
use containerd_client::services::v1::snapshots::snapshots_client::SnapshotsClient;
use containerd_client::services::v1::snapshots::{
    Kind, ListSnapshotsRequest, RemoveSnapshotRequest, StatSnapshotRequest,
};
use tonic::transport::Channel;
use tonic::Code;
use tracing::{info, warn};
use weenv_snapshotter_api::labels::LABEL_BOUND_LAYER;
use weenv_snapshotter_api::verify::{VerifyReport, VerifyVerdict, VERIFY_PATH};

/// What the namespace has under a chain id.
#[derive(Debug, PartialEq, Eq)]
pub enum Existing {
    /// Nothing: prepare the layer.
    Absent,
    /// A snapshot that may be reused.
    Usable,
    /// A snapshot that must not be used (why): replace it.
    Replace(String),
}

/// What to do with `chain` in `c`'s namespace for the manifest's layer `layer` (see the module
/// doc).
pub async fn existing_chain(
    c: &Ctd,
    snaps: &SnapshotsClient<Channel>,
    snapshotter: &str,
    chain: &str,
    layer: &str,
) -> Result<Existing, PullError> {
    let stat = snaps
        .clone()
        .stat(c.req(StatSnapshotRequest {
            snapshotter: snapshotter.to_string(),
            key: chain.to_string(),
        }))
        .await;
    let info = match stat {
        Ok(r) => r.into_inner().info,
        Err(s) if s.code() == Code::NotFound => return Ok(Existing::Absent),
        Err(s) if s.code() == Code::FailedPrecondition && s.message().contains("quarantined") => {
            return Ok(Existing::Replace(s.message().to_string()))
        }
        Err(s) => return Err(ctd("snapshot stat")(s)),
    };
    let bound = info.and_then(|i| i.labels.get(LABEL_BOUND_LAYER).cloned());
    let Some(bound) = bound.filter(|b| b != layer) else {
        return Ok(Existing::Usable);
    };
    let contested = |why: String, hint: &str| PullError::Contested {
        chain: chain.to_string(),
        layer: layer.to_string(),
        bound: bound.clone(),
        why,
        hint: hint.to_string(),
    };
    let Some(addr) = &c.daemon else {
        return Err(contested(
            "the weenv-snapshotter's endpoint is not configured, so it cannot be verified".into(),
            "run weenv with --config naming the daemon's config (observability.listen)",
        ));
    };
    warn!(chain, layer, bound = %bound, "the chain is a lazy layer of another blob: verifying it before it is used");
    let body =
        weenv_snapshotter_api::client::request(addr, "POST", &format!("{VERIFY_PATH}{bound}"))
            .await
            .map_err(|e| {
                contested(
                    format!("verification failed: {e}"),
                    "retry; see the daemon's log",
                )
            })?;
    let report: VerifyReport = serde_json::from_str(&body).map_err(|e| {
        contested(
            format!("unreadable verification answer: {e}"),
            "check that the daemon and weenv are of one version",
        )
    })?;
    Ok(match report.verdict {
        VerifyVerdict::Verified => {
            info!(chain, bound = %bound, secs = report.secs, "the chain's lazy layer verified: it is this layer's diff_id");
            Existing::Usable
        }
        VerifyVerdict::Quarantined => Existing::Replace(format!(
            "its layer failed verification: {}",
            report.reason.unwrap_or_default()
        )),
        VerifyVerdict::Unclaimed => Existing::Replace("its layer has no claimed diff_id".into()),
    })
}

/// Removes `chain` and every chain built on it from `c`'s namespace (committed snapshots only:
/// a container's snapshot on top fails the pull), so the layer can be prepared again.
pub async fn remove_chain(
    c: &Ctd,
    snapshotter: &str,
    chain: &str,
    layer: &str,
    why: &str,
) -> Result<(), PullError> {
    let snaps = SnapshotsClient::new(c.ch.clone());
    // Breadth first from the chain; removed deepest first.
    let mut order = vec![chain.to_string()];
    let mut i = 0;
    while i < order.len() {
        let req = ListSnapshotsRequest {
            snapshotter: snapshotter.to_string(),
            filters: vec![format!("parent=={:?}", order[i])],
        };
        let mut stream = snaps
            .clone()
            .list(c.req(req))
            .await
            .map_err(ctd("snapshot list"))?
            .into_inner();
        while let Some(page) = stream.message().await.map_err(ctd("snapshot list"))? {
            for child in page.info {
                if child.kind != Kind::Committed as i32 {
                    return Err(PullError::Contested {
                        chain: chain.to_string(),
                        layer: layer.to_string(),
                        bound: String::new(),
                        why: format!("{why}; and snapshot {:?} (a container's?) is built on it, so it cannot be replaced", child.name),
                        hint: format!("remove the containers using it (namespace {}), then pull again", c.ns),
                    });
                }
                order.push(child.name);
            }
        }
        i += 1;
    }
    for key in order.iter().rev() {
        let r = snaps
            .clone()
            .remove(c.req(RemoveSnapshotRequest {
                snapshotter: snapshotter.to_string(),
                key: key.clone(),
            }))
            .await;
        match r {
            Ok(_) => {}
            Err(s) if s.code() == Code::NotFound => {}
            Err(s) => return Err(ctd("snapshot remove")(s)),
        }
    }
    warn!(
        chain,
        layer,
        removed = order.len(),
        why,
        "replaced the namespace's chain: it is prepared again from this manifest's layer"
    );
    Ok(())
}
