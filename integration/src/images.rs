//! Test images built offline from what the machine has, cached across runs.
//!
//! - [`busybox`]: busybox-static in a one-layer OCI image, built with `umoci` (a few seconds).
//! - [`pause`]: a pod sandbox image for CRI (busybox-static as `/bin/sleep`).
//! - [`python`]: a Debian bookworm rootfs with python3, built with
//!   `debootstrap --variant=minbase --include=python3` from the machine's configured apt mirror
//!   (read at run time from `/etc/apt/sources.list{,.d/*}`; this repository names no package
//!   host; apt caches and lists removed like Debian's own images), packed as a 3-layer OCI image
//!   with gzip layers like a normal image (≈ 175 MB of tar). First build ≈ 100 s here
//!   (debootstrap 85 s, mostly the mirror download; tar+gzip 15 s), then cached.
//! - [`python_testsuite`]: [`python`] plus Debian's `libpython3.11-testsuite` (CPython's
//!   regression tests), its own debootstrap (≈ 2 min once).
//! - [`python_fast`]: the fallback when debootstrap cannot run: busybox plus the host's own
//!   python3 interpreter, its shared libraries and standard library, 2 layers (≈ 5 s to build,
//!   ≈ 20 MB gzipped).
//!
//! Images are cached under [`cache_root`] (`$WEENV_TEST_IMAGES` or
//! `/var/tmp/weenv-test-images`) in a directory keyed by [`IMAGES_VERSION`]; a build happens in a
//! temp sibling and is renamed into place, under an exclusive `flock`, so parallel tests build an
//! image once. Bump [`IMAGES_VERSION`] whenever a recipe changes.

use anyhow::{bail, Context, Result};
use nix::fcntl::{Flock, FlockArg};
use sha2::{Digest as _, Sha256};
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Version of the image recipes; part of every cache directory name.
pub const IMAGES_VERSION: &str = "v2";

/// An image in an OCI layout directory, named by a tag (`org.opencontainers.image.ref.name`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OciImage {
    /// The OCI layout directory (has `oci-layout`, `index.json`, `blobs/`).
    pub layout: PathBuf,
    /// The tag inside the layout.
    pub tag: String,
}

impl OciImage {
    /// `oci:DIR:TAG`, the reference form used by skopeo and `weenv-convert`.
    pub fn oci_ref(&self) -> String {
        format!("oci:{}:{}", self.layout.display(), self.tag)
    }
}

/// Root of the image cache.
pub fn cache_root() -> PathBuf {
    std::env::var_os("WEENV_TEST_IMAGES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/weenv-test-images"))
}

/// busybox-static (`/bin/busybox` + applet symlinks + `/etc/weenv`), one gzip layer, built with
/// umoci. Tag `busybox`. `Cmd` is `/bin/sh`, `PATH=/bin`.
pub fn busybox() -> Result<OciImage> {
    cached("busybox", "busybox", |dir| {
        let layout = dir.join("oci");
        let bundle = dir.join("bundle");
        let img = umoci_new(&layout, "busybox")?;
        run(Command::new("umoci")
            .args(["unpack", "--image", &img])
            .arg(&bundle))?;
        let rootfs = bundle.join("rootfs");
        populate_busybox(&rootfs)?;
        umoci_repack_sh(&img, &bundle, "PATH=/bin:/usr/bin:/sbin:/usr/sbin")?;
        // umoci leaves the old, unconfigured manifest blobs around; harmless. The bundle is
        // not needed any more.
        fs::remove_dir_all(&bundle).with_context(|| format!("removing {}", bundle.display()))?;
        Ok(layout)
    })
}

/// busybox-static with a symlink for every applet it has (`busybox --list`: top, nc, wget, …)
/// and a small `/bin/pgrep` (Debian's busybox-static has none), one gzip layer. Tag
/// `busybox`. The image the CRI validation suite (critest) runs its containers from: its specs
/// call applets the small [`busybox`] image leaves out.
pub fn busybox_all_applets() -> Result<OciImage> {
    busybox_full("busybox-all", "busybox", &["--config.cmd", "/bin/sh"])
}

