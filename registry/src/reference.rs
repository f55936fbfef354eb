//! `Reference`: a parsed image reference, `[registry[:port]/]repository[:tag][@sha256:<hex>]`,
//! with Docker Hub defaults (`docker.io`, `library/`, API host `registry-1.docker.io`).
//!
//! The first path component is a registry when it contains `.` or `:` or is `localhost`
//! (Docker's rule); otherwise the reference is on Docker Hub.

use crate::error::RegistryError;
use std::fmt;
use std::str::FromStr;
use weenv_format::Digest;

/// Docker Hub's canonical registry name.
pub const DOCKER_HUB: &str = "docker.io";
/// Docker Hub's API host.
pub const DOCKER_HUB_API: &str = "registry-1.docker.io";
/// Tag used when a reference has neither tag nor digest.
pub const DEFAULT_TAG: &str = "latest";

/// A parsed image reference. A digest, when present, wins over the tag for fetching.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Reference {
    registry: String,
    repository: String,
    tag: Option<String>,
    digest: Option<Digest>,
}

fn bad(input: &str, reason: impl Into<String>) -> RegistryError {
    RegistryError::BadReference {
        input: input.to_string(),
        reason: reason.into(),
    }
}

fn valid_repo_component(c: &str) -> bool {
    // [a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*
    !c.is_empty()
        && c.bytes()
            .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b'-'))
        && c.as_bytes()[0].is_ascii_alphanumeric()
        && c.as_bytes()[c.len() - 1].is_ascii_alphanumeric()
        && !c.contains("..")
        && !c.contains("___")
}

fn valid_tag(t: &str) -> bool {
    // [\w][\w.-]{0,127}
    !t.is_empty()
        && t.len() <= 128
        && (t.as_bytes()[0].is_ascii_alphanumeric() || t.as_bytes()[0] == b'_')
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

fn valid_registry(r: &str) -> bool {
    let (host, port) = match r.rsplit_once(':') {
        Some((h, p)) if !h.contains(']') || h.ends_with(']') => (h, Some(p)),
        _ => (r, None),
    };
    let host_ok = if host.starts_with('[') && host.ends_with(']') {
        host.len() > 2
            && host[1..host.len() - 1]
                .bytes()
                .all(|b| b.is_ascii_hexdigit() || b == b':')
    } else {
        !host.is_empty()
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-'))
    };
    let port_ok =
        port.is_none_or(|p| !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()));
    host_ok && port_ok
}

impl Reference {
    /// Build a reference from parts (validated like a parsed one).
    pub fn new(
        registry: &str,
        repository: &str,
        tag: Option<&str>,
        digest: Option<Digest>,
    ) -> Result<Self, RegistryError> {
        let mut s = format!("{registry}/{repository}");
        if let Some(t) = tag {
            s.push(':');
            s.push_str(t);
        }
        if let Some(d) = &digest {
            s.push('@');
            s.push_str(d.as_str());
        }
        s.parse()
    }

    /// Registry name as written and normalised (`docker.io` for Docker Hub), with port.
    pub fn registry(&self) -> &str {
        &self.registry
    }

    /// Host (and port) to talk to: `registry-1.docker.io` for Docker Hub, else [`Self::registry`].
    pub fn api_host(&self) -> &str {
        if self.registry == DOCKER_HUB {
            DOCKER_HUB_API
        } else {
            &self.registry
        }
    }

    /// Repository path (`library/busybox`).
    pub fn repository(&self) -> &str {
        &self.repository
    }

    /// Tag, if any (`latest` is filled in only when there is no digest either).
    pub fn tag(&self) -> Option<&str> {
        self.tag.as_deref()
    }

    /// Digest, if any.
    pub fn digest(&self) -> Option<&Digest> {
        self.digest.as_ref()
    }

    /// What to put after `/manifests/`: the digest if present, else the tag.
    pub fn manifest_ref(&self) -> String {
        match (&self.digest, &self.tag) {
            (Some(d), _) => d.to_string(),
            (None, Some(t)) => t.clone(),
            (None, None) => DEFAULT_TAG.to_string(),
        }
    }

    /// Same repository, pinned to `digest` (the tag is kept for display).
    pub fn with_digest(&self, digest: Digest) -> Self {
        Reference {
            digest: Some(digest),
            ..self.clone()
        }
    }

    /// Same repository with `tag` and no digest.
    pub fn with_tag(&self, tag: &str) -> Result<Self, RegistryError> {
        if !valid_tag(tag) {
            return Err(bad(tag, "invalid tag"));
        }
        Ok(Reference {
            tag: Some(tag.to_string()),
            digest: None,
            ..self.clone()
        })
    }

    /// Another repository on the same registry (for cross-repository mounts), no tag/digest.
    pub fn with_repository(&self, repository: &str) -> Result<Self, RegistryError> {
        Reference::new(&self.registry, repository, Some(DEFAULT_TAG), None)
    }
}

