//! Plans by reference: the node's read-only OCI distribution endpoint (`[plans] listen`).
//!
//! containerd reaches it as a registry mirror (`hosts.toml`, which adds `?ns=<registry>` to
//! every request). For a manifest request the endpoint fetches the manifest from the registry
//! (`ns`); an ordinary image manifest is passed through unchanged, a plan artifact
//! ([`weenv_env::plan_ref`]) is resolved and composed on the node, metadata only:
//! - the plan's groups are resolved (digest references forever, tags for `ttl_secs`) and
//!   composed with [`weenv_env::plan_ref::compose_with_mutation`];
//! - an at-init patch becomes a small layer synthesised here ([`mutation`]): only the files the
//!   patch touches are read from the groups' layers (TOC + range reads), patched in memory,
//!   packed as a deterministic zstd tar; content-addressed, cached, never pushed anywhere.
//!
//! Blob requests: the composed config and the mutation layer are served from memory; every
//! other blob is redirected (307) to the registry that holds it (a group layer: its group's
//! repository; a passed-through image: the requested repository). The weenv snapshotter does not
//! even go there for weenv layers: [`PlanIndex::home`] tells the Prepare path which group
//! repository holds a layer, so lazy reads go straight to the group's registry.
//!
//! Errors reach the client as registry errors (`{"errors":[{"code","message"}]}`) with the
//! message of what failed (an unknown group, a group that moved or is not a group, a patch that
//! does not apply). A `HEAD` that fails is answered `405`, so containerd repeats it as a `GET`
//! and shows the message (a `HEAD` response has no body).

// PlanServeError carries the env crate's errors by value (one per request, off the hot path).
#![allow(clippy::result_large_err)]

pub mod mutation;
pub mod serve;

use crate::remote::source::LayerSource;
use bytes::Bytes;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use thiserror::Error;
use tracing::{debug, info};
use weenv_env::group::{parse_manifest, MEDIA_TYPE_OCI_MANIFEST};
use weenv_env::plan::{Plan, PlanError, ResolvedGroup};
use weenv_env::plan_ref::{compose_with_mutation, is_plan, parse_plan_config, PlanRefError};
use weenv_format::Digest;
use weenv_registry::{Capability, Client, Reference, RegistryError};

/// Most composed plans (and resolved references) kept in memory; the oldest half is dropped
/// past it.
pub const PLAN_CACHE_ENTRIES: usize = 4096;

/// What failed while serving a plan; each maps to one registry error code and status.
#[derive(Debug, Error)]
pub enum PlanServeError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{reference} not found in the registry: {error}")]
    NotFound {
        reference: String,
        error: Box<RegistryError>,
    },
    #[error("weenv plan {plan}: group {group} not found (was it published, or did it move? `weenv-convert group create ... --push {group}`): {error}")]
    GroupNotFound {
        plan: String,
        group: String,
        error: Box<RegistryError>,
    },
    #[error("weenv plan {plan}: {error}")]
    Plan { plan: String, error: PlanRefError },
    #[error("weenv plan {plan}: the mutation does not apply: {error}")]
    Mutation {
        plan: String,
        error: weenv_env::mutation::MutationError,
    },
    #[error("weenv plan {plan}: {what}: {error}")]
    Registry {
        plan: String,
        what: String,
        error: Box<RegistryError>,
    },
    #[error(
        "blob {digest} is not known here: pull the plan (its manifest) through this endpoint first"
    )]
    UnknownBlob { digest: Digest },
}

impl PlanServeError {
    /// (HTTP status, registry error code).
    pub fn status_code(&self) -> (u16, &'static str) {
        match self {
            PlanServeError::BadRequest(_) => (400, "UNSUPPORTED"),
            PlanServeError::NotFound { .. } => (404, "MANIFEST_UNKNOWN"),
            PlanServeError::GroupNotFound { .. } => (424, "MANIFEST_UNKNOWN"),
            PlanServeError::Plan { .. } | PlanServeError::Mutation { .. } => {
                (422, "MANIFEST_INVALID")
            }
            PlanServeError::Registry { .. } => (502, "UNAVAILABLE"),
            PlanServeError::UnknownBlob { .. } => (404, "BLOB_UNKNOWN"),
        }
    }
}

/// A composed plan, as served.
#[derive(Debug)]
pub struct ComposedPlan {
    pub plan_reference: String,
    pub manifest_json: Bytes,
    pub manifest_digest: Digest,
    pub config_json: Bytes,
    pub config_digest: Digest,
    /// The synthesised mutation layer: digest and compressed bytes.
    pub mutation: Option<(Digest, Bytes)>,
}