/// [`busybox_all_applets`] serving `/www` with busybox's `httpd` on port 80 : the stand-in for critest's `e2e-test-images/httpd` (which
/// lives on registry.k8s.io, out of reach here); it logs one line naming httpd first. Tag
/// `httpd`.
pub fn busybox_httpd() -> Result<OciImage> {
    // The real image's Apache says "httpd" on start-up (critest looks for it in the log).
    busybox_full(
        "busybox-httpd",
        "httpd",
        &[
            "--config.cmd",
            "/bin/sh",
            "--config.cmd",
            "-c",
            "--config.cmd",
            "echo 'httpd: serving /www on :80'; exec httpd -f -p 80 -h /www",
        ],
    )
}

/// `/bin/pgrep PATTERN`: the pids whose process name contains PATTERN, exit 1 when none.
const PGREP: &str = "#!/bin/sh\n# pgrep PATTERN (Debian's busybox-static has no pgrep applet)\n\
st=1\nfor d in /proc/[0-9]*; do\n  read -r n < \"$d/comm\" 2>/dev/null || continue\n  \
case \"$n\" in *\"$1\"*) echo \"${d#/proc/}\"; st=0;; esac\ndone\nexit $st\n";

fn busybox_full(name: &str, tag: &str, config: &[&str]) -> Result<OciImage> {
    cached(name, tag, |dir| {
        let layout = dir.join("oci");
        let bundle = dir.join("bundle");
        let img = umoci_new(&layout, tag)?;
        run(Command::new("umoci")
            .args(["unpack", "--image", &img])
            .arg(&bundle))?;
        let rootfs = bundle.join("rootfs");
        populate_busybox(&rootfs)?;
        let list = Command::new(host_busybox()?)
            .arg("--list")
            .output()
            .context("busybox --list")?;
        let bin = rootfs.join("bin");
        for applet in String::from_utf8_lossy(&list.stdout).split_whitespace() {
            let link = bin.join(applet);
            if applet != "busybox" && !link.exists() {
                std::os::unix::fs::symlink("busybox", link)?;
            }
        }
        let pgrep = bin.join("pgrep");
        if !pgrep.exists() {
            fs::write(&pgrep, PGREP)?;
            fs::set_permissions(&pgrep, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
        }
        fs::create_dir_all(rootfs.join("www"))?;
        fs::write(rootfs.join("www/index.html"), "weenv test page\n")?;
        run(Command::new("umoci")
            .args(["repack", "--image", &img])
            .arg(&bundle))?;
        run(Command::new("umoci")
            .args(["config", "--image", &img, "--clear=config.cmd"])
            .args(config)
            .args(["--config.env", "PATH=/bin:/usr/bin:/sbin:/usr/sbin"]))?;
        fs::remove_dir_all(&bundle).with_context(|| format!("removing {}", bundle.display()))?;
        Ok(layout)
    })
}

/// busybox plus `/data`: `files` incompressible files of `file_kib` KiB each (deterministic
/// pseudo-random bytes) and `/data/SHA256SUMS` listing them, so `cd /data && sha256sum -c
/// SHA256SUMS` reads every byte and checks it. One gzip layer. Tag `data`. The cluster tests of
/// the peer cache use it (small, so 5 nodes fit a 2-core CI machine).
pub fn busybox_data(files: usize, file_kib: usize) -> Result<OciImage> {
    cached(
        &format!("busybox-data-{files}x{file_kib}k"),
        "data",
        |dir| {
            let layout = dir.join("oci");
            let bundle = dir.join("bundle");
            let img = umoci_new(&layout, "data")?;
            run(Command::new("umoci")
                .args(["unpack", "--image", &img])
                .arg(&bundle))?;
            let rootfs = bundle.join("rootfs");
            populate_busybox(&rootfs)?;
            let data = rootfs.join("data");
            fs::create_dir_all(&data)?;
            let mut sums = String::new();
            let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
            for i in 0..files {
                let mut buf = vec![0u8; file_kib << 10];
                for chunk in buf.chunks_mut(8) {
                    // xorshift64: incompressible, so frames are as large compressed as not.
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
                }
                let name = format!("f{i:04}");
                fs::write(data.join(&name), &buf)?;
                sums.push_str(&format!("{}  {name}\n", hex::encode(Sha256::digest(&buf))));
            }
            fs::write(data.join("SHA256SUMS"), sums)?;
            umoci_repack_sh(&img, &bundle, "PATH=/bin:/usr/bin:/sbin:/usr/sbin")?;
            fs::remove_dir_all(&bundle)
                .with_context(|| format!("removing {}", bundle.display()))?;
            Ok(layout)
        },
    )
}

/// A pod sandbox ("pause") image for CRI tests, built locally: busybox-static as `/bin/busybox`
/// and nothing else, entrypoint `/bin/busybox sleep 2147483647` (containerd's CRI plugin stops a
/// sandbox with SIGKILL, so no signal handling is needed). One gzip layer. Tag `pause`.
pub fn pause() -> Result<OciImage> {
    // Cache key "pause-busybox": the recipe changed from a busybox copy named `sleep`.
    cached("pause-busybox", "pause", |dir| {
        let layout = dir.join("oci");
        let bundle = dir.join("bundle");
        let img = umoci_new(&layout, "pause")?;
        run(Command::new("umoci")
            .args(["unpack", "--image", &img])
            .arg(&bundle))?;
        let bin = bundle.join("rootfs/bin");
        fs::create_dir_all(&bin)?;
        let src = host_busybox()?;
        // `busybox sleep`: the process is named `busybox`, not `sleep`, so a `pgrep sleep` in a
        // container sharing the pod's PID namespace (critest's execSync timeout spec) does not
        // find the sandbox.
        fs::copy(src, bin.join("busybox")).context("copying busybox")?;
        run(Command::new("umoci")
            .args(["repack", "--image", &img])
            .arg(&bundle))?;
        run(Command::new("umoci").args([
            "config",
            "--image",
            &img,
            "--config.entrypoint",
            "/bin/busybox",
            "--config.entrypoint",
            "sleep",
            "--config.cmd",
            "2147483647",
        ]))?;
        fs::remove_dir_all(&bundle).with_context(|| format!("removing {}", bundle.display()))?;
        Ok(layout)
    })
}

/// `umoci init` of the OCI layout `layout` and `umoci new` of the empty image `tag` in it;
/// returns the `LAYOUT:TAG` image reference umoci takes.
pub(crate) fn umoci_new(layout: &Path, tag: &str) -> Result<String> {
    let img = format!("{}:{tag}", layout.display());
    run(Command::new("umoci")
        .arg("init")
        .arg("--layout")
        .arg(layout))?;
    run(Command::new("umoci").args(["new", "--image", &img]))?;
    Ok(img)
}

/// `umoci repack` of `bundle` into `img`, then sets its cmd to `/bin/sh` and its environment
/// to `path_env` (`PATH=...`).
pub(crate) fn umoci_repack_sh(img: &str, bundle: &Path, path_env: &str) -> Result<()> {
    run(Command::new("umoci")
        .args(["repack", "--image", img])
        .arg(bundle))?;
    run(Command::new("umoci").args([
        "config",
        "--image",
        img,
        "--config.cmd",
        "/bin/sh",
        "--config.env",
        path_env,
    ]))
}

/// The host's static busybox binary.
fn host_busybox() -> Result<&'static str> {
    ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .context("busybox not found: install busybox-static (scripts/deps.sh)")
}

