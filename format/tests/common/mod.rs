//! Test helpers: a tar builder of our own (ustar / GNU / PAX, so tests control every header
//! byte), a counting `RangeRead`, and a tool to re-tail a blob with a modified TOC.
#![allow(dead_code, clippy::unwrap_used)]

use std::cell::Cell;
use weenv_format::footer::{skippable_header, Footer, SKIPPABLE_HEADER, TOC_SKIPPABLE_MAGIC};
use weenv_format::tar::pax_record;
use weenv_format::{Digest, RangeRead, Toc, FOOTER_SIZE, FORMAT_VERSION};

/// How a long name is encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Names {
    Ustar,
    Gnu,
    Pax,
}

#[derive(Clone, Debug, Default)]
pub struct Hdr {
    pub name: Vec<u8>,
    pub typeflag: u8,
    pub size: u64,
    pub mode: u32,
    pub uid: u64,
    pub gid: u64,
    pub mtime: i64,
    pub link: Vec<u8>,
    pub devmajor: u32,
    pub devminor: u32,
    pub gnu_magic: bool,
}

fn put_octal(field: &mut [u8], v: u64) {
    let w = field.len() - 1;
    let s = format!("{v:0w$o}");
    if s.len() <= w {
        field[..w].copy_from_slice(s.as_bytes());
        field[w] = 0;
    } else {
        // base-256
        field.fill(0);
        field[0] = 0x80;
        let bytes = v.to_be_bytes();
        let n = field.len();
        field[n - 8..].copy_from_slice(&bytes);
        field[0] |= 0x80;
    }
}

/// Encode one header block (with checksum).
pub fn header_block(h: &Hdr) -> [u8; 512] {
    let mut b = [0u8; 512];
    let name = &h.name;
    assert!(name.len() <= 100, "use long-name helpers");
    b[..name.len()].copy_from_slice(name);
    put_octal(&mut b[100..108], u64::from(h.mode));
    put_octal(&mut b[108..116], h.uid);
    put_octal(&mut b[116..124], h.gid);
    put_octal(&mut b[124..136], h.size);
    if h.mtime >= 0 {
        put_octal(&mut b[136..148], h.mtime as u64);
    } else {
        let v = (h.mtime as i128 as u128).to_be_bytes(); // two's complement
        b[136..148].copy_from_slice(&v[4..16]);
        b[136] |= 0x80;
    }
    b[156] = h.typeflag;
    let l = h.link.len().min(100);
    b[157..157 + l].copy_from_slice(&h.link[..l]);
    if h.gnu_magic {
        b[257..265].copy_from_slice(b"ustar  \0");
    } else {
        b[257..263].copy_from_slice(b"ustar\0");
        b[263..265].copy_from_slice(b"00");
    }
    put_octal(&mut b[329..337], u64::from(h.devmajor));
    put_octal(&mut b[337..345], u64::from(h.devminor));
    b[148..156].fill(b' ');
    let sum: u64 = b.iter().map(|x| u64::from(*x)).sum();
    let s = format!("{sum:06o}\0 ");
    b[148..156].copy_from_slice(s.as_bytes());
    b
}

#[derive(Default)]
pub struct TarBuilder {
    pub out: Vec<u8>,
}

