//! The snapshot service: containerd snapshotter semantics over [`MetaStore`] plus snapshot
//! directories, with the remote path delegated to a [`LayerProvider`].
//!
//! Ordinary snapshots live in `<snapshots_dir>/<id>/{fs,work}` exactly like containerd's
//! overlayfs snapshotter; remote snapshots are committed records whose directory is a FUSE
//! layer dir. The gRPC adapter (`grpc.rs`) only converts types and errors.

use crate::mounts::{
    hold_natives, mounts_for, native_for_new, native_lower, release_native, Access, MountSpec,
    OverlayFeatures,
};
use crate::remote::contest::ClaimSource;
use crate::remote::identity::claim_fits_target;
use crate::remote::source::{LayerSources, NoSource};
use crate::remote::{
    LayerProvider, RemoteError, RemoteLayerRequest, UnsourcedLayerRequest, LABEL_TARGET,
    LABEL_WEENV_LAYER,
};
use crate::store::{
    Filter, FilterError, Kind, MetaStore, NewSnapshot, RemoteLayerRef, SnapshotRecord, StoreError,
};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};
use thiserror::Error;
use tracing::{debug, info, warn};
use weenv_format::Digest;
use weenv_snapshotter_api::config::TrustSection;

/// Service errors, mapped to gRPC codes in `grpc.rs`.
#[derive(Debug, Error)]
pub enum SnapshotError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The cause is part of the message, not a `source()` (said once by chain printers).
    #[error("invalid filter: {0}")]
    Filter(FilterError),
    #[error("{op} {path}: {error}")]
    Io {
        op: &'static str,
        path: PathBuf,
        error: std::io::Error,
    },
    /// The remote path committed `target`: containerd must see AlreadyExists.
    #[error("target snapshot {0:?} already exists (remote layer)")]
    RemoteCommitted(String),
    #[error("remount of {digest} failed: {error}")]
    Remount { digest: String, error: RemoteError },
    /// A remote snapshot the call reaches is quarantined (see `service::gate`).
    #[error(
        "snapshot {key:?} is lazy layer {digest}, quarantined ({reason}): nothing new may use it; \
             remove the images built on it and its chain snapshot in their namespace \
             (`ctr -n NAMESPACE snapshots --snapshotter weenv rm CHAIN_ID`), then pull again: \
             the layer then takes the ordinary path, where its diff_id is checked"
    )]
    Quarantined {
        key: String,
        digest: String,
        reason: String,
    },
    /// A contested remote snapshot's verification concluded nothing (see `service::gate`).
    #[error(
        "snapshot {key:?} (lazy layer {digest}) is contested: image manifest {manifest} claims \
             its chain with layer {other}; it is not used before its layer is verified, and the \
             verification did not conclude: {reason}"
    )]
    Unverified {
        key: String,
        digest: String,
        manifest: String,
        other: String,
        reason: String,
    },
}

impl From<FilterError> for SnapshotError {
    fn from(e: FilterError) -> Self {
        SnapshotError::Filter(e)
    }
}

fn io_err<'a>(
    op: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> SnapshotError + 'a {
    move |source| SnapshotError::Io {
        op,
        path: path.to_path_buf(),
        error: source,
    }
}

/// Snapshot info as returned by Stat/Update/Walk.
pub type Info = SnapshotRecord;

/// Counters of the remote path (exposed on `/metrics`).
#[derive(Debug, Default)]
pub struct RemoteCounters {
    /// Prepares answered with a remote snapshot (AlreadyExists).
    pub remote_hits: AtomicU64,
    /// Prepares with remote labels whose layer is not a weenv layer.
    pub remote_not_weenv: AtomicU64,
    /// Prepares whose remote path failed (fell back to the ordinary path).
    pub remote_errors: AtomicU64,
    /// Prepares refused the remote path because the layer's identity did not match (another
    /// layer under the chain, another claimed diff_id or TOC, a quarantined layer, no claim):
    /// they took the ordinary path, where containerd checks the diff_id.
    pub remote_refused: AtomicU64,
    /// Prepares naming a weenv layer but not its image (stock clients) whose image was not
    /// found in containerd's content store: they took the ordinary path.
    pub remote_no_source: AtomicU64,
    /// Prepares of weenv layers whose image is not in `trust.lazy_sources`: ordinary path.
    pub remote_untrusted: AtomicU64,
    /// Calls that reached a contested unverified remote snapshot (held for its verification).
    pub contested: AtomicU64,
    /// Gate checks that could not read containerd's image claims (snapshots used unchecked).
    pub contest_unchecked: AtomicU64,
    /// Such Prepares while containerd did not answer on `registry.containerd_socket`.
    pub remote_no_containerd: AtomicU64,
    /// Such Prepares whose registry host name names several configured registries (containerd
    /// drops the port) and no image record said which.
    pub remote_ambiguous_source: AtomicU64,
}

