//! `weenv pull`: pull an image through containerd's API with remote-snapshot labels, so the
//! weenv snapshotter mounts weenv layers lazily (like `ctr-remote image rpull`).
//!
//! Steps, under one containerd lease: resolve the manifest (index -> platform pick), write
//! index/manifest/config into containerd's content store; per layer (bottom up, by chain id)
//! `Stat` -> `Prepare` with `containerd.io/snapshot.ref` + `cri.*` labels; AlreadyExists means
//! the snapshotter committed a remote snapshot; otherwise fetch the blob, `Diff.Apply` it into
//! the prepared mounts and `Commit` (so any image works). Finally GC labels
//! (`gc.ref.snapshot.<snapshotter>` on the config, `gc.ref.content.*` on manifest/index) and
//! the image record (create, or update if it exists).

use crate::progress::{LayerEvent, Outcome, Tally};
use bytes::Bytes;
use containerd_client::services::v1::content_client::ContentClient;
use containerd_client::services::v1::diff_client::DiffClient;
use containerd_client::services::v1::images_client::ImagesClient;
use containerd_client::services::v1::leases_client::LeasesClient;
use containerd_client::services::v1::snapshots::snapshots_client::SnapshotsClient;
use containerd_client::services::v1::snapshots::{
    CommitSnapshotRequest, PrepareSnapshotRequest, RemoveSnapshotRequest,
};
use containerd_client::services::v1::{
    AddResourceRequest, ApplyRequest, CreateImageRequest, CreateRequest as LeaseCreate,
    DeleteRequest as LeaseDelete, Image, Info as ContentInfo, InfoRequest,
    Resource as LeaseResource, UpdateImageRequest, UpdateRequest, WriteAction, WriteContentRequest,
};
use containerd_client::types::Descriptor as CDescriptor;
use std::collections::{BTreeMap, HashMap};
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use thiserror::Error;
use tonic::transport::Channel;
use tonic::{Code, Request};
use tracing::{debug, info};
use weenv_registry::manifest::{chain_ids, host_platform, ImageConfig};
use weenv_registry::{select_platform, Client, ImageManifest, Manifest, Platform, Reference};
use weenv_snapshotter_api::config::ListenAddr;

/// Label: CRI manifest digest.
pub use weenv_snapshotter_api::labels::{
    layer_labels, LABEL_CRI_IMAGE_LAYERS, LABEL_CRI_MANIFEST_DIGEST,
};

/// Errors of a pull.
#[derive(Debug, Error)]
pub enum PullError {
    #[error(transparent)]
    Registry(#[from] weenv_registry::RegistryError),
    #[error("containerd {op}: {status}{}", containerd_hint(status))]
    Containerd {
        op: &'static str,
        status: tonic::Status,
    },
    #[error("image config {digest}: {message}")]
    Config { digest: String, message: String },
    #[error("no manifest for platform {platform} in index {reference} (available: {available}); pass --platform with one of them")]
    NoPlatform {
        reference: String,
        platform: String,
        available: String,
    },
    #[error("{reference} is a single-platform image for {available}, not for the requested platform {requested}; pass --platform {available} or pull an image built for {requested}")]
    WrongPlatform {
        reference: String,
        requested: String,
        available: String,
    },
    /// What containerd's own unpacker says ("wrong diff id calculated on extraction").
    #[error("layer {layer}: wrong diff_id calculated on extraction: the image config claims {claimed}, the layer is {actual} (hint: the image's config does not match its layers; rebuild or re-push the image)")]
    WrongDiffId {
        layer: String,
        claimed: String,
        actual: String,
    },
    /// The namespace's chain is a lazy layer bound to another blob than the manifest names,
    /// and it can be neither verified nor replaced.
    #[error("chain {chain} in this namespace is lazy layer {bound}, not the manifest's {layer}: {why} (hint: {hint})")]
    Contested {
        chain: String,
        layer: String,
        bound: String,
        why: String,
        hint: String,
    },
    /// A layer failed: which one, of which image (the cause follows).
    #[error("layer {index}/{total} {digest} of {image}")]
    Layer {
        index: usize,
        total: usize,
        digest: String,
        image: String,
        #[source]
        source: Box<PullError>,
    },
}

/// What to do about a containerd error, by its code (empty when there is nothing to add).
fn containerd_hint(status: &tonic::Status) -> &'static str {
    let m = status.message();
    match status.code() {
        Code::Unavailable => " (hint: check that containerd runs at --address and that the weenv-snapshotter daemon runs on the socket of containerd's proxy_plugins entry)",
        _ if m.contains("snapshotter not loaded") => " (hint: add the weenv snapshotter to containerd's config as a proxy_plugins entry and restart containerd, or pass --snapshotter with a loaded one)",
        Code::PermissionDenied | Code::Unauthenticated => " (hint: run weenv as a user that may use containerd's socket, e.g. root)",
        Code::DeadlineExceeded => " (hint: containerd or the snapshotter did not answer in time; check their logs and retry)",
        _ => "",
    }
}

