//! Benchmarks for groups and plans (run by `integration/bench/plan_bench.sh`; prints a table):
//! 1. compose latency of a 4-group plan against a local registry: cold (empty resolution cache)
//!    and warm (cache loaded from disk, tags within TTL), resolve+compose alone and with publish;
//! 2. at-init mutation latency, median of 100: a 4-file patch (modify, new file, delete, mode)
//!    applied into a fresh overlay upper layer over a 400-file repository, as `weenv run` does;
//! 3. artifact accounting for T=200 tasks over 4 repositories and H=3 harnesses.
//!
//! Timings are printed, not asserted (no timed asserts); correctness of every iteration is.

use anyhow::{ensure, Result};
use std::path::Path;
use std::process::Command;
use std::time::{Instant, SystemTime};
use weenv_converter::group::{create_group, GroupSource, GroupSpec};
use weenv_converter::mutate::apply_mutation_to_dir;
use weenv_converter::plan::{compose_plan, parse_ref, publish_composed};
use weenv_converter::registry_config;
use weenv_converter::resolve_cache::{unix_secs, ResolveCache, ResolvePolicy};
use weenv_env::group::{ConfigFragment, GroupKind};
use weenv_env::plan::{Mutation, Plan};
use weenv_env::stats::{stats, synthetic, table, SyntheticSizes};
use weenv_format::writer::WriterOptions;
use weenv_integration::images;
use weenv_integration::registry::LocalRegistry;
use weenv_integration::util::require_root_and_bins;
use weenv_registry::Client;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn p90(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[(v.len() * 9) / 10]
}

const PATCH: &str = "diff --git a/pkg/mod_007.py b/pkg/mod_007.py
--- a/pkg/mod_007.py
+++ b/pkg/mod_007.py
@@ -1,4 +1,4 @@
 # module 7
 def f7(x):
-    return x + 7
+    return x - 7
 
diff --git a/tests/test_bug.py b/tests/test_bug.py
new file mode 100644
--- /dev/null
+++ b/tests/test_bug.py
@@ -0,0 +1,2 @@
+from pkg.mod_007 import f7
+assert f7(7) == 0
diff --git a/pkg/mod_300.py b/pkg/mod_300.py
deleted file mode 100644
--- a/pkg/mod_300.py
+++ /dev/null
@@ -1,4 +0,0 @@
-# module 300
-def f300(x):
-    return x + 300
-
diff --git a/run_tests.sh b/run_tests.sh
old mode 100644
new mode 100755
";

fn make_repo(root: &Path) -> Result<()> {
    for i in 0..400 {
        let p = root.join(format!("pkg/mod_{i:03}.py"));
        std::fs::create_dir_all(p.parent().unwrap_or(root))?;
        std::fs::write(
            p,
            format!("# module {i}\ndef f{i}(x):\n    return x + {i}\n\n"),
        )?;
    }
    std::fs::create_dir_all(root.join("tests"))?;
    std::fs::write(root.join("run_tests.sh"), "#!/bin/sh\npython3 -m pytest\n")?;
    Ok(())
}

async fn compose_bench(tmp: &Path) -> Result<Vec<(String, f64, f64)>> {
    let reg = LocalRegistry::start(tmp)?;
    let host = reg.host();
    let client = Client::new(registry_config(std::slice::from_ref(&host)))?;
    let scratch = tmp.join("scratch");
    std::fs::create_dir_all(&scratch)?;
    images::push_oci_layout(&images::busybox()?, &format!("{host}/src/busybox:1"))?;
    let spec = |kind: GroupKind, name: &str| GroupSpec {
        kind,
        name: name.into(),
        fragment: ConfigFragment::default(),
        platform: None,
        mtime_clamp: None,
    };
    create_group(
        &client,
        &GroupSource::Image {
            reference: format!("{host}/src/busybox:1"),
            layers: 0..1,
        },
        &spec(GroupKind::Base, "base"),
        &parse_ref(&format!("{host}/weenv/base:1"))?,
        &scratch,
        &WriterOptions::default(),
    )
    .await?;
    for (kind, name) in [
        (GroupKind::Task, "task"),
        (GroupKind::Harness, "harness"),
        (GroupKind::Evaluator, "eval"),
    ] {
        let d = tmp.join(name);
        make_repo(&d)?;
        create_group(
            &client,
            &GroupSource::Dir(d),
            &spec(kind, name),
            &parse_ref(&format!("{host}/weenv/{name}:1"))?,
            &scratch,
            &WriterOptions::default(),
        )
        .await?;
    }
    let plan = Plan::parse(&format!(
        "version = 1\ngroups = [\"{host}/weenv/base:1\", \"{host}/weenv/task:1\", \"{host}/weenv/harness:1\", \"{host}/weenv/eval:1\"]\n"
    ))?;
    let target = parse_ref(&format!("{host}/weenv/env:bench"))?;
    let cache_dir = tmp.join("cache");
    let policy = ResolvePolicy::default();
    let mut rows = Vec::new();
    for warm in [false, true] {
        let (mut compose_ms, mut total_ms) = (Vec::new(), Vec::new());
        for _ in 0..21 {
            if !warm {
                let _ = std::fs::remove_dir_all(&cache_dir);
            }
            let t = Instant::now();
            let mut cache = ResolveCache::load(&cache_dir);
            let now = unix_secs(SystemTime::now());
            let (groups, composed) = compose_plan(&client, &plan, &mut cache, now, policy).await?;
            cache.save()?;
            compose_ms.push(t.elapsed().as_secs_f64() * 1e3);
            let r = publish_composed(&client, &groups, &composed, &target).await?;
            total_ms.push(t.elapsed().as_secs_f64() * 1e3);
            ensure!(r.manifest_digest == Some(composed.manifest_digest.clone()));
        }
        rows.push((
            if warm { "warm cache" } else { "cold cache" }.to_string(),
            median(&mut compose_ms),
            median(&mut total_ms),
        ));
    }
    Ok(rows)
}

