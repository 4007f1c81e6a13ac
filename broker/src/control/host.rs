//! What the host gives the broker that its settings default from: the
//! memory it may use — the machine's (`MemTotal` in `/proc/meminfo`) or the
//! cgroup's limit (`memory.max` in cgroup v2, `memory.limit_in_bytes` in
//! v1), whichever is lower. Read once, at start, while the configuration is
//! resolved; the parsing is pure and tested on sample texts.

use std::path::Path;

/// The memory this process may use: the lower of the machine's and its
/// cgroup's limit; `None` when neither can be read.
pub fn memory_limit_bytes() -> Option<u64> {
    let machine =
        std::fs::read_to_string("/proc/meminfo").ok().and_then(|text| meminfo_total(&text));
    let cgroup = cgroup_limit(Path::new("/proc/self/cgroup"), Path::new("/sys/fs/cgroup"));
    match (machine, cgroup) {
        (Some(machine), Some(cgroup)) => Some(machine.min(cgroup)),
        (machine, cgroup) => machine.or(cgroup),
    }
}

/// `MemTotal` of a `/proc/meminfo` text, in bytes.
pub fn meminfo_total(text: &str) -> Option<u64> {
    let line = text.lines().find(|line| line.starts_with("MemTotal:"))?;
    let mut words = line.split_whitespace().skip(1);
    let value: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") | None => value.checked_mul(1024),
        Some(_) => None,
    }
}

/// A cgroup limit file's value: bytes, or `None` for "max" (no limit) and
/// for values so large they mean no limit (v1 writes a page-rounded
/// `i64::MAX`).
pub fn limit_value(text: &str) -> Option<u64> {
    let value: u64 = text.trim().parse().ok()?;
    (value < 1 << 60).then_some(value)
}

/// The memory limit of this process's cgroup, v2 or v1.
fn cgroup_limit(self_cgroup: &Path, root: &Path) -> Option<u64> {
    let membership = std::fs::read_to_string(self_cgroup).ok()?;
    for line in membership.lines() {
        // v2: "0::/path"; v1: "N:memory:/path" (controllers comma-separated).
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let relative = path.trim_start_matches('/');
        let file = if controllers.is_empty() {
            root.join(relative).join("memory.max")
        } else if controllers.split(',').any(|name| name == "memory") {
            root.join("memory").join(relative).join("memory.limit_in_bytes")
        } else {
            continue;
        };
        if let Some(limit) = std::fs::read_to_string(file).ok().and_then(|text| limit_value(&text))
        {
            return Some(limit);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: MemTotal is read in kB and turned into bytes; a malformed text
    // gives nothing rather than a wrong figure.
    #[test]
    fn meminfo_total_is_read_in_bytes() {
        let text = "MemTotal:       24683784 kB\nMemFree:         1000 kB\n";
        assert_eq!(meminfo_total(text), Some(24_683_784 * 1024));
        assert_eq!(meminfo_total("MemFree: 1 kB\n"), None);
        assert_eq!(meminfo_total("MemTotal: lots kB\n"), None);
    }

    // Goal: "max" and v1's huge sentinel mean no limit; a number is bytes.
    #[test]
    fn cgroup_limits_are_bytes_or_none() {
        assert_eq!(limit_value("max\n"), None);
        assert_eq!(limit_value("9223372036854771712\n"), None);
        assert_eq!(limit_value("536870912\n"), Some(512 << 20));
    }

    // Goal: the cgroup's file is found from this process's membership, for
    // v2 and v1 layouts. Method: a fake /proc/self/cgroup and root.
    #[test]
    fn the_cgroup_file_is_found_for_v2_and_v1() {
        let dir = tempfile::tempdir().unwrap();
        let membership = dir.path().join("cgroup");
        std::fs::write(&membership, "0::/spool.slice\n").unwrap();
        std::fs::create_dir_all(dir.path().join("root/spool.slice")).unwrap();
        std::fs::write(dir.path().join("root/spool.slice/memory.max"), "1073741824\n").unwrap();
        assert_eq!(cgroup_limit(&membership, &dir.path().join("root")), Some(1 << 30));
        std::fs::write(&membership, "4:cpu,cpuacct:/x\n3:memory:/box\n").unwrap();
        std::fs::create_dir_all(dir.path().join("root/memory/box")).unwrap();
        std::fs::write(dir.path().join("root/memory/box/memory.limit_in_bytes"), "268435456")
            .unwrap();
        assert_eq!(cgroup_limit(&membership, &dir.path().join("root")), Some(256 << 20));
        std::fs::write(&membership, "0::/elsewhere\n").unwrap();
        assert_eq!(cgroup_limit(&membership, &dir.path().join("root")), None);
    }
}
