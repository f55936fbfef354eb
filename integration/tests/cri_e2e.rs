//! CRI end to end: this test is the kubelet. It speaks the CRI gRPC API (`runtime.v1`, a
//! tonic client generated from `integration/proto/runtime/v1/api.proto`) to a private
//! containerd 1.6 whose CRI plugin uses the weenv snapshotter, and runs pods the way a
//! kubelet does: PullImage → RunPodSandbox (host network, so no CNI; the sandbox image is a
//! pause image built locally and served by the test registry) → CreateContainer →
//! StartContainer → wait for the exit (ContainerStatus) → read the CRI log file →
//! StopPodSandbox → RemovePodSandbox, and checks that nothing of the pod is left (shim
//! processes, mounts, runc state).
//!
//! - Both `disable_snapshot_annotations` settings: `true` (containerd's default: the CRI
//!   plugin sends no labels; the layers' `containerd.io/snapshot/*` annotations and the
//!   content store's distribution-source labels are all the daemon gets) and `false` (the
//!   CRI plugin's `cri.*` labels). Each runs on a fresh daemon and containerd; the container
//!   must print the right output while the registry (counted at a proxy) serves at most a
//!   quarter of the image's layer bytes.
//! - The runtime handler `weenv` (`io.containerd.weenv.v1`, the elastic shim): a pod whose
//!   container asks for 0.25 CPU / 64 MiB (CRI resources: the initial quota) with pod and
//!   container annotations `io.weenv.cpu.max=0.4`, `io.weenv.memory.max=200Mi` (the
//!   maximum). The container's cgroup starts at the request and, under a memory and CPU
//!   burst, rises to exactly the maximum (below what the raise would otherwise give: 0.5 or
//!   1 CPU, 256 MiB) and never beyond.
//! - For comparison (printed, same Debian+python3 image): the same CRI flow with containerd's
//!   overlayfs snapshotter on the original gzip image (a full pull).

mod snapshotter_common;

use anyhow::{bail, ensure, Context, Result};
use snapshotter_common::*;
use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use weenv_integration::containerd::{Containerd, ContainerdOptions};
use weenv_integration::cri::{api, parse_cri_log, Cri, CriOptions, WEENV_HANDLER};

const SCRIPT: &str = "import json, sys; print(json.dumps({'ok': sys.version_info[0]}))";
const EXPECTED: &str = "{\"ok\": 3}";

/// Runs one CRI call with a timeout; the error names the call.
async fn call<T>(
    what: &str,
    secs: u64,
    fut: impl Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T> {
    match tokio::time::timeout(Duration::from_secs(secs), fut).await {
        Ok(Ok(r)) => Ok(r.into_inner()),
        Ok(Err(s)) => bail!("CRI {what}: {:?}: {}", s.code(), s.message()),
        Err(_) => bail!("CRI {what} did not answer within {secs} s"),
    }
}

/// A pod with one container, as the kubelet describes it.
struct PodSpec {
    name: String,
    image: String,
    command: Vec<String>,
    runtime_handler: String,
    pod_annotations: HashMap<String, String>,
    container_annotations: HashMap<String, String>,
    resources: Option<api::LinuxContainerResources>,
    cgroup_parent: String,
}

impl PodSpec {
    fn new(name: &str, image: &str, command: &[&str], cgroup_parent: &str) -> PodSpec {
        PodSpec {
            name: name.into(),
            image: image.into(),
            command: command.iter().map(|s| s.to_string()).collect(),
            runtime_handler: String::new(),
            pod_annotations: HashMap::new(),
            container_annotations: HashMap::new(),
            resources: None,
            cgroup_parent: cgroup_parent.into(),
        }
    }

    fn sandbox_config(&self, log_dir: &Path) -> api::PodSandboxConfig {
        api::PodSandboxConfig {
            metadata: Some(api::PodSandboxMetadata {
                name: self.name.clone(),
                uid: format!("uid-{}-{}", self.name, std::process::id()),
                namespace: "weenv-cri-test".into(),
                attempt: 0,
            }),
            hostname: String::new(),
            log_directory: log_dir.display().to_string(),
            labels: HashMap::new(),
            annotations: self.pod_annotations.clone(),
            linux: Some(api::LinuxPodSandboxConfig {
                cgroup_parent: self.cgroup_parent.clone(),
                security_context: Some(api::LinuxSandboxSecurityContext {
                    namespace_options: Some(api::NamespaceOption {
                        network: api::NamespaceMode::Node as i32,
                        pid: api::NamespaceMode::Container as i32,
                        ipc: api::NamespaceMode::Pod as i32,
                    }),
                }),
            }),
        }
    }
}

/// A pod whose container was started.
struct StartedPod {
    sandbox_id: String,
    container_id: String,
    log_file: PathBuf,
    /// Seconds from the start of PullImage: pulled, container started.
    pulled_s: f64,
    started_s: f64,
    t0: Instant,
    /// [`cni_netns`] before the pod.
    netns_before: Vec<String>,
}

/// The CRI plugin's network namespaces (`/run/netns/cni-*`).
fn cni_netns() -> Vec<String> {
    std::fs::read_dir("/run/netns")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with("cni-"))
        .collect()
}