impl RemoteCounters {
    /// Prometheus text for these counters.
    pub fn render(&self) -> String {
        let mut e = crate::metrics::Exposition::new();
        e.counter_family(
            "weenv_remote_prepares_total",
            "Prepares with remote-snapshot labels, by outcome.",
            "outcome",
            [
                ("remote", &self.remote_hits),
                ("not_weenv", &self.remote_not_weenv),
                ("error", &self.remote_errors),
                ("refused", &self.remote_refused),
                ("no_source", &self.remote_no_source),
                ("untrusted_source", &self.remote_untrusted),
                ("no_containerd", &self.remote_no_containerd),
                ("ambiguous_source", &self.remote_ambiguous_source),
            ]
            .map(|(outcome, c)| (outcome, c.load(Ordering::Relaxed)))
            .to_vec(),
        );
        e.counter(
            "weenv_contested_snapshots_total",
            "Stat/Prepare/View calls that reached an unverified remote snapshot whose chain another image claims with another layer (held until the layer was verified).",
            self.contested.load(Ordering::Relaxed),
        );
        e.counter(
            "weenv_contest_unchecked_total",
            "Gate checks that could not read containerd's image claims (unverified remote snapshots used unchecked).",
            self.contest_unchecked.load(Ordering::Relaxed),
        );
        e.render()
    }
}

/// The containerd snapshotter.
pub struct SnapshotService {
    counters: RemoteCounters,
    /// Held while a remote snapshot is checked for conflicts and inserted.
    remote_commit: parking_lot::Mutex<()>,
    /// Layers a remote Prepare is mounting and has not yet recorded (digest → Prepares):
    /// cleanup must not release them in that window.
    mounting: Arc<parking_lot::Mutex<HashMap<String, usize>>>,
    store: Arc<MetaStore>,
    snapshots_dir: PathBuf,
    layers: Option<Arc<dyn LayerProvider>>,
    /// Where layers come from when a Prepare names only the layer (stock clients).
    sources: Option<Arc<dyn LayerSources>>,
    /// What the node's images claim (the gate's contest check).
    claims: Option<Arc<dyn ClaimSource>>,
    /// Which images may be lazy; contest checks.
    trust: TrustSection,
    /// What the kernel's overlayfs supports (`xino`).
    overlay: OverlayFeatures,
    /// Which group repository holds a layer of a plan composed on this node.
    plans: Option<Arc<dyn crate::plans::PlanIndex>>,
}

/// containerd's default namespace (a Prepare without the namespace header).
pub const DEFAULT_NAMESPACE: &str = "default";

fn now_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

fn to_btree(labels: HashMap<String, String>) -> BTreeMap<String, String> {
    labels.into_iter().collect()
}

impl SnapshotService {
    /// A service over `store`, keeping ordinary snapshot dirs in `snapshots_dir`.
    pub fn new(
        store: Arc<MetaStore>,
        snapshots_dir: PathBuf,
        layers: Option<Arc<dyn LayerProvider>>,
    ) -> Result<Self, SnapshotError> {
        crate::dirs::ensure_private(&snapshots_dir).map_err(io_err("create", &snapshots_dir))?;
        Ok(Self {
            counters: RemoteCounters::default(),
            remote_commit: parking_lot::Mutex::new(()),
            mounting: Arc::default(),
            store,
            snapshots_dir,
            layers,
            sources: None,
            claims: None,
            trust: TrustSection::default(),
            overlay: OverlayFeatures::detect(),
            plans: None,
        })
    }

    /// Checks contested snapshots against the image claims of `claims` (see `service::gate`).
    pub fn with_claims(mut self, claims: Arc<dyn ClaimSource>) -> Self {
        self.claims = Some(claims);
        self
    }

    /// The trust policy (`[trust]`).
    pub fn with_trust(mut self, trust: TrustSection) -> Self {
        self.trust = trust;
        self
    }