/// Copies the host's static busybox into `rootfs` with the applets tests use.
fn populate_busybox(rootfs: &Path) -> Result<()> {
    let bin = rootfs.join("bin");
    fs::create_dir_all(&bin)?;
    fs::create_dir_all(rootfs.join("etc"))?;
    fs::create_dir_all(rootfs.join("tmp"))?;
    let src = host_busybox()?;
    fs::copy(src, bin.join("busybox")).context("copying busybox")?;
    for applet in [
        "sh",
        "ls",
        "cat",
        "echo",
        "sleep",
        "md5sum",
        "sha256sum",
        "true",
        "false",
        "head",
        "wc",
        "find",
        "stat",
        "env",
        "id",
        "mkdir",
        "rm",
        "touch",
        "dd",
        "sync",
        "uname",
    ] {
        std::os::unix::fs::symlink("busybox", bin.join(applet))?;
    }
    fs::write(rootfs.join("etc/weenv"), "hello from weenv test image\n")?;
    Ok(())
}

/// Debian bookworm minbase + python3 from the configured apt mirror, three gzip layers
/// (`/usr` minus python's stdlib, python's stdlib, everything else). Tag `python`.
/// `Cmd` is `python3`.
pub fn python() -> Result<OciImage> {
    debian_python("python", "python3")
}

