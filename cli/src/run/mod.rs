//! `weenv run PLAN --image NAME [-- cmd...]`: compose an environment plan on this node —
//! metadata only, nothing written to a registry (read-only credentials suffice) — prepare its
//! layers through the snapshotter (lazily), prepare the container's rootfs snapshot, apply the
//! plan's at-init mutation into it, create the container and its task and start it — all
//! through containerd's gRPC API, no `ctr`, `mount` or `umount` process.
//!
//! Steps (each timed, [`Timings`]), in [`compose_and_start`]: resolve the plan's groups
//! (resolution cache, registry on a miss), compose (concatenate their layers; the manifest and
//! config written into containerd's content store and the image record created, [`image`]),
//! layers (the image's layer snapshots: a weenv layer already on the node under any other
//! stack is reused by digest), then [`create`] (prepare the rootfs snapshot, mount it with
//! `nix` to read the image's users and apply the mutation, build the runtime spec from the
//! image config, create the container and the task) and [`Task::start`]; [`run_plan`] adds
//! [`Task::wait`] / [`Task::remove`]. `--publish` also pushes the composed image to NAME (the
//! old path, for nodes that pull it with stock clients). A mutation that fails
//! (rejected hunk, missing file, failed checkout) removes the snapshot again and returns the
//! error: no container is created and no task is ever started on an unpatched rootfs.

pub mod container;
pub mod image;
pub mod rootfs;
pub mod spec;
pub use spec::Limits;
pub mod stdio;

use crate::pull::{Ctd, PullError, PullReport};
use container::{ContainerRecord, Lifecycle, DEFAULT_RUNTIME};
use oci_spec::image::ImageConfiguration;
use rootfs::{MountedRootfs, RootfsError};
use spec::{
    build_spec, container_labels, parse_mount_spec, spec_any, SpecError, SpecInput, UserDb,
};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use stdio::{StdioMode, TaskIo};
use thiserror::Error;
use weenv_converter::mutate::{apply_mutation_to_dir, MutateError};
use weenv_converter::plan::{parse_ref, publish_composed, resolve_groups, PlanCmdError};
use weenv_converter::resolve_cache::{unix_secs, ResolveCache, ResolvePolicy};
use weenv_env::plan::{compose, Mutation, Plan, PlanError};
use weenv_registry::Client;

/// Errors of `weenv run`.
#[derive(Debug, Error)]
pub enum RunError {
    #[error("reading {path}: {error}")]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("plan {path}: {error}")]
    Plan {
        path: PathBuf,
        error: Box<PlanError>,
    },
    #[error(transparent)]
    Compose(Box<PlanCmdError>),
    #[error("connecting to containerd at {address}: {message}")]
    Connect { address: PathBuf, message: String },
    #[error("composed image config: {0}")]
    Config(String),
    #[error(transparent)]
    Containerd(Box<PullError>),
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error("container rootfs: {0}")]
    Rootfs(#[from] RootfsError),
    #[error("container rootfs: the mount/mutation task failed: {0}")]
    RootfsTask(String),
    #[error("task stdio: {0}")]
    Stdio(std::io::Error),
    #[error("plan reference {reference}: {message}")]
    PlanRef { reference: String, message: String },
    #[error("fetching the patch blob {digest}: {message}")]
    PatchBlob { digest: String, message: String },
    #[error("mutation failed, container {id} not created (its snapshot removed), nothing started: {error}")]
    Mutation { id: String, error: Box<MutateError> },
}

impl From<PlanCmdError> for RunError {
    fn from(e: PlanCmdError) -> Self {
        RunError::Compose(Box::new(e))
    }
}

impl From<PullError> for RunError {
    fn from(e: PullError) -> Self {
        RunError::Containerd(Box::new(e))
    }
}

