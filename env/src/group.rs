//! Layer groups: the OCI artifact that publishes one independently evolving component
//! (an OS base, a repository, a harness, an evaluator) as a list of weenv layers plus the
//! image-config fragment it contributes.
//!
//! A group is an ordinary OCI image manifest (`application/vnd.oci.image.manifest.v1+json`)
//! with `artifactType` and `config.mediaType` set to [`MEDIA_TYPE_GROUP_CONFIG`]. Its config
//! blob is a [`GroupConfig`] (JSON); its layers are weenv layer descriptors (with the TOC
//! annotations). Any OCI registry stores it; no runtime runs it directly: a plan composes
//! groups into a runnable image (see [`crate::plan`]).
//!
//! Also here: minimal serde types for OCI manifests and descriptors ([`Manifest`],
//! [`Descriptor`]) so the format crate stays free of registry/oci-spec dependencies, and
//! [`canonical_json`] which every emitted blob goes through (stable bytes, stable digests).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use thiserror::Error;
use weenv_format::Digest;
use weenv_registry::manifest::{Descriptor, ImageManifest};
use weenv_registry::Platform;

/// Media type (and `artifactType`) of a layer group's config blob.
pub const MEDIA_TYPE_GROUP_CONFIG: &str = "application/vnd.weenv.group.config.v1+json";
/// OCI image manifest media type.
pub const MEDIA_TYPE_OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// OCI image config media type.
pub const MEDIA_TYPE_OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
/// Manifest annotation: group kind.
pub const ANNOTATION_GROUP_KIND: &str = "io.weenv.group.kind";
/// Manifest annotation: group name.
pub const ANNOTATION_GROUP_NAME: &str = "io.weenv.group.name";
/// Current [`GroupConfig::version`].
pub const GROUP_CONFIG_VERSION: u32 = 1;

/// Errors from parsing or validating a layer group.
#[derive(Debug, Error)]
pub enum GroupError {
    #[error("group {what} is not valid JSON: {source}")]
    Json {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("group field `{field}` is invalid: {reason}")]
    Invalid { field: String, reason: String },
}

/// Kind of a layer group. Free-form kinds are allowed (`Other`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GroupKind {
    Base,
    Task,
    Harness,
    Evaluator,
    Other(String),
}

impl GroupKind {
    /// The kind as written in JSON and on the command line.
    pub fn as_str(&self) -> &str {
        match self {
            GroupKind::Base => "base",
            GroupKind::Task => "task",
            GroupKind::Harness => "harness",
            GroupKind::Evaluator => "evaluator",
            GroupKind::Other(s) => s,
        }
    }
}

impl From<&str> for GroupKind {
    fn from(s: &str) -> Self {
        match s {
            "base" => GroupKind::Base,
            "task" => GroupKind::Task,
            "harness" => GroupKind::Harness,
            "evaluator" => GroupKind::Evaluator,
            other => GroupKind::Other(other.to_string()),
        }
    }
}

impl fmt::Display for GroupKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for GroupKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for GroupKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(GroupKind::from(s.as_str()))
    }
}

/// The image-config fragment a group contributes. Every field is optional; unset fields
/// are inherited from lower groups when composing.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConfigFragment {
    /// `KEY=VALUE` entries. `PATH` is merged across groups (see [`crate::plan::merge_env`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entrypoint: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmd: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// The config blob of a layer group (media type [`MEDIA_TYPE_GROUP_CONFIG`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GroupConfig {
    /// Schema version, [`GROUP_CONFIG_VERSION`].
    pub version: u32,
    pub kind: GroupKind,
    /// Human name (`python-base`, `harness`), not necessarily the reference.
    pub name: String,
    /// Written `{"os", "architecture", "variant"?}` (see [`platform_fields`]).
    #[serde(with = "platform_fields")]
    pub platform: Platform,
    #[serde(default)]
    pub config: ConfigFragment,
    /// Uncompressed digests of the group's layers, in manifest order.
    pub diff_ids: Vec<Digest>,
}

impl GroupConfig {
    /// Parse and validate a group config blob.
    pub fn from_json(bytes: &[u8]) -> Result<Self, GroupError> {
        let c: GroupConfig = serde_json::from_slice(bytes).map_err(|source| GroupError::Json {
            what: "config",
            source,
        })?;
        c.validate()?;
        Ok(c)
    }

