//! The kubelet's side of the CRI for the end-to-end tests (cri_e2e.rs on the weenv
//! snapshotter, shim_cri.rs with the runtime handler only): a pod with one container run
//! PullImage → RunPodSandbox (host network, no CNI) → CreateContainer → StartContainer,
//! waiting on ContainerStatus, reading the CRI log, StopPodSandbox → RemovePodSandbox with a
//! check that nothing of the pod is left; the container's quota read from its cgroup (v1 or
//! v2); [`elastic_pod`], the weenv runtime handler's scenario.
#![allow(dead_code)]

use anyhow::{bail, ensure, Context, Result};
use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use weenv_integration::containerd::Containerd;
use weenv_integration::cri::{api, parse_cri_log, Cri, WEENV_HANDLER};

/// Runs one CRI call with a timeout; the error names the call.
pub async fn call<T>(
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
pub struct PodSpec {
    pub name: String,
    pub image: String,
    pub command: Vec<String>,
    pub runtime_handler: String,
    pub pod_annotations: HashMap<String, String>,
    pub container_annotations: HashMap<String, String>,
    pub resources: Option<api::LinuxContainerResources>,
    pub cgroup_parent: String,
    /// PullImage first (default); `false` for images put into containerd's `k8s.io`
    /// namespace directly (`ctr images import`, see [`wait_image_known`]).
    pub pull: bool,
}

impl PodSpec {
    pub fn new(name: &str, image: &str, command: &[&str], cgroup_parent: &str) -> PodSpec {
        PodSpec {
            name: name.into(),
            image: image.into(),
            command: command.iter().map(|s| s.to_string()).collect(),
            runtime_handler: String::new(),
            pod_annotations: HashMap::new(),
            container_annotations: HashMap::new(),
            resources: None,
            cgroup_parent: cgroup_parent.into(),
            pull: true,
        }
    }

    pub fn sandbox_config(&self, log_dir: &Path) -> api::PodSandboxConfig {
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
pub struct StartedPod {
    pub sandbox_id: String,
    pub container_id: String,
    pub log_file: PathBuf,
    /// Seconds from the start of PullImage: pulled, container started.
    pub pulled_s: f64,
    pub started_s: f64,
    pub t0: Instant,
    /// [`cni_netns`] before the pod.
    pub netns_before: Vec<String>,
}

/// The CRI plugin's network namespaces (`/run/netns/cni-*`).
pub fn cni_netns() -> Vec<String> {
    std::fs::read_dir("/run/netns")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with("cni-"))
        .collect()
}

/// Waits (ImageStatus, up to `secs`) until the CRI plugin knows image `name`, e.g. one that
/// `ctr -n k8s.io images import` put into containerd (the plugin picks it up from the
/// image event); its id.
pub async fn wait_image_known(cri: &mut Cri, name: &str, secs: u64) -> Result<String> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let st = call(
            "ImageStatus",
            30,
            cri.image.image_status(api::ImageStatusRequest {
                image: Some(api::ImageSpec {
                    image: name.into(),
                    annotations: HashMap::new(),
                }),
                verbose: false,
            }),
        )
        .await?;
        if let Some(img) = st.image.filter(|i| !i.id.is_empty()) {
            return Ok(img.id);
        }
        ensure!(
            Instant::now() < deadline,
            "the CRI plugin does not know image {name} after {secs} s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// PullImage (unless `spec.pull` is false) → RunPodSandbox → CreateContainer →
/// StartContainer.
pub async fn start_pod(cri: &mut Cri, ctd: &Containerd, spec: &PodSpec) -> Result<StartedPod> {
    let log_dir = ctd.dir().join("pods").join(&spec.name);
    std::fs::create_dir_all(&log_dir)?;
    let sandbox_config = spec.sandbox_config(&log_dir);
    let netns_before = cni_netns();
    let t0 = Instant::now();
    let image = api::ImageSpec {
        image: spec.image.clone(),
        annotations: HashMap::new(),
    };
    if spec.pull {
        let pulled = call(
            "PullImage",
            600,
            cri.image.pull_image(api::PullImageRequest {
                image: Some(image.clone()),
                sandbox_config: Some(sandbox_config.clone()),
            }),
        )
        .await?;
        ensure!(
            pulled.image_ref.starts_with("sha256:"),
            "PullImage returned {:?}",
            pulled.image_ref
        );
    }
    let pulled_s = t0.elapsed().as_secs_f64();
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

pub async fn container_status(
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
pub async fn wait_output(cri: &mut Cri, pod: &StartedPod, expected: &str) -> Result<f64> {
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
pub async fn wait_exit(cri: &mut Cri, id: &str, secs: u64) -> Result<api::ContainerStatus> {
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
pub async fn remove_pod(cri: &mut Cri, pod: &StartedPod, cgroup: &CgroupParent) -> Result<()> {
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
            // v1: one directory per hierarchy; v2: the unified tree itself.
            let hierarchies = std::fs::read_dir("/sys/fs/cgroup")
                .into_iter()
                .flatten()
                .flatten()
                .map(|h| h.path())
                .chain([PathBuf::from("/sys/fs/cgroup")]);
            for h in hierarchies {
                let cg = h.join(cgroup.0.trim_start_matches('/')).join(id);
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
pub fn processes_naming(needle: &str) -> Vec<String> {
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
pub fn mounts_naming(needle: &str) -> Vec<String> {
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
pub struct CgroupParent(pub String);

impl CgroupParent {
    pub fn new() -> CgroupParent {
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

/// One cgroup reading of a container: CPU quota (µs per period), period, memory limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Quota {
    pub cpu_quota: i64,
    pub cpu_period: i64,
    pub memory: u64,
}

/// Reads the container's CPU quota and memory limit from its cgroup (`cgroups_path` as in
/// its OCI spec): v1 `cpu.cfs_quota_us`/`cpu.cfs_period_us`/`memory.limit_in_bytes` when the
/// v1 memory controller has it, else v2 `cpu.max`/`memory.max`. `None` once it is gone.
pub fn read_quota(cgroups_path: &str) -> Option<Quota> {
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

/// What [`elastic_pod`] saw.
pub struct ElasticPod {
    /// The cgroup version the shim ran the container on (`status.json`).
    pub cgroup: String,
    /// Seconds from the pod's first call (PullImage, or RunPodSandbox without `pull`) to the
    /// container's exit.
    pub run_s: f64,
}

/// A pod with the weenv runtime handler: initial quota from the container's CRI resources
/// (0.25 CPU, 64 MiB), maximum from `io.weenv.*` pod and container annotations (0.4 CPU,
/// 200 MiB); the cgroup must start at the initial values and rise to exactly the maximum
/// under load, and the shim's records stay within it. `command` is the workload: it prints
/// `ready`, idles 2 s (the test reads the initial values), grows to 144 MiB in 4 MiB steps
/// (64 → 128 MiB → the 200 MiB maximum), prints `grown`, runs two busy processes until its
/// CPU quota left the initial 25000 µs (or for 15 s), idles 3 s so that the test's polling
/// sees the raised quota before the cgroup goes, and prints `done`. The maxima are below what
/// a raise gives (×2 or ×4: 0.5 or 1 CPU; 256 MiB): a raise is clamped to them. `pull`:
/// PullImage first ([`PodSpec::pull`]).
pub async fn elastic_pod(
    ctd: &Containerd,
    image: &str,
    cgroup: &CgroupParent,
    command: &[&str],
    pull: bool,
) -> Result<ElasticPod> {
    const PERIOD: i64 = 100_000;
    const INITIAL_CPU: i64 = 25_000; // 0.25 CPU
    const MAX_CPU: i64 = 40_000; // io.weenv.cpu.max=0.4
    const INITIAL_MEM: u64 = 64 << 20;
    const MAX_MEM: u64 = 200 << 20; // io.weenv.memory.max=200Mi
    let status_dir = ctd.dir().join("weenv-status");
    let mut spec = PodSpec::new("elastic", image, command, &cgroup.0);
    spec.pull = pull;
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
    // Generous for an emulated VM (~10x slower); a hang, not a timing bound.
    let deadline = Instant::now() + Duration::from_secs(600);
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
            "elastic container still running after 600 s; readings {readings:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let st = wait_exit(&mut cri, &pod.container_id, 10).await?;
    let run_s = pod.t0.elapsed().as_secs_f64();
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
    let status_file = changes_file.with_file_name("status.json");
    let status: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&status_file)
            .with_context(|| format!("read {}", status_file.display()))?,
    )?;
    ensure!(status["elastic"] == true, "not elastic: {status}");
    let version = status["cgroup"]
        .as_str()
        .context("no cgroup version")?
        .to_string();
    remove_pod(&mut cri, &pod, cgroup).await?;
    eprintln!(
        "CRI runtime handler weenv (cgroup {version}): cgroup started at {}m CPU / {} MiB \
         (request), peaked at {}m / {} MiB (io.weenv.cpu.max=0.4, io.weenv.memory.max=200Mi); \
         {run_s:.1} s from the first CRI call to the exit",
        first.cpu_quota * 1000 / PERIOD,
        first.memory >> 20,
        top_cpu * 1000 / PERIOD,
        top_mem >> 20
    );
    Ok(ElasticPod {
        cgroup: version,
        run_s,
    })
}
