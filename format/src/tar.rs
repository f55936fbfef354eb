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
//! `K` longlink; PAX `x` (per entry) with keys `path`, `linkpath`, `size`, `uid`, `gid`, `mtime`
//! (fractional) and `SCHILY.xattr.*` (other keys are ignored); octal and base-256 numeric
//! fields; both unsigned and signed header checksums. PAX `g` (global) headers are skipped, as
//! containerd skips them, so the TOC shows what a stock unpack shows. Rejected with typed
//! errors: bad checksums, GNU sparse (`S` or `GNU.sparse.*`), other typeflags, payloads on
//! non-file entries, extension headers larger than [`MAX_EXTENSION_SIZE`], a second `x`, `L` or
//! `K` header for the same entry (Go keeps the last, the tar crate refuses: ambiguous), a `g`
//! header between an entry's extension headers and the entry, plus every path rule in
//! [`crate::paths`]. So an entry's header blocks span at most [`crate::tarcheck::MAX_HEADER_SPAN`].
//!
//! Precedence for names (as Go's archive/tar, which containerd uses): GNU `L`/`K` > PAX `x` >
//! header field. The first all-zero block ends the archive; a non-zero block right after it is
//! rejected (as Go does); everything after the second block is trailer (kept, not parsed).
//!
//! [`TarParser`] is push style (fed pieces of any size); [`walk`] drives it from a reader.

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
    /// A new, admitted entry (path and hardlink target normalised), before its payload.
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
}

