//! Rendezvous (highest-random-weight) hashing: which member owns a frame digest. Pure.
//!
//! Every member scores every digest (`sha256(member ‖ 0 ‖ digest)`, first 8 bytes); the highest
//! score owns it. All nodes that know the same members agree on the owner without talking, a
//! member joining takes over only the digests it now wins (about 1/N), and a member leaving
//! hands only its own digests to their runner-up. The hash is sha256 (not std's `Hasher`,
//! whose output may change between Rust releases) so mixed builds during a rolling upgrade
//! still agree.

use sha2::{Digest as _, Sha256};
use std::net::SocketAddr;
use weenv_format::Digest;

/// A member's score for `digest` (higher wins).
pub fn score(member: &SocketAddr, digest: &Digest) -> u64 {
    let mut h = Sha256::new();
    h.update(member.to_string().as_bytes());
    h.update([0u8]);
    h.update(digest.as_str().as_bytes());
    let out = h.finalize();
    let mut b = [0u8; 8];
    b.copy_from_slice(&out[..8]);
    u64::from_be_bytes(b)
}

/// `members` ordered by their score for `digest`, owner first (ties: lower address first).
pub fn ranked(members: &[SocketAddr], digest: &Digest) -> Vec<SocketAddr> {
    let mut v: Vec<(u64, SocketAddr)> = members.iter().map(|m| (score(m, digest), *m)).collect();
    v.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    v.dedup_by(|a, b| a.1 == b.1);
    v.into_iter().map(|(_, m)| m).collect()
}

/// The owner of `digest` among `members` (`None` when there are none).
pub fn owner(members: &[SocketAddr], digest: &Digest) -> Option<SocketAddr> {
    members
        .iter()
        .map(|m| (score(m, digest), *m))
        .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)))
        .map(|(_, m)| m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(n: u8) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, n], 7470))
    }
    fn d(i: u32) -> Digest {
        Digest::sha256(&i.to_le_bytes())
    }

    #[test]
    fn owner_is_the_first_ranked_and_order_does_not_matter() {
        let a = [m(1), m(2), m(3), m(4)];
        let b = [m(4), m(2), m(1), m(3)];
        for i in 0..200 {
            let r = ranked(&a, &d(i));
            assert_eq!(r.len(), 4);
            assert_eq!(owner(&a, &d(i)), Some(r[0]));
            assert_eq!(owner(&b, &d(i)), Some(r[0]));
            assert_eq!(ranked(&b, &d(i)), r);
        }
        assert_eq!(owner(&[], &d(0)), None);
        assert_eq!(ranked(&[m(1), m(1)], &d(0)), vec![m(1)]);
    }

    #[test]
    fn load_is_spread_evenly() {
        let ms = [m(1), m(2), m(3), m(4)];
        let mut count = [0u32; 4];
        for i in 0..8000 {
            let o = owner(&ms, &d(i)).unwrap();
            count[ms.iter().position(|x| *x == o).unwrap()] += 1;
        }
        for c in count {
            assert!((1700..=2300).contains(&c), "{count:?}");
        }
    }

    #[test]
    fn a_joining_member_takes_only_what_it_wins_and_a_leaving_one_hands_to_runner_up() {
        let four = [m(1), m(2), m(3), m(4)];
        let five = [m(1), m(2), m(3), m(4), m(5)];
        let mut moved = 0;
        for i in 0..5000 {
            let (before, after) = (owner(&four, &d(i)).unwrap(), owner(&five, &d(i)).unwrap());
            if before != after {
                assert_eq!(after, m(5), "only moves to the new member");
                moved += 1;
                // The new member's runner-up is the old owner: it still holds the frame.
                assert_eq!(ranked(&five, &d(i))[1], before);
            }
        }
        assert!((800..=1200).contains(&moved), "{moved} of 5000 moved");
        for i in 0..2000 {
            let r = ranked(&five, &d(i));
            let without: Vec<SocketAddr> = five.iter().copied().filter(|x| *x != r[0]).collect();
            assert_eq!(owner(&without, &d(i)), Some(r[1]));
        }
    }
}
