//! Environment plans: an ordered list of layer groups (bottom to top), an optional per-task
//! mutation and config overrides, and the pure composition of resolved groups into one
//! ordinary OCI image manifest + config (metadata only: no layer byte is touched).
//!
//! Plan file (TOML, `version = 1`, unknown keys rejected):
//! ```toml
//! version = 1
//! groups = ["reg/weenv/base:1", "reg/weenv/task-x:1", "reg/weenv/harness:2"]
//! [mutation]            # optional
//! mode = "init"         # "init" (default) or "pre-applied"
//! patch = "bug.diff"    # file relative to the plan (init), or blob = "sha256:..."
//! root = "/src/repo"    # directory the patch paths are relative to (default "/")
//! strip = 1             # leading path components to strip (default 1: git's a/ b/)
//! checkout = "abc123"   # optional: `git -C root checkout` (needs git in the image)
//! # group = "reg/weenv/task-x-bug:1"   # pre-applied: the group made by `group mutate`
//! [config]              # optional overrides, applied after all groups
//! cmd = ["python3", "/eval/run.py"]
//! workdir = "/src/repo"
//! [config.env]
//! TASK = "42"
//! ```
//!
//! Composition rules ([`compose`]): layers and diff_ids concatenated bottom→top; env merged
//! by [`merge_env`] (higher groups override a key; `PATH` entries are merged, higher first);
//! workdir/entrypoint/cmd/user from the highest group that sets them; labels merged (higher
//! wins); then the plan's `[config]` overrides. All groups must share one platform.

