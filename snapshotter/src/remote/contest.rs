//! Contested chains: a committed remote snapshot whose chain id another image claims with
//! another layer.
//!
//! containerd's unpacker (nerdctl, the Go client, CRI) asks `Stat(chainID)` before anything
//! else and reuses a committed chain of its namespace without a Prepare, so the snapshotter
//! never learns which image is unpacking. What it can learn: before an image is unpacked its
//! manifest and config are in containerd's content store, and the unpack's `Stat` (and every
//! later `Prepare`/`View` on top of the chain) reaches the daemon with the snapshot's key. If
//! an image manifest there names, at the position whose chain id is the snapshot's, another
//! layer than the one the snapshot was made from, one of the two images claims diff_ids that
//! are not its own: the snapshot is *contested*, and it is not handed out before its layer is
//! verified (see the service's gate).
//!
//! [`contest`] is the pure decision; [`ClaimSource`] reads the claims (for the daemon:
//! [`ContainerdClaims`], every namespace of containerd's content store, each manifest and
//! config read once and cached by digest).

use super::image::{config_diff_ids, verified, LocalBlobs, IMAGE_CACHE_ENTRIES, LOCAL_BLOB_MAX};
use super::source::ContainerdSources;
use std::collections::HashMap;
use std::sync::Arc;
use weenv_format::Digest;
use weenv_registry::manifest::chain_ids;
use weenv_registry::ImageManifest;

/// What one image manifest claims: per layer, bottom first, (chain id, layer digest).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageClaims {
    pub manifest: String,
    pub chains: Vec<(String, String)>,
}

impl ImageClaims {
    /// The claims of manifest `manifest` (digest) listing `layers` with config diff_ids
    /// `diff_ids`; `None` when the counts differ (containerd refuses such an image). Pure.
    pub fn new(manifest: &str, layers: &[String], diff_ids: &[String]) -> Option<ImageClaims> {
        (layers.len() == diff_ids.len()).then(|| ImageClaims {
            manifest: manifest.to_string(),
            chains: chain_ids(diff_ids)
                .into_iter()
                .zip(layers.iter().cloned())
                .collect(),
        })
    }
}

/// Another image claiming a chain with another layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Contest {
    /// The manifest of that image.
    pub manifest: String,
    /// The layer it names at that chain.
    pub layer: String,
}

/// The first image among `images` that claims chain `chain` with another layer than `bound`
/// (the layer the chain's remote snapshot was made from). Pure.
pub fn contest(images: &[Arc<ImageClaims>], chain: &str, bound: &str) -> Option<Contest> {
    images.iter().find_map(|i| {
        i.chains
            .iter()
            .find(|(c, l)| c == chain && l != bound)
            .map(|(_, l)| Contest {
                manifest: i.manifest.clone(),
                layer: l.clone(),
            })
    })
}

/// Where the claims of the node's images come from.
#[async_trait::async_trait]
pub trait ClaimSource: Send + Sync + 'static {
    /// The claims of every image manifest the node has; `Err` when they cannot be read.
    async fn claims(&self) -> Result<Vec<Arc<ImageClaims>>, String>;
}

/// [`ClaimSource`] over containerd's content store: every namespace, each manifest and config
/// read once (cached by manifest digest, `None` for a manifest that claims nothing; one whose
/// blobs are not readable yet is read again on the next call).
pub struct ContainerdClaims {
    sources: Arc<ContainerdSources>,
    cache: parking_lot::Mutex<HashMap<String, Option<Arc<ImageClaims>>>>,
}

impl ContainerdClaims {
    pub fn new(sources: Arc<ContainerdSources>) -> Self {
        Self {
            sources,
            cache: parking_lot::Mutex::new(HashMap::new()),
        }
    }

    /// The claims of manifest `md` in `namespace` (content store only; verified bytes):
    /// `Some(None)` for a manifest that claims nothing (not an image manifest, no diff_ids,
    /// counts that differ: final), `None` when a blob is not readable (yet: a pull writes the
    /// manifest before the config; asked again next time).
    async fn read(&self, namespace: &str, md: &Digest) -> Option<Option<Arc<ImageClaims>>> {
        let get = |d: Digest| async move {
            let b = self.sources.blob(namespace, &d, LOCAL_BLOB_MAX).await?;
            verified(&d, b)
        };
        let Ok(m) = serde_json::from_slice::<ImageManifest>(&get(md.clone()).await?) else {
            return Some(None);
        };
        let Ok(diff_ids) = config_diff_ids(&get(m.config.digest.clone()).await?) else {
            return Some(None);
        };
        let layers: Vec<String> = m.layers.iter().map(|l| l.digest.to_string()).collect();
        Some(ImageClaims::new(md.as_str(), &layers, &diff_ids).map(Arc::new))
    }
}

#[async_trait::async_trait]
impl ClaimSource for ContainerdClaims {
    async fn claims(&self) -> Result<Vec<Arc<ImageClaims>>, String> {
        let mut out = Vec::new();
        for ns in self.sources.namespaces().await? {
            for m in self.sources.manifests(&ns).await? {
                let cached = self.cache.lock().get(&m.digest).cloned();
                let claims = match cached {
                    Some(c) => c,
                    None => {
                        let Ok(md) = m.digest.parse::<Digest>() else {
                            continue;
                        };
                        let Some(c) = self.read(&ns, &md).await else {
                            continue; // not readable yet: not cached
                        };
                        let mut cache = self.cache.lock();
                        if cache.len() >= IMAGE_CACHE_ENTRIES {
                            cache.clear();
                        }
                        cache.insert(m.digest.clone(), c.clone());
                        c
                    }
                };
                out.extend(claims);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // ok: test code
mod tests {
    use super::*;

    fn d(s: &str) -> String {
        Digest::sha256(s.as_bytes()).to_string()
    }

    #[test]
    fn another_layer_under_the_same_chain_contests_it() {
        let diff = [d("base"), d("app")];
        let chains = chain_ids(&diff);
        let good = Arc::new(ImageClaims::new("sha256:good", &[d("L1"), d("L2")], &diff).unwrap());
        let evil = Arc::new(ImageClaims::new("sha256:evil", &[d("E1"), d("E2")], &diff).unwrap());
        // EVIL's snapshots (bound to E1, E2) are contested by GOOD, and the other way round.
        let all = [good.clone(), evil.clone()];
        assert_eq!(
            contest(&all, &chains[0], &d("E1")),
            Some(Contest {
                manifest: "sha256:good".into(),
                layer: d("L1")
            })
        );
        assert_eq!(
            contest(&all, &chains[1], &d("L2")).unwrap().manifest,
            "sha256:evil"
        );
        // Alone, or with images agreeing on the layer, nothing is contested.
        assert_eq!(
            contest(std::slice::from_ref(&evil), &chains[0], &d("E1")),
            None
        );
        assert_eq!(contest(&[good.clone(), good], &chains[1], &d("L2")), None);
        // Another chain is no contest.
        assert_eq!(contest(&[evil], &d("other"), &d("L1")), None);
        assert!(ImageClaims::new("m", &[d("a")], &[]).is_none());
    }
}
