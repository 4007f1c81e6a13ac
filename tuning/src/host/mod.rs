//! Host checks: is this machine set up the way Spool's design assumes?
//!
//! This module owns reading the host (io_uring, RLIMIT_MEMLOCK, CPUs and
//! governors, the data directory's filesystem and block device, vm.dirty_*
//! sysctls), deciding which settings Spool would change ([`plan_changes`]) and
//! making those changes on request ([`apply`]). It does not persist anything
//! across reboots (no /etc files): every change is a runtime write to /proc or
//! /sys that an operator can see and revert, and memlock is left to the
//! service manager because a limit only binds processes started after it.
//!
//! Every check that cannot read its source (VMs, containers) reports
//! [`Check::Unknown`] with the reason instead of failing the whole report.
//! The kernel-file formats live in [`parse`]; the roots of /proc and /sys are
//! parameters ([`Roots`]) so the sysfs walk is testable on a fake tree.

pub mod parse;
#[cfg(test)]
mod tests;

use std::ffi::CString;
use std::fs;
use std::io;
use std::mem::MaybeUninit;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use parse::Scheduler;

/// glommio pins `io_memory` and needs at least this much locked memory
/// (`spool-plan host`, docs/capacity.md); root is exempt.
pub const MEMLOCK_BYTES_MIN: u64 = 512 * 1024;
/// Bound for other writers' dirty page cache before background writeback:
/// Spool writes O_DIRECT, so dirty pages belong to other processes, and a
/// byte bound (not a RAM ratio) keeps their writeback bursts small next to
/// Spool's fdatasync.
pub const DIRTY_BACKGROUND_BYTES: u64 = 64 * 1024 * 1024;
/// Bound at which other writers are throttled (see [`DIRTY_BACKGROUND_BYTES`]).
pub const DIRTY_BYTES: u64 = 256 * 1024 * 1024;
/// Most CPUs whose governor is read.
pub const CPUS_MAX: usize = 4096;
/// Longest kernel text file read (all of them are one short line or /proc/mounts).
pub const KERNEL_FILE_BYTES_MAX: u64 = 4 * 1024 * 1024;

/// Why the host checks or changes failed as a whole.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HostError {
    #[error("--apply changes kernel settings and needs root (running as uid {euid}); rerun with sudo, or apply the listed changes by hand")]
    NotRoot { euid: u32 },
}

/// A check's outcome: a value, or why it could not be read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Check<T> {
    Ok { value: T },
    Unknown { reason: String },
}

impl<T> Check<T> {
    pub fn unknown(reason: impl Into<String>) -> Self {
        Check::Unknown { reason: reason.into() }
    }

    pub fn value(&self) -> Option<&T> {
        match self {
            Check::Ok { value } => Some(value),
            Check::Unknown { .. } => None,
        }
    }
}

/// Where /proc and /sys are mounted (the real ones, or a fake tree in tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Roots {
    pub proc_root: PathBuf,
    pub sys_root: PathBuf,
}

