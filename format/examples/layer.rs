//! `cargo run -p weenv-format --example layer -- IN.tar OUT.tar.zst [chunk_kib]`: convert a tar
//! into a weenv layer, re-open it, print the summary, time and ratio (a quick benchmark tool).

use std::time::Instant;
use weenv_format::{write_layer, LayerReader, WriterOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        return Err("usage: layer IN.tar OUT.tar.zst [chunk_kib]".into());
    }
    let mut opts = WriterOptions::default();
    if let Some(k) = args.get(3) {
        opts.chunk_size = k.parse::<u64>()? << 10;
    }
    let input = std::io::BufReader::new(std::fs::File::open(&args[1])?);
    let output = std::io::BufWriter::new(std::fs::File::create(&args[2])?);
    let t = Instant::now();
    let s = write_layer(input, output, &opts)?;
    let secs = t.elapsed().as_secs_f64();
    println!("{s:#?}");
    println!(
        "write: {:.2} s, {:.1} MB/s, ratio {:.3}, TOC {} bytes",
        secs,
        s.uncompressed_size as f64 / secs / 1e6,
        s.blob_size as f64 / s.uncompressed_size as f64,
        s.toc_length
    );
    let t = Instant::now();
    let r = LayerReader::open(std::fs::File::open(&args[2])?, None)?;
    println!(
        "open: {:.3} s, {} entries, {} frames",
        t.elapsed().as_secs_f64(),
        r.toc().entries.len(),
        r.toc().frames.len()
    );
    // What `weenv-convert verify` adds: the TOC checked against the tar stream. Timed apart
    // from decompression (frames decoded first), then both together.
    let t = Instant::now();
    let frames: Vec<Vec<u8>> = (0..r.toc().frames.len() as u32)
        .map(|i| r.read_frame(weenv_format::FrameIdx(i)))
        .collect::<Result<_, _>>()?;
    let decode = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let mut c = weenv_format::StreamChecker::new(r.toc());
    for f in &frames {
        c.update(f);
    }
    let report = c.finish()?;
    let check = t.elapsed().as_secs_f64();
    println!(
        "verify: frames decoded + sha256 {:.2} s, TOC-vs-tar check {:.2} s ({:.0} MB/s, {} entries, diff_id {})",
        decode,
        check,
        report.bytes as f64 / check / 1e6,
        report.entries,
        report.diff_id
    );
    Ok(())
}