/// What a manifest request gets.
#[derive(Debug)]
pub enum ManifestAnswer {
    /// A composed plan.
    Plan(Arc<ComposedPlan>),
    /// An ordinary manifest, passed through: media type, digest, bytes.
    Passthrough(weenv_registry::ManifestBlob),
}

/// What a blob request gets.
#[derive(Debug, PartialEq, Eq)]
pub enum BlobAnswer {
    /// Served from memory: media type and bytes.
    Bytes(&'static str, Bytes),
    /// Redirect to this URL (the registry holding the blob).
    Redirect(String),
}

/// Where each layer of the composed plans lives (its group's repository), for the Prepare
/// path: lazy reads go to the group's registry, not to the plan's repository (which does not
/// hold the layer).
pub trait PlanIndex: Send + Sync + 'static {
    /// The group (`registry/repo@manifest digest`) holding `layer`, if a served plan has it.
    fn home(&self, layer: &Digest) -> Option<LayerSource>;
}

#[derive(Default)]
struct Caches {
    /// `registry/repo:tag` -> (manifest digest, when resolved).
    tags: HashMap<String, (Digest, Instant)>,
    /// Group manifest digest -> the resolved group.
    groups: HashMap<Digest, ResolvedGroup>,
    /// Plan artifact digest -> its composition.
    plans: HashMap<Digest, Arc<ComposedPlan>>,
    /// Composed manifest digest -> composition (manifest requests by digest).
    composed: HashMap<Digest, Arc<ComposedPlan>>,
    /// Config or mutation digest -> composition holding it.
    blobs: HashMap<Digest, Arc<ComposedPlan>>,
    /// Layer digest -> the group that holds it.
    homes: HashMap<Digest, LayerSource>,
}

fn bound<K, V>(m: &mut HashMap<K, V>) {
    if m.len() >= PLAN_CACHE_ENTRIES {
        m.clear();
    }
}

/// Resolves and composes plan references (see the module docs).
pub struct PlanServer {
    client: Client,
    ttl: Duration,
    caches: Mutex<Caches>,
    /// One composition per plan at a time.
    composing: tokio::sync::Mutex<()>,
}

impl PlanServer {
    /// A server reaching registries through `client`; tags are re-resolved after `ttl`.
    pub fn new(client: Client, ttl: Duration) -> Self {
        Self {
            client,
            ttl,
            caches: Mutex::new(Caches::default()),
            composing: tokio::sync::Mutex::new(()),
        }
    }

    fn reference(ns: &str, name: &str, reference: &str) -> Result<Reference, PlanServeError> {
        let s = if reference.starts_with("sha256:") {
            format!("{ns}/{name}@{reference}")
        } else {
            format!("{ns}/{name}:{reference}")
        };
        s.parse()
            .map_err(|e: RegistryError| PlanServeError::BadRequest(format!("{s}: {e}")))
    }

    /// The manifest `ns/name:reference` (or `@digest`): a composed plan or a passed-through
    /// manifest.
    pub async fn manifest(
        &self,
        ns: &str,
        name: &str,
        reference: &str,
    ) -> Result<ManifestAnswer, PlanServeError> {
        let r = Self::reference(ns, name, reference)?;
        if let Some(d) = r.digest() {
            if let Some(c) = self.caches.lock().composed.get(d).cloned() {
                return Ok(ManifestAnswer::Plan(c));
            }
        }
        let m = self
            .client
            .get_manifest(&r)
            .await
            .map_err(|e| match e.status() {
                Some(404) => PlanServeError::NotFound {
                    reference: r.to_string(),
                    error: Box::new(e),
                },
                _ => PlanServeError::Registry {
                    plan: r.to_string(),
                    what: "fetching the manifest".into(),
                    error: Box::new(e),
                },
            })?;
        let artifact = match parse_manifest(&m.bytes) {
            Ok(a) if is_plan(&a) => a,
            _ => return Ok(ManifestAnswer::Passthrough(m)),
        };
        if let Some(c) = self.caches.lock().plans.get(&m.digest).cloned() {
            return Ok(ManifestAnswer::Plan(c));
        }
        let _one = self.composing.lock().await;
        if let Some(c) = self.caches.lock().plans.get(&m.digest).cloned() {
            return Ok(ManifestAnswer::Plan(c));
        }
        let t = Instant::now();
        let composed = Arc::new(self.compose(&r, &artifact).await?);
        info!(plan = %r, artifact = %m.digest, manifest = %composed.manifest_digest,
            mutation = composed.mutation.is_some(), ms = t.elapsed().as_millis() as u64,
            "plan composed on the node");
        let mut c = self.caches.lock();
        bound(&mut c.plans);
        bound(&mut c.composed);
        bound(&mut c.blobs);
        c.plans.insert(m.digest.clone(), composed.clone());
        c.composed
            .insert(composed.manifest_digest.clone(), composed.clone());
        c.blobs
            .insert(composed.config_digest.clone(), composed.clone());
        if let Some((d, _)) = &composed.mutation {
            c.blobs.insert(d.clone(), composed.clone());
        }
        Ok(ManifestAnswer::Plan(composed))
    }

