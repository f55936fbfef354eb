//! `[trust]`: which images may be served lazily, and what happens when two images claim one
//! chain for different layers (issue 24; the snapshotter README's "Trust model").
//!
//! A lazily served layer's diff_id is proven only once all its bytes are there. Inside one
//! containerd namespace containerd reuses a committed chain without asking which image wants
//! it, so an image claiming another image's diff_ids could shape what the other image runs.
//! The daemon therefore (1) serves lazily only layers of images from `lazy_sources` (every
//! other image takes the ordinary path, where containerd checks each diff_id at unpack), and
//! (2) with `check_contested`, holds a `Stat`, `Prepare` or `View` that reaches an unverified
//! remote snapshot whose chain another image of containerd's content store claims with
//! another layer until the snapshot's layer is fully fetched and its diff_id checked (a
//! mismatch quarantines it and the call fails).

use super::{invalid, ConfigError};
use serde::{Deserialize, Serialize};
use weenv_registry::Reference;

/// Trust policy of the lazy path.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrustSection {
    /// Image sources whose weenv layers may be mounted lazily: `host[:port]` (every repository
    /// of that registry) or `host[:port]/repository` (that repository and those below it, at a
    /// `/` boundary), or `"*"`. Layers of any other image take the ordinary path: containerd
    /// (or `weenv pull`) fetches and unpacks them, checking the diff_id. Default `["*"]`
    /// (every source); a multi-tenant node lists the repositories it trusts.
    #[serde(default = "default_lazy_sources")]
    pub lazy_sources: Vec<String>,
    /// Hold a `Stat`, `Prepare` or `View` that reaches an unverified remote snapshot whose
    /// chain another image in containerd's content store claims with another layer, until that
    /// snapshot's layer is fully fetched and verified (on a mismatch it is quarantined and the
    /// call fails). Needs `registry.containerd_socket`. Default true; false only to measure the
    /// attack it stops.
    #[serde(default = "default_true")]
    pub check_contested: bool,
    /// Verify every newly committed remote layer at once: all its frames fetched at on-demand
    /// priority (ahead of the background fill, which yields to the node's reads and busy CPU)
    /// and its diff_id checked, so an image with false diff_ids is quarantined within its
    /// download time even when nothing contests it. Costs the whole layer's bytes at pull time
    /// (what a full pull fetches; the container still starts lazily). Default false.
    #[serde(default)]
    pub verify_on_commit: bool,
    /// Longest such hold, in seconds (then the call fails and may be retried; the verification
    /// goes on). Default 600; between 1 and 86400.
    #[serde(default = "default_verify_timeout_secs")]
    pub verify_timeout_secs: u64,
}

fn default_lazy_sources() -> Vec<String> {
    vec!["*".to_string()]
}
fn default_true() -> bool {
    true
}
fn default_verify_timeout_secs() -> u64 {
    600
}

impl Default for TrustSection {
    fn default() -> Self {
        Self {
            lazy_sources: default_lazy_sources(),
            check_contested: true,
            verify_on_commit: false,
            verify_timeout_secs: default_verify_timeout_secs(),
        }
    }
}

impl TrustSection {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        for s in &self.lazy_sources {
            let bad = |why: &str| {
                invalid(
                    "trust.lazy_sources",
                    format!(
                        "{s:?}: {why} (use \"host[:port]\", \"host[:port]/repository\" or \"*\")"
                    ),
                )
            };
            if s == "*" {
                continue;
            }
            if s.is_empty() || s.contains("://") || s.contains(char::is_whitespace) {
                return Err(bad("not a registry or repository"));
            }
            if s.contains('@') || s.ends_with('/') || s.starts_with('/') || s.contains("//") {
                return Err(bad("no digest, no leading, trailing or double '/'"));
            }
        }
        if !(1..=86_400).contains(&self.verify_timeout_secs) {
            return Err(invalid(
                "trust.verify_timeout_secs",
                format!("{} is not between 1 and 86400", self.verify_timeout_secs),
            ));
        }
        Ok(())
    }

    /// True if layers of `image` may be served lazily. Pure.
    pub fn allows_lazy(&self, image: &Reference) -> bool {
        let (host, repo) = (image.registry(), image.repository());
        self.lazy_sources.iter().any(|s| {
            if s == "*" {
                return true;
            }
            let (shost, srepo) = match s.split_once('/') {
                Some((h, r)) => (h, Some(r)),
                None => (s.as_str(), None),
            };
            shost == host
                && srepo.is_none_or(|r| {
                    repo == r
                        || repo
                            .strip_prefix(r)
                            .is_some_and(|rest| rest.starts_with('/'))
                })
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // ok: test code
mod tests {
    use super::*;

    fn policy(sources: &[&str]) -> TrustSection {
        TrustSection {
            lazy_sources: sources.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    fn r(s: &str) -> Reference {
        s.parse().unwrap()
    }

    #[test]
    fn sources_match_registry_and_repository_at_a_slash() {
        let p = policy(&["reg:5000/weenv", "trusted.example"]);
        assert!(p.allows_lazy(&r("reg:5000/weenv:1")));
        assert!(p.allows_lazy(&r("reg:5000/weenv/base:1")));
        assert!(p.allows_lazy(&r("reg:5000/weenv/base@sha256:0000000000000000000000000000000000000000000000000000000000000000")));
        assert!(!p.allows_lazy(&r("reg:5000/weenvil/base:1")));
        assert!(!p.allows_lazy(&r("reg:5000/app:evil")));
        assert!(!p.allows_lazy(&r("reg:5001/weenv/base:1")));
        assert!(!p.allows_lazy(&r("reg/weenv/base:1")));
        assert!(p.allows_lazy(&r("trusted.example/any/thing:2")));
        assert!(TrustSection::default().allows_lazy(&r("anything.example/x:1")));
        assert!(!policy(&[]).allows_lazy(&r("reg:5000/weenv:1")));
    }

    #[test]
    fn bad_sources_and_timeouts_name_the_field() {
        for s in ["", "https://reg/x", "reg/x/", "reg@sha256:1", "a b"] {
            let e = policy(&[s]).validate().unwrap_err().to_string();
            assert!(e.contains("trust.lazy_sources"), "{e}");
        }
        policy(&["*", "reg:5000", "reg:5000/a/b"])
            .validate()
            .unwrap();
        let t = TrustSection {
            verify_timeout_secs: 0,
            ..Default::default()
        };
        assert!(t
            .validate()
            .unwrap_err()
            .to_string()
            .contains("trust.verify_timeout_secs"));
    }
}