    /// Mount specs for a kernel with `overlay` (default: the running kernel's).
    pub fn with_overlay(mut self, overlay: OverlayFeatures) -> Self {
        self.overlay = overlay;
        self
    }

    /// Finds the image of layers whose Prepare names only the layer through `sources`.
    pub fn with_sources(mut self, sources: Arc<dyn LayerSources>) -> Self {
        self.sources = Some(sources);
        self
    }

    /// Layers of plans composed on this node are read from their groups' repositories.
    pub fn with_plans(mut self, plans: Arc<dyn crate::plans::PlanIndex>) -> Self {
        self.plans = Some(plans);
        self
    }

    /// Remote-path counters.
    pub fn counters(&self) -> &RemoteCounters {
        &self.counters
    }

    /// The metadata store (status, pull bookkeeping).
    pub fn store(&self) -> &Arc<MetaStore> {
        &self.store
    }

    fn dir(&self, id: u64) -> PathBuf {
        self.snapshots_dir.join(id.to_string())
    }

    fn layer_dir(&self, rec: &SnapshotRecord) -> PathBuf {
        match &rec.remote {
            Some(r) => r.dir.clone(),
            None => self.dir(rec.id).join("fs"),
        }
    }

    /// Remount every committed remote snapshot's layer. Call before serving gRPC.
    /// Returns (remounted, failed) counts; failures are logged, not fatal.
    pub async fn remount_all(&self) -> Result<(usize, usize), SnapshotError> {
        let Some(layers) = &self.layers else {
            return Ok((0, 0));
        };
        let mut done = HashSet::new();
        let (mut ok, mut failed) = (0, 0);
        for rec in self.store.list()? {
            let Some(r) = &rec.remote else { continue };
            if !done.insert(r.digest.clone()) {
                continue;
            }
            let res = match r.digest.parse::<Digest>() {
                Ok(d) => layers.remount(&d).await.map(|m| (m, d)),
                Err(e) => Err(RemoteError::Toc {
                    digest: r.digest.clone(),
                    message: e.to_string(),
                }),
            };
            match res {
                Ok((m, d)) if m.dir == r.dir || layers.serves_dir(&d, &r.dir) => ok += 1,
                Ok((m, _)) => {
                    warn!(digest = %r.digest, old = %r.dir.display(), new = %m.dir.display(),
                        "layer directory moved (mountpoint changed?); snapshots keep the old path");
                    failed += 1;
                }
                Err(e) => {
                    warn!(digest = %r.digest, error = %e, "cannot remount layer");
                    failed += 1;
                }
            }
        }
        // Native trees named by live mounts are pinned again before any can be evicted.
        for rec in self.store.list()? {
            hold_natives(Some(layers.as_ref()), &rec.native, true);
        }
        layers.native_restored();
        Ok((ok, failed))
    }

    pub fn stat(&self, key: &str) -> Result<Info, SnapshotError> {
        Ok(self.store.get(key)?)
    }

    pub fn update(
        &self,
        key: &str,
        labels: HashMap<String, String>,
        fieldpaths: &[String],
    ) -> Result<Info, SnapshotError> {
        Ok(self
            .store
            .update_labels(key, &to_btree(labels), fieldpaths, now_nanos())?)
    }

    /// (size bytes, inodes).
    pub fn usage(&self, key: &str) -> Result<(i64, i64), SnapshotError> {
        let rec = self.store.get(key)?;
        if rec.kind == Kind::Committed {
            return Ok((rec.size, rec.inodes));
        }
        let fs = self.dir(rec.id).join("fs");
        dir_usage(&fs).map_err(io_err("usage of", &fs))
    }

    pub fn mounts(&self, key: &str) -> Result<Vec<MountSpec>, SnapshotError> {
        let rec = self.store.get(key)?;
        self.mounts_of(&rec)
    }

