//! `RangeRead`: random access to a blob (file, memory, HTTP). Synchronous on purpose: the format
//! crate has no runtime; async callers wrap their client. Implemented for `[u8]`, `Vec<u8>`,
//! `File`, and through `&T`, `Arc<T>`, `Box<T>`.

use std::io;

/// Random read access to an immutable blob.
pub trait RangeRead {
    /// Total size of the blob in bytes.
    fn size(&self) -> io::Result<u64>;
    /// Read exactly `len` bytes at `offset` (an error if the blob is shorter).
    fn read_at(&self, offset: u64, len: u64) -> io::Result<Vec<u8>>;
}

impl RangeRead for [u8] {
    fn size(&self) -> io::Result<u64> {
        Ok(self.len() as u64)
    }
    fn read_at(&self, offset: u64, len: u64) -> io::Result<Vec<u8>> {
        let end = offset
            .checked_add(len)
            .filter(|e| *e <= self.len() as u64)
            .ok_or_else(|| {
                io::Error::new(io::ErrorKind::UnexpectedEof, "range past end of blob")
            })?;
        Ok(self[offset as usize..end as usize].to_vec())
    }
}

impl RangeRead for Vec<u8> {
    fn size(&self) -> io::Result<u64> {
        self.as_slice().size()
    }
    fn read_at(&self, offset: u64, len: u64) -> io::Result<Vec<u8>> {
        self.as_slice().read_at(offset, len)
    }
}

impl RangeRead for std::fs::File {
    fn size(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }
    fn read_at(&self, offset: u64, len: u64) -> io::Result<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        let mut buf = vec![0u8; usize::try_from(len).map_err(io::Error::other)?];
        FileExt::read_exact_at(self, &mut buf, offset)?;
        Ok(buf)
    }
}

impl<T: RangeRead + ?Sized> RangeRead for &T {
    fn size(&self) -> io::Result<u64> {
        (**self).size()
    }
    fn read_at(&self, offset: u64, len: u64) -> io::Result<Vec<u8>> {
        (**self).read_at(offset, len)
    }
}

impl<T: RangeRead + ?Sized> RangeRead for std::sync::Arc<T> {
    fn size(&self) -> io::Result<u64> {
        (**self).size()
    }
    fn read_at(&self, offset: u64, len: u64) -> io::Result<Vec<u8>> {
        (**self).read_at(offset, len)
    }
}

impl<T: RangeRead + ?Sized> RangeRead for Box<T> {
    fn size(&self) -> io::Result<u64> {
        (**self).size()
    }
    fn read_at(&self, offset: u64, len: u64) -> io::Result<Vec<u8>> {
        (**self).read_at(offset, len)
    }
}
