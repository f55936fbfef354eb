//! The composed image on this node, metadata only: the composed manifest and config go into
//! containerd's content store (Content `Write`, under a lease) with their GC labels — manifest
//! -> config and layers (`containerd.io/gc.ref.content.*`), config -> the image's top snapshot
//! (`containerd.io/gc.ref.snapshot.<snapshotter>`) — and the repositories its layers come from
//! (`containerd.io/distribution.source.<registry>` on the manifest); the image record
//! (Images API) names the manifest. Nothing is written to a registry: the layers stay in
//! their groups' repositories and are prepared through the snapshotter from there (weenv
//! layers lazily; each layer's labels name its group's reference and manifest, from which the
//! daemon reads the TOC hint, start-up profile and claimed diff_id).

use crate::pull::{
    cdesc, distribution_source_labels, label_config_snapshot, manifest_gc_labels, prepare_layers,
    put_image, Ctd, LayerSource, PullError, PullReport,
};
use bytes::Bytes;
use std::time::{Duration, Instant};
use weenv_env::plan::{Composed, ResolvedGroup};
use weenv_registry::{Client, Reference};

/// What [`store_and_prepare`] did and how long each half took.
#[derive(Clone, Debug, Default)]
pub struct Installed {
    /// Layer counts and the image's top chain id (`image` = the record's name).
    pub layers: PullReport,
    /// Writing manifest and config into the content store and the image record.
    pub store: Duration,
    /// Preparing the layer snapshots.
    pub prepare: Duration,
}

/// Where each layer of the composed image lives: its group's reference and manifest.
pub fn layer_sources(groups: &[ResolvedGroup]) -> Result<Vec<LayerSource>, PullError> {
    let mut v = Vec::new();
    for g in groups {
        let reference: Reference = g.reference.parse()?;
        for _ in &g.manifest.layers {
            v.push(LayerSource {
                reference: reference.clone(),
                manifest: g.manifest_digest.to_string(),
            });
        }
    }
    Ok(v)
}

/// Store the composed image as `name` in containerd (namespace of `c`) and prepare its
/// layers through `snapshotter`; all under one lease, so nothing is collected half-way.
pub(crate) async fn store_and_prepare(
    registry: &Client,
    c: &mut Ctd,
    name: &str,
    groups: &[ResolvedGroup],
    composed: &Composed,
    snapshotter: &str,
    lease: String,
) -> Result<Installed, PullError> {
    c.begin_lease(lease).await?;
    let res = store_leased(registry, c, name, groups, composed, snapshotter).await;
    let ended = c.end_lease().await;
    let out = res?;
    ended?;
    Ok(out)
}

async fn store_leased(
    registry: &Client,
    c: &Ctd,
    name: &str,
    groups: &[ResolvedGroup],
    composed: &Composed,
    snapshotter: &str,
) -> Result<Installed, PullError> {
    let t = Instant::now();
    let sources = layer_sources(groups)?;
    let m = &composed.manifest;
    c.write_content(
        composed.config_digest.as_str(),
        Bytes::from(composed.config_json.clone()),
        Default::default(),
    )
    .await?;
    let mut labels = manifest_gc_labels(m);
    labels.extend(distribution_source_labels(
        sources.iter().map(|s| &s.reference),
    ));
    let mdigest = composed.manifest_digest.as_str();
    c.write_content(mdigest, Bytes::from(composed.manifest_json.clone()), labels)
        .await?;
    let media_type = m
        .media_type
        .clone()
        .unwrap_or_else(|| weenv_env::group::MEDIA_TYPE_OCI_MANIFEST.to_string());
    put_image(
        c,
        name,
        cdesc(&media_type, mdigest, composed.manifest_json.len() as u64),
    )
    .await?;
    let store = t.elapsed();

    let t = Instant::now();
    let mut layers = prepare_layers(
        registry,
        c,
        m,
        &composed.config.rootfs.diff_ids,
        &sources,
        snapshotter,
        &|_| {},
    )
    .await?;
    label_config_snapshot(c, m, snapshotter, &layers.top_chain_id).await?;
    layers.manifest = mdigest.to_string();
    layers.image = name.to_string();
    Ok(Installed {
        layers,
        store,
        prepare: t.elapsed(),
    })
}
