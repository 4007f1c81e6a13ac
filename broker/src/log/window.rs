//! [`Window`]: a page-aligned read window over one file, so scans and reads
//! issue large aligned reads (O_DIRECT) and parse batches out of them.

use std::rc::Rc;

use crate::io::{IoError, StorageFile};
use crate::log::layout::{page_ceil, page_floor};
use crate::log::SharedBytes;

pub(crate) struct Window<'a, F: StorageFile> {
    file: &'a F,
    chunk_bytes: u64,
    start: u64,
    bytes: Option<Rc<F::ReadBuf>>,
    /// The last read returned less than asked: the file ends in the window.
    at_eof: bool,
    /// Bytes read from the file so far.
    read_bytes: u64,
    /// Reads ahead of what is asked stop here (what is asked is always read).
    ahead_end: u64,
}

impl<'a, F: StorageFile> Window<'a, F> {
    pub fn new(file: &'a F, chunk_bytes: u64) -> Self {
        Self {
            file,
            chunk_bytes,
            start: 0,
            bytes: None,
            at_eof: false,
            read_bytes: 0,
            ahead_end: u64::MAX,
        }
    }

    /// Reads ahead of what [`Window::get`] asks for stop at `end` (what is
    /// asked past it is still read): a scan that knows where the bytes it
    /// needs end reads no chunk beyond them.
    pub fn ahead_until(mut self, end: u64) -> Self {
        self.ahead_end = end;
        self
    }

    /// Bytes `[pos, pos + len)`, shorter only at end of file.
    pub async fn get(&mut self, pos: u64, len: u64) -> Result<&[u8], IoError> {
        let covered = self.bytes.as_ref().is_some_and(|bytes| {
            let end = self.start + bytes.len() as u64;
            pos >= self.start && (pos + len <= end || (self.at_eof && pos <= end))
        });
        if !covered {
            let start = page_floor(pos);
            let asked = page_ceil(pos + len);
            let ahead = page_ceil(self.ahead_end.min(pos.saturating_add(self.chunk_bytes)));
            let want = asked.max(ahead) - start;
            let bytes = self.file.read_at(start, want as usize).await?;
            self.at_eof = (bytes.len() as u64) < want;
            self.read_bytes += bytes.len() as u64;
            self.bytes = Some(Rc::new(bytes));
            self.start = start;
        }
        let Some(bytes) = self.bytes.as_ref() else { unreachable!("window just filled") };
        let from = (pos - self.start) as usize;
        let to = ((pos + len - self.start) as usize).min(bytes.len());
        Ok(&bytes[from.min(to)..to])
    }

    /// Whether the bytes read last hold all of `[pos, pos + len)` (a
    /// [`Window::get`] of it would not read).
    pub fn holds(&self, pos: u64, len: u64) -> bool {
        self.bytes
            .as_ref()
            .is_some_and(|bytes| pos >= self.start && pos + len <= self.start + bytes.len() as u64)
    }

    /// Bytes read from the file through this window.
    pub fn read_bytes(&self) -> u64 {
        self.read_bytes
    }

    /// The bytes `[pos, pos + len)` that the last [`Window::get`] covered,
    /// as a range of the read buffer itself (no copy).
    ///
    /// # Panics
    /// When no `get` covered that range (a caller's bug).
    pub fn share(&self, pos: u64, len: u64) -> SharedBytes {
        let Some(bytes) = self.bytes.as_ref() else { panic!("share before get") };
        let from = (pos - self.start) as usize;
        let to = from + len as usize;
        assert!(to <= bytes.len(), "share past the window");
        SharedBytes::from_shared(Rc::new(SharedRead(bytes.clone()))).slice(from..to)
    }
}

/// A window's read buffer, shared with the batches served from it.
struct SharedRead<R>(Rc<R>);

impl<R: std::ops::Deref<Target = [u8]>> AsRef<[u8]> for SharedRead<R> {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}