/// Retries (250 ms apart) of a Prepare that containerd answers `Unavailable`: ~10 s, the
/// longest reconnect backoff seen from containerd 1.6 towards a restarted proxy plugin.
const PREPARE_UNAVAILABLE_RETRIES: u32 = 40;

pub(crate) fn ctd(op: &'static str) -> impl FnOnce(tonic::Status) -> PullError {
    move |status| PullError::Containerd { op, status }
}

/// GC labels of a manifest: config and layers it references.
pub fn manifest_gc_labels(m: &ImageManifest) -> BTreeMap<String, String> {
    let mut l = BTreeMap::new();
    l.insert(
        "containerd.io/gc.ref.content.config".to_string(),
        m.config.digest.to_string(),
    );
    for (i, d) in m.layers.iter().enumerate() {
        l.insert(
            format!("containerd.io/gc.ref.content.l.{i}"),
            d.digest.to_string(),
        );
    }
    l
}

/// Options of a pull.
#[derive(Clone, Debug)]
pub struct PullOptions {
    pub namespace: String,
    pub snapshotter: String,
    /// `os/arch[/variant]`; default: this host.
    pub platform: Option<Platform>,
    /// Image name recorded in containerd (default: the normalised reference).
    pub image_name: Option<String>,
    /// The weenv-snapshotter's endpoint (`observability.listen`): asked to verify a chain of
    /// the namespace that is a lazy layer bound to another blob than the manifest names.
    /// `None`: such a chain is replaced unverified.
    pub daemon: Option<ListenAddr>,
}

/// What a pull did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PullReport {
    pub image: String,
    pub manifest: String,
    pub top_chain_id: String,
    /// Layers committed as remote (lazy) snapshots.
    pub remote_layers: usize,
    /// Layers fetched and applied the ordinary way.
    pub applied_layers: usize,
    /// Layers already present.
    pub present_layers: usize,
    /// Layers and bytes (compressed) by outcome.
    pub tally: Tally,
    pub seconds: f64,
    /// The image config's bytes (JSON).
    pub config_json: Vec<u8>,
}

/// containerd clients bound to one namespace and lease (shared with [`crate::run`]).
#[derive(Clone)]
pub struct Ctd {
    pub(crate) ch: Channel,
    pub(crate) ns: String,
    pub(crate) lease: Option<String>,
    /// The daemon's endpoint, for verifications (see [`PullOptions::daemon`]).
    pub(crate) daemon: Option<ListenAddr>,
}

impl Ctd {
    /// The containerd channel.
    pub fn channel(&self) -> Channel {
        self.ch.clone()
    }

    pub fn new(ch: Channel, ns: &str) -> Ctd {
        Ctd {
            ch,
            ns: ns.to_string(),
            lease: None,
            daemon: None,
        }
    }

    /// Verifications of contested chains are asked of the daemon at `daemon`.
    pub fn with_daemon(mut self, daemon: Option<ListenAddr>) -> Ctd {
        self.daemon = daemon;
        self
    }

    /// Create lease `id` (expiring after an hour, in case this process dies before
    /// [`Ctd::end_lease`]); the calls that follow carry it.
    pub async fn begin_lease(&mut self, id: String) -> Result<(), PullError> {
        let expire = chrono::Utc::now() + chrono::Duration::hours(1);
        LeasesClient::new(self.ch.clone())
            .create(self.req(LeaseCreate {
                id: id.clone(),
                labels: [("containerd.io/gc.expire".to_string(), expire.to_rfc3339())].into(),
            }))
            .await
            .map_err(ctd("lease create"))?;
        self.lease = Some(id);
        Ok(())
    }

    /// Delete the lease (what it protected must be referenced otherwise by now).
    pub async fn end_lease(&mut self) -> Result<(), PullError> {
        let Some(id) = self.lease.take() else {
            return Ok(());
        };
        LeasesClient::new(self.ch.clone())
            .delete(self.req(LeaseDelete { id, sync: false }))
            .await
            .map_err(ctd("lease delete"))?;
        Ok(())
    }

