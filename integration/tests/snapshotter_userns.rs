//! A user-namespaced container on a lazily pulled weenv image, as containerd's Go client makes
//! one: `stockrun -remap N` (integration/go/stockrun) pulls with unpack (the weenv layer becomes
//! a remote snapshot, no labels of its own), then `WithRemappedSnapshot(id, image, N, N)`
//! (containerd prepares `<chain>-N-N-remap` on the image's chain, chowns every file by N,
//! commits it, and prepares the container's snapshot on it) and `oci.WithUserNamespace`
//! (container ids 0-65535 mapped to host ids N-N+65535 in the runtime spec). Inside, the image's
//! files and the container's root must show their image owners (root: 0:0), as on containerd's
//! overlayfs snapshotter with the gzip image: the container's root takes the owner of its
//! parent's root, which containerd chowned to N (without that it shows as 65534, "nobody",
//! and is not the container's root's to write).

use anyhow::{ensure, Context, Result};
use std::process::Command;
use weenv_integration::containerd::Containerd;
use weenv_integration::stack::Stack;
use weenv_integration::{images, stockrun};

/// Host uid/gid that container root maps to.
const REMAP: u32 = 100000;
/// What the container prints: the owners of its root, a directory, a file of the image and one
/// it writes into its root.
const SCRIPT: &str =
    "stat -c '%u:%g %n' / /etc /bin/busybox; touch /new && stat -c '%u:%g %n' /new; id -u";

fn stockrun_remapped(
    bin: &std::path::Path,
    ctd: &Containerd,
    ns: &str,
    snapshotter: &str,
    image: &str,
) -> Result<String> {
    let o = Command::new(bin)
        .arg("-address")
        .arg(ctd.address())
        .args(["-namespace", ns, "-snapshotter", snapshotter, "-plain-http"])
        .args(["-remap", &REMAP.to_string()])
        .args([image, "sh", "-c", SCRIPT])
        .output()
        .context("running stockrun")?;
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    );
    ensure!(
        o.status.success(),
        "stockrun -remap {image} on {snapshotter} failed ({}):\n{out}{err}\ncontainerd log:\n{}",
        o.status,
        ctd.log()
    );
    Ok(out)
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, containerd, runc, fuse, docker-registry, skopeo, umoci, go + golang-github-containerd-containerd-dev"]
async fn remapped_container_on_a_lazy_image_sees_its_owners() -> Result<()> {
    let s = Stack::builder().proxy().use_containerd().start()?;
    let bin = stockrun::build(&s.root().join("go"))?;
    let img = s.push_converted(&images::busybox()?, "busybox").await?;
    let (gz, weenv) = (img.gz, img.weenv);
    let (daemon, ctd) = (&s.daemon, &s.ctd);

    // The control: containerd's overlayfs snapshotter, the gzip image (a full pull).
    let want = stockrun_remapped(&bin, ctd, "ovl", "overlayfs", &gz)?;
    let owners: Vec<&str> = want.lines().collect();
    ensure!(
        owners == ["0:0 /", "0:0 /etc", "0:0 /bin/busybox", "0:0 /new", "0"],
        "overlayfs control: {want}"
    );
    let got = stockrun_remapped(&bin, ctd, "lazy", "weenv", &weenv)?;
    println!("inside the remapped container (weenv, lazy):\n{got}");
    ensure!(
        got == want,
        "owners inside the remapped container differ from overlayfs's:\nweenv:\n{got}\noverlayfs:\n{want}\ndaemon log:\n{}",
        daemon.log()
    );
    let remote = daemon.metric("weenv_remote_prepares_total{outcome=\"remote\"}")?;
    ensure!(
        remote >= 1,
        "the image was not pulled lazily ({remote} remote snapshots)\n{}",
        daemon.log()
    );
    drop(s);
    Ok(())
}
