//! `snapconform` (`integration/go/snapconform`): containerd's own snapshotter conformance
//! suite (`snapshots/testsuite` of containerd 1.6, Debian's
//! `golang-github-containerd-containerd-dev`) run in one Go test binary against containerd's
//! overlayfs snapshotter (the control) and against weenv-snapshotter daemons reached through the
//! Snapshots gRPC API (`snapshots/proxy`), under the daemon umasks it is given, plus its own
//! `ParentOwner` and `StateModes` checks. [`build`] compiles it; [`Results::parse`] reads its
//! `-test.v` output; [`Results::regressions`] is the rule the CI test asserts.

use crate::debian_go::{self, Build};
use anyhow::Result;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Source directory of `snapconform`.
pub fn source_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("go/snapconform")
}

/// Builds the `snapconform` test binary into `out_dir`; returns its path.
pub fn build(out_dir: &Path) -> Result<PathBuf> {
    debian_go::build(&source_dir(), out_dir, "snapconform.test", Build::Tests)
}

/// A subtest's outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    Pass,
    Fail,
    Skip,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Pass => "pass",
            Outcome::Fail => "FAIL",
            Outcome::Skip => "skip",
        }
    }
}

/// Outcomes by subtest, then by snapshotter (`overlayfs`, `weenv-umask000`, ...).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Results {
    pub by_test: BTreeMap<String, BTreeMap<String, Outcome>>,
}

/// The control every other snapshotter is held to.
pub const CONTROL: &str = "overlayfs";

impl Results {
    /// Reads `--- PASS|FAIL|SKIP: TestSnapshotters/<snapshotter>/<subtest> (…)` lines. Pure.
    pub fn parse(output: &str) -> Results {
        let mut r = Results::default();
        for line in output.lines() {
            let l = line.trim_start();
            let Some((outcome, rest)) = [
                ("--- PASS: ", Outcome::Pass),
                ("--- FAIL: ", Outcome::Fail),
                ("--- SKIP: ", Outcome::Skip),
            ]
            .iter()
            .find_map(|(p, o)| l.strip_prefix(p).map(|rest| (*o, rest))) else {
                continue;
            };
            let name = rest.split(" (").next().unwrap_or(rest);
            let mut parts = name.splitn(3, '/');
            let (Some(_top), Some(sn), Some(test)) = (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            r.by_test
                .entry(test.to_string())
                .or_default()
                .insert(sn.to_string(), outcome);
        }
        r
    }

    /// Every snapshotter named in the results, the control first.
    pub fn snapshotters(&self) -> Vec<String> {
        let mut all: Vec<String> = self
            .by_test
            .values()
            .flat_map(|m| m.keys().cloned())
            .collect();
        all.sort_by_key(|s| (s != CONTROL, s.clone()));
        all.dedup();
        all
    }

    /// (subtest, snapshotter, outcome) where the control passes and the snapshotter does not
    /// (or did not run it); subtests the control does not pass are held to nothing. Pure.
    pub fn regressions(&self) -> Vec<(String, String, Option<Outcome>)> {
        let sns = self.snapshotters();
        let mut out = Vec::new();
        for (test, m) in &self.by_test {
            if m.get(CONTROL) != Some(&Outcome::Pass) {
                continue;
            }
            for sn in sns.iter().filter(|s| *s != CONTROL) {
                let got = m.get(sn).copied();
                if got != Some(Outcome::Pass) {
                    out.push((test.clone(), sn.clone(), got));
                }
            }
        }
        out
    }

    /// A Markdown table: subtest → outcome per snapshotter.
    pub fn table(&self) -> String {
        let sns = self.snapshotters();
        let mut s = format!(
            "| subtest | {} |\n|---|{}\n",
            sns.join(" | "),
            "---|".repeat(sns.len())
        );
        for (test, m) in &self.by_test {
            let cells: Vec<&str> = sns
                .iter()
                .map(|sn| m.get(sn).map_or("–", |o| o.as_str()))
                .collect();
            s.push_str(&format!("| {test} | {} |\n", cells.join(" | ")));
        }
        s
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const OUT: &str = "=== RUN   TestSnapshotters
    snapconform_test.go:336: mode . 0700
--- FAIL: TestSnapshotters (9.1s)
    --- PASS: TestSnapshotters/overlayfs (0.39s)
        --- PASS: TestSnapshotters/overlayfs/Basic (0.08s)
        --- SKIP: TestSnapshotters/overlayfs/Rename (0.01s)
        --- PASS: TestSnapshotters/overlayfs/RootPermission (0.02s)
        --- FAIL: TestSnapshotters/overlayfs/Odd (0.02s)
    --- FAIL: TestSnapshotters/weenv-umask000 (3.2s)
        --- PASS: TestSnapshotters/weenv-umask000/Basic (0.5s)
        --- SKIP: TestSnapshotters/weenv-umask000/Rename (0.01s)
        --- FAIL: TestSnapshotters/weenv-umask000/RootPermission (0.3s)
        --- PASS: TestSnapshotters/weenv-umask000/Odd (0.3s)
";

    #[test]
    fn parses_and_holds_weenv_to_what_overlayfs_passes() {
        let r = Results::parse(OUT);
        assert_eq!(r.by_test.len(), 4);
        assert_eq!(r.by_test["Basic"]["weenv-umask000"], Outcome::Pass);
        assert_eq!(r.snapshotters(), vec!["overlayfs", "weenv-umask000"]);
        assert_eq!(
            r.regressions(),
            vec![(
                "RootPermission".to_string(),
                "weenv-umask000".to_string(),
                Some(Outcome::Fail)
            )]
        );
        let t = r.table();
        assert!(t.contains("| RootPermission | pass | FAIL |"), "{t}");
        assert!(t.contains("| Rename | skip | skip |"), "{t}");
    }

    #[test]
    fn a_subtest_weenv_did_not_run_is_a_regression() {
        let r = Results::parse(
            "--- PASS: T/overlayfs/A (0s)\n--- PASS: T/weenv/B (0s)\n--- PASS: T/overlayfs/B (0s)\n",
        );
        assert_eq!(
            r.regressions(),
            vec![("A".to_string(), "weenv".to_string(), None)]
        );
    }
}
