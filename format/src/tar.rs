//! A streaming tar parser of our own (ustar, GNU, PAX), built for byte-exact re-framing.
//!
//! [`walk`] reads a tar stream block by block and reports every input byte to a [`TarSink`]
//! exactly once, in order: header blocks, extension payloads, padding, the end-of-archive blocks
//! and any trailing bytes go to [`TarSink::meta`]; regular-file payloads go to
//! [`TarSink::payload`] after the [`TarSink::entry`] that owns them. Concatenating `meta` and
//! `payload` bytes in call order reproduces the input exactly.
//!
//! Supported: typeflags `0`/`\0`/`7` (file; `\0` with a trailing `/` is a V7 directory), `1`
//! hardlink, `2` symlink, `3`/`4` char/block device, `5` dir, `6` fifo; GNU `L` longname and
//! `K` longlink; PAX `x` (per entry) and `g` (global, applied to all later entries) with keys
//! `path`, `linkpath`, `size`, `uid`, `gid`, `mtime` (fractional) and `SCHILY.xattr.*` (other
//! keys are ignored); octal and base-256 numeric fields; both unsigned and signed header
//! checksums. Rejected with typed errors: bad checksums, GNU sparse (`S` or `GNU.sparse.*`),
//! other typeflags, payloads on non-file entries, extension headers larger than
//! [`MAX_EXTENSION_SIZE`], plus every path rule in [`crate::paths`].
//!
//! Precedence for names (as Go's archive/tar, which containerd uses): GNU `L`/`K` > PAX `x` >
//! PAX `g` > header field. Divergence from Go: Go ignores `g` headers; we apply them (POSIX).
//! The first all-zero block ends the archive; a non-zero block right after it is rejected (as Go
//! does); everything after the second block is trailer (kept, not parsed).

use crate::paths::{self, Admit, Namespace};
use crate::toc::{Entry, EntryKind};
use crate::FormatError;
use std::collections::BTreeMap;
use std::io::Read;

/// Tar block size.
pub const BLOCK: usize = 512;
/// Largest PAX / GNU long-name payload accepted.
pub const MAX_EXTENSION_SIZE: u64 = 1 << 20;
/// Payload is handed to the sink in pieces of at most this many bytes.
pub const PIECE: usize = 64 << 10;

/// The fields of one header block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// Name (with the ustar prefix joined in), cut at the first NUL.
    pub name: Vec<u8>,
    pub mode: u32,
    pub uid: u64,
    pub gid: u64,
    pub size: u64,
    pub mtime: i64,
    pub typeflag: u8,
    pub linkname: Vec<u8>,
    pub devmajor: u64,
    pub devminor: u64,
}

/// Receives the parsed stream; see the module docs for the byte contract.
pub trait TarSink {
    /// Bytes that are not file payload.
    fn meta(&mut self, bytes: &[u8]) -> Result<(), FormatError>;
    /// A new, admitted entry (path normalised, hardlink resolved), before its payload.
    fn entry(&mut self, entry: Entry) -> Result<(), FormatError>;
    /// Payload bytes of the last entry (regular files only), in order.
    fn payload(&mut self, bytes: &[u8]) -> Result<(), FormatError>;
}

/// True if all 512 bytes are zero.
pub fn is_zero_block(block: &[u8]) -> bool {
    block.iter().all(|b| *b == 0)
}

fn cstr(field: &[u8]) -> &[u8] {
    match field.iter().position(|b| *b == 0) {
        Some(n) => &field[..n],
        None => field,
    }
}

