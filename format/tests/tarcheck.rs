//! TOCs that lie about their tar: every lie is rejected by `StreamChecker` (the whole stream),
//! and the per-entry header check rejects the ones it can see from the entry's own header.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use weenv_format::tarcheck::{check_entry, check_entry_header, StreamChecker, MAX_HEADER_SPAN};
use weenv_format::toc::{Entry, EntryKind, Toc, TocLimits};
use weenv_format::{write_layer, FormatError, LayerReader, LayerSummary};

/// An image layer with one of everything that matters.
fn sample_tar() -> Vec<u8> {
    let mut t = TarBuilder::new();
    t.dir("bin/");
    t.entry(
        Hdr {
            name: b"bin/busybox".to_vec(),
            typeflag: b'0',
            size: 3000,
            mode: 0o755,
            mtime: 1_700_000_000,
            ..Default::default()
        },
        &[0xb5; 3000],
        Names::Pax,
        &[],
    );
    t.link(b'2', "bin/sh", "busybox");
    t.link(b'1', "bin/ash", "bin/busybox");
    t.dir("etc/");
    t.entry(
        Hdr {
            name: b"etc/passwd".to_vec(),
            typeflag: b'0',
            size: 9,
            mode: 0o644,
            uid: 0,
            mtime: 1_700_000_000,
            ..Default::default()
        },
        b"root:x:0\n",
        Names::Pax,
        &[("user.note".to_string(), b"honest".to_vec())],
    );
    t.file("etc/hostname", b"box\n");
    t.entry(
        Hdr {
            name: format!("opt/{}", "n".repeat(120)).into_bytes(),
            typeflag: b'0',
            size: 4,
            mode: 0o600,
            uid: 1000,
            gid: 1000,
            mtime: 1_700_000_000,
            ..Default::default()
        },
        b"long",
        Names::Gnu,
        &[],
    );
    t.finish()
}

fn sample() -> (Vec<u8>, Vec<u8>, LayerSummary, Toc) {
    let tar = sample_tar();
    let mut blob = Vec::new();
    let s = write_layer(&tar[..], &mut blob, &small_frames()).unwrap();
    let toc = LayerReader::open(&blob[..], None).unwrap().into_toc();
    (tar, blob, s, toc)
}

/// Feed the stream in awkward pieces (the parser is push style).
fn stream_check(toc: &Toc, tar: &[u8]) -> Result<weenv_format::StreamReport, FormatError> {
    let mut c = StreamChecker::new(toc);
    let mut at = 0;
    let mut step = 1;
    while at < tar.len() {
        let n = step.min(tar.len() - at);
        c.update(&tar[at..n + at]);
        at += n;
        step = (step * 7 + 3) % 1500 + 1;
    }
    c.finish()
}

fn entry_check(toc: &Toc, tar: &[u8], e: &Entry) -> Result<u64, FormatError> {
    let from = (e.header as usize).min(tar.len());
    let to = (e.header + MAX_HEADER_SPAN).min(tar.len() as u64) as usize;
    check_entry(toc, e, &tar[from..to])
}

fn idx(toc: &Toc, path: &str) -> usize {
    toc.entries.iter().position(|e| e.path == path).unwrap()
}

fn field_of(err: &FormatError) -> &'static str {
    match err {
        FormatError::TocMismatch { field, .. } => field,
        FormatError::StreamMismatch { what, .. } => what,
        other => panic!("not a mismatch: {other}"),
    }
}

