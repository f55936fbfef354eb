//! TOC JSON past the digest check: the semantic validator and everything that trusts a
//! validated TOC (chunk clipping, frame lists, fetch planning) over arbitrary TOCs.
#![no_main]

use libfuzzer_sys::fuzz_target;
use weenv_format::{frames_for_range, plan_fetch, FrameIdx, Toc};

fuzz_target!(|data: &[u8]| {
    if let Ok(toc) = serde_json::from_slice::<Toc>(data) {
        let end = toc
            .frames
            .last()
            .map_or(0, |f| f.offset.saturating_add(f.clen));
        let _ = toc.validate(end);
        for e in &toc.entries {
            let _ = e.chunks_in(0, u64::MAX).count();
            let _ = e.chunks_in(u64::MAX / 2, u64::MAX).count();
            let _ = frames_for_range(e, 1, 1 << 40);
        }
        let all: Vec<FrameIdx> = (0..toc.frames.len().min(1 << 16) as u32).map(FrameIdx).collect();
        let _ = plan_fetch(&toc, &all, 1 << 20, 8 << 20);
        let _ = plan_fetch(&toc, &all, u64::MAX, u64::MAX);
    }
});
