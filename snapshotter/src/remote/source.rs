//! Where a layer comes from when the Prepare does not say: containerd's content store.
//!
//! Stock clients (nerdctl, the containerd Go client's `Pull` with unpack, CRI with
//! `disable_snapshot_annotations`) pass a Prepare only the target chain id and the layer
//! descriptor's `containerd.io/snapshot/*` annotations: weenv images carry the layer digest
//! there ([`weenv_format::snapshot_labels`]), but no image reference. Before unpacking, the
//! same pull wrote the image manifest into containerd's content store with two kinds of labels:
//! `containerd.io/gc.ref.content.l.<i>=<layer digest>` (one per layer; `containerd.io/
//! gc.ref.content.<i>` from older clients, `weenv pull` writes the former) and
//! `containerd.io/distribution.source.<host>=<repo>[,<repo>...]` (where it was pulled from).
//! The manifest that lists the layer and names a source gives the registry, the repository and
//! the manifest digest (its TOC hints, profile and the diff_ids its config claims).
//!
//! containerd drops the port from that label (`127.0.0.1:5000/app` is recorded as
//! `distribution.source.127.0.0.1=app`), so the registry is the first of [`candidate_hosts`]
//! that serves the manifest: the hosts of the daemon's own registry config with that host name
//! (`registry.plain_http`, `hosts_dir` entries), then the bare host (HTTPS on 443); the answer
//! is remembered per (host, repository).
//!
//! [`pick_source`] and [`candidate_hosts`] are the pure decisions; [`ContainerdSources`] asks
//! containerd (Content.List of the manifests: those with a `gc.ref.content.config` label) in
//! the Prepare's namespace, and the registry which candidate has the manifest.
//! containerd's CRI plugin with `discard_unpacked_layers = true` writes no layer labels: its
//! layers are then pulled the ordinary way (logged).
//!
//! [`ContainerdSources`] is also the daemon's [`super::image::LocalBlobs`]: manifests and
//! configs read from the content store (Content.Read, verified against their digest by the
//! caller) before the registry is asked for them.

use containerd_client::services::v1::content_client::ContentClient;
use containerd_client::services::v1::{Info, ListContentRequest, ReadContentRequest};
use std::collections::HashMap;
use std::path::PathBuf;
use tokio::sync::Mutex;
use tonic::transport::Channel;
use tracing::debug;
use weenv_format::Digest;
use weenv_registry::{Client, Reference};

/// containerd's label naming where a blob was pulled from (suffix: the registry host).
pub const LABEL_DISTRIBUTION_SOURCE: &str = "containerd.io/distribution.source.";
/// containerd's GC reference labels of a manifest to its children.
const LABEL_GC_CONTENT: &str = "containerd.io/gc.ref.content.";
/// The content-store filter selecting image manifests (they reference a config).
pub const MANIFEST_FILTER: &str = r#"labels."containerd.io/gc.ref.content.config""#;

/// What the content store says about one blob.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContentLabels {
    pub digest: String,
    /// Last update (nanoseconds since the epoch): the most recent pull wins.
    pub updated: i128,
    pub labels: HashMap<String, String>,
}

impl From<Info> for ContentLabels {
    fn from(i: Info) -> Self {
        let updated = i
            .updated_at
            .map(|t| i128::from(t.seconds) * 1_000_000_000 + i128::from(t.nanos))
            .unwrap_or(0);
        Self {
            digest: i.digest,
            updated,
            labels: i.labels,
        }
    }
}

/// Where a layer can be read from, as the content store names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContentSource {
    /// Registry host name as containerd records it (no port).
    pub host: String,
    pub repository: String,
    /// The manifest listing the layer.
    pub manifest: String,
}

/// Where a layer can be read from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerSource {
    /// `<host[:port]>/<repository>@<manifest digest>`.
    pub reference: String,
    /// The manifest listing the layer.
    pub manifest: String,
}

