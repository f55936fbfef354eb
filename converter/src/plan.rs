//! `weenv-convert plan compose`: resolve a plan's group references (through the persisted
//! [`ResolveCache`]), compose them into an ordinary OCI image with
//! [`weenv_env::plan::compose`] (metadata only), and publish it: layers are mounted
//! across repositories of the same registry (no byte passes through the client), then the
//! config blob and the manifest are pushed.

use crate::resolve_cache::{Lookup, ResolveCache, ResolvePolicy};
use bytes::Bytes;
use std::collections::BTreeSet;
use thiserror::Error;
use weenv_env::group::{parse_manifest, MEDIA_TYPE_OCI_MANIFEST};
use weenv_env::plan::{compose, Composed, Plan, PlanError, ResolvedGroup};
use weenv_format::Digest;
use weenv_registry::{Client, Reference, RegistryError};

/// Errors of plan resolution, composition and publication.
#[derive(Debug, Error)]
pub enum PlanCmdError {
    #[error("invalid group reference {reference:?}: {error}")]
    BadReference {
        reference: String,
        error: Box<RegistryError>,
    },
    #[error("group {reference} not found in the registry (publish it with `weenv-convert group create ... --push {reference}`): {error}")]
    MissingGroup {
        reference: String,
        error: Box<RegistryError>,
    },
    #[error("resolving group {reference}: {error}")]
    Registry {
        reference: String,
        error: Box<RegistryError>,
    },
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error("layer {digest} of group {group} is on registry {from}, but the target is on {to}: cross-registry mounts are impossible; publish the group on {to} first")]
    CrossRegistry {
        digest: Digest,
        group: String,
        from: String,
        to: String,
    },
    #[error("layer {digest} of group {group} is not in repository {repo} and the registry refused to mount it into {target}")]
    MountRefused {
        digest: Digest,
        group: String,
        repo: String,
        target: String,
    },
    #[error("publishing {target}: {error}")]
    Push {
        target: String,
        error: Box<RegistryError>,
    },
}

/// Parse a reference string.
pub fn parse_ref(reference: &str) -> Result<Reference, PlanCmdError> {
    reference
        .parse::<Reference>()
        .map_err(|source| PlanCmdError::BadReference {
            reference: reference.to_string(),
            error: Box::new(source),
        })
}

fn reg_err(reference: &str, source: RegistryError) -> PlanCmdError {
    if source.status() == Some(404) {
        PlanCmdError::MissingGroup {
            reference: reference.to_string(),
            error: Box::new(source),
        }
    } else {
        PlanCmdError::Registry {
            reference: reference.to_string(),
            error: Box::new(source),
        }
    }
}

/// Serve `reference` from the cache when the policy allows.
fn from_cache(
    cache: &ResolveCache,
    reference: &str,
    now: u64,
    policy: ResolvePolicy,
) -> Option<ResolvedGroup> {
    let Lookup::Fresh(d) = cache.lookup(reference, now, policy) else {
        return None;
    };
    let mbytes = cache.blob(&d)?;
    let m = parse_manifest(mbytes).ok()?;
    let cbytes = cache.blob(&m.config.digest)?;
    ResolvedGroup::parse(reference, d, mbytes, cbytes).ok()
}

/// Fetch group manifest + config from the registry.
async fn fetch_group(
    client: &Client,
    reference: &str,
    cache: &ResolveCache,
) -> Result<(ResolvedGroup, Vec<u8>, Vec<u8>), PlanCmdError> {
    let r = parse_ref(reference)?;
    let blob = client
        .get_manifest(&r)
        .await
        .map_err(|e| reg_err(reference, e))?;
    let m = ResolvedGroup::parse_manifest(reference, &blob.bytes)?;
    let config = match cache.blob(&m.config.digest) {
        Some(c) => c.to_vec(),
        None => client
            .get_blob(&r, &m.config.digest)
            .await
            .map_err(|e| reg_err(reference, e))?
            .to_vec(),
    };
    let g = ResolvedGroup::parse(reference, blob.digest.clone(), &blob.bytes, &config)?;
    Ok((g, blob.bytes.to_vec(), config))
}

/// Resolve group references (bottom→top), using and updating `cache`. Cache misses are
/// fetched concurrently.
pub async fn resolve_groups(
    client: &Client,
    refs: &[&str],
    cache: &mut ResolveCache,
    now: u64,
    policy: ResolvePolicy,
) -> Result<Vec<ResolvedGroup>, PlanCmdError> {
    let mut out: Vec<Option<ResolvedGroup>> = refs
        .iter()
        .map(|r| from_cache(cache, r, now, policy))
        .collect();
    let misses: Vec<usize> = (0..refs.len()).filter(|i| out[*i].is_none()).collect();
    let cache_ro: &ResolveCache = cache;
    let fetched = futures::future::try_join_all(
        misses
            .iter()
            .map(|i| fetch_group(client, refs[*i], cache_ro)),
    )
    .await?;
    for (i, (g, mbytes, cbytes)) in misses.into_iter().zip(fetched) {
        cache.put_blob(&g.manifest_digest, &mbytes);
        cache.put_blob(&g.manifest.config.digest, &cbytes);
        cache.record(refs[i], &g.manifest_digest, now);
        out[i] = Some(g);
    }
    Ok(out.into_iter().flatten().collect())
}

