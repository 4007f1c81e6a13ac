//! Host checks on fake /proc and /sys trees and fabricated reports.

use std::fs;
use std::path::Path;

use super::*;

fn write(path: &Path, text: &str) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, text).unwrap();
}

/// A sysfs tree with disk `vda` (254:0) holding partition `vda1` (254:1).
fn fake_sys(root: &Path, scheduler: &str) {
    let disk = root.join("devices/pci0000:00/virtio1/block/vda");
    write(&disk.join("queue/scheduler"), scheduler);
    write(&disk.join("queue/logical_block_size"), "512\n");
    write(&disk.join("queue/rotational"), "0\n");
    write(&disk.join("vda1/partition"), "1\n");
    fs::create_dir_all(root.join("dev/block")).unwrap();
    std::os::unix::fs::symlink(
        "../../devices/pci0000:00/virtio1/block/vda",
        root.join("dev/block/254:0"),
    )
    .unwrap();
    std::os::unix::fs::symlink(
        "../../devices/pci0000:00/virtio1/block/vda/vda1",
        root.join("dev/block/254:1"),
    )
    .unwrap();
}

// Goal: a partition's device number resolves to its whole disk's queue files.
// Method: fake sysfs tree; look up the partition 254:1 and the disk 254:0.
#[test]
fn block_device_resolves_partition_to_disk() {
    let dir = tempfile::tempdir().unwrap();
    fake_sys(dir.path(), "none [mq-deadline] kyber\n");
    for minor in [0, 1] {
        let device = block_device_for(dir.path(), 254, minor);
        let device = device.value().unwrap_or_else(|| panic!("{device:?}"));
        assert_eq!(device.name, "vda");
        assert_eq!(device.dev, format!("254:{minor}"));
        assert_eq!(device.scheduler.value().unwrap().active, "mq-deadline");
        assert_eq!(device.logical_block_bytes, Check::Ok { value: 512 });
        assert_eq!(device.rotational, Check::Ok { value: false });
        assert!(!device.is_nvme);
    }
}

// Goal: a device number absent from sysfs (tmpfs, overlay, containers) is
// "unknown" with a reason, not an error. Method: look up 0:45 in the fake tree.
#[test]
fn missing_block_device_is_unknown_with_reason() {
    let dir = tempfile::tempdir().unwrap();
    fake_sys(dir.path(), "[none]\n");
    match block_device_for(dir.path(), 0, 45) {
        Check::Unknown { reason } => assert!(reason.contains("virtual filesystem"), "{reason}"),
        other => panic!("expected unknown, got {other:?}"),
    }
}

fn report_with(
    scheduler: &str,
    is_nvme: bool,
    governor: &str,
    dirty_bytes: u64,
    memlock_ok: bool,
) -> HostReport {
    HostReport {
        is_root: false,
        io_uring: IoUring {
            available: true,
            detail: String::new(),
            disabled_sysctl: Check::Ok { value: 0 },
        },
        memlock: Check::Ok {
            value: Memlock {
                soft_bytes: Some(if memlock_ok { MEMLOCK_BYTES_MIN } else { 64 * 1024 }),
                hard_bytes: None,
                required_bytes: MEMLOCK_BYTES_MIN,
                sufficient: memlock_ok,
            },
        },
        cpu_count: Check::Ok { value: 2 },
        governors: Check::Ok {
            value: ["cpu0", "cpu1"]
                .map(|cpu| CpuGovernor {
                    cpu: cpu.to_owned(),
                    governor: governor.to_owned(),
                    available: vec!["powersave".to_owned(), "performance".to_owned()],
                })
                .to_vec(),
        },
        data_dir: "/var/lib/spool".to_owned(),
        probed_path: "/var/lib/spool".to_owned(),
        filesystem: Check::unknown("not probed"),
        block_device: Check::Ok {
            value: BlockDevice {
                name: if is_nvme { "nvme0n1" } else { "sda" }.to_owned(),
                dev: "259:0".to_owned(),
                is_nvme,
                scheduler: Check::Ok { value: parse::parse_scheduler(scheduler).unwrap() },
                logical_block_bytes: Check::Ok { value: 4096 },
                rotational: Check::Ok { value: !is_nvme },
            },
        },
        disk: DiskNeed { needed_bytes: 1, free_bytes: None, sufficient: Check::unknown("-") },
        sysctls: vec![
            Sysctl {
                name: "vm.dirty_background_bytes".to_owned(),
                path: "/proc/sys/vm/dirty_background_bytes".to_owned(),
                value: Check::Ok { value: dirty_bytes.min(DIRTY_BACKGROUND_BYTES) },
            },
            Sysctl {
                name: "vm.dirty_bytes".to_owned(),
                path: "/proc/sys/vm/dirty_bytes".to_owned(),
                value: Check::Ok { value: dirty_bytes },
            },
        ],
        changes: Vec::new(),
    }
}