fn sh(cmd: &mut Command) -> Result<()> {
    let o = cmd.output()?;
    ensure!(
        o.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    Ok(())
}

/// Median/p90 of applying the patch into a fresh overlay upper layer (apply only), and of the
/// whole mount + apply + umount.
fn mutation_bench(tmp: &Path) -> Result<(f64, f64, f64)> {
    let lower = tmp.join("lower");
    make_repo(&lower.join("src/repo"))?;
    let m = Mutation {
        mode: Default::default(),
        patch: Some("bench.diff".into()),
        blob: None,
        checkout: None,
        root: "/src/repo".into(),
        strip: 1,
        group: None,
    };
    let (mut apply_ms, mut full_ms) = (Vec::new(), Vec::new());
    for i in 0..100 {
        let (upper, work, merged) = (
            tmp.join(format!("u{i}")),
            tmp.join(format!("w{i}")),
            tmp.join(format!("m{i}")),
        );
        for d in [&upper, &work, &merged] {
            std::fs::create_dir_all(d)?;
        }
        let opts = format!(
            "lowerdir={},upperdir={},workdir={}",
            lower.display(),
            upper.display(),
            work.display()
        );
        let t0 = Instant::now();
        sh(Command::new("mount")
            .args(["-t", "overlay", "overlay", "-o", &opts])
            .arg(&merged))?;
        let t1 = Instant::now();
        let r = apply_mutation_to_dir(&merged, &m, Some(PATCH.as_bytes()));
        let t2 = Instant::now();
        sh(Command::new("umount").arg(&merged))?;
        let t3 = Instant::now();
        let r = r?;
        ensure!(r.written.len() == 3 && r.deleted.len() == 1, "{r:?}");
        // overlayfs records the deletion as a 0/0 character device in the upper layer
        let wh = std::fs::symlink_metadata(upper.join("src/repo/pkg/mod_300.py"))?;
        ensure!(std::os::unix::fs::FileTypeExt::is_char_device(
            &wh.file_type()
        ));
        apply_ms.push((t2 - t1).as_secs_f64() * 1e3);
        full_ms.push((t3 - t0).as_secs_f64() * 1e3);
        let _ = std::fs::remove_dir_all(&upper);
        let _ = std::fs::remove_dir_all(&work);
    }
    let p = p90(&mut apply_ms.clone());
    Ok((median(&mut apply_ms), p, median(&mut full_ms)))
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "benchmark; needs root, docker-registry, skopeo, umoci, overlayfs"]
async fn plan_and_mutation_bench() -> Result<()> {
    require_root_and_bins(&["docker-registry", "skopeo", "umoci", "mount"])?;
    let tmp = tempfile::tempdir()?;
    let rows = compose_bench(tmp.path()).await?;
    let (apply_med, apply_p90, full_med) = mutation_bench(tmp.path())?;
    let st = stats(&synthetic(200, 4, 3, SyntheticSizes::default()));

    println!("\n== compose latency, 4-group plan (median of 21) ==");
    println!(
        "{:<12} {:>14} {:>22}",
        "", "resolve+compose", "+ publish (mount, push)"
    );
    for (name, c, t) in &rows {
        println!("{name:<12} {c:>11.2} ms {t:>19.2} ms");
    }
    println!("\n== at-init mutation (4-file patch, 400-file repo, overlay upper), 100 runs ==");
    println!("apply: median {apply_med:.2} ms, p90 {apply_p90:.2} ms; mount+apply+umount median {full_med:.2} ms");
    println!("\n== artifacts: T=200 tasks, 4 repositories, H=3 harnesses ==");
    print!("{}", table(&st));
    Ok(())
}
