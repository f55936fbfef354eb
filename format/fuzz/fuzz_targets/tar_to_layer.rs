//! Writer over arbitrary bytes: must return a typed error or a layer whose decompression is the
//! input byte for byte, whose TOC the reader accepts, and whose TOC the tar checks prove equal
//! to the tar (the whole stream, and every entry from its own header bytes).
#![no_main]

use libfuzzer_sys::fuzz_target;
use weenv_format::tarcheck::{check_entry, StreamChecker, MAX_HEADER_SPAN};
use weenv_format::{write_layer, LayerReader, WriterOptions};

fuzz_target!(|data: &[u8]| {
    let opts = WriterOptions {
        frame_size: 1024,
        small_file_threshold: 512,
        chunk_size: 1024,
        level: 1,
        shared_level: None,
    };
    let mut blob = Vec::new();
    if let Ok(summary) = write_layer(data, &mut blob, &opts) {
        let mut out = Vec::new();
        let mut dec = zstd::stream::read::Decoder::new(&blob[..]).expect("decoder");
        std::io::copy(&mut dec, &mut out).expect("written layer decompresses");
        assert_eq!(out, data, "decompression is the input");
        let r = LayerReader::open(&blob, None).expect("written layer opens");
        let toc = r.toc();
        for e in &toc.entries {
            if e.kind == weenv_format::EntryKind::File {
                r.read_entry(e, 0, u64::MAX).expect("file reads back");
            }
            let from = e.header as usize;
            let to = (e.header + MAX_HEADER_SPAN).min(data.len() as u64) as usize;
            check_entry(toc, e, &data[from..to]).expect("honest entry passes the header check");
        }
        let mut c = StreamChecker::new(toc);
        for piece in data.chunks(777) {
            c.update(piece);
        }
        let report = c.finish().expect("honest TOC passes the stream check");
        assert_eq!(report.diff_id, summary.diff_id);
    }
});
