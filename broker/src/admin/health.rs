//! `GET /health/ready`: every partition the committed table assigns is open
//! on its shard and serving; otherwise the list of those that are not, and
//! why. On a cluster node: every partition this node holds a replica of
//! knows its leader (none known: an election is under way, or this node is
//! cut off from its peers); a partition it holds no replica of is not
//! opened here and not asked for. Pure: the table and the reports come in
//! as arguments.

use std::fmt::Write as _;

use crate::control::assignment::{AssignmentTable, PartitionId};
use crate::net::memory::PoolStats;
use crate::shard::report::ShardReport;

/// Readiness: `Ok(summary)` when ready, `Err(reasons)` (one line each)
/// when not.
///
/// `missing` are the shards that did not report in time; `stopping` is the
/// broker draining; `admin_memory` the admin port's pool, listed after the
/// shards' pools.
pub fn readiness(
    table: &AssignmentTable,
    reports: &[ShardReport],
    missing: &[u16],
    stopping: bool,
    admin_memory: &PoolStats,
) -> Result<String, Vec<String>> {
    let mut reasons = Vec::new();
    if stopping {
        reasons.push("the broker is stopping".to_owned());
    }
    for shard in missing {
        reasons.push(format!("shard {shard} did not report in time"));
    }
    let mut partitions = 0usize;
    for (name, entry) in table.queues() {
        for (index, assignment) in entry.partitions.iter().enumerate() {
            partitions += 1;
            let partition = PartitionId(u32::try_from(index).unwrap_or(u32::MAX));
            let Some(report) = reports.iter().find(|report| report.shard == assignment.shard)
            else {
                // Reported above as a missing shard.
                continue;
            };
            let queue = name.as_str();
            if let Some(refused) = report
                .refused
                .iter()
                .find(|refused| refused.queue == queue && refused.partition == partition)
            {
                reasons.push(format!(
                    "partition {queue}/{partition} on shard {} refused to open: {}",
                    assignment.shard.0, refused.reason
                ));
            } else if let Some(open) = report
                .partitions
                .iter()
                .find(|open| open.queue == queue && open.partition == partition)
            {
                if open.replica.is_some_and(|role| role.leader == 0) {
                    reasons.push(format!(
                        "partition {queue}/{partition} on shard {} knows no leader (an \
                         election is under way, or this node is cut off from its peers)",
                        assignment.shard.0
                    ));
                }
            } else if report.replication.is_none() {
                // A cluster node opens only the partitions it holds a
                // replica of.
                reasons.push(format!(
                    "partition {queue}/{partition} is not open yet on shard {}",
                    assignment.shard.0
                ));
            }
        }
    }
    if reasons.is_empty() {
        let mut summary = String::new();
        let _ = write!(
            summary,
            "ready: {} shards, {} queues, {partitions} partitions open",
            reports.len(),
            table.queues().count()
        );
        // Each shard's memory pools: used of size (`net/memory.rs`), then
        // the admin port's (`admin/memory.rs`).
        let pool = |summary: &mut String, pool: &str, stats: &PoolStats| {
            let _ = write!(
                summary,
                " {pool} {} of {} KiB (peak {}, waits {}, refusals {});",
                stats.used_bytes / 1024,
                stats.size_bytes / 1024,
                stats.peak_bytes / 1024,
                stats.waits,
                stats.refusals
            );
        };
        for report in reports {
            let _ = write!(summary, "\nshard {} memory:", report.shard.0);
            for (name, stats) in &report.memory {
                pool(&mut summary, name, stats);
            }
        }
        summary.push_str("\nadmin memory:");
        pool(&mut summary, super::memory::ADMIN_POOL, admin_memory);
        Ok(summary)
    } else {
        Err(reasons)
    }
}
