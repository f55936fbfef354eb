//! Per-task mutation of a shared repository group, two ways with identical results:
//!
//! - **pre-applied** ([`mutate_group`]): resolve the base group, open its weenv layers over
//!   ranged registry reads and let [`weenv_env::mutation::build_mutation_tar`] (pure) build a
//!   tiny layer of only the changed files and whiteouts; publish it as a one-layer group.
//! - **at init** ([`apply_mutation_to_dir`]): apply the patch into a mounted container rootfs
//!   before the task starts (pure Rust: nothing needed in the image), optionally after
//!   `git checkout COMMIT` (that step runs the image's own git in a chroot, so the image must
//!   have git). A rejected hunk is an error and nothing is written.
//!
//! Paths of the patch are relative to the mutation root (`--root`, default `/`).

use crate::group::{GroupCmdError, GroupReport};
use std::path::{Path, PathBuf};
use std::process::Command;
use thiserror::Error;
use weenv_env::group::GroupKind;
use weenv_env::mutation::{build_mutation_tar, MutationError, MutationSummary};
use weenv_env::patch::{apply, parse_patch, ApplyReport, DirTarget, PatchError, PatchTarget};
use weenv_env::plan::Mutation;
use weenv_format::reader::LayerReader;

/// Errors of mutation.
#[derive(Debug, Error)]
pub enum MutateError {
    #[error(transparent)]
    Patch(#[from] PatchError),
    #[error(transparent)]
    Mutation(#[from] MutationError),
    #[error("mutation root {root:?} inside {rootfs}: {reason}")]
    Root {
        root: String,
        rootfs: PathBuf,
        reason: String,
    },
    #[error("git checkout {commit} in {repo} failed ({status}): {stderr}; the image must contain git for `checkout`")]
    Checkout {
        commit: String,
        repo: String,
        status: String,
        stderr: String,
    },
    #[error("building the mutation layer: {0}")]
    Tar(std::io::Error),
    #[error(transparent)]
    Group(#[from] GroupCmdError),
}

/// Resolve `path` (absolute, inside the container) under `rootfs`, following symlinks the way
/// the container would see them (absolute targets restart at `rootfs`), never leaving it.
pub fn resolve_in_root(rootfs: &Path, path: &str) -> Result<PathBuf, MutateError> {
    let err = |reason: String| MutateError::Root {
        root: path.to_string(),
        rootfs: rootfs.to_path_buf(),
        reason,
    };
    let mut todo: Vec<String> = path
        .split('/')
        .filter(|c| !c.is_empty())
        .rev()
        .map(str::to_string)
        .collect();
    let mut cur: Vec<String> = Vec::new();
    let mut hops = 0;
    while let Some(c) = todo.pop() {
        match c.as_str() {
            "." => continue,
            ".." => {
                cur.pop();
                continue;
            }
            _ => {}
        }
        let candidate = cur
            .iter()
            .fold(rootfs.to_path_buf(), |p, c| p.join(c))
            .join(&c);
        match std::fs::symlink_metadata(&candidate) {
            Ok(m) if m.file_type().is_symlink() => {
                hops += 1;
                if hops > 40 {
                    return Err(err("too many levels of symbolic links".into()));
                }
                let t = std::fs::read_link(&candidate).map_err(|e| err(e.to_string()))?;
                let t = t.to_string_lossy().into_owned();
                if t.starts_with('/') {
                    cur.clear();
                }
                todo.extend(
                    t.split('/')
                        .filter(|c| !c.is_empty())
                        .rev()
                        .map(str::to_string),
                );
            }
            Ok(m) if !m.is_dir() => {
                return Err(err(format!("{} is not a directory", candidate.display())))
            }
            Ok(_) => cur.push(c),
            Err(e) => return Err(err(format!("{}: {e}", candidate.display()))),
        }
    }
    Ok(cur.iter().fold(rootfs.to_path_buf(), |p, c| p.join(c)))
}

/// Run the image's git (in a chroot of `rootfs`) to check out `commit` in `repo_in_container`.
pub fn git_checkout(
    rootfs: &Path,
    repo_in_container: &str,
    commit: &str,
) -> Result<(), MutateError> {
    let out = Command::new("chroot")
        .arg(rootfs)
        .args([
            "git",
            "-c",
            "core.hooksPath=/dev/null",
            "-c",
            "advice.detachedHead=false",
            "-C",
        ])
        .arg(repo_in_container)
        .args(["checkout", "-q", commit, "--"])
        .output()
        .map_err(|e| MutateError::Checkout {
            commit: commit.to_string(),
            repo: repo_in_container.to_string(),
            status: "not started".into(),
            stderr: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(MutateError::Checkout {
            commit: commit.to_string(),
            repo: repo_in_container.to_string(),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

/// Apply an at-init mutation into a mounted rootfs: `checkout` first (if any), then the
/// patch (if given). Either fails without starting anything; a rejected hunk writes nothing.
pub fn apply_mutation_to_dir(
    rootfs: &Path,
    m: &Mutation,
    patch: Option<&[u8]>,
) -> Result<ApplyReport, MutateError> {
    let dir = resolve_in_root(rootfs, &m.root)?;
    // Parse before any side effect so a malformed patch changes nothing.
    let parsed = patch.map(|p| parse_patch(p, m.strip)).transpose()?;
    if let Some(c) = &m.checkout {
        git_checkout(rootfs, &m.root, c)?;
    }
    match parsed {
        Some(p) => {
            let mut t = DirTarget::new(dir);
            Ok(apply(&p, &mut t as &mut dyn PatchTarget)?)
        }
        None => Ok(ApplyReport::default()),
    }
}

/// Options of `group mutate`.
#[derive(Clone, Debug)]
pub struct MutateSpec {
    pub name: String,
    /// Directory (inside the image) the patch paths are relative to.
    pub root: String,
    pub strip: u32,
}

/// `weenv-convert group mutate`: resolve the base group, build the mutation layer from range
/// reads of the files the patch touches, and publish a one-layer group (kind `mutation`) at
/// `target`, to be stacked right above the base group.
pub async fn mutate_group(
    client: &weenv_registry::Client,
    base_ref: &str,
    patch_bytes: &[u8],
    spec: &MutateSpec,
    target: &weenv_registry::Reference,
    scratch: &Path,
    opts: &weenv_format::writer::WriterOptions,
) -> Result<(GroupReport, MutationSummary), MutateError> {
    let patch = parse_patch(patch_bytes, spec.strip)?;
    let mut cache = crate::resolve_cache::ResolveCache::in_memory();
    let groups =
        crate::plan::resolve_groups(client, &[base_ref], &mut cache, 0, Default::default())
            .await
            .map_err(|e| GroupCmdError::Invalid(e.to_string()))?;
    let base = groups
        .into_iter()
        .next()
        .ok_or_else(|| GroupCmdError::Invalid(format!("{base_ref} did not resolve")))?;
    let base_r: weenv_registry::Reference = base_ref
        .parse()
        .map_err(|e: weenv_registry::RegistryError| GroupCmdError::Invalid(e.to_string()))?;
    let handle = tokio::runtime::Handle::current();
    let (client2, descs, root) = (
        client.clone(),
        base.manifest.layers.clone(),
        spec.root.clone(),
    );
    let (tar, summary) = tokio::task::spawn_blocking(move || -> Result<_, MutateError> {
        let mut layers = Vec::new();
        for d in &descs {
            let hint = weenv_format::reader::TocHint::from_annotations(&d.annotations).map_err(
                |source| MutationError::Layer {
                    path: d.digest.to_string(),
                    error: source,
                },
            )?;
            let rr = weenv_registry::BlobRangeReader::new(
                client2.clone(),
                handle.clone(),
                base_r.clone(),
                d.digest.clone(),
            )
            .with_size(d.size);
            layers.push(
                LayerReader::open(rr, hint).map_err(|source| MutationError::Layer {
                    path: format!("layer {} of {}", d.digest, base_r),
                    error: source,
                })?,
            );
        }
        Ok(build_mutation_tar(&layers, &patch, &root)?)
    })
    .await
    .map_err(|e| MutateError::Tar(std::io::Error::other(e)))??;
    let tar_path = crate::group::scratch_file(scratch, "mutation-", ".tar")?;
    std::fs::write(&tar_path, &tar).map_err(MutateError::Tar)?;
    let gspec = crate::group::GroupSpec {
        kind: GroupKind::Other("mutation".into()),
        name: spec.name.clone(),
        fragment: Default::default(),
        platform: Some(base.config.platform.clone()),
        mtime_clamp: None,
    };
    let report = crate::group::create_group(
        client,
        &crate::group::GroupSource::Tar(tar_path.clone()),
        &gspec,
        target,
        scratch,
        opts,
    )
    .await;
    let _ = std::fs::remove_file(&tar_path);
    Ok((report?, summary))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use weenv_env::mutation::union_lookup;
    use weenv_format::reader::TocHint;
    use weenv_format::writer::{write_layer, WriterOptions};

    /// A tar from (path, content or None for a dir, mode); symlinks as ("l", "->target").
    fn tar_of(entries: &[(&str, Option<&str>, u32)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (p, c, mode) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_mode(*mode);
            h.set_mtime(1000);
            match c {
                None => {
                    h.set_entry_type(tar::EntryType::Directory);
                    h.set_size(0);
                    b.append_data(&mut h, format!("{p}/"), std::io::empty())
                        .unwrap();
                }
                Some(t) if t.starts_with("->") => {
                    h.set_entry_type(tar::EntryType::Symlink);
                    h.set_size(0);
                    b.append_link(&mut h, p, &t[2..]).unwrap();
                }
                Some(t) => {
                    h.set_entry_type(tar::EntryType::Regular);
                    h.set_size(t.len() as u64);
                    b.append_data(&mut h, p, t.as_bytes()).unwrap();
                }
            }
        }
        b.into_inner().unwrap()
    }

    fn layer(tar: &[u8]) -> LayerReader<Vec<u8>> {
        let mut blob = Vec::new();
        let s = write_layer(tar, &mut blob, &WriterOptions::default()).unwrap();
        LayerReader::open(blob, Some(TocHint::from(&s))).unwrap()
    }

    /// Extract a layer tar over `dir` with overlay-style whiteout semantics.
    fn unpack_with_whiteouts(tar: &[u8], dir: &Path) {
        let mut ar = tar::Archive::new(tar);
        for e in ar.entries().unwrap() {
            let mut e = e.unwrap();
            let p = e.path().unwrap().into_owned();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            let parent = dir.join(p.parent().unwrap());
            if name == ".wh..wh..opq" {
                for c in std::fs::read_dir(&parent).unwrap() {
                    let c = c.unwrap().path();
                    if c.is_dir() && !c.is_symlink() {
                        std::fs::remove_dir_all(c).unwrap();
                    } else {
                        std::fs::remove_file(c).unwrap();
                    }
                }
            } else if let Some(victim) = name.strip_prefix(".wh.") {
                let v = parent.join(victim);
                if v.is_dir() && !v.is_symlink() {
                    std::fs::remove_dir_all(v).unwrap();
                } else {
                    std::fs::remove_file(v).unwrap();
                }
            } else {
                let target = dir.join(&p);
                if target.is_symlink() || target.is_file() {
                    std::fs::remove_file(&target).unwrap();
                }
                e.unpack_in(dir).unwrap();
                if e.header().entry_type().is_file() {
                    let mode = e.header().mode().unwrap();
                    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(mode))
                        .unwrap();
                }
            }
        }
    }

    /// (path, kind, perms, content or link) for every entry under `dir`.
    fn snapshot(dir: &Path) -> Vec<(String, char, u32, Vec<u8>)> {
        let mut out = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                let rel = p.strip_prefix(dir).unwrap().to_string_lossy().into_owned();
                let m = std::fs::symlink_metadata(&p).unwrap();
                if m.file_type().is_symlink() {
                    let t = std::fs::read_link(&p).unwrap();
                    out.push((rel, 'l', 0, t.to_string_lossy().as_bytes().to_vec()));
                } else if m.is_dir() {
                    out.push((rel, 'd', m.permissions().mode() & 0o7777, vec![]));
                    stack.push(p);
                } else {
                    out.push((
                        rel,
                        'f',
                        m.permissions().mode() & 0o7777,
                        std::fs::read(&p).unwrap(),
                    ));
                }
            }
        }
        out.sort();
        out
    }

    const PATCH: &str = "diff --git a/calc.py b/calc.py
--- a/calc.py
+++ b/calc.py
@@ -1,2 +1,2 @@
 def add(a, b):
-    return a + b
+    return a - b
diff --git a/run.sh b/run.sh
old mode 100644
new mode 100755
diff --git a/tests/new_test.py b/tests/new_test.py
new file mode 100644
--- /dev/null
+++ b/tests/new_test.py
@@ -0,0 +1 @@
+assert True
diff --git a/old.txt b/old.txt
deleted file mode 100644
--- a/old.txt
+++ /dev/null
@@ -1 +0,0 @@
-bye
diff --git a/a.txt b/b.txt
similarity index 100%
rename from a.txt
rename to b.txt
diff --git a/link b/link
--- a/link
+++ b/link
@@ -1 +1 @@
-calc.py
\\ No newline at end of file
+run.sh
\\ No newline at end of file
";

    fn base_layers() -> (Vec<u8>, Vec<u8>) {
        let bottom = tar_of(&[
            ("src", None, 0o755),
            ("src/repo", None, 0o755),
            (
                "src/repo/calc.py",
                Some("def add(a, b):\n    return a + b\n"),
                0o644,
            ),
            ("src/repo/run.sh", Some("#!/bin/sh\n"), 0o644),
            ("src/repo/old.txt", Some("stale\n"), 0o644),
            ("src/repo/a.txt", Some("moved\n"), 0o600),
            ("src/repo/gone.txt", Some("x\n"), 0o644),
            ("src/repo/link", Some("->calc.py"), 0o777),
        ]);
        // upper layer: overrides old.txt, whiteouts gone.txt
        let top = tar_of(&[
            ("src/repo/old.txt", Some("bye\n"), 0o644),
            ("src/repo/.wh.gone.txt", Some(""), 0o644),
        ]);
        (bottom, top)
    }

    fn mutation(strip: u32) -> Mutation {
        Mutation {
            mode: Default::default(),
            patch: Some("p.diff".into()),
            blob: None,
            checkout: None,
            root: "/src/repo".into(),
            strip,
            group: None,
        }
    }

    #[test]
    fn pre_applied_and_at_init_give_identical_trees() {
        let (bottom, top) = base_layers();
        let layers = vec![layer(&bottom), layer(&top)];
        assert!(union_lookup(&layers, "src/repo/gone.txt").is_none());
        assert_eq!(union_lookup(&layers, "src/repo/old.txt").unwrap().0, 1);

        let patch = parse_patch(PATCH.as_bytes(), 1).unwrap();
        let (mtar, summary) = build_mutation_tar(&layers, &patch, "/src/repo").unwrap();
        assert_eq!(summary.deleted, vec!["src/repo/old.txt", "src/repo/a.txt"]);
        assert_eq!(summary.written.len(), 5, "{:?}", summary.written);

        let pre = tempfile::tempdir().unwrap();
        unpack_with_whiteouts(&bottom, pre.path());
        unpack_with_whiteouts(&top, pre.path());
        let base_snapshot = snapshot(pre.path());
        unpack_with_whiteouts(&mtar, pre.path());

        let init = tempfile::tempdir().unwrap();
        unpack_with_whiteouts(&bottom, init.path());
        unpack_with_whiteouts(&top, init.path());
        assert_eq!(snapshot(init.path()), base_snapshot);
        apply_mutation_to_dir(init.path(), &mutation(1), Some(PATCH.as_bytes())).unwrap();

        let a = snapshot(pre.path());
        assert_eq!(a, snapshot(init.path()));
        let get = |p: &str| a.iter().find(|e| e.0 == p).cloned();
        assert_eq!(
            get("src/repo/calc.py").unwrap().3,
            b"def add(a, b):\n    return a - b\n"
        );
        assert_eq!(get("src/repo/run.sh").unwrap().2, 0o755);
        assert_eq!(
            get("src/repo/tests/new_test.py").unwrap().3,
            b"assert True\n"
        );
        assert!(get("src/repo/old.txt").is_none() && get("src/repo/a.txt").is_none());
        assert_eq!(get("src/repo/b.txt").unwrap().2, 0o600);
        assert_eq!(get("src/repo/link").unwrap().3, b"run.sh");
        assert!(get("src/repo/gone.txt").is_none());
    }

    #[test]
    fn rejected_hunk_fails_both_ways_and_changes_nothing() {
        let (bottom, _) = base_layers();
        // old.txt holds "stale" in the bottom layer only: the deletion hunk (-bye) is rejected
        let layers = vec![layer(&bottom)];
        let patch = parse_patch(PATCH.as_bytes(), 1).unwrap();
        let e = build_mutation_tar(&layers, &patch, "/src/repo").unwrap_err();
        assert!(e.to_string().contains("old.txt"), "{e}");

        let d = tempfile::tempdir().unwrap();
        unpack_with_whiteouts(&bottom, d.path());
        let before = snapshot(d.path());
        let e = apply_mutation_to_dir(d.path(), &mutation(1), Some(PATCH.as_bytes())).unwrap_err();
        assert!(
            matches!(e, MutateError::Patch(PatchError::Rejected { .. })),
            "{e}"
        );
        assert!(e.to_string().contains("old.txt: hunk #1"), "{e}");
        assert_eq!(snapshot(d.path()), before);
    }

    #[test]
    fn checkout_without_git_in_the_image_fails_before_patching() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("src/repo")).unwrap();
        std::fs::write(d.path().join("src/repo/calc.py"), "x\n").unwrap();
        let mut m = mutation(1);
        m.checkout = Some("abc123".into());
        let p = "--- a/calc.py\n+++ b/calc.py\n@@ -1 +1 @@\n-x\n+y\n";
        let e = apply_mutation_to_dir(d.path(), &m, Some(p.as_bytes())).unwrap_err();
        assert!(matches!(e, MutateError::Checkout { .. }), "{e}");
        assert!(e.to_string().contains("must contain git"), "{e}");
        assert_eq!(
            std::fs::read(d.path().join("src/repo/calc.py")).unwrap(),
            b"x\n"
        );
    }

    #[test]
    fn root_resolution_stays_inside_rootfs() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        std::fs::create_dir_all(r.join("opt/src")).unwrap();
        std::os::unix::fs::symlink("/opt/src", r.join("src")).unwrap();
        std::os::unix::fs::symlink("../../..", r.join("opt/up")).unwrap();
        assert_eq!(resolve_in_root(r, "/src").unwrap(), r.join("opt/src"));
        assert_eq!(resolve_in_root(r, "/opt/up/opt").unwrap(), r.join("opt"));
        assert_eq!(resolve_in_root(r, "/").unwrap(), r.to_path_buf());
        assert!(resolve_in_root(r, "/missing").is_err());
    }
}
