//! Plans by reference: a plan published as a small OCI artifact, and the composition of one
//! with its mutation synthesised as a layer.
//!
//! The artifact is an OCI image manifest with artifact type [`MEDIA_TYPE_PLAN_CONFIG`]; its
//! config blob is the plan as canonical JSON (the same [`Plan`] schema as the TOML file, with
//! a mutation patch named by `blob`, never by file), and its one optional layer
//! ([`MEDIA_TYPE_PATCH`]) is the mutation's patch. A node resolves a plan reference, resolves the
//! plan's groups, builds the at-init mutation as a tiny layer (see
//! [`crate::mutation::build_mutation_tar`]) and composes with [`compose_with_mutation`]: the
//! mutation layer is stacked as a pre-applied group on top, so any containerd client gets an
//! ordinary image whose rootfs already holds the task's change.

use crate::group::{build_group, canonical_json, GroupConfig, GroupKind, MEDIA_TYPE_OCI_MANIFEST};
use crate::plan::{compose, Composed, MutationMode, Plan, PlanError, ResolvedGroup};
use std::collections::BTreeMap;
use thiserror::Error;
use weenv_format::Digest;
use weenv_registry::manifest::{Descriptor, ImageManifest};

/// Artifact type of a plan manifest and media type of its config blob (the plan as JSON).
pub const MEDIA_TYPE_PLAN_CONFIG: &str = "application/vnd.weenv.plan.config.v1+json";
/// Media type of the mutation's patch blob (a unified or git diff).
pub const MEDIA_TYPE_PATCH: &str = "application/vnd.weenv.patch.v1.diff";
/// Media type of a synthesised mutation layer (an ordinary zstd tar layer).
pub const MEDIA_TYPE_MUTATION_LAYER: &str = "application/vnd.oci.image.layer.v1.tar+zstd";
/// Largest plan config blob accepted (a plan is a few hundred bytes).
pub const MAX_PLAN_CONFIG: usize = 256 * 1024;
/// Largest patch accepted in a plan artifact.
pub const MAX_PATCH: usize = 16 * 1024 * 1024;

/// Errors of building or reading a plan artifact.
#[derive(Debug, Error)]
pub enum PlanRefError {
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error("plan artifact: {0}")]
    Invalid(String),
}

/// A plan artifact ready to push.
#[derive(Clone, Debug)]
pub struct PlanArtifact {
    pub plan: Plan,
    pub config_json: Vec<u8>,
    /// The patch blob (descriptor + bytes), if the plan has an at-init patch.
    pub patch: Option<(Descriptor, Vec<u8>)>,
    pub manifest: ImageManifest,
    pub manifest_json: Vec<u8>,
    pub manifest_digest: Digest,
}

/// True if `m` is a plan artifact.
pub fn is_plan(m: &ImageManifest) -> bool {
    m.config.media_type == MEDIA_TYPE_PLAN_CONFIG
}

