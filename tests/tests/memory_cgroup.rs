// Goal: a broker in a memory-limited cgroup takes its budget from the
// cgroup's limit and is not OOM-killed by clients that would need more
// memory than the cgroup has: 160 connections each start a 4 MiB frame
// (640 MiB of read buffers unbounded) inside a 512 MiB cgroup, and a
// well-behaved client beside them still completes its round trips.
//
// Method: a child of this process's memory cgroup (v2 `memory.max`, or v1
// `memory.limit_in_bytes`) limited to 512 MiB; `spoold` started through a
// two-line script that moves itself into it and execs the binary, with no
// `--memory-bytes`, so the default (half the lower of the machine and the
// cgroup) is under test. Afterwards the cgroup's OOM-kill count and the
// process itself are checked.
//
// How it can fail: a default that ignores the cgroup gives a pool of the
// machine's size (the budget check fails); with the read buffers unbounded
// the kernel kills spoold (its metrics stop answering, oom_kill counts 1:
// seen with `--memory-bytes` set far above the cgroup).
//
// Skipped (with a printed reason) when not root or without a writable
// memory cgroup, as the loop-mount fault tests are without root.

#![allow(clippy::unwrap_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use spool_tests::admin::{http_get, Exposition};
use spool_tests::fault::{good_round_trip, hold_unfinished_frames, message_id, warmed_good_client};
use spool_tests::{spoold_bin, Spoold, SpooldOptions};

const QUEUE: &str = "cgroup";
const CGROUP_LIMIT_BYTES: u64 = 512 << 20;
const FRAME_BYTES: u32 = 4 << 20;
const HOSTILE_CONNECTIONS: usize = 160;
const ROUND_TRIPS: u64 = 20;
const ROUND_TRIP_MAX: Duration = Duration::from_secs(2);

/// A memory cgroup made for one test, removed when dropped.
struct Cgroup {
    dir: PathBuf,
    /// The file that limits it and the file that counts its OOM kills.
    limit_file: &'static str,
    events_file: &'static str,
}

impl Cgroup {
    /// A child of this process's memory cgroup, limited to `bytes`.
    fn create(bytes: u64) -> Result<Cgroup, String> {
        let membership = std::fs::read_to_string("/proc/self/cgroup")
            .map_err(|error| format!("/proc/self/cgroup: {error}"))?;
        let name = format!("spool-e2e-{}", std::process::id());
        for line in membership.lines() {
            let mut parts = line.splitn(3, ':');
            let (Some(_), Some(controllers), Some(path)) =
                (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let relative = path.trim_start_matches('/');
            let (parent, limit_file, events_file) = if controllers.is_empty() {
                (Path::new("/sys/fs/cgroup").join(relative), "memory.max", "memory.events")
            } else if controllers.split(',').any(|c| c == "memory") {
                (
                    Path::new("/sys/fs/cgroup/memory").join(relative),
                    "memory.limit_in_bytes",
                    "memory.oom_control",
                )
            } else {
                continue;
            };
            if !parent.join(limit_file).exists() {
                continue;
            }
            let dir = parent.join(&name);
            std::fs::create_dir_all(&dir).map_err(|error| format!("{}: {error}", dir.display()))?;
            std::fs::write(dir.join(limit_file), bytes.to_string())
                .map_err(|error| format!("{}: {error}", dir.join(limit_file).display()))?;
            return Ok(Cgroup { dir, limit_file, events_file });
        }
        Err(format!("no writable memory cgroup in {membership:?}"))
    }

    /// OOM kills in the cgroup (`oom_kill N` in its events file).
    fn oom_kills(&self) -> u64 {
        let text = std::fs::read_to_string(self.dir.join(self.events_file)).unwrap_or_default();
        text.lines()
            .find_map(|line| line.strip_prefix("oom_kill "))
            .and_then(|count| count.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // Empty once spoold is gone (killed and reaped before this drop).
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("cgroup {} ({}) left behind", self.dir.display(), self.limit_file);
    }
}

fn pool(broker: &Spoold, figure: &str) -> Option<f64> {
    let page = http_get(&broker.admin_addr(), "/metrics");
    if page.status != 200 {
        return None;
    }
    Exposition::parse(&page.body).ok()?.value(figure, &[("shard", "0"), ("pool", "requests")])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broker_in_a_memory_cgroup_budgets_from_it_and_is_not_oom_killed() {
    let cgroup = Cgroup::create(CGROUP_LIMIT_BYTES)
        .unwrap_or_else(|why| panic!("this test needs root and a writable memory cgroup: {why}"));
    let scratch = tempfile::tempdir().unwrap();
    let script = scratch.path().join("spoold-in-cgroup");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho $$ > {}/cgroup.procs || exit 90\nexec {} \"$@\"\n",
            cgroup.dir.display(),
            spoold_bin().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut options = SpooldOptions::new(1);
    options.bin = Some(script);
    options.args = vec!["--frame-bytes-max".into(), (FRAME_BYTES + 4096).to_string()];
    let broker = Spoold::start_with(options);
    // The default budget: half the cgroup's limit (the machine has more);
    // the one shard's requests pool is a quarter of what the admin port's
    // pool (5 % of the budget, above its 8 MiB floor) leaves.
    let budget = CGROUP_LIMIT_BYTES / 2;
    let expected = ((budget - budget / 100 * 5) / 100 * 25) as f64;
    assert_eq!(pool(&broker, "spool_shard_memory_budget_bytes"), Some(expected));
    let (client, producer) = warmed_good_client(&broker, QUEUE).await;

    let hostile = hold_unfinished_frames(&broker.addr(), HOSTILE_CONNECTIONS, FRAME_BYTES, false);
    spool_tests::events::wait_for_metric(
        &broker,
        "spool_shard_memory_waits_total",
        "connections waiting for the requests pool",
        |waits| waits >= 1.0,
    )
    .await;
    let mut slowest = Duration::ZERO;
    for round in 0..ROUND_TRIPS {
        let took = good_round_trip(&client, &producer, QUEUE, message_id(1, round), round).await;
        slowest = slowest.max(took);
    }
    let rss_kib = broker.rss_kib();
    eprintln!(
        "RSS {rss_kib:?} KiB in a {CGROUP_LIMIT_BYTES}-byte cgroup; slowest round trip {slowest:?}"
    );
    assert!(slowest < ROUND_TRIP_MAX, "a good round trip took {slowest:?}");
    assert!(pool(&broker, "spool_shard_memory_used_bytes").is_some(), "spoold stopped answering");
    assert_eq!(cgroup.oom_kills(), 0, "the kernel OOM-killed in the broker's cgroup");
    for task in hostile {
        task.abort();
    }
    drop(broker);
    drop(cgroup);
}