/// Resolve and compose `plan` (no push).
pub async fn compose_plan(
    client: &Client,
    plan: &Plan,
    cache: &mut ResolveCache,
    now: u64,
    policy: ResolvePolicy,
) -> Result<(Vec<ResolvedGroup>, Composed), PlanCmdError> {
    let refs = plan.group_refs();
    let groups = resolve_groups(client, &refs, cache, now, policy).await?;
    let composed = compose(&groups, plan)?;
    Ok((groups, composed))
}

/// Push a plan artifact under `target`: its patch blob, its config (the plan JSON), its
/// manifest. Returns the manifest digest.
pub async fn publish_plan(
    client: &Client,
    artifact: &weenv_env::plan_ref::PlanArtifact,
    target: &Reference,
) -> Result<Digest, PlanCmdError> {
    let push_err = |source| PlanCmdError::Push {
        target: target.to_string(),
        error: Box::new(source),
    };
    if let Some((d, bytes)) = &artifact.patch {
        client
            .push_blob(target, &d.digest, Bytes::from(bytes.clone()))
            .await
            .map_err(push_err)?;
    }
    client
        .push_blob(
            target,
            &artifact.manifest.config.digest,
            Bytes::from(artifact.config_json.clone()),
        )
        .await
        .map_err(push_err)?;
    client
        .push_manifest(
            target,
            Bytes::from(artifact.manifest_json.clone()),
            MEDIA_TYPE_OCI_MANIFEST,
        )
        .await
        .map_err(push_err)
}

/// What publishing a composed image did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PublishReport {
    /// Layers already in the target repository.
    pub layers_present: usize,
    /// Layers mounted from a group's repository.
    pub layers_mounted: usize,
    /// Bytes uploaded (config blob and manifest only).
    pub bytes_uploaded: u64,
    pub manifest_digest: Option<Digest>,
}

/// Publish a composed image under `target`: mount every layer from its group's repository
/// (same registry), push the config blob, push the manifest.
pub async fn publish_composed(
    client: &Client,
    groups: &[ResolvedGroup],
    composed: &Composed,
    target: &Reference,
) -> Result<PublishReport, PlanCmdError> {
    let mut report = PublishReport::default();
    let push_err = |source| PlanCmdError::Push {
        target: target.to_string(),
        error: Box::new(source),
    };
    let mut seen = BTreeSet::new();
    let mut jobs = Vec::new();
    for g in groups {
        let gr = parse_ref(&g.reference)?;
        for l in &g.manifest.layers {
            if !seen.insert(l.digest.clone()) {
                continue;
            }
            if gr.registry() != target.registry() {
                return Err(PlanCmdError::CrossRegistry {
                    digest: l.digest.clone(),
                    group: g.reference.clone(),
                    from: gr.registry().to_string(),
                    to: target.registry().to_string(),
                });
            }
            let (gr, digest, group) = (gr.clone(), l.digest.clone(), g.reference.clone());
            jobs.push(async move {
                if client
                    .head_blob(target, &digest)
                    .await
                    .map_err(push_err)?
                    .is_some()
                {
                    return Ok(false);
                }
                if gr.repository() != target.repository()
                    && client
                        .mount_blob(target, gr.repository(), &digest)
                        .await
                        .map_err(push_err)?
                {
                    return Ok(true);
                }
                Err(PlanCmdError::MountRefused {
                    digest,
                    group,
                    repo: gr.repository().to_string(),
                    target: target.to_string(),
                })
            });
        }
    }
    for mounted in futures::future::try_join_all(jobs).await? {
        if mounted {
            report.layers_mounted += 1;
        } else {
            report.layers_present += 1;
        }
    }
    let pushed = client
        .push_blob(
            target,
            &composed.config_digest,
            Bytes::from(composed.config_json.clone()),
        )
        .await
        .map_err(push_err)?;
    if pushed == weenv_registry::BlobPush::Uploaded {
        report.bytes_uploaded += composed.config_json.len() as u64;
    }
    let d = client
        .push_manifest(
            target,
            Bytes::from(composed.manifest_json.clone()),
            MEDIA_TYPE_OCI_MANIFEST,
        )
        .await
        .map_err(push_err)?;
    report.bytes_uploaded += composed.manifest_json.len() as u64;
    report.manifest_digest = Some(d);
    Ok(report)
}