impl FromStr for Reference {
    type Err = RegistryError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        if input.is_empty() || input.len() > 4096 {
            return Err(bad(input, "empty or too long"));
        }
        let (rest, digest) = match input.split_once('@') {
            Some((r, d)) => {
                let d: Digest = d
                    .parse()
                    .map_err(|_| bad(input, format!("invalid digest {d:?}")))?;
                (r, Some(d))
            }
            None => (input, None),
        };
        // A tag is after the last ':' that follows the last '/'.
        let last_slash = rest.rfind('/');
        let (name, tag) = match rest.rfind(':') {
            Some(c) if last_slash.is_none_or(|s| c > s) => (&rest[..c], Some(&rest[c + 1..])),
            _ => (rest, None),
        };
        if let Some(t) = tag {
            if !valid_tag(t) {
                return Err(bad(input, format!("invalid tag {t:?}")));
            }
        }
        let (registry, repo) = match name.split_once('/') {
            Some((first, remainder))
                if first.contains('.') || first.contains(':') || first == "localhost" =>
            {
                (first.to_string(), remainder.to_string())
            }
            _ => (DOCKER_HUB.to_string(), name.to_string()),
        };
        if !valid_registry(&registry) {
            return Err(bad(input, format!("invalid registry {registry:?}")));
        }
        let registry = match registry.as_str() {
            "index.docker.io" | "registry-1.docker.io" => DOCKER_HUB.to_string(),
            _ => registry,
        };
        let repository = if registry == DOCKER_HUB && !repo.contains('/') {
            format!("library/{repo}")
        } else {
            repo
        };
        if repository.len() > 255 || !repository.split('/').all(valid_repo_component) {
            return Err(bad(
                input,
                format!("invalid repository {repository:?} (lowercase a-z0-9 and ._- separators)"),
            ));
        }
        let tag = match (tag, &digest) {
            (Some(t), _) => Some(t.to_string()),
            (None, None) => Some(DEFAULT_TAG.to_string()),
            (None, Some(_)) => None,
        };
        Ok(Reference {
            registry,
            repository,
            tag,
            digest,
        })
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Reference({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Reference {
        s.parse().unwrap()
    }

    #[test]
    fn registry_repo_tag() {
        let r = p("reg.example.com/team/app:1.2");
        assert_eq!(
            (r.registry(), r.repository(), r.tag()),
            ("reg.example.com", "team/app", Some("1.2"))
        );
        assert_eq!(r.api_host(), "reg.example.com");
        assert_eq!(r.to_string(), "reg.example.com/team/app:1.2");
        assert_eq!(r.manifest_ref(), "1.2");
    }

    #[test]
    fn port_and_nested_repo() {
        let r = p("127.0.0.1:5001/a/b/c:tag");
        assert_eq!(
            (r.registry(), r.repository(), r.tag()),
            ("127.0.0.1:5001", "a/b/c", Some("tag"))
        );
        let r = p("localhost:8080/a/b");
        assert_eq!(
            (r.registry(), r.repository(), r.tag()),
            ("localhost:8080", "a/b", Some("latest"))
        );
        let r = p("localhost/x");
        assert_eq!(r.registry(), "localhost");
        assert_eq!(p("[::1]:5000/x:1").registry(), "[::1]:5000");
    }

    #[test]
    fn digest_refs() {
        let d = Digest::sha256(b"x");
        let r = p(&format!("reg:5000/repo@{d}"));
        assert_eq!(r.digest(), Some(&d));
        assert_eq!(r.tag(), None);
        assert_eq!(r.manifest_ref(), d.to_string());
        assert_eq!(r.to_string(), format!("reg:5000/repo@{d}"));
        let r = p(&format!("reg:5000/repo:v1@{d}"));
        assert_eq!((r.tag(), r.digest()), (Some("v1"), Some(&d)));
        assert_eq!(r.manifest_ref(), d.to_string());
        assert_eq!(p(&r.to_string()), r);
    }

    #[test]
    fn docker_hub_defaults() {
        let r = p("busybox");
        assert_eq!(
            (r.registry(), r.repository(), r.tag()),
            ("docker.io", "library/busybox", Some("latest"))
        );
        assert_eq!(r.api_host(), "registry-1.docker.io");
        assert_eq!(p("user/app:2").repository(), "user/app");
        assert_eq!(
            p("index.docker.io/busybox").to_string(),
            "docker.io/library/busybox:latest"
        );
        assert_eq!(p("docker.io/library/busybox:1"), p("busybox:1"));
    }

    #[test]
    fn rejects_bad_input() {
        for s in [
            "",
            "UPPER/case",
            "reg:5000/repo:bad tag",
            "repo@sha256:abc",
            "reg:port/repo",
            "repo:",
            "/repo",
            "repo/",
            "a//b",
            "reg.io/-x",
            "repo:-tag",
        ] {
            assert!(
                matches!(
                    s.parse::<Reference>(),
                    Err(RegistryError::BadReference { .. })
                ),
                "{s:?} should be rejected"
            );
        }
    }

    #[test]
    fn with_helpers() {
        let r = p("reg:1/a:t");
        let d = Digest::sha256(b"m");
        assert_eq!(r.with_digest(d.clone()).manifest_ref(), d.to_string());
        assert_eq!(r.with_tag("u").unwrap().to_string(), "reg:1/a:u");
        assert_eq!(r.with_repository("b/c").unwrap().repository(), "b/c");
        assert!(r.with_tag("bad tag").is_err());
    }
}