    fn mounts_of(&self, rec: &SnapshotRecord) -> Result<Vec<MountSpec>, SnapshotError> {
        let access = match rec.kind {
            Kind::Active => Access::Active,
            Kind::View => Access::View,
            Kind::Committed => {
                return Err(StoreError::FailedPrecondition(format!(
                    "snapshot {:?} is committed: mounts exist only for active and view snapshots",
                    rec.key
                ))
                .into())
            }
        };
        let parents: Vec<PathBuf> = self
            .chain(&rec.parent)?
            .iter()
            .map(|p| {
                native_lower(self.layers.as_deref(), &rec.native, p)
                    .unwrap_or_else(|| self.layer_dir(p))
            })
            .collect();
        let d = self.dir(rec.id);
        let (upper, work) = (d.join("fs"), d.join("work"));
        let dev = |p: &Path| std::fs::metadata(p).map(|m| m.dev()).ok();
        let xino = self.overlay.xino
            && self.overlay.xino_for(
                (access == Access::Active).then(|| dev(&upper)),
                &parents.iter().map(|p| dev(p)).collect::<Vec<_>>(),
            );
        Ok(mounts_for(access, &upper, &work, &parents, xino))
    }

    /// Snapshot `parent` and its ancestors, nearest first.
    fn chain(&self, parent: &str) -> Result<Vec<SnapshotRecord>, SnapshotError> {
        let mut out = Vec::new();
        let mut p = parent.to_string();
        while !p.is_empty() {
            let prec = self.store.get(&p)?;
            p = prec.parent.clone();
            out.push(prec);
        }
        Ok(out)
    }

    /// Prepare an active snapshot; with remote labels and a weenv layer, commit a remote
    /// snapshot instead and return [`SnapshotError::RemoteCommitted`].
    pub async fn prepare(
        &self,
        key: &str,
        parent: &str,
        labels: HashMap<String, String>,
    ) -> Result<Vec<MountSpec>, SnapshotError> {
        self.prepare_in(DEFAULT_NAMESPACE, key, parent, labels)
            .await
    }

    /// The remote request of a Prepare: the image its labels name, or (stock clients: only the
    /// layer is named) the image the content store of `namespace` names for the layer.
    async fn remote_request(
        &self,
        namespace: &str,
        labels: &HashMap<String, String>,
    ) -> Option<RemoteLayerRequest> {
        let home = |d: &weenv_format::Digest| self.plans.as_ref().and_then(|p| p.home(d));
        if let Some(r) = RemoteLayerRequest::from_labels(labels) {
            // A plan reference names the plan's repository, which does not hold the layer.
            let r = match home(&r.digest) {
                Some(h) => RemoteLayerRequest {
                    reference: h.reference,
                    manifest: Some(h.manifest),
                    ..r
                },
                None => r,
            };
            return Some(RemoteLayerRequest {
                namespace: Some(namespace.to_string()),
                ..r
            });
        }
        let u = UnsourcedLayerRequest::from_labels(labels)?;
        if let Some(h) = home(&u.layer.digest) {
            debug!(digest = %u.layer.digest, reference = %h.reference, "layer of a plan composed on this node");
            return Some(RemoteLayerRequest {
                namespace: Some(namespace.to_string()),
                ..u.with_source(h.reference, Some(h.manifest))
            });
        }
        let sources = self.sources.as_ref()?;
        match sources.source(namespace, &u.layer.digest).await {
            Ok(s) => {
                debug!(digest = %u.layer.digest, reference = %s.reference, "layer source found in containerd's content store");
                Some(RemoteLayerRequest {
                    namespace: Some(namespace.to_string()),
                    ..u.with_source(s.reference, Some(s.manifest))
                })
            }
            Err(why) => {
                let c = match &why {
                    NoSource::Unreachable(_) => &self.counters.remote_no_containerd,
                    NoSource::AmbiguousHost { .. } => &self.counters.remote_ambiguous_source,
                    NoSource::NoManifest | NoSource::NotServed { .. } => {
                        &self.counters.remote_no_source
                    }
                };
                c.fetch_add(1, Ordering::Relaxed);
                warn!(namespace, digest = %u.layer.digest, target = %u.target, reason = %why,
                    "weenv layer without a source; taking the ordinary path (the whole layer is fetched)");
                None
            }
        }
    }