/// Options of `weenv run`.
#[derive(Clone, Debug)]
pub struct RunOptions {
    pub plan: PathBuf,
    /// Name of the composed image in containerd (a reference: a `blob =` patch is read from
    /// its repository; with `publish`, the composed image is pushed there).
    pub image: String,
    /// Also push the composed manifest and config to `image` (needs push credentials; the
    /// layers are mounted from the groups' repositories). Off: nothing is written to any
    /// registry.
    pub publish: bool,
    pub address: PathBuf,
    pub namespace: String,
    pub snapshotter: String,
    /// containerd runtime (e.g. `io.containerd.weenv.v1`); default containerd's
    /// ([`DEFAULT_RUNTIME`]).
    pub runtime: Option<String>,
    /// Container id (default `weenv-run-<pid>`).
    pub id: Option<String>,
    /// Extra mounts, ctr-style specs (`type=bind,src=/a,dst=/b,options=rbind:rw`).
    pub mounts: Vec<String>,
    /// CPU quota, memory limit and annotations of the container (default: none).
    pub limits: Limits,
    /// Command (default: the image's entrypoint/cmd).
    pub cmd: Vec<String>,
    /// Container labels added to those of the image config (e.g. a service's own state).
    pub labels: HashMap<String, String>,
    /// Keep the container (and its stopped task) after the task exits.
    pub keep: bool,
    /// Where the task's stdio goes; [`StdioMode::Inherit`] also forwards SIGINT/SIGTERM to
    /// the task (like `ctr run`).
    pub stdio: StdioMode,
    pub cache_dir: PathBuf,
    pub policy: ResolvePolicy,
    /// The weenv-snapshotter's endpoint, for verifications of contested chains (see
    /// `crate::trust`); `None`: such a chain fails the run.
    pub daemon: Option<weenv_snapshotter_api::config::ListenAddr>,
}

/// The steps of `weenv run`, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// The plan's group references to manifests (resolution cache, registry on a miss).
    Resolve,
    /// Concatenating the groups into one config and manifest, writing both into containerd's
    /// content store and creating the image record (metadata only).
    Compose,
    /// Publishing the composed manifest and config to the registry (`--publish` only).
    Publish,
    /// The image's layer snapshots through the snapshotter (weenv layers: lazy; a layer on
    /// the node already is reused).
    Layers,
    /// The container's rootfs snapshot (and reading the image's users from it).
    Prepare,
    /// The at-init mutation: mount, read users, apply, unmount.
    Mutate,
    /// Container record and task (shim, `runc create`).
    Create,
    /// `Tasks.Start`.
    Start,
    /// From start until the task exited.
    Exit,
    /// Deleting task, container and snapshot.
    Cleanup,
    /// An environment service handing out a container it created ahead of demand (its
    /// labels updated; the mutation, if any, is its own step).
    Pool,
}

impl Step {
    pub fn name(self) -> &'static str {
        match self {
            Step::Resolve => "resolve",
            Step::Compose => "compose",
            Step::Publish => "publish",
            Step::Layers => "layers",
            Step::Prepare => "prepare",
            Step::Mutate => "mutate",
            Step::Create => "create",
            Step::Start => "start",
            Step::Exit => "exit",
            Step::Cleanup => "cleanup",
            Step::Pool => "pool",
        }
    }
}

/// Wall time per step, in the order recorded.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Timings {
    pub steps: Vec<(Step, Duration)>,
}

impl Timings {
    pub fn record(&mut self, step: Step, d: Duration) {
        self.steps.push((step, d));
    }

    /// Time of `step` (summed if recorded more than once).
    pub fn get(&self, step: Step) -> Option<Duration> {
        let v: Vec<Duration> = self
            .steps
            .iter()
            .filter(|(s, _)| *s == step)
            .map(|(_, d)| *d)
            .collect();
        (!v.is_empty()).then(|| v.iter().sum())
    }

    fn ms(&self, steps: &[Step]) -> f64 {
        steps
            .iter()
            .filter_map(|s| self.get(*s))
            .map(|d| d.as_secs_f64() * 1e3)
            .sum()
    }

