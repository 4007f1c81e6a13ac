//! Journal file names and commit geometry. Pure: no I/O.
//!
//! A journal file is named by the journal position of its byte 0:
//! `{position:020}.wal`. The file being zero-filled ahead of need is
//! `next.prep`; it is never part of the journal and recovery deletes it.

use std::path::{Path, PathBuf};

use super::entry::V1_HEADER_BYTES;
use crate::limits::PAGE_BYTES;

/// Name of the file being zero-filled to become the next journal file.
pub const JOURNAL_PREPARED_NAME: &str = "next.prep";
/// Suffix of journal files.
pub const JOURNAL_FILE_SUFFIX: &str = ".wal";

/// Path of the journal file whose byte 0 is journal position `base`.
pub fn journal_file_path(dir: &Path, base: u64) -> PathBuf {
    dir.join(format!("{base:020}{JOURNAL_FILE_SUFFIX}"))
}

/// Parses `{20 digits}.wal`; anything else is not a journal file.
pub fn parse_journal_file_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(JOURNAL_FILE_SUFFIX)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The base position of the oldest journal file in `dir` (0 when there is
/// none, or the directory does not exist yet): where a recovery that
/// keeps every file starts its scan.
pub fn oldest_journal_file(dir: &Path) -> u64 {
    let Ok(names) = std::fs::read_dir(dir) else { return 0 };
    names
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str().and_then(parse_journal_file_name))
        .min()
        .unwrap_or(0)
}

pub fn page_floor(pos: u64) -> u64 {
    pos - pos % PAGE_BYTES
}

pub fn page_ceil(pos: u64) -> u64 {
    pos.div_ceil(PAGE_BYTES) * PAGE_BYTES
}

/// Bytes a commit of `data_bytes` of entries occupies: whole pages, with
/// room for a filler entry (at least a v1 header) unless the entries end on a
/// page boundary.
pub fn commit_span(data_bytes: u64) -> u64 {
    if data_bytes.is_multiple_of(PAGE_BYTES) {
        data_bytes
    } else {
        page_ceil(data_bytes + V1_HEADER_BYTES as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_span_leaves_room_for_a_filler_entry() {
        // Goal: every unaligned commit gets a filler of at least one header.
        assert_eq!(commit_span(4096), 4096);
        assert_eq!(commit_span(4096 - 32), 4096);
        assert_eq!(commit_span(4096 - 24), 8192);
        for data in (8..20_000).step_by(8) {
            let span = commit_span(data);
            assert!(span.is_multiple_of(PAGE_BYTES));
            assert!(span == data || span - data >= V1_HEADER_BYTES as u64);
        }
    }

    #[test]
    fn names_round_trip() {
        // Goal: journal file names parse back; foreign names are ignored.
        let path = journal_file_path(Path::new("/j"), 67_108_864);
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        assert_eq!(name, "00000000000067108864.wal");
        assert_eq!(parse_journal_file_name(name), Some(67_108_864));
        assert_eq!(parse_journal_file_name("next.prep"), None);
        assert_eq!(parse_journal_file_name("0000000000000000000x.wal"), None);
    }
}