    /// [`Self::prepare`] for a Prepare in containerd namespace `namespace`.
    pub async fn prepare_in(
        &self,
        namespace: &str,
        key: &str,
        parent: &str,
        labels: HashMap<String, String>,
    ) -> Result<Vec<MountSpec>, SnapshotError> {
        self.check_parent(parent).await?;
        let req = match &self.layers {
            Some(_) => self.remote_request(namespace, &labels).await,
            None => None,
        };
        let req = req.filter(|r| {
            let ok = r
                .reference
                .parse::<weenv_registry::Reference>()
                .is_ok_and(|i| self.trust.allows_lazy(&i));
            if !ok {
                self.counters
                    .remote_untrusted
                    .fetch_add(1, Ordering::Relaxed);
                info!(key, reference = %r.reference, digest = %r.digest,
                    "image not in trust.lazy_sources: its layer takes the ordinary path");
            }
            ok
        });
        if let (Some(layers), Some(req)) = (&self.layers, req) {
            match self
                .try_remote(layers.as_ref(), &req, parent, &labels)
                .await
            {
                Ok(true) => {
                    self.counters.remote_hits.fetch_add(1, Ordering::Relaxed);
                    return Err(SnapshotError::RemoteCommitted(req.target));
                }
                Ok(false) => {
                    self.counters
                        .remote_not_weenv
                        .fetch_add(1, Ordering::Relaxed);
                }
                Err(SnapshotError::Remount {
                    error: RemoteError::Identity { reason, .. },
                    ..
                }) => {
                    self.counters.remote_refused.fetch_add(1, Ordering::Relaxed);
                    warn!(key, target = %req.target, digest = %req.digest, reason,
                        "layer not shared lazily; taking the ordinary path")
                }
                Err(
                    e @ SnapshotError::Remount {
                        error: RemoteError::Limit(_),
                        ..
                    },
                ) => {
                    self.counters.remote_errors.fetch_add(1, Ordering::Relaxed);
                    warn!(key, digest = %req.digest, error = %e, "layer refused: over a limit");
                    return Err(e);
                }
                Err(e) => {
                    self.counters.remote_errors.fetch_add(1, Ordering::Relaxed);
                    warn!(key, digest = %req.digest, error = %e,
                        "remote path failed; falling back to the ordinary path")
                }
            }
        }
        self.create_local(key, parent, labels, Kind::Active)
    }

    /// The remote path. `Ok(true)`: a remote snapshot bound to this very layer exists (made
    /// now or before) under (target, parent); `Ok(false)`: take the ordinary path.
    async fn try_remote(
        &self,
        layers: &dyn LayerProvider,
        req: &RemoteLayerRequest,
        parent: &str,
        labels: &HashMap<String, String>,
    ) -> Result<bool, SnapshotError> {
        // containerd looks the snapshot up by (snapshot.ref label, parent) with Walk, so a
        // committed remote one with both is the answer — if it was made from this layer.
        match remote_match(&self.store.list()?, &req.target, parent, &req.digest) {
            RemoteMatch::Same(key) => {
                if let Some(reason) = layers.quarantined(&req.digest) {
                    return Err(refused(req, format!("the layer is quarantined: {reason}")));
                }
                debug!(key, target = %req.target, "remote snapshot exists");
                layers.prefetch(req); // another image may share the layer with its own profile
                return Ok(true);
            }
            RemoteMatch::Conflict(other) => return Err(conflict(req, parent, &other)),
            RemoteMatch::None => {}
        }
        if let Some(md) = labels.get(crate::remote::LABEL_CRI_MANIFEST_DIGEST) {
            // Resolved references: which manifest this reference named when it was pulled.
            if let Err(e) = self.store.put_ref(&req.reference, md) {
                warn!(reference = %req.reference, error = %e, "cannot record resolved reference");
            }
        }
        // From here until the record is in the store (or this Prepare gave up) cleanup
        // leaves the layer mounted.
        let _mounting = MountingGuard::new(&self.mounting, req.digest.to_string());
        let Some(m) = layers
            .mount(req)
            .await
            .map_err(|source| SnapshotError::Remount {
                digest: req.digest.to_string(),
                error: source,
            })?
        else {
            return Ok(false);
        };
        if let Some(claim) = &m.diff_id {
            // Checked when the parent's chain is known (a base layer, or a parent carrying
            // its chain label).
            let parent_chain = self.chain_of(parent)?;
            let known = parent.is_empty() || parent_chain.is_some();
            if known && !claim_fits_target(parent_chain.as_deref(), claim, &req.target) {
                return Err(refused(
                    req,
                    format!(
                        "the image config claims diff_id {claim}, from which chain {} does \
                         not follow (labels and config of two different images?)",
                        req.target
                    ),
                ));
            }
        }
        let mut l = to_btree(labels.clone());
        l.insert(LABEL_TARGET.into(), req.target.clone());
        l.insert(LABEL_WEENV_LAYER.into(), req.digest.to_string());
        // Check and insert under one lock: two Prepares of (target, parent) for different
        // layers must not both commit a snapshot containerd's Walk could confuse.
        let _one = self.remote_commit.lock();
        let recs = self.store.list()?;
        match remote_match(&recs, &req.target, parent, &req.digest) {
            RemoteMatch::Same(_) => return Ok(true),
            RemoteMatch::Conflict(other) => return Err(conflict(req, parent, &other)),
            RemoteMatch::None => {}
        }
        let name = remote_snapshot_name(&req.target, parent, &req.digest, |k| {
            recs.iter().any(|r| r.key == k)
        });
        self.store.create(NewSnapshot {
            key: name,
            parent: parent.to_string(),
            kind: Kind::Committed,
            labels: l,
            remote: Some(RemoteLayerRef {
                digest: req.digest.to_string(),
                dir: m.dir.clone(),
                toc_digest: m.toc_digest.as_ref().map(|d| d.to_string()),
                diff_id: m.diff_id.as_ref().map(|d| d.to_string()),
            }),
            usage: (m.size, m.inodes),
            now_nanos: now_nanos(),
            native: Vec::new(),
        })?;
        info!(target = %req.target, digest = %req.digest, dir = %m.dir.display(),
            "remote snapshot committed");
        if self.trust.verify_on_commit {
            self.verify_in_background(&req.digest);
        }
        Ok(true)
    }

