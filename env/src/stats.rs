//! Artifact accounting (`weenv-convert plan stats`): for a set of plans, what each packaging
//! strategy must publish (pure; sizes come from resolved groups or a synthetic model).
//!
//! - **weenv** (groups + plans): every distinct group once, layers deduplicated by digest; each
//!   plan adds one composed manifest (metadata only, a few KB, not counted as an artifact: `weenv
//!   run` composes it on the fly). Two variants: mutations
//!   pre-applied as tiny groups (one per task), or applied at init from patch files.
//! - **static bundling** (one full image per plan, T×H images): images built `FROM` the base
//!   share the base layers; every other layer is rebuilt, so it is published once per image.
//! - **dynamic assembly** (one image per distinct non-harness/evaluator stack, the harness and
//!   evaluator installed at every start): published bytes like static bundling over fewer
//!   images, plus harness+evaluator bytes fetched and installed at each start.

use std::collections::{BTreeMap, BTreeSet};

/// One group as stacked by a plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupShape {
    /// Identity (manifest digest, or a name in synthetic models).
    pub id: String,
    /// `base`, `task`, `harness`, `evaluator`, `mutation`, ...
    pub kind: String,
    /// (layer digest or id, compressed size).
    pub layers: Vec<(String, u64)>,
}

impl GroupShape {
    fn bytes(&self) -> u64 {
        self.layers.iter().map(|l| l.1).sum()
    }
}

/// One plan: its groups bottom→top.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanShape {
    pub groups: Vec<GroupShape>,
}

/// What one strategy publishes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cost {
    /// Published artifacts (images, groups, manifests).
    pub artifacts: usize,
    /// Layer bytes published.
    pub bytes: u64,
    /// Bytes installed at container start, summed over one start of every plan.
    pub init_bytes: u64,
}

/// The comparison.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub plans: usize,
    /// Distinct groups (weenv artifacts besides the composed manifests).
    pub groups: usize,
    /// Mutations pre-applied as tiny groups (one group per task).
    pub weenv: Cost,
    /// Mutations applied at init from patch files: `mutation` groups are replaced by patches
    /// (counted in `init_bytes` as applied per start, not as published groups).
    pub weenv_init_mutation: Cost,
    pub static_bundling: Cost,
    pub dynamic: Cost,
}

fn installed_at_init(kind: &str) -> bool {
    matches!(kind, "harness" | "evaluator")
}

/// Account for `plans`.
pub fn stats(plans: &[PlanShape]) -> Stats {
    let mut groups: BTreeMap<&str, &GroupShape> = BTreeMap::new();
    let mut layers: BTreeMap<&str, u64> = BTreeMap::new();
    let mut base_layers: BTreeMap<&str, u64> = BTreeMap::new();
    let mut static_rebuilt = 0u64;
    let mut dyn_images: BTreeMap<Vec<&str>, u64> = BTreeMap::new();
    let mut init_bytes = 0u64;
    for p in plans {
        let mut stack = Vec::new();
        let mut stack_bytes = 0u64;
        for g in &p.groups {
            groups.insert(&g.id, g);
            for (id, size) in &g.layers {
                layers.insert(id, *size);
                if g.kind == "base" {
                    base_layers.insert(id, *size);
                }
            }
            if g.kind != "base" {
                static_rebuilt += g.bytes();
            }
            if installed_at_init(&g.kind) {
                init_bytes += g.bytes();
            } else {
                stack.push(g.id.as_str());
                if g.kind != "base" {
                    stack_bytes += g.bytes();
                }
            }
        }
        dyn_images.insert(stack, stack_bytes);
    }
    let base_bytes: u64 = base_layers.values().sum();
    let non_mut_groups = groups.values().filter(|g| g.kind != "mutation").count();
    let mut_layers: BTreeSet<&str> = groups
        .values()
        .filter(|g| g.kind == "mutation")
        .flat_map(|g| g.layers.iter().map(|l| l.0.as_str()))
        .collect();
    let patch_bytes: u64 = plans
        .iter()
        .flat_map(|p| p.groups.iter())
        .filter(|g| g.kind == "mutation")
        .map(GroupShape::bytes)
        .sum();
    Stats {
        plans: plans.len(),
        groups: groups.len(),
        weenv: Cost {
            artifacts: groups.len(),
            bytes: layers.values().sum(),
            init_bytes: 0,
        },
        weenv_init_mutation: Cost {
            artifacts: non_mut_groups,
            bytes: layers
                .iter()
                .filter(|(id, _)| !mut_layers.contains(*id))
                .map(|(_, s)| s)
                .sum(),
            init_bytes: patch_bytes,
        },
        static_bundling: Cost {
            artifacts: plans.len(),
            bytes: base_bytes + static_rebuilt,
            init_bytes: 0,
        },
        dynamic: Cost {
            artifacts: dyn_images.len(),
            bytes: base_bytes + dyn_images.values().sum::<u64>(),
            init_bytes,
        },
    }
}

