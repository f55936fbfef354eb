use super::*;
use proptest::prelude::*;

fn tree(files: &[(&str, &str, u32)]) -> MemTree {
    MemTree {
        files: files
            .iter()
            .map(|(p, d, m)| {
                (
                    p.to_string(),
                    FileState {
                        data: d.as_bytes().to_vec(),
                        mode: *m,
                    },
                )
            })
            .collect(),
    }
}

/// Minimal LCS-based unified diff generator for tests (git style, 3 lines of context).
pub(crate) fn unified(path: &str, a: &[u8], b: &[u8]) -> String {
    let la = split_lines(a);
    let lb = split_lines(b);
    let (n, m) = (la.len(), lb.len());
    let mut dp = vec![vec![0usize; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            dp[i][j] = if la[i] == lb[j] {
                dp[i + 1][j + 1] + 1
            } else {
                dp[i + 1][j].max(dp[i][j + 1])
            };
        }
    }
    // ops: (kind, old index before op, new index before op, line)
    let mut ops: Vec<(LineKind, &[u8])> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < n || j < m {
        if i < n && j < m && la[i] == lb[j] {
            ops.push((LineKind::Context, la[i]));
            i += 1;
            j += 1;
        } else if i < n && (j == m || dp[i + 1][j] >= dp[i][j + 1]) {
            ops.push((LineKind::Remove, la[i]));
            i += 1;
        } else {
            ops.push((LineKind::Add, lb[j]));
            j += 1;
        }
    }
    let changed: Vec<usize> = (0..ops.len())
        .filter(|k| ops[*k].0 != LineKind::Context)
        .collect();
    let mut out = format!(
        "diff --git a/{path} b/{path}\nindex 000..111 100644\n--- a/{path}\n+++ b/{path}\n"
    );
    let mut k = 0;
    while k < changed.len() {
        let start = changed[k].saturating_sub(3);
        let mut end = (changed[k] + 4).min(ops.len());
        while k + 1 < changed.len() && changed[k + 1] < end + 3 {
            k += 1;
            end = (changed[k] + 4).min(ops.len());
        }
        k += 1;
        let old_before = ops[..start].iter().filter(|o| o.0 != LineKind::Add).count();
        let new_before = ops[..start]
            .iter()
            .filter(|o| o.0 != LineKind::Remove)
            .count();
        let old_len = ops[start..end]
            .iter()
            .filter(|o| o.0 != LineKind::Add)
            .count();
        let new_len = ops[start..end]
            .iter()
            .filter(|o| o.0 != LineKind::Remove)
            .count();
        let os = if old_len == 0 {
            old_before
        } else {
            old_before + 1
        };
        let ns = if new_len == 0 {
            new_before
        } else {
            new_before + 1
        };
        out += &format!("@@ -{os},{old_len} +{ns},{new_len} @@\n");
        for (kind, l) in &ops[start..end] {
            let c = match kind {
                LineKind::Context => ' ',
                LineKind::Remove => '-',
                LineKind::Add => '+',
            };
            out.push(c);
            out += &String::from_utf8_lossy(l);
            if !l.ends_with(b"\n") {
                out += "\n\\ No newline at end of file\n";
            }
        }
    }
    out
}

const GIT_PATCH: &str = "From 1234 Mon Sep 17 00:00:00 2001
Subject: [PATCH] introduce bug

---
diff --git a/src/calc.py b/src/calc.py
index 1111111..2222222 100644
--- a/src/calc.py
+++ b/src/calc.py
@@ -1,4 +1,4 @@
 def add(a, b):
-    return a + b
+    return a - b
 
 def mul(a, b):
diff --git a/run.sh b/run.sh
old mode 100644
new mode 100755
diff --git a/NEW.md b/NEW.md
new file mode 100644
index 0000000..3333333
--- /dev/null
+++ b/NEW.md
@@ -0,0 +1,2 @@
+hello
+world
\\ No newline at end of file
diff --git a/old.txt b/old.txt
deleted file mode 100644
index 4444444..0000000
--- a/old.txt
+++ /dev/null
@@ -1 +0,0 @@
-bye
diff --git a/empty b/empty
new file mode 100755
index 0000000..e69de29
diff --git a/a.txt b/b.txt
similarity index 100%
rename from a.txt
rename to b.txt
-- 
2.39.0
";