    /// The chain id of snapshot `key` when known: a remote snapshot's target label, or an
    /// ordinary one's `containerd.io/snapshot.ref` label. `None` for `""` or when unknown.
    fn chain_of(&self, key: &str) -> Result<Option<String>, SnapshotError> {
        if key.is_empty() {
            return Ok(None);
        }
        match self.store.get(key) {
            Ok(r) => Ok(r.labels.get(LABEL_TARGET).cloned()),
            Err(StoreError::NotFound(_)) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    pub fn view(
        &self,
        key: &str,
        parent: &str,
        labels: HashMap<String, String>,
    ) -> Result<Vec<MountSpec>, SnapshotError> {
        self.create_local(key, parent, labels, Kind::View)
    }

    fn create_local(
        &self,
        key: &str,
        parent: &str,
        labels: HashMap<String, String>,
        kind: Kind,
    ) -> Result<Vec<MountSpec>, SnapshotError> {
        // Complete layers with a native tree are mounted from it (pinned for this snapshot).
        let chain = self.chain(parent)?;
        let native = native_for_new(self.layers.as_deref(), &chain);
        let rec = self
            .store
            .create(NewSnapshot {
                key: key.to_string(),
                parent: parent.to_string(),
                kind,
                labels: to_btree(labels),
                remote: None,
                usage: (0, 0),
                now_nanos: now_nanos(),
                native: native.clone(),
            })
            .inspect_err(|_| release_native(self.layers.as_deref(), &native))?;
        let d = self.dir(rec.id);
        // The nearest parent's directory as this snapshot's mount names it (a native tree,
        // a FUSE layer dir or an ordinary snapshot's fs): the new root takes its owner.
        let top = chain.first().map(|p| {
            native_lower(self.layers.as_deref(), &native, p).unwrap_or_else(|| self.layer_dir(p))
        });
        let made = make_snapshot_dirs(&d, kind, top.as_deref());
        if let Err(e) = made {
            let _ = self.store.remove(key);
            let _ = std::fs::remove_dir_all(&d);
            release_native(self.layers.as_deref(), &rec.native);
            return Err(e);
        }
        self.mounts_of(&rec)
    }

    pub fn commit(
        &self,
        name: &str,
        key: &str,
        labels: HashMap<String, String>,
    ) -> Result<(), SnapshotError> {
        let rec = self.store.get(key)?;
        let fs = self.dir(rec.id).join("fs");
        let usage = if rec.kind == Kind::Active {
            dir_usage(&fs).map_err(io_err("usage of", &fs))?
        } else {
            (0, 0) // the store rejects it with FailedPrecondition
        };
        self.store
            .commit(name, key, to_btree(labels), usage, now_nanos())?;
        release_native(self.layers.as_deref(), &rec.native);
        Ok(())
    }

    pub fn remove(&self, key: &str) -> Result<(), SnapshotError> {
        let rec = self.store.remove(key)?;
        release_native(self.layers.as_deref(), &rec.native);
        if rec.remote.is_none() {
            let d = self.dir(rec.id);
            if let Err(e) = std::fs::remove_dir_all(&d) {
                // Cleanup retries orphans later.
                warn!(dir = %d.display(), error = %e, "cannot remove snapshot dir");
            }
        }
        Ok(())
    }

    /// Snapshots matching `filters`, remote snapshots first: after a Prepare answered
    /// AlreadyExists, containerd takes the first committed snapshot its Walk finds under
    /// (target label, parent), and an ordinary snapshot may carry any label its creator chose.
    pub fn walk(&self, filters: &[String]) -> Result<Vec<Info>, SnapshotError> {
        let f = Filter::parse(filters)?;
        let mut out: Vec<Info> = self
            .store
            .list()?
            .into_iter()
            .filter(|r| f.matches(r))
            .collect();
        out.sort_by_key(|r| r.remote.is_none()); // stable: key order within each group
        Ok(out)
    }

    /// Remove directories no snapshot refers to and release unreferenced remote layers.
    pub fn cleanup(&self) -> Result<(), SnapshotError> {
        let ids = |recs: &[SnapshotRecord]| -> HashSet<String> {
            recs.iter().map(|r| r.id.to_string()).collect()
        };
        let before = ids(&self.store.list()?);
        let rd =
            std::fs::read_dir(&self.snapshots_dir).map_err(io_err("read", &self.snapshots_dir))?;
        let candidates: Vec<_> = rd
            .flatten()
            .filter(|e| !before.contains(e.file_name().to_string_lossy().as_ref()))
            .collect();
        if !candidates.is_empty() {
            // A snapshot's record is written before its dir: one whose dir was listed above
            // has its record in this second listing (a Prepare running meanwhile keeps it).
            let now = ids(&self.store.list()?);
            for e in candidates {
                if now.contains(e.file_name().to_string_lossy().as_ref()) {
                    continue;
                }
                let p = e.path();
                info!(dir = %p.display(), "cleanup: removing orphan snapshot dir");
                std::fs::remove_dir_all(&p).map_err(io_err("remove", &p))?;
            }
        }
        if let Some(layers) = &self.layers {
            // Under the remote-commit lock, from a listing taken under it: a remote Prepare
            // records its snapshot under the same lock, and one still mounting is in
            // `mounting` — neither loses its layer to this release.
            let _one = self.remote_commit.lock();
            let recs = self.store.list()?;
            let mounting = self.mounting.lock();
            let used: HashSet<&str> = recs
                .iter()
                .filter_map(|r| r.remote.as_ref())
                .map(|r| r.digest.as_str())
                .collect();
            for l in self.store.layers()? {
                if used.contains(l.digest.as_str()) || mounting.contains_key(&l.digest) {
                    continue;
                }
                if let Ok(d) = l.digest.parse::<Digest>() {
                    if let Err(e) = layers.release(&d) {
                        warn!(digest = %l.digest, error = %e, "cleanup: cannot release layer");
                    }
                }
            }
        }
        Ok(())
    }
}

/// Marks a layer as being mounted by a remote Prepare for as long as it lives.
struct MountingGuard {
    set: Arc<parking_lot::Mutex<HashMap<String, usize>>>,
    digest: String,
}

impl MountingGuard {
    fn new(set: &Arc<parking_lot::Mutex<HashMap<String, usize>>>, digest: String) -> Self {
        *set.lock().entry(digest.clone()).or_insert(0) += 1;
        MountingGuard {
            set: set.clone(),
            digest,
        }
    }
}

impl Drop for MountingGuard {
    fn drop(&mut self) {
        let mut m = self.set.lock();
        if let Some(n) = m.get_mut(&self.digest) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.digest);
            }
        }
    }
}

