//! The workspace's one OCI image model: descriptors, manifests and indexes (OCI and Docker
//! v2 schema 2), the platform type, the image-config head, media types, platform selection
//! and chain ids. Every crate (env, converter, snapshotter, cli) uses these types.
//!
//! Parsing is lenient about unknown fields (registries add their own) and strict about what
//! we use: digests must be `sha256:<hex>`, sizes integers. Serialisation keeps field order and
//! skips absent optionals, so manifests written by the converter are deterministic.
//!
//! Why local types and not `oci-spec`'s (0.10) image types: its `Descriptor`/`ImageManifest`
//! keep annotations in a `HashMap`, so serialising them gives a different key order per run
//! (and a different digest for the same manifest), while the converter, groups and plans must
//! emit identical bytes for identical input; its `Platform` (de)serialises `os.version` and
//! `os.features` as `os_version`/`os_features` (not the spec's names) and reads `armbe` as
//! `arm64be`, which would change index bytes we pass through. Until those gaps close, this
//! module is the single home of the model.

use crate::error::RegistryError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use thiserror::Error;
use weenv_format::Digest;

pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const DOCKER_MANIFEST_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";

/// `Accept` header for manifest requests (all four manifest/index types).
pub const MANIFEST_ACCEPT: &str = "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.list.v2+json, application/vnd.docker.distribution.manifest.v2+json";

/// Largest manifest we accept (containerd uses the same 4 MiB bound).
pub const MAX_MANIFEST_SIZE: u64 = 4 << 20;

/// A content descriptor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    pub media_type: String,
    pub digest: Digest,
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub urls: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<Platform>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
}

impl Descriptor {
    /// A descriptor without optional fields.
    pub fn new(media_type: &str, digest: Digest, size: u64) -> Self {
        Descriptor {
            media_type: media_type.to_string(),
            digest,
            size,
            urls: None,
            annotations: BTreeMap::new(),
            platform: None,
            artifact_type: None,
        }
    }
}

/// A platform of an index entry.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Platform {
    pub architecture: String,
    pub os: String,
    #[serde(
        rename = "os.version",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub os_version: Option<String>,
    #[serde(
        rename = "os.features",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub os_features: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub features: Option<Vec<String>>,
}

impl fmt::Display for Platform {
    /// `os/arch[/variant]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

/// A platform written as `os/arch[/variant]` that does not parse.
#[derive(Debug, Error)]
#[error("{0:?} is not os/arch[/variant], e.g. linux/amd64")]
pub struct PlatformParseError(pub String);

impl FromStr for Platform {
    type Err = PlatformParseError;
    /// `os/arch[/variant]`, each part non-empty (the one parser of `--platform` values).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let parts: Vec<&str> = s.split('/').collect();
        if parts.iter().any(|p| p.is_empty()) {
            return Err(PlatformParseError(s.to_string()));
        }
        match parts.as_slice() {
            [os, arch] | [os, arch, _] => Ok(Platform {
                os: os.to_string(),
                architecture: arch.to_string(),
                variant: parts.get(2).map(|v| v.to_string()),
                ..Default::default()
            }),
            _ => Err(PlatformParseError(s.to_string())),
        }
    }
}

/// An image manifest (OCI or Docker v2 schema 2).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageManifest {
    pub schema_version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<Descriptor>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// An image index / manifest list.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageIndex {
    pub schema_version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
    pub manifests: Vec<Descriptor>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<Descriptor>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// A parsed manifest document (parsed once per fetch; the size difference does not matter).
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Manifest {
    Image(ImageManifest),
    Index(ImageIndex),
}

/// True for the image-manifest media types (OCI and Docker).
pub fn is_image_manifest(media_type: &str) -> bool {
    media_type == OCI_MANIFEST || media_type == DOCKER_MANIFEST
}

/// True for the index media types (OCI and Docker manifest list).
pub fn is_index(media_type: &str) -> bool {
    media_type == OCI_INDEX || media_type == DOCKER_MANIFEST_LIST
}

