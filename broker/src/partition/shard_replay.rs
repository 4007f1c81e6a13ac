//! The shard journal's ordered replay at start
//! (`docs/design/shard-journal.md` §5): every partition of the shard that
//! the handles table knows has its checkpoint restored, then **one** pass
//! reads the entries they replay in journal order and folds each into its
//! partition's state. The partitions' opens then take those states
//! ([`JournalReplayed`]) and only run the epoch fence.
//!
//! Why: a partition's own replay reads the entries routed to it, and on a
//! shard of many partitions those lie scattered across the whole journal
//! between the other partitions' entries; each read fetches a chunk of
//! [`crate::limits::JOURNAL_READ_CHUNK_BYTES`] around its entry, so
//! partitions replaying one after another (or a few dozen at once) read
//! the same chunks again and again — 1,000 partitions with a 900 MB
//! backlog read ≈ 60 GB and peaked at 7 GiB. In journal order each chunk is
//! read once, and at most [`REPLAY_READ_BYTES`] of entries are held.
//!
//! Nothing here decides anything the open does not: a partition whose
//! checkpoint does not restore, or whose entries do not apply, is left out
//! of the result, and its own open meets the same error and refuses it as
//! before; a read that fails leaves every partition to its own open. The
//! epoch is not known yet (the open bumps it): states are restored with
//! epoch 0 and the open sets the new one, which replay never reads.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use futures_util::StreamExt;
use spool_wire::proto::PartitionId;

use super::log::ReplayCursor;
use super::open::{restore_journal_state, JournalReplayed, ReplayFold};
use super::{LogCursor, PartitionError, REPLAY_READ_BYTES};
use crate::io::Storage;
use crate::limits::PARTITION_OPENS_CONCURRENT;
use crate::log::journal::{Journal, JournalPos, PartitionHandle, RoutedEntry};
use crate::queue::{LeaderEpoch, Offset, PartitionContext, PartitionState, QueueConfig, QueueId};

/// A partition the ordered pass replays.
#[derive(Clone, Debug)]
pub struct ShardReplayTarget {
    pub handle: PartitionHandle,
    pub dir: PathBuf,
    pub queue: QueueId,
    pub partition: PartitionId,
    pub config: QueueConfig,
}

/// What the ordered pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShardReplayReport {
    /// Partitions asked for.
    pub partitions: usize,
    /// Partitions replayed (their opens take the result).
    pub replayed: usize,
    /// Partitions left to their own open: the checkpoint did not restore
    /// or an entry did not apply (the open refuses them, naming why).
    pub left_to_open: usize,
    /// Entries read and handed to their partition.
    pub entries: u64,
    /// Entry bytes (headers included) of those entries.
    pub entry_bytes: u64,
    /// Events folded into the states.
    pub events: u64,
    /// A journal read failed: nothing was replayed here, every partition
    /// replays on its own at open.
    pub read_failed: Option<String>,
}

/// One partition while the pass runs.
struct Folding {
    target: ShardReplayTarget,
    state: PartitionState,
    covers: Option<Offset>,
    replay_from: LogCursor,
    cursor: ReplayCursor,
    fold: ReplayFold,
}

/// Restores every target's checkpoint (up to [`PARTITION_OPENS_CONCURRENT`]
/// at once), then replays, in journal order and reading each chunk of the
/// journal once, the entries `routed` holds for them past their
/// checkpoints. Returns the replayed states by handle, for the partitions'
/// opens.
pub async fn replay_journal_shard<S: Storage + Clone>(
    storage: &S,
    journal: &Journal<S>,
    routed: &BTreeMap<PartitionHandle, Vec<RoutedEntry>>,
    targets: Vec<ShardReplayTarget>,
    secret: [u8; 32],
) -> (HashMap<PartitionHandle, JournalReplayed>, ShardReplayReport) {
    let mut report = ShardReplayReport { partitions: targets.len(), ..Default::default() };
    let restored: Vec<Option<Folding>> = futures_util::stream::iter(targets)
        .map(|target| {
            let storage = storage.clone();
            async move {
                let context = PartitionContext {
                    queue: target.queue,
                    partition: target.partition,
                    epoch: LeaderEpoch(0),
                    secret,
                    config: target.config.clone(),
                };
                match restore_journal_state(&storage, &target.dir, context).await {
                    Ok((state, covers, replay_from)) => Some(Folding {
                        target,
                        state,
                        covers,
                        replay_from,
                        cursor: ReplayCursor::new(replay_from),
                        fold: ReplayFold::default(),
                    }),
                    Err(error) => {
                        left_out(&target, &error);
                        None
                    }
                }
            }
        })
        .buffered(PARTITION_OPENS_CONCURRENT)
        .collect()
        .await;
    let mut folding = restored;
    // Every entry replayed, of every partition, in journal order.
    let mut order: Vec<(JournalPos, u32, u32)> = Vec::new();
    for (index, part) in folding.iter().enumerate() {
        let Some(part) = part else { continue };
        let Some(entries) = routed.get(&part.target.handle) else { continue };
        let index = u32::try_from(index).unwrap_or(u32::MAX);
        order.extend(entries.iter().filter(|entry| part.replay_from.journal_replays(entry)).map(
            |entry| {
                let bytes = entry.entry_len;
                (entry.position, index, bytes)
            },
        ));
    }
    order.sort_unstable_by_key(|(position, _, _)| *position);
    let mut done = 0;
    while done < order.len() {
        let mut total = 0u64;
        let mut end = done;
        while end < order.len() && (end == done || total < REPLAY_READ_BYTES) {
            total += u64::from(order[end].2);
            end += 1;
        }
        let positions: Vec<JournalPos> =
            order[done..end].iter().map(|(position, _, _)| *position).collect();
        let batches = match journal.read_entries(&positions, total).await {
            Ok(batches) => batches,
            Err(error) => {
                tracing::warn!(dir = %journal.dir().display(), %error,
                    "the shard's ordered replay could not read its journal; each partition \
                     replays on its own");
                report.read_failed = Some(error.to_string());
                return (HashMap::new(), report);
            }
        };
        for ((_, index, bytes), batch) in order[done..end].iter().zip(&batches) {
            report.entries += 1;
            report.entry_bytes += u64::from(*bytes);
            let slot = &mut folding[*index as usize];
            let Some(part) = slot else { continue };
            let Some(apply_from) = part.cursor.admit(&batch.header) else { continue };
            if let Err(error) =
                part.fold.apply(&mut part.state, batch, apply_from, &part.target.dir)
            {
                left_out(&part.target, &error);
                *slot = None;
            }
        }
        done = end;
    }
    let mut replayed = HashMap::with_capacity(folding.len());
    for part in folding {
        let Some(mut part) = part else {
            report.left_to_open += 1;
            continue;
        };
        let (batches, events) = part.fold.finish(&mut part.state);
        report.events += events;
        replayed.insert(
            part.target.handle,
            JournalReplayed {
                config: part.target.config,
                state: part.state,
                covers: part.covers,
                replay_from: part.replay_from,
                batches,
                events,
            },
        );
    }
    report.replayed = replayed.len();
    (replayed, report)
}

/// A partition the pass leaves to its own open, which meets `error` again
/// and reports it.
fn left_out(target: &ShardReplayTarget, error: &PartitionError) {
    tracing::debug!(queue_id = target.queue.0, partition = target.partition.0, %error,
        "left to the partition's own open");
}