fn sample_tree() -> MemTree {
    tree(&[
        (
            "src/calc.py",
            "def add(a, b):\n    return a + b\n\ndef mul(a, b):\n    return a * b\n",
            MODE_FILE,
        ),
        ("run.sh", "#!/bin/sh\n", MODE_FILE),
        ("old.txt", "bye\n", MODE_FILE),
        ("a.txt", "moved\n", MODE_FILE),
    ])
}

#[test]
fn parses_git_patch_features() {
    let p = parse_patch(GIT_PATCH.as_bytes(), 1).unwrap();
    assert_eq!(p.files.len(), 6);
    assert_eq!(p.files[0].old_path.as_deref(), Some("src/calc.py"));
    assert_eq!(p.files[0].hunks[0].lines.len(), 5);
    assert_eq!(
        (p.files[1].old_mode, p.files[1].new_mode),
        (Some(0o100644), Some(0o100755))
    );
    assert!(p.files[1].hunks.is_empty());
    assert_eq!(p.files[2].old_path, None);
    assert_eq!(p.files[2].hunks[0].lines[1].1, b"world".to_vec());
    assert_eq!(p.files[3].new_path, None);
    assert_eq!(
        (
            p.files[4].old_path.as_deref(),
            p.files[4].new_path.as_deref()
        ),
        (None, Some("empty"))
    );
    assert_eq!(p.files[5].old_path.as_deref(), Some("a.txt"));
    assert_eq!(p.files[5].new_path.as_deref(), Some("b.txt"));
}

#[test]
fn applies_git_patch_in_memory() {
    let mut t = sample_tree();
    let r = apply_bytes(GIT_PATCH.as_bytes(), 1, &mut t).unwrap();
    let get = |p: &str| t.files.get(p).cloned();
    assert_eq!(
        get("src/calc.py").unwrap().data,
        b"def add(a, b):\n    return a - b\n\ndef mul(a, b):\n    return a * b\n".to_vec()
    );
    assert_eq!(get("run.sh").unwrap().mode, MODE_EXEC);
    assert_eq!(get("NEW.md").unwrap().data, b"hello\nworld".to_vec());
    assert_eq!(get("old.txt"), None);
    assert_eq!(
        get("empty").unwrap(),
        FileState {
            data: vec![],
            mode: MODE_EXEC
        }
    );
    assert_eq!(get("a.txt"), None);
    assert_eq!(get("b.txt").unwrap().data, b"moved\n".to_vec());
    assert_eq!(r.deleted, vec!["old.txt".to_string(), "a.txt".to_string()]);
    assert_eq!(r.written.len(), 5);
}

#[test]
fn rejected_hunk_names_file_and_hunk_and_writes_nothing() {
    let mut t = sample_tree();
    t.files.get_mut("src/calc.py").unwrap().data =
        b"def add(a, b):\n    return a + b + 0\n".to_vec();
    let before = t.clone();
    let e = apply_bytes(GIT_PATCH.as_bytes(), 1, &mut t).unwrap_err();
    match &e {
        PatchError::Rejected { file, hunk, .. } => {
            assert_eq!((file.as_str(), *hunk), ("src/calc.py", 1))
        }
        other => panic!("{other}"),
    }
    assert!(e.to_string().contains("src/calc.py: hunk #1"), "{e}");
    assert_eq!(t, before, "all-or-nothing");
    // a later file failing also leaves earlier files untouched
    let mut t = sample_tree();
    t.files.remove("old.txt");
    let before = t.clone();
    assert!(matches!(
        apply_bytes(GIT_PATCH.as_bytes(), 1, &mut t),
        Err(PatchError::Missing { .. })
    ));
    assert_eq!(t, before);
}