impl Default for Roots {
    fn default() -> Self {
        Self { proc_root: PathBuf::from("/proc"), sys_root: PathBuf::from("/sys") }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IoUring {
    /// `io_uring_setup` returned a ring.
    pub available: bool,
    /// What the probe saw.
    pub detail: String,
    /// kernel.io_uring_disabled (0 = allowed, 1 = privileged only, 2 = off).
    pub disabled_sysctl: Check<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Memlock {
    /// Soft limit; `None` = unlimited.
    pub soft_bytes: Option<u64>,
    /// Hard limit; `None` = unlimited.
    pub hard_bytes: Option<u64>,
    pub required_bytes: u64,
    /// Root, or a soft limit of at least `required_bytes`.
    pub sufficient: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CpuGovernor {
    pub cpu: String,
    pub governor: String,
    /// `scaling_available_governors`; empty when unreadable.
    pub available: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Filesystem {
    pub mount_point: String,
    pub source: String,
    pub fstype: String,
    pub free_bytes: u64,
    pub total_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BlockDevice {
    /// Whole-disk name under /sys/block (a partition resolves to its disk).
    pub name: String,
    /// MAJOR:MINOR of the filesystem's device.
    pub dev: String,
    pub is_nvme: bool,
    pub scheduler: Check<Scheduler>,
    pub logical_block_bytes: Check<u64>,
    pub rotational: Check<bool>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sysctl {
    pub name: String,
    pub path: String,
    pub value: Check<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DiskNeed {
    /// The plan's disk need for one replica (retention or backlog, plus reserve).
    pub needed_bytes: u64,
    pub free_bytes: Option<u64>,
    pub sufficient: Check<bool>,
}

/// How a change is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApplyHow {
    /// `--apply` writes `desired` to every path.
    Write,
    /// An operator must do it (the instruction is in `reason`).
    Manual,
}

/// A setting Spool would change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Change {
    pub setting: String,
    pub paths: Vec<String>,
    pub current: String,
    pub desired: String,
    pub reason: String,
    pub how: ApplyHow,
}

/// Everything `spool-plan host` reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostReport {
    pub is_root: bool,
    pub io_uring: IoUring,
    pub memlock: Check<Memlock>,
    pub cpu_count: Check<usize>,
    pub governors: Check<Vec<CpuGovernor>>,
    pub data_dir: String,
    /// The data dir, or its nearest existing ancestor when it does not exist yet.
    pub probed_path: String,
    pub filesystem: Check<Filesystem>,
    pub block_device: Check<BlockDevice>,
    pub disk: DiskNeed,
    pub sysctls: Vec<Sysctl>,
    pub changes: Vec<Change>,
}

/// Reads the host. Never fails: what cannot be read is [`Check::Unknown`].
pub fn probe(data_dir: &Path, disk_need_bytes: u64, roots: &Roots) -> HostReport {
    let is_root = effective_uid() == 0;
    let probed_path = existing_ancestor(data_dir);
    let filesystem = probe_filesystem(&probed_path, roots);
    let free_bytes = filesystem.value().map(|fs| fs.free_bytes);
    let disk = DiskNeed {
        needed_bytes: disk_need_bytes,
        free_bytes,
        sufficient: match free_bytes {
            Some(free) => Check::Ok { value: free >= disk_need_bytes },
            None => Check::unknown("free space of the data dir's filesystem is unknown"),
        },
    };
    let mut report = HostReport {
        is_root,
        io_uring: probe_io_uring(roots),
        memlock: probe_memlock(is_root),
        cpu_count: match std::thread::available_parallelism() {
            Ok(count) => Check::Ok { value: count.get() },
            Err(error) => Check::unknown(format!("available_parallelism: {error}")),
        },
        governors: probe_governors(roots),
        data_dir: data_dir.display().to_string(),
        probed_path: probed_path.display().to_string(),
        filesystem,
        block_device: probe_block_device(&probed_path, roots),
        disk,
        sysctls: probe_sysctls(roots),
        changes: Vec::new(),
    };
    report.changes = plan_changes(&report);
    report
}

/// The changes Spool would make on a host that reported `report`. Pure.
pub fn plan_changes(report: &HostReport) -> Vec<Change> {
    let mut changes = Vec::new();
    for sysctl in &report.sysctls {
        let desired = match sysctl.name.as_str() {
            "vm.dirty_background_bytes" => DIRTY_BACKGROUND_BYTES,
            "vm.dirty_bytes" => DIRTY_BYTES,
            _ => continue,
        };
        // 0 means the RAM-ratio limit is in force; a smaller byte bound is already fine.
        let Some(&current) = sysctl.value.value() else { continue };
        if current == 0 || current > desired {
            changes.push(Change {
                setting: sysctl.name.clone(),
                paths: vec![sysctl.path.clone()],
                current: if current == 0 {
                    "0 (ratio in force)".to_owned()
                } else {
                    current.to_string()
                },
                desired: desired.to_string(),
                reason: "bound other writers' dirty page cache in bytes so their writeback \
                         bursts stay small next to Spool's O_DIRECT writes and fdatasync"
                    .to_owned(),
                how: ApplyHow::Write,
            });
        }
    }
    if let Some(device) = report.block_device.value() {
        let solid_state = device.is_nvme || device.rotational.value() == Some(&false);
        if let Some(scheduler) = device.scheduler.value() {
            if solid_state
                && scheduler.active != "none"
                && scheduler.available.iter().any(|name| name == "none")
            {
                changes.push(Change {
                    setting: format!("block scheduler of {}", device.name),
                    paths: vec![format!("/sys/block/{}/queue/scheduler", device.name)],
                    current: scheduler.active.clone(),
                    desired: "none".to_owned(),
                    reason: "solid-state device with its own queues: Spool's writes are large, \
                             sequential and already batched, so reordering only adds latency"
                        .to_owned(),
                    how: ApplyHow::Write,
                });
            }
        }
    }
    if let Some(governors) = report.governors.value() {
        let slow: Vec<&CpuGovernor> = governors
            .iter()
            .filter(|cpu| cpu.governor != "performance")
            .filter(|cpu| {
                cpu.available.is_empty() || cpu.available.iter().any(|g| g == "performance")
            })
            .collect();
        if !slow.is_empty() {
            let mut current: Vec<&str> = slow.iter().map(|cpu| cpu.governor.as_str()).collect();
            current.sort_unstable();
            current.dedup();
            changes.push(Change {
                setting: "cpu frequency governor".to_owned(),
                paths: slow
                    .iter()
                    .map(|cpu| {
                        format!("/sys/devices/system/cpu/{}/cpufreq/scaling_governor", cpu.cpu)
                    })
                    .collect(),
                current: current.join(","),
                desired: "performance".to_owned(),
                reason: "thread-per-core shards poll and park; frequency ramp-up after a park \
                         shows up directly in request latency"
                    .to_owned(),
                how: ApplyHow::Write,
            });
        }
    }
    if let Some(memlock) = report.memlock.value() {
        if !memlock.sufficient {
            changes.push(Change {
                setting: "RLIMIT_MEMLOCK".to_owned(),
                paths: Vec::new(),
                current: memlock.soft_bytes.map_or("unlimited".to_owned(), |b| b.to_string()),
                desired: format!(">= {MEMLOCK_BYTES_MIN}"),
                reason: "glommio pins io_memory per executor; set LimitMEMLOCK=infinity in \
                         spoold's systemd unit, or `ulimit -l 512` (or more) in the shell that \
                         starts it"
                    .to_owned(),
                how: ApplyHow::Manual,
            });
        }
    }
    changes
}

/// Outcome of one change under `--apply`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Applied {
    pub setting: String,
    pub path: Option<String>,
    /// "applied", "manual: …" or "failed: …".
    pub outcome: String,
}

/// Refuses unless `euid` is root: every automatic change writes to /proc or /sys.
///
/// # Errors
/// [`HostError::NotRoot`] for any other uid.
pub fn check_may_apply(euid: u32) -> Result<(), HostError> {
    if euid == 0 {
        Ok(())
    } else {
        Err(HostError::NotRoot { euid })
    }
}

/// Makes `changes` on this host, under `roots`. Paths in a [`Change`] are
/// shown as /proc or /sys; they are rebased onto `roots` before writing.
///
/// # Errors
/// [`HostError::NotRoot`] when not running as root. A change that fails to
/// write is reported in its [`Applied`] and does not stop the others.
pub fn apply(changes: &[Change], roots: &Roots) -> Result<Vec<Applied>, HostError> {
    apply_as(effective_uid(), changes, roots)
}

/// [`apply`] with the caller's uid passed in, so the refusal is testable.
fn apply_as(euid: u32, changes: &[Change], roots: &Roots) -> Result<Vec<Applied>, HostError> {
    check_may_apply(euid)?;
    let mut results = Vec::new();
    for change in changes {
        if change.how == ApplyHow::Manual {
            results.push(Applied {
                setting: change.setting.clone(),
                path: None,
                outcome: format!("manual: {}", change.reason),
            });
            continue;
        }
        for path in &change.paths {
            let target = rebase(path, roots);
            let outcome = match write_existing(&target, &change.desired) {
                Ok(()) => "applied".to_owned(),
                Err(error) => format!("failed: {}: {error}", target.display()),
            };
            results.push(Applied {
                setting: change.setting.clone(),
                path: Some(path.clone()),
                outcome,
            });
        }
    }
    Ok(results)
}

/// Writes `value` to a kernel file that must already exist: a missing
/// /proc or /sys entry means the kernel lacks the knob, and creating a plain
/// file in its place would hide that.
fn write_existing(path: &Path, value: &str) -> io::Result<()> {
    use std::io::Write;
    let mut file = fs::OpenOptions::new().write(true).truncate(true).open(path)?;
    file.write_all(value.as_bytes())
}

fn rebase(path: &str, roots: &Roots) -> PathBuf {
    if let Some(rest) = path.strip_prefix("/proc/") {
        roots.proc_root.join(rest)
    } else if let Some(rest) = path.strip_prefix("/sys/") {
        roots.sys_root.join(rest)
    } else {
        PathBuf::from(path)
    }
}

fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Reads a small kernel text file.
fn read_kernel_file(path: &Path) -> Result<String, String> {
    use std::io::Read;
    let file = fs::File::open(path).map_err(|error| format!("{}: {error}", path.display()))?;
    let mut text = String::new();
    file.take(KERNEL_FILE_BYTES_MAX)
        .read_to_string(&mut text)
        .map_err(|error| format!("{}: {error}", path.display()))?;
    Ok(text)
}

fn read_u64(path: &Path) -> Check<u64> {
    match read_kernel_file(path) {
        Ok(text) => match parse::parse_u64(&text) {
            Some(value) => Check::Ok { value },
            None => {
                Check::unknown(format!("{}: not an integer: {:?}", path.display(), text.trim()))
            }
        },
        Err(reason) => Check::unknown(reason),
    }
}

/// The io_uring_params struct is 120 bytes on every architecture; the probe
/// passes it zeroed (no flags) and reads nothing back.
#[repr(C)]
struct IoUringParams {
    words: [u32; 30],
}

const _: () = assert!(std::mem::size_of::<IoUringParams>() == 120);

fn probe_io_uring(roots: &Roots) -> IoUring {
    let disabled_sysctl = read_u64(&roots.proc_root.join("sys/kernel/io_uring_disabled"));
    let mut params = IoUringParams { words: [0; 30] };
    // SAFETY: io_uring_setup(entries, params) reads and writes exactly
    // sizeof(struct io_uring_params) = 120 bytes at `params`, which is a live,
    // zeroed, 4-byte-aligned 120-byte buffer owned by this frame.
    let result =
        unsafe { libc::syscall(libc::SYS_io_uring_setup, 1_u32, std::ptr::from_mut(&mut params)) };
    if result >= 0 {
        // The ring exists only to prove setup works; closing it frees it.
        // SAFETY: `result` is a file descriptor this process just received and owns.
        unsafe { libc::close(result as libc::c_int) };
        return IoUring {
            available: true,
            detail: "io_uring_setup(1) succeeded".to_owned(),
            disabled_sysctl,
        };
    }
    let error = io::Error::last_os_error();
    let why = match error.raw_os_error() {
        Some(libc::ENOSYS) => "kernel built without io_uring, or a sandbox hides it",
        Some(libc::EPERM) => "kernel.io_uring_disabled or a seccomp filter forbids it",
        Some(libc::ENOMEM) => "RLIMIT_MEMLOCK too small for even one ring",
        _ => "unexpected error",
    };
    IoUring {
        available: false,
        detail: format!("io_uring_setup(1) failed: {error} ({why})"),
        disabled_sysctl,
    }
}

fn probe_memlock(is_root: bool) -> Check<Memlock> {
    let mut limit = MaybeUninit::<libc::rlimit>::uninit();
    // SAFETY: getrlimit writes one `struct rlimit` to the pointer, which
    // points to an uninitialized rlimit owned by this frame.
    let result = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, limit.as_mut_ptr()) };
    if result != 0 {
        return Check::unknown(format!(
            "getrlimit(RLIMIT_MEMLOCK): {}",
            io::Error::last_os_error()
        ));
    }
    // SAFETY: getrlimit returned 0, so it initialized `limit`.
    let limit = unsafe { limit.assume_init() };
    let finite = |value: libc::rlim_t| (value != libc::RLIM_INFINITY).then_some(value);
    let soft_bytes = finite(limit.rlim_cur);
    Check::Ok {
        value: Memlock {
            soft_bytes,
            hard_bytes: finite(limit.rlim_max),
            required_bytes: MEMLOCK_BYTES_MIN,
            sufficient: is_root || soft_bytes.is_none_or(|soft| soft >= MEMLOCK_BYTES_MIN),
        },
    }
}

fn probe_governors(roots: &Roots) -> Check<Vec<CpuGovernor>> {
    let cpu_dir = roots.sys_root.join("devices/system/cpu");
    let entries = match fs::read_dir(&cpu_dir) {
        Ok(entries) => entries,
        Err(error) => return Check::unknown(format!("{}: {error}", cpu_dir.display())),
    };
    let mut cpus: Vec<(u32, String)> = entries
        .filter_map(|entry| entry.ok())
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            let index: u32 = name.strip_prefix("cpu")?.parse().ok()?;
            Some((index, name))
        })
        .take(CPUS_MAX)
        .collect();
    cpus.sort_unstable();
    let mut governors = Vec::new();
    let mut last_reason = String::new();
    for (_, cpu) in cpus {
        let freq_dir = cpu_dir.join(&cpu).join("cpufreq");
        match read_kernel_file(&freq_dir.join("scaling_governor")) {
            Ok(text) => match parse::parse_governor(&text) {
                Some(governor) => {
                    let available = read_kernel_file(&freq_dir.join("scaling_available_governors"))
                        .map(|text| text.split_whitespace().map(str::to_owned).collect())
                        .unwrap_or_default();
                    governors.push(CpuGovernor { cpu, governor, available });
                }
                None => last_reason = format!("{cpu}: unreadable governor {:?}", text.trim()),
            },
            Err(reason) => last_reason = reason,
        }
    }
    if governors.is_empty() {
        let reason = if last_reason.is_empty() {
            format!("no cpuN directories under {}", cpu_dir.display())
        } else {
            format!("no cpufreq governor exposed (typical in VMs): {last_reason}")
        };
        return Check::unknown(reason);
    }
    Check::Ok { value: governors }
}