impl Manifest {
    /// Parse `bytes` served with `media_type` (from Content-Type; may be empty or generic, then
    /// the document's `mediaType` field or its shape decides).
    pub fn parse(media_type: &str, bytes: &[u8]) -> Result<Manifest, RegistryError> {
        let bad = |detail: String| RegistryError::BadManifest {
            reference: format!("<{media_type}>"),
            detail,
        };
        let media_type = media_type.split(';').next().unwrap_or("").trim();
        let v: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| bad(format!("not JSON: {e}")))?;
        let field_mt = v.get("mediaType").and_then(|m| m.as_str()).unwrap_or("");
        let mt = if is_image_manifest(media_type) || is_index(media_type) {
            media_type
        } else {
            field_mt
        };
        if v.get("schemaVersion").and_then(|s| s.as_u64()) != Some(2) {
            return Err(bad(
                "schemaVersion is not 2 (schema 1 manifests are not supported)".into(),
            ));
        }
        let index = if is_index(mt) {
            true
        } else if is_image_manifest(mt) {
            false
        } else if v.get("manifests").is_some() {
            true
        } else if v.get("layers").is_some() {
            false
        } else {
            return Err(bad(format!("unknown manifest media type {mt:?}")));
        };
        if index {
            serde_json::from_value(v)
                .map(Manifest::Index)
                .map_err(|e| bad(format!("bad index: {e}")))
        } else {
            serde_json::from_value(v)
                .map(Manifest::Image)
                .map_err(|e| bad(format!("bad image manifest: {e}")))
        }
    }
}

/// An image config: what `weenv pull` and the daemon read (platform, `rootfs.diff_ids`) and
/// what a composed plan image writes (no `created` field, for determinism). Field order is the
/// written order. Reading is lenient about what the readers do not use: a `config` or
/// `history` that does not fit these types (e.g. Docker's `"Labels": null`) reads as empty.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architecture: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub os: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    #[serde(default, deserialize_with = "or_default")]
    pub config: RuntimeConfig,
    pub rootfs: RootFs,
    #[serde(default, deserialize_with = "or_default")]
    pub history: Vec<History>,
}

impl ImageConfig {
    /// The platform the config declares (`None` if it names no os or architecture).
    pub fn platform(&self) -> Option<Platform> {
        Some(Platform {
            os: self.os.clone()?,
            architecture: self.architecture.clone()?,
            variant: self.variant.clone(),
            ..Default::default()
        })
    }
}

/// `value` as a `T`, or `T::default()` when it is not one (see [`ImageConfig`]).
fn or_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::de::DeserializeOwned + Default,
{
    let v = serde_json::Value::deserialize(d)?;
    Ok(serde_json::from_value(v).unwrap_or_default())
}

/// Image config `config` section (the subset weenv writes).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct RuntimeConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entrypoint: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmd: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// `rootfs` of an image config.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RootFs {
    #[serde(rename = "type", default)]
    pub kind: String,
    pub diff_ids: Vec<String>,
}

/// Image config `history` entry.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
    #[serde(default)]
    pub created_by: String,
}

/// Chain ids of a layer stack from its diff ids (OCI image spec: `chain(n) =
/// sha256(chain(n-1) + " " + diff_id(n))`).
pub fn chain_ids(diff_ids: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(diff_ids.len());
    for d in diff_ids {
        let next = chain_id(out.last().map(String::as_str), d);
        out.push(next);
    }
    out
}

/// Chain id of a layer with diff id `diff_id` on top of chain `parent` (`None`: a base layer).
pub fn chain_id(parent: Option<&str>, diff_id: &str) -> String {
    match parent {
        None => diff_id.to_string(),
        Some(prev) => Digest::sha256(format!("{prev} {diff_id}").as_bytes()).to_string(),
    }
}

/// Normalise an architecture name the way Go/OCI spell it (`x86_64` -> `amd64`, ...).
pub fn normalize_arch(arch: &str) -> &str {
    match arch {
        "x86_64" | "x86-64" => "amd64",
        "aarch64" => "arm64",
        "i386" | "i686" => "386",
        "armhf" | "armel" => "arm",
        other => other,
    }
}

/// The platform this binary runs on (`linux`, normalised GOARCH spelling, no variant).
pub fn host_platform() -> Platform {
    Platform {
        os: std::env::consts::OS.to_string(),
        architecture: normalize_arch(std::env::consts::ARCH).to_string(),
        ..Default::default()
    }
}

