//! [`ReadAhead`]: runs a `Read` (e.g. a gzip decoder) on its own thread and hands its output
//! over in bounded 1 MiB buffers, so decompressing the source and compressing the weenv frames
//! use two cores for one layer. Memory is bounded by `depth` buffers.

use std::io::{self, Read};
use std::sync::mpsc::{sync_channel, Receiver};
use std::thread::JoinHandle;

const BUF: usize = 1 << 20;

/// A reader fed by a producer thread.
pub struct ReadAhead {
    rx: Receiver<io::Result<Vec<u8>>>,
    current: Vec<u8>,
    pos: usize,
    done: bool,
    thread: Option<JoinHandle<()>>,
}

impl ReadAhead {
    /// Start reading `inner` on a new thread, at most `depth` buffers ahead.
    pub fn spawn(mut inner: Box<dyn Read + Send>, depth: usize) -> io::Result<ReadAhead> {
        let (tx, rx) = sync_channel(depth.max(1));
        let thread = std::thread::Builder::new()
            .name("weenv-readahead".into())
            .spawn(move || loop {
                let mut buf = vec![0u8; BUF];
                let mut filled = 0;
                let res = loop {
                    match inner.read(&mut buf[filled..]) {
                        Ok(0) => break Ok(()),
                        Ok(n) => {
                            filled += n;
                            if filled == BUF {
                                break Ok(());
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => break Err(e),
                    }
                };
                buf.truncate(filled);
                let last = filled < BUF;
                let msg = match res {
                    Ok(()) => Ok(buf),
                    Err(e) => Err(e),
                };
                let failed = msg.is_err();
                // The consumer hung up (it failed or finished early): stop.
                if tx.send(msg).is_err() || last || failed {
                    return;
                }
            })?;
        Ok(ReadAhead {
            rx,
            current: Vec::new(),
            pos: 0,
            done: false,
            thread: Some(thread),
        })
    }
}

impl Read for ReadAhead {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.current.len() {
            if self.done {
                return Ok(0);
            }
            match self.rx.recv() {
                Ok(Ok(buf)) => {
                    if buf.len() < BUF {
                        self.done = true;
                    }
                    self.current = buf;
                    self.pos = 0;
                }
                Ok(Err(e)) => {
                    self.done = true;
                    return Err(e);
                }
                Err(_) => {
                    self.done = true;
                    return Err(io::Error::other("read-ahead thread ended unexpectedly"));
                }
            }
        }
        let n = out.len().min(self.current.len() - self.pos);
        out[..n].copy_from_slice(&self.current[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

impl Drop for ReadAhead {
    fn drop(&mut self) {
        // Unblock the producer (its send fails once the receiver is gone), then join it.
        let (_, dead) = sync_channel(0);
        drop(std::mem::replace(&mut self.rx, dead));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn passes_bytes_through_in_order() {
        for len in [0usize, 1, BUF - 1, BUF, BUF + 1, 3 * BUF + 17] {
            let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let mut r = ReadAhead::spawn(Box::new(io::Cursor::new(data.clone())), 2).unwrap();
            let mut out = Vec::new();
            r.read_to_end(&mut out).unwrap();
            assert_eq!(out, data, "len {len}");
        }
    }

    struct Failing(usize);
    impl Read for Failing {
        fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
            if self.0 == 0 {
                return Err(io::Error::other("boom"));
            }
            let n = out.len().min(self.0);
            self.0 -= n;
            Ok(n)
        }
    }

    #[test]
    fn forwards_errors_and_stops_early_without_hanging() {
        let mut r = ReadAhead::spawn(Box::new(Failing(BUF + 5)), 1).unwrap();
        let mut out = Vec::new();
        let e = r.read_to_end(&mut out).unwrap_err();
        assert_eq!(e.to_string(), "boom");
        // Dropping a reader whose producer is still running must not deadlock.
        let r = ReadAhead::spawn(Box::new(io::repeat(1).take(64 * BUF as u64)), 1).unwrap();
        drop(r);
    }
}