    /// `Snapshots.Prepare`, retried while containerd answers `Unavailable`: containerd dials a
    /// proxy snapshotter lazily and backs off after a failed dial (the daemon started after
    /// containerd, or restarted): such a call fails before it reaches the snapshotter, and a
    /// retry a moment later goes through.
    pub(crate) async fn prepare(
        &self,
        snapshotter: &str,
        key: &str,
        parent: &str,
        labels: HashMap<String, String>,
    ) -> Result<Vec<containerd_client::types::Mount>, tonic::Status> {
        let snaps = SnapshotsClient::new(self.ch.clone());
        let mut attempt = 0u32;
        loop {
            let res = snaps
                .clone()
                .prepare(self.req(PrepareSnapshotRequest {
                    snapshotter: snapshotter.to_string(),
                    key: key.to_string(),
                    parent: parent.to_string(),
                    labels: labels.clone(),
                }))
                .await;
            match res {
                Err(s)
                    if s.code() == Code::Unavailable && attempt < PREPARE_UNAVAILABLE_RETRIES =>
                {
                    attempt += 1;
                    debug!(attempt, error = %s.message(), "snapshotter unavailable through containerd; retrying");
                    tokio::time::sleep(std::time::Duration::from_millis(250)).await;
                }
                other => return other.map(|r| r.into_inner().mounts),
            }
        }
    }

    /// A request carrying this client's namespace (and lease).
    pub fn req<T>(&self, m: T) -> Request<T> {
        let mut r = Request::new(m);
        let md = r.metadata_mut();
        if let Ok(v) = self.ns.parse() {
            md.insert("containerd-namespace", v);
        }
        if let Some(v) = self.lease.as_ref().and_then(|l| l.parse().ok()) {
            md.insert("containerd-lease", v);
        }
        r
    }

    /// True if content `d` is in the namespace's content store.
    pub async fn content_exists(&self, d: &str) -> Result<bool, PullError> {
        let r = ContentClient::new(self.ch.clone())
            .info(self.req(InfoRequest {
                digest: d.to_string(),
            }))
            .await;
        match r {
            Ok(_) => Ok(true),
            Err(s) if s.code() == Code::NotFound => Ok(false),
            Err(s) => Err(ctd("content info")(s)),
        }
    }

    /// Write `data` (digest `d`) into the content store with `labels` (set on the commit; on
    /// content already present, by an update).
    pub async fn write_content(
        &self,
        d: &str,
        data: Bytes,
        labels: BTreeMap<String, String>,
    ) -> Result<(), PullError> {
        if self.content_exists(d).await? {
            // Present, but perhaps held only by another client's lease or by an image being
            // removed: our lease takes a reference first, so the collector keeps the blob while
            // we label it and build on it. Collected in between (NotFound): written again.
            match self.label_present(d, labels.clone()).await {
                Err(PullError::Containerd { status, .. }) if status.code() == Code::NotFound => {
                    tracing::debug!(
                        digest = d,
                        "content collected while being labelled; writing it again"
                    );
                }
                res => return res,
            }
        }
        const CHUNK: usize = 1 << 20;
        let total = data.len() as i64;
        let rf = format!("weenv-pull-{}-{d}", unique());
        let mut msgs = Vec::new();
        let mut off = 0usize;
        while off < data.len() {
            let end = (off + CHUNK).min(data.len());
            msgs.push(WriteContentRequest {
                action: WriteAction::Write as i32,
                r#ref: rf.clone(),
                total,
                expected: d.to_string(),
                offset: off as i64,
                data: data.slice(off..end).to_vec(),
                labels: HashMap::new(),
            });
            off = end;
        }
        msgs.push(WriteContentRequest {
            action: WriteAction::Commit as i32,
            r#ref: rf,
            total,
            expected: d.to_string(),
            offset: total,
            data: Vec::new(),
            labels: labels.clone().into_iter().collect(),
        });
        let r = ContentClient::new(self.ch.clone())
            .write(self.req(futures::stream::iter(msgs)))
            .await;
        let mut stream = match r {
            Ok(s) => s.into_inner(),
            Err(s) if s.code() == Code::AlreadyExists => {
                return self.label_present(d, labels).await;
            }
            Err(s) => return Err(ctd("content write")(s)),
        };
        loop {
            match stream.message().await {
                Ok(Some(_)) => {}
                Ok(None) => return Ok(()),
                Err(s) if s.code() == Code::AlreadyExists => {
                    return self.label_present(d, labels).await;
                }
                Err(s) => return Err(ctd("content write")(s)),
            }
        }
    }

    /// Labels content `d` that is already in the store, after adding it to this client's
    /// lease (no-op without a lease), so the collector keeps it while we build on it.
    async fn label_present(
        &self,
        d: &str,
        labels: BTreeMap<String, String>,
    ) -> Result<(), PullError> {
        self.lease_resource(d, "content".to_string()).await?;
        self.set_labels(d, labels).await
    }

