//! The gRPC service: validation, the create fan-out, exec / sessions / files on running
//! environments, inspection, delete, reconcile at start, TTL and garbage collection.

use crate::error::EnvdError;
use crate::exec::{self, RunParams, DEFAULT_OUTPUT_LIMIT, MAX_OUTPUT_LIMIT};
use crate::files;
use crate::pool::{self, Demand, PoolKey, POOL_LABEL};
use crate::proto::envd_server::Envd;
use crate::proto::*;
use crate::session::Session;
use crate::state::{labels, random_hex, set_state, unix_now, Env, Events};
use containerd_client::services::v1::containers_client::ContainersClient;
use containerd_client::services::v1::tasks_client::TasksClient;
use containerd_client::services::v1::{
    Container, GetContainerRequest, GetRequest as GetTaskRequest, ListContainersRequest,
    UpdateContainerRequest,
};
use futures::StreamExt;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use weenv_cli::pull::Ctd;
use weenv_cli::run::container::Lifecycle;
use weenv_cli::run::{self as run, PlanInput, RunOptions, Timings};
use weenv_converter::resolve_cache::ResolvePolicy;
use weenv_env::plan::{Mutation, MutationMode, Plan};

/// The default long-lived init: a shell that sleeps until it is signalled.
pub const DEFAULT_INIT: &[&str] = &[
    "/bin/sh",
    "-c",
    "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done",
];

/// Settings of the service.
#[derive(Clone, Debug)]
pub struct Config {
    pub namespace: String,
    pub snapshotter: String,
    pub runtime: String,
    /// FIFOs of execs and sessions, the resolution cache.
    pub state_dir: PathBuf,
    pub default_ttl: Duration,
    pub max_ttl: Duration,
    pub gc_interval: Duration,
    /// Given: every environment's `io.weenv.status.dir` / `io.weenv.ledger.dir` annotation
    /// (else the shim's defaults, `/run/weenv/status`, `/run/weenv/ledger`).
    pub shim_status_dir: Option<PathBuf>,
    pub shim_ledger_dir: Option<PathBuf>,
    pub policy: ResolvePolicy,
    /// Creations run at once when a request does not say.
    pub parallelism: usize,
    /// The weenv daemon's endpoint (verifications of contested chains, as `weenv run`).
    pub daemon: Option<weenv_snapshotter_api::config::ListenAddr>,
    /// Spares kept per pool key at most (0: no pool; see [`crate::pool`]).
    pub pool: usize,
}

/// How long an exec waits for a launcher on its way before starting its own process.
const LAUNCHER_WAIT: Duration = Duration::from_secs(5);

/// Spares created at once.
const POOL_FILL_PARALLELISM: usize = 2;

/// The warm pool's state ([`crate::pool`]).
#[derive(Default)]
struct PoolState {
    keys: HashMap<String, PoolEntry>,
    /// The last create request (refills wait until creates were quiet).
    last_create: Option<Instant>,
}

#[derive(Default)]
struct PoolEntry {
    spares: Vec<Spare>,
    /// Spares being created.
    filling: usize,
    demand: Demand,
    /// How to make one (the latest request of the key).
    recipe: Option<SpareRecipe>,
}

/// A running container of the pool, not yet an environment.
struct Spare {
    id: String,
    pid: u32,
    /// Its init's start time ([`pool::start_time`]), against a reused pid.
    started: u64,
    /// Its first launcher ([`exec::LAUNCHER`]), started with it, and that one's variables.
    launcher: Option<exec::Started>,
    launcher_env: BTreeMap<String, String>,
    process: Option<serde_json::Value>,
    snapshotter: String,
}

#[derive(Clone)]
struct SpareRecipe {
    o: RunOptions,
    /// The plan without its at-init mutation (applied at the claim).
    plan: Option<PlanInput>,
    name: String,
    /// The environment variables of the spare's first launcher.
    env: HashMap<String, String>,
}

/// The shim's status directory of `ns/id`.
fn shim_status_path(cfg: &Config, id: &str) -> PathBuf {
    cfg.shim_status_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from("/run/weenv/status"))
        .join(&cfg.namespace)
        .join(id)
}

/// The shim's cause when it ended the task (`status.json` state `terminated`).
fn shim_cause(cfg: &Config, id: &str) -> Option<String> {
    let text = std::fs::read_to_string(shim_status_path(cfg, id).join("status.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    (v["state"] == "terminated").then(|| {
        v["reason"]
            .as_str()
            .unwrap_or("terminated by the weenv shim")
            .to_string()
    })
}

pub struct Service {
    cfg: Config,
    ch: tonic::transport::Channel,
    registry: weenv_registry::Client,
    envs: Mutex<HashMap<String, Arc<Env>>>,
    events: Events,
    pool: Mutex<PoolState>,
    /// Images installed by this process (a plan's next environment skips the install).
    installed: run::InstalledImages,
}

type Stream<T> = Pin<Box<dyn futures::Stream<Item = Result<T, Status>> + Send + 'static>>;

fn invalid(msg: impl Into<String>) -> EnvdError {
    EnvdError::InvalidArgument(msg.into())
}

impl Service {
    pub fn new(
        cfg: Config,
        ch: tonic::transport::Channel,
        registry: weenv_registry::Client,
    ) -> Result<Arc<Service>, EnvdError> {
        std::fs::create_dir_all(cfg.state_dir.join("io")).map_err(EnvdError::io(format!(
            "creating the state directory {}",
            cfg.state_dir.display()
        )))?;
        Ok(Arc::new(Service {
            cfg,
            ch,
            registry,
            envs: Mutex::new(HashMap::new()),
            events: Events::default(),
            pool: Mutex::new(PoolState::default()),
            installed: Default::default(),
        }))
    }

    fn lc(&self) -> Lifecycle {
        Lifecycle::new(self.ch.clone(), &self.cfg.namespace)
    }

    fn ctd(&self) -> Ctd {
        Ctd::new(self.ch.clone(), &self.cfg.namespace)
    }

    fn io_dir(&self) -> PathBuf {
        self.cfg.state_dir.join("io")
    }

    fn get(&self, id: &str) -> Result<Arc<Env>, EnvdError> {
        self.envs
            .lock()
            .get(id)
            .cloned()
            .ok_or_else(|| EnvdError::NoEnv(id.to_string()))
    }

    /// The environment, running (else why not).
    fn running(&self, id: &str) -> Result<Arc<Env>, EnvdError> {
        let env = self.get(id)?;
        let (state, cause) = env.state();
        if state != EnvState::Running {
            return Err(EnvdError::NotRunning {
                id: id.to_string(),
                state: state.as_str_name().to_lowercase(),
                cause,
            });
        }
        Ok(env)
    }