/// [`python`] plus Debian's `libpython3.11-testsuite` (CPython's own regression tests,
/// `/usr/lib/python3.11/test`, in the stdlib layer; ≈ 25 MB more). Tag `python`. First build
/// ≈ 2 min (its own debootstrap), then cached.
pub fn python_testsuite() -> Result<OciImage> {
    debian_python("python-testsuite", "python3,libpython3.11-testsuite")
}

/// A debootstrap image with the packages `include` (comma-separated), laid out like
/// [`python`].
fn debian_python(name: &str, include: &str) -> Result<OciImage> {
    cached(name, "python", |dir| {
        let mirror = debian_mirror()?;
        let root = dir.join("rootfs");
        let out = Command::new("debootstrap")
            .args([
                "--variant=minbase",
                &format!("--include={include}"),
                "bookworm",
            ])
            .arg(&root)
            .arg(&mirror)
            .output()
            .context("running debootstrap (install it with scripts/deps.sh)")?;
        if !out.status.success() {
            bail!(
                "debootstrap from {mirror} failed: {}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        // Like Debian's own container images: no apt caches or package lists.
        for junk in ["var/cache/apt", "var/lib/apt/lists"] {
            let d = root.join(junk);
            if d.is_dir() {
                remove_tree(&d)?;
                fs::create_dir_all(&d)?;
            }
        }
        let pylib = python_stdlib_dir(&root)?;
        let layers = [
            // base: everything but /usr (etc, var, merged-/usr symlinks, ...)
            LayerSpec {
                exclude: vec!["./usr".into()],
                parents: vec![],
                include: vec![".".into()],
            },
            // /usr without python's standard library
            LayerSpec {
                exclude: vec![format!("./{pylib}")],
                parents: vec![],
                include: vec!["./usr".into()],
            },
            stdlib_layer(&pylib),
        ];
        let config = ImageConfigSpec {
            env: "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            cmd: "python3",
        };
        python_layout(&root, &layers, &config, dir)
    })
}

/// Fallback for [`python`] when debootstrap cannot run: busybox + the host's python3 with its
/// shared libraries and standard library, two gzip layers. Tag `python`.
pub fn python_fast() -> Result<OciImage> {
    cached("python-fast", "python", |dir| {
        let root = dir.join("rootfs");
        populate_busybox(&root)?;
        let python =
            fs::canonicalize("/usr/bin/python3").context("host has no /usr/bin/python3")?;
        let mut files = vec![python.clone()];
        files.extend(shared_libraries(&python)?);
        for f in &files {
            copy_into(&root, f)?;
        }
        let pyname = python
            .file_name()
            .and_then(|n| n.to_str())
            .context("python3 file name")?
            .to_string();
        std::os::unix::fs::symlink(&pyname, root.join("usr/bin/python3"))?;
        let pylib = format!("usr/lib/{pyname}");
        fs::create_dir_all(root.join("usr/lib"))?;
        let out = Command::new("cp")
            .args(["-a", &format!("/{pylib}")])
            .arg(root.join("usr/lib"))
            .output()?;
        if !out.status.success() {
            bail!("copying /{pylib}: {}", String::from_utf8_lossy(&out.stderr));
        }
        let layers = [
            LayerSpec {
                exclude: vec![format!("./{pylib}")],
                parents: vec![],
                include: vec![".".into()],
            },
            stdlib_layer(&pylib),
        ];
        let config = ImageConfigSpec {
            env: "PATH=/usr/bin:/bin",
            cmd: "python3",
        };
        python_layout(&root, &layers, &config, dir)
    })
}

/// Copies `skopeo copy --dest-tls-verify=false oci:LAYOUT:TAG docker://DEST`. `dest` is a
/// registry reference without scheme, e.g. `127.0.0.1:40123/busybox:1`.
pub fn push_oci_layout(image: &OciImage, dest: &str) -> Result<()> {
    run(Command::new("skopeo")
        .args(["copy", "--quiet", "--dest-tls-verify=false"])
        .arg(image.oci_ref())
        .arg(format!("docker://{dest}")))
}

/// Writes the image as a docker-archive tarball (`skopeo copy oci:.. docker-archive:FILE:REF`).
pub fn to_docker_archive(image: &OciImage, file: &Path, reference: &str) -> Result<()> {
    run(Command::new("skopeo")
        .args(["copy", "--quiet"])
        .arg(image.oci_ref())
        .arg(format!("docker-archive:{}:{reference}", file.display())))
}

/// The Debian archive URL of the machine's apt configuration (the first `deb` source that
/// serves a bookworm suite other than `-security`/`-updates`).
pub fn debian_mirror() -> Result<String> {
    let mut texts = Vec::new();
    if let Ok(t) = fs::read_to_string("/etc/apt/sources.list") {
        texts.push((false, t));
    }
    if let Ok(rd) = fs::read_dir("/etc/apt/sources.list.d") {
        let mut paths: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
        paths.sort();
        for p in paths {
            let deb822 = p.extension().is_some_and(|e| e == "sources");
            let list = p.extension().is_some_and(|e| e == "list");
            if deb822 || list {
                if let Ok(t) = fs::read_to_string(&p) {
                    texts.push((deb822, t));
                }
            }
        }
    }
    for (deb822, text) in &texts {
        let found = if *deb822 {
            mirror_from_deb822(text, "bookworm")
        } else {
            mirror_from_list(text, "bookworm")
        };
        if let Some(m) = found {
            return Ok(m);
        }
    }
    bail!("no Debian bookworm mirror in /etc/apt/sources.list or /etc/apt/sources.list.d/*.sources")
}

/// One-line format: `deb [opts] URI SUITE COMPONENTS...`.
pub fn mirror_from_list(text: &str, suite: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let line = line.split('#').next()?.trim();
        let mut words = line.split_whitespace();
        if words.next()? != "deb" {
            return None;
        }
        let mut rest: Vec<&str> = words.collect();
        if rest.first()?.starts_with('[') {
            let end = rest.iter().position(|w| w.ends_with(']'))?;
            rest.drain(..=end);
        }
        let (uri, s) = (rest.first()?, rest.get(1)?);
        (*s == suite).then(|| uri.to_string())
    })
}

