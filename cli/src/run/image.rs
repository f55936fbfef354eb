//! The composed image on this node, metadata only: the composed manifest and config go into
//! containerd's content store (Content `Write`, under a lease) with their GC labels — manifest
//! -> config and layers (`containerd.io/gc.ref.content.*`), config -> the image's top snapshot
//! (`containerd.io/gc.ref.snapshot.<snapshotter>`) — and the repositories its layers come from
//! (`containerd.io/distribution.source.<registry>` on the manifest); the image record
//! (Images API) names the manifest. Nothing is written to a registry: the layers stay in
//! their groups' repositories and are prepared through the snapshotter from there (weenv
//! layers lazily; each layer's labels name its group's reference and manifest, from which the
//! daemon reads the TOC hint, start-up profile and claimed diff_id). Those group manifests
//! and configs, resolved by the CLI already, are written into the content store too (under
//! the same lease, labelled with their repository's distribution source): the daemon reads
//! them there (verified against their digests) instead of fetching them from the registry a
//! second time.

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

/// One blob the CLI already holds, for containerd's content store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupBlob {
    pub digest: String,
    pub bytes: Bytes,
    /// The group's reference (its repository is the blob's distribution source).
    pub reference: Reference,
}

/// Every group's manifest and config that `blob` (the resolution cache) holds, each once, in
/// group order (manifest, then config). Pure.
pub fn group_blobs<'a>(
    groups: &[ResolvedGroup],
    blob: impl Fn(&weenv_format::Digest) -> Option<&'a [u8]>,
) -> Result<Vec<GroupBlob>, PullError> {
    let mut out: Vec<GroupBlob> = Vec::new();
    for g in groups {
        let reference: Reference = g.reference.parse()?;
        for d in [&g.manifest_digest, &g.manifest.config.digest] {
            if out.iter().any(|b| b.digest == d.as_str()) {
                continue;
            }
            if let Some(bytes) = blob(d) {
                out.push(GroupBlob {
                    digest: d.to_string(),
                    bytes: Bytes::copy_from_slice(bytes),
                    reference: reference.clone(),
                });
            }
        }
    }
    Ok(out)
}

/// The resolved groups of a plan and the blobs of theirs the CLI holds ([`group_blobs`]).
#[derive(Clone, Copy)]
pub struct Groups<'a> {
    pub resolved: &'a [ResolvedGroup],
    pub blobs: &'a [GroupBlob],
}

/// Store the composed image as `name` in containerd (namespace of `c`) and prepare its
/// layers through `snapshotter`; all under one lease, so nothing is collected half-way.
pub(crate) async fn store_and_prepare(
    registry: &Client,
    c: &mut Ctd,
    name: &str,
    groups: Groups<'_>,
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
    groups: Groups<'_>,
    composed: &Composed,
    snapshotter: &str,
) -> Result<Installed, PullError> {
    let t = Instant::now();
    let sources = layer_sources(groups.resolved)?;
    for b in groups.blobs {
        c.write_content(
            &b.digest,
            b.bytes.clone(),
            distribution_source_labels([&b.reference]),
        )
        .await?;
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use weenv_env::group::{build_group, GroupConfig};
    use weenv_format::Digest;

    fn group(name: &str, reference: &str) -> (ResolvedGroup, Vec<u8>, Vec<u8>) {
        let cfg = GroupConfig::from_json(
            format!(
                r#"{{"version":1,"kind":"base","name":"{name}","platform":{{"os":"linux","architecture":"amd64"}},"diffIds":[]}}"#
            )
            .as_bytes(),
        )
        .unwrap();
        let b = build_group(cfg, vec![]).unwrap();
        let g = ResolvedGroup {
            reference: reference.into(),
            manifest_digest: b.manifest_digest.clone(),
            manifest: b.manifest.clone(),
            config: b.config.clone(),
        };
        (g, b.manifest_json, b.config_json)
    }

    #[test]
    fn group_blobs_are_the_cached_manifests_and_configs_once() {
        let (a, am, ac) = group("a", "reg:5000/weenv/a:1");
        let (b, bm, _bc) = group("b", "reg:5000/weenv/b:1");
        let cached: Vec<(Digest, Vec<u8>)> = vec![
            (a.manifest_digest.clone(), am.clone()),
            (a.manifest.config.digest.clone(), ac.clone()),
            (b.manifest_digest.clone(), bm.clone()),
            // b's config is not cached: not written (the daemon asks the registry)
        ];
        let lookup = |d: &Digest| {
            cached
                .iter()
                .find(|(k, _)| k == d)
                .map(|(_, v)| v.as_slice())
        };
        // a listed twice: its blobs once
        let blobs = group_blobs(&[a.clone(), b.clone(), a.clone()], lookup).unwrap();
        let got: Vec<(String, Bytes, String)> = blobs
            .into_iter()
            .map(|x| (x.digest, x.bytes, x.reference.to_string()))
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    a.manifest_digest.to_string(),
                    Bytes::from(am),
                    "reg:5000/weenv/a:1".to_string()
                ),
                (
                    a.manifest.config.digest.to_string(),
                    Bytes::from(ac),
                    "reg:5000/weenv/a:1".to_string()
                ),
                (
                    b.manifest_digest.to_string(),
                    Bytes::from(bm),
                    "reg:5000/weenv/b:1".to_string()
                ),
            ]
        );
    }
}