#[test]
fn honest_layer_passes_both_checks() {
    let (tar, _, s, toc) = sample();
    let report = stream_check(&toc, &tar).unwrap();
    assert_eq!(report.diff_id, s.diff_id);
    assert_eq!(report.bytes, tar.len() as u64);
    assert_eq!(report.entries, toc.entries.len() as u64);
    for e in &toc.entries {
        let span = entry_check(&toc, &tar, e).unwrap();
        assert!(span >= 512, "{}", e.path);
        if let Some(start) = toc.data_start(e) {
            assert_eq!(e.header + span, start, "{}", e.path);
        }
    }
    // The long name uses a GNU L header: its span covers it.
    let long = &toc.entries[toc.entries.len() - 1];
    assert!(entry_check(&toc, &tar, long).unwrap() >= 1536);
    // Too few bytes: asks for more rather than calling it a lie.
    let e = &toc.entries[idx(&toc, "etc/passwd")];
    let h = e.header as usize;
    assert!(matches!(
        check_entry_header(e, &tar[h..h + 600]),
        Err(FormatError::TruncatedTar { .. })
    ));
}

/// Apply `lie` to the honest TOC; both checks must reject it (the per-entry one on `path`).
fn lie_seen_by_both(path: &str, field: &str, lie: impl Fn(&mut Toc)) {
    let (tar, _, _, mut toc) = sample();
    lie(&mut toc);
    let err = stream_check(&toc, &tar).unwrap_err();
    assert_eq!(field_of(&err), field, "stream check: {err}");
    assert!(err.to_string().contains(path), "{err}");
    let e = &toc.entries[idx(&toc, path)];
    let err = entry_check(&toc, &tar, e).unwrap_err();
    assert_eq!(field_of(&err), field, "entry check: {err}");
}

#[test]
fn setuid_only_in_the_toc() {
    lie_seen_by_both("bin/busybox", "mode", |t| {
        let i = idx(t, "bin/busybox");
        t.entries[i].mode |= 0o4000;
    });
}

#[test]
fn wrong_uid_and_gid() {
    lie_seen_by_both("etc/passwd", "uid", |t| {
        let i = idx(t, "etc/passwd");
        t.entries[i].uid = 1000;
    });
    lie_seen_by_both("etc/hostname", "gid", |t| {
        let i = idx(t, "etc/hostname");
        t.entries[i].gid = 42;
    });
}

#[test]
fn wrong_xattr() {
    lie_seen_by_both("etc/passwd", "xattrs", |t| {
        let i = idx(t, "etc/passwd");
        t.entries[i]
            .xattrs
            .insert("security.capability".into(), vec![1, 0, 0, 2]);
    });
}

#[test]
fn wrong_link_targets() {
    lie_seen_by_both("bin/sh", "link target", |t| {
        let i = idx(t, "bin/sh");
        t.entries[i].link = Some("/etc/shadow".into());
    });
    lie_seen_by_both("bin/ash", "link target", |t| {
        let i = idx(t, "bin/ash");
        t.entries[i].link = Some("etc/passwd".into());
    });
}

#[test]
fn type_and_device_lies() {
    lie_seen_by_both("etc/hostname", "type", |t| {
        let i = idx(t, "etc/hostname");
        let e = &mut t.entries[i];
        e.kind = EntryKind::Char;
        e.devmajor = 1;
        e.devminor = 3;
        e.size = 0;
        e.chunks.clear();
    });
}

#[test]
fn file_grown_by_repeating_a_frame() {
    let (tar, _, _, mut toc) = sample();
    let i = idx(&toc, "bin/busybox");
    let e = &mut toc.entries[i];
    let again = e.chunks[0].clone();
    let mut extra = again.clone();
    extra.file_offset = e.size;
    e.chunks.push(extra);
    e.size += again.len;
    // Validation refuses it (chunks are not contiguous in the stream) ...
    let end = toc.frames.last().map_or(0, |f| f.offset + f.clen);
    assert!(toc.validate(end).is_err());
    // ... and both tar checks see the size the tar really has.
    let err = stream_check(&toc, &tar).unwrap_err();
    assert_eq!(field_of(&err), "size", "{err}");
    let err = entry_check(&toc, &tar, &toc.entries[i]).unwrap_err();
    assert_eq!(field_of(&err), "size", "{err}");
}