    /// `resolve 1.2 ms, compose 0.1 ms, ...`.
    pub fn render(&self) -> String {
        self.steps
            .iter()
            .map(|(s, d)| format!("{} {:.1} ms", s.name(), d.as_secs_f64() * 1e3))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Timings and outcome of a run.
#[derive(Clone, Debug, Default)]
pub struct RunReport {
    pub manifest_digest: String,
    /// Resolve + compose (+ publish).
    pub compose_ms: f64,
    /// The image's layer snapshots.
    pub layers_ms: f64,
    /// Layers committed as remote (lazy) snapshots, applied, already present.
    pub layers: (usize, usize, usize),
    /// Whole at-init mutation step (mount, apply, unmount).
    pub mutation_ms: f64,
    /// The patch/checkout application alone.
    pub mutation_apply_ms: f64,
    pub exit_code: i32,
    pub timings: Timings,
}

/// The patch bytes of an at-init mutation: a file relative to the plan, or a blob.
pub async fn patch_bytes(
    client: &Client,
    m: &Mutation,
    plan_dir: &Path,
    image: &str,
) -> Result<Option<Vec<u8>>, RunError> {
    if let Some(p) = &m.patch {
        let path = plan_dir.join(p);
        return std::fs::read(&path)
            .map(Some)
            .map_err(|source| RunError::Read {
                path,
                error: source,
            });
    }
    if let Some(d) = &m.blob {
        let r = parse_ref(image)?;
        return client
            .get_blob(&r, d)
            .await
            .map(|b| Some(b.to_vec()))
            .map_err(|e| RunError::PatchBlob {
                digest: d.to_string(),
                message: e.to_string(),
            });
    }
    Ok(None)
}

/// What [`create`] creates: one container of a pulled image.
#[derive(Clone, Debug)]
pub struct ContainerRun<'a> {
    pub id: &'a str,
    /// containerd image record name.
    pub image: &'a str,
    pub config: &'a ImageConfiguration,
    /// The image's top chain id (the snapshot parent).
    pub parent: &'a str,
    pub namespace: &'a str,
    pub snapshotter: &'a str,
    pub runtime: &'a str,
    /// Replaces the image's entrypoint + cmd when not empty.
    pub cmd: &'a [String],
    /// ctr-style mount specs.
    pub mounts: &'a [String],
    pub limits: &'a Limits,
    /// Container labels added to the image config's.
    pub labels: &'a HashMap<String, String>,
    /// At-init mutation and its patch bytes.
    pub mutation: Option<(&'a Mutation, Option<&'a [u8]>)>,
    pub stdio: StdioMode,
}

/// A created task (container record, snapshot, stdio).
pub struct Task {
    lc: Lifecycle,
    id: String,
    snapshotter: String,
    io: Option<TaskIo>,
    /// Time the mutation's application took (the patch alone).
    pub mutation_apply: Option<Duration>,
    started: Option<Instant>,
    /// Calls `Tasks.CloseIO` (stdin) once this side's stdin copy ended.
    stdin_closer: Option<tokio::task::JoinHandle<()>>,
}

/// Read `/etc/passwd` and `/etc/group` of a mounted rootfs, resolved inside it.
fn read_users(root: &Path) -> UserDb {
    let read = |rel: &str| -> String {
        use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
        let how = OpenHow::new()
            .flags(OFlag::O_RDONLY | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
        let Ok(dir) = std::fs::File::open(root) else {
            return String::new();
        };
        match openat2(&dir, rel, how) {
            Ok(fd) => std::io::read_to_string(std::fs::File::from(fd)).unwrap_or_default(),
            Err(_) => String::new(),
        }
    };
    UserDb::parse(&read("etc/passwd"), &read("etc/group"))
}

/// Prepare the rootfs snapshot, read the image's users and apply the mutation in it, create
/// the container record and the task. On error everything created is removed again.
pub async fn create(
    ch: tonic::transport::Channel,
    r: &ContainerRun<'_>,
    timings: &mut Timings,
) -> Result<Task, RunError> {
    let mut lc = Lifecycle::new(ch, r.namespace);
    let t = Instant::now();
    lc.begin_lease(format!("weenv-run-{}", r.id)).await?;
    let res = create_leased(&lc, r, timings, t).await;
    let ended = lc.end_lease().await;
    let (io, mutation_apply) = res?;
    if let Err(e) = ended {
        tracing::warn!(error = %e, "could not delete the run lease (it expires in an hour)");
    }
    Ok(Task {
        lc,
        id: r.id.to_string(),
        snapshotter: r.snapshotter.to_string(),
        io: Some(io),
        mutation_apply,
        started: None,
        stdin_closer: None,
    })
}

async fn create_leased(
    lc: &Lifecycle,
    r: &ContainerRun<'_>,
    timings: &mut Timings,
    t: Instant,
) -> Result<(TaskIo, Option<Duration>), RunError> {
    let mounts = lc.prepare_snapshot(r.snapshotter, r.id, r.parent).await?;
    let remove_snapshot = || async {
        if let Err(e) = lc.remove_snapshot(r.snapshotter, r.id).await {
            tracing::warn!(error = %e, id = r.id, "could not remove the container snapshot");
        }
    };
    // The rootfs is mounted once: read-write with a mutation, else read-only (users only).
    let mutate_t = Instant::now();
    if r.mutation.is_none() {
        timings.record(Step::Prepare, t.elapsed());
    }
    // Mounting, the mutation and the unmount (which syncs the upper layer) block: off the
    // async workers, so concurrent starts in one process do not wait on each other.
    let id = r.id.to_string();
    let (mounts_c, mutation) = (
        mounts.clone(),
        r.mutation.map(|(m, p)| (m.clone(), p.map(<[u8]>::to_vec))),
    );
    let mounted =
        tokio::task::spawn_blocking(move || -> Result<(UserDb, Option<Duration>), RunError> {
            let root = MountedRootfs::mount(&mounts_c, mutation.is_none())?;
            let users = read_users(root.path());
            let mut apply = None;
            if let Some((m, patch)) = &mutation {
                let a = Instant::now();
                let res = apply_mutation_to_dir(root.path(), m, patch.as_deref());
                apply = Some(a.elapsed());
                if let Err(error) = res {
                    return Err(RunError::Mutation {
                        id,
                        error: Box::new(error),
                    });
                }
            }
            root.unmount()?;
            Ok((users, apply))
        })
        .await
        .unwrap_or_else(|e| Err(RunError::RootfsTask(e.to_string())));
    let (users, apply) = match mounted {
        Ok(v) => v,
        Err(e) => {
            remove_snapshot().await;
            return Err(e);
        }
    };
    if r.mutation.is_some() {
        timings.record(Step::Prepare, mutate_t.duration_since(t));
        timings.record(Step::Mutate, mutate_t.elapsed());
    }

    let t = Instant::now();
    let built = (|| -> Result<ContainerRecord, RunError> {
        let extra = r
            .mounts
            .iter()
            .map(|m| parse_mount_spec(m))
            .collect::<Result<Vec<_>, _>>()?;
        let spec = build_spec(
            r.config,
            &SpecInput {
                namespace: r.namespace,
                id: r.id,
                cmd: r.cmd,
                mounts: extra,
                users,
                limits: r.limits.clone(),
            },
        )?;
        Ok(ContainerRecord {
            id: r.id.to_string(),
            image: r.image.to_string(),
            snapshotter: r.snapshotter.to_string(),
            runtime: r.runtime.to_string(),
            labels: {
                let mut l = container_labels(r.config);
                l.extend(r.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
                l
            },
            spec: spec_any(&spec)?,
        })
    })();
    let record = match built {
        Ok(rec) => rec,
        Err(e) => {
            remove_snapshot().await;
            return Err(e);
        }
    };
    if let Err(e) = lc.create_container(&record).await {
        remove_snapshot().await;
        return Err(e.into());
    }
    let created = async {
        let mut io = TaskIo::new(r.stdio, r.id).map_err(RunError::Stdio)?;
        let res = lc.create_task(r.id, mounts.clone(), &io.paths).await;
        io.created();
        res?;
        Ok::<_, RunError>(io)
    }
    .await;
    match created {
        Ok(io) => {
            timings.record(Step::Create, t.elapsed());
            Ok((io, apply))
        }
        Err(e) => {
            let _ = lc.delete_container(r.id).await;
            remove_snapshot().await;
            Err(e)
        }
    }
}

impl Task {
    pub fn id(&self) -> &str {
        &self.id
    }

    pub async fn start(&mut self, timings: &mut Timings) -> Result<(), RunError> {
        let t = Instant::now();
        self.lc.start_task(&self.id).await?;
        timings.record(Step::Start, t.elapsed());
        // The shim keeps a writer on the stdin FIFO open: the process sees EOF only after
        // `CloseIO`, which goes out once this side's stdin ended (ctr does the same).
        if let Some(done) = self.io.as_mut().and_then(TaskIo::take_stdin_done) {
            let (lc, id) = (self.lc.clone(), self.id.clone());
            self.stdin_closer = Some(tokio::spawn(async move {
                if done.await.is_ok() {
                    if let Err(e) = lc.close_stdin(&id).await {
                        tracing::warn!(error = %e, "closing the task's stdin");
                    }
                }
            }));
        }
        self.started = Some(Instant::now());
        Ok(())
    }

    /// Wait for the task to exit (forwarding SIGINT/SIGTERM to it if `forward_signals`) and
    /// for its output to be copied out; the exit status.
    pub async fn wait(
        &mut self,
        forward_signals: bool,
        timings: &mut Timings,
    ) -> Result<i32, RunError> {
        let status = if forward_signals {
            use tokio::signal::unix::{signal, SignalKind};
            let mut int = signal(SignalKind::interrupt()).map_err(RunError::Stdio)?;
            let mut term = signal(SignalKind::terminate()).map_err(RunError::Stdio)?;
            let wait = self.lc.wait_task(&self.id);
            tokio::pin!(wait);
            loop {
                let sig = tokio::select! {
                    r = &mut wait => break r?,
                    _ = int.recv() => nix::sys::signal::Signal::SIGINT,
                    _ = term.recv() => nix::sys::signal::Signal::SIGTERM,
                };
                if let Err(e) = self.lc.kill_task(&self.id, sig as u32).await {
                    tracing::warn!(error = %e, "forwarding {sig} to the task");
                }
            }
        } else {
            self.lc.wait_task(&self.id).await?
        };
        if let Some(c) = self.stdin_closer.take() {
            c.abort();
        }
        if let Some(io) = self.io.take() {
            io.finish(Duration::from_secs(10)).await;
        }
        if let Some(s) = self.started {
            timings.record(Step::Exit, s.elapsed());
        }
        Ok(status as i32)
    }

    /// Delete the task, the container and its snapshot.
    pub async fn remove(self, timings: &mut Timings) -> Result<(), RunError> {
        let t = Instant::now();
        let task = self.lc.delete_task(&self.id).await;
        let container = self.lc.delete_container(&self.id).await;
        let snapshot = self.lc.remove_snapshot(&self.snapshotter, &self.id).await;
        timings.record(Step::Cleanup, t.elapsed());
        task?;
        container?;
        snapshot?;
        Ok(())
    }
}

/// A started environment ([`compose_and_start`]).
pub struct Started {
    pub task: Task,
    /// Manifest digest of the composed image.
    pub manifest_digest: String,
    /// Layers committed as remote (lazy) snapshots, applied, already present.
    pub layers: (usize, usize, usize),
}

/// A parsed plan, the directory its relative paths are read from, and optionally the patch of
/// its at-init mutation given as bytes (a task's patch sent by a caller rather than a file
/// beside the plan).
#[derive(Clone, Debug)]
pub struct PlanInput {
    pub plan: Plan,
    pub dir: PathBuf,
    /// The mutation's patch bytes; `None`: the plan's `patch =` file or `blob =`.
    pub patch: Option<Vec<u8>>,
}

impl PlanInput {
    /// Read and parse the plan file `path` (relative patch paths: beside it).
    /// `arg` as `weenv run` and the environment service take it: a plan file if one exists
    /// at that path, otherwise a plan reference (`weenv-convert plan publish`) fetched from its
    /// registry — the plan a pod's `image:` names runs the same way here.
    pub async fn from_arg(client: &Client, arg: &Path) -> Result<PlanInput, RunError> {
        let s = arg.to_string_lossy();
        if arg.exists() || !looks_like_reference(&s) {
            return PlanInput::load(arg);
        }
        PlanInput::fetch(client, &s).await
    }

    /// The plan of the plan artifact `reference` names: its config blob (the plan) and its
    /// patch blob from the artifact's repository. An image that is not a plan artifact is an
    /// error that says so (run it with `ctr run` / `weenv pull`).
    pub async fn fetch(client: &Client, reference: &str) -> Result<PlanInput, RunError> {
        let bad = |message: String| RunError::PlanRef {
            reference: reference.to_string(),
            message,
        };
        let r = parse_ref(reference)?;
        let m = client
            .get_manifest(&r)
            .await
            .map_err(|e| bad(format!("fetching the manifest: {e}")))?;
        let artifact = weenv_env::group::parse_manifest(&m.bytes)
            .map_err(|e| bad(format!("not an OCI manifest: {e}")))?;
        if !weenv_env::plan_ref::is_plan(&artifact) {
            return Err(bad(format!(
                "not a plan artifact (config media type {:?}); publish one with `weenv-convert \
                 plan publish`, or run an image with `ctr run`",
                artifact.config.media_type
            )));
        }
        let config = client
            .get_blob(&r, &artifact.config.digest)
            .await
            .map_err(|e| bad(format!("fetching the plan config: {e}")))?;
        let (plan, patch) = weenv_env::plan_ref::parse_plan_config(&artifact, &config)
            .map_err(|e| bad(e.to_string()))?;
        let patch = match patch {
            Some(d) => Some(
                client
                    .get_blob(&r, &d.digest)
                    .await
                    .map_err(|e| bad(format!("fetching the patch: {e}")))?
                    .to_vec(),
            ),
            None => None,
        };
        Ok(PlanInput {
            plan,
            dir: PathBuf::from("."),
            patch,
        })
    }

    pub fn load(path: &Path) -> Result<PlanInput, RunError> {
        let text = std::fs::read_to_string(path).map_err(|source| RunError::Read {
            path: path.to_path_buf(),
            error: source,
        })?;
        let plan = Plan::parse(&text).map_err(|source| RunError::Plan {
            path: path.to_path_buf(),
            error: Box::new(source),
        })?;
        Ok(PlanInput {
            plan,
            dir: path.parent().unwrap_or(Path::new(".")).to_path_buf(),
            patch: None,
        })
    }
}

/// True if `s` reads as an image reference rather than a file name: a registry host (with a
/// dot or a port, or `localhost`) before the first `/` (pure).
pub fn looks_like_reference(s: &str) -> bool {
    let Some((host, rest)) = s.split_once('/') else {
        return false;
    };
    !rest.is_empty()
        && !s.ends_with(".toml")
        && (host.contains('.') || host.contains(':') || host == "localhost")
        && !host.starts_with('.')
}

/// Resolve the plan's groups, compose them on this node (content store + image record, no
/// registry write unless `o.publish`), prepare the layers, create the container with the
/// at-init mutation applied and start its task. The library call of `weenv run` (the plan
/// read from `o.plan`).
pub async fn compose_and_start(
    client: &Client,
    ch: tonic::transport::Channel,
    o: &RunOptions,
    tm: &mut Timings,
) -> Result<Started, RunError> {
    let input = PlanInput::from_arg(client, &o.plan).await?;
    compose_and_start_plan(client, ch, o, &input, None, tm).await
}

/// The images a long-running process (an environment service) installed on the node: per
/// (image record, snapshotter) the layers of the last install, so the next start of the same
/// composed image (same manifest digest) skips writing content, the record and the layer
/// snapshots — tens of containerd metadata transactions. Concurrent starts of one image
/// wait for its first install.
#[derive(Default)]
pub struct InstalledImages {
    slots: std::sync::Mutex<HashMap<(String, String), InstallSlot>>,
}

/// One image's last install (`None`: not installed, or forgotten); held while installing.
type InstallSlot = Arc<tokio::sync::Mutex<Option<PullReport>>>;

impl InstalledImages {
    fn slot(&self, image: &str, snapshotter: &str) -> InstallSlot {
        self.slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry((image.to_string(), snapshotter.to_string()))
            .or_default()
            .clone()
    }

    /// Forget every install (e.g. after images were removed).
    pub fn clear(&self) {
        self.slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clear();
    }
}

/// [`compose_and_start`] of a plan already parsed (`o.plan` is not read); with
/// `installed_cache`, an image installed before by this process is not installed again.
pub async fn compose_and_start_plan(
    client: &Client,
    ch: tonic::transport::Channel,
    o: &RunOptions,
    input: &PlanInput,
    installed_cache: Option<&InstalledImages>,
    tm: &mut Timings,
) -> Result<Started, RunError> {
    let plan = &input.plan;
    let t = Instant::now();
    let mut cache = ResolveCache::load(&o.cache_dir);
    let now = unix_secs(SystemTime::now());
    let groups = resolve_groups(client, &plan.group_refs(), &mut cache, now, o.policy).await?;
    if let Err(e) = cache.save() {
        tracing::warn!(error = %e, "could not save the resolution cache");
    }
    tm.record(Step::Resolve, t.elapsed());
    let t = Instant::now();
    let composed = compose(&groups, plan).map_err(PlanCmdError::from)?;
    let config: ImageConfiguration = serde_json::from_slice(&composed.config_json)
        .map_err(|e| RunError::Config(e.to_string()))?;
    let compose_t = t.elapsed();
    if o.publish {
        let t = Instant::now();
        publish_composed(client, &groups, &composed, &parse_ref(&o.image)?).await?;
        tm.record(Step::Publish, t.elapsed());
    }

    let id = run_id(o);
    // The image of these groups installed by this process before (`installed`): its record,
    // content and layer snapshots are there, so only the container is made. One install per
    // image at a time; the others wait for it and use it.
    let slot = installed_cache.map(|c| c.slot(&o.image, &o.snapshotter));
    let mut held = match &slot {
        Some(s) => Some(s.lock().await),
        None => None,
    };
    let hit = held
        .as_deref()
        .and_then(Option::as_ref)
        .filter(|l: &&PullReport| l.manifest == composed.manifest_digest.as_str())
        .cloned();
    let l = match hit {
        Some(mut l) => {
            tm.record(Step::Compose, compose_t);
            tm.record(Step::Layers, Duration::ZERO);
            // every layer is on the node already
            l.present_layers += l.remote_layers + l.applied_layers;
            (l.remote_layers, l.applied_layers) = (0, 0);
            l
        }
        None => {
            let mut c = Ctd::new(ch.clone(), &o.namespace).with_daemon(o.daemon.clone());
            let group_blobs = image::group_blobs(&groups, |d| cache.blob(d))?;
            let installed = image::store_and_prepare(
                client,
                &mut c,
                &o.image,
                image::Groups {
                    resolved: &groups,
                    blobs: &group_blobs,
                },
                &composed,
                &o.snapshotter,
                format!("weenv-run-image-{id}"),
            )
            .await?;
            tm.record(Step::Compose, compose_t + installed.store);
            tm.record(Step::Layers, installed.prepare);
            tracing::debug!(
                digest = %composed.manifest_digest,
                image = %o.image,
                compose_ms = compose_t.as_secs_f64() * 1e3,
                store_ms = installed.store.as_secs_f64() * 1e3,
                "composed on the node"
            );
            if let Some(h) = held.as_deref_mut() {
                *h = Some(installed.layers.clone());
            }
            installed.layers
        }
    };
    drop(held);

    // Read the patch before creating anything.
    let patch = match (&input.patch, plan.init_mutation()) {
        (Some(p), _) => Some(p.clone()),
        (None, Some(m)) => patch_bytes(client, m, &input.dir, &o.image).await?,
        (None, None) => None,
    };
    let task = create_and_start(
        ch,
        o,
        &id,
        &config,
        &l.top_chain_id,
        plan.init_mutation().map(|m| (m, patch.as_deref())),
        tm,
    )
    .await;
    let task = match (task, &slot) {
        (Ok(t), _) => t,
        // The installed image went away under us (its record removed, the snapshots
        // collected): forget it; the next start installs it again.
        (Err(e), Some(s)) => {
            *s.lock().await = None;
            return Err(e);
        }
        (Err(e), None) => return Err(e),
    };
    Ok(Started {
        task,
        manifest_digest: composed.manifest_digest.to_string(),
        layers: (l.remote_layers, l.applied_layers, l.present_layers),
    })
}

fn run_id(o: &RunOptions) -> String {
    o.id.clone()
        .unwrap_or_else(|| format!("weenv-run-{}", std::process::id()))
}

/// [`create`] then [`Task::start`] (the container removed again if the start fails).
async fn create_and_start(
    ch: tonic::transport::Channel,
    o: &RunOptions,
    id: &str,
    config: &ImageConfiguration,
    parent: &str,
    mutation: Option<(&Mutation, Option<&[u8]>)>,
    tm: &mut Timings,
) -> Result<Task, RunError> {
    let run = ContainerRun {
        id,
        image: &o.image,
        config,
        parent,
        namespace: &o.namespace,
        snapshotter: &o.snapshotter,
        runtime: o.runtime.as_deref().unwrap_or(DEFAULT_RUNTIME),
        cmd: &o.cmd,
        mounts: &o.mounts,
        limits: &o.limits,
        labels: &o.labels,
        mutation,
        stdio: o.stdio,
    };
    let mut task = create(ch, &run, tm).await?;
    if let Err(e) = task.start(tm).await {
        if let Err(e) = task.remove(tm).await {
            tracing::warn!(error = %e, "cleaning up the container");
        }
        return Err(e);
    }
    Ok(task)
}

/// Pull the image `o.image` (as `weenv pull` does, into `o.snapshotter`: lazy for weenv
/// layers), then create and start a container of it as [`compose_and_start`] does, with an
/// optional at-init mutation (`mutation` and its patch bytes) applied into its rootfs.
pub async fn pull_and_start(
    client: &Client,
    ch: tonic::transport::Channel,
    o: &RunOptions,
    mutation: Option<(&Mutation, &[u8])>,
    tm: &mut Timings,
) -> Result<Started, RunError> {
    let t = Instant::now();
    let opts = crate::pull::PullOptions {
        namespace: o.namespace.clone(),
        snapshotter: o.snapshotter.clone(),
        platform: None,
        image_name: None,
        daemon: o.daemon.clone(),
    };
    let rep = crate::pull::pull(client, ch.clone(), &o.image, &opts, &|_| {}).await?;
    tm.record(Step::Layers, t.elapsed());
    let config: ImageConfiguration =
        serde_json::from_slice(&rep.config_json).map_err(|e| RunError::Config(e.to_string()))?;
    let id = run_id(o);
    let mut o = o.clone();
    o.image.clone_from(&rep.image);
    let task = create_and_start(
        ch,
        &o,
        &id,
        &config,
        &rep.top_chain_id,
        mutation.map(|(m, p)| (m, Some(p))),
        tm,
    )
    .await?;
    Ok(Started {
        task,
        manifest_digest: rep.manifest,
        layers: (rep.remote_layers, rep.applied_layers, rep.present_layers),
    })
}

/// A channel to containerd at `address` (for [`compose_and_start`]; one serves many starts).
pub async fn connect(address: &Path) -> Result<tonic::transport::Channel, RunError> {
    containerd_client::connect(address)
        .await
        .map_err(|e| RunError::Connect {
            address: address.to_path_buf(),
            message: e.to_string(),
        })
}

/// [`compose_and_start`], then wait for the task and (unless `o.keep`) remove it. Returns the
/// task's exit code and the timings.
pub async fn run_plan(client: &Client, o: &RunOptions) -> Result<RunReport, RunError> {
    let ch = connect(&o.address).await?;
    let mut timings = Timings::default();
    let tm = &mut timings;
    let Started {
        mut task,
        manifest_digest,
        layers,
    } = compose_and_start(client, ch, o, tm).await?;
    let mut report = RunReport {
        manifest_digest,
        layers,
        ..Default::default()
    };
    report.mutation_apply_ms = task
        .mutation_apply
        .map(|d| d.as_secs_f64() * 1e3)
        .unwrap_or(0.0);
    let outcome = task.wait(o.stdio == StdioMode::Inherit, tm).await;
    if !o.keep {
        if let Err(e) = task.remove(tm).await {
            tracing::warn!(error = %e, "cleaning up the container");
        }
    }
    report.exit_code = outcome?;
    report.compose_ms = timings.ms(&[Step::Resolve, Step::Compose, Step::Publish]);
    report.layers_ms = timings.ms(&[Step::Layers]);
    report.mutation_ms = timings.ms(&[Step::Mutate]);
    report.timings = timings;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::looks_like_reference;

    #[test]
    fn plan_arguments_are_files_unless_they_name_a_registry() {
        for r in [
            "registry.example.com/weenv/plans:flask-4711",
            "127.0.0.1:5000/plans:t1",
            "localhost/plans@sha256:0000",
        ] {
            assert!(looks_like_reference(r), "{r}");
        }
        for f in [
            "plan.toml",
            "plans/flask.toml",
            "./plans/x",
            "../x/y",
            "/abs/plan",
            "dir.d/plan.toml",
            "host.example.com/",
        ] {
            assert!(!looks_like_reference(f), "{f}");
        }
    }
}