/// Pick the index entry for (os, arch, variant): the first whose platform
/// [`platform_matches`]. Entries without a platform (e.g. attestations) never match.
pub fn select_platform<'a>(
    index: &'a ImageIndex,
    os: &str,
    arch: &str,
    variant: Option<&str>,
) -> Option<&'a Descriptor> {
    index.manifests.iter().find(|d| {
        d.platform
            .as_ref()
            .is_some_and(|p| platform_matches(p, os, arch, variant))
    })
}

/// True when `p` (an index entry's platform, or an image config's os/architecture/variant)
/// is (os, arch, variant). Architectures are normalised; without a requested variant any
/// variant matches; `arm64` treats a missing variant as `v8`. Pure.
pub fn platform_matches(p: &Platform, os: &str, arch: &str, variant: Option<&str>) -> bool {
    let arch = normalize_arch(arch);
    if p.os != os || normalize_arch(&p.architecture) != arch {
        return false;
    }
    let norm_variant = |v: Option<&str>| -> Option<String> {
        match (arch, v) {
            ("arm64", None) => Some("v8".to_string()),
            (_, v) => v.map(str::to_string),
        }
    };
    match variant {
        None => true,
        Some(v) => norm_variant(p.variant.as_deref()) == norm_variant(Some(v)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A registry image config reads whatever its `config`/`history` hold (Docker writes
    /// `"Labels": null`); only platform and diff ids matter to the readers.
    #[test]
    fn an_image_config_reads_leniently() {
        let j = br#"{"architecture":"amd64","os":"linux","config":{"Env":null,"Labels":null,"Cmd":["sh"]},
            "rootfs":{"type":"layers","diff_ids":["sha256:aa"]},"history":[{"created":"x","empty_layer":true}]}"#;
        let c: ImageConfig = serde_json::from_slice(j).unwrap();
        assert_eq!(c.rootfs.diff_ids, vec!["sha256:aa".to_string()]);
        assert_eq!(
            c.platform().map(|p| p.to_string()).as_deref(),
            Some("linux/amd64")
        );
        assert_eq!(c.config, RuntimeConfig::default());
        let c: ImageConfig = serde_json::from_slice(br#"{"rootfs":{"diff_ids":[]}}"#).unwrap();
        assert_eq!(c.platform(), None);
    }

    fn d(n: u8) -> String {
        Digest::sha256(&[n]).to_string()
    }

    fn index_json() -> String {
        format!(
            r#"{{"schemaVersion":2,"mediaType":"{DOCKER_MANIFEST_LIST}","manifests":[
            {{"mediaType":"{DOCKER_MANIFEST}","digest":"{}","size":10,"platform":{{"architecture":"amd64","os":"linux"}}}},
            {{"mediaType":"{DOCKER_MANIFEST}","digest":"{}","size":11,"platform":{{"architecture":"arm","os":"linux","variant":"v7"}}}},
            {{"mediaType":"{DOCKER_MANIFEST}","digest":"{}","size":12,"platform":{{"architecture":"arm64","os":"linux","variant":"v8"}}}},
            {{"mediaType":"{OCI_MANIFEST}","digest":"{}","size":13,"platform":{{"architecture":"unknown","os":"unknown"}},
              "annotations":{{"vnd.docker.reference.type":"attestation-manifest"}}}}]}}"#,
            d(1),
            d(2),
            d(3),
            d(4)
        )
    }

    #[test]
    fn parses_index_and_selects_platform() {
        let Manifest::Index(ix) = Manifest::parse("", index_json().as_bytes()).unwrap() else {
            panic!("expected index")
        };
        assert_eq!(ix.manifests.len(), 4);
        assert_eq!(
            ix.manifests[3].annotations["vnd.docker.reference.type"],
            "attestation-manifest"
        );
        assert_eq!(
            select_platform(&ix, "linux", "x86_64", None).unwrap().size,
            10
        );
        assert_eq!(
            select_platform(&ix, "linux", "arm", Some("v7"))
                .unwrap()
                .size,
            11
        );
        assert!(select_platform(&ix, "linux", "arm", Some("v6")).is_none());
        assert_eq!(
            select_platform(&ix, "linux", "aarch64", None).unwrap().size,
            12
        );
        assert_eq!(
            select_platform(&ix, "linux", "arm64", Some("v8"))
                .unwrap()
                .size,
            12
        );
        assert!(select_platform(&ix, "windows", "amd64", None).is_none());
    }

    #[test]
    fn parses_docker_and_oci_manifests() {
        let m = format!(
            r#"{{"schemaVersion":2,"mediaType":"{DOCKER_MANIFEST}",
            "config":{{"mediaType":"{DOCKER_CONFIG}","digest":"{}","size":5}},
            "layers":[{{"mediaType":"application/vnd.docker.image.rootfs.diff.tar.gzip","digest":"{}","size":7,"extra":1}}]}}"#,
            d(1),
            d(2)
        );
        let Manifest::Image(im) = Manifest::parse(DOCKER_MANIFEST, m.as_bytes()).unwrap() else {
            panic!()
        };
        assert_eq!(im.layers[0].size, 7);
        // OCI manifest without mediaType field, served as application/json: shape decides
        let mut oci = ImageManifest {
            schema_version: 2,
            media_type: None,
            artifact_type: None,
            config: Descriptor::new(OCI_CONFIG, Digest::sha256(b"c"), 1),
            layers: vec![Descriptor::new(
                weenv_format::MEDIA_TYPE_LAYER_ZSTD,
                Digest::sha256(b"l"),
                2,
            )],
            subject: None,
            annotations: BTreeMap::new(),
        };
        oci.layers[0]
            .annotations
            .insert(weenv_format::ANNOTATION_TOC_DIGEST.into(), d(9));
        let bytes = serde_json::to_vec(&oci).unwrap();
        let s = String::from_utf8(bytes.clone()).unwrap();
        assert!(s.starts_with(r#"{"schemaVersion":2,"config":"#), "{s}");
        assert!(
            !s.contains("urls") && !s.contains("platform"),
            "absent optionals skipped: {s}"
        );
        assert_eq!(
            Manifest::parse("application/json", &bytes).unwrap(),
            Manifest::Image(oci)
        );
    }

    #[test]
    fn rejects_bad_manifests() {
        for (mt, body) in [
            ("", "not json"),
            ("", r#"{"schemaVersion":1,"fsLayers":[]}"#),
            ("", r#"{"schemaVersion":2}"#),
            (
                OCI_MANIFEST,
                r#"{"schemaVersion":2,"config":{},"layers":[]}"#,
            ),
            (
                OCI_INDEX,
                r#"{"schemaVersion":2,"manifests":[{"mediaType":"x","digest":"md5:1","size":1}]}"#,
            ),
        ] {
            assert!(
                matches!(
                    Manifest::parse(mt, body.as_bytes()),
                    Err(RegistryError::BadManifest { .. })
                ),
                "{body}"
            );
        }
    }

    #[test]
    fn chain_ids_follow_the_spec() {
        let a = Digest::sha256(b"a").to_string();
        let b = Digest::sha256(b"b").to_string();
        let ch = chain_ids(&[a.clone(), b.clone()]);
        assert_eq!(ch[0], a);
        assert_eq!(
            ch[1],
            Digest::sha256(format!("{a} {b}").as_bytes()).to_string()
        );
        assert!(chain_ids(&[]).is_empty());
    }

    #[test]
    fn platforms_parse_and_print_as_os_arch_variant() {
        let p: Platform = "linux/arm64/v8".parse().unwrap();
        assert_eq!(p.variant.as_deref(), Some("v8"));
        assert_eq!(p.to_string(), "linux/arm64/v8");
        let p: Platform = "linux/amd64".parse().unwrap();
        assert_eq!((p.os.as_str(), p.architecture.as_str()), ("linux", "amd64"));
        assert_eq!(p.to_string(), "linux/amd64");
        assert!("linux".parse::<Platform>().is_err());
        assert!("linux//".parse::<Platform>().is_err());
        assert!("linux/amd64/v1/x".parse::<Platform>().is_err());
        let h = host_platform();
        assert_eq!(h.os, "linux");
        assert_eq!(h.architecture, normalize_arch(&h.architecture));
    }
}