    async fn compose(
        &self,
        r: &Reference,
        artifact: &weenv_registry::manifest::ImageManifest,
    ) -> Result<ComposedPlan, PlanServeError> {
        let plan_s = r.to_string();
        let reg = |what: &str, e: RegistryError| PlanServeError::Registry {
            plan: plan_s.clone(),
            what: what.to_string(),
            error: Box::new(e),
        };
        let config = self
            .client
            .get_blob(r, &artifact.config.digest)
            .await
            .map_err(|e| reg("fetching the plan config", e))?;
        let (plan, patch_desc) =
            parse_plan_config(artifact, &config).map_err(|error| PlanServeError::Plan {
                plan: plan_s.clone(),
                error,
            })?;
        let groups = self.resolve_groups(&plan_s, &plan).await?;
        let layer = match (plan.init_mutation(), patch_desc) {
            (Some(m), Some(pd)) => {
                let patch = self
                    .client
                    .get_blob(r, &pd.digest)
                    .await
                    .map_err(|e| reg("fetching the patch", e))?;
                Some(
                    mutation::synthesise(&self.client, &groups, m, &patch)
                        .await
                        .map_err(|e| match e {
                            mutation::SynthError::Mutation(error) => PlanServeError::Mutation {
                                plan: plan_s.clone(),
                                error,
                            },
                            mutation::SynthError::Internal(why) => PlanServeError::Plan {
                                plan: plan_s.clone(),
                                error: PlanRefError::Invalid(why),
                            },
                        })?,
                )
            }
            _ => None,
        };
        let composed =
            compose_with_mutation(&plan_s, &groups, &plan, layer.as_ref().map(|(l, _)| l))
                .map_err(|error| PlanServeError::Plan {
                    plan: plan_s.clone(),
                    error,
                })?;
        {
            let mut c = self.caches.lock();
            for g in &groups {
                let Ok(gr) = g.reference.parse::<Reference>() else {
                    continue;
                };
                let at = gr.with_digest(g.manifest_digest.clone());
                for l in &g.manifest.layers {
                    bound(&mut c.homes);
                    c.homes.insert(
                        l.digest.clone(),
                        LayerSource {
                            reference: at.to_string(),
                            manifest: g.manifest_digest.to_string(),
                        },
                    );
                }
            }
        }
        Ok(ComposedPlan {
            plan_reference: plan_s,
            manifest_json: Bytes::from(composed.manifest_json),
            manifest_digest: composed.manifest_digest,
            config_json: Bytes::from(composed.config_json),
            config_digest: composed.config_digest,
            mutation: layer.map(|(l, b)| (l.descriptor.digest, b)),
        })
    }

    /// The plan's groups (bottom→top), through the tag and group caches.
    async fn resolve_groups(
        &self,
        plan_s: &str,
        plan: &Plan,
    ) -> Result<Vec<ResolvedGroup>, PlanServeError> {
        let refs: Vec<String> = plan.group_refs().iter().map(|s| s.to_string()).collect();
        let jobs = refs.iter().map(|g| self.resolve_group(plan_s, g));
        futures::future::try_join_all(jobs).await
    }