    /// Canonical JSON bytes of this config.
    pub fn to_json(&self) -> Vec<u8> {
        canonical_json(self)
    }

    /// Field-level validation.
    pub fn validate(&self) -> Result<(), GroupError> {
        let invalid = |field: &str, reason: String| GroupError::Invalid {
            field: field.to_string(),
            reason,
        };
        if self.version != GROUP_CONFIG_VERSION {
            return Err(invalid(
                "version",
                format!(
                    "unsupported version {}, expected {GROUP_CONFIG_VERSION}",
                    self.version
                ),
            ));
        }
        if self.name.is_empty() {
            return Err(invalid("name", "must not be empty".into()));
        }
        if self.kind.as_str().is_empty() {
            return Err(invalid("kind", "must not be empty".into()));
        }
        for (i, e) in self.config.env.iter().enumerate() {
            match e.split_once('=') {
                Some((k, _)) if !k.is_empty() => {}
                _ => {
                    return Err(invalid(
                        &format!("config.env[{i}]"),
                        format!("{e:?} is not KEY=VALUE"),
                    ))
                }
            }
        }
        Ok(())
    }
}

/// A group config's platform in the field order group configs were first published with
/// (`os`, `architecture`, `variant`, then the rarer OCI fields), so the bytes, and the digests
/// of existing groups, stay what they were; the type is the workspace's one [`Platform`].
mod platform_fields {
    use super::Platform;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize)]
    struct Ordered<'a> {
        os: &'a str,
        architecture: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        variant: Option<&'a str>,
        #[serde(rename = "os.version", skip_serializing_if = "Option::is_none")]
        os_version: Option<&'a str>,
        #[serde(rename = "os.features", skip_serializing_if = "Option::is_none")]
        os_features: Option<&'a [String]>,
        #[serde(skip_serializing_if = "Option::is_none")]
        features: Option<&'a [String]>,
    }

    pub fn serialize<S: Serializer>(p: &Platform, s: S) -> Result<S::Ok, S::Error> {
        Ordered {
            os: &p.os,
            architecture: &p.architecture,
            variant: p.variant.as_deref(),
            os_version: p.os_version.as_deref(),
            os_features: p.os_features.as_deref(),
            features: p.features.as_deref(),
        }
        .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Platform, D::Error> {
        Platform::deserialize(d)
    }
}

/// Parse an image manifest's JSON (a group's or a composed image's).
pub fn parse_manifest(bytes: &[u8]) -> Result<ImageManifest, GroupError> {
    serde_json::from_slice(bytes).map_err(|source| GroupError::Json {
        what: "manifest",
        source,
    })
}

/// Whether `m` is a weenv layer group's manifest.
pub fn is_group(m: &ImageManifest) -> bool {
    m.config.media_type == MEDIA_TYPE_GROUP_CONFIG
}

/// Serialize `v` as compact JSON. Field order is the struct order and maps are `BTreeMap`s,
/// so equal values give equal bytes (and digests).
pub fn canonical_json<T: Serialize>(v: &T) -> Vec<u8> {
    // Serializing plain structs/maps with string keys into a Vec cannot fail.
    serde_json::to_vec(v).unwrap_or_default()
}

/// A group ready to be pushed: manifest + config bytes and their digests.
#[derive(Clone, Debug)]
pub struct BuiltGroup {
    pub config: GroupConfig,
    pub config_json: Vec<u8>,
    pub manifest: ImageManifest,
    pub manifest_json: Vec<u8>,
    pub manifest_digest: Digest,
}