/// The nearest existing ancestor of `path`, canonicalized, so a data dir that
/// is not created yet is judged by the filesystem it will be created on.
fn existing_ancestor(path: &Path) -> PathBuf {
    let absolute = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().map(|cwd| cwd.join(path)).unwrap_or_else(|_| path.to_path_buf())
    };
    let mut candidate = absolute.as_path();
    loop {
        if let Ok(canonical) = candidate.canonicalize() {
            return canonical;
        }
        match candidate.parent() {
            Some(parent) => candidate = parent,
            None => return PathBuf::from("/"),
        }
    }
}

fn probe_filesystem(path: &Path, roots: &Roots) -> Check<Filesystem> {
    let mounts_path = roots.proc_root.join("mounts");
    let mounts = match read_kernel_file(&mounts_path) {
        Ok(text) => parse::parse_mounts(&text),
        Err(reason) => return Check::unknown(reason),
    };
    let Some(mount) = parse::mount_for_path(&mounts, path) else {
        return Check::unknown(format!(
            "no entry of {} holds {}",
            mounts_path.display(),
            path.display()
        ));
    };
    let (free_bytes, total_bytes) = match statvfs_bytes(path) {
        Ok(sizes) => sizes,
        Err(error) => return Check::unknown(format!("statvfs({}): {error}", path.display())),
    };
    Check::Ok {
        value: Filesystem {
            mount_point: mount.target.clone(),
            source: mount.source.clone(),
            fstype: mount.fstype.clone(),
            free_bytes,
            total_bytes,
        },
    }
}