    async fn resolve_group(
        &self,
        plan_s: &str,
        group: &str,
    ) -> Result<ResolvedGroup, PlanServeError> {
        let r: Reference = group
            .parse()
            .map_err(|e: RegistryError| PlanServeError::Plan {
                plan: plan_s.to_string(),
                error: PlanRefError::Plan(PlanError::Invalid {
                    field: "groups".into(),
                    reason: format!("{group}: {e}"),
                }),
            })?;
        let cached = {
            let c = self.caches.lock();
            let d = match r.digest() {
                Some(d) => Some(d.clone()),
                None => c
                    .tags
                    .get(group)
                    .filter(|(_, at)| at.elapsed() < self.ttl)
                    .map(|(d, _)| d.clone()),
            };
            d.and_then(|d| c.groups.get(&d).cloned())
        };
        if let Some(g) = cached {
            return Ok(ResolvedGroup {
                reference: group.to_string(),
                ..g
            });
        }
        let not_found = |e: RegistryError| PlanServeError::GroupNotFound {
            plan: plan_s.to_string(),
            group: group.to_string(),
            error: Box::new(e),
        };
        let reg = |what: &str, e: RegistryError| PlanServeError::Registry {
            plan: plan_s.to_string(),
            what: format!("{what} of group {group}"),
            error: Box::new(e),
        };
        let m = self.client.get_manifest(&r).await.map_err(|e| {
            if e.status() == Some(404) {
                not_found(e)
            } else {
                reg("fetching the manifest", e)
            }
        })?;
        let bad = |error: PlanError| PlanServeError::Plan {
            plan: plan_s.to_string(),
            error: PlanRefError::Plan(error),
        };
        let gm = ResolvedGroup::parse_manifest(group, &m.bytes).map_err(bad)?;
        let config = self
            .client
            .get_blob(&r, &gm.config.digest)
            .await
            .map_err(|e| reg("fetching the config", e))?;
        let g = ResolvedGroup::parse(group, m.digest.clone(), &m.bytes, &config).map_err(bad)?;
        debug!(group, digest = %m.digest, "plan group resolved");
        let mut c = self.caches.lock();
        bound(&mut c.groups);
        bound(&mut c.tags);
        c.groups.insert(m.digest.clone(), g.clone());
        if r.digest().is_none() {
            c.tags
                .insert(group.to_string(), (m.digest.clone(), Instant::now()));
        }
        Ok(g)
    }

    /// The blob `digest` requested as `ns/name`: from memory (composed config, mutation layer)
    /// or a redirect to the registry holding it.
    pub fn blob(
        &self,
        ns: &str,
        name: &str,
        digest: &Digest,
    ) -> Result<BlobAnswer, PlanServeError> {
        let c = self.caches.lock();
        if let Some(p) = c.blobs.get(digest) {
            if &p.config_digest == digest {
                return Ok(BlobAnswer::Bytes(
                    weenv_env::group::MEDIA_TYPE_OCI_CONFIG,
                    p.config_json.clone(),
                ));
            }
            if let Some((d, b)) = &p.mutation {
                if d == digest {
                    return Ok(BlobAnswer::Bytes(
                        weenv_env::plan_ref::MEDIA_TYPE_MUTATION_LAYER,
                        b.clone(),
                    ));
                }
            }
        }
        let (registry, repo) = match c.homes.get(digest) {
            Some(h) => {
                let r: Reference = h
                    .reference
                    .parse()
                    .map_err(|e: RegistryError| PlanServeError::BadRequest(e.to_string()))?;
                (r.registry().to_string(), r.repository().to_string())
            }
            None => (ns.to_string(), name.to_string()),
        };
        drop(c);
        let eps = self
            .client
            .config()
            .endpoints(&registry, Capability::Pull)
            .map_err(|e| PlanServeError::BadRequest(e.to_string()))?;
        let origin = eps.last().ok_or_else(|| PlanServeError::UnknownBlob {
            digest: digest.clone(),
        })?;
        Ok(BlobAnswer::Redirect(format!(
            "{}/{repo}/blobs/{digest}",
            origin.api_root
        )))
    }

    /// Media type served for composed manifests.
    pub const MANIFEST_MEDIA_TYPE: &'static str = MEDIA_TYPE_OCI_MANIFEST;
}

impl PlanIndex for PlanServer {
    fn home(&self, layer: &Digest) -> Option<LayerSource> {
        self.caches.lock().homes.get(layer).cloned()
    }
}

/// The registry config the plan endpoint's client (and the daemon's) uses: `cfg` without the
/// mirrors that are this endpoint itself (`own`: `host:port`), which containerd's `hosts.toml`
/// lists for plan registries, so the daemon never asks itself.
pub fn without_own_mirror(
    mut cfg: weenv_registry::RegistryConfig,
    own: &str,
) -> Result<weenv_registry::RegistryConfig, RegistryError> {
    if let Some(dir) = cfg.hosts_dir.take() {
        cfg.merge_hosts_dir(&dir)?;
    }
    for hc in cfg.hosts.values_mut() {
        hc.mirrors
            .retain(|m| url_host(&m.url).is_none_or(|h| h != own));
    }
    Ok(cfg)
}

fn url_host(url: &str) -> Option<String> {
    let rest = url.split_once("://").map(|(_, r)| r).unwrap_or(url);
    rest.split('/').next().map(str::to_string)
}

#[cfg(test)]
mod tests;