    /// Adds snapshot `key` of `snapshotter` to this client's lease (no-op without a lease),
    /// whether or not it exists yet: a snapshot another client committed is then kept while
    /// this one builds on it.
    pub async fn lease_snapshot(&self, snapshotter: &str, key: &str) -> Result<(), PullError> {
        self.lease_resource(key, format!("snapshots/{snapshotter}"))
            .await
    }

    async fn lease_resource(&self, id: &str, kind: String) -> Result<(), PullError> {
        let Some(lease) = self.lease.clone() else {
            return Ok(());
        };
        LeasesClient::new(self.ch.clone())
            .add_resource(self.req(AddResourceRequest {
                id: lease,
                resource: Some(LeaseResource {
                    id: id.to_string(),
                    r#type: kind,
                }),
            }))
            .await
            .map_err(ctd("lease add resource"))?;
        Ok(())
    }

    async fn set_labels(&self, d: &str, labels: BTreeMap<String, String>) -> Result<(), PullError> {
        if labels.is_empty() {
            return Ok(());
        }
        let paths = labels.keys().map(|k| format!("labels.{k}")).collect();
        ContentClient::new(self.ch.clone())
            .update(self.req(UpdateRequest {
                info: Some(ContentInfo {
                    digest: d.to_string(),
                    labels: labels.into_iter().collect(),
                    ..Default::default()
                }),
                update_mask: Some(prost_types::FieldMask { paths }),
            }))
            .await
            .map_err(ctd("content update"))?;
        Ok(())
    }
}

/// `containerd.io/distribution.source.<registry>` = the repositories (comma-separated) content
/// can be fetched from, as containerd's fetcher records them (a later push mounts from there).
pub fn distribution_source_labels<'a>(
    refs: impl IntoIterator<Item = &'a Reference>,
) -> BTreeMap<String, String> {
    let mut by_host: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in refs {
        let repos = by_host
            .entry(format!(
                "containerd.io/distribution.source.{}",
                r.registry()
            ))
            .or_default();
        if !repos.iter().any(|x| x == r.repository()) {
            repos.push(r.repository().to_string());
        }
    }
    by_host.into_iter().map(|(k, v)| (k, v.join(","))).collect()
}

/// Process id + wall-clock nanoseconds: unique across concurrent pulls on a node.
fn unique() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{}-{nanos}", std::process::id())
}

pub(crate) fn cdesc(media_type: &str, digest: &str, size: u64) -> CDescriptor {
    CDescriptor {
        media_type: media_type.to_string(),
        digest: digest.to_string(),
        size: size as i64,
        annotations: HashMap::new(),
    }
}