#[test]
fn create_over_existing_and_delete_with_extra_content_fail() {
    let mut t = sample_tree();
    t.files.insert(
        "NEW.md".into(),
        FileState {
            data: b"x".to_vec(),
            mode: MODE_FILE,
        },
    );
    assert!(matches!(
        apply_bytes(GIT_PATCH.as_bytes(), 1, &mut t),
        Err(PatchError::Exists { .. })
    ));
    let mut t = sample_tree();
    t.files.get_mut("old.txt").unwrap().data = b"bye\nmore\n".to_vec();
    assert!(matches!(
        apply_bytes(GIT_PATCH.as_bytes(), 1, &mut t),
        Err(PatchError::Rejected { .. })
    ));
}

#[test]
fn offset_search_finds_moved_hunk() {
    let old = "a\nb\nc\nd\ne\nf\ng\n";
    let new = "a\nb\nc\nD\ne\nf\ng\n";
    let p = unified("f", old.as_bytes(), new.as_bytes());
    let mut t = tree(&[("f", &format!("x\ny\nz\n{old}"), MODE_FILE)]);
    apply_bytes(p.as_bytes(), 1, &mut t).unwrap();
    assert_eq!(t.files["f"].data, format!("x\ny\nz\n{new}").into_bytes());
}

#[test]
fn no_newline_mismatch_is_rejected() {
    let p = unified("f", b"a\nb", b"a\nc");
    assert!(p.contains("\\ No newline"), "{p}");
    let mut ok = tree(&[("f", "a\nb", MODE_FILE)]);
    apply_bytes(p.as_bytes(), 1, &mut ok).unwrap();
    assert_eq!(ok.files["f"].data, b"a\nc".to_vec());
    let mut bad = tree(&[("f", "a\nb\n", MODE_FILE)]);
    assert!(matches!(
        apply_bytes(p.as_bytes(), 1, &mut bad),
        Err(PatchError::Rejected { .. })
    ));
}

#[test]
fn unsafe_and_unsupported_patches() {
    let p = "--- a/../etc/passwd\n+++ b/../etc/passwd\n@@ -1 +1 @@\n-x\n+y\n";
    assert!(matches!(
        parse_patch(p.as_bytes(), 1),
        Err(PatchError::UnsafePath { .. })
    ));
    let p = "--- /etc/passwd\n+++ /etc/passwd\n@@ -1 +1 @@\n-x\n+y\n";
    assert!(matches!(
        parse_patch(p.as_bytes(), 0),
        Err(PatchError::UnsafePath { .. })
    ));
    let p = "diff --git a/x.bin b/x.bin\nindex 1..2 100644\nGIT binary patch\nliteral 3\n";
    assert!(matches!(
        parse_patch(p.as_bytes(), 1),
        Err(PatchError::Unsupported { .. })
    ));
    let p = "--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n-x\n";
    let e = parse_patch(p.as_bytes(), 1).unwrap_err();
    assert!(matches!(e, PatchError::Parse { .. }), "{e}");
    assert!(e.to_string().contains("truncated"), "{e}");
}

#[test]
fn plain_diff_with_timestamps_and_strip0() {
    let p = "--- f.txt\t2024-01-01 00:00:00\n+++ f.txt\t2024-01-02 00:00:00\n@@ -1 +1 @@\n-x\n+y\n";
    let mut t = tree(&[("f.txt", "x\n", MODE_FILE)]);
    apply_bytes(p.as_bytes(), 0, &mut t).unwrap();
    assert_eq!(t.files["f.txt"].data, b"y\n".to_vec());
}