/// The registries to try for `host` (a host name without port, as containerd's
/// distribution-source label names it): the `configured` hosts with that host name (sorted),
/// then `host` itself. Pure.
pub fn candidate_hosts<'a>(
    host: &str,
    configured: impl IntoIterator<Item = &'a String>,
) -> Vec<String> {
    let mut out: Vec<String> = configured
        .into_iter()
        .filter(|c| {
            c.as_str() != host
                && c.rsplit_once(':').is_some_and(|(h, port)| {
                    h == host && !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit())
                })
        })
        .cloned()
        .collect();
    out.sort();
    out.dedup();
    out.push(host.to_string());
    out
}

/// The first (host, repository) of a blob's distribution-source labels, by host name.
fn distribution_source(labels: &HashMap<String, String>) -> Option<(&str, &str)> {
    let mut found: Vec<(&str, &str)> = labels
        .iter()
        .filter_map(|(k, v)| {
            let host = k.strip_prefix(LABEL_DISTRIBUTION_SOURCE)?;
            let repo = v.split(',').map(str::trim).find(|r| !r.is_empty())?;
            (!host.is_empty()).then_some((host, repo))
        })
        .collect();
    found.sort();
    found.into_iter().next()
}

/// Among content-store entries, the most recently updated manifest that lists `layer` (a GC
/// content label whose value is the layer digest; the config's does not count) and names a
/// distribution source. Ties: the smallest manifest digest. Pure.
pub fn pick_source(entries: &[ContentLabels], layer: &Digest) -> Option<ContentSource> {
    let lists_layer = |e: &ContentLabels| {
        e.labels.iter().any(|(k, v)| {
            k.strip_prefix(LABEL_GC_CONTENT)
                .is_some_and(|rest| rest != "config" && !rest.starts_with("m."))
                && v == layer.as_str()
        })
    };
    entries
        .iter()
        .filter(|e| e.digest.parse::<Digest>().is_ok() && lists_layer(e))
        .filter_map(|e| Some((e, distribution_source(&e.labels)?)))
        .max_by(|(a, _), (b, _)| a.updated.cmp(&b.updated).then(b.digest.cmp(&a.digest)))
        .map(|(e, (host, repo))| ContentSource {
            host: host.to_string(),
            repository: repo.to_string(),
            manifest: e.digest.clone(),
        })
}

/// Finds where a layer comes from.
#[async_trait::async_trait]
pub trait LayerSources: Send + Sync + 'static {
    /// The source of `layer` as the image manifests in `namespace` name it; `None` if none
    /// does (or the lookup failed: logged).
    async fn source(&self, namespace: &str, layer: &Digest) -> Option<LayerSource>;
}

/// [`LayerSources`] over containerd's Content API.
pub struct ContainerdSources {
    socket: PathBuf,
    channel: Mutex<Option<Channel>>,
    registry: Client,
    /// (label host, repository) -> the registry host that served its manifest.
    hosts: parking_lot::Mutex<HashMap<(String, String), String>>,
}

impl ContainerdSources {
    /// Sources read through containerd at `socket` (connected on first use); `registry`
    /// (its configured hosts) settles which registry a port-less label names.
    pub fn new(socket: PathBuf, registry: Client) -> Self {
        Self {
            socket,
            channel: Mutex::new(None),
            registry,
            hosts: parking_lot::Mutex::new(HashMap::new()),
        }
    }

    /// The reference of `s` on the first candidate registry serving its manifest.
    async fn reference(&self, s: &ContentSource) -> Option<String> {
        let key = (s.host.clone(), s.repository.clone());
        let at = |host: &str| format!("{host}/{}@{}", s.repository, s.manifest);
        if let Some(h) = self.hosts.lock().get(&key) {
            return Some(at(h));
        }
        let candidates = candidate_hosts(&s.host, self.registry.config().hosts.keys());
        for host in &candidates {
            let Ok(r) = at(host).parse::<Reference>() else {
                continue;
            };
            match self.registry.resolve(&r).await {
                Ok(_) => {
                    let mut hosts = self.hosts.lock();
                    if hosts.len() >= super::image::IMAGE_CACHE_ENTRIES {
                        hosts.clear();
                    }
                    hosts.insert(key, host.clone());
                    return Some(at(host));
                }
                Err(e) => {
                    debug!(reference = %r, error = %e, "candidate registry does not serve the manifest")
                }
            }
        }
        tracing::warn!(host = %s.host, repository = %s.repository, manifest = %s.manifest, ?candidates,
            "no registry serves the manifest containerd pulled the layer with (a registry on a \
             non-default port must be listed in registry.plain_http or hosts_dir)");
        None
    }