/// Sizes of a synthetic workload's groups (bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyntheticSizes {
    pub base: u64,
    pub task: u64,
    pub mutation: u64,
    pub harness: u64,
    pub evaluator: u64,
}

impl Default for SyntheticSizes {
    /// Debian+python base 150 MB, repository 40 MB, mutation 8 KB, harness 300 MB
    /// (an agent SDK stack), evaluator 5 MB.
    fn default() -> Self {
        SyntheticSizes {
            base: 150 << 20,
            task: 40 << 20,
            mutation: 8 << 10,
            harness: 300 << 20,
            evaluator: 5 << 20,
        }
    }
}

/// `tasks` tasks spread over `repos` repositories, each run with each of `harnesses`
/// harnesses: base + task(repo) + mutation(task) + harness + evaluator per plan.
pub fn synthetic(
    tasks: usize,
    repos: usize,
    harnesses: usize,
    s: SyntheticSizes,
) -> Vec<PlanShape> {
    let g = |id: String, kind: &str, size: u64| GroupShape {
        layers: vec![(format!("{id}-layer"), size)],
        id,
        kind: kind.to_string(),
    };
    let mut plans = Vec::new();
    for t in 0..tasks {
        for h in 0..harnesses {
            plans.push(PlanShape {
                groups: vec![
                    g("base".into(), "base", s.base),
                    g(format!("repo{}", t % repos.max(1)), "task", s.task),
                    g(format!("mut{t}"), "mutation", s.mutation),
                    g(format!("harness{h}"), "harness", s.harness),
                    g("evaluator".into(), "evaluator", s.evaluator),
                ],
            });
        }
    }
    plans
}

/// Human-readable table.
pub fn table(s: &Stats) -> String {
    let gb = |b: u64| {
        if b < 1 << 30 {
            format!("{:.2} MiB", b as f64 / f64::from(1u32 << 20))
        } else {
            format!("{:.2} GiB", b as f64 / f64::from(1u32 << 30))
        }
    };
    let mut out = format!(
        "plans: {}, distinct groups: {} (weenv artifacts = groups; composed manifests are metadata)\n",
        s.plans, s.groups
    );
    out += &format!(
        "{:<34} {:>10} {:>14} {:>16}\n",
        "strategy", "artifacts", "published", "installed/starts"
    );
    for (name, c) in [
        ("weenv, pre-applied mutations", &s.weenv),
        ("weenv, mutations at init", &s.weenv_init_mutation),
        ("static bundling (image per plan)", &s.static_bundling),
        ("dynamic (images + install at init)", &s.dynamic),
    ] {
        out += &format!(
            "{:<34} {:>10} {:>14} {:>16}\n",
            name,
            c.artifacts,
            gb(c.bytes),
            gb(c.init_bytes)
        );
    }
    out
}

/// Distinct ids of a kind across plans (for reports).
pub fn distinct_of_kind(plans: &[PlanShape], kind: &str) -> usize {
    plans
        .iter()
        .flat_map(|p| p.groups.iter())
        .filter(|g| g.kind == kind)
        .map(|g| g.id.as_str())
        .collect::<BTreeSet<_>>()
        .len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn t200_r4_h3() {
        let s = SyntheticSizes {
            base: 100,
            task: 10,
            mutation: 1,
            harness: 50,
            evaluator: 5,
        };
        let plans = synthetic(200, 4, 3, s);
        let st = stats(&plans);
        assert_eq!(st.plans, 600);
        // base + 4 repos + 200 mutations + 3 harnesses + 1 evaluator
        assert_eq!(st.groups, 1 + 4 + 200 + 3 + 1);
        assert_eq!(st.weenv.artifacts, 209);
        assert_eq!(st.weenv.bytes, 100 + 40 + 200 + 150 + 5);
        assert_eq!(st.weenv_init_mutation.artifacts, 9);
        assert_eq!(st.weenv_init_mutation.bytes, 100 + 40 + 150 + 5);
        assert_eq!(st.weenv_init_mutation.init_bytes, 600);
        assert_eq!(st.static_bundling.artifacts, 600);
        assert_eq!(st.static_bundling.bytes, 100 + 600 * (10 + 1 + 50 + 5));
        assert_eq!(st.dynamic.artifacts, 200);
        assert_eq!(st.dynamic.bytes, 100 + 200 * 11);
        assert_eq!(st.dynamic.init_bytes, 600 * 55);
        assert_eq!(distinct_of_kind(&plans, "harness"), 3);
        assert!(table(&st).contains("static bundling"));
    }
}