    /// Find every environment of a previous run of the service again (container labels) and
    /// see whether its task still runs.
    pub async fn reconcile(self: &Arc<Self>) -> Result<usize, EnvdError> {
        let stale = self.remove_stale_spares().await?;
        if stale > 0 {
            tracing::info!(stale, "removed the pooled environments of a previous run");
        }
        let list = self
            .list_containers(format!("labels.\"{}\"==1", labels::MANAGED))
            .await?;
        let mut n = 0;
        for ct in list {
            let runtime = ct
                .runtime
                .as_ref()
                .map(|r| r.name.clone())
                .unwrap_or_default();
            let Some(env) = Env::from_labels(&ct.id, &ct.labels, &ct.snapshotter, &runtime) else {
                continue;
            };
            let env = Arc::new(env);
            *env.process.lock() = ct
                .spec
                .as_ref()
                .and_then(|s| serde_json::from_slice::<serde_json::Value>(&s.value).ok())
                .map(|v| v["process"].clone());
            self.envs.lock().insert(env.id.clone(), env.clone());
            n += 1;
            match self.task_state(&env.id).await {
                Some((2, pid, _)) => {
                    env.pid.store(pid, Ordering::Relaxed);
                    set_state(
                        &env,
                        &self.events,
                        EnvState::Running,
                        "found again at service start",
                    );
                    self.watch(env.clone());
                }
                Some((_, _, exit)) => {
                    let (s, cause) = self.exit_cause(&env.id, exit);
                    set_state(&env, &self.events, s, cause);
                }
                None => set_state(
                    &env,
                    &self.events,
                    EnvState::Failed,
                    "its task is gone (containerd or the node restarted); delete it",
                ),
            }
        }
        Ok(n)
    }

    /// The namespace's containers matching `filter`.
    async fn list_containers(&self, filter: String) -> Result<Vec<Container>, EnvdError> {
        let c = self.ctd();
        Ok(ContainersClient::new(c.channel())
            .list(c.req(ListContainersRequest {
                filters: vec![filter],
            }))
            .await
            .map_err(|status| weenv_cli::pull::PullError::Containerd {
                op: "container list",
                status,
            })?
            .into_inner()
            .containers)
    }

    /// (containerd task status, pid, exit status) of the init, `None` without a task.
    async fn task_state(&self, id: &str) -> Option<(i32, u32, u32)> {
        let c = self.ctd();
        let r = TasksClient::new(c.channel())
            .get(c.req(GetTaskRequest {
                container_id: id.to_string(),
                exec_id: String::new(),
            }))
            .await
            .ok()?
            .into_inner();
        let p = r.process?;
        Some((p.status, p.pid, p.exit_status))
    }

    /// The state and cause of an init that exited with `status`.
    fn exit_cause(&self, id: &str, status: u32) -> (EnvState, String) {
        if let Some(reason) = shim_cause(&self.cfg, id) {
            return (EnvState::Failed, reason);
        }
        match status {
            0 => (EnvState::Exited, "the init exited with status 0".into()),
            137 => (
                EnvState::Failed,
                "the init was killed (SIGKILL, exit 137: the kernel's OOM killer at a fixed limit, or a kill)"
                    .into(),
            ),
            s => (EnvState::Failed, format!("the init exited with status {s}")),
        }
    }

