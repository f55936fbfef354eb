//! containerd's own snapshotter conformance suite against weenv, with containerd's overlayfs
//! snapshotter as the control: `snapconform` (integration/go/snapconform, built here with Go
//! in GOPATH mode against Debian's containerd 1.6 sources) runs `snapshots/testsuite`'s
//! `SnapshotterSuite` on overlayfs in process and on a fresh weenv-snapshotter daemon per
//! subtest through the Snapshots gRPC API (`snapshots/proxy`, as containerd's proxy plugins
//! reach it), the daemon once under umask 000 and once under 022, plus two checks of its
//! own: `ParentOwner` (a child snapshot's root has its parent's owner) and `StateModes`
//! (state dirs 0700, a snapshot's fs 0755 and work 0711). Every subtest overlayfs passes must
//! pass on weenv under both umasks. The table is printed (`--nocapture`).

use anyhow::{ensure, Context, Result};
use std::process::Command;
use weenv_integration::snapconform::{self, Results};
use weenv_integration::util::{require_root_and_bins, workspace_bin};

#[test]
#[ignore = "needs root, fuse, fusermount3, go + golang-github-containerd-containerd-dev"]
fn containerd_snapshotter_suite_passes_on_weenv_as_on_overlayfs() -> Result<()> {
    require_root_and_bins(&["go", "fusermount3"])?;
    let tmp = tempfile::tempdir()?;
    let bin = snapconform::build(&tmp.path().join("go"))?;
    let weenv = workspace_bin("weenv-snapshotter")?;
    let o = Command::new(&bin)
        .args(["-test.v", "-test.parallel", "4", "-test.timeout", "20m"])
        .arg("-weenv-bin")
        .arg(&weenv)
        .args(["-weenv-umask", "000,022"])
        .output()
        .context("running snapconform")?;
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let r = Results::parse(&out);
    println!("{}", r.table());
    // The modes and owners the checks saw (snapshotter/check: path mode), sorted.
    let mut seen: Vec<&str> = out
        .lines()
        .filter_map(|l| l.split_once("TestSnapshotters/").map(|(_, r)| r))
        .filter(|l| l.contains(": mode ") || l.contains("): root "))
        .collect();
    seen.sort();
    seen.dedup();
    println!("{}", seen.join("\n"));
    let sns = r.snapshotters();
    ensure!(
        sns == ["overlayfs", "weenv-umask000", "weenv-umask022"] && r.by_test.len() >= 23,
        "snapconform did not run the suite on every snapshotter ({sns:?}, {} subtests):\n{out}",
        r.by_test.len()
    );
    let bad = r.regressions();
    ensure!(
        bad.is_empty(),
        "subtests that pass on overlayfs but not on weenv: {bad:?}\n{out}"
    );
    // Our own checks hold on the control too: they test what overlayfs does.
    for own in ["ParentOwner", "StateModes"] {
        let m = r
            .by_test
            .get(own)
            .with_context(|| format!("{own} did not run:\n{out}"))?;
        ensure!(
            m.len() == sns.len() && m.values().all(|o| *o == snapconform::Outcome::Pass),
            "{own}: {m:?}\n{out}"
        );
    }
    ensure!(
        o.status.success(),
        "snapconform failed ({}):\n{out}",
        o.status
    );
    Ok(())
}