/// deb822 format (`Types:`, `URIs:`, `Suites:` stanzas separated by blank lines).
pub fn mirror_from_deb822(text: &str, suite: &str) -> Option<String> {
    text.split("\n\n").find_map(|stanza| {
        let field = |name: &str| {
            stanza.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim().eq_ignore_ascii_case(name)).then(|| v.trim().to_string())
            })
        };
        let enabled = !matches!(field("Enabled").as_deref(), Some("no"));
        let types = field("Types")?;
        let suites = field("Suites")?;
        let uri = field("URIs")?.split_whitespace().next()?.to_string();
        (enabled
            && types.split_whitespace().any(|t| t == "deb")
            && suites.split_whitespace().any(|s| s == suite))
        .then_some(uri)
    })
}

/// Which paths one layer holds, relative to the rootfs (`./...`, GNU tar syntax).
struct LayerSpec {
    exclude: Vec<String>,
    /// Directory entries added without their content (parents of `include`).
    parents: Vec<String>,
    include: Vec<String>,
}

struct ImageConfigSpec {
    env: &'static str,
    cmd: &'static str,
}

/// The layer holding python's standard library `pylib` (with its parent directories).
fn stdlib_layer(pylib: &str) -> LayerSpec {
    LayerSpec {
        exclude: vec![],
        parents: vec!["./usr".into(), "./usr/lib".into()],
        include: vec![format!("./{pylib}")],
    }
}