    async fn channel(&self) -> Result<Channel, String> {
        let mut ch = self.channel.lock().await;
        if let Some(c) = ch.as_ref() {
            return Ok(c.clone());
        }
        let c = containerd_client::connect(&self.socket)
            .await
            .map_err(|e| format!("connecting to containerd at {}: {e}", self.socket.display()))?;
        *ch = Some(c.clone());
        Ok(c)
    }

    /// The image manifests of `namespace`'s content store (those referencing a config).
    pub(crate) async fn manifests(&self, namespace: &str) -> Result<Vec<ContentLabels>, String> {
        let req = ListContentRequest {
            filters: vec![MANIFEST_FILTER.to_string()],
        };
        let err = |s: tonic::Status| format!("containerd content list: {}", s.message());
        let mut stream = ContentClient::new(self.channel().await?)
            .list(in_namespace(namespace, req))
            .await
            .map_err(err)?
            .into_inner();
        let mut out = Vec::new();
        while let Some(resp) = stream.message().await.map_err(err)? {
            out.extend(resp.info.into_iter().map(ContentLabels::from));
        }
        Ok(out)
    }
}

impl ContainerdSources {
    /// containerd's namespaces.
    pub(crate) async fn namespaces(&self) -> Result<Vec<String>, String> {
        let r = containerd_client::services::v1::namespaces_client::NamespacesClient::new(
            self.channel().await?,
        )
        .list(containerd_client::services::v1::ListNamespacesRequest {
            filter: String::new(),
        })
        .await
        .map_err(|s| format!("containerd namespace list: {}", s.message()))?;
        Ok(r.into_inner()
            .namespaces
            .into_iter()
            .map(|n| n.name)
            .collect())
    }
}

/// `msg` as a request in containerd namespace `namespace`.
fn in_namespace<T>(namespace: &str, msg: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    if let Ok(v) = namespace.parse() {
        req.metadata_mut().insert("containerd-namespace", v);
    }
    req
}

#[async_trait::async_trait]
impl super::image::LocalBlobs for ContainerdSources {
    /// Content.Read of the whole blob (absent, larger than `max` or unreadable: `None`).
    async fn blob(&self, namespace: &str, digest: &Digest, max: usize) -> Option<bytes::Bytes> {
        let read = async {
            let req = ReadContentRequest {
                digest: digest.to_string(),
                offset: 0,
                size: 0,
            };
            let err = |s: tonic::Status| format!("containerd content read: {}", s.message());
            let mut stream = ContentClient::new(self.channel().await?)
                .read(in_namespace(namespace, req))
                .await
                .map_err(err)?
                .into_inner();
            let mut out = Vec::new();
            while let Some(resp) = stream.message().await.map_err(err)? {
                if out.len() + resp.data.len() > max {
                    return Err(format!("larger than {max} bytes"));
                }
                out.extend_from_slice(&resp.data);
            }
            Ok::<_, String>(bytes::Bytes::from(out))
        };
        match read.await {
            Ok(b) => Some(b),
            Err(e) => {
                debug!(namespace, %digest, error = %e, "blob not read from containerd's content store");
                None
            }
        }
    }
}

