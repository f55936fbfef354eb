//! Footer + TOC reader over arbitrary bytes: must return a typed error or a verified TOC, never
//! panic or allocate without bound. When a TOC is accepted, every file is read back too (frame
//! decoding and chunk slicing over hostile but validated TOCs).
#![no_main]

use libfuzzer_sys::fuzz_target;
use weenv_format::{Footer, LayerReader};

fuzz_target!(|data: &[u8]| {
    let _ = Footer::parse(data);
    let _ = weenv_format::reader::parse_tail(data, data.len() as u64, None);
    if let Ok(r) = LayerReader::open(data, None) {
        for e in &r.toc().entries {
            let _ = r.read_entry(e, 0, u64::MAX);
        }
    }
});
