//! The fuzz targets' entry points (format/fuzz/fuzz_targets/*.rs), fed a few hundred
//! deterministic random and mutated inputs: typed error or correct result, never a panic.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use weenv_format::tarcheck::{check_entry, StreamChecker, MAX_HEADER_SPAN};
use weenv_format::toc::Toc;
use weenv_format::{write_layer, EntryKind, Footer, LayerReader};

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Same body as fuzz_targets/toc_parse.rs.
fn toc_parse(data: &[u8]) {
    let _ = Footer::parse(data);
    let _ = weenv_format::reader::parse_tail(data, data.len() as u64, None);
    if let Ok(r) = LayerReader::open(data, None) {
        for e in &r.toc().entries {
            let _ = r.read_entry(e, 0, u64::MAX);
        }
    }
}

/// Same body as fuzz_targets/tar_to_layer.rs.
fn tar_to_layer(data: &[u8]) {
    let mut blob = Vec::new();
    if write_layer(data, &mut blob, &small_frames()).is_ok() {
        assert_eq!(zstd_decompress(&blob), data);
        let r = LayerReader::open(&blob, None).unwrap();
        let toc = r.toc();
        for e in &toc.entries {
            if e.kind == EntryKind::File {
                r.read_entry(e, 0, u64::MAX).unwrap();
            }
            let to = (e.header + MAX_HEADER_SPAN).min(data.len() as u64) as usize;
            check_entry(toc, e, &data[e.header as usize..to]).unwrap();
        }
        let mut c = StreamChecker::new(toc);
        for piece in data.chunks(777) {
            c.update(piece);
        }
        c.finish().unwrap();
    }
}

fn seed_tar() -> Vec<u8> {
    let mut t = TarBuilder::new();
    t.dir("d/");
    t.file("d/a", b"alpha");
    t.file("d/b", &[7u8; 2500]);
    t.link(b'1', "d/h", "d/a");
    t.link(b'2', "d/s", "a");
    t.pax(&[("SCHILY.xattr.user.x", b"1"), ("mtime", b"1.5")], false);
    t.file("m", b"pax");
    t.file(&"x".repeat(150), b"long");
    t.gnu_long(b'L', "y".repeat(130).as_bytes());
    t.file("short", b"gnu long");
    t.finish()
}

fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut v = seed.to_vec();
    match rng.below(5) {
        0 => {
            for _ in 0..1 + rng.below(8) {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
        }
        1 => v.truncate(rng.below(v.len())),
        2 => {
            let i = rng.below(v.len());
            let n = rng.below(64);
            v.splice(i..i, (0..n).map(|_| rng.next() as u8));
        }
        3 => {
            let i = rng.below(v.len());
            v[i] = [0u8, 0xff, b'0', b'7', b' ', b'/', b'.'][rng.below(7)];
        }
        _ => {
            let i = rng.below(v.len());
            let j = (i + rng.below(600)).min(v.len());
            v.drain(i..j);
        }
    }
    v
}

#[test]
fn tar_to_layer_never_panics() {
    let seed = seed_tar();
    tar_to_layer(&seed);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for _ in 0..400 {
        let m = mutate(&mut rng, &seed);
        tar_to_layer(&m);
    }
    for n in [0usize, 1, 511, 512, 1024, 3000] {
        let junk: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
        tar_to_layer(&junk);
    }
}

#[test]
fn toc_parse_never_panics() {
    let tar = seed_tar();
    let mut blob = Vec::new();
    let s = write_layer(&tar[..], &mut blob, &small_frames()).unwrap();
    toc_parse(&blob);
    let mut rng = Rng(0xD1B5_4A32_D192_ED03);
    // Raw mutations of the blob, concentrated on the tail.
    for _ in 0..300 {
        let mut m = blob.clone();
        let tail = (blob.len() - s.toc_offset as usize).max(1);
        for _ in 0..1 + rng.below(4) {
            let i = blob.len() - 1 - rng.below(tail);
            m[i] ^= 1 << rng.below(8);
        }
        toc_parse(&m);
        toc_parse(&mutate(&mut rng, &blob));
    }
    // Semantic mutations: edit the TOC JSON, re-tail with a correct digest, so the validator
    // (not the digest check) has to catch it.
    let toc = LayerReader::open(&blob, None).unwrap().into_toc();
    let json = serde_json::to_vec(&toc).unwrap();
    let mut accepted = 0;
    for _ in 0..300 {
        let mut j = json.clone();
        for _ in 0..1 + rng.below(3) {
            let digits: Vec<usize> = j
                .iter()
                .enumerate()
                .filter(|(_, c)| c.is_ascii_digit())
                .map(|(i, _)| i)
                .collect();
            let i = digits[rng.below(digits.len())];
            j[i] = b"0123456789"[rng.below(10)];
            if rng.below(4) == 0 {
                j.insert(i, b"98765"[rng.below(5)]);
            }
        }
        let Ok(t) = serde_json::from_slice::<Toc>(&j) else {
            continue;
        };
        let m = retail(&blob, s.toc_offset, &t);
        if LayerReader::open(&m[..], None).is_ok() {
            accepted += 1;
        }
        toc_parse(&m);
    }
    // Some edits (mtime, mode digits, ...) are legal; most layout edits are not.
    assert!(accepted < 300);
}
