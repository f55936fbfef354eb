//! The containerd shim v2 task service (`containerd.task.v2.Task`) for runc containers,
//! plus the [`Shim`] lifecycle (start/delete of the shim binary itself).
//!
//! Task API: create, start, state, wait, kill, delete, pids, connect, shutdown, exec,
//! stats, update, pause, resume, close_io, resize_pty; TTY through runc's console socket
//! (`io.rs`). Every container gets an elastic [`Monitor`] (see `monitor.rs`)
//! started with the task; exits come from the shim's reaper through the monitor
//! subscription (`exits.rs`-style loop in [`TaskService::watch_exits`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use containerd_shim::api::{
    ConnectRequest, ConnectResponse, CreateTaskRequest, CreateTaskResponse, DeleteRequest, Empty,
    ExecProcessRequest, KillRequest, PidsRequest, PidsResponse, StartRequest, StartResponse,
    StateRequest, StateResponse, Status as TaskStatus, WaitRequest, WaitResponse,
};
use containerd_shim::asynchronous::monitor::monitor_subscribe;
use containerd_shim::asynchronous::publisher::RemotePublisher;
use containerd_shim::asynchronous::{spawn, ExitSignal, Shim};
use containerd_shim::monitor::{Subject, Topic};
use containerd_shim::protos::events::task::{
    TaskCreate, TaskDelete, TaskExecAdded, TaskExecStarted, TaskExit, TaskIO, TaskOOM, TaskPaused,
    TaskResumed, TaskStart,
};
use containerd_shim::protos::protobuf::MessageDyn;
use containerd_shim::protos::shim::shim::{
    CloseIORequest, PauseRequest, ResizePtyRequest, ResumeRequest, ShutdownRequest, StatsRequest,
    StatsResponse, UpdateTaskRequest,
};
use containerd_shim::protos::topics;
use containerd_shim::protos::ttrpc::{self, r#async::TtrpcContext};
use containerd_shim::util::{mount_rootfs, read_pid_from_file, timestamp, write_str_to_file};
use containerd_shim::{Config, DeleteResponse, Flags, StartOpts, Task, TtrpcResult};
use runc::options::{CreateOpts, DeleteOpts, ExecOpts, KillOpts};
use runc::Runc;
use tokio::sync::{mpsc, watch, Mutex};
use tracing::{error, info, warn};

use crate::cgroup;
use crate::config::ShimConfig;
use crate::error::ShimError;
use crate::io::{resize, start_copy, ConsoleSocket};
use crate::monitor::{Monitor, Outcome};
use crate::process::{wait_exit, EarlyExits, Process};
use crate::runc::{client, describe, FifoIo};
use crate::status::{Status, StatusDir};

/// How long runc may take to send the pty master.
const CONSOLE_TIMEOUT: Duration = Duration::from_secs(10);

/// Receives the pty master and starts the copy loops for `p`'s FIFOs.
async fn attach_console(
    p: &mut Process,
    pending: tokio::task::JoinHandle<std::io::Result<std::fs::File>>,
) -> Result<(), ShimError> {
    let master = pending
        .await
        .map_err(|e| ShimError::io("console socket task")(std::io::Error::other(e)))?
        .map_err(ShimError::io("receive pty master"))?;
    let path = |s: &str| (!s.is_empty()).then(|| PathBuf::from(s));
    let (stdin, stdout) = (path(&p.stdin), path(&p.stdout));
    p.stdin_closer = start_copy(&master, stdin.as_deref(), stdout.as_deref())
        .map_err(ShimError::io("pty copy"))?;
    p.console = Some(master);
    Ok(())
}

mod task;

/// Runtime name containerd uses for this shim.
pub const RUNTIME_ID: &str = "io.containerd.weenv.v1";

type Event = (&'static str, Box<dyn MessageDyn>);

struct Container {
    id: String,
    bundle: PathBuf,
    runc: Arc<Runc>,
    init: Process,
    execs: HashMap<String, Process>,
    monitor: Option<Arc<std::sync::Mutex<Monitor>>>,
    stop_monitor: Option<watch::Sender<bool>>,
    status_dir: StatusDir,
    status: Status,
    cfg: ShimConfig,
    /// Set when the shim terminated the task (readable reason).
    terminated: Option<String>,
}

#[derive(Default)]
struct State {
    containers: HashMap<String, Container>,
    early: EarlyExits,
}

struct Inner {
    namespace: String,
    exit: Arc<ExitSignal>,
    events: mpsc::UnboundedSender<Event>,
    state: Mutex<State>,
    clock: Instant,
}

/// The task service served over ttrpc.
#[derive(Clone)]
pub struct TaskService {
    inner: Arc<Inner>,
}

/// The shim lifecycle object.
pub struct Service {
    namespace: String,
    id: String,
    exit: Arc<ExitSignal>,
}

fn runc_root(namespace: &str) -> PathBuf {
    Path::new("/run/containerd/runc").join(namespace)
}

#[async_trait]
impl Shim for Service {
    type T = TaskService;

    async fn new(_runtime_id: &str, args: &Flags, config: &mut Config) -> Self {
        config.no_setup_logger = true;
        Service {
            namespace: args.namespace.clone(),
            id: args.id.clone(),
            exit: Arc::new(ExitSignal::default()),
        }
    }

    async fn start_shim(&mut self, opts: StartOpts) -> Result<String, containerd_shim::Error> {
        let grouping = opts.id.clone();
        // containerd 2.x sends BootstrapParams on stdin, which `spawn` would parse as options.
        let input = crate::bootstrap::normalise_stdin().map_err(|e| {
            containerd_shim::Error::Other(format!("reading the start parameters on stdin: {e}"))
        })?;
        tracing::debug!(?input, "start parameters on stdin");
        let address = spawn(opts, &grouping, Vec::new()).await?;
        write_str_to_file("address", &address).await?;
        Ok(address)
    }

    async fn delete_shim(&mut self) -> Result<DeleteResponse, containerd_shim::Error> {
        // containerd runs `delete` in the bundle dir after the shim died.
        let bundle = std::env::current_dir().unwrap_or_default();
        if let Ok(r) = client("runc", &runc_root(&self.namespace), &bundle) {
            let _ = r.delete(&self.id, Some(&DeleteOpts { force: true })).await;
        }
        let rootfs = bundle.join("rootfs");
        let _ = containerd_shim::mount::umount_recursive(rootfs.to_str(), 0);
        let mut resp = DeleteResponse::new();
        resp.exit_status = 137;
        resp.exited_at = Some(timestamp()?).into();
        Ok(resp)
    }

    async fn wait(&mut self) {
        self.exit.wait().await
    }

    async fn create_task_service(&self, publisher: RemotePublisher) -> TaskService {
        crate::logging::init_fifo_logger();
        let (tx, mut rx) = mpsc::unbounded_channel::<Event>();
        let ns = self.namespace.clone();
        tokio::spawn(async move {
            while let Some((topic, ev)) = rx.recv().await {
                let ctx = ttrpc::context::with_duration(Duration::from_secs(5));
                if let Err(e) = publisher.publish(ctx, topic, &ns, ev).await {
                    warn!(topic, error = %e, "publish event");
                }
            }
        });
        let svc = TaskService {
            inner: Arc::new(Inner {
                namespace: self.namespace.clone(),
                exit: self.exit.clone(),
                events: tx,
                state: Mutex::new(State::default()),
                clock: Instant::now(),
            }),
        };
        let watcher = svc.clone();
        tokio::spawn(async move { watcher.watch_exits().await });
        svc
    }
}

impl TaskService {
    fn publish(&self, topic: &'static str, ev: Box<dyn MessageDyn>) {
        let _ = self.inner.events.send((topic, ev));
    }

    async fn watch_exits(&self) {
        let mut sub = match monitor_subscribe(Topic::Pid).await {
            Ok(s) => s,
            Err(e) => {
                error!(error = %e, "cannot subscribe to process exits; tasks will never be reported as exited");
                return;
            }
        };
        while let Some(ev) = sub.rx.recv().await {
            if let Subject::Pid(pid) = ev.subject {
                self.on_exit(pid, ev.exit_code).await;
            }
        }
    }

    async fn on_exit(&self, pid: i32, code: i32) {
        let mut st = self.inner.state.lock().await;
        let at = timestamp().unwrap_or_default();
        for c in st.containers.values_mut() {
            if c.init.pid == pid && c.init.exit.is_none() {
                if let Some(s) = c.stop_monitor.take() {
                    let _ = s.send(true);
                }
                let now = self.inner.clock.elapsed();
                let (oom, oom_total, oom_at_max) = match c.monitor.as_ref().map(|m| m.lock()) {
                    Some(Ok(mut m)) => {
                        (m.final_oom_check(now), m.oom_total(), m.oom_at_max_reason())
                    }
                    _ => (false, 0, None),
                };
                // Killed by SIGKILL after the kernel's OOM killer acted at the top tier: the
                // task could not fit at its maximum, reported like a shim termination.
                if c.terminated.is_none() && code == 128 + libc::SIGKILL {
                    if let Some(reason) = oom_at_max {
                        error!(id = %c.id, reason = %reason, exit_status = c.cfg.monitor.terminate_exit_code, "task ended by the kernel OOM killer at its maximum memory tier");
                        c.status.reason = Some(reason.clone());
                        c.terminated = Some(reason);
                    }
                }
                let status = match &c.terminated {
                    Some(_) => c.cfg.monitor.terminate_exit_code,
                    None => code as u32,
                };
                c.init.set_exited(status, at.clone());
                if oom_total > 0 && c.terminated.is_none() {
                    c.status.reason = Some(format!(
                        "the kernel OOM-killed {oom_total} process(es) at the memory limit; \
                         init exit status {code}"
                    ));
                }
                if oom {
                    self.publish(
                        topics::TASK_OOM_EVENT_TOPIC,
                        Box::new(TaskOOM {
                            container_id: c.id.clone(),
                            ..Default::default()
                        }),
                    );
                }
                c.status.state = if c.terminated.is_some() {
                    "terminated"
                } else {
                    "exited"
                }
                .into();
                if let Some(Ok(m)) = c.monitor.as_ref().map(|m| m.lock()) {
                    c.status.cpu_millicores = m.current().cpu.map(|t| t.value);
                    c.status.memory_bytes = m.current().mem.map(|t| t.value);
                }
                c.status.exit_status = Some(status);
                if let Err(e) = c.status_dir.write(&c.status) {
                    warn!(error = %e, "write status");
                }
                info!(id = %c.id, pid, status, "init process exited");
                let ev = TaskExit {
                    container_id: c.id.clone(),
                    id: c.id.clone(),
                    pid: pid as u32,
                    exit_status: status,
                    exited_at: Some(at).into(),
                    ..Default::default()
                };
                self.publish(topics::TASK_EXIT_EVENT_TOPIC, Box::new(ev));
                return;
            }
            if let Some(p) = c
                .execs
                .values_mut()
                .find(|p| p.pid == pid && p.exit.is_none())
            {
                p.set_exited(code as u32, at.clone());
                let ev = TaskExit {
                    container_id: c.id.clone(),
                    id: p.exec_id.clone(),
                    pid: pid as u32,
                    exit_status: code as u32,
                    exited_at: Some(at).into(),
                    ..Default::default()
                };
                self.publish(topics::TASK_EXIT_EVENT_TOPIC, Box::new(ev));
                return;
            }
        }
        st.early.push(pid, code);
    }

    /// Runs the elastic loop of container `id` until stopped or the task must die.
    fn spawn_monitor(
        &self,
        id: String,
        mon: Arc<std::sync::Mutex<Monitor>>,
        interval: Duration,
        mut stop: watch::Receiver<bool>,
    ) {
        let svc = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let mut errors = 0u64;
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stop.changed() => break,
                }
                if *stop.borrow() {
                    break;
                }
                let now = svc.inner.clock.elapsed();
                let (out, oom) = match mon.lock() {
                    Ok(mut m) => (m.round(now), m.take_new_oom()),
                    Err(_) => break,
                };
                if oom {
                    warn!(id = %id, "the kernel reported an OOM event in the container");
                    svc.publish(
                        topics::TASK_OOM_EVENT_TOPIC,
                        Box::new(TaskOOM {
                            container_id: id.clone(),
                            ..Default::default()
                        }),
                    );
                }
                match out {
                    Ok(Outcome::Continue) => {}
                    Ok(Outcome::Terminate(reason)) => {
                        svc.terminate(&id, reason).await;
                        break;
                    }
                    Err(e) => {
                        errors += 1;
                        if errors.is_power_of_two() {
                            warn!(id = %id, error = %e, errors, "elastic monitor round failed");
                        }
                    }
                }
            }
        });
    }

    /// Kills the task for a reason the user must see (status file, log, exit status).
    async fn terminate(&self, id: &str, reason: String) {
        let mut st = self.inner.state.lock().await;
        let Some(c) = st.containers.get_mut(id) else {
            return;
        };
        error!(id, reason = %reason, exit_status = c.cfg.monitor.terminate_exit_code, "weenv terminates the task");
        c.terminated = Some(reason.clone());
        c.status.state = "terminating".into();
        c.status.reason = Some(reason);
        c.status.exit_status = Some(c.cfg.monitor.terminate_exit_code);
        let _ = c.status_dir.write(&c.status);
        if let Some(m) = &c.monitor {
            if let Ok(m) = m.lock() {
                // v1: let the kernel OOM killer act on frozen tasks as well.
                let _ = m.io().write(&cgroup::CgroupWrite::OomKillDisable(false));
            }
        }
        let runc = c.runc.clone();
        let cid = c.id.clone();
        drop(st);
        if let Err(e) = runc.kill(&cid, 9, Some(&KillOpts { all: true })).await {
            warn!(id, error = %e, "kill terminated task");
        }
    }

    fn status_of(p: &Process) -> TaskStatus {
        p.status
    }

    async fn create_inner(&self, req: &CreateTaskRequest) -> Result<CreateTaskResponse, ShimError> {
        if !req.checkpoint.is_empty() {
            return Err(ShimError::Unsupported("restore from a checkpoint"));
        }
        let bundle = PathBuf::from(&req.bundle);
        let spec = oci_spec::runtime::Spec::load(bundle.join("config.json")).map_err(|source| {
            ShimError::Spec {
                path: bundle.clone(),
                source,
            }
        })?;
        let annotations = spec.annotations().clone().unwrap_or_default();
        let mut cfg = ShimConfig::load_default()?;
        cfg.apply_annotations(&annotations)?;
        let rootfs = bundle.join("rootfs");
        std::fs::create_dir_all(&rootfs)
            .map_err(ShimError::io(format!("mkdir {}", rootfs.display())))?;
        for m in &req.rootfs {
            mount_rootfs(m, &rootfs)
                .await
                .map_err(ShimError::shim("mount rootfs"))?;
        }
        let runc = Arc::new(
            client("runc", &runc_root(&self.inner.namespace), &bundle).map_err(|e| {
                ShimError::Runc {
                    op: "client",
                    detail: e.to_string(),
                }
            })?,
        );
        let mut init = Process::new("", &req.stdin, &req.stdout, &req.stderr, req.terminal);
        if !req.terminal {
            init.open_logs(&req.id, &self.inner.namespace)?;
        }
        let pid_file = bundle.join("init.pid");
        let mut opts = CreateOpts::new().pid_file(&pid_file);
        let console = if req.terminal {
            let sock = ConsoleSocket::new().map_err(ShimError::io("console socket"))?;
            opts = opts
                .console_socket(sock.path())
                .io(Arc::new(FifoIo::default()));
            Some(tokio::spawn(sock.receive(CONSOLE_TIMEOUT)))
        } else {
            opts = opts.io(Arc::new(init.stdio.clone()));
            None
        };
        if let Err(e) = runc.create(&req.id, &bundle, Some(&opts)).await {
            if let Some(c) = console {
                c.abort();
            }
            let _ = containerd_shim::mount::umount_recursive(rootfs.to_str(), 0);
            return Err(ShimError::runc("create", &bundle, &e));
        }
        if let Some(c) = console {
            attach_console(&mut init, c).await?;
        }
        let pid = read_pid_from_file(&pid_file)
            .await
            .map_err(ShimError::shim(format!("read {}", pid_file.display())))?;
        init.pid = pid;
        let status_dir = StatusDir::new(&cfg.monitor.status_dir, &self.inner.namespace, &req.id);
        if let Err(e) = status_dir.reset() {
            warn!(error = %e, "status dir");
        }
        let key = format!("{}/{}", self.inner.namespace, req.id);
        let now = self.inner.clock.elapsed();
        let monitor = match cgroup::open(pid)
            .map_err(crate::monitor::MonitorError::from)
            .and_then(|io| Monitor::new(key, io, cfg.clone(), status_dir.clone(), now))
        {
            Ok(m) => Some(Arc::new(std::sync::Mutex::new(m))),
            Err(e) => {
                warn!(id = %req.id, error = %e, "elastic provisioning disabled for this container");
                None
            }
        };
        let mut status = Status {
            namespace: self.inner.namespace.clone(),
            id: req.id.clone(),
            state: "created".into(),
            ..Default::default()
        };
        if let Some(m) = &monitor {
            if let Ok(m) = m.lock() {
                status.cgroup = Some(m.io().version().as_str().to_string());
                status.elastic = m.is_elastic();
                status.cpu_millicores = m.current().cpu.map(|t| t.value);
                status.memory_bytes = m.current().mem.map(|t| t.value);
            }
        }
        let _ = status_dir.write(&status);
        let c = Container {
            id: req.id.clone(),
            bundle: bundle.clone(),
            runc,
            init,
            execs: HashMap::new(),
            monitor,
            stop_monitor: None,
            status_dir,
            status,
            cfg,
            terminated: None,
        };
        self.inner
            .state
            .lock()
            .await
            .containers
            .insert(req.id.clone(), c);
        let ev = TaskCreate {
            container_id: req.id.clone(),
            bundle: req.bundle.clone(),
            rootfs: req.rootfs.clone(),
            io: Some(TaskIO {
                stdin: req.stdin.clone(),
                stdout: req.stdout.clone(),
                stderr: req.stderr.clone(),
                terminal: req.terminal,
                ..Default::default()
            })
            .into(),
            pid: pid as u32,
            ..Default::default()
        };
        self.publish(topics::TASK_CREATE_EVENT_TOPIC, Box::new(ev));
        Ok(CreateTaskResponse {
            pid: pid as u32,
            ..Default::default()
        })
    }
}