/// Parse a numeric field: octal (space/NUL padded) or GNU base-256 (high bit set).
fn numeric(field: &[u8], offset: u64, name: &'static str) -> Result<i64, FormatError> {
    let bad = || FormatError::TarNumeric {
        offset,
        field: name,
    };
    if let Some(&first) = field.first() {
        if first & 0x80 != 0 {
            let inv: u8 = if first & 0x40 != 0 { 0xff } else { 0 };
            let mut x: u64 = 0;
            for (i, &c) in field.iter().enumerate() {
                let mut c = c ^ inv;
                if i == 0 {
                    c &= 0x7f;
                }
                if x >> 56 != 0 {
                    return Err(bad());
                }
                x = (x << 8) | u64::from(c);
            }
            if x >> 63 != 0 {
                return Err(bad());
            }
            let v = x as i64;
            return Ok(if inv == 0xff { !v } else { v });
        }
    }
    let start = field.iter().position(|b| *b != b' ' && *b != 0);
    let Some(start) = start else { return Ok(0) };
    let end = field
        .iter()
        .rposition(|b| *b != b' ' && *b != 0)
        .unwrap_or(start)
        + 1;
    let digits = cstr(&field[start..end]);
    let mut v: i64 = 0;
    for &d in digits {
        if !(b'0'..=b'7').contains(&d) {
            return Err(bad());
        }
        v = v
            .checked_mul(8)
            .and_then(|v| v.checked_add(i64::from(d - b'0')))
            .ok_or_else(bad)?;
    }
    Ok(v)
}

fn unsigned(field: &[u8], offset: u64, name: &'static str) -> Result<u64, FormatError> {
    u64::try_from(numeric(field, offset, name)?).map_err(|_| FormatError::TarNumeric {
        offset,
        field: name,
    })
}

/// Parse and checksum-verify one header block found at stream `offset`.
pub fn parse_header(block: &[u8; BLOCK], offset: u64) -> Result<Header, FormatError> {
    let stored = unsigned(&block[148..156], offset, "chksum")?;
    let mut usum: u64 = 0;
    let mut ssum: i64 = 0;
    for (i, &b) in block.iter().enumerate() {
        let b = if (148..156).contains(&i) { b' ' } else { b };
        usum += u64::from(b);
        ssum += i64::from(b as i8);
    }
    if stored != usum && i64::try_from(stored).ok() != Some(ssum) {
        return Err(FormatError::TarChecksum {
            offset,
            stored,
            computed: usum,
        });
    }
    let magic = &block[257..265];
    let posix = magic == b"ustar\x0000"; // magic + version "00", as Go checks
    let gnu = magic == b"ustar  \0";
    let mut name = cstr(&block[0..100]).to_vec();
    if posix {
        let prefix = cstr(&block[345..500]);
        if !prefix.is_empty() {
            let mut full = prefix.to_vec();
            full.push(b'/');
            full.extend_from_slice(&name);
            name = full;
        }
    }
    let (devmajor, devminor) = if posix || gnu {
        (
            unsigned(&block[329..337], offset, "devmajor")?,
            unsigned(&block[337..345], offset, "devminor")?,
        )
    } else {
        (0, 0)
    };
    Ok(Header {
        name,
        mode: (unsigned(&block[100..108], offset, "mode")? & 0o7777) as u32,
        uid: unsigned(&block[108..116], offset, "uid")?,
        gid: unsigned(&block[116..124], offset, "gid")?,
        size: unsigned(&block[124..136], offset, "size")?,
        mtime: numeric(&block[136..148], offset, "mtime")?,
        typeflag: block[156],
        linkname: cstr(&block[157..257]).to_vec(),
        devmajor,
        devminor,
    })
}

/// PAX records that matter to us.
#[derive(Debug, Clone, Default)]
struct Pax {
    path: Option<Vec<u8>>,
    linkpath: Option<Vec<u8>>,
    size: Option<u64>,
    uid: Option<u64>,
    gid: Option<u64>,
    mtime: Option<(i64, u32)>,
    xattrs: BTreeMap<String, Vec<u8>>,
    sparse: bool,
}

fn parse_decimal(v: &[u8]) -> Option<u64> {
    if v.is_empty() || v.len() > 20 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}

