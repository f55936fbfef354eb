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
//! `distribution.source.127.0.0.1=app`: `url.Hostname()` in its `AppendDistributionSourceLabel`)
//! and writes nothing else that names the registry before it unpacks: the image record (whose
//! name has the port) is created only after the unpack. So the registry is, in this order
//! ([`choose_host`]):
//! 1. the host of an image record of the namespace whose target is the manifest (or an index
//!    listing it) and whose name has the label's host name and one of its repositories: exact
//!    (a re-pull, an image pulled before under another tag or by another client);
//! 2. the one registry of the daemon's config with that host name (`registry.plain_http`,
//!    `hosts_dir` entries, with or without a port; none: the bare host, HTTPS on 443):
//!    exact as far as the config is;
//! 3. two or more configured registries share the host name and no record says which: no guess.
//!    The layer takes the ordinary path ([`NoSource::AmbiguousHost`]).
//!
//! The chosen registry must serve the manifest by digest; the answer is remembered per
//! (host, repository, manifest). Prepares whose labels name the image (`weenv pull`, CRI with
//! snapshot annotations, `ctr-remote`) never come here: their reference has the port.
//!
//! [`pick_source`], [`configured_hosts`] and [`choose_host`] are the pure decisions;
//! [`ContainerdSources`] asks containerd (Content.List of the manifests: those with a
//! `gc.ref.content.config` label; Images.List) in the Prepare's namespace, and the registry
//! whether the chosen host has the manifest. It also tells whether containerd answers at all
//! ([`ContainerdSources::check`], `weenv_containerd_up`): without it every such layer is
//! pulled in full.
//! containerd's CRI plugin with `discard_unpacked_layers = true` writes no layer labels: its
//! layers are then pulled the ordinary way (logged).
//!
//! [`ContainerdSources`] is also the daemon's [`super::image::LocalBlobs`]: manifests and
//! configs read from the content store (Content.Read, verified against their digest by the
//! caller) before the registry is asked for them.

use containerd_client::services::v1::content_client::ContentClient;
use containerd_client::services::v1::images_client::ImagesClient;
use containerd_client::services::v1::version_client::VersionClient;
use containerd_client::services::v1::{
    Info, ListContentRequest, ListImagesRequest, ReadContentRequest,
};
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
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
/// The content-store filter selecting image indexes (they reference a first manifest).
const INDEX_FILTER: &str = r#"labels."containerd.io/gc.ref.content.m.0""#;
/// How long one call to containerd may take before it counts as not answering.
const CONTAINERD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

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
    /// The first repository of the label.
    pub repository: String,
    /// Every repository of the label (pulls of the same blob from several repositories).
    pub repositories: Vec<String>,
    /// The manifest listing the layer.
    pub manifest: String,
}

/// Why a layer's source was not found: the layer takes the ordinary path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NoSource {
    /// containerd did not answer on `registry.containerd_socket`.
    Unreachable(String),
    /// No image manifest of the namespace lists the layer with a distribution source.
    NoManifest,
    /// Several configured registries have the label's host name and no image record says
    /// which one the layer was pulled from.
    AmbiguousHost {
        host: String,
        candidates: Vec<String>,
    },
    /// The registry chosen does not serve the manifest.
    NotServed { reference: String, error: String },
}

impl std::fmt::Display for NoSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NoSource::Unreachable(e) => write!(f, "containerd does not answer: {e}"),
            NoSource::NoManifest => write!(
                f,
                "no image manifest in containerd's content store lists this weenv layer with a \
                 distribution source"
            ),
            NoSource::AmbiguousHost { host, candidates } => write!(
                f,
                "containerd recorded the registry as {host:?} (it drops the port) and the \
                 config has several registries of that name ({}); no image record says which. \
                 Pull with `weenv pull`, enable CRI snapshot annotations, or give each registry \
                 its own host name",
                candidates.join(", ")
            ),
            NoSource::NotServed { reference, error } => {
                write!(f, "the registry chosen does not serve {reference}: {error}")
            }
        }
    }
}

/// The registry to read a layer from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostChoice {
    /// `host[:port]` and repository.
    Use(String, String),
    /// Several configured registries share the host name (sorted).
    Ambiguous(Vec<String>),
}

