#![cfg(test)] // test-only module: the whole file compiles only under `cargo test`
#![allow(clippy::unwrap_used)]

use super::*;

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn cap(cpu: u64, mem: u64, rcpu: u64, rmem: u64) -> Capacity {
    Capacity {
        total: Res { cpu_m: cpu, mem },
        reserve: Res {
            cpu_m: rcpu,
            mem: rmem,
        },
    }
}

fn r(cpu_m: u64, mem: u64) -> Res {
    Res { cpu_m, mem }
}

#[test]
fn scale_up_never_uses_the_reserve() {
    let c = cap(4000, 4096, 1000, 1024);
    let mut f = LedgerFile::default();
    f.admit("a", 1, 1, r(500, 512), &c, 0);
    f.admit("b", 2, 1, r(500, 512), &c, 0);
    // a may grow to 4000 - 1000 - 500 = 2500.
    assert_eq!(f.ceiling("a", &c), r(2500, 2560));
    assert_eq!(f.request("a", r(8000, 9999), &c), Some(r(2500, 2560)));
    // shrinking is always accepted, never below base
    assert_eq!(f.request("a", r(100, 100), &c), Some(r(500, 512)));
    assert_eq!(f.request("zzz", r(1, 1), &c), None);
}

#[test]
fn admission_preempts_scale_up_gains() {
    let c = cap(4000, 1 << 40, 1000, 0);
    let mut f = LedgerFile::default();
    f.admit("a", 1, 1, r(500, 0), &c, 0);
    assert_eq!(f.request("a", r(3000, 0), &c), Some(r(3000, 0)));
    // b needs 1500: free is 4000-3000 = 1000 (the reserve), so 500 is taken from a.
    let adm = f.admit("b", 2, 1, r(1500, 0), &c, 42);
    assert_eq!(adm.preempted, vec![("a".to_string(), r(500, 0))]);
    assert!(!adm.oversubscribed);
    assert_eq!(f.entries["a"].granted, r(2500, 0));
    assert_eq!(f.entries["a"].preempted_at_ms, Some(42));
    // Bases beyond capacity are admitted, flagged.
    let adm = f.admit("c", 3, 1, r(9000, 0), &c, 43);
    assert!(adm.oversubscribed);
    assert_eq!(f.entries["a"].granted, r(500, 0), "all gains taken back");
}

#[test]
fn dead_shims_are_reaped() {
    let c = cap(4000, 4096, 0, 0);
    let mut f = LedgerFile::default();
    f.admit("a", 1, 10, r(500, 0), &c, 0);
    f.admit("b", 2, 20, r(500, 0), &c, 0);
    let dead = f.reap(|pid, start| pid == 1 && start == 10);
    assert_eq!(dead, vec!["b".to_string()]);
    assert_eq!(f.entries.len(), 1);
}

#[test]
fn file_ledger_is_shared_and_reaps_dead_pids() -> TestResult {
    let t = tempfile::tempdir()?;
    let l = Ledger::new(t.path());
    let c = cap(4000, 1 << 30, 0, 0);
    l.admit("ns/a", r(500, 1 << 20), &c)?;
    // An entry of a pid that does not exist is reaped by the next transaction.
    l.transact(|f| {
        f.admit("ns/ghost", u32::MAX - 1, 1, r(100, 0), &c, 0);
    })?;
    let f = l.read()?;
    assert!(!f.entries.contains_key("ns/ghost"), "reads skip dead shims");
    assert!(std::fs::read_to_string(l.path())?.contains("ns/ghost"));
    l.transact(|_| ())?;
    assert!(!std::fs::read_to_string(l.path())?.contains("ns/ghost"));
    let f = l.read()?;
    assert!(!f.entries.contains_key("ns/ghost"));
    assert_eq!(f.entries["ns/a"].shim_pid, std::process::id());
    // Concurrent transactions from threads do not lose updates.
    let hs: Vec<_> = (0..8)
        .map(|i| {
            let l = l.clone();
            std::thread::spawn(move || {
                l.admit(&format!("ns/t{i}"), r(10, 0), &c).unwrap() // ok: test code
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap(); // ok: test code
    }
    assert_eq!(l.read()?.entries.len(), 9);
    l.release("ns/a")?;
    assert_eq!(l.read()?.entries.len(), 8);
    Ok(())
}