/// PullImage → RunPodSandbox → CreateContainer → StartContainer.
async fn start_pod(cri: &mut Cri, ctd: &Containerd, spec: &PodSpec) -> Result<StartedPod> {
    let log_dir = ctd.dir().join("pods").join(&spec.name);
    std::fs::create_dir_all(&log_dir)?;
    let sandbox_config = spec.sandbox_config(&log_dir);
    let netns_before = cni_netns();
    let t0 = Instant::now();
    let image = api::ImageSpec {
        image: spec.image.clone(),
        annotations: HashMap::new(),
    };
    let pulled = call(
        "PullImage",
        600,
        cri.image.pull_image(api::PullImageRequest {
            image: Some(image.clone()),
            sandbox_config: Some(sandbox_config.clone()),
        }),
    )
    .await?;
    let pulled_s = t0.elapsed().as_secs_f64();
    ensure!(
        pulled.image_ref.starts_with("sha256:"),
        "PullImage returned {:?}",
        pulled.image_ref
    );
    let sandbox_id = call(
        "RunPodSandbox",
        120,
        cri.runtime.run_pod_sandbox(api::RunPodSandboxRequest {
            config: Some(sandbox_config.clone()),
            runtime_handler: spec.runtime_handler.clone(),
        }),
    )
    .await?
    .pod_sandbox_id;
    let log_path = format!("{}.log", spec.name);
    let container_id = call(
        "CreateContainer",
        120,
        cri.runtime.create_container(api::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.clone(),
            config: Some(api::ContainerConfig {
                metadata: Some(api::ContainerMetadata {
                    name: spec.name.clone(),
                    attempt: 0,
                }),
                image: Some(image),
                command: spec.command.clone(),
                args: vec![],
                working_dir: String::new(),
                envs: vec![],
                labels: HashMap::new(),
                annotations: spec.container_annotations.clone(),
                log_path: log_path.clone(),
                linux: Some(api::LinuxContainerConfig {
                    resources: spec.resources,
                }),
            }),
            sandbox_config: Some(sandbox_config),
        }),
    )
    .await?
    .container_id;
    call(
        "StartContainer",
        120,
        cri.runtime.start_container(api::StartContainerRequest {
            container_id: container_id.clone(),
        }),
    )
    .await?;
    Ok(StartedPod {
        sandbox_id,
        container_id,
        log_file: log_dir.join(log_path),
        pulled_s,
        started_s: t0.elapsed().as_secs_f64(),
        t0,
        netns_before,
    })
}

async fn container_status(
    cri: &mut Cri,
    id: &str,
    verbose: bool,
) -> Result<api::ContainerStatusResponse> {
    call(
        "ContainerStatus",
        30,
        cri.runtime.container_status(api::ContainerStatusRequest {
            container_id: id.into(),
            verbose,
        }),
    )
    .await
}