/// The python image's layout `dir/oci` (tag `python`) from `root`, which is removed after.
fn python_layout(
    root: &Path,
    layers: &[LayerSpec],
    config: &ImageConfigSpec,
    dir: &Path,
) -> Result<PathBuf> {
    let layout = dir.join("oci");
    write_oci_layout(root, layers, config, &layout, "python", dir)?;
    remove_tree(root)?;
    Ok(layout)
}

/// Writes an OCI layout with one gzip layer per spec (GNU tar, sorted names, numeric owners,
/// PAX without atime/ctime, `gzip -n`), an image config with the diff_ids and an index tagged
/// `tag`. `scratch` holds the intermediate tar files.
fn write_oci_layout(
    root: &Path,
    layers: &[LayerSpec],
    config: &ImageConfigSpec,
    layout: &Path,
    tag: &str,
    scratch: &Path,
) -> Result<()> {
    let blobs = layout.join("blobs/sha256");
    fs::create_dir_all(&blobs)?;
    fs::write(
        layout.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )?;
    let mut diff_ids = Vec::new();
    let mut descs = Vec::new();
    for (i, spec) in layers.iter().enumerate() {
        let tar = scratch.join(format!("layer{i}.tar"));
        let mut cmd = Command::new("tar");
        cmd.arg("-C").arg(root).arg("-cf").arg(&tar).args([
            "--sort=name",
            "--numeric-owner",
            "--xattrs",
            "--format=pax",
            "--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime",
        ]);
        for e in &spec.exclude {
            cmd.arg(format!("--exclude={e}"));
        }
        if !spec.parents.is_empty() {
            cmd.arg("--no-recursion")
                .args(&spec.parents)
                .arg("--recursion");
        }
        cmd.args(&spec.include);
        run(&mut cmd)?;
        diff_ids.push(sha256_file(&tar)?);
        let gz = scratch.join(format!("layer{i}.tar.gz"));
        let out = File::create(&gz)?;
        let status = Command::new("gzip")
            .args(["-n", "-c"])
            .arg(&tar)
            .stdout(out)
            .status()?;
        if !status.success() {
            bail!("gzip {} failed: {status}", tar.display());
        }
        fs::remove_file(&tar)?;
        let digest = sha256_file(&gz)?;
        let size = fs::metadata(&gz)?.len();
        fs::rename(&gz, blobs.join(&digest[7..]))?;
        descs.push(serde_json::json!({
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": digest, "size": size,
        }));
    }
    let config = serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "config": { "Env": [config.env], "Cmd": [config.cmd] },
        "rootfs": { "type": "layers", "diff_ids": diff_ids },
        "history": layers.iter().map(|_| serde_json::json!({"created_by": "weenv test image"})).collect::<Vec<_>>(),
    });
    let config_desc = write_blob(&blobs, &serde_json::to_vec(&config)?)?;
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": { "mediaType": "application/vnd.oci.image.config.v1+json",
                    "digest": config_desc.0, "size": config_desc.1 },
        "layers": descs,
    });
    let (mdigest, msize) = write_blob(&blobs, &serde_json::to_vec(&manifest)?)?;
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": mdigest, "size": msize,
            "annotations": { "org.opencontainers.image.ref.name": tag },
        }],
    });
    fs::write(layout.join("index.json"), serde_json::to_vec(&index)?)?;
    Ok(())
}

fn write_blob(blobs: &Path, data: &[u8]) -> Result<(String, u64)> {
    let digest = format!("sha256:{}", hex::encode(Sha256::digest(data)));
    fs::write(blobs.join(&digest[7..]), data)?;
    Ok((digest, data.len() as u64))
}

/// `sha256:<hex>` of a file, streamed.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(format!("sha256:{}", hex::encode(h.finalize())))
}

/// `usr/lib/python3.X` inside a rootfs.
fn python_stdlib_dir(root: &Path) -> Result<String> {
    let mut found: Vec<String> = fs::read_dir(root.join("usr/lib"))?
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with("python3.") && root.join("usr/lib").join(n).is_dir())
        .collect();
    found.sort();
    found
        .pop()
        .map(|n| format!("usr/lib/{n}"))
        .context("no usr/lib/python3.* in the debootstrap rootfs")
}