/// Where a layer can be read from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerSource {
    /// `<host[:port]>/<repository>@<manifest digest>`.
    pub reference: String,
    /// The manifest listing the layer.
    pub manifest: String,
}

/// The registries of the daemon's config (`configured`: `host[:port]` keys) whose host name
/// is `host` (a host name without port, as containerd's distribution-source label names it),
/// sorted. Pure.
pub fn configured_hosts<'a>(
    host: &str,
    configured: impl IntoIterator<Item = &'a String>,
) -> Vec<String> {
    let mut out: Vec<String> = configured
        .into_iter()
        .filter(|c| {
            c.as_str() == host
                || c.rsplit_once(':').is_some_and(|(h, port)| {
                    h == host && !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit())
                })
        })
        .cloned()
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The registry of a layer whose distribution source is `host` (no port) and `repository`:
/// the first of `recorded` (`host[:port]`, repository of image records naming the manifest,
/// newest first, already filtered to this host name and the label's repositories), else the
/// one `configured` registry of that host name ([`configured_hosts`]), else the bare host when
/// none is configured; several configured and no record: [`HostChoice::Ambiguous`]. Pure.
pub fn choose_host(
    host: &str,
    repository: &str,
    configured: &[String],
    recorded: &[(String, String)],
) -> HostChoice {
    if let Some((h, r)) = recorded.first() {
        return HostChoice::Use(h.clone(), r.clone());
    }
    match configured {
        [] => HostChoice::Use(host.to_string(), repository.to_string()),
        [one] => HostChoice::Use(one.clone(), repository.to_string()),
        many => HostChoice::Ambiguous(many.to_vec()),
    }
}

/// The host name of `registry` (`host[:port]`).
fn host_name(registry: &str) -> &str {
    match registry.rsplit_once(':') {
        Some((h, port))
            if !h.is_empty() && !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) =>
        {
            h
        }
        _ => registry,
    }
}

/// From image records (`(name, target digest, updated)`) and indexes (`(index digest, labels)`
/// of the content store), the (`host[:port]`, repository) of every record whose target is
/// `s.manifest` or an index listing it, whose host name is `s.host` and whose repository is one
/// of the label's; newest first, each once. Pure.
pub fn recorded_hosts(
    s: &ContentSource,
    images: &[(String, String, i128)],
    indexes: &[ContentLabels],
) -> Vec<(String, String)> {
    let listing: HashSet<&str> = indexes
        .iter()
        .filter(|i| {
            i.labels.iter().any(|(k, v)| {
                k.strip_prefix(LABEL_GC_CONTENT)
                    .is_some_and(|rest| rest.starts_with("m."))
                    && *v == s.manifest
            })
        })
        .map(|i| i.digest.as_str())
        .collect();
    let mut found: Vec<(i128, String, String)> = images
        .iter()
        .filter(|(_, target, _)| *target == s.manifest || listing.contains(target.as_str()))
        .filter_map(|(name, _, updated)| {
            let r = name.parse::<Reference>().ok()?;
            (host_name(r.registry()) == s.host
                && s.repositories.iter().any(|x| x == r.repository()))
            .then(|| {
                (
                    *updated,
                    r.registry().to_string(),
                    r.repository().to_string(),
                )
            })
        })
        .collect();
    found.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    let mut seen = HashSet::new();
    found
        .into_iter()
        .filter(|(_, h, r)| seen.insert((h.clone(), r.clone())))
        .map(|(_, h, r)| (h, r))
        .collect()
}

