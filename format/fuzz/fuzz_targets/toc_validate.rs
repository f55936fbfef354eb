//! TOC JSON past the digest check: the semantic validator, everything that trusts a validated
//! TOC (chunk clipping, frame lists, fetch planning), and the tar checks comparing arbitrary
//! TOCs with a fixed small tar stream (typed errors, never a panic).
#![no_main]

use libfuzzer_sys::fuzz_target;
use weenv_format::tarcheck::{check_entry, StreamChecker};
use weenv_format::{frames_for_range, plan_fetch, FrameIdx, Toc};

/// A tiny ustar stream: directory `d/`, file `d/f` ("hi"), end blocks.
fn seed_tar() -> Vec<u8> {
    fn header(name: &str, typeflag: u8, size: u64) -> [u8; 512] {
        let mut b = [0u8; 512];
        b[..name.len()].copy_from_slice(name.as_bytes());
        b[100..108].copy_from_slice(b"0000644\0");
        b[124..136].copy_from_slice(format!("{size:011o}\0").as_bytes());
        b[156] = typeflag;
        b[257..265].copy_from_slice(b"ustar\x0000");
        b[148..156].fill(b' ');
        let sum: u32 = b.iter().map(|x| u32::from(*x)).sum();
        b[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        b
    }
    let mut t = Vec::new();
    t.extend_from_slice(&header("d/", b'5', 0));
    t.extend_from_slice(&header("d/f", b'0', 2));
    let mut data = [0u8; 512];
    data[..2].copy_from_slice(b"hi");
    t.extend_from_slice(&data);
    t.extend_from_slice(&[0u8; 1024]);
    t
}

fuzz_target!(|data: &[u8]| {
    if let Ok(toc) = serde_json::from_slice::<Toc>(data) {
        let end = toc
            .frames
            .last()
            .map_or(0, |f| f.offset.saturating_add(f.clen));
        let valid = toc.validate(end).is_ok();
        for e in &toc.entries {
            let _ = e.chunks_in(0, u64::MAX).count();
            let _ = e.chunks_in(u64::MAX / 2, u64::MAX).count();
            let _ = frames_for_range(e, 1, 1 << 40);
        }
        let all: Vec<FrameIdx> = (0..toc.frames.len().min(1 << 16) as u32).map(FrameIdx).collect();
        let _ = plan_fetch(&toc, &all, 1 << 20, 8 << 20);
        let _ = plan_fetch(&toc, &all, u64::MAX, u64::MAX);
        let tar = seed_tar();
        if valid {
            for e in &toc.entries {
                let from = (e.header.min(tar.len() as u64)) as usize;
                let _ = check_entry(&toc, e, &tar[from..]);
            }
        }
        let mut c = StreamChecker::new(&toc);
        c.update(&tar);
        let _ = c.finish();
    }
});
