//! The weenv runtime handler through containerd's CRI plugin, without the snapshotter or a
//! registry, so that it also runs inside the cgroup v2 VM of `scripts/vm-shim-tests.sh`
//! (cri_e2e.rs runs the same scenario on the weenv snapshotter with a Python image, on this
//! machine's cgroup v1): a private containerd 1.6 with the CRI plugin on overlayfs, the
//! busybox image and a locally built pause image put into its `k8s.io` namespace with
//! `ctr images import` (no PullImage), then the kubelet's calls for a pod with runtime
//! handler `weenv`: the container asks for 0.25 CPU / 64 MiB (CRI resources) with
//! `io.weenv.cpu.max=0.4` / `io.weenv.memory.max=200Mi` (pod and container annotations);
//! its cgroup must start at the request and rise to exactly the maximum under a memory and
//! CPU burst ([`cri_common::elastic_pod`]), on the machine's cgroup version, and nothing of
//! the pod may be left after RemovePodSandbox.

mod cri_common;
mod shim_common;

use anyhow::{Context, Result};
use cri_common::{elastic_pod, wait_image_known, CgroupParent};
use weenv_integration::containerd::{Containerd, ContainerdOptions};
use weenv_integration::cri::{Cri, CriOptions};

/// Name the pause image is imported under (the CRI plugin's `sandbox_image`).
const PAUSE_REF: &str = "localhost/pause:pause";

/// [`elastic_pod`]'s workload in busybox `sh` + `awk` (cri_e2e.rs has it in Python): idle
/// 2 s; grow to 144 MiB in 1 MiB steps (a 50 ms pause every 4 MiB); two busy loops that
/// stop once the CPU quota (the container's own cgroup: v2 `cpu.max` in its cgroup
/// namespace, v1 `cpu.cfs_quota_us`, read with the shell's `read`, no fork) left the initial
/// 25000 µs, or after 15 s; idle 3 s; `done`.
const WORKLOAD: &str = r#"echo ready; sleep 2
awk 'BEGIN { for (i = 0; i < 144; i++) { a[i] = sprintf("%1048576s", ""); if (i % 4 == 0) system("sleep 0.05") }; print "grown" }'
q() { q=; for p in /sys/fs/cgroup/cpu.max /sys/fs/cgroup/cpu*/cpu.cfs_quota_us; do if [ -r "$p" ]; then read -r q _ < "$p"; return; fi; done; }
busy() {
  read -r t0 _ < /proc/uptime; t0=${t0%.*}
  while :; do
    q; case "$q" in ''|25000) ;; *) return ;; esac
    read -r t _ < /proc/uptime; [ "${t%.*}" -lt $((t0 + 15)) ] || return
    i=0; while [ $i -lt 2000 ]; do i=$((i+1)); done
  done
}
busy & busy; wait; sleep 3; echo done"#;

/// Imports the pause image (built offline, [`weenv_integration::images::pause`]) into the
/// `k8s.io` namespace as [`PAUSE_REF`].
fn import_pause(ctd: &Containerd) -> Result<()> {
    let pause = weenv_integration::images::pause()?;
    let tar = ctd.dir().join("pause-oci.tar");
    let st = std::process::Command::new("tar")
        .arg("-C")
        .arg(&pause.layout)
        .arg("-cf")
        .arg(&tar)
        .arg(".")
        .status()
        .context("run tar")?;
    anyhow::ensure!(st.success(), "tar of the pause image failed: {st}");
    let tar = tar.display().to_string();
    ctd.ctr_ok(&[
        "images",
        "import",
        "--base-name",
        "localhost/pause",
        "--snapshotter=overlayfs",
        &tar,
    ])?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, containerd (CRI plugin), runc, umoci, busybox-static"]
async fn cri_pod_with_the_weenv_handler_starts_at_the_request_and_rises_to_the_maximum(
) -> Result<()> {
    shim_common::require()?;
    // Dropped after the containerd (declared first).
    let cgroup = CgroupParent::new();
    let ctd = Containerd::start(ContainerdOptions {
        // The CRI plugin's namespace: images imported there are the kubelet's images.
        namespace: "k8s.io".into(),
        cri: Some(CriOptions {
            snapshotter: "overlayfs".into(),
            disable_snapshot_annotations: true,
            sandbox_image: PAUSE_REF.into(),
            plain_http: vec![],
            cni: None,
            mirrors: vec![],
        }),
        ..Default::default()
    })?;
    let image = ctd.import_busybox("overlayfs")?;
    import_pause(&ctd)?;
    let mut cri = Cri::connect(&ctd).await?;
    for name in [image, PAUSE_REF] {
        wait_image_known(&mut cri, name, 60)
            .await
            .with_context(|| format!("containerd log:\n{}", ctd.log()))?;
    }
    let r = elastic_pod(&ctd, image, &cgroup, &["sh", "-c", WORKLOAD], false).await?;
    assert_eq!(
        r.cgroup,
        shim_common::machine_cgroup_version(),
        "the shim used another cgroup version than the machine's"
    );
    println!(
        "CRI pod, runtime handler weenv, cgroup {}: {:.1} s from RunPodSandbox to the exit",
        r.cgroup, r.run_s
    );
    drop(ctd);
    Ok(())
}
