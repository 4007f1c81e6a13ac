//! [`SharedBytes`]: a byte range of a buffer the log already holds — a
//! cached commit or a read from a journal file — shared instead of copied.
//!
//! A claim hands out records as slices of the batch they were stored in
//! (the same bytes on the wire and on disk: docs/design/batch-format.md): the log returns each
//! batch as a range of the buffer it lives in, the partition narrows that to
//! each record, and only the response encoder copies the record, once, into
//! the frame it writes to the socket.

use std::fmt;
use std::ops::{Deref, Range};
use std::rc::Rc;

/// A buffer that can own shared ranges: anything that derefs to bytes.
trait Owner {
    fn bytes(&self) -> &[u8];
}

impl<T: Deref<Target = [u8]>> Owner for T {
    fn bytes(&self) -> &[u8] {
        self
    }
}

/// Adapts a buffer that exposes its bytes by `AsRef` (the log's commit
/// buffers) to [`Owner`].
struct ByRef<B>(Rc<B>);

impl<B: AsRef<[u8]>> Owner for ByRef<B> {
    fn bytes(&self) -> &[u8] {
        (*self.0).as_ref()
    }
}

/// An immutable range of a shared buffer; cloning it clones a reference
/// count, not the bytes. Single-threaded (`Rc`), like everything a shard
/// owns.
#[derive(Clone)]
pub struct SharedBytes {
    owner: Rc<dyn Owner>,
    start: usize,
    end: usize,
}

impl SharedBytes {
    /// The whole of `buf`.
    pub fn new<T: Deref<Target = [u8]> + 'static>(buf: T) -> Self {
        let end = buf.len();
        Self { owner: Rc::new(buf), start: 0, end }
    }

    /// The whole of a shared buffer that exposes its bytes by `AsRef` (a
    /// commit buffer the log also keeps in its tail cache).
    pub(crate) fn from_shared<B: AsRef<[u8]> + 'static>(buf: Rc<B>) -> Self {
        let end = (*buf).as_ref().len();
        Self { owner: Rc::new(ByRef(buf)), start: 0, end }
    }

    /// A copy of `bytes` in a buffer of its own (tests, and callers that
    /// hold bytes the log did not produce).
    pub fn copy_from(bytes: &[u8]) -> Self {
        let owned: Vec<u8> = bytes.to_vec();
        Self::new(owned)
    }

    /// The sub-range `range` of these bytes (relative to their start),
    /// sharing the same buffer.
    ///
    /// # Panics
    /// When `range` is not inside `0..self.len()` (a caller's bug, never
    /// input-driven: callers compute ranges from validated batches).
    #[must_use]
    pub fn slice(&self, range: Range<usize>) -> Self {
        assert!(range.start <= range.end && range.end <= self.len(), "slice out of range");
        Self {
            owner: self.owner.clone(),
            start: self.start + range.start,
            end: self.start + range.end,
        }
    }
}

impl Deref for SharedBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.owner.bytes()[self.start..self.end]
    }
}

impl AsRef<[u8]> for SharedBytes {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl PartialEq for SharedBytes {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for SharedBytes {}

impl PartialEq<[u8]> for SharedBytes {
    fn eq(&self, other: &[u8]) -> bool {
        **self == *other
    }
}

impl PartialEq<Vec<u8>> for SharedBytes {
    fn eq(&self, other: &Vec<u8>) -> bool {
        **self == other[..]
    }
}

impl fmt::Debug for SharedBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedBytes").field("len", &self.len()).finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_share_the_buffer_and_see_the_right_bytes() {
        // Goal: a slice is a window onto the same bytes, nested slices compose.
        let whole = SharedBytes::new((0u8..100).collect::<Vec<u8>>());
        let middle = whole.slice(10..60);
        assert_eq!(&*middle, &(10u8..60).collect::<Vec<u8>>()[..]);
        let inner = middle.slice(5..10);
        assert_eq!(&*inner, &[15, 16, 17, 18, 19]);
        assert_eq!(whole.as_ptr().wrapping_add(15), inner.as_ptr(), "no copy was made");
        assert_eq!(inner, SharedBytes::copy_from(&[15, 16, 17, 18, 19]));
    }

    #[test]
    fn a_shared_commit_buffer_is_served_without_a_copy() {
        let buf = Rc::new(vec![7u8; 64]);
        let shared = SharedBytes::from_shared(buf.clone());
        assert_eq!(shared.as_ptr(), buf.as_ptr());
        assert_eq!(shared.slice(8..16).len(), 8);
    }

    #[test]
    #[should_panic(expected = "slice out of range")]
    fn a_slice_past_the_end_is_a_bug() {
        let _ = SharedBytes::copy_from(&[1, 2, 3]).slice(2..4);
    }
}