/// Polls the container's CRI log until it contains `expected` (or the container exited);
/// returns the seconds since `pod.t0` at which it did.
async fn wait_output(cri: &mut Cri, pod: &StartedPod, expected: &str) -> Result<f64> {
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let text = parse_cri_log(&std::fs::read_to_string(&pod.log_file).unwrap_or_default());
        if text.contains(expected) {
            return Ok(pod.t0.elapsed().as_secs_f64());
        }
        let st = container_status(cri, &pod.container_id, false)
            .await?
            .status
            .context("no status")?;
        if st.state == api::ContainerState::ContainerExited as i32 {
            let text = parse_cri_log(&std::fs::read_to_string(&pod.log_file).unwrap_or_default());
            if text.contains(expected) {
                return Ok(pod.t0.elapsed().as_secs_f64());
            }
            bail!(
                "container exited ({}, {}) without printing {expected:?}; log:\n{text}",
                st.exit_code,
                st.reason
            );
        }
        if Instant::now() > deadline {
            bail!("no {expected:?} in the container log within 180 s; log:\n{text}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (ContainerStatus) until the container exited; its status.
async fn wait_exit(cri: &mut Cri, id: &str, secs: u64) -> Result<api::ContainerStatus> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let st = container_status(cri, id, false)
            .await?
            .status
            .context("no status")?;
        if st.state == api::ContainerState::ContainerExited as i32 {
            return Ok(st);
        }
        ensure!(
            Instant::now() < deadline,
            "container {id} still {:?} after {secs} s",
            st.state
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// StopPodSandbox → RemovePodSandbox, then checks that nothing of the pod is left: no
/// process (shim or container) naming its ids, no mount naming them, no runc state, no
/// cgroup, no new CNI network namespace (host network: none was ever made).
async fn remove_pod(cri: &mut Cri, pod: &StartedPod, cgroup: &CgroupParent) -> Result<()> {
    call(
        "StopPodSandbox",
        120,
        cri.runtime.stop_pod_sandbox(api::StopPodSandboxRequest {
            pod_sandbox_id: pod.sandbox_id.clone(),
        }),
    )
    .await?;
    call(
        "RemovePodSandbox",
        120,
        cri.runtime
            .remove_pod_sandbox(api::RemovePodSandboxRequest {
                pod_sandbox_id: pod.sandbox_id.clone(),
            }),
    )
    .await?;
    let ids = [pod.sandbox_id.as_str(), pod.container_id.as_str()];
    let new_netns: Vec<String> = cni_netns()
        .into_iter()
        .filter(|n| !pod.netns_before.contains(n))
        .collect();
    ensure!(
        new_netns.is_empty(),
        "network namespaces made: {new_netns:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let mut left = Vec::new();
        for id in ids {
            left.extend(
                processes_naming(id)
                    .into_iter()
                    .map(|p| format!("process {p}")),
            );
            left.extend(mounts_naming(id).into_iter().map(|m| format!("mount {m}")));
            let runc = Path::new("/run/containerd/runc/k8s.io").join(id);
            if runc.exists() {
                left.push(format!("runc state {}", runc.display()));
            }
            for h in std::fs::read_dir("/sys/fs/cgroup")
                .into_iter()
                .flatten()
                .flatten()
            {
                let cg = h.path().join(cgroup.0.trim_start_matches('/')).join(id);
                if cg.exists() {
                    left.push(format!("cgroup {}", cg.display()));
                }
            }
        }
        if left.is_empty() {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "left behind after RemovePodSandbox: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `pid: cmdline` of processes with an argument containing `needle`.
fn processes_naming(needle: &str) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().filter(|n| n.parse::<u32>().is_ok()) else {
            continue;
        };
        if let Ok(cmd) = std::fs::read(e.path().join("cmdline")) {
            let text = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if text.contains(needle) {
                out.push(format!("{pid}: {text}"));
            }
        }
    }
    out
}

/// Mount points (from /proc/self/mountinfo) containing `needle`.
fn mounts_naming(needle: &str) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| m.contains(needle))
        .map(str::to_string)
        .collect()
}

/// A cgroup parent for this test's pods (`/<name>` in every hierarchy), removed on drop
/// (after the containerd that used it was dropped: bind it first).
struct CgroupParent(String);

impl CgroupParent {
    fn new() -> CgroupParent {
        CgroupParent(format!("/weenv-cri-test-{}", std::process::id()))
    }
}

impl Drop for CgroupParent {
    fn drop(&mut self) {
        let rel = self.0.trim_start_matches('/');
        for h in std::fs::read_dir("/sys/fs/cgroup")
            .into_iter()
            .flatten()
            .flatten()
        {
            let dir = h.path().join(rel);
            // Children first (containerd removes them with the containers; this is for
            // failures), then the parent; rmdir only succeeds on empty cgroups.
            for c in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                if c.path().is_dir() {
                    let _ = std::fs::remove_dir(c.path());
                }
            }
            let _ = std::fs::remove_dir(&dir);
        }
        let _ = std::fs::remove_dir(Path::new("/sys/fs/cgroup").join(rel));
    }
}

/// Figures of one pod run.
struct Figures {
    served: u64,
    pulled_s: f64,
    started_s: f64,
    first_output_s: f64,
}

/// Starts a containerd with the CRI plugin on `snapshotter` (and `daemon` as its weenv
/// proxy snapshotter, if any).
fn cri_containerd(
    py: &PythonImage,
    sandbox_image: &str,
    snapshotter: &str,
    disable_snapshot_annotations: bool,
    daemon: Option<&Daemon>,
) -> Result<Containerd> {
    let ctd = Containerd::start(ContainerdOptions {
        proxy_snapshotter: daemon.map(|d| d.socket.clone()),
        cri: Some(CriOptions {
            snapshotter: snapshotter.into(),
            disable_snapshot_annotations,
            sandbox_image: sandbox_image.into(),
            plain_http: vec![py.reg.host(), py.proxy.host()],
            cni: None,
        }),
        ..Default::default()
    })?;
    if let Some(d) = daemon {
        d.use_containerd(&ctd)?;
    }
    Ok(ctd)
}

/// The kubelet's flow for a pod running `python3 -c SCRIPT` from `image`: checks the output
/// and the exit code, removes the pod; registry bytes are counted from PullImage on (the
/// sandbox image is pulled before, from the registry directly, not through the proxy).
async fn run_python_pod(
    py: &PythonImage,
    ctd: &Containerd,
    sandbox_image: &str,
    name: &str,
    image: &str,
    cgroup: &CgroupParent,
) -> Result<Figures> {
    let mut cri = Cri::connect(ctd).await?;
    call(
        "PullImage (sandbox image)",
        300,
        cri.image.pull_image(api::PullImageRequest {
            image: Some(api::ImageSpec {
                image: sandbox_image.into(),
                annotations: HashMap::new(),
            }),
            sandbox_config: None,
        }),
    )
    .await?;
    py.proxy.stats().clear();
    let spec = PodSpec::new(name, image, &["python3", "-c", SCRIPT], &cgroup.0);
    let pod = start_pod(&mut cri, ctd, &spec)
        .await
        .with_context(|| format!("containerd log:\n{}", ctd.log()))?;
    // The CRI plugin keeps its sandbox state (and the sandbox's /dev/shm mount) in this
    // containerd's private temp dir.
    let sandbox_dir = ctd
        .state()
        .join("io.containerd.grpc.v1.cri/sandboxes")
        .join(&pod.sandbox_id);
    ensure!(
        sandbox_dir.is_dir(),
        "sandbox state not in {}",
        sandbox_dir.display()
    );
    let first_output_s = wait_output(&mut cri, &pod, EXPECTED).await?;
    let served = py.proxy.stats().bytes_served();
    let st = wait_exit(&mut cri, &pod.container_id, 60).await?;
    ensure!(st.exit_code == 0, "exit {} ({})", st.exit_code, st.reason);
    ensure!(
        Path::new(&st.log_path) == pod.log_file,
        "log path {} != {}",
        st.log_path,
        pod.log_file.display()
    );
    let out = parse_cri_log(&std::fs::read_to_string(&pod.log_file)?);
    ensure!(out == format!("{EXPECTED}\n"), "container output {out:?}");
    remove_pod(&mut cri, &pod, cgroup).await?;
    Ok(Figures {
        served,
        pulled_s: pod.pulled_s,
        started_s: pod.started_s,
        first_output_s,
    })
}

/// One cgroup reading of a container: CPU quota (µs per period), period, memory limit.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Quota {
    cpu_quota: i64,
    cpu_period: i64,
    memory: u64,
}

/// Reads the container's CPU quota and memory limit from its cgroup (`cgroups_path` as in
/// its OCI spec): v1 `cpu.cfs_quota_us`/`cpu.cfs_period_us`/`memory.limit_in_bytes` when the
/// v1 memory controller has it, else v2 `cpu.max`/`memory.max`. `None` once it is gone.
fn read_quota(cgroups_path: &str) -> Option<Quota> {
    let rel = cgroups_path.trim_start_matches('/');
    let read = |p: PathBuf| {
        std::fs::read_to_string(p)
            .ok()
            .map(|s| s.trim().to_string())
    };
    let v1 = Path::new("/sys/fs/cgroup/memory").join(rel);
    if v1.is_dir() {
        let cpu = Path::new("/sys/fs/cgroup/cpu").join(rel);
        return Some(Quota {
            cpu_quota: read(cpu.join("cpu.cfs_quota_us"))?.parse().ok()?,
            cpu_period: read(cpu.join("cpu.cfs_period_us"))?.parse().ok()?,
            memory: read(v1.join("memory.limit_in_bytes"))?.parse().ok()?,
        });
    }
    let v2 = Path::new("/sys/fs/cgroup").join(rel);
    let max = read(v2.join("cpu.max"))?;
    let mut f = max.split_whitespace();
    let cpu_quota = match f.next()? {
        "max" => -1,
        q => q.parse().ok()?,
    };
    Some(Quota {
        cpu_quota,
        cpu_period: f.next()?.parse().ok()?,
        memory: read(v2.join("memory.max"))?.parse().unwrap_or(u64::MAX),
    })
}

/// The elastic pod's workload: grows to 144 MiB in 4 MiB steps (the limit rises from 64 MiB:
/// 128 MiB, then the 200 MiB maximum, which holds it), prints `grown`, then runs two busy
/// processes until its CPU quota (read from its own cgroup) left the initial 25000 µs, or
/// for 15 s; then idles 3 s (the raised quota stays: no scale-down while the test watches)
/// so that the test's polling sees it before the container exits and its cgroup is removed
/// (CI once missed it: the container exited within the test's 50 ms poll plus a CRI status
/// call on a loaded machine); prints `done`. Stopping at the raise keeps the test independent
/// of how much CPU a loaded machine has left for a larger quota.
const ELASTIC_SCRIPT: &str = r#"
import glob, os, time

def quota():
    for p in glob.glob('/sys/fs/cgroup/cpu*/cpu.cfs_quota_us') + ['/sys/fs/cgroup/cpu.max']:
        try:
            with open(p) as f:
                return f.read().split()[0]
        except OSError:
            pass
    return None

a = []
for _ in range(36):
    a.append(b'x' * (4 << 20))
    time.sleep(0.05)
print('grown', flush=True)
pid = os.fork()
end = time.time() + 15
while time.time() < end and quota() in (None, '25000'):
    for _ in range(20000):
        pass
if pid == 0:
    os._exit(0)
os.wait()
time.sleep(3)
print('done', flush=True)
"#;

/// A pod with the weenv runtime handler: initial quota from the container's CRI resources,
/// maximum from `io.weenv.*` pod and container annotations; the cgroup must start at the
/// initial values and rise to exactly the maximum under load.
async fn elastic_pod(ctd: &Containerd, image: &str, cgroup: &CgroupParent) -> Result<()> {
    const PERIOD: i64 = 100_000;
    const INITIAL_CPU: i64 = 25_000; // 0.25 CPU
    const MAX_CPU: i64 = 40_000; // io.weenv.cpu.max=0.4
    const INITIAL_MEM: u64 = 64 << 20;
    const MAX_MEM: u64 = 200 << 20; // io.weenv.memory.max=200Mi
                                    // Idle 2 s (the test reads the initial values), then ELASTIC_SCRIPT. The maxima are
                                    // below what a raise gives (×2 or ×4: 0.5 or 1 CPU; 256 MiB): a raise is clamped to them.
    let script = "echo ready; sleep 2; exec python3 -c \"$0\"";
    let status_dir = ctd.dir().join("weenv-status");
    let mut spec = PodSpec::new(
        "elastic",
        image,
        &["sh", "-c", script, ELASTIC_SCRIPT],
        &cgroup.0,
    );
    spec.runtime_handler = WEENV_HANDLER.into();
    spec.pod_annotations = [
        ("io.weenv.cpu.max", "0.4"),
        ("io.weenv.status.dir", &status_dir.display().to_string()),
        (
            "io.weenv.ledger.dir",
            &ctd.dir().join("weenv-ledger").display().to_string(),
        ),
        // No scale-down while the test watches.
        ("io.weenv.cpu.scale_down_window_s", "600"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    spec.container_annotations = [("io.weenv.memory.max".to_string(), "200Mi".to_string())].into();
    spec.resources = Some(api::LinuxContainerResources {
        cpu_period: PERIOD,
        cpu_quota: INITIAL_CPU,
        cpu_shares: 256,
        memory_limit_in_bytes: INITIAL_MEM as i64,
    });
    let mut cri = Cri::connect(ctd).await?;
    let pod = start_pod(&mut cri, ctd, &spec)
        .await
        .with_context(|| format!("containerd log:\n{}", ctd.log()))?;
    // The container's cgroup, from its OCI spec (verbose ContainerStatus).
    let info = container_status(&mut cri, &pod.container_id, true)
        .await?
        .info;
    let info: serde_json::Value =
        serde_json::from_str(info.get("info").context("no verbose info")?)?;
    let cgroups_path = info["runtimeSpec"]["linux"]["cgroupsPath"]
        .as_str()
        .context("no cgroupsPath in the runtime spec")?
        .to_string();
    ensure!(
        info["runtimeSpec"]["annotations"]["io.weenv.cpu.max"] == "0.4"
            && info["runtimeSpec"]["annotations"]["io.weenv.memory.max"] == "200Mi",
        "annotations did not reach the runtime spec: {}",
        info["runtimeSpec"]["annotations"]
    );
    let mut readings: Vec<Quota> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(q) = read_quota(&cgroups_path) {
            if readings.last() != Some(&q) {
                readings.push(q);
            }
        }
        let st = container_status(&mut cri, &pod.container_id, false)
            .await?
            .status
            .context("no status")?;
        if st.state == api::ContainerState::ContainerExited as i32 {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "elastic container still running after 120 s; readings {readings:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let st = wait_exit(&mut cri, &pod.container_id, 10).await?;
    let out = parse_cri_log(&std::fs::read_to_string(&pod.log_file)?);
    let changes_file = status_dir
        .join("k8s.io")
        .join(&pod.container_id)
        .join("changes.jsonl");
    let changes = std::fs::read_to_string(&changes_file).unwrap_or_default();
    eprintln!("CRI runtime handler weenv: cgroup {cgroups_path} readings {readings:?}");
    eprintln!("shim's quota changes:\n{changes}");
    ensure!(
        st.exit_code == 0 && out == "ready\ngrown\ndone\n",
        "exit {} ({}), output {out:?}\ncontainerd log:\n{}",
        st.exit_code,
        st.reason,
        ctd.log()
    );
    let first = readings.first().context("no cgroup reading")?;
    ensure!(
        *first
            == Quota {
                cpu_quota: INITIAL_CPU,
                cpu_period: PERIOD,
                memory: INITIAL_MEM
            },
        "initial cgroup values {first:?} are not the container's request (0.25 CPU, 64 MiB)"
    );
    let top_cpu = readings.iter().map(|q| q.cpu_quota).max().unwrap_or(0);
    let top_mem = readings.iter().map(|q| q.memory).max().unwrap_or(0);
    ensure!(
        readings.iter().all(|q| q.cpu_period == PERIOD),
        "period changed: {readings:?}"
    );
    ensure!(
        top_cpu == MAX_CPU,
        "CPU quota peaked at {top_cpu} µs/period, not the maximum {MAX_CPU} \
         (io.weenv.cpu.max=0.4): {readings:?}\n{changes}"
    );
    ensure!(
        top_mem == MAX_MEM,
        "memory limit peaked at {top_mem}, not the maximum {MAX_MEM} \
         (io.weenv.memory.max=200Mi): {readings:?}\n{changes}"
    );
    // The shim's records agree: it started from the request and stayed within the maximum.
    for line in changes.lines() {
        let c: serde_json::Value = serde_json::from_str(line)?;
        let new = c["new"].as_u64().context("new")?;
        match c["resource"].as_str() {
            Some("cpu") => ensure!(new <= 400, "CPU above the maximum: {line}"),
            Some("memory") => ensure!(new <= MAX_MEM, "memory above the maximum: {line}"),
            _ => bail!("unknown change {line}"),
        }
    }
    remove_pod(&mut cri, &pod, cgroup).await?;
    eprintln!(
        "CRI runtime handler weenv: cgroup started at {}m CPU / {} MiB (request), peaked at \
         {}m / {} MiB (io.weenv.cpu.max=0.4, io.weenv.memory.max=200Mi)",
        first.cpu_quota * 1000 / PERIOD,
        first.memory >> 20,
        top_cpu * 1000 / PERIOD,
        top_mem >> 20
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, containerd (CRI plugin), runc, fuse, docker-registry, skopeo, umoci, debootstrap, busybox-static"]
async fn cri_pods_pull_lazily_in_both_annotation_settings_and_the_weenv_handler_sets_quota(
) -> Result<()> {
    let cgroup = CgroupParent::new();
    let py = PythonImage::start().await?;
    let pause = weenv_integration::images::pause()?;
    let sandbox_image = py.reg.push(&pause, "pause:1")?;
    let proxy = &py.proxy;
    let weenv = format!("{}/python:weenv", proxy.host());
    let gz = format!("{}/python:gz", proxy.host());
    let layer_bytes = image_layer_bytes(&py.client, &py.direct).await?;
    let load = || {
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    };

    for disable_snapshot_annotations in [true, false] {
        let label = if disable_snapshot_annotations {
            "disable_snapshot_annotations = true (no CRI labels)"
        } else {
            "disable_snapshot_annotations = false (CRI labels)"
        };
        // Only the proxy is configured in the daemon (as in stock_client.rs): containerd
        // records the registry without its port, and the daemon takes the configured host
        // of that name, so the proxy counts every byte.
        let opts = DaemonOptions {
            plain_http: vec![proxy.host()],
            ..py.daemon_options()
        };
        let daemon = Daemon::start(
            &py.tmp
                .path()
                .join(format!("snap-{disable_snapshot_annotations}")),
            &opts,
        )?;
        let ctd = cri_containerd(
            &py,
            &sandbox_image,
            "weenv",
            disable_snapshot_annotations,
            Some(&daemon),
        )?;
        let f = run_python_pod(&py, &ctd, &sandbox_image, "lazy", &weenv, &cgroup)
            .await
            .with_context(|| format!("{label}; daemon log:\n{}", daemon.log()))?;
        let remote = daemon.metric("weenv_remote_prepares_total{outcome=\"remote\"}")?;
        eprintln!(
            "CRI, weenv snapshotter, {label}: registry served {} bytes = {:.1}% of the \
             {layer_bytes} layer bytes; pulled {:.2} s, container started {:.2} s, first \
             output {:.2} s after PullImage; {remote} remote snapshots (load {})",
            f.served,
            100.0 * f.served as f64 / layer_bytes as f64,
            f.pulled_s,
            f.started_s,
            f.first_output_s,
            load()
        );
        ensure!(
            remote >= 3,
            "{label}: layers were not mounted lazily ({remote} remote)\n{}",
            daemon.log()
        );
        ensure!(
            f.served * 4 <= layer_bytes,
            "{label}: registry served {} of {layer_bytes} layer bytes (more than a quarter)\n{:?}",
            f.served,
            proxy.stats().summary()
        );
        if !disable_snapshot_annotations {
            elastic_pod(&ctd, &weenv, &cgroup)
                .await
                .with_context(|| format!("weenv runtime handler; {label}"))?;
        }
        drop(ctd);
        drop(daemon);
    }

    // A full pull for comparison: the same CRI flow with containerd's overlayfs snapshotter
    // on the original gzip image.
    let ctd = cri_containerd(&py, &sandbox_image, "overlayfs", true, None)?;
    let f = run_python_pod(&py, &ctd, &sandbox_image, "full", &gz, &cgroup).await?;
    eprintln!(
        "CRI, overlayfs snapshotter, gzip image (full pull): registry served {} bytes; pulled \
         {:.2} s, container started {:.2} s, first output {:.2} s after PullImage (load {})",
        f.served,
        f.pulled_s,
        f.started_s,
        f.first_output_s,
        load()
    );
    drop(ctd);
    Ok(())
}