    /// Wait for the init in the background; its end becomes the state with its cause.
    fn watch(self: &Arc<Self>, env: Arc<Env>) {
        let me = self.clone();
        tokio::spawn(async move {
            match me.lc().wait_task(&env.id).await {
                Ok(status) => {
                    if env.state().0 == EnvState::Deleted {
                        return;
                    }
                    // The shim writes its reason as it ends the task: give it a moment.
                    if status != 0 {
                        for _ in 0..30 {
                            if shim_cause(&me.cfg, &env.id).is_some() {
                                break;
                            }
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    }
                    let (s, cause) = me.exit_cause(&env.id, status);
                    set_state(&env, &me.events, s, cause);
                    for s in take_sessions(&env) {
                        s.close_now().await;
                    }
                }
                Err(e) => {
                    tracing::warn!(env = %env.id, error = %e, "waiting for an environment's init")
                }
            }
        });
    }

    /// Delete environments past their time to live; run every `gc_interval`.
    pub fn spawn_gc(self: &Arc<Self>) {
        let me = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(me.cfg.gc_interval);
            loop {
                tick.tick().await;
                let now = unix_now();
                let expired: Vec<String> = me
                    .envs
                    .lock()
                    .values()
                    .filter(|e| e.expires_at > 0 && e.expires_at <= now)
                    .filter(|e| e.state().0 != EnvState::Creating)
                    .map(|e| e.id.clone())
                    .collect();
                for id in expired {
                    if let Err(e) = me.delete_one(&id, "time to live expired").await {
                        tracing::warn!(env = %id, error = %e, "deleting an expired environment");
                    }
                }
            }
        });
    }

    /// Kill, delete task, container and snapshot; forget it.
    pub async fn delete_one(&self, id: &str, cause: &str) -> Result<(), EnvdError> {
        let env = self.get(id)?;
        set_state(
            &env,
            &self.events,
            EnvState::Deleted,
            format!("deleting: {cause}"),
        );
        for s in take_sessions(&env) {
            s.close_now().await;
        }
        drop(env.launcher.lock().take());
        let res = self.teardown(id, &env.snapshotter).await;
        self.envs.lock().remove(id);
        res?;
        self.events.emit(id, EnvState::Deleted, cause);
        Ok(())
    }

    /// One environment of a Create request.
    async fn create_one(self: &Arc<Self>, spec: EnvSpec) -> (Result<EnvInfo, EnvdError>, Timings) {
        let mut tm = Timings::default();
        let res = self.create_inner(spec, &mut tm).await;
        (res, tm)
    }

    async fn create_inner(
        self: &Arc<Self>,
        spec: EnvSpec,
        tm: &mut Timings,
    ) -> Result<EnvInfo, EnvdError> {
        let source = spec
            .source
            .clone()
            .ok_or_else(|| invalid("no source: give plan_path, plan_toml, groups or image"))?;
        let name = if spec.name.is_empty() {
            "env"
        } else {
            spec.name.as_str()
        };
        if name.len() > 40
            || !name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return Err(invalid(format!(
                "name {name:?}: use at most 40 characters of [a-z0-9-]"
            )));
        }
        let r = spec.resources.unwrap_or_default();
        if r.cpus < 0.0 || r.memory_bytes < 0 || r.cpu_max < 0.0 || r.memory_max_bytes < 0 {
            return Err(invalid("resources must not be negative"));
        }
        let ttl = if spec.ttl_seconds == 0 {
            self.cfg.default_ttl
        } else {
            Duration::from_secs(spec.ttl_seconds)
        };
        if ttl > self.cfg.max_ttl {
            return Err(invalid(format!(
                "ttl_seconds {} is above the service's maximum {} s",
                ttl.as_secs(),
                self.cfg.max_ttl.as_secs()
            )));
        }
        let now = unix_now();
        let (plan_input, source_text) = match &source {
            env_spec::Source::PlanPath(p) => {
                // A plan file on the node, or a plan reference (fetched like `weenv run`).
                let input = PlanInput::from_arg(&self.registry, Path::new(p)).await?;
                (Some(input), format!("plan {p}"))
            }
            env_spec::Source::PlanToml(t) => {
                let plan = Plan::parse(t).map_err(|e| invalid(format!("plan_toml: {e}")))?;
                let dir = if spec.plan_dir.is_empty() {
                    "."
                } else {
                    spec.plan_dir.as_str()
                };
                (
                    Some(PlanInput {
                        plan,
                        dir: PathBuf::from(dir),
                        patch: None,
                    }),
                    "inline plan".to_string(),
                )
            }
            env_spec::Source::Groups(g) => {
                let plan = Plan {
                    version: weenv_env::plan::PLAN_VERSION,
                    groups: g.refs.clone(),
                    mutation: None,
                    config: Default::default(),
                };
                plan.validate()
                    .map_err(|e| invalid(format!("groups: {e}")))?;
                (
                    Some(PlanInput {
                        plan,
                        dir: PathBuf::from("."),
                        patch: None,
                    }),
                    format!("groups {}", g.refs.join(",")),
                )
            }
            env_spec::Source::Image(i) => {
                if i.is_empty() {
                    return Err(invalid("image: empty reference"));
                }
                (None, format!("image {i}"))
            }
        };
        let task_mutation = spec.task.as_ref().filter(|t| !t.patch.is_empty()).map(|t| {
            (
                Mutation {
                    mode: MutationMode::Init,
                    patch: None,
                    blob: None,
                    checkout: None,
                    root: if t.root.is_empty() {
                        "/".into()
                    } else {
                        t.root.clone()
                    },
                    strip: match t.strip {
                        0 => 1,
                        s if s < 0 => 0,
                        s => s as u32,
                    },
                    group: None,
                },
                t.patch.clone(),
            )
        });
        // One image record per composed image (the plan's groups and config; the task's
        // mutation is applied at init and does not change it), kept after its environments:
        // it holds the image's layer snapshots, so the next environment of the plan starts warm.
        let image_record = match &plan_input {
            None => String::new(),
            Some(input) => {
                use sha2::Digest;
                let key = serde_json::to_string(&(&input.plan.groups, &input.plan.config))
                    .unwrap_or_default();
                let h = hex::encode(sha2::Sha256::digest(key.as_bytes()));
                format!("weenv.local/envd/plan:{}", &h[..24])
            }
        };
        let snapshotter = if spec.snapshotter.is_empty() {
            self.cfg.snapshotter.clone()
        } else {
            spec.snapshotter.clone()
        };
        let runtime = if spec.runtime.is_empty() {
            self.cfg.runtime.clone()
        } else {
            spec.runtime.clone()
        };
        let new_env = |id: String| {
            Arc::new(Env {
                id,
                created_at: now,
                expires_at: now + ttl.as_secs() as i64,
                source: source_text.clone(),
                snapshotter: snapshotter.clone(),
                runtime: runtime.clone(),
                user_labels: spec.labels.clone().into_iter().collect(),
                env: spec.env.clone().into_iter().collect(),
                image_record: image_record.clone(),
                state: Mutex::new((EnvState::Creating, String::new())),
                pid: Default::default(),
                process: Mutex::new(None),
                sessions: Mutex::new(HashMap::new()),
                running_execs: Default::default(),
                exec_seq: Default::default(),
                launcher: Mutex::new(None),
                launcher_pending: Default::default(),
                launcher_ready: Default::default(),
            })
        };

        let mut annotations = BTreeMap::new();
        if r.cpu_max > 0.0 {
            annotations.insert("io.weenv.cpu.max".to_string(), r.cpu_max.to_string());
        }
        if r.memory_max_bytes > 0 {
            annotations.insert(
                "io.weenv.memory.max".to_string(),
                r.memory_max_bytes.to_string(),
            );
        }
        if r.fixed {
            annotations.insert("io.weenv.elastic".to_string(), "false".to_string());
        }
        if let Some(d) = &self.cfg.shim_status_dir {
            annotations.insert("io.weenv.status.dir".into(), d.display().to_string());
        }
        if let Some(d) = &self.cfg.shim_ledger_dir {
            annotations.insert("io.weenv.ledger.dir".into(), d.display().to_string());
        }
        let mut o = RunOptions {
            plan: PathBuf::new(),
            image: match &source {
                env_spec::Source::Image(i) => i.clone(),
                _ => image_record.clone(),
            },
            publish: false,
            address: PathBuf::new(),
            namespace: self.cfg.namespace.clone(),
            snapshotter: snapshotter.clone(),
            runtime: Some(runtime.clone()),
            id: None,
            mounts: spec.mounts.clone(),
            limits: run::Limits {
                cpus: (r.cpus > 0.0).then_some(r.cpus),
                memory_bytes: (r.memory_bytes > 0).then_some(r.memory_bytes),
                annotations: annotations.into_iter().collect(),
            },
            cmd: if spec.init.is_empty() {
                DEFAULT_INIT.iter().map(|s| s.to_string()).collect()
            } else {
                spec.init.clone()
            },
            labels: HashMap::new(),
            keep: true,
            stdio: run::stdio::StdioMode::Null,
            cache_dir: self.cfg.state_dir.join("resolve-cache"),
            policy: self.cfg.policy,
            daemon: self.cfg.daemon.clone(),
        };

        // The warm pool: a spare of this key (everything but the task's mutation, labels,
        // time to live and variables) is claimed; a miss is created as below. Either way the
        // demand is counted, so the pool refills for the next batch.
        if self.cfg.pool > 0 {
            let key = PoolKey {
                image: match &plan_input {
                    Some(i) => format!(
                        "plan {image_record} {}",
                        serde_json::to_string(&i.plan.group_refs()).unwrap_or_default()
                    ),
                    None => format!("image {}", o.image),
                },
                snapshotter: snapshotter.clone(),
                runtime: runtime.clone(),
                resources: (
                    r.cpus,
                    r.memory_bytes,
                    r.cpu_max,
                    r.memory_max_bytes,
                    r.fixed,
                ),
                mounts: spec.mounts.clone(),
                init: spec.init.clone(),
                name: name.to_string(),
            };
            let digest = key.digest();
            let recipe = SpareRecipe {
                o: o.clone(),
                plan: plan_input.clone().map(|mut p| {
                    if p.plan.init_mutation().is_some() {
                        p.plan.mutation = None;
                    }
                    p.patch = None;
                    p
                }),
                name: name.to_string(),
                env: spec.env.clone(),
            };
            self.note_demand(&digest, recipe);
            // The mutation a claim applies: the task's, else the plan's own at-init one.
            let mutation = match (&task_mutation, &plan_input) {
                (Some((m, p)), _) => Some((m.clone(), Some(p.clone()))),
                (None, Some(input)) => match input.plan.init_mutation() {
                    Some(m) => Some((
                        m.clone(),
                        run::patch_bytes(&self.registry, m, &input.dir, &o.image).await?,
                    )),
                    None => None,
                },
                (None, None) => None,
            };
            if let Some(info) = self.claim(&digest, &new_env, mutation, tm).await? {
                return Ok(info);
            }
        }

        let id = format!("{name}-{}", random_hex(5));
        let env = new_env(id.clone());
        o.id = Some(id.clone());
        o.labels = env.container_labels();
        self.envs.lock().insert(id.clone(), env.clone());
        self.events
            .emit(&id, EnvState::Creating, env.source.clone());
        let started = match plan_input {
            Some(mut input) => {
                if let Some((m, patch)) = task_mutation {
                    input.plan.mutation = Some(m);
                    input.patch = Some(patch);
                }
                run::compose_and_start_plan(
                    &self.registry,
                    self.ch.clone(),
                    &o,
                    &input,
                    Some(&self.installed),
                    tm,
                )
                .await
            }
            None => {
                let m = task_mutation.as_ref().map(|(m, p)| (m, p.as_slice()));
                run::pull_and_start(&self.registry, self.ch.clone(), &o, m, tm).await
            }
        };
        let started = match started {
            Ok(s) => s,
            Err(e) => {
                self.envs.lock().remove(&id);
                self.events.emit(&id, EnvState::Failed, e.to_string());
                return Err(e.into());
            }
        };
        drop(started.task);
        let (process, pid) = self.process_and_pid(&id).await;
        *env.process.lock() = process;
        env.pid.store(pid, Ordering::Relaxed);
        set_state(&env, &self.events, EnvState::Running, "the init runs");
        self.watch(env.clone());
        self.prime(env.clone());
        Ok(env.info())
    }

    /// The container spec's process (the exec template) and the init's pid.
    async fn process_and_pid(&self, id: &str) -> (Option<serde_json::Value>, u32) {
        let c = self.ctd();
        let spec_json = ContainersClient::new(c.channel())
            .get(c.req(GetContainerRequest { id: id.to_string() }))
            .await
            .ok()
            .and_then(|r| r.into_inner().container)
            .and_then(|c| c.spec)
            .and_then(|s| serde_json::from_slice::<serde_json::Value>(&s.value).ok());
        let pid = self.task_state(id).await.map(|(_, p, _)| p).unwrap_or(0);
        (spec_json.map(|v| v["process"].clone()), pid)
    }

    /// Count a create of pool key `digest` (its recipe is the latest request's).
    fn note_demand(&self, digest: &str, recipe: SpareRecipe) {
        let now = Instant::now();
        let mut pool = self.pool.lock();
        pool.last_create = Some(now);
        let e = pool.keys.entry(digest.to_string()).or_default();
        e.demand.ask(now);
        e.recipe = Some(recipe);
    }

    /// Claim a running spare of `digest`: the mutation applied through its init's root, its
    /// labels made the environment's. `None`: no spare (create one).
    async fn claim(
        self: &Arc<Self>,
        digest: &str,
        new_env: &(dyn Fn(String) -> Arc<Env> + Sync),
        mutation: Option<(Mutation, Option<Vec<u8>>)>,
        tm: &mut Timings,
    ) -> Result<Option<EnvInfo>, EnvdError> {
        loop {
            let t = Instant::now();
            let Some(spare) = self
                .pool
                .lock()
                .keys
                .get_mut(digest)
                .and_then(|e| e.spares.pop())
            else {
                return Ok(None);
            };
            // Still running? (A spare whose init ended is dropped; the next one is tried.)
            if pool::start_time(spare.pid).is_none_or(|t| t != spare.started) {
                self.drop_spare(spare.id, spare.snapshotter);
                continue;
            }
            let pre = t.elapsed();
            let env = new_env(spare.id.clone());
            self.events
                .emit(&env.id, EnvState::Creating, env.source.clone());
            if let Some((m, patch)) = mutation {
                let mt = Instant::now();
                let root = PathBuf::from(format!("/proc/{}/root", spare.pid));
                let id = spare.id.clone();
                let applied = tokio::task::spawn_blocking(move || {
                    weenv_converter::mutate::apply_mutation_to_dir(&root, &m, patch.as_deref())
                        .map(|_| ())
                        .map_err(|error| EnvdError::PooledMutation {
                            id,
                            error: Box::new(error),
                        })
                })
                .await
                .unwrap_or_else(|e| Err(EnvdError::Internal(e.to_string())));
                tm.record(run::Step::Mutate, mt.elapsed());
                if let Err(e) = applied {
                    self.events.emit(&env.id, EnvState::Failed, e.to_string());
                    self.drop_spare(spare.id, spare.snapshotter);
                    return Err(e);
                }
            }
            let lt = Instant::now();
            let mut labels = env.container_labels();
            labels.insert(POOL_LABEL.to_string(), String::new());
            let c = self.ctd();
            let paths = labels.keys().map(|k| format!("labels.{k}")).collect();
            let updated = ContainersClient::new(c.channel())
                .update(c.req(UpdateContainerRequest {
                    container: Some(Container {
                        id: spare.id.clone(),
                        labels,
                        ..Default::default()
                    }),
                    update_mask: Some(prost_types::FieldMask { paths }),
                }))
                .await;
            if let Err(status) = updated {
                let e = weenv_cli::pull::PullError::Containerd {
                    op: "container update",
                    status,
                };
                self.events.emit(&env.id, EnvState::Failed, e.to_string());
                self.drop_spare(spare.id, spare.snapshotter);
                return Err(e.into());
            }
            tm.record(run::Step::Pool, pre + lt.elapsed());
            *env.process.lock() = spare.process;
            // (a launcher made with other variables than this environment's is not used)
            *env.launcher.lock() = spare.launcher.filter(|_| spare.launcher_env == env.env);
            env.pid.store(spare.pid, Ordering::Relaxed);
            self.envs.lock().insert(env.id.clone(), env.clone());
            set_state(
                &env,
                &self.events,
                EnvState::Running,
                "the init runs (a pooled environment)",
            );
            self.watch(env.clone());
            self.prime(env.clone());
            return Ok(Some(env.info()));
        }
    }

    /// Delete a spare in the background (task, container, snapshot).
    fn drop_spare(self: &Arc<Self>, id: String, snapshotter: String) {
        let me = self.clone();
        tokio::spawn(async move {
            if let Err(e) = me.teardown(&id, &snapshotter).await {
                tracing::warn!(env = %id, error = %e, "removing a pooled environment");
            }
        });
    }

    /// Kill the task, delete it, the container and its snapshot (each if there).
    async fn teardown(&self, id: &str, snapshotter: &str) -> Result<(), EnvdError> {
        let lc = self.lc();
        if self.task_state(id).await.is_some() {
            if let Err(e) = lc.kill_process(id, "", 9, true).await {
                tracing::debug!(env = id, error = %e, "killing the environment");
            }
            let _ = tokio::time::timeout(Duration::from_secs(10), lc.wait_task(id)).await;
            if let Err(e) = lc.delete_task(id).await {
                tracing::warn!(env = id, error = %e, "deleting the environment's task");
            }
        }
        let container = lc.delete_container(id).await;
        let snapshot = lc.remove_snapshot(snapshotter, id).await;
        if let Err(e) = container {
            if !matches!(&e, weenv_cli::pull::PullError::Containerd { status, .. } if status.code() == tonic::Code::NotFound)
            {
                return Err(e.into());
            }
        }
        snapshot?;
        Ok(())
    }

    /// Keep the pool: every half second, once creates were quiet for [`Demand::QUIET`], start
    /// the spares each key wants (two at a time) and remove those of idle keys.
    pub fn spawn_pool(self: &Arc<Self>) {
        if self.cfg.pool == 0 {
            return;
        }
        let me = self.clone();
        let slots = Arc::new(tokio::sync::Semaphore::new(POOL_FILL_PARALLELISM));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            loop {
                tick.tick().await;
                let now = Instant::now();
                let mut start = Vec::new();
                let mut idle = Vec::new();
                {
                    let mut pool = me.pool.lock();
                    let quiet = pool
                        .last_create
                        .is_none_or(|t| now.saturating_duration_since(t) >= Demand::QUIET);
                    let max = me.cfg.pool;
                    pool.keys.retain(|digest, e| {
                        if e.demand.idle(now) {
                            idle.append(&mut e.spares);
                            return e.filling > 0;
                        }
                        if quiet {
                            let want = e.demand.want(now, max);
                            let n = pool::to_start(want, e.spares.len(), e.filling)
                                .min(slots.available_permits());
                            if let Some(r) = &e.recipe {
                                for _ in 0..n {
                                    e.filling += 1;
                                    start.push((digest.clone(), r.clone()));
                                }
                            }
                        }
                        true
                    });
                }
                for s in idle {
                    me.drop_spare(s.id, s.snapshotter);
                }
                for (digest, recipe) in start {
                    let Ok(permit) = slots.clone().acquire_owned().await else {
                        return;
                    };
                    let me = me.clone();
                    tokio::spawn(async move {
                        let made = me.make_spare(&digest, recipe).await;
                        drop(permit);
                        let mut pool = me.pool.lock();
                        let e = pool.keys.entry(digest.clone()).or_default();
                        e.filling = e.filling.saturating_sub(1);
                        match made {
                            Ok(s) => e.spares.push(s),
                            Err(err) => {
                                tracing::warn!(pool = %digest, error = %err, "creating a pooled environment");
                                // the demand is forgotten: a failing recipe does not loop
                                e.demand = Demand::default();
                            }
                        }
                    });
                }
            }
        });
    }

    /// Create one spare of `recipe` (no mutation, only the pool label).
    async fn make_spare(&self, digest: &str, recipe: SpareRecipe) -> Result<Spare, EnvdError> {
        let id = format!("{}-{}", recipe.name, random_hex(5));
        let mut o = recipe.o;
        o.id = Some(id.clone());
        o.labels = [(POOL_LABEL.to_string(), digest.to_string())].into();
        let mut tm = Timings::default();
        let started = match &recipe.plan {
            Some(input) => {
                run::compose_and_start_plan(
                    &self.registry,
                    self.ch.clone(),
                    &o,
                    input,
                    Some(&self.installed),
                    &mut tm,
                )
                .await?
            }
            None => run::pull_and_start(&self.registry, self.ch.clone(), &o, None, &mut tm).await?,
        };
        drop(started.task);
        let (process, pid) = self.process_and_pid(&id).await;
        let vars: BTreeMap<String, String> = recipe.env.into_iter().collect();
        let launcher = self
            .start_launcher(
                &id,
                process.as_ref().unwrap_or(&serde_json::Value::Null),
                &vars,
                &format!("l0-{}", random_hex(3)),
            )
            .await
            .map_err(|e| tracing::debug!(env = %id, error = %e, "starting a launcher"))
            .ok();
        tracing::debug!(pool = digest, env = %id, timings = %tm.render(), "pooled environment ready");
        Ok(Spare {
            id,
            pid,
            started: pool::start_time(pid).unwrap_or(0),
            launcher,
            launcher_env: vars,
            process,
            snapshotter: o.snapshotter,
        })
    }

    /// Delete every spare (at shutdown: they hold no state; environments stay).
    pub async fn drain_pool(&self) {
        let spares: Vec<Spare> = {
            let mut pool = self.pool.lock();
            pool.keys
                .values_mut()
                .flat_map(|e| e.spares.drain(..))
                .collect()
        };
        futures::future::join_all(spares.iter().map(|s| async move {
            if let Err(e) = self.teardown(&s.id, &s.snapshotter).await {
                tracing::warn!(env = %s.id, error = %e, "removing a pooled environment");
            }
        }))
        .await;
    }

    /// Delete the spares a previous run of the service left (they hold no state).
    async fn remove_stale_spares(&self) -> Result<usize, EnvdError> {
        let list = self
            .list_containers(format!("labels.\"{POOL_LABEL}\""))
            .await?;
        let n = list.len();
        for ct in list {
            if let Err(e) = self.teardown(&ct.id, &ct.snapshotter).await {
                tracing::warn!(env = %ct.id, error = %e, "removing a stale pooled environment");
            }
        }
        Ok(n)
    }

    /// Start the environment's next launcher in the background (unless one is ready or on its
    /// way).
    fn prime(self: &Arc<Self>, env: Arc<Env>) {
        if env.launcher.lock().is_some() || env.launcher_pending.swap(true, Ordering::AcqRel) {
            return;
        }
        let me = self.clone();
        tokio::spawn(async move {
            let res = if env.state().0 == EnvState::Running {
                let xid = Service::exec_id(&env, "l");
                me.start_launcher(&env.id, &Service::template(&env), &env.env, &xid)
                    .await
                    .map(Some)
            } else {
                Ok(None)
            };
            match res {
                Ok(Some(l)) => *env.launcher.lock() = Some(l),
                Ok(None) => {}
                Err(e) => tracing::debug!(env = %env.id, error = %e, "starting a launcher"),
            }
            env.launcher_pending.store(false, Ordering::Release);
            env.launcher_ready.notify_waiters();
        });
    }

    /// A [`exec::LAUNCHER`] process in container `id`.
    async fn start_launcher(
        &self,
        id: &str,
        template: &serde_json::Value,
        vars: &BTreeMap<String, String>,
        xid: &str,
    ) -> Result<exec::Started, EnvdError> {
        let argv: Vec<String> = exec::LAUNCHER.iter().map(|s| s.to_string()).collect();
        let p = exec::process_json(template, &argv, None, vars);
        exec::start(&self.lc(), &self.io_dir(), id, xid, &p, true).await
    }

    fn template(env: &Env) -> serde_json::Value {
        env.process
            .lock()
            .clone()
            .unwrap_or(serde_json::Value::Null)
    }

    fn exec_id(env: &Env, kind: &str) -> String {
        format!(
            "{kind}{}-{}",
            env.exec_seq.fetch_add(1, Ordering::Relaxed),
            random_hex(3)
        )
    }

    /// The cause of an exec's end the environment knows (the shim's reason when it ended the
    /// environment), if the exec was killed.
    async fn exec_cause(&self, env: &Env, exit: &mut ExecExit) {
        if exit.timed_out || (exit.exit_code <= 128 && !exit.killed) {
            return;
        }
        // The shim writes its reason as it ends the environment; an init still running a
        // second later means the exec alone was killed (a signal).
        for i in 0..30 {
            if let Some(reason) = shim_cause(&self.cfg, &env.id) {
                exit.killed = true;
                exit.cause = reason;
                return;
            }
            if i >= 10 && matches!(self.task_state(&env.id).await, Some((2, _, _))) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Run one command (the core of Exec, Upload, Download).
    #[allow(clippy::too_many_arguments)]
    async fn exec_inner(
        self: &Arc<Self>,
        env: &Arc<Env>,
        argv: Vec<String>,
        cwd: Option<&str>,
        extra_env: &BTreeMap<String, String>,
        stdin: Vec<u8>,
        timeout: Option<Duration>,
        output_limit: u64,
        tx: Option<mpsc::Sender<Result<ExecEvent, Status>>>,
    ) -> Result<ExecExit, EnvdError> {
        let t0 = Instant::now();
        let mut vars = env.env.clone();
        vars.extend(extra_env.iter().map(|(k, v)| (k.clone(), v.clone())));
        let p = exec::process_json(&Self::template(env), &argv, cwd, &vars);
        let lc = self.lc();
        let xid = Self::exec_id(env, "x");
        env.running_execs.fetch_add(1, Ordering::Relaxed);
        // A launcher started ahead takes the request: one line on its stdin, no `runc exec`
        // on this path (the next launcher is started in the background).
        let line = exec::launch_line(&argv, cwd, extra_env);
        let mut ready = env.launcher.lock().take();
        if ready.is_none() && line.is_some() {
            // One on its way (an environment's first exec right after its create): waiting
            // for it costs one `runc exec`, starting another costs two.
            let notified = env.launcher_ready.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if env.launcher_pending.load(Ordering::Acquire) {
                let _ = tokio::time::timeout(LAUNCHER_WAIT, notified).await;
                ready = env.launcher.lock().take();
            }
        }
        let launched = match (ready, line) {
            (Some(l), Some(line)) => Some((l, line)),
            (l, _) => {
                // not usable for this request: back for the next one
                if let Some(l) = l {
                    *env.launcher.lock() = Some(l);
                }
                None
            }
        };
        let (launched, stdin) = match launched {
            Some((l, line)) => {
                self.prime(env.clone());
                let mut data = line.into_bytes();
                data.push(b'\n');
                data.extend_from_slice(&stdin);
                (Some(l), data)
            }
            None => (None, stdin),
        };
        let res = async {
            let started = match launched {
                Some(l) => Ok(l),
                None => {
                    exec::start(&lc, &self.io_dir(), &env.id, &xid, &p, !stdin.is_empty()).await
                }
            };
            let started = match started {
                Ok(s) => s,
                // What a shell answers for a command it cannot run (127): an agent's
                // tool call gets an exit code, not an API error.
                Err(e) if exec::is_not_found(&e) => {
                    return Ok(ExecExit {
                        exit_code: 127,
                        duration_ms: t0.elapsed().as_secs_f64() * 1e3,
                        stderr: format!("{}: {e}\n", argv[0]).into_bytes(),
                        ..Default::default()
                    })
                }
                Err(e) => return Err(e),
            };
            exec::run(
                &lc,
                &env.id,
                started,
                RunParams {
                    stdin,
                    timeout,
                    output_limit,
                    tx,
                },
                t0,
            )
            .await
        }
        .await;
        env.running_execs.fetch_sub(1, Ordering::Relaxed);
        let mut exit = res?;
        self.exec_cause(env, &mut exit).await;
        Ok(exit)
    }
}

/// The environment's sessions, removed from it (to close them outside the lock).
fn take_sessions(env: &Env) -> Vec<Arc<Session>> {
    let taken = std::mem::take(&mut *env.sessions.lock());
    taken.into_values().collect()
}

fn timeout_of(s: f64) -> Result<Option<Duration>, EnvdError> {
    if s < 0.0 || !s.is_finite() {
        return Err(invalid(format!(
            "timeout_seconds {s}: give 0 (none) or a positive number"
        )));
    }
    Ok((s > 0.0).then(|| Duration::from_secs_f64(s)))
}

fn limit_of(l: u64) -> Result<u64, EnvdError> {
    match l {
        0 => Ok(DEFAULT_OUTPUT_LIMIT),
        l if l > MAX_OUTPUT_LIMIT => Err(invalid(format!(
            "output_limit {l} is above the maximum {MAX_OUTPUT_LIMIT}"
        ))),
        l => Ok(l),
    }
}

/// The sum of the base requests (millicores, bytes) in the weenv shims' node ledger
/// (`ledger.json`: `entries.<ns/id>.base.{cpu_m,mem}`). Pure.
pub fn ledger_requests(json: &str) -> (u64, u64) {
    let v: serde_json::Value = serde_json::from_str(json).unwrap_or_default();
    let Some(entries) = v["entries"].as_object() else {
        return (0, 0);
    };
    entries.values().fold((0, 0), |(c, m), e| {
        (
            c + e["base"]["cpu_m"].as_u64().unwrap_or(0),
            m + e["base"]["mem"].as_u64().unwrap_or(0),
        )
    })
}

/// `MemTotal` of `/proc/meminfo`, in bytes. Pure.
pub fn mem_total(meminfo: &str) -> u64 {
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kib| kib << 10)
        .unwrap_or(0)
}

