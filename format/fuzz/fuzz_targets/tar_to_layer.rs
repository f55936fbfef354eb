//! Writer over arbitrary bytes: must return a typed error or a layer whose decompression is the
//! input byte for byte and whose TOC the reader accepts.
#![no_main]

use libfuzzer_sys::fuzz_target;
use weenv_format::{write_layer, LayerReader, WriterOptions};

fuzz_target!(|data: &[u8]| {
    let opts = WriterOptions {
        frame_size: 1024,
        small_file_threshold: 512,
        chunk_size: 1024,
        level: 1,
    };
    let mut blob = Vec::new();
    if write_layer(data, &mut blob, &opts).is_ok() {
        let mut out = Vec::new();
        let mut dec = zstd::stream::read::Decoder::new(&blob[..]).expect("decoder");
        std::io::copy(&mut dec, &mut out).expect("written layer decompresses");
        assert_eq!(out, data, "decompression is the input");
        let r = LayerReader::open(&blob, None).expect("written layer opens");
        for e in &r.toc().entries {
            if e.kind == weenv_format::EntryKind::File {
                r.read_entry(e, 0, u64::MAX).expect("file reads back");
            }
        }
    }
});