/// Build the artifact of `plan` whose at-init patch file holds `patch` (pure). A plan with a
/// `mutation.patch` file needs `patch`; the artifact names it by digest (`mutation.blob`).
pub fn build_plan_artifact(
    plan: &Plan,
    patch: Option<&[u8]>,
) -> Result<PlanArtifact, PlanRefError> {
    plan.validate()?;
    let mut plan = plan.clone();
    let mut layers = Vec::new();
    let mut patch_blob = None;
    if let Some(m) = plan.mutation.as_mut() {
        if m.mode == MutationMode::Init {
            match (m.patch.take(), patch, &m.blob) {
                (Some(_), Some(bytes), _) => {
                    let d = Descriptor::new(
                        MEDIA_TYPE_PATCH,
                        Digest::sha256(bytes),
                        bytes.len() as u64,
                    );
                    m.blob = Some(d.digest.clone());
                    layers.push(d.clone());
                    patch_blob = Some((d, bytes.to_vec()));
                }
                (Some(file), None, _) => {
                    return Err(PlanRefError::Invalid(format!(
                        "mutation.patch {file:?} given without its content"
                    )))
                }
                (None, _, Some(_)) => {
                    return Err(PlanRefError::Invalid(
                        "mutation.blob: a plan artifact carries its patch itself; name the patch \
                         file with mutation.patch"
                            .into(),
                    ))
                }
                (None, _, None) => {}
            }
            if m.checkout.is_some() {
                return Err(PlanRefError::Invalid(
                    "mutation.checkout needs git in a running container; a plan reference \
                     applies its patch as a layer (use a task group at that commit)"
                        .into(),
                ));
            }
        }
    }
    let config_json = canonical_json(&plan);
    let manifest = ImageManifest {
        schema_version: 2,
        media_type: Some(MEDIA_TYPE_OCI_MANIFEST.into()),
        artifact_type: Some(MEDIA_TYPE_PLAN_CONFIG.into()),
        config: Descriptor::new(
            MEDIA_TYPE_PLAN_CONFIG,
            Digest::sha256(&config_json),
            config_json.len() as u64,
        ),
        layers,
        subject: None,
        annotations: BTreeMap::new(),
    };
    let manifest_json = canonical_json(&manifest);
    let manifest_digest = Digest::sha256(&manifest_json);
    Ok(PlanArtifact {
        plan,
        config_json,
        patch: patch_blob,
        manifest,
        manifest_json,
        manifest_digest,
    })
}

/// The plan in a plan artifact's config blob, validated; the descriptor of its patch blob
/// (a layer of `manifest` with the digest the plan names), if it has one.
pub fn parse_plan_config(
    manifest: &ImageManifest,
    config: &[u8],
) -> Result<(Plan, Option<Descriptor>), PlanRefError> {
    if !is_plan(manifest) {
        return Err(PlanRefError::Invalid(format!(
            "config media type {:?} is not {MEDIA_TYPE_PLAN_CONFIG}",
            manifest.config.media_type
        )));
    }
    if config.len() > MAX_PLAN_CONFIG {
        return Err(PlanRefError::Invalid(format!(
            "config blob of {} bytes (at most {MAX_PLAN_CONFIG})",
            config.len()
        )));
    }
    let plan: Plan = serde_json::from_slice(config)
        .map_err(|e| PlanRefError::Invalid(format!("config blob is not a weenv plan: {e}")))?;
    plan.validate()?;
    let patch = match plan.init_mutation() {
        Some(m) if m.patch.is_some() => {
            return Err(PlanRefError::Invalid(
                "mutation.patch names a file; an artifact names its patch by blob".into(),
            ))
        }
        Some(m) => match &m.blob {
            Some(d) => Some(
                manifest
                    .layers
                    .iter()
                    .find(|l| &l.digest == d)
                    .cloned()
                    .ok_or_else(|| {
                        PlanRefError::Invalid(format!(
                            "mutation.blob {d} is not a layer of the artifact"
                        ))
                    })?,
            ),
            None => None,
        },
        None => None,
    };
    if let Some(p) = &patch {
        if p.size > MAX_PATCH as u64 {
            return Err(PlanRefError::Invalid(format!(
                "patch of {} bytes (at most {MAX_PATCH})",
                p.size
            )));
        }
    }
    Ok((plan, patch))
}

/// A mutation layer: its descriptor (compressed blob) and diff_id (uncompressed tar digest).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MutationLayer {
    pub descriptor: Descriptor,
    pub diff_id: Digest,
}