/// Build a group manifest from its layer descriptors and config (pure).
/// `layers.len()` must equal `config.diff_ids.len()`.
pub fn build_group(config: GroupConfig, layers: Vec<Descriptor>) -> Result<BuiltGroup, GroupError> {
    config.validate()?;
    if layers.len() != config.diff_ids.len() {
        return Err(GroupError::Invalid {
            field: "diffIds".into(),
            reason: format!(
                "{} diff_ids for {} layers",
                config.diff_ids.len(),
                layers.len()
            ),
        });
    }
    let config_json = config.to_json();
    let mut annotations = BTreeMap::new();
    annotations.insert(ANNOTATION_GROUP_KIND.to_string(), config.kind.to_string());
    annotations.insert(ANNOTATION_GROUP_NAME.to_string(), config.name.clone());
    let manifest = ImageManifest {
        schema_version: 2,
        media_type: Some(MEDIA_TYPE_OCI_MANIFEST.into()),
        artifact_type: Some(MEDIA_TYPE_GROUP_CONFIG.into()),
        config: Descriptor::new(
            MEDIA_TYPE_GROUP_CONFIG,
            Digest::sha256(&config_json),
            config_json.len() as u64,
        ),
        layers,
        subject: None,
        annotations,
    };
    let manifest_json = canonical_json(&manifest);
    let manifest_digest = Digest::sha256(&manifest_json);
    Ok(BuiltGroup {
        config,
        config_json,
        manifest,
        manifest_json,
        manifest_digest,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    pub(crate) fn sample_config() -> GroupConfig {
        GroupConfig {
            version: 1,
            kind: GroupKind::Harness,
            name: "harness".into(),
            platform: "linux/amd64".parse().unwrap(),
            config: ConfigFragment {
                env: vec!["PATH=/opt/harness/bin".into(), "HARNESS=1".into()],
                workdir: Some("/work".into()),
                ..Default::default()
            },
            diff_ids: vec![Digest::sha256(b"layer")],
        }
    }

    #[test]
    fn config_roundtrip_and_kinds() {
        let c = sample_config();
        let j = c.to_json();
        assert_eq!(GroupConfig::from_json(&j).unwrap(), c);
        let s = String::from_utf8(j).unwrap();
        assert!(s.contains("\"kind\":\"harness\""), "{s}");
        assert!(s.contains("\"diffIds\""), "{s}");
        // Platform bytes as first published (os before architecture), so digests hold.
        assert!(
            s.contains(r#""platform":{"os":"linux","architecture":"amd64"}"#),
            "{s}"
        );
        let mut o = c.clone();
        o.kind = GroupKind::from("linter");
        let back = GroupConfig::from_json(&o.to_json()).unwrap();
        assert_eq!(back.kind, GroupKind::Other("linter".into()));
    }

    #[test]
    fn validation_names_field() {
        let mut c = sample_config();
        c.config.env.push("NOEQUALS".into());
        let e = GroupConfig::from_json(&c.to_json())
            .unwrap_err()
            .to_string();
        assert!(e.contains("config.env[2]"), "{e}");
        let mut c = sample_config();
        c.version = 9;
        assert!(c.validate().unwrap_err().to_string().contains("`version`"));
        let j = br#"{"version":1,"kind":"base","name":"b","platform":{"os":"linux","architecture":"amd64"},"diffIds":[],"bogus":1}"#;
        assert!(GroupConfig::from_json(j).is_err());
    }

    #[test]
    fn build_group_is_deterministic() {
        let layer = Descriptor {
            annotations: [(
                weenv_format::ANNOTATION_TOC_DIGEST.to_string(),
                "x".to_string(),
            )]
            .into(),
            ..Descriptor::new(
                weenv_format::MEDIA_TYPE_LAYER_ZSTD,
                Digest::sha256(b"blob"),
                4,
            )
        };
        let a = build_group(sample_config(), vec![layer.clone()]).unwrap();
        let b = build_group(sample_config(), vec![layer.clone()]).unwrap();
        assert_eq!(a.manifest_digest, b.manifest_digest);
        assert!(is_group(&a.manifest));
        let parsed = parse_manifest(&a.manifest_json).unwrap();
        assert_eq!(parsed, a.manifest);
        assert_eq!(
            parsed.artifact_type.as_deref(),
            Some(MEDIA_TYPE_GROUP_CONFIG)
        );
        assert!(build_group(sample_config(), vec![]).is_err());
        // Pins the group manifest/config bytes (field order, skip rules, BTreeMap annotations).
        assert_eq!(
            a.manifest_digest.to_string(),
            "sha256:6b5d2b625b3681d600bbdd31b091ffdf77808310e7bfb16f8e94b42dc61a427f"
        );
        assert_eq!(
            Digest::sha256(&a.config_json).to_string(),
            "sha256:7e6573247faa99095eb0374e4928a7d3ada1a4a51bff26561b290d75c2223138"
        );
    }
}