/// Makes snapshot dir `d` as overlayfs's snapshotter does, modes set explicitly
/// (`crate::dirs`): `d` 0700, `fs` 0755 and, for an active snapshot, `work` 0711. With a
/// parent, `fs` then takes the owner (and mode) of the parent's top directory `parent_top`
/// (overlayfs chowns a new snapshot's `fs` to its parent's): a container whose user namespace
/// maps root to another uid (containerd's `WithRemappedSnapshot`, whose chowned top layer
/// this carries) finds its root owned by its own root. For a remote parent `parent_top` is the
/// FUSE layer root (the TOC's root entry) or its native tree.
fn make_snapshot_dirs(
    d: &Path,
    kind: Kind,
    parent_top: Option<&Path>,
) -> Result<(), SnapshotError> {
    use crate::dirs::{create, PRIVATE, SNAPSHOT_FS, SNAPSHOT_WORK};
    create(d, PRIVATE).map_err(io_err("create", d))?;
    let fs = d.join("fs");
    create(&fs, SNAPSHOT_FS).map_err(io_err("create", &fs))?;
    if kind == Kind::Active {
        let work = d.join("work");
        create(&work, SNAPSHOT_WORK).map_err(io_err("create", &work))?;
    }
    if let Some(top) = parent_top {
        let (uid, gid, mode) = crate::dirs::copy_owner_and_mode(top, &fs)
            .map_err(io_err("take the owner of the parent's directory", top))?;
        debug!(dir = %fs.display(), uid, gid, mode = format!("{mode:04o}"), "snapshot root takes its parent's owner");
    }
    Ok(())
}