use crate::group::{
    canonical_json, is_group, parse_manifest, ConfigFragment, GroupConfig, MEDIA_TYPE_OCI_CONFIG,
    MEDIA_TYPE_OCI_MANIFEST,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use thiserror::Error;
use weenv_format::Digest;
use weenv_registry::manifest::{
    Descriptor, History, ImageConfig, ImageManifest, RootFs, RuntimeConfig,
};

/// Current plan file version.
pub const PLAN_VERSION: u32 = 1;
/// Manifest annotation on a composed image: `ref@digest` of each group, bottom→top, comma-separated.
pub const ANNOTATION_PLAN_GROUPS: &str = "io.weenv.plan.groups";
/// Config label prefix recording an at-init mutation (`.mode`, `.root`, `.patch`, `.checkout`).
pub const LABEL_MUTATION_PREFIX: &str = "io.weenv.mutation";

/// Errors from parsing, validating or composing a plan.
#[derive(Debug, Error)]
pub enum PlanError {
    #[error("plan is not valid TOML for weenv plan v{PLAN_VERSION}: {0}")]
    Toml(#[from] toml::de::Error),
    #[error("plan field `{field}` is invalid: {reason}")]
    Invalid { field: String, reason: String },
    #[error("compose got {got} resolved groups for a plan of {want} group references")]
    GroupCount { got: usize, want: usize },
    #[error("`{reference}` is not a weenv layer group (config media type {media_type:?}); publish it with `weenv-convert group create`")]
    NotAGroup {
        reference: String,
        media_type: String,
    },
    #[error("group `{reference}` is malformed: {reason}")]
    BadGroup { reference: String, reason: String },
    #[error("groups `{first}` and `{second}` resolve to the same manifest {digest}: a group may appear once in a plan")]
    Duplicate {
        first: String,
        second: String,
        digest: Digest,
    },
    #[error("platform mismatch: group `{lower}` is {lower_platform} but group `{upper}` is {upper_platform}")]
    PlatformMismatch {
        lower: String,
        lower_platform: String,
        upper: String,
        upper_platform: String,
    },
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> PlanError {
    PlanError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

/// When a mutation is applied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MutationMode {
    /// Applied into the container's writable layer before the task starts (`weenv run`).
    #[default]
    Init,
    /// Already packaged as a tiny group (`weenv-convert group mutate`) named by `group`.
    PreApplied,
}

fn default_root() -> String {
    "/".into()
}
fn default_strip() -> u32 {
    1
}

/// The `[mutation]` table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mutation {
    /// Default `init`.
    #[serde(default)]
    pub mode: MutationMode,
    /// Unified diff file, relative to the plan file's directory (or absolute).
    #[serde(default)]
    pub patch: Option<String>,
    /// Or: the patch as a blob digest in the image's repository.
    #[serde(default)]
    pub blob: Option<Digest>,
    /// Commit to check out in the git repository at `root` (init mode; needs git in the image).
    #[serde(default)]
    pub checkout: Option<String>,
    /// Directory inside the rootfs the patch paths are relative to. Default `/`.
    #[serde(default = "default_root")]
    pub root: String,
    /// Leading path components stripped from patch paths (`patch -p`). Default 1.
    #[serde(default = "default_strip")]
    pub strip: u32,
    /// Pre-applied mode: reference of the mutation group, stacked on top of `groups`.
    #[serde(default)]
    pub group: Option<String>,
}

/// The `[config]` overrides table.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigOverrides {
    #[serde(default)]
    pub cmd: Option<Vec<String>>,
    #[serde(default)]
    pub entrypoint: Option<Vec<String>>,
    /// Replaces the value of each key; `$PATH` inside `PATH` expands to the composed PATH.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub workdir: Option<String>,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// An environment plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    /// Must be [`PLAN_VERSION`].
    pub version: u32,
    /// Group references, bottom to top.
    pub groups: Vec<String>,
    #[serde(default)]
    pub mutation: Option<Mutation>,
    #[serde(default)]
    pub config: ConfigOverrides,
}

impl Plan {
    /// Parse and validate a plan file's text.
    pub fn parse(text: &str) -> Result<Self, PlanError> {
        let p: Plan = toml::from_str(text)?;
        p.validate()?;
        Ok(p)
    }

    /// Group references to resolve, bottom→top, including a pre-applied mutation group.
    pub fn group_refs(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.groups.iter().map(String::as_str).collect();
        if let Some(Mutation {
            mode: MutationMode::PreApplied,
            group: Some(g),
            ..
        }) = &self.mutation
        {
            v.push(g);
        }
        v
    }

    /// The at-init mutation, if any.
    pub fn init_mutation(&self) -> Option<&Mutation> {
        self.mutation
            .as_ref()
            .filter(|m| m.mode == MutationMode::Init)
    }

    /// Field-level validation; the error names the offending field.
    pub fn validate(&self) -> Result<(), PlanError> {
        if self.version != PLAN_VERSION {
            return Err(invalid(
                "version",
                format!(
                    "unsupported version {}, expected {PLAN_VERSION}",
                    self.version
                ),
            ));
        }
        if self.groups.is_empty() {
            return Err(invalid("groups", "must list at least one group reference"));
        }
        for (i, g) in self.groups.iter().enumerate() {
            if g.is_empty() || g.chars().any(char::is_whitespace) {
                return Err(invalid(
                    format!("groups[{i}]"),
                    format!("{g:?} is not a reference"),
                ));
            }
            if let Some(j) = self.groups[..i].iter().position(|h| h == g) {
                return Err(invalid(
                    format!("groups[{i}]"),
                    format!("duplicate of groups[{j}] ({g})"),
                ));
            }
        }
        if let Some(m) = &self.mutation {
            self.validate_mutation(m)?;
        }
        for k in self.config.env.keys() {
            if k.is_empty() || k.contains('=') {
                return Err(invalid(
                    format!("config.env.{k}"),
                    "not a valid variable name",
                ));
            }
        }
        if let Some(w) = &self.config.workdir {
            if !w.starts_with('/') {
                return Err(invalid("config.workdir", format!("{w:?} must be absolute")));
            }
        }
        Ok(())
    }

    fn validate_mutation(&self, m: &Mutation) -> Result<(), PlanError> {
        if !m.root.starts_with('/') || m.root.split('/').any(|c| c == "..") {
            return Err(invalid(
                "mutation.root",
                format!("{:?} must be absolute without `..`", m.root),
            ));
        }
        if m.patch.is_some() && m.blob.is_some() {
            return Err(invalid(
                "mutation.blob",
                "give either `patch` or `blob`, not both",
            ));
        }
        match m.mode {
            MutationMode::Init => {
                if m.group.is_some() {
                    return Err(invalid(
                        "mutation.group",
                        "only allowed with mode = \"pre-applied\"",
                    ));
                }
                if m.patch.is_none() && m.blob.is_none() && m.checkout.is_none() {
                    return Err(invalid(
                        "mutation",
                        "init mode needs `patch`, `blob` or `checkout`",
                    ));
                }
            }
            MutationMode::PreApplied => {
                let Some(g) = &m.group else {
                    return Err(invalid(
                        "mutation.group",
                        "pre-applied mode needs the mutation group made by `weenv-convert group mutate`",
                    ));
                };
                if self.groups.contains(g) {
                    return Err(invalid(
                        "mutation.group",
                        format!("{g} is already listed in groups"),
                    ));
                }
                if m.checkout.is_some() {
                    return Err(invalid(
                        "mutation.checkout",
                        "only allowed with mode = \"init\"",
                    ));
                }
            }
        }
        Ok(())
    }
}

/// A group reference resolved to its manifest and config.
#[derive(Clone, Debug)]
pub struct ResolvedGroup {
    /// The reference as written in the plan.
    pub reference: String,
    pub manifest_digest: Digest,
    pub manifest: ImageManifest,
    pub config: GroupConfig,
}

impl ResolvedGroup {
    /// Check that `manifest_bytes` is a layer group's manifest (before its config is fetched).
    pub fn parse_manifest(
        reference: &str,
        manifest_bytes: &[u8],
    ) -> Result<ImageManifest, PlanError> {
        let manifest = parse_manifest(manifest_bytes).map_err(|e| PlanError::BadGroup {
            reference: reference.to_string(),
            reason: e.to_string(),
        })?;
        if !is_group(&manifest) {
            return Err(PlanError::NotAGroup {
                reference: reference.to_string(),
                media_type: manifest.config.media_type,
            });
        }
        Ok(manifest)
    }

    /// A group from its manifest and config bytes, as fetched for `reference`.
    pub fn parse(
        reference: &str,
        manifest_digest: Digest,
        manifest_bytes: &[u8],
        config_bytes: &[u8],
    ) -> Result<Self, PlanError> {
        let manifest = Self::parse_manifest(reference, manifest_bytes)?;
        let config = GroupConfig::from_json(config_bytes).map_err(|e| PlanError::BadGroup {
            reference: reference.to_string(),
            reason: e.to_string(),
        })?;
        Ok(ResolvedGroup {
            reference: reference.to_string(),
            manifest_digest,
            manifest,
            config,
        })
    }
}

/// Merge `upper` env entries over `lower` (both `KEY=VALUE`, order kept, first position wins).
/// A key in `upper` replaces its value, except `PATH`: the upper PATH's entries come first,
/// followed by lower entries it does not already contain (so a harness adding
/// `/opt/harness/bin` keeps the base's `/usr/bin:/bin`). A merged PATH lists each entry once
/// and drops empty entries (an empty entry would mean the working directory).
pub fn merge_env(lower: &[String], upper: &[String]) -> Vec<String> {
    let mut out: Vec<(String, String)> = lower.iter().filter_map(|e| split_env(e)).collect();
    for (k, v) in upper.iter().filter_map(|e| split_env(e)) {
        match out.iter_mut().find(|(ok, _)| *ok == k) {
            Some(slot) if k == "PATH" => slot.1 = merge_path(&v, &slot.1),
            Some(slot) => slot.1 = v,
            None if k == "PATH" => out.push((k, merge_path(&v, ""))),
            None => out.push((k, v)),
        }
    }
    out.into_iter().map(|(k, v)| format!("{k}={v}")).collect()
}

fn split_env(e: &str) -> Option<(String, String)> {
    e.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
}

fn merge_path(upper: &str, lower: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for p in upper.split(':').chain(lower.split(':')) {
        if !p.is_empty() && !parts.contains(&p) {
            parts.push(p);
        }
    }
    parts.join(":")
}

/// A composed image: config + manifest bytes and digests.
#[derive(Clone, Debug)]
pub struct Composed {
    pub config: ImageConfig,
    pub config_json: Vec<u8>,
    pub config_digest: Digest,
    pub manifest: ImageManifest,
    pub manifest_json: Vec<u8>,
    pub manifest_digest: Digest,
}

/// Compose resolved groups (in [`Plan::group_refs`] order) into an image. Pure and
/// deterministic: equal inputs give byte-identical config and manifest.
pub fn compose(groups: &[ResolvedGroup], plan: &Plan) -> Result<Composed, PlanError> {
    let want = plan.group_refs().len();
    if groups.len() != want {
        return Err(PlanError::GroupCount {
            got: groups.len(),
            want,
        });
    }
    check_groups(groups)?;
    let platform = groups[0].config.platform.clone();

    let mut frag = ConfigFragment::default();
    let mut layers: Vec<Descriptor> = Vec::new();
    let mut diff_ids = Vec::new();
    let mut history = Vec::new();
    for g in groups {
        let c = &g.config.config;
        frag.env = merge_env(&frag.env, &c.env);
        override_opt(&mut frag.workdir, &c.workdir);
        override_opt(&mut frag.entrypoint, &c.entrypoint);
        override_opt(&mut frag.cmd, &c.cmd);
        override_opt(&mut frag.user, &c.user);
        frag.labels.extend(c.labels.clone());
        layers.extend(g.manifest.layers.iter().cloned());
        diff_ids.extend(g.config.diff_ids.iter().cloned());
        for _ in &g.manifest.layers {
            history.push(History {
                created_by: format!(
                    "weenv group {} {} ({}@{})",
                    g.config.kind, g.config.name, g.reference, g.manifest_digest
                ),
            });
        }
    }
    apply_overrides(&mut frag, &plan.config);
    if let Some(m) = plan.init_mutation() {
        frag.labels.extend(mutation_labels(m));
    }

    let config = ImageConfig {
        architecture: Some(platform.architecture.clone()),
        os: Some(platform.os.clone()),
        variant: platform.variant.clone(),
        config: RuntimeConfig {
            user: frag.user,
            env: frag.env,
            entrypoint: frag.entrypoint,
            cmd: frag.cmd,
            working_dir: frag.workdir,
            labels: frag.labels,
        },
        rootfs: RootFs {
            kind: "layers".into(),
            diff_ids: diff_ids.iter().map(Digest::to_string).collect(),
        },
        history,
    };
    let config_json = canonical_json(&config);
    let config_digest = Digest::sha256(&config_json);
    let provenance: Vec<String> = groups
        .iter()
        .map(|g| format!("{}@{}", g.reference, g.manifest_digest))
        .collect();
    let manifest = ImageManifest {
        schema_version: 2,
        media_type: Some(MEDIA_TYPE_OCI_MANIFEST.into()),
        artifact_type: None,
        config: Descriptor::new(
            MEDIA_TYPE_OCI_CONFIG,
            config_digest.clone(),
            config_json.len() as u64,
        ),
        layers,
        subject: None,
        annotations: [(ANNOTATION_PLAN_GROUPS.to_string(), provenance.join(","))].into(),
    };
    let manifest_json = canonical_json(&manifest);
    let manifest_digest = Digest::sha256(&manifest_json);
    Ok(Composed {
        config,
        config_json,
        config_digest,
        manifest,
        manifest_json,
        manifest_digest,
    })
}

fn check_groups(groups: &[ResolvedGroup]) -> Result<(), PlanError> {
    for (i, g) in groups.iter().enumerate() {
        if !is_group(&g.manifest) {
            return Err(PlanError::NotAGroup {
                reference: g.reference.clone(),
                media_type: g.manifest.config.media_type.clone(),
            });
        }
        if g.manifest.layers.len() != g.config.diff_ids.len() {
            return Err(PlanError::BadGroup {
                reference: g.reference.clone(),
                reason: format!(
                    "{} layers but {} diff_ids in its config",
                    g.manifest.layers.len(),
                    g.config.diff_ids.len()
                ),
            });
        }
        if let Some(prev) = groups[..i]
            .iter()
            .find(|p| p.manifest_digest == g.manifest_digest)
        {
            return Err(PlanError::Duplicate {
                first: prev.reference.clone(),
                second: g.reference.clone(),
                digest: g.manifest_digest.clone(),
            });
        }
        if i > 0 && g.config.platform != groups[0].config.platform {
            return Err(PlanError::PlatformMismatch {
                lower: groups[0].reference.clone(),
                lower_platform: groups[0].config.platform.to_string(),
                upper: g.reference.clone(),
                upper_platform: g.config.platform.to_string(),
            });
        }
    }
    Ok(())
}

fn override_opt<T: Clone>(slot: &mut Option<T>, upper: &Option<T>) {
    if upper.is_some() {
        slot.clone_from(upper);
    }
}

fn apply_overrides(frag: &mut ConfigFragment, o: &ConfigOverrides) {
    override_opt(&mut frag.workdir, &o.workdir);
    override_opt(&mut frag.entrypoint, &o.entrypoint);
    override_opt(&mut frag.cmd, &o.cmd);
    override_opt(&mut frag.user, &o.user);
    frag.labels.extend(o.labels.clone());
    for (k, v) in &o.env {
        let current = frag
            .env
            .iter()
            .find_map(|e| e.strip_prefix(&format!("{k}=")).map(str::to_string));
        let value = if k == "PATH" {
            let cur = current.unwrap_or_default();
            v.replace("${PATH}", &cur).replace("$PATH", &cur)
        } else {
            v.clone()
        };
        let entry = format!("{k}={value}");
        match frag
            .env
            .iter_mut()
            .find(|e| e.starts_with(&format!("{k}=")))
        {
            Some(slot) => *slot = entry,
            None => frag.env.push(entry),
        }
    }
}

/// Labels recording an at-init mutation in the composed config (informational; `weenv run`
/// reads the mutation from the plan).
fn mutation_labels(m: &Mutation) -> BTreeMap<String, String> {
    let mut l = BTreeMap::new();
    l.insert(format!("{LABEL_MUTATION_PREFIX}.mode"), "init".to_string());
    l.insert(format!("{LABEL_MUTATION_PREFIX}.root"), m.root.clone());
    if let Some(p) = &m.patch {
        l.insert(format!("{LABEL_MUTATION_PREFIX}.patch"), p.clone());
    }
    if let Some(b) = &m.blob {
        l.insert(format!("{LABEL_MUTATION_PREFIX}.patch"), b.to_string());
    }
    if let Some(c) = &m.checkout {
        l.insert(format!("{LABEL_MUTATION_PREFIX}.checkout"), c.clone());
    }
    l
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::group::{build_group, GroupKind};
    use weenv_registry::Platform;

    fn group(
        reference: &str,
        kind: GroupKind,
        layers: &[&[u8]],
        frag: ConfigFragment,
    ) -> ResolvedGroup {
        let descs: Vec<Descriptor> = layers
            .iter()
            .map(|b| {
                Descriptor::new(
                    weenv_format::MEDIA_TYPE_LAYER_ZSTD,
                    Digest::sha256(b),
                    b.len() as u64,
                )
            })
            .collect();
        let cfg = GroupConfig {
            version: 1,
            kind,
            name: reference
                .rsplit('/')
                .next()
                .unwrap_or(reference)
                .to_string(),
            platform: Platform {
                os: "linux".into(),
                architecture: "amd64".into(),
                ..Default::default()
            },
            config: frag,
            diff_ids: layers
                .iter()
                .map(|b| Digest::sha256(&[b, &b"-diff"[..]].concat()))
                .collect(),
        };
        let built = build_group(cfg, descs).unwrap();
        ResolvedGroup {
            reference: reference.into(),
            manifest_digest: built.manifest_digest,
            manifest: built.manifest,
            config: built.config,
        }
    }

    fn four() -> (Vec<ResolvedGroup>, Plan) {
        let base = group(
            "r/base:1",
            GroupKind::Base,
            &[b"b0", b"b1"],
            ConfigFragment {
                env: vec![
                    "PATH=/usr/local/bin:/usr/bin:/bin".into(),
                    "LANG=C.UTF-8".into(),
                ],
                cmd: Some(vec!["/bin/sh".into()]),
                workdir: Some("/".into()),
                ..Default::default()
            },
        );
        let task = group(
            "r/task:1",
            GroupKind::Task,
            &[b"t0"],
            ConfigFragment {
                workdir: Some("/src/repo".into()),
                labels: [("repo".to_string(), "x".to_string())].into(),
                ..Default::default()
            },
        );
        let harness = group(
            "r/harness:1",
            GroupKind::Harness,
            &[b"h0"],
            ConfigFragment {
                env: vec![
                    "PATH=/opt/harness/bin:/usr/bin".into(),
                    "LANG=en_US.UTF-8".into(),
                    "H=1".into(),
                ],
                entrypoint: Some(vec!["/opt/harness/bin/run".into()]),
                ..Default::default()
            },
        );
        let eval = group(
            "r/eval:1",
            GroupKind::Evaluator,
            &[b"e0"],
            ConfigFragment::default(),
        );
        let plan = Plan::parse(
            r#"
version = 1
groups = ["r/base:1", "r/task:1", "r/harness:1", "r/eval:1"]
"#,
        )
        .unwrap();
        (vec![base, task, harness, eval], plan)
    }

    #[test]
    fn compose_concatenates_and_merges() {
        let (g, plan) = four();
        let c = compose(&g, &plan).unwrap();
        let layer_digests: Vec<_> = c.manifest.layers.iter().map(|l| l.digest.clone()).collect();
        let want: Vec<_> = [&b"b0"[..], b"b1", b"t0", b"h0", b"e0"]
            .iter()
            .map(|b| Digest::sha256(b))
            .collect();
        assert_eq!(layer_digests, want);
        assert_eq!(c.config.rootfs.diff_ids.len(), 5);
        assert_eq!(
            c.config.rootfs.diff_ids[0],
            g[0].config.diff_ids[0].to_string()
        );
        let rc = &c.config.config;
        assert_eq!(
            rc.env,
            vec![
                "PATH=/opt/harness/bin:/usr/bin:/usr/local/bin:/bin".to_string(),
                "LANG=en_US.UTF-8".into(),
                "H=1".into()
            ]
        );
        assert_eq!(rc.working_dir.as_deref(), Some("/src/repo"));
        assert_eq!(
            rc.entrypoint,
            Some(vec!["/opt/harness/bin/run".to_string()])
        );
        assert_eq!(rc.cmd, Some(vec!["/bin/sh".to_string()]));
        assert_eq!(rc.labels.get("repo").map(String::as_str), Some("x"));
        assert_eq!(c.manifest.config.digest, Digest::sha256(&c.config_json));
        assert_eq!(c.manifest_digest, Digest::sha256(&c.manifest_json));
        assert!(!is_group(&c.manifest));
        let j = String::from_utf8(c.config_json.clone()).unwrap();
        assert!(j.contains("\"Env\""), "{j}");
        assert!(j.contains("\"WorkingDir\""), "{j}");
        assert!(j.contains("\"diff_ids\""), "{j}");
    }

    #[test]
    fn compose_bytes_are_pinned() {
        // Pins the composed manifest/config bytes: a change of the OCI model's field order or
        // skip rules must show up here.
        let (g, plan) = four();
        let c = compose(&g, &plan).unwrap();
        assert_eq!(
            c.manifest_digest.to_string(),
            "sha256:2832f777ad312bd91ea3bc830071b9fafbb3a8eca986c8391e7eb59086030001"
        );
        assert_eq!(
            c.config_digest.to_string(),
            "sha256:2b93549109badd189ac7d5381c55d4fe451856e80b18651bee484f5d32ad1081"
        );
    }

    #[test]
    fn compose_is_deterministic() {
        let (g, plan) = four();
        let a = compose(&g, &plan).unwrap();
        let b = compose(&g, &plan).unwrap();
        assert_eq!(a.manifest_json, b.manifest_json);
        assert_eq!(a.config_json, b.config_json);
        let (g2, plan2) = four();
        assert_eq!(
            compose(&g2, &plan2).unwrap().manifest_digest,
            a.manifest_digest
        );
    }

    #[test]
    fn overrides_apply_last() {
        let (g, _) = four();
        let plan = Plan::parse(
            r#"
version = 1
groups = ["r/base:1", "r/task:1", "r/harness:1", "r/eval:1"]
[config]
cmd = ["python3", "/eval/run.py"]
entrypoint = []
workdir = "/tmp"
[config.env]
PATH = "/x/bin:$PATH"
NEW = "v"
H = "2"
"#,
        )
        .unwrap();
        let c = compose(&g, &plan).unwrap();
        let rc = &c.config.config;
        assert_eq!(
            rc.cmd,
            Some(vec!["python3".to_string(), "/eval/run.py".into()])
        );
        assert_eq!(rc.entrypoint, Some(vec![]));
        assert_eq!(rc.working_dir.as_deref(), Some("/tmp"));
        assert_eq!(
            rc.env[0],
            "PATH=/x/bin:/opt/harness/bin:/usr/bin:/usr/local/bin:/bin"
        );
        assert!(rc.env.contains(&"NEW=v".to_string()));
        assert!(rc.env.contains(&"H=2".to_string()));
    }

    #[test]
    fn compose_errors() {
        let (mut g, plan) = four();
        let e = compose(&g[..3], &plan).unwrap_err();
        assert!(
            matches!(e, PlanError::GroupCount { got: 3, want: 4 }),
            "{e}"
        );

        let mut dup = g[1].clone();
        dup.reference = "r/task-alias:1".into();
        let mut g2 = g.clone();
        g2[3] = dup;
        let e = compose(&g2, &plan).unwrap_err();
        assert!(matches!(e, PlanError::Duplicate { .. }), "{e}");
        assert!(e.to_string().contains("r/task-alias:1"), "{e}");

        g[2].config.platform.architecture = "arm64".into();
        let e = compose(&g, &plan).unwrap_err();
        assert!(matches!(e, PlanError::PlatformMismatch { .. }), "{e}");
        assert!(e.to_string().contains("linux/arm64"), "{e}");

        let (mut g, plan) = four();
        g[0].manifest.config.media_type = MEDIA_TYPE_OCI_CONFIG.into();
        assert!(matches!(
            compose(&g, &plan).unwrap_err(),
            PlanError::NotAGroup { .. }
        ));
    }

    #[test]
    fn plan_validation_names_fields() {
        let cases: &[(&str, &str)] = &[
            ("version = 2\ngroups = [\"a\"]", "`version`"),
            ("version = 1\ngroups = []", "`groups`"),
            ("version = 1\ngroups = [\"a\", \"b\", \"a\"]", "`groups[2]`"),
            ("version = 1\ngroups = [\"a b\"]", "`groups[0]`"),
            (
                "version = 1\ngroups = [\"a\"]\n[mutation]\nmode = \"init\"",
                "`mutation`",
            ),
            (
                "version = 1\ngroups = [\"a\"]\n[mutation]\npatch = \"x\"\nroot = \"rel\"",
                "`mutation.root`",
            ),
            (
                "version = 1\ngroups = [\"a\"]\n[mutation]\nmode = \"pre-applied\"",
                "`mutation.group`",
            ),
            (
                "version = 1\ngroups = [\"a\"]\n[mutation]\nmode = \"pre-applied\"\ngroup = \"a\"",
                "`mutation.group`",
            ),
            (
                "version = 1\ngroups = [\"a\"]\n[mutation]\npatch = \"x\"\ngroup = \"b\"",
                "`mutation.group`",
            ),
            (
                "version = 1\ngroups = [\"a\"]\n[config]\nworkdir = \"rel\"",
                "`config.workdir`",
            ),
            ("version = 1\ngroups = [\"a\"]\nbogus = 1", "bogus"),
            ("version = 1\ngroups = [\"a\"]\n[config]\nfoo = 1", "foo"),
            (
                "version = 1\ngroups = [\"a\"]\n[mutation]\npatch = \"x\"\nmode = \"later\"",
                "later",
            ),
        ];
        for (text, needle) in cases {
            let e = Plan::parse(text).unwrap_err().to_string();
            assert!(e.contains(needle), "{text:?} -> {e}");
        }
    }

    #[test]
    fn pre_applied_group_goes_on_top_and_init_labels_recorded() {
        let p = Plan::parse(
            "version = 1\ngroups = [\"a\", \"b\"]\n[mutation]\nmode = \"pre-applied\"\ngroup = \"m\"",
        )
        .unwrap();
        assert_eq!(p.group_refs(), vec!["a", "b", "m"]);
        assert!(p.init_mutation().is_none());

        let (g, _) = four();
        let p = Plan::parse(
            r#"
version = 1
groups = ["r/base:1", "r/task:1", "r/harness:1", "r/eval:1"]
[mutation]
patch = "bug.diff"
root = "/src/repo"
checkout = "abc"
"#,
        )
        .unwrap();
        let m = p.init_mutation().unwrap();
        assert_eq!((m.strip, m.root.as_str()), (1, "/src/repo"));
        let c = compose(&g, &p).unwrap();
        let l = &c.config.config.labels;
        assert_eq!(
            l.get("io.weenv.mutation.patch").map(String::as_str),
            Some("bug.diff")
        );
        assert_eq!(
            l.get("io.weenv.mutation.checkout").map(String::as_str),
            Some("abc")
        );
    }

    fn path_strategy() -> impl proptest::strategy::Strategy<Value = Option<Vec<&'static str>>> {
        use proptest::prelude::*;
        proptest::option::of(proptest::collection::vec(
            prop::sample::select(vec!["/a", "/b", "/c", "/usr/bin", "/bin", "/opt/x"]),
            0..4,
        ))
    }

    proptest::proptest! {
        /// Layers/diff_ids concatenate in order; PATH keeps every entry once, top group's first;
        /// composing twice gives the same digests.
        #[test]
        fn compose_properties(spec in proptest::collection::vec((0usize..3, path_strategy()), 1..6)) {
            let groups: Vec<ResolvedGroup> = spec
                .iter()
                .enumerate()
                .map(|(i, (n, path))| {
                    let layers: Vec<Vec<u8>> = (0..*n).map(|j| format!("g{i}l{j}").into_bytes()).collect();
                    let refs: Vec<&[u8]> = layers.iter().map(|l| l.as_slice()).collect();
                    let env = path.as_ref().map(|p| vec![format!("PATH={}", p.join(":"))]).unwrap_or_default();
                    group(&format!("r/g{i}:1"), GroupKind::Other(format!("k{i}")), &refs, ConfigFragment { env, ..Default::default() })
                })
                .collect();
            let refs: Vec<String> = groups.iter().map(|g| format!("{:?}", g.reference)).collect();
            let plan = Plan::parse(&format!("version = 1\ngroups = [{}]\n", refs.join(", "))).unwrap();
            let c = compose(&groups, &plan).unwrap();
            let want: Vec<Digest> = groups.iter().flat_map(|g| g.manifest.layers.iter().map(|l| l.digest.clone())).collect();
            let got: Vec<Digest> = c.manifest.layers.iter().map(|l| l.digest.clone()).collect();
            proptest::prop_assert_eq!(got, want);
            let want_ids: Vec<String> = groups.iter().flat_map(|g| g.config.diff_ids.iter().map(Digest::to_string)).collect();
            proptest::prop_assert_eq!(&c.config.rootfs.diff_ids, &want_ids);
            let path = c.config.config.env.iter().find_map(|e| e.strip_prefix("PATH=")).map(str::to_string);
            let all: std::collections::BTreeSet<&str> = spec.iter().flat_map(|(_, p)| p.iter().flatten().copied()).collect();
            let entries: Vec<String> = path.as_deref().unwrap_or("").split(':').filter(|e| !e.is_empty()).map(str::to_string).collect();
            let uniq: std::collections::BTreeSet<&str> = entries.iter().map(String::as_str).collect();
            proptest::prop_assert_eq!(uniq.len(), entries.len());
            proptest::prop_assert_eq!(&uniq, &all);
            if let Some((_, Some(top))) = spec.iter().rev().find(|(_, p)| p.is_some()) {
                let mut seen = Vec::new();
                for e in top.iter() { if !seen.contains(e) { seen.push(*e); } }
                proptest::prop_assert_eq!(&entries[..seen.len()], &seen.iter().map(|s| s.to_string()).collect::<Vec<_>>()[..]);
            }
            proptest::prop_assert_eq!(compose(&groups, &plan).unwrap().manifest_digest, c.manifest_digest);
        }
    }

    #[test]
    fn merge_env_rules() {
        let lower = vec!["A=1".to_string(), "PATH=/b:/c".into()];
        let upper = vec!["PATH=/a:/b".to_string(), "A=2".into(), "B=x=y".into()];
        assert_eq!(
            merge_env(&lower, &upper),
            vec!["A=2", "PATH=/a:/b:/c", "B=x=y"]
        );
        assert_eq!(merge_env(&[], &upper), vec!["PATH=/a:/b", "A=2", "B=x=y"]);
    }
}
