//! A byte-bounded LRU index with pinning: the pure eviction policy shared by L1 and L2.
//!
//! It holds keys and sizes only (the caller owns the values or files). Invariants:
//! - `used()` is the sum of the sizes of all entries;
//! - after any call returns, either `used() <= capacity()` or every remaining entry is pinned;
//! - a pinned entry is never returned as evicted; eviction picks the least recently used
//!   unpinned entries first.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

#[derive(Debug)]
struct Node {
    size: u64,
    tick: u64,
    pins: u32,
}

/// LRU over keys with sizes, bounded by a byte capacity.
#[derive(Debug)]
pub struct Lru<K: Eq + Hash + Clone> {
    map: HashMap<K, Node>,
    order: BTreeMap<u64, K>,
    used: u64,
    capacity: u64,
    tick: u64,
}

impl<K: Eq + Hash + Clone> Lru<K> {
    /// Empty index with `capacity` bytes.
    pub fn new(capacity: u64) -> Self {
        Lru {
            map: HashMap::new(),
            order: BTreeMap::new(),
            used: 0,
            capacity,
            tick: 0,
        }
    }

    /// Bytes accounted.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Byte capacity.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The keys, in no particular order.
    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.map.keys()
    }

    /// True if `k` is present.
    pub fn contains(&self, k: &K) -> bool {
        self.map.contains_key(k)
    }

    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    /// Marks `k` most recently used. Returns false if absent.
    pub fn touch(&mut self, k: &K) -> bool {
        let t = self.next_tick();
        match self.map.get_mut(k) {
            Some(n) => {
                self.order.remove(&n.tick);
                n.tick = t;
                self.order.insert(t, k.clone());
                true
            }
            None => false,
        }
    }

    /// Inserts (or refreshes) `k` with `size` and returns the keys evicted to make room.
    /// An entry larger than the capacity is still inserted and evicted at once (returned),
    /// unless `pinned`.
    pub fn insert(&mut self, k: K, size: u64, pinned: bool) -> Vec<K> {
        let t = self.next_tick();
        if let Some(old) = self.map.remove(&k) {
            self.order.remove(&old.tick);
            self.used -= old.size;
            self.map.insert(
                k.clone(),
                Node {
                    size,
                    tick: t,
                    pins: old.pins + u32::from(pinned),
                },
            );
        } else {
            self.map.insert(
                k.clone(),
                Node {
                    size,
                    tick: t,
                    pins: u32::from(pinned),
                },
            );
        }
        self.order.insert(t, k);
        self.used += size;
        self.evict()
    }

    /// Reserves `size` bytes for a new entry `k`, inserted pinned, but only if evicting
    /// unpinned entries can make everything fit in the capacity: returns the keys evicted to
    /// make room, or `None` (nothing changed) when the pinned entries leave too little room
    /// or `k` is already present.
    pub fn reserve(&mut self, k: K, size: u64) -> Option<Vec<K>> {
        if self.map.contains_key(&k) {
            return None;
        }
        let pinned: u64 = self
            .map
            .values()
            .filter(|n| n.pins > 0)
            .map(|n| n.size)
            .sum();
        if pinned.saturating_add(size) > self.capacity {
            return None;
        }
        Some(self.insert(k, size, true))
    }

    /// Pins `k` (it will not be evicted until unpinned). Returns false if absent.
    pub fn pin(&mut self, k: &K) -> bool {
        match self.map.get_mut(k) {
            Some(n) => {
                n.pins += 1;
                true
            }
            None => false,
        }
    }

    /// True if `k` is present and pinned.
    pub fn pinned(&self, k: &K) -> bool {
        self.map.get(k).is_some_and(|n| n.pins > 0)
    }

    /// Unpins `k` and returns keys evicted now that it may go.
    pub fn unpin(&mut self, k: &K) -> Vec<K> {
        if let Some(n) = self.map.get_mut(k) {
            n.pins = n.pins.saturating_sub(1);
        }
        self.evict()
    }

    /// Removes `k`; returns its size if it was present (pins are ignored).
    pub fn remove(&mut self, k: &K) -> Option<u64> {
        let n = self.map.remove(k)?;
        self.order.remove(&n.tick);
        self.used -= n.size;
        Some(n.size)
    }

    fn evict(&mut self) -> Vec<K> {
        let mut out = Vec::new();
        if self.used <= self.capacity {
            return out;
        }
        let mut victims = Vec::new();
        let mut freed = 0u64;
        for (tick, k) in &self.order {
            if self.used - freed <= self.capacity {
                break;
            }
            if let Some(n) = self.map.get(k) {
                if n.pins == 0 {
                    freed += n.size;
                    victims.push(*tick);
                }
            }
        }
        for t in victims {
            if let Some(k) = self.order.remove(&t) {
                if let Some(n) = self.map.remove(&k) {
                    self.used -= n.size;
                }
                out.push(k);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn evicts_least_recently_used() {
        let mut l = Lru::new(100);
        assert!(l.insert("a", 40, false).is_empty());
        assert!(l.insert("b", 40, false).is_empty());
        l.touch(&"a");
        assert_eq!(l.insert("c", 40, false), vec!["b"]);
        assert_eq!(l.used(), 80);
        assert!(l.contains(&"a") && l.contains(&"c"));
    }

    #[test]
    fn pinned_entries_survive_until_unpinned() {
        let mut l = Lru::new(100);
        l.insert("a", 60, true);
        assert_eq!(
            l.insert("b", 60, false),
            vec!["b"],
            "b is the only unpinned entry"
        );
        assert!(l.contains(&"a"));
        assert!(l.unpin(&"a").is_empty(), "under capacity: nothing to evict");
        assert_eq!(l.insert("c", 60, false), vec!["a"]);
        assert_eq!(l.used(), 60);
    }

    #[test]
    fn oversized_entry_is_evicted_at_once() {
        let mut l = Lru::new(10);
        assert_eq!(l.insert("big", 11, false), vec!["big"]);
        assert!(l.is_empty());
    }

    #[test]
    fn reinsert_updates_size() {
        let mut l = Lru::new(100);
        l.insert(1, 10, false);
        l.insert(1, 30, false);
        assert_eq!(l.used(), 30);
        assert_eq!(l.remove(&1), Some(30));
        assert_eq!(l.used(), 0);
    }

    #[test]
    fn reserve_evicts_unpinned_or_refuses() {
        let mut l = Lru::new(100);
        l.insert("frame", 50, true);
        l.insert("old", 40, false);
        assert_eq!(l.reserve("copy", 60), None, "50 pinned + 60 > 100");
        assert_eq!(l.used(), 90, "a refused reservation changes nothing");
        assert_eq!(l.reserve("copy", 50), Some(vec!["old"]));
        assert_eq!(l.used(), 100);
        assert_eq!(l.reserve("copy", 1), None, "already present");
        assert!(l.unpin(&"copy").is_empty());
        assert_eq!(
            l.insert("x", 10, false),
            vec!["copy"],
            "unpinned copies are evictable"
        );
    }

    proptest! {
        #[test]
        fn used_bounded_unless_pinned(ops in proptest::collection::vec((0u8..20, 1u64..50, any::<bool>(), 0u8..4), 1..200)) {
            let mut l = Lru::new(200);
            let mut pinned: HashMap<u8, u32> = HashMap::new();
            for (k, size, pin, op) in ops {
                match op {
                    3 if size % 3 == 0 => { if let Some(ev) = l.reserve(k, size) { *pinned.entry(k).or_default() += 1;
                               for e in ev { prop_assert!(pinned.get(&e).copied().unwrap_or(0) == 0); } } }
                    0 | 1 => { let ev = l.insert(k, size, pin); if pin { *pinned.entry(k).or_default() += 1; }
                               for e in ev { prop_assert!(pinned.get(&e).copied().unwrap_or(0) == 0); } }
                    2 => { if pinned.get(&k).copied().unwrap_or(0) > 0 { *pinned.entry(k).or_default() -= 1; l.unpin(&k); } }
                    _ => { l.touch(&k); }
                }
                let all_pinned = l.map.values().all(|n| n.pins > 0);
                prop_assert!(l.used() <= 200 || all_pinned);
                let sum: u64 = l.map.values().map(|n| n.size).sum();
                prop_assert_eq!(sum, l.used());
            }
        }
    }
}