/// PAX time: `[-]sec[.frac]` -> (sec, nsec), normalised so nsec is in 0..1e9.
fn parse_pax_time(v: &[u8]) -> Option<(i64, u32)> {
    let (neg, v) = match v.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, v),
    };
    let (int, frac) = match v.iter().position(|b| *b == b'.') {
        Some(p) => (&v[..p], &v[p + 1..]),
        None => (v, &[][..]),
    };
    let secs = i64::try_from(parse_decimal(int)?).ok()?;
    if !frac.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut nsec: u32 = 0;
    for i in 0..9 {
        nsec = nsec * 10 + frac.get(i).map_or(0, |d| u32::from(d - b'0'));
    }
    if !neg {
        Some((secs, nsec))
    } else if nsec == 0 {
        Some((-secs, 0))
    } else {
        Some((-secs - 1, 1_000_000_000 - nsec))
    }
}

impl Pax {
    /// Apply the records in `data` (`"<len> <key>=<value>\n"`*) on top of `self`.
    fn apply(&mut self, mut data: &[u8], offset: u64) -> Result<(), FormatError> {
        let bad = |reason: &str| FormatError::PaxRecord {
            offset,
            reason: reason.to_string(),
        };
        while !data.is_empty() {
            let sp = data
                .iter()
                .position(|b| *b == b' ')
                .ok_or_else(|| bad("record without a length"))?;
            let len = parse_decimal(&data[..sp]).ok_or_else(|| bad("bad record length"))?;
            let len = usize::try_from(len).map_err(|_| bad("bad record length"))?;
            if len <= sp + 1 || len > data.len() || data[len - 1] != b'\n' {
                return Err(bad("record length does not match its contents"));
            }
            let rec = &data[sp + 1..len - 1];
            data = &data[len..];
            let eq = rec
                .iter()
                .position(|b| *b == b'=')
                .ok_or_else(|| bad("record without '='"))?;
            let (key, value) = (&rec[..eq], &rec[eq + 1..]);
            let key = std::str::from_utf8(key).map_err(|_| bad("key is not UTF-8"))?;
            let set = !value.is_empty();
            match key {
                "path" => self.path = set.then(|| value.to_vec()),
                "linkpath" => self.linkpath = set.then(|| value.to_vec()),
                "size" => {
                    self.size = match set {
                        true => Some(parse_decimal(value).ok_or_else(|| bad("bad size"))?),
                        false => None,
                    }
                }
                "uid" | "gid" => {
                    let v = match set {
                        true => Some(parse_decimal(value).ok_or_else(|| bad("bad uid/gid"))?),
                        false => None,
                    };
                    if key == "uid" {
                        self.uid = v;
                    } else {
                        self.gid = v;
                    }
                }
                "mtime" => {
                    self.mtime = match set {
                        true => Some(parse_pax_time(value).ok_or_else(|| bad("bad mtime"))?),
                        false => None,
                    }
                }
                k if k.starts_with("GNU.sparse.") => self.sparse = true,
                k => {
                    if let Some(name) = k.strip_prefix("SCHILY.xattr.") {
                        paths::check_xattr(name, value).map_err(bad)?;
                        self.xattrs.insert(name.to_string(), value.to_vec());
                    }
                }
            }
        }
        Ok(())
    }

    fn merged(global: &Pax, local: Option<&Pax>) -> Pax {
        let Some(l) = local else {
            return global.clone();
        };
        let mut xattrs = global.xattrs.clone();
        xattrs.extend(l.xattrs.iter().map(|(k, v)| (k.clone(), v.clone())));
        Pax {
            path: l.path.clone().or_else(|| global.path.clone()),
            linkpath: l.linkpath.clone().or_else(|| global.linkpath.clone()),
            size: l.size.or(global.size),
            uid: l.uid.or(global.uid),
            gid: l.gid.or(global.gid),
            mtime: l.mtime.or(global.mtime),
            xattrs,
            sparse: l.sparse || global.sparse,
        }
    }
}