/// What the committed remote snapshots say about a Prepare of (`target`, `parent`) for layer
/// `digest`.
#[derive(Debug, PartialEq, Eq)]
pub enum RemoteMatch {
    /// A remote snapshot of this layer exists under (target, parent): its key.
    Same(String),
    /// A remote snapshot of another layer holds (target, parent): its layer digest. The
    /// Prepare must not get it (the claimed diff_ids of one of the two images are false), and
    /// no second one may be committed (containerd's Walk could not tell them apart).
    Conflict(String),
    None,
}

/// Finds the committed remote snapshot under (`target`, `parent`) and compares its layer
/// with `digest`. Ordinary snapshots never match: their content was not made from this
/// layer. Pure.
pub fn remote_match(
    recs: &[SnapshotRecord],
    target: &str,
    parent: &str,
    digest: &Digest,
) -> RemoteMatch {
    let under = recs.iter().filter(|r| {
        r.kind == Kind::Committed
            && r.parent == parent
            && r.labels.get(LABEL_TARGET).map(String::as_str) == Some(target)
    });
    let mut other = None;
    for r in under {
        match &r.remote {
            Some(rl) if rl.digest == digest.as_str() => return RemoteMatch::Same(r.key.clone()),
            Some(rl) => other = other.or(Some(rl.digest.clone())),
            None => {}
        }
    }
    other.map_or(RemoteMatch::None, RemoteMatch::Conflict)
}

fn refused(req: &RemoteLayerRequest, reason: String) -> SnapshotError {
    SnapshotError::Remount {
        digest: req.digest.to_string(),
        error: RemoteError::Identity {
            digest: req.digest.to_string(),
            reason,
        },
    }
}

fn conflict(req: &RemoteLayerRequest, parent: &str, other: &str) -> SnapshotError {
    refused(
        req,
        format!(
            "chain {} on parent {parent:?} is already a remote snapshot of layer {other}: two \
             images claim the same diff_ids for different layers",
            req.target
        ),
    )
}

/// Backend name of a remote snapshot: the target chain id, or (when that name is taken, e.g.
/// by the same chain on another parent, a chain whose lower part was unpacked the ordinary
/// way in another namespace) the target suffixed with a hash of the parent and the layer
/// digest. Pure.
pub fn remote_snapshot_name(
    target: &str,
    parent: &str,
    digest: &Digest,
    taken: impl Fn(&str) -> bool,
) -> String {
    if !taken(target) {
        return target.to_string();
    }
    let h = Digest::sha256(format!("{parent}\n{digest}").as_bytes());
    format!("{target}@{}", &h.hex()[..16])
}

/// Disk usage like containerd's `fs.DiskUsage`: allocated bytes and distinct inodes.
pub fn dir_usage(root: &Path) -> std::io::Result<(i64, i64)> {
    let mut seen = HashSet::new();
    let mut size = 0i64;
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let md = std::fs::symlink_metadata(&p)?;
        if seen.insert((md.dev(), md.ino())) {
            size += (md.blocks() * 512) as i64;
        }
        if md.is_dir() {
            for e in std::fs::read_dir(&p)? {
                stack.push(e?.path());
            }
        }
    }
    Ok((size, seen.len() as i64))
}

mod gate;
mod tests;