/// Shared libraries of an ELF file as resolved by `ldd` (absolute paths, loader included).
fn shared_libraries(elf: &Path) -> Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(elf)
        .output()
        .context("running ldd")?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .split_whitespace()
        .filter(|w| w.starts_with('/'))
        .map(PathBuf::from)
        .collect())
}

/// Copies absolute `file` to `root/file` (resolving symlinks of the source, keeping its path).
fn copy_into(root: &Path, file: &Path) -> Result<()> {
    let rel = file.strip_prefix("/").unwrap_or(file);
    let dst = root.join(rel);
    if let Some(p) = dst.parent() {
        fs::create_dir_all(p)?;
    }
    fs::copy(file, &dst).with_context(|| format!("copying {}", file.display()))?;
    Ok(())
}

/// Builds `name` once per [`IMAGES_VERSION`] under [`cache_root`]: `build(dir)` fills a fresh
/// temp dir and returns the layout path inside it; the dir is then renamed into place.
fn cached(name: &str, tag: &str, build: impl FnOnce(&Path) -> Result<PathBuf>) -> Result<OciImage> {
    let root = cache_root();
    fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    let key = format!("{name}-{IMAGES_VERSION}");
    let done = root.join(&key);
    let lock = File::create(root.join(format!("{key}.lock")))?;
    // Held (and released on drop) until this function returns.
    let _lock = Flock::lock(lock, FlockArg::LockExclusive)
        .map_err(|(_, errno)| io::Error::from(errno))
        .context("locking the image cache")?;
    let image = OciImage {
        layout: done.join("oci"),
        tag: tag.to_string(),
    };
    if done.join("oci/index.json").exists() {
        return Ok(image);
    }
    let tmp = root.join(format!("{key}.tmp"));
    if tmp.exists() {
        remove_tree(&tmp)?;
    }
    fs::create_dir_all(&tmp)?;
    let started = std::time::Instant::now();
    let layout = build(&tmp).with_context(|| format!("building test image {name}"))?;
    if layout != tmp.join("oci") {
        bail!("image builder for {name} must write tmp/oci");
    }
    if done.exists() {
        remove_tree(&done)?;
    }
    fs::rename(&tmp, &done)?;
    let mut log = io::stderr();
    let _ = writeln!(
        log,
        "built test image {name} in {:.1}s at {}",
        started.elapsed().as_secs_f64(),
        done.display()
    );
    Ok(image)
}

/// `rm -rf` that copes with read-only directories left by debootstrap.
fn remove_tree(p: &Path) -> Result<()> {
    run(Command::new("rm").arg("-rf").arg(p))
}

/// Runs a command, failing with its stderr.
fn run(cmd: &mut Command) -> Result<()> {
    let out = cmd
        .output()
        .with_context(|| format!("running {:?}", cmd.get_program()))?;
    if !out.status.success() {
        bail!(
            "{:?} failed ({}): {}",
            cmd,
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_one_line_sources() {
        let t = "# comment\ndeb-src http://x/debian bookworm main\n\
                 deb [arch=amd64 signed-by=/k.gpg] http://mirror.example/debian bookworm main\n";
        assert_eq!(
            mirror_from_list(t, "bookworm").as_deref(),
            Some("http://mirror.example/debian")
        );
        assert_eq!(
            mirror_from_list("deb http://m/d bookworm-security main", "bookworm"),
            None
        );
    }

    #[test]
    fn parses_deb822_sources() {
        let t = "Types: deb\nURIs: http://sec.example/debian-security\nSuites: bookworm-security\n\n\
                 Types: deb deb-src\nURIs: http://m.example/debian\nSuites: bookworm bookworm-updates\n\
                 Components: main\n";
        assert_eq!(
            mirror_from_deb822(t, "bookworm").as_deref(),
            Some("http://m.example/debian")
        );
        let disabled = "Enabled: no\nTypes: deb\nURIs: http://m/d\nSuites: bookworm\n";
        assert_eq!(mirror_from_deb822(disabled, "bookworm"), None);
    }

    #[test]
    #[ignore = "needs umoci and busybox-static"]
    fn builds_busybox_image() {
        let img = busybox().expect("busybox image");
        assert!(img.layout.join("index.json").exists());
    }
}