/// Compose `groups` (resolved for `plan.group_refs()`) with the at-init mutation given as a
/// synthesised `layer`, stacked on top as a pre-applied mutation group named
/// `<plan_reference>#mutation` (pure). Without a layer this is [`compose`].
pub fn compose_with_mutation(
    plan_reference: &str,
    groups: &[ResolvedGroup],
    plan: &Plan,
    layer: Option<&MutationLayer>,
) -> Result<Composed, PlanRefError> {
    // Stock clients' unpackers hand a Prepare only the layer descriptor's
    // `containerd.io/snapshot/*` annotations: name each weenv layer there (groups made from
    // directories do not carry them), so the node's snapshotter mounts it lazily.
    let mut groups = groups.to_vec();
    for g in &mut groups {
        for l in &mut g.manifest.layers {
            weenv_format::snapshot_labels::add_snapshot_annotations(&l.digest, &mut l.annotations);
        }
    }
    let Some(layer) = layer else {
        return Ok(compose(&groups, plan)?);
    };
    let platform = groups
        .first()
        .map(|g| g.config.platform.clone())
        .ok_or_else(|| PlanRefError::Invalid("a plan needs at least one group".into()))?;
    let reference = format!("{plan_reference}#mutation");
    let built = build_group(
        GroupConfig {
            version: 1,
            kind: GroupKind::Other("mutation".into()),
            name: "mutation".into(),
            platform,
            config: Default::default(),
            diff_ids: vec![layer.diff_id.clone()],
        },
        vec![layer.descriptor.clone()],
    )
    .map_err(|e| PlanRefError::Invalid(format!("mutation layer: {e}")))?;
    let mut all = groups;
    all.push(ResolvedGroup {
        reference: reference.clone(),
        manifest_digest: built.manifest_digest,
        manifest: built.manifest,
        config: built.config,
    });
    let mut pre = plan.clone();
    if let Some(m) = pre.mutation.as_mut() {
        m.mode = MutationMode::PreApplied;
        m.group = Some(reference);
        m.patch = None;
        m.blob = None;
        m.checkout = None;
    }
    Ok(compose(&all, &pre)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAN: &str = "version = 1\ngroups = [\"r/base:1\", \"r/task:1\"]\n\
        [mutation]\npatch = \"bug.diff\"\nroot = \"/src\"\n[config]\ncmd = [\"true\"]\n";

    #[test]
    fn artifact_round_trips_and_names_its_patch_by_digest() {
        let plan = Plan::parse(PLAN).unwrap();
        let a = build_plan_artifact(&plan, Some(b"--- a/x\n+++ b/x\n")).unwrap();
        assert!(is_plan(&a.manifest));
        assert_eq!(a.manifest.layers.len(), 1);
        let (back, patch) = parse_plan_config(&a.manifest, &a.config_json).unwrap();
        let m = back.mutation.as_ref().unwrap();
        assert_eq!(m.patch, None);
        assert_eq!(m.blob.as_ref(), Some(&a.manifest.layers[0].digest));
        assert_eq!(patch.unwrap().media_type, MEDIA_TYPE_PATCH);
        assert_eq!(back.config.cmd, Some(vec!["true".to_string()]));
        // Deterministic: equal inputs, equal digest.
        let b = build_plan_artifact(&plan, Some(b"--- a/x\n+++ b/x\n")).unwrap();
        assert_eq!(a.manifest_digest, b.manifest_digest);
    }

    #[test]
    fn artifact_refuses_what_a_node_cannot_apply() {
        let plan = Plan::parse(PLAN).unwrap();
        let e = build_plan_artifact(&plan, None).unwrap_err().to_string();
        assert!(e.contains("without its content"), "{e}");
        let co = Plan::parse(&PLAN.replace("root =", "checkout = \"abc\"\nroot =")).unwrap();
        let e = build_plan_artifact(&co, Some(b"x"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("checkout"), "{e}");
    }

    #[test]
    fn a_patch_blob_must_be_in_the_artifact() {
        let plan = Plan::parse(PLAN).unwrap();
        let mut a = build_plan_artifact(&plan, Some(b"p")).unwrap();
        a.manifest.layers.clear();
        let e = parse_plan_config(&a.manifest, &a.config_json)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a layer of the artifact"), "{e}");
        let mut g = a.manifest.clone();
        g.config.media_type = "application/vnd.oci.image.config.v1+json".into();
        assert!(parse_plan_config(&g, &a.config_json).is_err());
    }
}