#[async_trait::async_trait]
impl LayerSources for ContainerdSources {
    async fn source(&self, namespace: &str, layer: &Digest) -> Option<LayerSource> {
        let found = match self.manifests(namespace).await {
            Ok(m) => {
                let s = pick_source(&m, layer);
                debug!(namespace, %layer, manifests = m.len(), source = ?s, "layer source from containerd's content store");
                s?
            }
            Err(e) => {
                tracing::warn!(namespace, %layer, error = %e, "cannot read containerd's content store; the layer is pulled the ordinary way");
                return None;
            }
        };
        Some(LayerSource {
            reference: self.reference(&found).await?,
            manifest: found.manifest,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(digest: &Digest, updated: i128, labels: &[(&str, &str)]) -> ContentLabels {
        ContentLabels {
            digest: digest.to_string(),
            updated,
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn the_newest_manifest_listing_the_layer_with_a_source_wins() {
        let layer = Digest::sha256(b"layer");
        let (m1, m2, m3, m4) = (
            Digest::sha256(b"m1"),
            Digest::sha256(b"m2"),
            Digest::sha256(b"m3"),
            Digest::sha256(b"m4"),
        );
        let l = layer.to_string();
        let entries = vec![
            // lists the layer, older
            entry(
                &m1,
                10,
                &[
                    ("containerd.io/gc.ref.content.l.0", &l),
                    ("containerd.io/distribution.source.reg.io", "old/repo"),
                ],
            ),
            // newest, but no source
            entry(&m2, 99, &[("containerd.io/gc.ref.content.l.1", &l)]),
            // lists another layer
            entry(
                &m3,
                50,
                &[
                    ("containerd.io/gc.ref.content.l.0", "sha256:other"),
                    ("containerd.io/distribution.source.reg.io", "x"),
                ],
            ),
            // newer, older-style label, two repos
            entry(
                &m4,
                20,
                &[
                    ("containerd.io/gc.ref.content.3", &l),
                    ("containerd.io/distribution.source.127.0.0.1", "a/b,c/d"),
                ],
            ),
        ];
        assert_eq!(
            pick_source(&entries, &layer),
            Some(ContentSource {
                host: "127.0.0.1".into(),
                repository: "a/b".into(),
                manifest: m4.to_string(),
            })
        );
        assert_eq!(
            pick_source(&entries[..3], &layer).unwrap().manifest,
            m1.to_string()
        );
        assert_eq!(pick_source(&entries[1..3], &layer), None);
    }

    #[test]
    fn config_and_child_manifest_references_do_not_count() {
        let layer = Digest::sha256(b"layer");
        let l = layer.to_string();
        let m = Digest::sha256(b"m");
        let src = ("containerd.io/distribution.source.r", "x");
        for key in [
            "containerd.io/gc.ref.content.config",
            "containerd.io/gc.ref.content.m.0",
            "containerd.io/gc.ref.snapshot.weenv",
        ] {
            assert_eq!(
                pick_source(&[entry(&m, 1, &[(key, &l), src])], &layer),
                None,
                "{key}"
            );
        }
        // a malformed digest or an empty source is no manifest to read
        let bad = ContentLabels {
            digest: "sha256:x".into(),
            ..entry(&m, 1, &[("containerd.io/gc.ref.content.l.0", &l), src])
        };
        assert_eq!(pick_source(&[bad], &layer), None);
        let empty = entry(
            &m,
            1,
            &[
                ("containerd.io/gc.ref.content.l.0", &l),
                ("containerd.io/distribution.source.r", " ,"),
            ],
        );
        assert_eq!(pick_source(&[empty], &layer), None);
    }

    #[test]
    fn configured_hosts_with_the_label_host_name_come_first() {
        let configured: Vec<String> = [
            "127.0.0.1:5001",
            "reg.io",
            "127.0.0.1:5000",
            "127.0.0.10:1",
            "127.0.0.1:x",
            "127.0.0.1",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            candidate_hosts("127.0.0.1", &configured),
            vec!["127.0.0.1:5000", "127.0.0.1:5001", "127.0.0.1"]
        );
        assert_eq!(candidate_hosts("reg.io", &configured), vec!["reg.io"]);
        assert_eq!(candidate_hosts("docker.io", &[]), vec!["docker.io"]);
    }
}
