//! Pure parsers for the kernel's text files the host checks read.
//!
//! Owns the formats of `/sys/block/X/queue/scheduler`, `scaling_governor`,
//! `/proc/mounts`, `/sys/dev/block` device numbers and plain integer sysctls.
//! Does no I/O, so each format is tested on sample text rather than on
//! whatever machine runs the tests.

use std::path::{Component, Path};

use serde::{Deserialize, Serialize};

/// Most mount entries considered; a host with more is unusual enough that the
/// rest are ignored rather than parsed without bound.
pub const MOUNT_ENTRIES_MAX: usize = 65_536;

/// An I/O scheduler file: `none [mq-deadline] kyber bfq`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scheduler {
    /// The bracketed entry.
    pub active: String,
    /// Every entry, active included.
    pub available: Vec<String>,
}

/// Parses a scheduler file. `None` when no entry is bracketed (the format of
/// old single-queue kernels without a choice, or an empty file).
pub fn parse_scheduler(text: &str) -> Option<Scheduler> {
    let mut active = None;
    let mut available = Vec::new();
    for word in text.split_whitespace() {
        match word.strip_prefix('[').and_then(|rest| rest.strip_suffix(']')) {
            Some(name) => {
                active = Some(name.to_owned());
                available.push(name.to_owned());
            }
            None => available.push(word.to_owned()),
        }
    }
    active.map(|active| Scheduler { active, available })
}

/// Parses a `scaling_governor` file: one word.
pub fn parse_governor(text: &str) -> Option<String> {
    let mut words = text.split_whitespace();
    let governor = words.next()?;
    if words.next().is_some() {
        return None;
    }
    Some(governor.to_owned())
}

/// One line of `/proc/mounts`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountEntry {
    pub source: String,
    pub target: String,
    pub fstype: String,
}

/// Parses `/proc/mounts`, undoing the kernel's octal escapes (`\040` = space).
/// Malformed lines are skipped: the file is the kernel's, not user input.
pub fn parse_mounts(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let source = fields.next()?;
            let target = fields.next()?;
            let fstype = fields.next()?;
            Some(MountEntry {
                source: unescape_octal(source),
                target: unescape_octal(target),
                fstype: fstype.to_owned(),
            })
        })
        .take(MOUNT_ENTRIES_MAX)
        .collect()
}

/// The mount holding `path` (absolute, canonical): the entry with the longest
/// target that is a path prefix of it; the last such entry wins, as a later
/// mount over the same point hides the earlier one.
pub fn mount_for_path<'m>(mounts: &'m [MountEntry], path: &Path) -> Option<&'m MountEntry> {
    let mut best: Option<(&MountEntry, usize)> = None;
    for entry in mounts {
        let target = Path::new(&entry.target);
        if path.starts_with(target) {
            let depth =
                target.components().filter(|part| matches!(part, Component::Normal(_))).count();
            if best.is_none_or(|(_, best_depth)| depth >= best_depth) {
                best = Some((entry, depth));
            }
        }
    }
    best.map(|(entry, _)| entry)
}

/// Parses `MAJOR:MINOR` (the `dev` file of a block device).
pub fn parse_dev_numbers(text: &str) -> Option<(u32, u32)> {
    let (major, minor) = text.trim().split_once(':')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// Parses a file holding one unsigned integer (sysctls, `logical_block_size`).
pub fn parse_u64(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

fn unescape_octal(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let octal = bytes.get(index + 1..index + 4).filter(|digits| {
            bytes[index] == b'\\' && digits.iter().all(|digit| (b'0'..=b'7').contains(digit))
        });
        match octal.and_then(|digits| u8::from_str_radix(std::str::from_utf8(digits).ok()?, 8).ok())
        {
            Some(byte) => {
                out.push(byte);
                index += 4;
            }
            None => {
                out.push(bytes[index]);
                index += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: the bracketed scheduler is the active one and all are listed.
    // Method: sample files from a virtio disk, an NVMe disk and a malformed one.
    #[test]
    fn scheduler_files_parse() {
        let virtio = parse_scheduler("none [mq-deadline] kyber bfq \n").unwrap();
        assert_eq!(virtio.active, "mq-deadline");
        assert_eq!(virtio.available, ["none", "mq-deadline", "kyber", "bfq"]);
        let nvme = parse_scheduler("[none] mq-deadline\n").unwrap();
        assert_eq!(nvme.active, "none");
        assert_eq!(parse_scheduler("none mq-deadline\n"), None);
        assert_eq!(parse_scheduler(""), None);
    }

    // Goal: a governor file is exactly one word. Method: good, empty and junk text.
    #[test]
    fn governor_files_parse() {
        assert_eq!(parse_governor("powersave\n").as_deref(), Some("powersave"));
        assert_eq!(parse_governor("performance").as_deref(), Some("performance"));
        assert_eq!(parse_governor("\n"), None);
        assert_eq!(parse_governor("a b"), None);
    }

    // Goal: mounts parse with escapes, and the deepest mount holding a path is
    // chosen. Method: a sample /proc/mounts with nested and escaped targets.
    #[test]
    fn mounts_parse_and_resolve() {
        let text = "proc /proc proc rw,relatime 0 0\n\
                    /dev/vda / ext4 rw,relatime 0 0\n\
                    /dev/nvme0n1p1 /var/lib/spool xfs rw,noatime 0 0\n\
                    tmpfs /var/lib/spool\\040data tmpfs rw 0 0\n\
                    broken-line\n";
        let mounts = parse_mounts(text);
        assert_eq!(mounts.len(), 4);
        assert_eq!(mounts[3].target, "/var/lib/spool data");
        let data = mount_for_path(&mounts, Path::new("/var/lib/spool/q1")).unwrap();
        assert_eq!(data.fstype, "xfs");
        assert_eq!(data.source, "/dev/nvme0n1p1");
        let spaced = mount_for_path(&mounts, Path::new("/var/lib/spool data/x")).unwrap();
        assert_eq!(spaced.fstype, "tmpfs");
        // "/var/lib/spoolish" must not match "/var/lib/spool": prefixes are by component.
        assert_eq!(mount_for_path(&mounts, Path::new("/var/lib/spoolish")).unwrap().target, "/");
        assert_eq!(mount_for_path(&mounts, Path::new("/proc/1")).unwrap().fstype, "proc");
    }

    // Goal: device numbers and integer files parse; junk is rejected.
    #[test]
    fn numbers_parse() {
        assert_eq!(parse_dev_numbers("254:0\n"), Some((254, 0)));
        assert_eq!(parse_dev_numbers("254"), None);
        assert_eq!(parse_u64("512\n"), Some(512));
        assert_eq!(parse_u64("-1"), None);
    }
}