/// Read a memory/cpu counter of the environment's cgroup (v1, then v2).
fn cgroup_counter(ns: &str, id: &str, v1: (&str, &str), v2: (&str, &str)) -> Option<u64> {
    let read = |p: String, key: &str| -> Option<u64> {
        let t = std::fs::read_to_string(p).ok()?;
        if key.is_empty() {
            return t.trim().parse().ok();
        }
        t.lines()
            .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
    };
    read(format!("/sys/fs/cgroup/{}/{ns}/{id}/{}", v1.0, v1.1), "")
        .or_else(|| read(format!("/sys/fs/cgroup/{ns}/{id}/{}", v2.0), v2.1))
}

#[tonic::async_trait]
impl Envd for Arc<Service> {
    type CreateStream = Stream<CreateResult>;

    async fn create(
        &self,
        req: Request<CreateRequest>,
    ) -> Result<Response<Self::CreateStream>, Status> {
        let req = req.into_inner();
        if req.envs.is_empty() {
            return Err(invalid("no environment to create (envs is empty)").into());
        }
        if req.envs.len() > 1024 {
            return Err(invalid("at most 1024 environments per request").into());
        }
        let par = match req.parallelism {
            0 => self.cfg.parallelism,
            p => p as usize,
        };
        let me = self.clone();
        let (tx, rx) = mpsc::channel(req.envs.len());
        tokio::spawn(async move {
            let mut s = futures::stream::iter(req.envs.into_iter().enumerate())
                .map(|(i, spec)| {
                    let me = me.clone();
                    async move {
                        let t = Instant::now();
                        let (r, tm) = me.create_one(spec).await;
                        (i, r, tm, t.elapsed())
                    }
                })
                .buffer_unordered(par.max(1));
            while let Some((i, r, tm, el)) = s.next().await {
                let timings = tm
                    .steps
                    .iter()
                    .map(|(s, d)| StepTiming {
                        step: s.name().to_string(),
                        ms: d.as_secs_f64() * 1e3,
                    })
                    .collect();
                let (env, error) = match r {
                    Ok(e) => (Some(e), String::new()),
                    Err(e) => (None, e.to_string()),
                };
                let _ = tx
                    .send(Ok(CreateResult {
                        index: i as u32,
                        env,
                        error,
                        timings,
                        total_ms: el.as_secs_f64() * 1e3,
                    }))
                    .await;
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    type ExecStream = Stream<ExecEvent>;

    async fn exec(&self, req: Request<ExecRequest>) -> Result<Response<Self::ExecStream>, Status> {
        let r = req.into_inner();
        let env = self.running(&r.env_id)?;
        let argv = match (r.argv.is_empty(), r.shell.is_empty()) {
            (false, true) => r.argv,
            (true, false) => vec!["/bin/sh".into(), "-c".into(), r.shell],
            _ => return Err(invalid("give either argv or shell").into()),
        };
        let timeout = timeout_of(r.timeout_seconds)?;
        let limit = limit_of(r.output_limit)?;
        let (tx, rx) = mpsc::channel(64);
        let me = self.clone();
        let extra: BTreeMap<String, String> = r.env.into_iter().collect();
        tokio::spawn(async move {
            let stream_tx = (!r.buffered).then(|| tx.clone());
            let cwd = (!r.cwd.is_empty()).then_some(r.cwd.as_str());
            let res = me
                .exec_inner(&env, argv, cwd, &extra, r.stdin, timeout, limit, stream_tx)
                .await;
            let msg = match res {
                Ok(exit) => Ok(ExecEvent {
                    event: Some(exec_event::Event::Exit(exit)),
                }),
                Err(e) => Err(e.status()),
            };
            let _ = tx.send(msg).await;
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn open_session(
        &self,
        req: Request<OpenSessionRequest>,
    ) -> Result<Response<OpenSessionResponse>, Status> {
        let t0 = Instant::now();
        let r = req.into_inner();
        let env = self.running(&r.env_id)?;
        let shell = if r.shell.is_empty() {
            "/bin/sh"
        } else {
            r.shell.as_str()
        };
        let mut vars = env.env.clone();
        vars.extend(r.env);
        let xid = Service::exec_id(&env, "s");
        let cwd = (!r.cwd.is_empty()).then_some(r.cwd.as_str());
        let p = Session::process(&Service::template(&env), shell, cwd, &vars);
        let s = Session::open(&self.lc(), &self.io_dir(), &env.id, &xid, &p).await?;
        let id = s.id.clone();
        env.sessions.lock().insert(id.clone(), Arc::new(s));
        Ok(Response::new(OpenSessionResponse {
            session_id: id,
            ms: t0.elapsed().as_secs_f64() * 1e3,
        }))
    }

    async fn run_in_session(
        &self,
        req: Request<RunInSessionRequest>,
    ) -> Result<Response<RunInSessionResponse>, Status> {
        let r = req.into_inner();
        let env = self.running(&r.env_id)?;
        let s = env
            .sessions
            .lock()
            .get(&r.session_id)
            .cloned()
            .ok_or_else(|| EnvdError::NoSession {
                env: r.env_id.clone(),
                session: r.session_id.clone(),
            })?;
        let out = s
            .run(
                &r.command,
                timeout_of(r.timeout_seconds)?,
                limit_of(r.output_limit)?,
            )
            .await?;
        if out.session_closed {
            env.sessions.lock().remove(&r.session_id);
        }
        Ok(Response::new(out))
    }

    async fn close_session(
        &self,
        req: Request<CloseSessionRequest>,
    ) -> Result<Response<CloseSessionResponse>, Status> {
        let r = req.into_inner();
        let env = self.get(&r.env_id)?;
        let s = env
            .sessions
            .lock()
            .remove(&r.session_id)
            .ok_or_else(|| EnvdError::NoSession {
                env: r.env_id.clone(),
                session: r.session_id.clone(),
            })?;
        s.close_now().await;
        Ok(Response::new(CloseSessionResponse {}))
    }

    async fn read_file(
        &self,
        req: Request<ReadFileRequest>,
    ) -> Result<Response<ReadFileResponse>, Status> {
        let r = req.into_inner();
        let env = self.running(&r.env_id)?;
        let limit = if r.limit == 0 {
            files::MAX_FILE
        } else {
            r.limit.min(files::MAX_FILE)
        };
        let pid = env.pid.load(Ordering::Relaxed);
        let data = tokio::task::spawn_blocking(move || files::read(pid, &r.path, limit))
            .await
            .map_err(|e| EnvdError::Internal(e.to_string()))??;
        Ok(Response::new(ReadFileResponse { data }))
    }

    async fn write_file(
        &self,
        req: Request<WriteFileRequest>,
    ) -> Result<Response<WriteFileResponse>, Status> {
        let r = req.into_inner();
        let env = self.running(&r.env_id)?;
        let pid = env.pid.load(Ordering::Relaxed);
        let n = r.data.len() as u64;
        tokio::task::spawn_blocking(move || {
            files::write(pid, &r.path, &r.data, r.mode, !r.no_parents)
        })
        .await
        .map_err(|e| EnvdError::Internal(e.to_string()))??;
        Ok(Response::new(WriteFileResponse { bytes: n }))
    }

    async fn upload(
        &self,
        req: Request<tonic::Streaming<UploadChunk>>,
    ) -> Result<Response<UploadResponse>, Status> {
        const MAX: usize = 1 << 30;
        let mut s = req.into_inner();
        let (mut env_id, mut dest, mut data) = (String::new(), String::new(), Vec::new());
        while let Some(c) = s.message().await? {
            if env_id.is_empty() {
                env_id = c.env_id;
                dest = c.dest;
            }
            if data.len() + c.data.len() > MAX {
                return Err(EnvdError::TooLarge(format!("upload above {MAX} bytes")).into());
            }
            data.extend_from_slice(&c.data);
        }
        let env = self.running(&env_id)?;
        files::inner_path(&dest)?;
        let n = data.len() as u64;
        let argv = vec![
            "/bin/sh".into(),
            "-c".into(),
            "mkdir -p \"$1\" && tar -x -f - -C \"$1\"".into(),
            "upload".into(),
            dest.clone(),
        ];
        let exit = self
            .exec_inner(
                &env,
                argv,
                None,
                &BTreeMap::new(),
                data,
                None,
                64 << 10,
                None,
            )
            .await?;
        if exit.exit_code != 0 {
            return Err(EnvdError::Internal(format!(
                "extracting the tar into {dest} failed (exit {}): {}",
                exit.exit_code,
                String::from_utf8_lossy(&exit.stderr)
            ))
            .into());
        }
        Ok(Response::new(UploadResponse { bytes: n }))
    }

    type DownloadStream = Stream<DataChunk>;

    async fn download(
        &self,
        req: Request<DownloadRequest>,
    ) -> Result<Response<Self::DownloadStream>, Status> {
        let r = req.into_inner();
        let env = self.running(&r.env_id)?;
        files::inner_path(&r.path)?;
        let argv = vec![
            "/bin/sh".into(),
            "-c".into(),
            "cd \"$(dirname \"$1\")\" && exec tar -c -f - \"$(basename \"$1\")\"".into(),
            "download".into(),
            r.path.clone(),
        ];
        let (tx, mut rx) = mpsc::channel(16);
        let (out_tx, out_rx) = mpsc::channel(16);
        let me = self.clone();
        tokio::spawn(async move {
            let res = me
                .exec_inner(
                    &env,
                    argv,
                    None,
                    &BTreeMap::new(),
                    Vec::new(),
                    None,
                    MAX_OUTPUT_LIMIT,
                    Some(tx),
                )
                .await;
            let _ = res;
        });
        tokio::spawn(async move {
            let mut stderr = Vec::new();
            let mut sent = false;
            while let Some(ev) = rx.recv().await {
                match ev.map(|e| e.event) {
                    Ok(Some(exec_event::Event::Stdout(d))) => {
                        sent = true;
                        if out_tx.send(Ok(DataChunk { data: d })).await.is_err() {
                            return;
                        }
                    }
                    Ok(Some(exec_event::Event::Stderr(d))) => stderr.extend_from_slice(&d),
                    _ => {}
                }
            }
            if !sent {
                let _ = out_tx
                    .send(Err(Status::not_found(format!(
                        "downloading {}: {}",
                        r.path,
                        String::from_utf8_lossy(&stderr).trim()
                    ))))
                    .await;
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(out_rx))))
    }

    async fn list(&self, req: Request<ListRequest>) -> Result<Response<ListResponse>, Status> {
        let want = req.into_inner().labels;
        let mut envs: Vec<EnvInfo> = self
            .envs
            .lock()
            .values()
            .filter(|e| e.matches(&want))
            .map(|e| e.info())
            .collect();
        envs.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(Response::new(ListResponse { envs }))
    }

    async fn stats(&self, req: Request<StatsRequest>) -> Result<Response<StatsResponse>, Status> {
        let id = req.into_inner().env_id;
        let env = self.get(&id)?;
        let dir = shim_status_path(&self.cfg, &id);
        let status = std::fs::read_to_string(dir.join("status.json")).unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(&status).unwrap_or_default();
        let changes = std::fs::read_to_string(dir.join("changes.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect();
        let ns = &self.cfg.namespace;
        let sessions = env.sessions.lock().len() as u32;
        Ok(Response::new(StatsResponse {
            env: Some(env.info()),
            cpu_millicores: v["cpu_millicores"].as_u64().unwrap_or(0) as u32,
            memory_limit_bytes: v["memory_bytes"].as_i64().unwrap_or(0),
            memory_usage_bytes: cgroup_counter(
                ns,
                &id,
                ("memory", "memory.usage_in_bytes"),
                ("memory.current", ""),
            )
            .unwrap_or(0) as i64,
            cpu_usage_ns: cgroup_counter(
                ns,
                &id,
                ("cpuacct", "cpuacct.usage"),
                ("cpu.stat", "usage_usec "),
            )
            .unwrap_or(0),
            quota_changes: changes,
            shim_status_json: status,
            sessions,
            running_execs: env.running_execs.load(Ordering::Relaxed),
        }))
    }

    type EventsStream = Stream<Event>;

    async fn events(
        &self,
        req: Request<EventsRequest>,
    ) -> Result<Response<Self::EventsStream>, Status> {
        let r = req.into_inner();
        let (held, mut live) = self.events.subscribe();
        let (tx, rx) = mpsc::channel(256);
        tokio::spawn(async move {
            let keep = |e: &Event| r.env_id.is_empty() || e.env_id == r.env_id;
            if r.replay {
                for e in held.into_iter().filter(keep) {
                    if tx.send(Ok(e)).await.is_err() {
                        return;
                    }
                }
            }
            loop {
                match live.recv().await {
                    Ok(e) if keep(&e) => {
                        if tx.send(Ok(e)).await.is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                        let _ = tx
                            .send(Err(Status::data_loss(format!(
                                "the events stream fell {n} events behind; reconnect with replay"
                            ))))
                            .await;
                        return;
                    }
                    Err(_) => return,
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn node(&self, _req: Request<NodeRequest>) -> Result<Response<NodeInfo>, Status> {
        let cache = weenv_converter::resolve_cache::ResolveCache::load(
            &self.cfg.state_dir.join("resolve-cache"),
        );
        let ledger = self
            .cfg
            .shim_ledger_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from("/run/weenv/ledger"))
            .join("ledger.json");
        let (cpu_requested, mem_requested) =
            ledger_requests(&std::fs::read_to_string(ledger).unwrap_or_default());
        let pooled = self
            .pool
            .lock()
            .keys
            .values()
            .map(|e| e.spares.len() as u32)
            .sum();
        Ok(Response::new(NodeInfo {
            name: std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_string())
                .unwrap_or_default(),
            groups: cache.references(),
            environments: self.envs.lock().len() as u32,
            pooled,
            cpu_capacity_millicores: std::thread::available_parallelism()
                .map(|n| n.get() as u64 * 1000)
                .unwrap_or(1000),
            memory_capacity_bytes: mem_total(
                &std::fs::read_to_string("/proc/meminfo").unwrap_or_default(),
            ),
            cpu_requested_millicores: cpu_requested,
            memory_requested_bytes: mem_requested,
        }))
    }

    async fn delete(
        &self,
        req: Request<DeleteRequest>,
    ) -> Result<Response<DeleteResponse>, Status> {
        let ids = req.into_inner().env_ids;
        if ids.is_empty() {
            return Err(invalid("no environment named (env_ids is empty)").into());
        }
        let res = futures::future::join_all(ids.iter().map(|id| async move {
            (
                id.clone(),
                self.delete_one(id, "deleted by the client").await,
            )
        }))
        .await;
        let mut out = DeleteResponse::default();
        for (id, r) in res {
            match r {
                Ok(()) => out.deleted.push(id),
                Err(e) => out.errors.push(format!("{id}: {e}")),
            }
        }
        Ok(Response::new(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ledger_requests_sum_the_bases() {
        let j = r#"{"version":1,"entries":{
            "ns/a":{"shim_pid":1,"shim_start":2,"base":{"cpu_m":500,"mem":1024},"granted":{"cpu_m":900,"mem":4096}},
            "ns/b":{"shim_pid":3,"shim_start":4,"base":{"cpu_m":250,"mem":0},"granted":{"cpu_m":250,"mem":0}}}}"#;
        assert_eq!(ledger_requests(j), (750, 1024));
        assert_eq!(ledger_requests(""), (0, 0));
        assert_eq!(ledger_requests("{\"entries\":{}}"), (0, 0));
    }

    #[test]
    fn mem_total_in_bytes() {
        assert_eq!(
            mem_total("MemTotal:       24684004 kB\nMemFree: 1 kB\n"),
            24684004 << 10
        );
        assert_eq!(mem_total("nothing"), 0);
    }
}
