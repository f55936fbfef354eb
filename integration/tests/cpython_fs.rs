//! CPython's own regression tests of its filesystem modules (Debian's
//! `libpython3.11-testsuite`, [`weenv_integration::images::python_testsuite`]) in a container of
//! a lazily pulled image (weenv, background fill off: every lower a FUSE layer) and on
//! containerd's overlayfs snapshotter; per module the same number of tests must run with the
//! same verdict and the same failing tests (`integration/fscheck/cpython_tests.py`).
//!
//! CI runs [`CI_MODULES`]; `CPYTHON_TESTS="test_os test_posix ..."` picks others
//! (`integration/bench/cpython_fs.sh` runs the full list and prints the table).

mod snapshotter_common;

use anyhow::{bail, ensure, Result};
use snapshotter_common::*;
use weenv_integration::containerd::Containerd;
use weenv_integration::stack::Stack;

const RUNNER: &str = include_str!("../fscheck/cpython_tests.py");

/// The modules CI runs (about a minute per snapshotter on a 2-core machine).
const CI_MODULES: &str = "test_stat test_glob test_fileio test_shutil test_os";

/// Runs the modules in a container of `image` on `snapshotter`; one line per module.
fn run_modules(
    ctd: &Containerd,
    ns: &str,
    snapshotter: &str,
    image: &str,
    id: &str,
    modules: &[&str],
) -> Result<Vec<String>> {
    let mut cmd = vec!["python3", "-c", RUNNER];
    cmd.extend_from_slice(modules);
    let out = ctr_run(ctd, ns, snapshotter, image, id, &cmd)?;
    let lines: Vec<String> = out.lines().map(str::to_string).collect();
    ensure!(
        lines.len() == modules.len(),
        "{snapshotter}: expected {} module lines:\n{out}",
        modules.len()
    );
    Ok(lines)
}

/// `test_os: ran=...` → (`test_os`, `ran=...`).
fn split(line: &str) -> (&str, &str) {
    line.split_once(": ").unwrap_or((line, ""))
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, containerd, runc, fuse, docker-registry, skopeo, debootstrap"]
async fn cpython_filesystem_tests_pass_alike_on_weenv_and_overlayfs() -> Result<()> {
    let modules_env = std::env::var("CPYTHON_TESTS").unwrap_or_else(|_| CI_MODULES.into());
    let modules: Vec<&str> = modules_env.split_whitespace().collect();
    let stack = Stack::builder()
        .require(PYTHON_BINS)
        .use_containerd()
        .start()?;
    let img = weenv_integration::images::python_testsuite()?;
    let weenv = stack.push_converted(&img, "cpython").await?.weenv;
    let (daemon, ctd) = (&stack.daemon, &stack.ctd);

    let o = ctd.ctr_ns("stock", &["images", "pull", "--plain-http", &weenv])?;
    ensure!(
        o.status.success(),
        "stock pull: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let t = std::time::Instant::now();
    let want = run_modules(ctd, "stock", "overlayfs", &weenv, "cpy-ovl", &modules)?;
    let ovl_secs = t.elapsed().as_secs_f64();
    let rep = daemon.pull(ctd.address(), "lazy", &weenv)?;
    ensure!(rep.contains("3 lazy, 0 applied"), "{rep}");
    let t = std::time::Instant::now();
    let got = run_modules(ctd, "lazy", "weenv", &weenv, "cpy-weenv", &modules)?;
    let weenv_secs = t.elapsed().as_secs_f64();

    println!("| module | overlayfs | weenv (lazy, FUSE lowers) |");
    println!("|---|---|---|");
    let mut differ = Vec::new();
    for (w, g) in want.iter().zip(&got) {
        let ((m, a), (_, b)) = (split(w), split(g));
        println!("| {m} | {a} | {} |", if a == b { "same" } else { b });
        ensure!(
            !a.starts_with("ran=0 "),
            "{m} ran no test on overlayfs: {a}"
        );
        if a != b {
            differ.push(format!("{m}\n    overlayfs: {a}\n    weenv:     {b}"));
        }
    }
    println!("time: overlayfs {ovl_secs:.1} s, weenv {weenv_secs:.1} s");
    if !differ.is_empty() {
        bail!("CPython tests differ:\n{}", differ.join("\n"));
    }
    Ok(())
}