/// Extension state between headers.
#[derive(Default)]
struct Pending {
    global: Pax,
    local: Option<Pax>,
    long_name: Option<Vec<u8>>,
    long_link: Option<Vec<u8>>,
    /// Offset of the first extension header not yet consumed by an entry.
    since: Option<u64>,
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn u32_field(path: &str, field: &'static str, v: u64) -> Result<u32, FormatError> {
    u32::try_from(v).map_err(|_| FormatError::FieldOutOfRange {
        path: path.to_string(),
        field,
        value: v.to_string(),
    })
}

impl Pending {
    /// Build the entry for `h` and reset per-entry state. Returns the entry and its payload size.
    fn finish(&mut self, h: &Header, offset: u64) -> Result<(Entry, u64), FormatError> {
        let pax = Pax::merged(&self.global, self.local.as_ref());
        let raw_name = self
            .long_name
            .take()
            .or_else(|| pax.path.clone())
            .unwrap_or_else(|| h.name.clone());
        let raw_link = self
            .long_link
            .take()
            .or_else(|| pax.linkpath.clone())
            .unwrap_or_else(|| h.linkname.clone());
        self.local = None;
        self.since = None;
        let display = lossy(&raw_name);
        let kind = match h.typeflag {
            b'\0' if raw_name.ends_with(b"/") => EntryKind::Dir,
            b'0' | b'\0' | b'7' => EntryKind::File,
            b'1' => EntryKind::Hardlink,
            b'2' => EntryKind::Symlink,
            b'3' => EntryKind::Char,
            b'4' => EntryKind::Block,
            b'5' => EntryKind::Dir,
            b'6' => EntryKind::Fifo,
            b'S' => return Err(FormatError::GnuSparse { path: display }),
            t => {
                return Err(FormatError::TarUnsupportedType {
                    offset,
                    typeflag: char::from(t),
                })
            }
        };
        if pax.sparse {
            return Err(FormatError::GnuSparse { path: display });
        }
        let path = paths::normalise(&raw_name)?;
        let size = pax.size.unwrap_or(h.size);
        if kind != EntryKind::File && size != 0 {
            return Err(FormatError::UnexpectedPayload {
                path,
                typeflag: char::from(h.typeflag),
                size,
            });
        }
        let link = match kind {
            EntryKind::Symlink => {
                let target = String::from_utf8(raw_link).map_err(|e| FormatError::InvalidPath {
                    path: lossy(e.as_bytes()),
                    reason: "symlink target is not UTF-8",
                })?;
                if let Err(reason) = paths::check_symlink_target(&target) {
                    return Err(FormatError::InvalidPath { path, reason });
                }
                Some(target)
            }
            EntryKind::Hardlink => Some(paths::normalise(&raw_link)?),
            _ => None,
        };
        let (mtime, mtime_nsec) = pax.mtime.unwrap_or((h.mtime, 0));
        let is_dev = matches!(kind, EntryKind::Char | EntryKind::Block);
        let entry = Entry {
            uid: u32_field(&path, "uid", pax.uid.unwrap_or(h.uid))?,
            gid: u32_field(&path, "gid", pax.gid.unwrap_or(h.gid))?,
            devmajor: if is_dev {
                u32_field(&path, "devmajor", h.devmajor)?
            } else {
                0
            },
            devminor: if is_dev {
                u32_field(&path, "devminor", h.devminor)?
            } else {
                0
            },
            path,
            kind,
            mode: h.mode,
            mtime,
            mtime_nsec,
            size,
            link,
            xattrs: pax.xattrs,
            chunks: Vec::new(),
        };
        Ok((entry, size))
    }
}

/// Encode one PAX record `"<len> <key>=<value>\n"` (for writers and tests).
pub fn pax_record(key: &str, value: &[u8]) -> Vec<u8> {
    let body = key.len() + value.len() + 3; // ' ', '=', '\n'
    let mut len = body + 1;
    while len != body + len.to_string().len() {
        len = body + len.to_string().len();
    }
    let mut out = format!("{len} {key}=").into_bytes();
    out.extend_from_slice(value);
    out.push(b'\n');
    out
}

/// Read until `buf` is full or EOF; returns the number of bytes read.
fn read_full<R: Read>(r: &mut R, buf: &mut [u8]) -> Result<usize, FormatError> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(FormatError::io("reading the tar stream", e)),
        }
    }
    Ok(n)
}

fn read_exact_at<R: Read>(
    r: &mut R,
    buf: &mut [u8],
    offset: u64,
    what: &'static str,
) -> Result<(), FormatError> {
    let n = read_full(r, buf)?;
    if n < buf.len() {
        return Err(FormatError::TruncatedTar {
            offset: offset + n as u64,
            what,
        });
    }
    Ok(())
}

