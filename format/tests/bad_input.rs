//! Every bad-input case gets its typed error (never a panic).
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use weenv_format::footer::Footer;
use weenv_format::{
    write_layer, Digest, FormatError, FrameIdx, LayerReader, LayerSummary, Toc, TocHint,
    WriterOptions, FOOTER_SIZE,
};

fn sample() -> (Vec<u8>, LayerSummary, Toc) {
    let mut t = TarBuilder::new();
    t.dir("d/");
    t.file("d/a", b"alpha");
    t.file("d/b", &vec![9u8; 3000]);
    t.link(b'1', "d/h", "d/a");
    let tar = t.finish();
    let mut blob = Vec::new();
    let opts = WriterOptions {
        frame_size: 1024,
        small_file_threshold: 512,
        chunk_size: 1024,
        level: 3,
        shared_level: None,
    };
    let s = write_layer(&tar[..], &mut blob, &opts).unwrap();
    let toc = LayerReader::open(&blob, None).unwrap().into_toc();
    (blob, s, toc)
}

fn open(blob: &[u8]) -> Result<(), FormatError> {
    LayerReader::open(blob, None).map(|_| ())
}

fn writer(tar: &[u8]) -> FormatError {
    write_layer(tar, Vec::new(), &WriterOptions::default()).unwrap_err()
}