#[test]
fn path_whose_chunks_point_at_another_files_bytes() {
    let (tar, _, _, mut toc) = sample();
    let host = idx(&toc, "etc/hostname");
    let pw = idx(&toc, "etc/passwd");
    // etc/hostname (4 bytes) served from etc/passwd's payload.
    let mut c = toc.entries[pw].chunks[0].clone();
    c.len = 4;
    toc.entries[host].chunks = vec![c];
    let err = stream_check(&toc, &tar).unwrap_err();
    assert_eq!(field_of(&err), "content mapping", "{err}");
    assert!(err.to_string().contains("etc/hostname"), "{err}");
    let err = entry_check(&toc, &tar, &toc.entries[host]).unwrap_err();
    assert_eq!(field_of(&err), "data start", "{err}");
    let end = toc.frames.last().map_or(0, |f| f.offset + f.clen);
    assert!(toc.validate(end).is_err());
}

#[test]
fn char_device_only_in_the_toc() {
    let (tar, _, _, mut toc) = sample();
    let last = toc.entries.last().unwrap().clone();
    // Placed where the tar has its end-of-archive block: valid placement, not a header.
    let end_of_last = toc.data_start(&last).unwrap() + last.size;
    let dev = Entry {
        path: "dev/evil".into(),
        header: end_of_last.div_ceil(512) * 512,
        kind: EntryKind::Char,
        mode: 0o666,
        devmajor: 1,
        devminor: 1,
        ..last.clone()
    };
    let dev = Entry {
        size: 0,
        chunks: vec![],
        link: None,
        ..dev
    };
    toc.entries.push(dev.clone());
    let end = toc.frames.last().map_or(0, |f| f.offset + f.clen);
    toc.validate(end).unwrap();
    let err = stream_check(&toc, &tar).unwrap_err();
    assert_eq!(field_of(&err), "presence", "{err}");
    assert!(err.to_string().contains("dev/evil"), "{err}");
    let err = entry_check(&toc, &tar, &dev).unwrap_err();
    assert_eq!(field_of(&err), "header", "{err}");
}

#[test]
fn file_only_in_the_toc() {
    let (tar, _, _, mut toc) = sample();
    // An extra empty file claiming etc/hostname's header: the path differs.
    let h = idx(&toc, "etc/hostname");
    let mut fake = toc.entries[h].clone();
    fake.path = "etc/sudoers".into();
    fake.size = 0;
    fake.chunks.clear();
    toc.entries.insert(h, fake.clone());
    let err = stream_check(&toc, &tar).unwrap_err();
    assert_eq!(field_of(&err), "presence", "{err}");
    assert!(err.to_string().contains("etc/sudoers"), "{err}");
    let err = entry_check(&toc, &tar, &fake).unwrap_err();
    assert_eq!(field_of(&err), "path", "{err}");
}

#[test]
fn toc_missing_a_tar_entry() {
    let (tar, _, _, mut toc) = sample();
    let i = idx(&toc, "etc/hostname");
    toc.entries.remove(i);
    let err = stream_check(&toc, &tar).unwrap_err();
    assert_eq!(field_of(&err), "presence", "{err}");
    assert!(err.to_string().contains("etc/hostname"), "{err}");
    // The per-entry check cannot see an absent entry: every remaining entry is honest.
    for e in &toc.entries {
        entry_check(&toc, &tar, e).unwrap();
    }
}