// Goal: an untuned NVMe host gets every change, a tuned one none, and a
// rotational disk keeps its scheduler. Method: plan_changes on fabricated reports.
#[test]
fn changes_follow_the_report() {
    let untuned = plan_changes(&report_with("none [mq-deadline]", true, "powersave", 0, false));
    let settings: Vec<&str> = untuned.iter().map(|change| change.setting.as_str()).collect();
    assert_eq!(
        settings,
        [
            "vm.dirty_background_bytes",
            "vm.dirty_bytes",
            "block scheduler of nvme0n1",
            "cpu frequency governor",
            "RLIMIT_MEMLOCK"
        ]
    );
    assert_eq!(untuned[2].desired, "none");
    assert_eq!(untuned[2].paths, ["/sys/block/nvme0n1/queue/scheduler"]);
    assert_eq!(untuned[3].paths.len(), 2);
    assert_eq!(untuned[3].desired, "performance");
    assert_eq!(untuned[4].how, ApplyHow::Manual);

    let tuned =
        plan_changes(&report_with("[none] mq-deadline", true, "performance", DIRTY_BYTES, true));
    assert!(tuned.is_empty(), "{tuned:?}");

    let spinning =
        plan_changes(&report_with("none [mq-deadline]", false, "performance", DIRTY_BYTES, true));
    assert!(spinning.is_empty(), "{spinning:?}");
}

// Goal: --apply refuses without root and writes nothing. Method: apply_as with
// uid 1000 on a fake tree, then check the file is unchanged.
#[test]
fn apply_refuses_without_root() {
    let dir = tempfile::tempdir().unwrap();
    let roots = Roots { proc_root: dir.path().join("proc"), sys_root: dir.path().join("sys") };
    write(&roots.proc_root.join("sys/vm/dirty_bytes"), "0\n");
    let changes = plan_changes(&report_with("[none]", true, "performance", 0, true));
    let error = apply_as(1000, &changes, &roots).unwrap_err();
    assert!(matches!(error, HostError::NotRoot { euid: 1000 }));
    assert!(error.to_string().contains("needs root"));
    assert_eq!(fs::read_to_string(roots.proc_root.join("sys/vm/dirty_bytes")).unwrap(), "0\n");
}

// Goal: as root, --apply writes each desired value to its (rebased) path,
// reports a missing path as failed and memlock as manual. Method: apply_as(0)
// on a fake tree that lacks the background sysctl file.
#[test]
fn apply_writes_desired_values_under_roots() {
    let dir = tempfile::tempdir().unwrap();
    let roots = Roots { proc_root: dir.path().join("proc"), sys_root: dir.path().join("sys") };
    write(&roots.proc_root.join("sys/vm/dirty_bytes"), "0\n");
    write(&roots.sys_root.join("block/nvme0n1/queue/scheduler"), "none [mq-deadline]\n");
    for cpu in ["cpu0", "cpu1"] {
        write(
            &roots.sys_root.join(format!("devices/system/cpu/{cpu}/cpufreq/scaling_governor")),
            "powersave\n",
        );
    }
    let changes = plan_changes(&report_with("none [mq-deadline]", true, "powersave", 0, false));
    let applied = apply_as(0, &changes, &roots).unwrap();
    let outcome = |setting: &str| -> Vec<&str> {
        applied.iter().filter(|a| a.setting == setting).map(|a| a.outcome.as_str()).collect()
    };
    assert!(outcome("vm.dirty_background_bytes")[0].starts_with("failed"));
    assert_eq!(outcome("vm.dirty_bytes"), ["applied"]);
    assert_eq!(outcome("cpu frequency governor"), ["applied", "applied"]);
    assert!(outcome("RLIMIT_MEMLOCK")[0].starts_with("manual"));
    assert_eq!(
        fs::read_to_string(roots.proc_root.join("sys/vm/dirty_bytes")).unwrap(),
        DIRTY_BYTES.to_string()
    );
    assert_eq!(
        fs::read_to_string(roots.sys_root.join("block/nvme0n1/queue/scheduler")).unwrap(),
        "none"
    );
    assert_eq!(
        fs::read_to_string(roots.sys_root.join("devices/system/cpu/cpu1/cpufreq/scaling_governor"))
            .unwrap(),
        "performance"
    );
}

// Goal: probing the real host never panics and fills in what this machine has.
// Method: probe "." with the real roots; the data dir's filesystem comes from /proc/mounts.
#[test]
fn probe_runs_on_this_host() {
    let report = probe(Path::new("./does/not/exist/yet"), 1, &Roots::default());
    assert!(!report.probed_path.contains("does/not/exist"));
    if let Some(fs) = report.filesystem.value() {
        assert!(!fs.fstype.is_empty());
        assert_eq!(report.disk.free_bytes, Some(fs.free_bytes));
        assert_eq!(report.disk.sufficient, Check::Ok { value: fs.free_bytes >= 1 });
    }
    assert_eq!(report.sysctls.len(), 4);
}