/// (bytes available to unprivileged users, total bytes).
fn statvfs_bytes(path: &Path) -> io::Result<(u64, u64)> {
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))?;
    let mut stats = MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c_path` is a NUL-terminated string alive for the call, and
    // statvfs writes one `struct statvfs` to a buffer of exactly that type.
    let result = unsafe { libc::statvfs(c_path.as_ptr(), stats.as_mut_ptr()) };
    if result != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so it initialized `stats`.
    let stats = unsafe { stats.assume_init() };
    let fragment = stats.f_frsize;
    Ok((stats.f_bavail.saturating_mul(fragment), stats.f_blocks.saturating_mul(fragment)))
}

fn probe_block_device(path: &Path, roots: &Roots) -> Check<BlockDevice> {
    let metadata = match fs::metadata(path) {
        Ok(metadata) => metadata,
        Err(error) => return Check::unknown(format!("stat({}): {error}", path.display())),
    };
    let dev = metadata.dev();
    block_device_for(&roots.sys_root, libc::major(dev), libc::minor(dev))
}

/// Resolves a device number to its whole disk under `sys_root` and reads its
/// queue settings. A partition's queue belongs to its parent disk.
pub fn block_device_for(sys_root: &Path, major: u32, minor: u32) -> Check<BlockDevice> {
    let dev = format!("{major}:{minor}");
    let link = sys_root.join("dev/block").join(&dev);
    let device_dir = match link.canonicalize() {
        Ok(dir) => dir,
        Err(error) => {
            let hint = if major == 0 {
                " (major 0: a virtual filesystem such as tmpfs or overlay has no block device)"
            } else {
                ""
            };
            return Check::unknown(format!("{}: {error}{hint}", link.display()));
        }
    };
    let disk_dir = if device_dir.join("partition").exists() {
        match device_dir.parent() {
            Some(parent) => parent.to_path_buf(),
            None => return Check::unknown(format!("{} has no parent disk", device_dir.display())),
        }
    } else {
        device_dir
    };
    let Some(name) = disk_dir.file_name().map(|name| name.to_string_lossy().into_owned()) else {
        return Check::unknown(format!("{} has no name", disk_dir.display()));
    };
    let queue = disk_dir.join("queue");
    let scheduler = match read_kernel_file(&queue.join("scheduler")) {
        Ok(text) => match parse::parse_scheduler(&text) {
            Some(scheduler) => Check::Ok { value: scheduler },
            None => Check::unknown(format!("no active scheduler in {:?}", text.trim())),
        },
        Err(reason) => Check::unknown(reason),
    };
    let rotational = match read_u64(&queue.join("rotational")) {
        Check::Ok { value } => Check::Ok { value: value != 0 },
        Check::Unknown { reason } => Check::Unknown { reason },
    };
    Check::Ok {
        value: BlockDevice {
            is_nvme: name.starts_with("nvme"),
            name,
            dev,
            scheduler,
            logical_block_bytes: read_u64(&queue.join("logical_block_size")),
            rotational,
        },
    }
}

fn probe_sysctls(roots: &Roots) -> Vec<Sysctl> {
    ["vm.dirty_background_bytes", "vm.dirty_bytes", "vm.dirty_background_ratio", "vm.dirty_ratio"]
        .into_iter()
        .map(|name| {
            let relative = format!("sys/{}", name.replace('.', "/"));
            Sysctl {
                name: name.to_owned(),
                path: format!("/proc/{relative}"),
                value: read_u64(&roots.proc_root.join(relative)),
            }
        })
        .collect()
}