/// The platforms an index offers, for messages.
fn available_platforms(ix: &weenv_registry::ImageIndex) -> String {
    let v: Vec<String> = ix
        .manifests
        .iter()
        .filter_map(|d| d.platform.as_ref())
        .map(Platform::to_string)
        .collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

/// A plain (single-platform) manifest must be for the requested platform, as its config
/// declares it (like containerd's platform matcher; a config naming no platform passes).
fn check_config_platform(
    cfg: &ImageConfig,
    reference: &str,
    want: &Platform,
) -> Result<(), PullError> {
    match cfg.platform() {
        Some(p)
            if !weenv_registry::platform_matches(
                &p,
                &want.os,
                &want.architecture,
                want.variant.as_deref(),
            ) =>
        {
            Err(PullError::WrongPlatform {
                reference: reference.to_string(),
                requested: want.to_string(),
                available: p.to_string(),
            })
        }
        _ => Ok(()),
    }
}
/// Pull `reference` into containerd at `channel`.
pub async fn pull(
    registry: &Client,
    channel: Channel,
    reference: &str,
    opts: &PullOptions,
    progress: &(dyn Fn(&LayerEvent) + Sync),
) -> Result<PullReport, PullError> {
    let started = Instant::now();
    let r: Reference = reference.parse()?;
    let mut c = Ctd::new(channel, &opts.namespace).with_daemon(opts.daemon.clone());
    c.begin_lease(format!("weenv-pull-{}", unique())).await?;
    let res = pull_leased(registry, &c, &r, opts, progress).await;
    let del = c.end_lease().await;
    let mut report = res?;
    del?;
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

async fn pull_leased(
    registry: &Client,
    c: &Ctd,
    r: &Reference,
    opts: &PullOptions,
    progress: &(dyn Fn(&LayerEvent) + Sync),
) -> Result<PullReport, PullError> {
    let top = registry.get_manifest(r).await?;
    let want = opts.platform.clone().unwrap_or_else(host_platform);
    let (manifest, mblob, single) = match top.parse()? {
        Manifest::Image(m) => (m, top.clone(), true),
        Manifest::Index(ix) => {
            let d = select_platform(&ix, &want.os, &want.architecture, want.variant.as_deref())
                .ok_or_else(|| PullError::NoPlatform {
                    reference: r.to_string(),
                    platform: want.to_string(),
                    available: available_platforms(&ix),
                })?;
            let mb = registry
                .get_manifest(&r.with_digest(d.digest.clone()))
                .await?;
            let m = match mb.parse()? {
                Manifest::Image(m) => m,
                Manifest::Index(_) => {
                    return Err(PullError::NoPlatform {
                        reference: r.to_string(),
                        platform: want.to_string(),
                        available: format!("{} is itself an index (not supported)", d.digest),
                    })
                }
            };
            (m, mb, false)
        }
    };
    let cfg_bytes = registry.get_blob(r, &manifest.config.digest).await?;
    let cfg: ImageConfig = serde_json::from_slice(&cfg_bytes).map_err(|e| PullError::Config {
        digest: manifest.config.digest.to_string(),
        message: e.to_string(),
    })?;
    if single {
        check_config_platform(&cfg, &r.to_string(), &want)?;
    }
    let diff_ids = &cfg.rootfs.diff_ids;
    if diff_ids.len() != manifest.layers.len() {
        return Err(PullError::Config {
            digest: manifest.config.digest.to_string(),
            message: format!(
                "{} diff_ids for {} layers",
                diff_ids.len(),
                manifest.layers.len()
            ),
        });
    }
    c.write_content(
        manifest.config.digest.as_str(),
        cfg_bytes.clone(),
        BTreeMap::new(),
    )
    .await?;
    let sources = vec![
        LayerSource {
            reference: r.clone(),
            manifest: mblob.digest.to_string(),
        };
        manifest.layers.len()
    ];
    let mut report = prepare_layers(
        registry,
        c,
        &manifest,
        diff_ids,
        &sources,
        &opts.snapshotter,
        progress,
    )
    .await?;
    report.manifest = mblob.digest.to_string();
    report.config_json = cfg_bytes.to_vec();
    label_config_snapshot(c, &manifest, &opts.snapshotter, &report.top_chain_id).await?;
    c.write_content(
        mblob.digest.as_str(),
        mblob.bytes.clone(),
        manifest_gc_labels(&manifest),
    )
    .await?;
    if top.digest != mblob.digest {
        let mut il = BTreeMap::new();
        if let Manifest::Index(ix) = top.parse()? {
            for (i, m) in ix.manifests.iter().enumerate() {
                il.insert(
                    format!("containerd.io/gc.ref.content.m.{i}"),
                    m.digest.to_string(),
                );
            }
        }
        c.write_content(top.digest.as_str(), top.bytes.clone(), il)
            .await?;
    }
    let name = opts.image_name.clone().unwrap_or_else(|| r.to_string());
    put_image(
        c,
        &name,
        cdesc(&top.media_type, top.digest.as_str(), top.bytes.len() as u64),
    )
    .await?;
    info!(image = %name, remote = report.remote_layers, applied = report.applied_layers,
        present = report.present_layers, "pulled");
    report.image = name;
    Ok(report)
}

/// Where a layer's blob lives: the reference it is fetched from (the daemon's
/// `cri.image-ref` label) and the manifest that lists it there (`cri.manifest-digest`: the
/// daemon reads the layer's TOC hint, start-up profile and claimed diff_id from it).
#[derive(Clone, Debug)]
pub struct LayerSource {
    pub reference: Reference,
    pub manifest: String,
}

/// Every layer of `manifest` as a snapshot (bottom up, by chain id): present ones are kept,
/// weenv layers become remote (lazy) snapshots through the snapshotter, any other layer is
/// fetched from its source into the content store and applied. The report's `top_chain_id`
/// is the image's rootfs parent. Runs under the caller's lease.
pub(crate) async fn prepare_layers(
    registry: &Client,
    c: &Ctd,
    manifest: &ImageManifest,
    diff_ids: &[String],
    sources: &[LayerSource],
    snapshotter: &str,
    progress: &(dyn Fn(&LayerEvent) + Sync),
) -> Result<PullReport, PullError> {
    if diff_ids.len() != manifest.layers.len() || sources.len() != manifest.layers.len() {
        return Err(PullError::Config {
            digest: manifest.config.digest.to_string(),
            message: format!(
                "{} diff_ids and {} sources for {} layers",
                diff_ids.len(),
                sources.len(),
                manifest.layers.len()
            ),
        });
    }
    let chains = chain_ids(diff_ids);
    let layer_digests: Vec<String> = manifest
        .layers
        .iter()
        .map(|l| l.digest.to_string())
        .collect();
    let mut report = PullReport::default();
    let snaps = SnapshotsClient::new(c.ch.clone());
    let mut parent = String::new();
    let total = manifest.layers.len();
    for (i, layer) in manifest.layers.iter().enumerate() {
        let chain = &chains[i];
        let src = &sources[i];
        let outcome = prepare_layer(
            registry,
            c,
            &snaps,
            snapshotter,
            (i, layer),
            chain,
            &parent,
            src,
            &diff_ids[i],
            &layer_digests,
        )
        .await
        .map_err(|e| PullError::Layer {
            index: i + 1,
            total,
            digest: layer.digest.to_string(),
            image: src.reference.to_string(),
            source: Box::new(e),
        })?;
        let ev = LayerEvent {
            index: i + 1,
            total,
            digest: layer.digest.to_string(),
            size: layer.size,
            outcome,
        };
        match outcome {
            Outcome::Lazy => report.remote_layers += 1,
            Outcome::Applied => report.applied_layers += 1,
            Outcome::Present => report.present_layers += 1,
        }
        report.tally.add(&ev);
        progress(&ev);
        parent = chain.clone();
    }
    report.top_chain_id = parent;
    Ok(report)
}

/// One layer (index `i`) on `parent`: kept if its chain is there, else a remote snapshot
/// (the snapshotter answers AlreadyExists to the labelled Prepare) or fetched and applied.
#[allow(clippy::too_many_arguments)]
async fn prepare_layer(
    registry: &Client,
    c: &Ctd,
    snaps: &SnapshotsClient<Channel>,
    snapshotter: &str,
    (i, layer): (usize, &weenv_registry::Descriptor),
    chain: &str,
    parent: &str,
    src: &LayerSource,
    diff_id: &str,
    layer_digests: &[String],
) -> Result<Outcome, PullError> {
    // First into our lease, then looked up: a chain another pull or run committed (and may
    // drop, with its image, at any moment) is kept while ours builds on it.
    c.lease_snapshot(snapshotter, chain).await?;
    match crate::trust::existing_chain(c, snaps, snapshotter, chain, layer.digest.as_str()).await? {
        crate::trust::Existing::Usable => return Ok(Outcome::Present),
        crate::trust::Existing::Absent => {}
        crate::trust::Existing::Replace(why) => {
            crate::trust::remove_chain(c, snapshotter, chain, layer.digest.as_str(), &why).await?
        }
    }
    let labels = layer_labels(
        chain,
        &src.reference.to_string(),
        layer.digest.as_str(),
        &src.manifest,
        layer_digests,
    );
    let mut replaced = false;
    let (key, prepared) = loop {
        let key = format!("extract-weenv-{}-{} {chain}", unique(), i);
        match c.prepare(snapshotter, &key, parent, labels.clone()).await {
            // The snapshotter committed a remote snapshot, or containerd already has the chain
            // (a concurrent pull, or a quarantined chain its Stat hides): which one, checked.
            Err(s) if s.code() == Code::AlreadyExists => {
                let why = match crate::trust::existing_chain(
                    c,
                    snaps,
                    snapshotter,
                    chain,
                    layer.digest.as_str(),
                )
                .await?
                {
                    crate::trust::Existing::Usable => {
                        debug!(layer = %layer.digest, chain, "remote snapshot");
                        return Ok(Outcome::Lazy);
                    }
                    crate::trust::Existing::Absent => {
                        "containerd has the chain but the snapshotter hides it (a quarantined lazy layer)"
                            .to_string()
                    }
                    crate::trust::Existing::Replace(why) => why,
                };
                if replaced {
                    return Err(PullError::Contested {
                        chain: chain.to_string(),
                        layer: layer.digest.to_string(),
                        bound: String::new(),
                        why,
                        hint: "the chain came back after it was replaced; retry the pull".into(),
                    });
                }
                crate::trust::remove_chain(c, snapshotter, chain, layer.digest.as_str(), &why)
                    .await?;
                replaced = true;
            }
            other => break (key, other),
        }
    };
    match prepared {
        Err(s) if s.code() == Code::AlreadyExists => Ok(Outcome::Lazy),
        Err(s) => Err(ctd("snapshot prepare")(s)),
        Ok(mounts) => {
            let applied = apply_layer(registry, c, &src.reference, layer, mounts)
                .await
                .and_then(|actual| check_diff_id(layer.digest.as_str(), diff_id, actual));
            // A concurrent pull or run committed the same chain first (containerd's
            // unpacker treats this as success too): ours is dropped, theirs is the layer.
            let done = match applied {
                Ok(()) => match snaps
                    .clone()
                    .commit(c.req(CommitSnapshotRequest {
                        snapshotter: snapshotter.to_string(),
                        name: chain.to_string(),
                        key: key.clone(),
                        labels: HashMap::new(),
                    }))
                    .await
                {
                    Ok(_) => Ok(true),
                    Err(s) if s.code() == Code::AlreadyExists => Ok(false),
                    Err(s) => Err(ctd("snapshot commit")(s)),
                },
                Err(e) => Err(e),
            };
            if !matches!(done, Ok(true)) {
                let _ = snaps
                    .clone()
                    .remove(c.req(RemoveSnapshotRequest {
                        snapshotter: snapshotter.to_string(),
                        key,
                    }))
                    .await;
            }
            match done {
                Ok(true) => Ok(Outcome::Applied),
                Ok(false) => Ok(Outcome::Present),
                Err(e) => Err(e),
            }
        }
    }
}

/// GC reference config -> the image's top snapshot (`gc.ref.snapshot.<snapshotter>`).
pub(crate) async fn label_config_snapshot(
    c: &Ctd,
    manifest: &ImageManifest,
    snapshotter: &str,
    top_chain_id: &str,
) -> Result<(), PullError> {
    let mut cl = BTreeMap::new();
    cl.insert(
        format!("containerd.io/gc.ref.snapshot.{snapshotter}"),
        top_chain_id.to_string(),
    );
    c.set_labels(manifest.config.digest.as_str(), cl).await
}

/// Create the image record `name` -> `target`, or update it if it exists.
pub(crate) async fn put_image(c: &Ctd, name: &str, target: CDescriptor) -> Result<(), PullError> {
    let image = Image {
        name: name.to_string(),
        labels: HashMap::new(),
        target: Some(target),
        created_at: None,
        updated_at: None,
    };
    let mut images = ImagesClient::new(c.ch.clone());
    let created = images
        .create(c.req(CreateImageRequest {
            image: Some(image.clone()),
            source_date_epoch: None,
        }))
        .await;
    match created {
        Ok(_) => Ok(()),
        Err(s) if s.code() == Code::AlreadyExists => {
            images
                .update(c.req(UpdateImageRequest {
                    image: Some(image),
                    update_mask: None,
                    source_date_epoch: None,
                }))
                .await
                .map_err(ctd("image update"))?;
            Ok(())
        }
        Err(s) => Err(ctd("image create")(s)),
    }
}

/// The applied layer must be the diff_id the config claims (as containerd's unpacker checks):
/// an image claiming another image's diff_ids gets no snapshot under that image's chain ids.
fn check_diff_id(layer: &str, claimed: &str, actual: Option<String>) -> Result<(), PullError> {
    match actual {
        Some(a) if a == claimed => Ok(()),
        a => Err(PullError::WrongDiffId {
            layer: layer.to_string(),
            claimed: claimed.to_string(),
            actual: a.unwrap_or_else(|| "unknown (containerd returned no digest)".into()),
        }),
    }
}

/// Fetches the blob into containerd's content store (unless there) and applies it to
/// `mounts`; returns the digest of the applied (uncompressed) stream.
async fn apply_layer(
    registry: &Client,
    c: &Ctd,
    r: &Reference,
    layer: &weenv_registry::Descriptor,
    mounts: Vec<containerd_client::types::Mount>,
) -> Result<Option<String>, PullError> {
    let d = layer.digest.as_str();
    if !c.content_exists(d).await? {
        let blob = registry.get_blob(r, &layer.digest).await?;
        c.write_content(d, blob, distribution_source_labels([r]))
            .await?;
    }
    let resp = DiffClient::new(c.ch.clone())
        .apply(c.req(ApplyRequest {
            diff: Some(cdesc(&layer.media_type, d, layer.size)),
            mounts,
            payloads: HashMap::new(),
            sync_fs: false,
        }))
        .await
        .map_err(ctd("diff apply"))?;
    Ok(resp.into_inner().applied.map(|a| a.digest))
}

#[cfg(test)]
mod tests {
    use super::*;
    use weenv_format::Digest;
    use weenv_registry::manifest::RootFs;

    #[test]
    fn applied_layers_must_be_the_claimed_diff_id() {
        let a = Digest::sha256(b"a").to_string();
        let b = Digest::sha256(b"b").to_string();
        assert!(check_diff_id("sha256:l", &a, Some(a.clone())).is_ok());
        assert!(matches!(
            check_diff_id("sha256:l", &a, Some(b)),
            Err(PullError::WrongDiffId { .. })
        ));
        assert!(check_diff_id("sha256:l", &a, None).is_err());
    }

    #[test]
    fn distribution_sources_group_repositories_by_registry() {
        let refs: Vec<Reference> = [
            "r:5000/weenv/base:1",
            "r:5000/weenv/repo:1",
            "r:5000/weenv/base:2",
            "q.example/x:1",
        ]
        .iter()
        .map(|r| r.parse().unwrap())
        .collect();
        let l = distribution_source_labels(&refs);
        assert_eq!(
            l.get("containerd.io/distribution.source.r:5000")
                .map(String::as_str),
            Some("weenv/base,weenv/repo")
        );
        assert_eq!(
            l.get("containerd.io/distribution.source.q.example")
                .map(String::as_str),
            Some("x")
        );
        assert_eq!(l.len(), 2);
    }

    #[test]
    fn a_single_platform_image_must_be_for_the_requested_platform() {
        let cfg = |os: &str, arch: &str| ImageConfig {
            os: Some(os.into()),
            architecture: Some(arch.into()),
            rootfs: RootFs::default(),
            ..Default::default()
        };
        let amd64 = cfg("linux", "amd64");
        let err = check_config_platform(&amd64, "r/x:1", &"linux/s390x".parse().unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("linux/s390x") && err.contains("linux/amd64") && err.contains("r/x:1"),
            "{err}"
        );
        check_config_platform(&amd64, "r", &"linux/x86_64".parse().unwrap()).unwrap();
        check_config_platform(
            &cfg("linux", "arm64"),
            "r",
            &"linux/arm64/v8".parse().unwrap(),
        )
        .unwrap();
        // A config naming no platform is not refused.
        let none = ImageConfig {
            os: None,
            ..cfg("linux", "amd64")
        };
        check_config_platform(&none, "r", &"linux/s390x".parse().unwrap()).unwrap();
    }

    /// A failed layer names its index, digest and image, then the cause with what to do.
    #[test]
    fn a_layer_error_names_the_image_the_layer_and_what_to_do() {
        let e = PullError::Layer {
            index: 2,
            total: 3,
            digest: "sha256:abc".into(),
            image: "r:5000/x/y:1".into(),
            source: Box::new(ctd("snapshot prepare")(tonic::Status::unknown(
                "snapshotter not loaded: weenv: invalid argument",
            ))),
        };
        let e = anyhow::Error::new(e).context("pulling r:5000/x/y:1");
        let m = weenv_registry::causes(e.as_ref());
        assert!(m.contains("layer 2/3 sha256:abc of r:5000/x/y:1"), "{m}");
        assert!(m.contains("containerd snapshot prepare"), "{m}");
        assert!(m.contains("proxy_plugins"), "{m}");
        let u = ctd("lease create")(tonic::Status::unavailable("connection refused")).to_string();
        assert!(u.contains("hint: check that containerd runs"), "{u}");
        let n = ctd("snapshot stat")(tonic::Status::not_found("x")).to_string();
        assert!(!n.contains("hint"), "{n}");
    }

    /// `weenv pull` against a registry that does not answer says the cause once (reqwest
    /// hides it in its source chain: it is said once, in the message), both as anyhow's
    /// `{:#}` and as `weenv_registry::causes` (what `weenv` prints).
    #[tokio::test]
    async fn an_unreachable_registry_is_said_once() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let host = closed.local_addr().unwrap().to_string();
        drop(closed);
        let mut rc = weenv_registry::RegistryConfig::default();
        rc.hosts.insert(
            host.clone(),
            weenv_registry::HostConfig {
                plain_http: true,
                ..Default::default()
            },
        );
        let client = Client::new(rc).unwrap();
        let r: Reference = format!("{host}/x/y:1").parse().unwrap();
        let e = client.get_manifest(&r).await.unwrap_err();
        let e = anyhow::Error::new(PullError::from(e)).context("weenv pull");
        for m in [format!("{e:#}"), weenv_registry::causes(e.as_ref())] {
            let segs: Vec<&str> = m.split(": ").map(str::trim).collect();
            let distinct: std::collections::HashSet<&&str> = segs.iter().collect();
            assert_eq!(distinct.len(), segs.len(), "a segment repeats in: {m}");
            assert_eq!(m.matches("refused").count(), 1, "{m}");
        }
    }
}