fn padding(size: u64) -> usize {
    ((BLOCK as u64 - size % BLOCK as u64) % BLOCK as u64) as usize
}

/// Parse the whole stream, reporting to `sink`. Returns the number of input bytes.
pub fn walk<R: Read, S: TarSink>(mut input: R, sink: &mut S) -> Result<u64, FormatError> {
    let mut offset: u64 = 0;
    let mut pending = Pending::default();
    let mut names = Namespace::new();
    let mut block = [0u8; BLOCK];
    let mut piece = vec![0u8; PIECE];
    loop {
        let n = read_full(&mut input, &mut block)?;
        if n == 0 {
            // EOF on a block boundary without end-of-archive blocks: accepted (Go does too).
            if let Some(at) = pending.since {
                return Err(FormatError::DanglingExtension { offset: at });
            }
            return Ok(offset);
        }
        if n < BLOCK {
            return Err(FormatError::TruncatedTar {
                offset: offset + n as u64,
                what: "a header block",
            });
        }
        let here = offset;
        offset += BLOCK as u64;
        sink.meta(&block)?;
        if is_zero_block(&block) {
            if let Some(at) = pending.since {
                return Err(FormatError::DanglingExtension { offset: at });
            }
            // End of archive. Like Go's archive/tar (containerd), a zero block followed by a
            // non-zero block is an error (e.g. concatenated archives), so both unpackers agree.
            let k = read_full(&mut input, &mut block)?;
            if k == BLOCK && !is_zero_block(&block) {
                return Err(FormatError::DataAfterEnd { offset });
            }
            offset += k as u64;
            sink.meta(&block[..k])?;
            // The rest (record padding, anything) is trailer, kept verbatim.
            loop {
                let k = read_full(&mut input, &mut piece)?;
                if k == 0 {
                    return Ok(offset);
                }
                offset += k as u64;
                sink.meta(&piece[..k])?;
            }
        }
        let h = parse_header(&block, here)?;
        match h.typeflag {
            b'x' | b'g' | b'L' | b'K' => {
                if h.size > MAX_EXTENSION_SIZE {
                    return Err(FormatError::ExtensionTooLarge {
                        offset: here,
                        size: h.size,
                        limit: MAX_EXTENSION_SIZE,
                    });
                }
                let padded = h.size as usize + padding(h.size);
                let mut data = vec![0u8; padded];
                read_exact_at(&mut input, &mut data, offset, "an extension header")?;
                offset += padded as u64;
                sink.meta(&data)?;
                let data = &data[..h.size as usize];
                match h.typeflag {
                    b'x' => pending
                        .local
                        .get_or_insert_with(Pax::default)
                        .apply(data, here)?,
                    b'g' => pending.global.apply(data, here)?,
                    b'L' => pending.long_name = Some(cstr(data).to_vec()),
                    _ => pending.long_link = Some(cstr(data).to_vec()),
                }
                if h.typeflag != b'g' {
                    pending.since.get_or_insert(here);
                }
            }
            _ => {
                let (mut entry, size) = pending.finish(&h, here)?;
                let (admit, resolved) = names.admit(&entry)?;
                if admit == Admit::New {
                    if resolved.is_some() {
                        entry.link = resolved;
                    }
                    sink.entry(entry)?;
                }
                let mut left = size;
                while left > 0 {
                    let k = left.min(PIECE as u64) as usize;
                    read_exact_at(&mut input, &mut piece[..k], offset, "a file payload")?;
                    offset += k as u64;
                    left -= k as u64;
                    sink.payload(&piece[..k])?;
                }
                let pad = padding(size);
                if pad > 0 {
                    read_exact_at(&mut input, &mut block[..pad], offset, "payload padding")?;
                    offset += pad as u64;
                    sink.meta(&block[..pad])?;
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn numeric_fields() {
        assert_eq!(numeric(b"0000644\0", 0, "m").unwrap(), 0o644);
        assert_eq!(numeric(b"  644 \0", 0, "m").unwrap(), 0o644);
        assert_eq!(numeric(b"\0\0\0\0", 0, "m").unwrap(), 0);
        assert!(numeric(b"0009\0", 0, "m").is_err());
        let mut b256 = [0u8; 12];
        b256[0] = 0x80;
        b256[11] = 0x01;
        b256[10] = 0x02;
        assert_eq!(numeric(&b256, 0, "size").unwrap(), 0x0201);
        let neg = [0xffu8; 12];
        assert_eq!(numeric(&neg, 0, "mtime").unwrap(), -1);
        let mut huge = [0xffu8; 12];
        huge[0] = 0x80;
        assert!(numeric(&huge, 0, "size").is_err());
    }

    #[test]
    fn pax_record_lengths() {
        assert_eq!(pax_record("path", b"ab"), b"11 path=ab\n");
        assert_eq!(pax_record("k", &[b'x'; 4]), b"9 k=xxxx\n");
        assert_eq!(pax_record("k", &[b'x'; 5]), b"11 k=xxxxx\n"); // length digits grow
    }

    #[test]
    fn pax_times_and_records() {
        assert_eq!(parse_pax_time(b"12.5"), Some((12, 500_000_000)));
        assert_eq!(parse_pax_time(b"12"), Some((12, 0)));
        assert_eq!(parse_pax_time(b"-1.25"), Some((-2, 750_000_000)));
        assert_eq!(parse_pax_time(b"1.1234567891"), Some((1, 123_456_789)));
        assert_eq!(parse_pax_time(b"x"), None);
        let mut p = Pax::default();
        let mut data = pax_record("path", b"ab");
        data.extend(pax_record("SCHILY.xattr.user.k", b"v"));
        p.apply(&data, 0).unwrap();
        assert_eq!(p.path.as_deref(), Some(&b"ab"[..]));
        assert_eq!(p.xattrs.get("user.k").map(Vec::as_slice), Some(&b"v"[..]));
        assert!(Pax::default().apply(b"99 path=ab\n", 0).is_err());
        assert!(Pax::default().apply(b"5 ab\n", 0).is_err());
        assert!(Pax::default().apply(b"x path=ab\n", 0).is_err());
        let mut s = Pax::default();
        s.apply(&pax_record("GNU.sparse.major", b"1"), 0).unwrap();
        assert!(s.sparse);
    }

    fn block(name: &[u8], prefix: &[u8], typeflag: u8, posix: bool) -> [u8; BLOCK] {
        let mut b = [0u8; BLOCK];
        b[..name.len()].copy_from_slice(name);
        b[100..108].copy_from_slice(b"0000644\0");
        b[124..136].copy_from_slice(b"00000000000\0");
        b[156] = typeflag;
        if posix {
            b[257..265].copy_from_slice(b"ustar\x0000");
            b[345..345 + prefix.len()].copy_from_slice(prefix);
        }
        b[148..156].fill(b' ');
        let sum: u32 = b.iter().map(|x| u32::from(*x)).sum();
        b[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        b
    }

    #[test]
    fn headers() {
        let h = parse_header(&block(b"name", b"pre/fix", b'0', true), 0).unwrap();
        assert_eq!(h.name, b"pre/fix/name");
        assert_eq!(h.mode, 0o644);
        // V7 (no magic): the prefix area is not a prefix.
        let h = parse_header(&block(b"name", b"", b'0', false), 0).unwrap();
        assert_eq!(h.name, b"name");
        // Signed checksum (bytes >= 0x80 counted negative) is accepted.
        let mut b = block("caf\u{e9}".as_bytes(), b"", b'0', true);
        b[148..156].fill(b' ');
        let ssum: i64 = b.iter().map(|x| i64::from(*x as i8)).sum();
        b[148..156].copy_from_slice(format!("{ssum:06o}\0 ").as_bytes());
        assert!(parse_header(&b, 0).is_ok());
        b[0] ^= 1;
        assert!(matches!(
            parse_header(&b, 512),
            Err(FormatError::TarChecksum { offset: 512, .. })
        ));
    }
}