#[test]
fn wrong_magic() {
    let (mut blob, _, _) = sample();
    let n = blob.len();
    blob[n - FOOTER_SIZE + 9] ^= 0x20; // inside "WEENVTOC"
    assert!(matches!(open(&blob), Err(FormatError::BadMagic { .. })));
    // A plain zstd blob (not weenv) also says BadMagic.
    let noise: Vec<u8> = (0..5000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let plain = zstd::bulk::compress(&noise, 3).unwrap();
    assert!(plain.len() > FOOTER_SIZE);
    assert!(matches!(open(&plain), Err(FormatError::BadMagic { .. })));
}

#[test]
fn truncated_blob() {
    let (blob, _, _) = sample();
    assert!(matches!(
        open(&blob[..10]),
        Err(FormatError::Truncated { .. })
    ));
    assert!(matches!(open(&[]), Err(FormatError::Truncated { .. })));
    // Front bytes missing: the footer no longer adds up to the blob size.
    assert!(matches!(
        open(&blob[7..]),
        Err(FormatError::TocLocation { .. })
    ));
    // Tail cut: the footer is gone.
    assert!(open(&blob[..blob.len() - 3]).is_err());
}

#[test]
fn truncated_tar() {
    let mut t = TarBuilder::new();
    t.file("a", &[1u8; 2000]);
    let tar = t.finish();
    for cut in [100, 512 + 1000, 512 + 2000] {
        assert!(
            matches!(writer(&tar[..cut]), FormatError::TruncatedTar { .. }),
            "cut at {cut}"
        );
    }
    // With frames in flight on a worker pool, the error still comes back (no hang).
    let mut t = TarBuilder::new();
    for i in 0..200 {
        t.file(&format!("f{i}"), &[i as u8; 3000]);
    }
    let tar = t.finish();
    let cut = tar.len() / 2 + 100;
    let err = weenv_format::write_layer_parallel(&tar[..cut], Vec::new(), &small_frames(), 3)
        .unwrap_err();
    assert!(matches!(err, FormatError::TruncatedTar { .. }), "{err}");
}

#[test]
fn toc_digest_mismatch() {
    let (mut blob, s, _) = sample();
    // Flip a byte inside the compressed TOC: the footer digest no longer matches.
    let at = s.toc_offset as usize + 8 + 3;
    blob[at] ^= 1;
    assert!(matches!(
        open(&blob),
        Err(FormatError::TocDigestMismatch {
            source_of_expected: "footer",
            ..
        })
    ));
    // An annotation digest that differs from the blob's TOC.
    let (blob, s, _) = sample();
    let mut hint = TocHint::from(&s);
    hint.digest = Digest::sha256(b"something else");
    assert!(matches!(
        LayerReader::open(&blob, Some(hint)),
        Err(FormatError::TocDigestMismatch {
            source_of_expected: "descriptor annotation",
            ..
        })
    ));
}

#[test]
fn frame_digest_mismatch() {
    let (blob, s, mut toc) = sample();
    let idx = toc.lookup("d/a").unwrap().chunks[0].frame.0 as usize;
    toc.frames[idx].digest = Digest::sha256(b"not the frame");
    let at = toc.frames[idx].offset;
    let bad = retail(&blob, s.toc_offset, &toc);
    let r = LayerReader::open(&bad, None).unwrap();
    let e = r.read_file("d/a", 0, 5).unwrap_err();
    assert!(
        matches!(e, FormatError::FrameDigestMismatch { frame, .. } if frame == at),
        "{e}"
    );
    // Corrupt compressed bytes of a frame (TOC intact): decompress error or digest mismatch.
    let (mut blob, _, toc) = sample();
    let f = &toc.frames[1];
    let mid = (f.offset + f.clen / 2) as usize;
    blob[mid] ^= 0xff;
    let r = LayerReader::open(&blob, None).unwrap();
    assert!(r.verify().is_err());
    let e = r.read_frame(FrameIdx(1)).unwrap_err();
    assert!(
        matches!(
            e,
            FormatError::FrameDigestMismatch { .. } | FormatError::FrameDecompress { .. }
        ),
        "{e}"
    );
}

#[test]
fn absurd_sizes_and_offsets() {
    let (blob, s, toc) = sample();
    let check = |toc: &Toc, pred: fn(&FormatError) -> bool| {
        let bad = retail(&blob, s.toc_offset, toc);
        let e = LayerReader::open(&bad, None).err().expect("must fail");
        assert!(pred(&e), "unexpected error: {e}");
    };
    let mut t = toc.clone();
    t.frames[0].ulen = 1 << 40;
    check(&t, |e| matches!(e, FormatError::AbsurdSize { .. }));
    let mut t = toc.clone();
    t.frames[1].offset += 1;
    check(&t, |e| {
        matches!(e, FormatError::FrameLayout { frame: 1, .. })
    });
    let mut t = toc.clone();
    t.frames.pop();
    check(&t, |e| matches!(e, FormatError::FrameLayout { .. }));
    let mut t = toc.clone();
    let f = t.entries.iter_mut().find(|e| e.path == "d/a").unwrap();
    f.chunks[0].frame_offset = u64::MAX - 2;
    check(&t, |e| matches!(e, FormatError::EntryLayout { .. }));
    let mut t = toc.clone();
    let f = t.entries.iter_mut().find(|e| e.path == "d/b").unwrap();
    f.size += 1;
    check(&t, |e| matches!(e, FormatError::EntryLayout { .. }));
    let mut t = toc.clone();
    let f = t.entries.iter_mut().find(|e| e.path == "d/b").unwrap();
    f.chunks[1].frame = FrameIdx(9999);
    check(&t, |e| matches!(e, FormatError::EntryLayout { .. }));

    // Footer pointing outside the blob / with an absurd TOC length.
    for (off, len) in [(u64::MAX - 10, 100), (0, u64::MAX), (5, 1 << 40)] {
        let mut b = blob.clone();
        let n = b.len();
        let mut f = Footer::parse(&b).unwrap();
        f.toc_offset = off;
        f.toc_len = len;
        b[n - FOOTER_SIZE..].copy_from_slice(&f.encode());
        let e = open(&b).unwrap_err();
        assert!(
            matches!(
                e,
                FormatError::AbsurdSize { .. } | FormatError::TocLocation { .. }
            ),
            "{e}"
        );
    }
    // Hint with an absurd length.
    let mut hint = TocHint::from(&s);
    hint.length = u64::MAX;
    assert!(matches!(
        LayerReader::open(&blob, Some(hint)),
        Err(FormatError::AbsurdSize { .. })
    ));
    // Absurd PAX size / extension.
    let mut t = TarBuilder::new();
    t.raw_header(&Hdr {
        name: b"x".to_vec(),
        typeflag: b'x',
        size: 1 << 30,
        ..Default::default()
    });
    assert!(matches!(
        writer(&t.out),
        FormatError::ExtensionTooLarge { .. }
    ));
}

#[test]
fn dotdot_paths() {
    let mut t = TarBuilder::new();
    t.file("a/../../etc/passwd", b"x");
    assert!(matches!(
        writer(&t.finish()),
        FormatError::DotDotPath { .. }
    ));
    let mut t = TarBuilder::new();
    t.file("ok", b"x");
    t.link(b'1', "h", "../outside");
    assert!(matches!(
        writer(&t.finish()),
        FormatError::DotDotPath { .. }
    ));
    // In a TOC.
    let (blob, s, mut toc) = sample();
    toc.entries[1].path = "d/../a".into();
    let e = open(&retail(&blob, s.toc_offset, &toc)).unwrap_err();
    assert!(matches!(e, FormatError::DotDotPath { .. }), "{e}");
}

#[test]
fn absolute_paths() {
    let mut t = TarBuilder::new();
    t.file("/etc/passwd", b"x");
    assert!(matches!(
        writer(&t.finish()),
        FormatError::AbsolutePath { .. }
    ));
    // PAX path overriding a harmless header name.
    let mut t = TarBuilder::new();
    t.pax(&[("path", b"/etc/shadow")], false);
    t.file("harmless", b"x");
    assert!(matches!(
        writer(&t.finish()),
        FormatError::AbsolutePath { .. }
    ));
    // GNU long name.
    let mut t = TarBuilder::new();
    t.gnu_long(b'L', b"/root/.ssh/authorized_keys");
    t.file("harmless", b"x");
    assert!(matches!(
        writer(&t.finish()),
        FormatError::AbsolutePath { .. }
    ));
    let (blob, s, mut toc) = sample();
    toc.entries[1].path = "/d/a".into();
    assert!(matches!(
        open(&retail(&blob, s.toc_offset, &toc)),
        Err(FormatError::AbsolutePath { .. })
    ));
}

#[test]
fn duplicate_paths() {
    let mut t = TarBuilder::new();
    t.file("a", b"1");
    t.file("./a", b"2");
    assert!(matches!(
        writer(&t.finish()),
        FormatError::DuplicatePath { .. }
    ));
    // A directory repeated with different metadata is a duplicate too.
    let mut t = TarBuilder::new();
    t.dir("d");
    t.raw_header(&Hdr {
        name: b"d/".to_vec(),
        typeflag: b'5',
        mode: 0o700,
        ..Default::default()
    });
    t.data(&[]);
    assert!(matches!(
        writer(&t.finish()),
        FormatError::DuplicatePath { .. }
    ));
    let (blob, s, mut toc) = sample();
    let dup = toc.entries[1].clone();
    toc.entries.push(dup);
    assert!(matches!(
        open(&retail(&blob, s.toc_offset, &toc)),
        Err(FormatError::DuplicatePath { .. })
    ));
}

#[test]
fn bad_tar_checksum() {
    let mut t = TarBuilder::new();
    t.file("a", b"1");
    let mut tar = t.finish();
    tar[0] ^= 1;
    assert!(matches!(
        writer(&tar),
        FormatError::TarChecksum { offset: 0, .. }
    ));
    // Random bytes are not a tar.
    let junk: Vec<u8> = (0..2048u32).map(|i| (i * 31 + 7) as u8).collect();
    assert!(matches!(
        writer(&junk),
        FormatError::TarChecksum { .. } | FormatError::TarNumeric { .. }
    ));
}

#[test]
fn other_tar_violations() {
    // GNU sparse, via typeflag and via PAX keys.
    let mut t = TarBuilder::new();
    t.raw_header(&Hdr {
        name: b"s".to_vec(),
        typeflag: b'S',
        ..Default::default()
    });
    assert!(matches!(writer(&t.finish()), FormatError::GnuSparse { .. }));
    let mut t = TarBuilder::new();
    t.pax(
        &[("GNU.sparse.major", b"1"), ("GNU.sparse.minor", b"0")],
        false,
    );
    t.file("s", b"x");
    assert!(matches!(writer(&t.finish()), FormatError::GnuSparse { .. }));
    // Payload on a symlink.
    let mut t = TarBuilder::new();
    t.raw_header(&Hdr {
        name: b"l".to_vec(),
        typeflag: b'2',
        size: 5,
        link: b"x".to_vec(),
        ..Default::default()
    });
    t.data(b"12345");
    assert!(matches!(
        writer(&t.finish()),
        FormatError::UnexpectedPayload { .. }
    ));
    // Hardlink to nothing / to a directory / to a later file.
    for (setup, target) in [(false, "missing"), (true, "d")] {
        let mut t = TarBuilder::new();
        if setup {
            t.dir("d");
        }
        t.link(b'1', "h", target);
        t.file("missing", b"late");
        assert!(matches!(
            writer(&t.finish()),
            FormatError::HardlinkTarget { .. }
        ));
    }
    // Entry below a symlink.
    let mut t = TarBuilder::new();
    t.link(b'2', "etc", "/etc");
    t.file("etc/passwd", b"x");
    assert!(matches!(
        writer(&t.finish()),
        FormatError::ParentNotDirectory { .. }
    ));
    // A file replacing a directory that already has entries.
    let mut t = TarBuilder::new();
    t.file("a/b/c", b"x");
    t.file("a", b"x");
    assert!(matches!(
        writer(&t.finish()),
        FormatError::ParentNotDirectory { .. }
    ));
    let mut t = TarBuilder::new();
    t.file("a/b/c", b"x");
    t.dir("a/b");
    t.dir("a");
    assert!(write_layer(&t.finish()[..], Vec::new(), &WriterOptions::default()).is_ok());
    // xattr value over 64 KiB; symlink target with NUL (via PAX linkpath).
    let mut t = TarBuilder::new();
    t.pax(&[("SCHILY.xattr.user.big", &vec![1u8; 70_000])], false);
    t.file("f", b"x");
    assert!(matches!(writer(&t.finish()), FormatError::PaxRecord { .. }));
    let mut t = TarBuilder::new();
    t.pax(&[("linkpath", b"a\0b")], false);
    t.link(b'2', "l", "x");
    assert!(matches!(
        writer(&t.finish()),
        FormatError::InvalidPath { .. }
    ));
    // Concatenated archives: a header right after a single zero block.
    let mut t = TarBuilder::new();
    t.file("a", b"x");
    t.out.extend_from_slice(&[0u8; 512]);
    t.file("b", b"y");
    assert!(matches!(
        writer(&t.finish()),
        FormatError::DataAfterEnd { .. }
    ));
    // Extension header followed by end of archive.
    let mut t = TarBuilder::new();
    t.pax(&[("path", b"x")], false);
    assert!(matches!(
        writer(&t.finish()),
        FormatError::DanglingExtension { .. }
    ));
    // Malformed PAX record.
    let mut t = TarBuilder::new();
    t.raw_header(&Hdr {
        name: b"p".to_vec(),
        typeflag: b'x',
        size: 9,
        ..Default::default()
    });
    t.data(b"99 path=x");
    t.file("f", b"x");
    assert!(matches!(writer(&t.finish()), FormatError::PaxRecord { .. }));
    // Unsupported typeflag.
    let mut t = TarBuilder::new();
    t.raw_header(&Hdr {
        name: b"v".to_vec(),
        typeflag: b'V',
        ..Default::default()
    });
    assert!(matches!(
        writer(&t.finish()),
        FormatError::TarUnsupportedType { typeflag: 'V', .. }
    ));
    // uid beyond u32 via PAX.
    let mut t = TarBuilder::new();
    t.pax(&[("uid", b"99999999999")], false);
    t.file("f", b"x");
    assert!(matches!(
        writer(&t.finish()),
        FormatError::FieldOutOfRange { field: "uid", .. }
    ));
    // Root entry that is not a directory.
    let mut t = TarBuilder::new();
    t.file("./", b"");
    assert!(matches!(
        writer(&t.finish()),
        FormatError::InvalidPath { .. }
    ));
}

#[test]
fn lookups_fail_typed() {
    let (blob, _, _) = sample();
    let r = LayerReader::open(&blob, None).unwrap();
    assert!(matches!(
        r.read_file("nope", 0, 1),
        Err(FormatError::NoSuchEntry { .. })
    ));
    assert!(matches!(
        r.read_file("d", 0, 1),
        Err(FormatError::NotAFile { .. })
    ));
    assert_eq!(r.read_file("d/a", 100, 5).unwrap(), b"");
}
