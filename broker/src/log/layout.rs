//! File names and commit geometry shared by the appender, recovery and the
//! reader. Pure functions: no I/O.

use std::path::{Path, PathBuf};

use crate::limits::{FILLER_BYTES_MIN, PAGE_BYTES};

/// Name of the file being prepared (zero-filled) to become the next segment.
pub const PREPARED_FILE_NAME: &str = "next-segment.prep";
/// Suffix of segment files: `{base_offset:020}.log`.
pub const SEGMENT_SUFFIX: &str = ".log";
/// Suffix of persisted sparse indexes: `{base_offset:020}.index`.
pub const INDEX_SUFFIX: &str = ".index";

pub fn segment_path(dir: &Path, base_offset: u64) -> PathBuf {
    dir.join(format!("{base_offset:020}{SEGMENT_SUFFIX}"))
}

pub fn index_path(dir: &Path, base_offset: u64) -> PathBuf {
    dir.join(format!("{base_offset:020}{INDEX_SUFFIX}"))
}

/// Parses `{20 digits}{suffix}`; anything else is not ours.
pub fn parse_name(name: &str, suffix: &str) -> Option<u64> {
    let digits = name.strip_suffix(suffix)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

pub fn page_floor(pos: u64) -> u64 {
    pos - pos % PAGE_BYTES
}

pub fn page_ceil(pos: u64) -> u64 {
    pos.div_ceil(PAGE_BYTES) * PAGE_BYTES
}

/// Bytes a commit of `data_bytes` batches occupies: rounded up to whole pages,
/// with room for a filler batch (at least a header) unless the data already
/// ends on a page boundary.
pub fn commit_span(data_bytes: u64) -> u64 {
    if data_bytes.is_multiple_of(PAGE_BYTES) {
        data_bytes
    } else {
        page_ceil(data_bytes + FILLER_BYTES_MIN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_span_leaves_room_for_a_filler() {
        // Goal: every non-aligned commit gets a filler of at least one header.
        assert_eq!(commit_span(4096), 4096);
        assert_eq!(commit_span(1024), 4096);
        assert_eq!(commit_span(4096 - 64), 4096);
        assert_eq!(commit_span(4096 - 56), 8192);
        assert_eq!(commit_span(8), 4096);
        for data in (8..20_000).step_by(8) {
            let span = commit_span(data);
            assert!(span.is_multiple_of(PAGE_BYTES));
            assert!(span == data || span - data >= FILLER_BYTES_MIN);
        }
    }

    #[test]
    fn names_round_trip() {
        // Goal: segment names parse back; foreign names are ignored.
        let path = segment_path(Path::new("/p"), 42);
        let name = path.file_name().unwrap().to_str().unwrap();
        assert_eq!(name, "00000000000000000042.log");
        assert_eq!(parse_name(name, SEGMENT_SUFFIX), Some(42));
        assert_eq!(parse_name("42.log", SEGMENT_SUFFIX), None);
        assert_eq!(parse_name("0000000000000000004x.log", SEGMENT_SUFFIX), None);
    }
}