impl TarBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    fn pad(&mut self) {
        while !self.out.len().is_multiple_of(512) {
            self.out.push(0);
        }
    }

    pub fn raw_header(&mut self, h: &Hdr) {
        self.out.extend_from_slice(&header_block(h));
    }

    pub fn data(&mut self, data: &[u8]) {
        self.out.extend_from_slice(data);
        self.pad();
    }

    /// A PAX extended header (`x`, or `g` when `global`).
    pub fn pax(&mut self, records: &[(&str, &[u8])], global: bool) {
        let mut body = Vec::new();
        for (k, v) in records {
            body.extend(pax_record(k, v));
        }
        self.raw_header(&Hdr {
            name: if global {
                b"pax_global_header".to_vec()
            } else {
                b"PaxHeaders/x".to_vec()
            },
            typeflag: if global { b'g' } else { b'x' },
            size: body.len() as u64,
            mode: 0o644,
            ..Default::default()
        });
        self.data(&body);
    }

    /// A GNU `L` (name) or `K` (link) header.
    pub fn gnu_long(&mut self, typeflag: u8, value: &[u8]) {
        let mut body = value.to_vec();
        body.push(0);
        self.raw_header(&Hdr {
            name: b"././@LongLink".to_vec(),
            typeflag,
            size: body.len() as u64,
            gnu_magic: true,
            ..Default::default()
        });
        self.data(&body);
    }

    /// An entry with any name/link length, encoded per `names`, plus optional xattrs (PAX).
    pub fn entry(&mut self, mut h: Hdr, data: &[u8], names: Names, xattrs: &[(String, Vec<u8>)]) {
        let long = h.name.len() > 100 || h.link.len() > 100;
        let mut recs: Vec<(String, Vec<u8>)> = xattrs
            .iter()
            .map(|(k, v)| (format!("SCHILY.xattr.{k}"), v.clone()))
            .collect();
        if long {
            match names {
                Names::Gnu => {
                    if h.name.len() > 100 {
                        self.gnu_long(b'L', &h.name.clone());
                        h.name.truncate(100);
                    }
                    if h.link.len() > 100 {
                        self.gnu_long(b'K', &h.link.clone());
                        h.link.truncate(100);
                    }
                    h.gnu_magic = true;
                }
                Names::Pax | Names::Ustar => {
                    if h.name.len() > 100 {
                        recs.push(("path".into(), h.name.clone()));
                        h.name.truncate(100);
                    }
                    if h.link.len() > 100 {
                        recs.push(("linkpath".into(), h.link.clone()));
                        h.link.truncate(100);
                    }
                }
            }
        }
        if !recs.is_empty() {
            let r: Vec<(&str, &[u8])> = recs
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_slice()))
                .collect();
            self.pax(&r, false);
        }
        self.raw_header(&h);
        self.data(data);
    }

    pub fn file(&mut self, name: &str, data: &[u8]) {
        self.entry(
            Hdr {
                name: name.as_bytes().to_vec(),
                typeflag: b'0',
                size: data.len() as u64,
                mode: 0o644,
                mtime: 1_700_000_000,
                ..Default::default()
            },
            data,
            Names::Pax,
            &[],
        );
    }

    pub fn dir(&mut self, name: &str) {
        self.entry(
            Hdr {
                name: name.as_bytes().to_vec(),
                typeflag: b'5',
                mode: 0o755,
                mtime: 1_700_000_000,
                ..Default::default()
            },
            &[],
            Names::Pax,
            &[],
        );
    }

    pub fn link(&mut self, typeflag: u8, name: &str, target: &str) {
        self.entry(
            Hdr {
                name: name.as_bytes().to_vec(),
                typeflag,
                mode: 0o777,
                link: target.as_bytes().to_vec(),
                mtime: 1_700_000_000,
                ..Default::default()
            },
            &[],
            Names::Pax,
            &[],
        );
    }

    /// End-of-archive (two zero blocks) padded to a 10 KiB record like GNU tar.
    pub fn finish(mut self) -> Vec<u8> {
        self.out.extend_from_slice(&[0u8; 1024]);
        while !self.out.len().is_multiple_of(10240) {
            self.out.push(0);
        }
        self.out
    }
}

/// A `RangeRead` over memory that counts calls.
pub struct Counting {
    pub data: Vec<u8>,
    pub reads: Cell<u32>,
    pub sizes: Cell<u32>,
}

impl Counting {
    pub fn new(data: Vec<u8>) -> Self {
        Counting {
            data,
            reads: Cell::new(0),
            sizes: Cell::new(0),
        }
    }
}

impl RangeRead for Counting {
    fn size(&self) -> std::io::Result<u64> {
        self.sizes.set(self.sizes.get() + 1);
        self.data.size()
    }
    fn read_at(&self, offset: u64, len: u64) -> std::io::Result<Vec<u8>> {
        self.reads.set(self.reads.get() + 1);
        self.data.read_at(offset, len)
    }
}

/// Replace the TOC + footer of `blob` (whose TOC starts at `toc_offset`) with `toc`, correctly
/// digested, so tests reach the semantic validator with hostile contents.
pub fn retail(blob: &[u8], toc_offset: u64, toc: &Toc) -> Vec<u8> {
    let mut out = blob[..toc_offset as usize].to_vec();
    let z = toc.encode().unwrap();
    out.extend_from_slice(&skippable_header(TOC_SKIPPABLE_MAGIC, z.len() as u32));
    out.extend_from_slice(&z);
    let footer = Footer {
        version: FORMAT_VERSION,
        toc_offset,
        toc_len: (SKIPPABLE_HEADER + z.len()) as u64,
        toc_digest: Digest::sha256(&z),
    };
    out.extend_from_slice(&footer.encode());
    assert_eq!(
        out.len() as u64,
        toc_offset + footer.toc_len + FOOTER_SIZE as u64
    );
    out
}

/// Decompress a blob like `zstd -d` (concatenated frames, skippable frames skipped).
pub fn zstd_decompress(blob: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut dec = zstd::stream::read::Decoder::new(blob).unwrap();
    std::io::copy(&mut dec, &mut out).unwrap();
    out
}

/// Writer options with tiny frames (1 KiB), so small test archives span many frames.
#[allow(dead_code)] // not every test binary that includes `common` uses it
pub fn small_frames() -> weenv_format::WriterOptions {
    weenv_format::WriterOptions {
        frame_size: 1024,
        small_file_threshold: 512,
        chunk_size: 1024,
        level: 1,
        shared_level: None,
    }
}