/// The first (host, repositories) of a blob's distribution-source labels, by host name.
fn distribution_source(labels: &HashMap<String, String>) -> Option<(&str, Vec<&str>)> {
    let mut found: Vec<(&str, Vec<&str>)> = labels
        .iter()
        .filter_map(|(k, v)| {
            let host = k.strip_prefix(LABEL_DISTRIBUTION_SOURCE)?;
            let repos: Vec<&str> = v
                .split(',')
                .map(str::trim)
                .filter(|r| !r.is_empty())
                .collect();
            (!host.is_empty() && !repos.is_empty()).then_some((host, repos))
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
        .and_then(|(e, (host, repos))| {
            Some(ContentSource {
                host: host.to_string(),
                repository: repos.first()?.to_string(),
                repositories: repos.iter().map(|r| r.to_string()).collect(),
                manifest: e.digest.clone(),
            })
        })
}

/// Finds where a layer comes from.
#[async_trait::async_trait]
pub trait LayerSources: Send + Sync + 'static {
    /// The source of `layer` as the image manifests in `namespace` name it, or why there is
    /// none (logged by the caller, which takes the ordinary path).
    async fn source(&self, namespace: &str, layer: &Digest) -> Result<LayerSource, NoSource>;
}

/// [`LayerSources`] over containerd's Content and Images API.
pub struct ContainerdSources {
    socket: PathBuf,
    channel: Mutex<Option<Channel>>,
    registry: Client,
    /// (label host, repository, manifest) -> the `host[:port]/repository` that served it.
    hosts: parking_lot::Mutex<HashMap<(String, String, String), String>>,
    /// Whether containerd answered the last call (1) or not (0, also before the first).
    up: AtomicU64,
    /// Calls to containerd that got no answer.
    unreachable: AtomicU64,
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
            up: AtomicU64::new(0),
            unreachable: AtomicU64::new(0),
        }
    }

    /// The socket asked.
    pub fn socket(&self) -> &std::path::Path {
        &self.socket
    }

    /// Asks containerd for its version: `Ok(version)` if it answers on the socket.
    pub async fn check(&self) -> Result<String, String> {
        self.ask("containerd version", |ch| async move {
            VersionClient::new(ch)
                .version(())
                .await
                .map(|r| r.into_inner().version)
        })
        .await
        .map_err(|e| e.to_string())
    }

    /// One call to containerd (`f` on the channel), bounded by [`CONTAINERD_TIMEOUT`];
    /// records whether containerd answered (a gRPC status other than `Unavailable` is an
    /// answer; no connection, `Unavailable` or the timeout are not).
    async fn ask<T, F, Fut>(&self, what: &'static str, f: F) -> Result<T, CallError>
    where
        F: FnOnce(Channel) -> Fut + Send,
        Fut: std::future::Future<Output = Result<T, tonic::Status>> + Send,
        T: Send,
    {
        let run = async {
            let ch = self.channel().await.map_err(CallError::NoAnswer)?;
            f(ch).await.map_err(|st| {
                let m = format!("{what}: {}", st.message());
                if st.code() == tonic::Code::Unavailable {
                    CallError::NoAnswer(m)
                } else {
                    CallError::Failed(m)
                }
            })
        };
        let r = tokio::time::timeout(CONTAINERD_TIMEOUT, run)
            .await
            .unwrap_or_else(|_| {
                Err(CallError::NoAnswer(format!(
                    "{what}: no answer within {} s",
                    CONTAINERD_TIMEOUT.as_secs()
                )))
            });
        if let Err(CallError::NoAnswer(_)) = r {
            self.up.store(0, Ordering::Relaxed);
            self.unreachable.fetch_add(1, Ordering::Relaxed);
        } else {
            self.up.store(1, Ordering::Relaxed);
        }
        r
    }

    /// `/metrics`: `weenv_containerd_up` and `weenv_containerd_unreachable_total`.
    pub fn render(&self) -> String {
        let mut e = crate::metrics::Exposition::new();
        e.gauge_family(
            "weenv_containerd_up",
            "Whether containerd answered the last call on registry.containerd_socket (label-free lazy pulls of weenv images need it).",
            "socket",
            vec![(self.socket.display().to_string(), self.up.load(Ordering::Relaxed))],
        );
        e.counter(
            "weenv_containerd_unreachable_total",
            "Calls to containerd on registry.containerd_socket that got no answer (the layers they were for were pulled in full).",
            self.unreachable.load(Ordering::Relaxed),
        );
        e.render()
    }

    /// The reference of `s` on the registry [`choose_host`] names, if it serves the manifest.
    async fn reference(&self, namespace: &str, s: &ContentSource) -> Result<String, NoSource> {
        let key = (s.host.clone(), s.repository.clone(), s.manifest.clone());
        if let Some(at) = self.hosts.lock().get(&key) {
            return Ok(format!("{at}@{}", s.manifest));
        }
        let configured = configured_hosts(&s.host, self.registry.config().hosts.keys());
        let recorded = match self.image_records(namespace).await {
            Ok((images, indexes)) => recorded_hosts(s, &images, &indexes),
            Err(e) => {
                debug!(namespace, error = %e, "image records not read; the config decides");
                Vec::new()
            }
        };
        let (host, repo) = match choose_host(&s.host, &s.repository, &configured, &recorded) {
            HostChoice::Use(h, r) => (h, r),
            HostChoice::Ambiguous(candidates) => {
                return Err(NoSource::AmbiguousHost {
                    host: s.host.clone(),
                    candidates,
                })
            }
        };
        let reference = format!("{host}/{repo}@{}", s.manifest);
        let r = reference
            .parse::<Reference>()
            .map_err(|e| NoSource::NotServed {
                reference: reference.clone(),
                error: e.to_string(),
            })?;
        if let Err(e) = self.registry.resolve(&r).await {
            return Err(NoSource::NotServed {
                reference,
                error: format!(
                    "{e} (a registry on a non-default port must be listed in \
                     registry.plain_http or hosts_dir)"
                ),
            });
        }
        let mut hosts = self.hosts.lock();
        if hosts.len() >= super::image::IMAGE_CACHE_ENTRIES {
            hosts.clear();
        }
        hosts.insert(key, format!("{host}/{repo}"));
        debug!(%reference, recorded = recorded.len(), ?configured, "registry of a port-less distribution source");
        Ok(reference)
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

    /// Content.List of the blobs matching `filter` in `namespace`.
    async fn list_content(
        &self,
        namespace: &str,
        filter: &str,
    ) -> Result<Vec<ContentLabels>, CallError> {
        let req = in_namespace(
            namespace,
            ListContentRequest {
                filters: vec![filter.to_string()],
            },
        );
        self.ask("containerd content list", |ch| async move {
            let mut stream = ContentClient::new(ch).list(req).await?.into_inner();
            let mut out = Vec::new();
            while let Some(resp) = stream.message().await? {
                out.extend(resp.info.into_iter().map(ContentLabels::from));
            }
            Ok(out)
        })
        .await
    }

    /// The image records of `namespace` (name, target digest, last update) and its indexes.
    async fn image_records(
        &self,
        namespace: &str,
    ) -> Result<(Vec<(String, String, i128)>, Vec<ContentLabels>), CallError> {
        let req = in_namespace(namespace, ListImagesRequest { filters: vec![] });
        let images = self
            .ask("containerd images list", |ch| async move {
                Ok(ImagesClient::new(ch).list(req).await?.into_inner().images)
            })
            .await?;
        let images: Vec<(String, String, i128)> = images
            .into_iter()
            .filter_map(|i| {
                let updated = i
                    .updated_at
                    .map(|t| i128::from(t.seconds) * 1_000_000_000 + i128::from(t.nanos))
                    .unwrap_or(0);
                Some((i.name, i.target?.digest, updated))
            })
            .collect();
        let indexes = if images.is_empty() {
            Vec::new()
        } else {
            self.list_content(namespace, INDEX_FILTER).await?
        };
        Ok((images, indexes))
    }
}

/// A call to containerd that failed.
#[derive(Clone, Debug, PartialEq, Eq)]
enum CallError {
    /// No connection, `Unavailable` or no answer in time.
    NoAnswer(String),
    /// containerd answered with an error.
    Failed(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::NoAnswer(m) | CallError::Failed(m) => f.write_str(m),
        }
    }
}