#[test]
fn hidden_entry_inside_an_unlisted_file_is_caught_by_the_stream_check() {
    // A file whose payload is a forged char-device header; the TOC omits the file and lists
    // the forged header as an entry. Its own header parses, so only the stream check sees it.
    let mut forged = TarBuilder::new();
    forged.raw_header(&Hdr {
        name: b"dev/mem".to_vec(),
        typeflag: b'3',
        mode: 0o666,
        devmajor: 1,
        devminor: 1,
        ..Default::default()
    });
    let payload = forged.out.clone();
    let mut t = TarBuilder::new();
    t.file("a", b"x");
    t.file("carrier", &payload);
    t.file("z", b"y");
    let tar = t.finish();
    let mut blob = Vec::new();
    write_layer(&tar[..], &mut blob, &small_frames()).unwrap();
    let mut toc = LayerReader::open(&blob[..], None).unwrap().into_toc();
    let c = idx(&toc, "carrier");
    let data = toc.data_start(&toc.entries[c]).unwrap();
    let mut fake = toc.entries[c].clone();
    fake.path = "dev/mem".into();
    fake.header = data;
    fake.kind = EntryKind::Char;
    fake.mode = 0o666;
    fake.mtime = 0;
    fake.devmajor = 1;
    fake.devminor = 1;
    fake.size = 0;
    fake.chunks.clear();
    toc.entries[c] = fake.clone();
    let end = toc.frames.last().map_or(0, |f| f.offset + f.clen);
    toc.validate(end).unwrap();
    entry_check(&toc, &tar, &fake).unwrap();
    let err = stream_check(&toc, &tar).unwrap_err();
    assert_eq!(field_of(&err), "presence", "{err}");
}

#[test]
fn header_offset_lie() {
    let (tar, _, _, mut toc) = sample();
    let i = idx(&toc, "etc/hostname");
    toc.entries[i].header += 512;
    assert!(stream_check(&toc, &tar).is_err());
    assert!(entry_check(&toc, &tar, &toc.entries[i]).is_err());
}

#[test]
fn stream_length_and_trailing_entries() {
    let (tar, _, _, toc) = sample();
    // A stream cut short: the parser reports the truncation or entries go missing.
    assert!(stream_check(&toc, &tar[..tar.len() - 10240]).is_err());
    // A stream with more bytes than the TOC's frames.
    let mut longer = tar.clone();
    longer.extend_from_slice(&[0u8; 512]);
    let err = stream_check(&toc, &longer).unwrap_err();
    assert_eq!(field_of(&err), "stream length", "{err}");
}

#[test]
fn validation_rules_name_the_entry() {
    let (_, _, s, toc) = sample();
    let check = |t: &Toc| t.validate(s.toc_offset).unwrap_err().to_string();
    let mut t = toc.clone();
    let i = idx(&t, "etc/hostname");
    t.entries[i].header += 1;
    let msg = check(&t);
    assert!(
        msg.contains("etc/hostname") && msg.contains("512-byte"),
        "{msg}"
    );
    let mut t = toc.clone();
    t.entries[i].header = t.entries[i - 1].header;
    let msg = check(&t);
    assert!(
        msg.contains("etc/hostname") && msg.contains("before the end"),
        "{msg}"
    );
    let mut t = toc.clone();
    t.entries[i].header = s.uncompressed_size;
    let msg = check(&t);
    assert!(msg.contains("past the stream end"), "{msg}");
    let mut t = toc.clone();
    let b = idx(&t, "bin/busybox");
    t.entries[b].chunks[1].frame_offset = 1;
    let msg = check(&t);
    assert!(msg.contains("bin/busybox"), "{msg}");
    let mut t = toc.clone();
    t.entries[b].header += 512 * 8; // data would start before the header
    let msg = check(&t);
    assert!(msg.contains("bin/busybox"), "{msg}");
    let mut t = toc.clone();
    t.entries[i].path = format!("etc/{}", "h".repeat(256));
    let msg = check(&t);
    assert!(msg.contains("255 bytes"), "{msg}");
}

#[test]
fn long_names_are_refused_by_the_writer() {
    let mut t = TarBuilder::new();
    t.file(&format!("d/{}", "n".repeat(256)), b"x");
    let err = write_layer(&t.finish()[..], Vec::new(), &small_frames()).unwrap_err();
    assert!(err.to_string().contains("NAME_MAX"), "{err}");
}