#[test]
fn dir_target_roundtrip_and_symlink_refusal() {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    let root = d.path();
    std::fs::create_dir_all(root.join("src")).unwrap();
    std::fs::write(
        root.join("src/calc.py"),
        "def add(a, b):\n    return a + b\n\ndef mul(a, b):\n    return a * b\n",
    )
    .unwrap();
    std::fs::write(root.join("run.sh"), "#!/bin/sh\n").unwrap();
    std::fs::write(root.join("old.txt"), "bye\n").unwrap();
    std::fs::write(root.join("a.txt"), "moved\n").unwrap();
    let mut t = DirTarget::new(root);
    apply_bytes(GIT_PATCH.as_bytes(), 1, &mut t).unwrap();
    assert!(!root.join("old.txt").exists());
    assert_eq!(std::fs::read(root.join("NEW.md")).unwrap(), b"hello\nworld");
    let mode = std::fs::metadata(root.join("run.sh"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o755);
    assert_eq!(std::fs::read(root.join("b.txt")).unwrap(), b"moved\n");

    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("victim"), "x\n").unwrap();
    std::os::unix::fs::symlink(outside.path(), root.join("escape")).unwrap();
    let p = "--- a/escape/victim\n+++ b/escape/victim\n@@ -1 +1 @@\n-x\n+pwned\n";
    assert!(apply_bytes(p.as_bytes(), 1, &mut t).is_err());
    assert_eq!(
        std::fs::read(outside.path().join("victim")).unwrap(),
        b"x\n"
    );
}

#[test]
fn symlink_patch_in_dir() {
    let d = tempfile::tempdir().unwrap();
    let p = "diff --git a/link b/link\nnew file mode 120000\n--- /dev/null\n+++ b/link\n@@ -0,0 +1 @@\n+target/file\n\\ No newline at end of file\n";
    let mut t = DirTarget::new(d.path());
    apply_bytes(p.as_bytes(), 1, &mut t).unwrap();
    assert_eq!(
        std::fs::read_link(d.path().join("link")).unwrap().to_str(),
        Some("target/file")
    );
}

fn lines_strategy() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(
        prop::sample::select(vec!["a", "b", "c", "d", "", "x y"]),
        0..40,
    )
    .prop_map(|v| v.into_iter().map(|s| format!("{s}\n")).collect())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// apply(diff(a, b), a) == b.
    #[test]
    fn diff_then_apply_roundtrips(a in lines_strategy(), b in lines_strategy()) {
        let (a, b) = (a.concat(), b.concat());
        let p = unified("dir/f", a.as_bytes(), b.as_bytes());
        let mut t = tree(&[("dir/f", &a, MODE_FILE)]);
        apply_bytes(p.as_bytes(), 1, &mut t).unwrap();
        prop_assert_eq!(&t.files["dir/f"].data, &b.as_bytes().to_vec());
    }

    /// With unique lines, hunks are found again after unrelated lines are prepended.
    #[test]
    fn offset_search_roundtrips(
        a in prop::collection::btree_set(0u8..40, 1..25),
        b in prop::collection::btree_set(0u8..40, 0..25),
        pre in 1usize..6,
    ) {
        let a: String = a.iter().map(|n| format!("l{n}\n")).collect();
        let b: String = b.iter().map(|n| format!("l{n}\n")).collect();
        let p = unified("f", a.as_bytes(), b.as_bytes());
        let prefix: String = (0..pre).map(|i| format!("pre{i}\n")).collect();
        let mut t = tree(&[("f", &format!("{prefix}{a}"), MODE_FILE)]);
        apply_bytes(p.as_bytes(), 1, &mut t).unwrap();
        prop_assert_eq!(t.files["f"].data.clone(), format!("{prefix}{b}").into_bytes());
    }

    /// Parsing and applying never panic on arbitrary bytes.
    #[test]
    fn arbitrary_bytes_never_panic(b in prop::collection::vec(any::<u8>(), 0..400)) {
        if let Ok(p) = parse_patch(&b, 1) {
            let _ = apply(&p, &mut MemTree::default());
        }
    }

    /// Parsing never panics on diff-like input.
    #[test]
    fn parse_never_panics(s in "(diff --git a/x b/x\n|--- a/x\n|\\+\\+\\+ b/x\n|@@ -1,2 \\+1 @@\n| x\n|-y\n|\\+z\n|\\\\ No newline\n|new file mode 100644\n){0,12}") {
        let _ = parse_patch(s.as_bytes(), 1);
    }
}