impl ContainerdSources {
    /// The image manifests of `namespace`'s content store (those referencing a config).
    pub(crate) async fn manifests(&self, namespace: &str) -> Result<Vec<ContentLabels>, String> {
        self.list_content(namespace, MANIFEST_FILTER)
            .await
            .map_err(|e| e.to_string())
    }

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
    async fn source(&self, namespace: &str, layer: &Digest) -> Result<LayerSource, NoSource> {
        let manifests = self
            .list_content(namespace, MANIFEST_FILTER)
            .await
            .map_err(|e| NoSource::Unreachable(e.to_string()))?;
        let found = pick_source(&manifests, layer);
        debug!(namespace, %layer, manifests = manifests.len(), source = ?found, "layer source from containerd's content store");
        let found = found.ok_or(NoSource::NoManifest)?;
        Ok(LayerSource {
            reference: self.reference(namespace, &found).await?,
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
                repositories: vec!["a/b".into(), "c/d".into()],
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
    fn configured_hosts_are_those_of_the_label_host_name() {
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
            configured_hosts("127.0.0.1", &configured),
            vec!["127.0.0.1", "127.0.0.1:5000", "127.0.0.1:5001"]
        );
        assert_eq!(configured_hosts("reg.io", &configured), vec!["reg.io"]);
        assert!(configured_hosts("docker.io", &[]).is_empty());
    }

    #[test]
    fn a_record_decides_else_the_one_configured_host_else_no_guess() {
        let c = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let rec = vec![("127.0.0.1:5001".to_string(), "app".to_string())];
        let use_ = |h: &str, r: &str| HostChoice::Use(h.into(), r.into());
        // Two registries share the host name: only a record says which.
        let two = c(&["127.0.0.1:5000", "127.0.0.1:5001"]);
        assert_eq!(
            choose_host("127.0.0.1", "app", &two, &rec),
            use_("127.0.0.1:5001", "app")
        );
        assert_eq!(
            choose_host("127.0.0.1", "app", &two, &[]),
            HostChoice::Ambiguous(two.clone())
        );
        assert_eq!(
            choose_host("127.0.0.1", "app", &c(&["127.0.0.1:5000"]), &[]),
            use_("127.0.0.1:5000", "app")
        );
        assert_eq!(
            choose_host("reg.io", "app", &[], &[]),
            use_("reg.io", "app")
        );
        // A record wins over the config (it names the registry the image came from).
        assert_eq!(
            choose_host("127.0.0.1", "app", &c(&["127.0.0.1:5000"]), &rec),
            use_("127.0.0.1:5001", "app")
        );
    }

    #[test]
    fn records_name_the_port_of_the_manifest_or_its_index() {
        let m = Digest::sha256(b"m").to_string();
        let idx = Digest::sha256(b"idx");
        let s = ContentSource {
            host: "127.0.0.1".into(),
            repository: "team/app".into(),
            repositories: vec!["team/app".into(), "mirror/app".into()],
            manifest: m.clone(),
        };
        let images: Vec<(String, String, i128)> = vec![
            ("127.0.0.1:5001/team/app:v1".into(), m.clone(), 10),
            // newer, through the index that lists the manifest, another repository of the label
            ("127.0.0.1:5002/mirror/app:v2".into(), idx.to_string(), 20),
            // same manifest, another host name or a repository the label does not name
            ("localhost:5003/team/app:v1".into(), m.clone(), 30),
            ("127.0.0.1:5004/other/app:v1".into(), m.clone(), 40),
            // the CRI's image-id record and another image
            (m.clone(), m.clone(), 50),
            (
                "127.0.0.1:5005/team/app:old".into(),
                "sha256:other".into(),
                60,
            ),
            // the same registry again under another tag: once
            ("127.0.0.1:5001/team/app:v3".into(), m.clone(), 5),
        ];
        let indexes = vec![entry(&idx, 1, &[("containerd.io/gc.ref.content.m.1", &m)])];
        assert_eq!(
            recorded_hosts(&s, &images, &indexes),
            vec![
                ("127.0.0.1:5002".to_string(), "mirror/app".to_string()),
                ("127.0.0.1:5001".to_string(), "team/app".to_string()),
            ]
        );
        assert_eq!(
            recorded_hosts(&s, &images[..1], &[]),
            vec![("127.0.0.1:5001".to_string(), "team/app".to_string())]
        );
        assert!(
            recorded_hosts(&s, &images[1..2], &[]).is_empty(),
            "index unknown"
        );
    }
}