#[test]
fn limits_are_enforced_while_decoding() {
    let (_, _, _, toc) = sample();
    let z = toc.encode().unwrap();
    let n = toc.entries.len() as u64;
    let ok = TocLimits {
        max_entries: n,
        max_decoded_bytes: 1 << 20,
    };
    assert_eq!(Toc::decode_with_limits(&z, &ok).unwrap(), toc);
    let few = TocLimits {
        max_entries: n - 1,
        ..ok
    };
    match Toc::decode_with_limits(&z, &few) {
        Err(FormatError::TocLimit {
            what, value, limit, ..
        }) => {
            assert_eq!((what, value, limit), ("entry count", n, n - 1));
        }
        other => panic!("{other:?}"),
    }
    let small = TocLimits {
        max_decoded_bytes: 100,
        ..ok
    };
    let err = Toc::decode_with_limits(&z, &small).unwrap_err();
    assert!(
        matches!(err, FormatError::TocLimit { limit: 100, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("limit of 100"), "{err}");
}

#[test]
fn huge_entry_counts_stop_early() {
    // 3 million tiny entries, as in the memory-amplification report: refused at the limit
    // (the decoder never holds more than max_entries + 1 of them).
    let mut json = String::from("{\"version\":2,\"frames\":[],\"entries\":[");
    for i in 0..3_000_000u32 {
        if i > 0 {
            json.push(',');
        }
        json.push_str("{\"path\":\"a\",\"header\":0,\"kind\":\"fifo\",\"mode\":0,\"mtime\":0}");
    }
    json.push_str("]}");
    let z = zstd::bulk::compress(json.as_bytes(), 3).unwrap();
    let limits = TocLimits {
        max_entries: 1000,
        max_decoded_bytes: 1 << 30,
    };
    let err = Toc::decode_with_limits(&z, &limits).unwrap_err();
    assert!(
        matches!(
            err,
            FormatError::TocLimit {
                what: "entry count",
                value: 1001,
                limit: 1000
            }
        ),
        "{err}"
    );
}

#[test]
fn version_1_tocs_ask_for_a_reconversion() {
    let json =
        br#"{"version":1,"frames":[],"entries":[{"path":"","kind":"dir","mode":493,"mtime":0}]}"#;
    let z = zstd::bulk::compress(json, 3).unwrap();
    let err = Toc::decode(&z).unwrap_err();
    assert!(
        matches!(err, FormatError::UnsupportedVersion { version: 1, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("re-convert"), "{err}");
    // Version after the entries (hand-made): same error.
    let json =
        br#"{"frames":[],"entries":[{"path":"","kind":"dir","mode":493,"mtime":0}],"version":1}"#;
    let z = zstd::bulk::compress(json, 3).unwrap();
    assert!(matches!(
        Toc::decode(&z),
        Err(FormatError::UnsupportedVersion { version: 1, .. })
    ));
    // A version-1 footer too.
    let (_, mut blob, _, _) = sample();
    let n = blob.len();
    blob[n - 72 + 16] = 1;
    let err = LayerReader::open(&blob[..], None).err().unwrap();
    assert!(err.to_string().contains("re-convert"), "{err}");
}

#[test]
fn data_too_far_from_its_header_is_refused() {
    // A synthetic TOC (validation does not decompress): one 8 MiB frame, a file whose data
    // would start 4 MiB after its header, past any header span the parser accepts.
    let toc = Toc {
        version: weenv_format::FORMAT_VERSION,
        frames: vec![weenv_format::Frame {
            offset: 0,
            clen: 10,
            ulen: 8 << 20,
            digest: weenv_format::Digest::sha256(b"x"),
        }],
        entries: vec![Entry {
            path: "f".into(),
            header: 0,
            size: 1,
            chunks: vec![weenv_format::ChunkRef {
                file_offset: 0,
                frame: weenv_format::FrameIdx(0),
                frame_offset: 4 << 20,
                len: 1,
            }],
            ..sample().3.entries[idx(&sample().3, "etc/hostname")].clone()
        }],
    };
    let msg = toc.validate(10).unwrap_err().to_string();
    assert!(
        msg.contains("\"f\"") && msg.contains("after its header"),
        "{msg}"
    );
    let mut near = toc.clone();
    near.entries[0].chunks[0].frame_offset = 512;
    near.validate(10).unwrap();
    const { assert!(MAX_HEADER_SPAN < 4 << 20) };
}