/// Extension state between headers (PAX `x`, GNU `L`/`K`: at most one of each per entry).
#[derive(Default)]
struct Pending {
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
        let pax = self.local.take().unwrap_or_default();
        let header = self.since.unwrap_or(offset);
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
        self.since = None;
        let display = lossy(&raw_name);
        let kind = match (entry_kind(h.typeflag, &raw_name), h.typeflag) {
            (Some(kind), _) => kind,
            (None, b'S') => return Err(FormatError::GnuSparse { path: display }),
            (None, t) => {
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
            header,
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

/// The entry type of a header with `typeflag` naming `raw_name` (after long names), or `None`
/// for typeflags we do not accept (extension headers are handled before this).
pub fn entry_kind(typeflag: u8, raw_name: &[u8]) -> Option<EntryKind> {
    Some(match typeflag {
        b'\0' if raw_name.ends_with(b"/") => EntryKind::Dir,
        b'0' | b'\0' | b'7' => EntryKind::File,
        b'1' => EntryKind::Hardlink,
        b'2' => EntryKind::Symlink,
        b'3' => EntryKind::Char,
        b'4' => EntryKind::Block,
        b'5' => EntryKind::Dir,
        b'6' => EntryKind::Fifo,
        _ => return None,
    })
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

fn padding(size: u64) -> usize {
    ((BLOCK as u64 - size % BLOCK as u64) % BLOCK as u64) as usize
}

/// Where [`TarParser`] is in the stream.
#[derive(Debug)]
enum State {
    /// Collecting a header block in `buf`.
    Header,
    /// Collecting an extension payload (`padded` bytes, `size` of them data) in `buf`.
    Extension {
        here: u64,
        typeflag: u8,
        size: usize,
        padded: usize,
    },
    /// File payload still to pass through, then `pad` bytes of padding.
    Payload { left: u64, pad: usize },
    /// Padding bytes still to pass through.
    Padding { left: usize },
    /// After the first zero block: collecting the second one (must be zero too if complete).
    EndSecond,
    /// After the end of the archive: everything is trailer, kept verbatim.
    Trailer,
    /// An error was returned; the parser refuses further input.
    Failed,
}

/// The tar parser, push style: feed it the stream in pieces of any size with
/// [`TarParser::push`], then call [`TarParser::finish`]. [`walk`] drives it from a reader; the
/// TOC checks in [`crate::tarcheck`] drive it from frames. Every byte is reported to the sink
/// exactly once, in order (see the module docs).
pub struct TarParser {
    offset: u64,
    pending: Pending,
    /// `None`: isolated mode (one entry parsed on its own: no namespace rules, hardlinks keep
    /// their literal, normalised target).
    names: Option<Namespace>,
    state: State,
    buf: Vec<u8>,
}

impl Default for TarParser {
    fn default() -> Self {
        Self::new()
    }
}

impl TarParser {
    /// A parser for a whole stream starting at offset 0, with the namespace rules.
    pub fn new() -> Self {
        TarParser {
            offset: 0,
            pending: Pending::default(),
            names: Some(Namespace::new()),
            state: State::Header,
            buf: Vec::with_capacity(BLOCK),
        }
    }

    /// A parser for bytes that start at stream offset `offset` on a header boundary, without
    /// the namespace rules (the entries before it are not seen): used to parse one entry's
    /// header blocks on their own.
    pub fn isolated_at(offset: u64) -> Self {
        TarParser {
            offset,
            names: None,
            ..Self::new()
        }
    }

    /// Stream offset of the next byte to be pushed.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// True once the end-of-archive zero block was seen.
    pub fn at_end(&self) -> bool {
        matches!(self.state, State::EndSecond | State::Trailer)
    }

    /// Feed the next bytes of the stream.
    pub fn push<S: TarSink>(&mut self, mut data: &[u8], sink: &mut S) -> Result<(), FormatError> {
        while !data.is_empty() {
            let (used, _) = self.advance(data, sink)?;
            data = &data[used..];
        }
        Ok(())
    }

    /// Feed bytes but stop right after the next entry was reported (before its payload).
    /// Returns the bytes consumed and whether an entry was reported.
    pub fn push_until_entry<S: TarSink>(
        &mut self,
        data: &[u8],
        sink: &mut S,
    ) -> Result<(usize, bool), FormatError> {
        self.advance(data, sink)
    }

    fn advance<S: TarSink>(
        &mut self,
        data: &[u8],
        sink: &mut S,
    ) -> Result<(usize, bool), FormatError> {
        if matches!(self.state, State::Failed) {
            return Err(FormatError::InvalidOption {
                field: "tar parser",
                reason: "used again after it returned an error".into(),
            });
        }
        let r = self.advance_inner(data, sink);
        if r.is_err() {
            self.state = State::Failed;
        }
        r
    }

    fn advance_inner<S: TarSink>(
        &mut self,
        data: &[u8],
        sink: &mut S,
    ) -> Result<(usize, bool), FormatError> {
        let mut used = 0;
        while used < data.len() {
            let rest = &data[used..];
            match self.state {
                State::Header => {
                    let take = (BLOCK - self.buf.len()).min(rest.len());
                    self.buf.extend_from_slice(&rest[..take]);
                    used += take;
                    if self.buf.len() == BLOCK && self.header_block(sink)? {
                        return Ok((used, true));
                    }
                }
                State::Extension {
                    here,
                    typeflag,
                    size,
                    padded,
                } => {
                    let take = (padded - self.buf.len()).min(rest.len());
                    self.buf.extend_from_slice(&rest[..take]);
                    used += take;
                    if self.buf.len() == padded {
                        self.extension(here, typeflag, size, sink)?;
                    }
                }
                State::Payload { left, pad } => {
                    let k = left.min(rest.len() as u64) as usize;
                    sink.payload(&rest[..k])?;
                    used += k;
                    self.offset += k as u64;
                    self.state = Self::after_payload(left - k as u64, pad);
                }
                State::Padding { left } => {
                    let k = left.min(rest.len());
                    sink.meta(&rest[..k])?;
                    used += k;
                    self.offset += k as u64;
                    self.state = Self::after_payload(0, left - k);
                }
                State::EndSecond => {
                    let take = (BLOCK - self.buf.len()).min(rest.len());
                    self.buf.extend_from_slice(&rest[..take]);
                    used += take;
                    if self.buf.len() == BLOCK {
                        // Like Go's archive/tar (containerd), a zero block followed by a
                        // non-zero block is an error (e.g. concatenated archives).
                        if !is_zero_block(&self.buf) {
                            return Err(FormatError::DataAfterEnd {
                                offset: self.offset,
                            });
                        }
                        sink.meta(&self.buf)?;
                        self.offset += BLOCK as u64;
                        self.buf.clear();
                        self.state = State::Trailer;
                    }
                }
                State::Trailer => {
                    sink.meta(rest)?;
                    used += rest.len();
                    self.offset += rest.len() as u64;
                }
                State::Failed => unreachable_failed()?,
            }
        }
        Ok((used, false))
    }

    fn after_payload(left: u64, pad: usize) -> State {
        match (left, pad) {
            (0, 0) => State::Header,
            (0, pad) => State::Padding { left: pad },
            (left, pad) => State::Payload { left, pad },
        }
    }

    /// A complete header block is in `buf`. Returns true if it reported an entry.
    fn header_block<S: TarSink>(&mut self, sink: &mut S) -> Result<bool, FormatError> {
        let mut block = [0u8; BLOCK];
        block.copy_from_slice(&self.buf);
        self.buf.clear();
        let here = self.offset;
        self.offset += BLOCK as u64;
        sink.meta(&block)?;
        if is_zero_block(&block) {
            if let Some(at) = self.pending.since {
                return Err(FormatError::DanglingExtension { offset: at });
            }
            self.state = State::EndSecond;
            return Ok(false);
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
                let size = h.size as usize;
                let padded = size + padding(h.size);
                self.state = State::Extension {
                    here,
                    typeflag: h.typeflag,
                    size,
                    padded,
                };
                if padded == 0 {
                    self.extension(here, h.typeflag, 0, sink)?;
                }
                Ok(false)
            }
            _ => {
                let (mut entry, size) = self.pending.finish(&h, here)?;
                let report = match &mut self.names {
                    Some(names) => {
                        let (admit, resolved) = names.admit(&entry)?;
                        if resolved.is_some() {
                            entry.link = resolved;
                        }
                        admit == Admit::New
                    }
                    None => true,
                };
                if report {
                    sink.entry(entry)?;
                }
                self.state = Self::after_payload(size, padding(size));
                Ok(report)
            }
        }
    }

    /// A complete extension payload (padded) is in `buf`.
    fn extension<S: TarSink>(
        &mut self,
        here: u64,
        typeflag: u8,
        size: usize,
        sink: &mut S,
    ) -> Result<(), FormatError> {
        let data = std::mem::take(&mut self.buf);
        self.offset += data.len() as u64;
        sink.meta(&data)?;
        let body = &data[..size];
        let twice = |what: &str| {
            FormatError::PaxRecord {
            offset: here,
            reason: format!("a second {what} for the same entry (Go's archive/tar and the tar crate disagree on which one wins)"),
        }
        };
        let p = &mut self.pending;
        match typeflag {
            b'x' => {
                if p.local.is_some() {
                    return Err(twice("PAX extended header"));
                }
                let mut pax = Pax::default();
                pax.apply(body, here)?;
                p.local = Some(pax);
            }
            b'g' => {
                // Global headers are ignored, as containerd does (Go's archive/tar returns them
                // as entries and containerd skips them), so both unpackers see the same files.
                if let Some(at) = p.since {
                    return Err(FormatError::PaxRecord {
                        offset: here,
                        reason: format!("a global header interrupts the extension headers started at offset {at}"),
                    });
                }
            }
            b'L' => {
                if p.long_name.is_some() {
                    return Err(twice("GNU long name"));
                }
                p.long_name = Some(cstr(body).to_vec());
            }
            _ => {
                if p.long_link.is_some() {
                    return Err(twice("GNU long link name"));
                }
                p.long_link = Some(cstr(body).to_vec());
            }
        }
        if typeflag != b'g' {
            p.since.get_or_insert(here);
        }
        self.buf = data;
        self.buf.clear();
        self.state = State::Header;
        Ok(())
    }

    /// The input ended: check it ended at a sensible place. Returns the stream length.
    pub fn finish<S: TarSink>(&mut self, sink: &mut S) -> Result<u64, FormatError> {
        let truncated =
            |offset: u64, what: &'static str| FormatError::TruncatedTar { offset, what };
        match self.state {
            State::Header if self.buf.is_empty() => {
                // EOF on a block boundary without end-of-archive blocks: accepted (Go does too).
                if let Some(at) = self.pending.since {
                    return Err(FormatError::DanglingExtension { offset: at });
                }
                Ok(self.offset)
            }
            State::Header => Err(truncated(
                self.offset + self.buf.len() as u64,
                "a header block",
            )),
            State::Extension { .. } => Err(truncated(
                self.offset + self.buf.len() as u64,
                "an extension header",
            )),
            State::Payload { .. } => Err(truncated(self.offset, "a file payload")),
            State::Padding { .. } => Err(truncated(self.offset, "payload padding")),
            State::EndSecond => {
                // A short second end block is trailer.
                let rest = std::mem::take(&mut self.buf);
                sink.meta(&rest)?;
                self.offset += rest.len() as u64;
                self.state = State::Trailer;
                Ok(self.offset)
            }
            State::Trailer => Ok(self.offset),
            State::Failed => unreachable_failed().map(|()| self.offset),
        }
    }
}

fn unreachable_failed() -> Result<(), FormatError> {
    Err(FormatError::InvalidOption {
        field: "tar parser",
        reason: "used again after it returned an error".into(),
    })
}

/// Parse the whole stream, reporting to `sink`. Returns the number of input bytes.
pub fn walk<R: Read, S: TarSink>(mut input: R, sink: &mut S) -> Result<u64, FormatError> {
    let mut parser = TarParser::new();
    let mut piece = vec![0u8; PIECE];
    loop {
        let n = match input.read(&mut piece) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(FormatError::io("reading the tar stream", e)),
        };
        if n == 0 {
            return parser.finish(sink);
        }
        parser.push(&piece[..n], sink)?;
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
