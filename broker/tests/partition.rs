//! A partition on real files: the state machine wired to its shard journal.
//! Each test drives a partition through glommio with a controlled clock and
//! checks what a restart (close or crash) recovers.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is the failure report

use std::cell::Cell;
use std::future::Future;
use std::path::Path;
use std::rc::Rc;

mod partition_layout;
mod witness_gate;

use glommio::{LocalExecutorBuilder, Placement};
use partition_layout::{open_partition, Layout};
use spool_broker::io::{CrashMode, DmaStorage, SimStorage};
use spool_broker::log::{LogConfig, RecordFatal};
use spool_broker::partition::signal::{ClaimCancel, WaitOwner};
use spool_broker::partition::{
    Clock, EnqueueOutcome, OpenReport, Partition, PartitionError, PartitionName,
};
use spool_broker::queue::{
    ClaimRequest, Lane, Offset, PartitionId, QueueConfig, QueueId, ReleaseReason, WorkerId,
};
use spool_wire::batch::{BatchBytes, DataBatchBuilder, MessageId, Payload, Record};
use spool_wire::ErrorCode;

const START_MS: u64 = 1_700_000_000_000;

fn run<T>(future: impl Future<Output = T>) -> T {
    LocalExecutorBuilder::new(Placement::Unbound)
        .io_memory(0)
        .make()
        .expect("glommio executor")
        .run(future)
}

fn small_log() -> LogConfig {
    LogConfig { segment_bytes: 8 << 20, ..LogConfig::default() }
}

fn clock(now: &Rc<Cell<u64>>) -> Clock {
    let now = now.clone();
    Rc::new(move || now.get())
}

/// A plain record: inline payload, no key, headers, priority or schedule.
fn record(message_id: [u8; 16], payload: Vec<u8>, now_ms: u64) -> Record {
    Record {
        message_id: MessageId(message_id),
        routing_key: vec![],
        headers: vec![],
        payload: Payload::Inline(payload),
        priority: 0,
        not_before_ms: 0,
        expiry_ms: 0,
        enqueue_time_ms: now_ms,
    }
}

fn batch(ids: &[u8], now_ms: u64) -> BatchBytes {
    let mut builder = DataBatchBuilder::new();
    for &id in ids {
        builder.push(&record([id; 16], vec![id; 100], now_ms)).unwrap();
    }
    builder.finish().unwrap()
}

type Opened = (Rc<Partition<DmaStorage>>, glommio::task::JoinHandle<()>);

async fn open(layout: Layout, dir: &Path, now: &Rc<Cell<u64>>, config: QueueConfig) -> Opened {
    let name =
        PartitionName { queue: "jobs".into(), queue_id: QueueId(1), partition: PartitionId(0) };
    let (partition, background, _report) = open_partition(
        layout,
        DmaStorage,
        dir,
        name,
        config,
        small_log(),
        Rc::new(RecordFatal::default()),
        clock(now),
    )
    .await
    .expect("open");
    let task = glommio::spawn_local(background.into_future()).detach();
    (partition, task)
}

async fn close((partition, task): Opened) {
    partition.close().await.expect("close");
    task.await;
}

fn claim_request(credits: u32) -> ClaimRequest {
    ClaimRequest {
        sub: spool_broker::queue::SubscriptionId::DEFAULT,
        worker: WorkerId(9),
        credits,
        max_bytes: 1 << 20,
        lease_ms: Some(30_000),
    }
}

// Every test below that opens with `open` runs on both log layouts.
both_layouts!(
    enqueue_claim_ack_survive_restart_and_old_tokens_are_stale,
    duplicate_enqueue_returns_the_original_offset_and_appends_nothing,
    full_queue_rejects_and_keeps_accepted_work,
    many_small_records_make_a_checkpoint_due_long_before_the_byte_interval,
    a_deep_backlog_waits_for_half_its_size_in_offsets_between_checkpoints,
    checkpoint_then_replay_equals_the_live_state,
    long_poll_claim_wakes_on_enqueue,
    a_token_repeated_in_one_ack_is_acked_once,
    ack_after_close_is_refused_not_acknowledged,
    a_large_claim_from_disk_serves_every_record_its_own_bytes,
    a_cancelled_claim_answers_empty_and_claims_nothing_later,
    next_visit_names_the_timers_the_waits_and_the_sweep_and_changes_touch,
    the_ready_hook_lists_every_claimable_message_through_a_random_history,
);

fn enqueue_claim_ack_survive_restart_and_old_tokens_are_stale(layout: Layout) {
    // Goal: acknowledged enqueues and acks survive a restart; a token from
    // before the restart is stale; claims of the old epoch are released at
    // open (epoch fence), not held until their lease ends. Method: enqueue
    // 5, claim 3, ack 1, close, reopen, check counts, that the old tokens
    // are refused, and that all 4 are claimable at the same instant.
    let dir = tempfile::tempdir().unwrap();
    let now = Rc::new(Cell::new(START_MS));
    run(async move {
        let opened = open(layout, dir.path(), &now, QueueConfig::default()).await;
        let partition = opened.0.clone();
        let epoch_before = partition.epoch();
        let outcomes = partition.enqueue(&batch(&[1, 2, 3, 4, 5], START_MS)).await.unwrap();
        assert_eq!(outcomes.len(), 5);
        assert!(matches!(outcomes[0], EnqueueOutcome::Appended { .. }));
        let claimed = partition.claim(&claim_request(3), Lane::Main, 0).await.unwrap();
        assert_eq!(claimed.len(), 3);
        // The record bytes are exactly what the producer archived.
        let record = spool_wire::batch::validate_record(&claimed[0].record).unwrap();
        match &record.payload {
            spool_wire::batch::ArchivedPayload::Inline(bytes) => assert_eq!(bytes.len(), 100),
            other => panic!("inline payload expected, got {other:?}"),
        }
        let acks = partition.ack(&[claimed[0].delivery.token]).await;
        assert!(acks[0].is_ok());
        close(opened).await;

        let opened = open(layout, dir.path(), &now, QueueConfig::default()).await;
        let partition = opened.0.clone();
        assert!(partition.epoch() > epoch_before, "epoch bumps on every open");
        let counters = partition.counters();
        assert_eq!(counters.live_messages, 4, "1 acked of 5");
        assert_eq!(counters.claimed, 0, "claims of the old epoch are fenced at open");
        // Tokens of the previous epoch are stale, acked or not.
        for item in &claimed {
            let result = partition.ack(&[item.delivery.token]).await;
            let error = result[0].as_ref().unwrap_err();
            assert_eq!(error.code(), ErrorCode::StaleToken, "{error}");
        }
        // Long before the lease ends, the two fenced claims are claimable.
        let again = partition.claim(&claim_request(10), Lane::Main, 0).await.unwrap();
        assert_eq!(again.len(), 4);
        close(opened).await;
    });
}

fn duplicate_enqueue_returns_the_original_offset_and_appends_nothing(layout: Layout) {
    // Goal: dedupe across a restart. Method: enqueue id 1, restart, enqueue
    // id 1 again with id 2; id 1 reports its original offset.
    let dir = tempfile::tempdir().unwrap();
    let now = Rc::new(Cell::new(START_MS));
    run(async move {
        let opened = open(layout, dir.path(), &now, QueueConfig::default()).await;
        let first = opened.0.enqueue(&batch(&[1], START_MS)).await.unwrap();
        let EnqueueOutcome::Appended { offset } = first[0] else { panic!("appended") };
        close(opened).await;
        let opened = open(layout, dir.path(), &now, QueueConfig::default()).await;
        let next = opened.0.log().next_offset();
        let second = opened.0.enqueue(&batch(&[1, 2], START_MS + 10)).await.unwrap();
        assert_eq!(second[0], EnqueueOutcome::Duplicate { original: offset });
        assert!(matches!(second[1], EnqueueOutcome::Appended { .. }));
        assert_eq!(opened.0.log().next_offset().0, next.0 + 1, "only the new record appended");
        assert_eq!(opened.0.counters().live_messages, 2);
        close(opened).await;
    });
}

fn full_queue_rejects_and_keeps_accepted_work(layout: Layout) {
    // Goal: admission. Method: max_messages 3; a batch of 2 then a batch of 2
    // is refused whole with QUEUE_FULL; the first two stay claimable.
    let dir = tempfile::tempdir().unwrap();
    let now = Rc::new(Cell::new(START_MS));
    run(async move {
        let config = QueueConfig { max_messages: 3, ..QueueConfig::default() };
        let opened = open(layout, dir.path(), &now, config).await;
        opened.0.enqueue(&batch(&[1, 2], START_MS)).await.unwrap();
        let refused = opened.0.enqueue(&batch(&[3, 4], START_MS)).await.unwrap_err();
        assert_eq!(refused.code(), ErrorCode::QueueFull);
        assert_eq!(opened.0.counters().live_messages, 2);
        let claimed = opened.0.claim(&claim_request(10), Lane::Main, 0).await.unwrap();
        assert_eq!(claimed.len(), 2);
        close(opened).await;
    });
}

/// Records per [`small_batch`].
const SMALL_BATCH_RECORDS: u64 = 1024;

/// A batch of [`SMALL_BATCH_RECORDS`] records of `body_bytes`, ids `first..`
/// (unique, so dedupe accepts each).
fn small_batch(first: u64, now_ms: u64, body_bytes: usize) -> BatchBytes {
    let mut builder = DataBatchBuilder::new();
    for id in first..first + SMALL_BATCH_RECORDS {
        let mut message_id = [0u8; 16];
        message_id[..8].copy_from_slice(&id.to_le_bytes());
        builder.push(&record(message_id, vec![1; body_bytes], now_ms)).unwrap();
    }
    builder.finish().unwrap()
}

fn many_small_records_make_a_checkpoint_due_long_before_the_byte_interval(layout: Layout) {
    // Goal: replay after a crash stays bounded in events, not only in bytes: a
    // checkpoint falls due after CHECKPOINT_INTERVAL_OFFSETS offsets even when
    // they hold far less than CHECKPOINT_INTERVAL_BYTES. Method: enqueue small
    // records with unique ids just below and then past the offset interval and
    // check `checkpoint_due` flips, then clears once a checkpoint is written.
    use spool_broker::partition::{CHECKPOINT_INTERVAL_BYTES, CHECKPOINT_INTERVAL_OFFSETS};
    const PER_BATCH: u64 = SMALL_BATCH_RECORDS;
    let small_batch = |first, now_ms| small_batch(first, now_ms, 16);
    let dir = tempfile::tempdir().unwrap();
    let now = Rc::new(Cell::new(START_MS));
    run(async move {
        let opened = open(layout, dir.path(), &now, QueueConfig::default()).await;
        let partition = opened.0.clone();
        let batches = CHECKPOINT_INTERVAL_OFFSETS / PER_BATCH;
        let mut written_bytes = 0u64;
        for index in 0..batches - 1 {
            let batch = small_batch(index * PER_BATCH, START_MS);
            written_bytes += batch.len() as u64;
            partition.enqueue(&batch).await.unwrap();
        }
        assert!(!partition.checkpoint_due(), "not due one batch short of the offset interval");
        partition.enqueue(&small_batch((batches - 1) * PER_BATCH, START_MS)).await.unwrap();
        assert!(written_bytes < CHECKPOINT_INTERVAL_BYTES / 16, "far below the byte interval");
        assert!(partition.checkpoint_due(), "due once the offset interval is reached");
        partition.checkpoint().await.unwrap().expect("written");
        assert!(!partition.checkpoint_due(), "a fresh checkpoint resets the interval");
        close(opened).await;
    });
}

fn a_deep_backlog_waits_for_half_its_size_in_offsets_between_checkpoints(layout: Layout) {
    // Goal: a checkpoint snapshots every held message, so a partition holding
    // many waits for more offsets than CHECKPOINT_INTERVAL_OFFSETS between
    // checkpoints (held / CHECKPOINT_INTERVAL_HELD_DIVISOR), and the snapshot
    // work per appended offset stays bounded. Method: hold 4 × the offset
    // interval, checkpoint, append one offset interval more: not due (it was
    // with the fixed interval); append until the growth reaches half of what
    // is held: due; a checkpoint clears it.
    use spool_broker::partition::{
        checkpoint_interval_offsets, CHECKPOINT_INTERVAL_HELD_DIVISOR, CHECKPOINT_INTERVAL_OFFSETS,
    };
    const PER_BATCH: u64 = SMALL_BATCH_RECORDS;
    let small_batch = |first, now_ms| small_batch(first, now_ms, 8);
    assert_eq!(CHECKPOINT_INTERVAL_HELD_DIVISOR, 2, "the counts below assume half");
    assert_eq!(checkpoint_interval_offsets(0), CHECKPOINT_INTERVAL_OFFSETS);
    assert_eq!(
        checkpoint_interval_offsets(10 * CHECKPOINT_INTERVAL_OFFSETS),
        5 * CHECKPOINT_INTERVAL_OFFSETS
    );
    let dir = tempfile::tempdir().unwrap();
    let now = Rc::new(Cell::new(START_MS));
    run(async move {
        let opened = open(layout, dir.path(), &now, QueueConfig::default()).await;
        let partition = opened.0.clone();
        let held = 4 * CHECKPOINT_INTERVAL_OFFSETS;
        let mut next = 0;
        while next < held {
            partition.enqueue(&small_batch(next, START_MS)).await.unwrap();
            next += PER_BATCH;
        }
        partition.checkpoint().await.unwrap().expect("written");
        assert!(!partition.checkpoint_due());
        while next < held + CHECKPOINT_INTERVAL_OFFSETS {
            partition.enqueue(&small_batch(next, START_MS)).await.unwrap();
            next += PER_BATCH;
        }
        assert!(
            !partition.checkpoint_due(),
            "one offset interval past a checkpoint of {held} held messages is not due"
        );
        // Due once the growth g reaches (held + g) / 2, i.e. g = held.
        while next < 2 * held - PER_BATCH {
            partition.enqueue(&small_batch(next, START_MS)).await.unwrap();
            next += PER_BATCH;
        }
        assert!(!partition.checkpoint_due(), "one batch short of half of what is held");
        partition.enqueue(&small_batch(next, START_MS)).await.unwrap();
        assert!(partition.checkpoint_due(), "due at half of what is held");
        partition.checkpoint().await.unwrap().expect("written");
        assert!(!partition.checkpoint_due(), "a fresh checkpoint resets the interval");
        close(opened).await;
    });
}

fn checkpoint_then_replay_equals_the_live_state(layout: Layout) {
    // Goal: recovery from a checkpoint plus the log tail gives the same state
    // as the live partition. Method: mixed operations, checkpoint midway,
    // more operations, compare the message views before close and after open.
    let dir = tempfile::tempdir().unwrap();
    let now = Rc::new(Cell::new(START_MS));
    run(async move {
        let opened = open(layout, dir.path(), &now, QueueConfig::default()).await;
        let partition = opened.0.clone();
        partition.enqueue(&batch(&[1, 2, 3, 4, 5, 6], START_MS)).await.unwrap();
        let claimed = partition.claim(&claim_request(2), Lane::Main, 0).await.unwrap();
        partition.ack(&[claimed[0].delivery.token]).await;
        let covers = partition.checkpoint().await.unwrap().expect("written");
        assert!(covers > Offset(0));
        partition
            .release(&claimed[1].delivery.token, ReleaseReason(7), Some(START_MS + 5_000))
            .await
            .unwrap();
        partition.enqueue(&batch(&[7, 8], START_MS)).await.unwrap();
        let before = partition.with_state(|state| state.messages());
        close(opened).await;

        let opened = open(layout, dir.path(), &now, QueueConfig::default()).await;
        let after = opened.0.with_state(|state| state.messages());
        assert_eq!(before, after);
        opened.0.with_state(|state| state.assert_invariants());
        close(opened).await;
    });
}

fn long_poll_claim_wakes_on_enqueue(layout: Layout) {
    // Goal: a claim with a wait returns as soon as a message arrives.
    // Method: start a waiting claim, enqueue from another task, check it got it.
    let dir = tempfile::tempdir().unwrap();
    let now = Rc::new(Cell::new(START_MS));
    run(async move {
        let opened = open(layout, dir.path(), &now, QueueConfig::default()).await;
        let partition = opened.0.clone();
        let waiter = {
            let partition = partition.clone();
            glommio::spawn_local(async move {
                partition.claim(&claim_request(1), Lane::Main, 60_000).await
            })
        };
        // The claim is waiting (registered) before the message arrives.
        while partition.claims_waiting() == 0 {
            futures_lite::future::yield_now().await;
        }
        partition.enqueue(&batch(&[42], START_MS)).await.unwrap();
        let claimed: Result<Vec<_>, PartitionError> = waiter.await;
        let claimed = claimed.unwrap();
        assert_eq!(claimed.len(), 1);
        assert_eq!(claimed[0].delivery.attempt, 1);
        close(opened).await;
    });
}

fn a_token_repeated_in_one_ack_is_acked_once(layout: Layout) {
    // Goal: one ack per claim even when a request repeats a token. Method:
    // ack [t, t]; the first succeeds, the second is stale; the message is
    // acked exactly once (live count drops by one).
    let dir = tempfile::tempdir().unwrap();
    let now = Rc::new(Cell::new(START_MS));
    run(async move {
        let opened = open(layout, dir.path(), &now, QueueConfig::default()).await;
        opened.0.enqueue(&batch(&[1, 2], START_MS)).await.unwrap();
        let claimed = opened.0.claim(&claim_request(1), Lane::Main, 0).await.unwrap();
        let token = claimed[0].delivery.token;
        let results = opened.0.ack(&[token, token]).await;
        assert!(results[0].is_ok());
        assert_eq!(results[1].as_ref().unwrap_err().code(), ErrorCode::StaleToken);
        assert_eq!(opened.0.counters().live_messages, 1);
        assert_eq!(opened.0.counters().totals.acked, 1);
        close(opened).await;
    });
}

fn ack_after_close_is_refused_not_acknowledged(layout: Layout) {
    // Goal: a closing partition never acknowledges an ack it did not append.
    // Method: claim, close, ack; the ack reports an error and a reopen still
    // has the message (claimed under the old epoch: the fence makes it ready).
    let dir = tempfile::tempdir().unwrap();
    let now = Rc::new(Cell::new(START_MS));
    run(async move {
        let opened = open(layout, dir.path(), &now, QueueConfig::default()).await;
        opened.0.enqueue(&batch(&[1], START_MS)).await.unwrap();
        let claimed = opened.0.claim(&claim_request(1), Lane::Main, 0).await.unwrap();
        let partition = opened.0.clone();
        close(opened).await;
        let results = partition.ack(&[claimed[0].delivery.token]).await;
        assert_eq!(results[0].as_ref().unwrap_err().code(), ErrorCode::ShuttingDown);
        drop(partition);
        let reopened = open(layout, dir.path(), &now, QueueConfig::default()).await;
        assert_eq!(reopened.0.counters().live_messages, 1, "the unacknowledged ack was not kept");
        close(reopened).await;
    });
}

/// A data batch of records `first..first + count`, each with a message id
/// and a payload derived from its number (so a record served for the wrong
/// offset is caught).
fn numbered_batch(first: u16, count: u16, now_ms: u64) -> BatchBytes {
    let mut builder = DataBatchBuilder::new();
    for number in first..first + count {
        builder.push(&numbered_record(number, now_ms)).unwrap();
    }
    builder.finish().unwrap()
}

fn numbered_record(number: u16, now_ms: u64) -> Record {
    let mut id = [0u8; 16];
    id[..2].copy_from_slice(&number.to_be_bytes());
    record(id, (0..200u16).map(|i| (number ^ i) as u8).collect(), now_ms)
}

fn a_large_claim_from_disk_serves_every_record_its_own_bytes(layout: Layout) {
    // Goal: a claim reads its records ahead in one log read (not one per
    // batch) and still serves each delivery the bytes of its own record,
    // across batches, control batches interleaved between them, and gaps
    // left by acked messages. Method: 40 batches of 10 records, a claim of
    // 3 and their ack after every 5th batch; close and reopen (nothing in
    // the tail cache: records come from the segment file); claim all with
    // one request; every delivery's record must carry the id and payload
    // of the message at its offset.
    let dir = tempfile::tempdir().unwrap();
    let now = Rc::new(Cell::new(START_MS));
    run(async move {
        let opened = open(layout, dir.path(), &now, QueueConfig::default()).await;
        let partition = opened.0.clone();
        let mut acked = 0;
        for index in 0..40u16 {
            let outcomes = partition.enqueue(&numbered_batch(index * 10, 10, START_MS)).await;
            assert_eq!(outcomes.unwrap().len(), 10);
            if index % 5 == 4 {
                let claimed = partition.claim(&claim_request(3), Lane::Main, 0).await.unwrap();
                let tokens: Vec<_> = claimed.iter().map(|c| c.delivery.token).collect();
                assert!(partition.ack(&tokens).await.iter().all(Result::is_ok));
                acked += claimed.len();
            }
        }
        close(opened).await;

        let opened = open(layout, dir.path(), &now, QueueConfig::default()).await;
        let partition = opened.0.clone();
        let request = ClaimRequest { max_bytes: 4 << 20, ..claim_request(1_000) };
        let claimed = partition.claim(&request, Lane::Main, 0).await.unwrap();
        assert_eq!(claimed.len(), 400 - acked);
        let mut offsets = Vec::new();
        for item in &claimed {
            let record = spool_wire::batch::validate_record(&item.record).unwrap();
            let number = u16::from_be_bytes([record.message_id.0[0], record.message_id.0[1]]);
            let expected = numbered_record(number, START_MS);
            match (&record.payload, &expected.payload) {
                (spool_wire::batch::ArchivedPayload::Inline(got), Payload::Inline(want)) => {
                    assert_eq!(got.as_slice(), want.as_slice(), "payload of record {number}");
                }
                (other, _) => panic!("inline payload expected, got {other:?}"),
            }
            offsets.push(item.delivery.offset.0);
        }
        // Offsets number data records only (control entries take none), and
        // the acked ones are the oldest: the rest are dense.
        assert_eq!(offsets, (acked as u64..400).collect::<Vec<_>>());
        close(opened).await;
    });
}

fn a_cancelled_claim_answers_empty_and_claims_nothing_later(layout: Layout) {
    // Goal: a waiting claim whose cancel handle fires (the protocol's
    // CancelClaim) returns empty at once and never claims what arrives
    // afterwards; a cancel that comes before the claim looks claims nothing
    // even with a message ready; once a claim decided its deliveries, a
    // cancel is refused. Method: the clock stands still, so only the cancel
    // can end the first wait; enqueue after it and check that a plain claim
    // then gets the message on its first attempt.
    let dir = tempfile::tempdir().unwrap();
    let now = Rc::new(Cell::new(START_MS));
    run(async move {
        let opened = open(layout, dir.path(), &now, QueueConfig::default()).await;
        let partition = opened.0.clone();
        let cancel = Rc::new(ClaimCancel::default());
        let waiter = {
            let (partition, cancel) = (partition.clone(), cancel.clone());
            glommio::spawn_local(async move {
                let waiting = Cell::new(0);
                let owner = WaitOwner { id: 1, waiting: &waiting, waiting_max: 4 };
                let never = std::future::pending();
                let request = claim_request(1);
                partition.claim_as(&request, Lane::Main, 60_000, owner, never, &cancel).await
            })
            .detach()
        };
        while partition.claims_waiting() == 0 {
            glommio::executor().yield_now().await;
        }
        assert!(cancel.cancel());
        let answered = waiter.await.unwrap().unwrap();
        assert!(answered.is_empty(), "a cancelled claim answers empty");
        assert_eq!(partition.claims_waiting(), 0, "its waiter slot is given back");

        partition.enqueue(&batch(&[1], START_MS)).await.unwrap();
        // Cancelled before it looks: nothing claimed although a message is ready.
        let early = ClaimCancel::default();
        assert!(early.cancel());
        let waiting = Cell::new(0);
        let owner = WaitOwner { id: 2, waiting: &waiting, waiting_max: 4 };
        let never = std::future::pending();
        let nothing =
            partition.claim_as(&claim_request(1), Lane::Main, 0, owner, never, &early).await;
        assert!(nothing.unwrap().is_empty());

        // The message was never claimed: its first delivery is attempt 1.
        let open_cancel = ClaimCancel::default();
        let owner = WaitOwner { id: 3, waiting: &waiting, waiting_max: 4 };
        let never = std::future::pending();
        let claimed = partition
            .claim_as(&claim_request(1), Lane::Main, 1_000, owner, never, &open_cancel)
            .await
            .unwrap();
        assert_eq!(claimed.len(), 1);
        assert_eq!(claimed[0].delivery.attempt, 1);
        assert!(!open_cancel.cancel(), "a claim that decided cannot be cancelled");
        close(opened).await;
    });
}

/// A batch of `count` 16-byte records with ids `first..first + count`.
fn unique_batch(first: u64, count: u64, now_ms: u64) -> BatchBytes {
    let mut builder = DataBatchBuilder::new();
    for id in first..first + count {
        let mut message_id = [0u8; 16];
        message_id[..8].copy_from_slice(&id.to_le_bytes());
        builder.push(&record(message_id, vec![1; 16], now_ms)).unwrap();
    }
    builder.finish().unwrap()
}

type SimOpened = (Rc<Partition<SimStorage>>, glommio::task::JoinHandle<()>, OpenReport);

async fn open_sim(disk: &SimStorage, now: &Rc<Cell<u64>>) -> SimOpened {
    let name =
        PartitionName { queue: "jobs".into(), queue_id: QueueId(1), partition: PartitionId(0) };
    let (partition, background, report) = open_partition(
        Layout::Journal,
        disk.clone(),
        Path::new("/data/p0"),
        name,
        QueueConfig::default(),
        small_log(),
        Rc::new(RecordFatal::default()),
        clock(now),
    )
    .await
    .expect("open");
    let task = glommio::spawn_local(background.into_future()).detach();
    (partition, task, report)
}

#[test]
fn claims_ride_the_next_commit_someone_waits_for_and_a_crash_meanwhile_loses_only_them() {
    // Goal: with the shard journal's commit delay (the broker sets
    // `COMMIT_DELAY_MS`), a claim, which replies
    // without its own sync, costs no commit of its own: its events are
    // written with the next commit someone waits for (an ack, an enqueue).
    // A crash while they are held loses only them: after reopen the
    // message is ready at once (not after its lease), the lost claim's
    // token is stale, and the acked message never comes back. Method:
    // SimStorage, a commit delay the test never ends, the journal's commit
    // count around each request, a crash image while a claim is held.
    let now = Rc::new(Cell::new(START_MS));
    run(async move {
        let disk = SimStorage::new();
        let (partition, _task, _) = open_sim(&disk, &now).await;
        let gate = Rc::new(witness_gate::Gate::default());
        let journal = partition.log().journal().shard().journal();
        journal.set_commit_delay(gate.delay());
        let settle = || async {
            for _ in 0..300 {
                futures_lite::future::yield_now().await;
            }
        };
        partition.enqueue(&batch(&[1, 2, 3], START_MS)).await.unwrap();
        let commits = || journal.stats().commits;
        let start = commits();
        let first = partition.claim(&claim_request(1), Lane::Main, 0).await.unwrap();
        assert_eq!(first.len(), 1);
        settle().await;
        assert_eq!(commits(), start, "the claim is held, not committed");
        assert!(partition.ack(&[first[0].delivery.token]).await[0].is_ok());
        assert_eq!(commits(), start + 1, "one commit carried the claim and the ack");

        let second = partition.claim(&claim_request(1), Lane::Main, 0).await.unwrap();
        assert_eq!(second.len(), 1);
        settle().await;
        assert_eq!(commits(), start + 1, "the second claim is held");
        let crashed = disk.crash_image(CrashMode::AllWritten);
        partition.enqueue(&batch(&[4], START_MS)).await.unwrap();
        assert_eq!(commits(), start + 2, "the enqueue's commit carried the held claim");
        assert_eq!(gate.made.get(), 2, "one delay per held commit, none ran out");

        // The crash lost the held claim's events and nothing else.
        let (reopened, _reopened_task, _) = open_sim(&crashed, &now).await;
        assert_eq!(reopened.counters().live_messages, 2, "message 1 stays acked");
        let stale = reopened.ack(&[second[0].delivery.token]).await;
        assert_eq!(stale[0].as_ref().unwrap_err().code(), ErrorCode::StaleToken);
        let again = reopened.claim(&claim_request(3), Lane::Main, 0).await.unwrap();
        let mut ids: Vec<u8> = again
            .iter()
            .map(|claimed| {
                let record = spool_wire::batch::validate_record(&claimed.record).unwrap();
                record.message_id.0[0]
            })
            .collect();
        ids.sort_unstable();
        assert_eq!(ids, vec![2, 3], "the lost claim's message is ready at once");
    });
}

#[test]
fn a_large_checkpoint_runs_in_bounded_steps_while_the_partition_serves() {
    // Goal: a checkpoint of a large state never holds the shard for more
    // than CHECKPOINT_STEP_ENTRIES entries: it yields between steps, the
    // partition enqueues, claims, acks and releases meanwhile (also
    // messages the checkpoint covers), and the checkpoint still describes
    // the state of the moment it began, so a crash after it recovers the
    // live state from it plus the log. Method: 40,000 messages on the
    // simulator; a checkpoint task runs while this task loops on requests
    // until it ends; check its step count and largest step (test hook
    // `last_checkpoint`), that requests completed while it ran and touched
    // covered messages, then open a crash image and compare every message.
    use spool_broker::partition::CHECKPOINT_STEP_ENTRIES;
    const BACKLOG: u64 = 40_000;
    let now = Rc::new(Cell::new(START_MS));
    run(async move {
        let disk = SimStorage::new();
        let (partition, _task, _) = open_sim(&disk, &now).await;
        for first in (0..BACKLOG).step_by(4_000) {
            partition.enqueue(&unique_batch(first, 4_000, START_MS)).await.unwrap();
        }
        let mut held = partition.claim(&claim_request(64), Lane::Main, 0).await.unwrap();
        let done = Rc::new(Cell::new(false));
        let checkpoint = glommio::spawn_local({
            let partition = partition.clone();
            let done = done.clone();
            async move {
                let result = partition.checkpoint().await;
                done.set(true);
                result
            }
        });
        let mut served_during = 0u64;
        let mut next_id = BACKLOG;
        while !done.get() {
            partition.enqueue(&unique_batch(next_id, 8, START_MS)).await.unwrap();
            next_id += 8;
            let claimed = partition.claim(&claim_request(3), Lane::Main, 0).await.unwrap();
            let mut tokens: Vec<_> = claimed.iter().map(|c| c.delivery.token).collect();
            tokens.extend(held.pop().map(|c| c.delivery.token));
            let release = tokens.pop().unwrap();
            assert!(partition.ack(&tokens).await.iter().all(Result::is_ok));
            partition.release(&release, ReleaseReason(3), None).await.unwrap();
            if !done.get() {
                served_during += 1;
            }
        }
        let covers = checkpoint.await.unwrap().expect("written");
        for claimed in held {
            partition.ack(&[claimed.delivery.token]).await[0].as_ref().unwrap();
        }
        let stats = partition.last_checkpoint().expect("stats of the checkpoint");
        assert_eq!(stats.covers, covers);
        assert!(served_during > 0, "no request completed while the checkpoint ran");
        assert!(stats.touched > 0, "no covered message changed while it was written");
        assert!(stats.max_step_entries <= CHECKPOINT_STEP_ENTRIES);
        // Fresh entries once, dedupe entries twice (counted, then listed).
        let visited = 3 * BACKLOG as usize - 64;
        assert!(
            stats.steps >= (visited / CHECKPOINT_STEP_ENTRIES) as u64,
            "{} steps for {visited} entries",
            stats.steps
        );
        let before = partition.with_state(|state| state.messages());

        let image = disk.crash_image(CrashMode::DurableOnly);
        let (reopened, _task, report) = open_sim(&image, &now).await;
        assert_eq!(report.checkpoint_covers, Some(covers));
        assert!(report.replayed_events > 0, "the requests after it are replayed");
        assert_eq!(reopened.with_state(|state| state.messages()), before);
        reopened.with_state(|state| state.assert_invariants());
    });
}

#[test]
fn a_crash_at_any_point_of_a_checkpoint_leaves_the_old_or_the_new_one_usable() {
    // Goal: the stepped, streamed checkpoint replaces the previous one
    // atomically: a crash after any write, sync, rename or directory sync
    // of it (or of the segment deletion after it) reopens from the old or
    // the new checkpoint, never a torn one, and recovers every message.
    // Method: a first checkpoint, more requests, then a second checkpoint
    // on the simulator with a hook taking a crash image (synced bytes only,
    // and every completed write) after each mutating operation; open each.
    const BACKLOG: u64 = 20_000;
    let now = Rc::new(Cell::new(START_MS));
    run(async move {
        let disk = SimStorage::new();
        let (partition, _task, _) = open_sim(&disk, &now).await;
        for first in (0..BACKLOG).step_by(5_000) {
            partition.enqueue(&unique_batch(first, 5_000, START_MS)).await.unwrap();
        }
        let claimed = partition.claim(&claim_request(10), Lane::Main, 0).await.unwrap();
        let old = partition.checkpoint().await.unwrap().expect("written");
        partition.enqueue(&unique_batch(BACKLOG, 2_000, START_MS)).await.unwrap();
        for (index, item) in claimed.iter().enumerate() {
            if index % 2 == 0 {
                partition.ack(&[item.delivery.token]).await[0].as_ref().unwrap();
            } else {
                partition.release(&item.delivery.token, ReleaseReason(1), None).await.unwrap();
            }
        }
        // Releases reply before their sync; a peek waits for everything
        // appended so far, so every image below holds them (a release lost
        // in a crash would rightly come back fenced instead).
        partition.peek(spool_broker::queue::SubscriptionId::DEFAULT, Offset(0), 1).await.unwrap();
        let before = partition.with_state(|state| state.messages());
        let images: Rc<std::cell::RefCell<Vec<SimStorage>>> = Rc::default();
        disk.set_hook({
            let images = images.clone();
            move |disk, _op, _count| {
                let mut images = images.borrow_mut();
                images.push(disk.crash_image(CrashMode::DurableOnly));
                images.push(disk.crash_image(CrashMode::AllWritten));
            }
        });
        let new = partition.checkpoint().await.unwrap().expect("written");
        disk.clear_hook();
        assert!(new > old);
        // A reopen fences the claims still held (epoch fence): every image
        // must give the state a clean reopen of the disk gives, which
        // differs from the live state only in those claims.
        let (reference, _reference_task, _) =
            open_sim(&disk.crash_image(CrashMode::DurableOnly), &now).await;
        let expected = reference.with_state(|state| state.messages());
        assert_eq!(expected.len(), before.len());
        let claimed = |phase: &spool_broker::queue::MessagePhase| {
            matches!(phase, spool_broker::queue::MessagePhase::Claimed { .. })
        };
        for (live, reopened) in before.iter().zip(&expected) {
            if claimed(&live.phase) {
                assert!(!claimed(&reopened.phase), "{reopened:?} is still claimed");
            } else {
                assert_eq!(live, reopened);
            }
        }
        let images = images.take();
        // Open, writes (at least two chunks and the header page), sync,
        // rename, directory sync: each with two images.
        assert!(images.len() >= 2 * 6, "{} images", images.len());
        let (mut from_old, mut from_new) = (0, 0);
        for (index, image) in images.into_iter().enumerate() {
            let (reopened, _task, report) = open_sim(&image, &now).await;
            match report.checkpoint_covers {
                Some(covers) if covers == old => from_old += 1,
                Some(covers) if covers == new => from_new += 1,
                other => panic!("image {index}: reopened from {other:?}, not {old:?} or {new:?}"),
            }
            let got = reopened.with_state(|state| state.messages());
            let first_difference = got.iter().zip(&expected).find(|(a, b)| a != b);
            assert!(
                got.len() == expected.len() && first_difference.is_none(),
                "image {index}: {} messages against {}, first difference {first_difference:?}",
                got.len(),
                expected.len()
            );
        }
        assert!(from_old > 0 && from_new > 0, "old {from_old}, new {from_new}");
    });
}

fn next_visit_names_the_timers_the_waits_and_the_sweep_and_changes_touch(layout: Layout) {
    // Goal: the shard's tick visits a partition only when it changed or its next visit came
    // (`server/tick.rs`), so `next_visit` must name every deadline the tick serves and the
    // touch hook must fire on every change: nothing to do at rest (None); a claim's lease end;
    // a long-poll's wait deadline; the sweep 100 ms on while a claim waits beside a ready
    // message it cannot take (the other lane); touches on enqueue, claim, a claim starting to
    // wait and ack. Method: a controlled clock, a counting touch hook, `next_visit` read after
    // each step.
    let dir = tempfile::tempdir().unwrap();
    let now = Rc::new(Cell::new(START_MS));
    run(async move {
        let opened = open(layout, dir.path(), &now, QueueConfig::default()).await;
        let partition = opened.0.clone();
        let touches = Rc::new(Cell::new(0u32));
        let counter = touches.clone();
        partition.set_touch_hook(Rc::new(move || counter.set(counter.get() + 1)));
        assert_eq!(partition.next_visit(START_MS), None, "an empty partition has nothing due");

        partition.enqueue(&batch(&[1], START_MS)).await.unwrap();
        assert!(touches.get() >= 1, "an enqueue touches");
        let lease = ClaimRequest { lease_ms: Some(2_000), ..claim_request(1) };
        let claimed = partition.claim(&lease, Lane::Main, 0).await.unwrap();
        assert_eq!(claimed.len(), 1);
        let after_claim = touches.get();
        assert!(after_claim >= 2, "a claim touches");
        assert_eq!(partition.next_visit(START_MS), Some(START_MS + 2_000), "the lease end");
        assert!(partition.ack(&[claimed[0].delivery.token]).await[0].is_ok());
        assert!(touches.get() > after_claim, "an ack touches");

        // A message ready in the main lane, a claim waiting on the dead-letter lane.
        partition.enqueue(&batch(&[2], START_MS)).await.unwrap();
        let before_wait = touches.get();
        let waiter = {
            let partition = partition.clone();
            glommio::spawn_local(async move {
                partition.claim(&claim_request(1), Lane::DeadLetter, 5_000).await
            })
        };
        while partition.claims_waiting() == 0 {
            futures_lite::future::yield_now().await;
        }
        assert!(touches.get() > before_wait, "a claim starting to wait touches");
        let sweep = START_MS + spool_broker::limits::TICK_SWEEP_INTERVAL_MS;
        assert_eq!(partition.next_visit(START_MS), Some(sweep), "the sweep beside a ready message");
        // Once the main lane is empty: the wait deadline, before the new lease's end.
        let taken = partition.claim(&claim_request(1), Lane::Main, 0).await.unwrap();
        assert_eq!(taken.len(), 1);
        assert_eq!(partition.next_visit(START_MS), Some(START_MS + 5_000));
        now.set(START_MS + 5_000);
        partition.tick();
        let ended: Result<Vec<_>, PartitionError> = waiter.await;
        assert!(ended.unwrap().is_empty(), "the wait ended at its deadline");
        assert_eq!(partition.next_visit(START_MS + 5_000), Some(START_MS + 30_000), "the lease");
        close(opened).await;
    });
}

fn the_ready_hook_lists_every_claimable_message_through_a_random_history(layout: Layout) {
    // Goal: the ready hook, which keeps the shard's ready ring for claims
    // of any partition, never leaves a claimable message unlisted: after
    // every step of a history of enqueues (some scheduled), claims of one
    // partition and of any, acks, releases with and without delay, lease
    // ends and ticks, a partition whose last `claim_ready` found it
    // exhausted and that the hook has not called since has nothing to
    // claim. Method: the hook sets a flag, an exhausted `claim_ready` clears
    // it; after each step, an unlisted partition is probed with a
    // `claim_ready` that must come back empty (and exhausted). Seeded, so a
    // failure names its seed and step; the run must also see the flag
    // cleared and set again many times (the check is not vacuous).
    for seed in 1..=6u64 {
        let dir = tempfile::tempdir().unwrap();
        let now = Rc::new(Cell::new(START_MS));
        let config = QueueConfig { max_deliveries: 3, ..QueueConfig::default() };
        let clock_now = now.clone();
        let (relisted, probes) = run(async move {
            let opened = open(layout, dir.path(), &clock_now, config).await;
            let partition = opened.0.clone();
            let listed = Rc::new(Cell::new(false));
            let hook_listed = listed.clone();
            partition.set_ready_hook(Rc::new(move |_| hook_listed.set(true)));
            let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let mut next = move |bound: u64| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng % bound
            };
            let mut held: Vec<spool_broker::queue::DeliveryToken> = Vec::new();
            let mut sent = 0u32;
            let (mut relisted, mut probes) = (0u32, 0u32);
            let cancel = ClaimCancel::default();
            for step in 0..400 {
                let at = clock_now.get();
                let was_listed = listed.get();
                match next(9) {
                    0 => {
                        let mut builder = DataBatchBuilder::new();
                        for _ in 0..=next(3) {
                            sent += 1;
                            let mut id = [0u8; 16];
                            id[..4].copy_from_slice(&sent.to_le_bytes());
                            let mut message = record(id, vec![7; 64], at);
                            if next(4) == 0 {
                                message.not_before_ms = at + 1 + next(4_000);
                            }
                            builder.push(&message).unwrap();
                        }
                        partition.enqueue(&builder.finish().unwrap()).await.unwrap();
                    }
                    1 | 2 => {
                        let credits = 1 + next(8) as u32;
                        let ready = partition.claim_ready(&claim_request(credits), &cancel).await;
                        let ready = ready.unwrap();
                        if ready.exhausted {
                            listed.set(false);
                        }
                        held.extend(ready.claimed.iter().map(|item| item.delivery.token));
                    }
                    3 => {
                        let claimed =
                            partition.claim(&claim_request(2), Lane::Main, 0).await.unwrap();
                        held.extend(claimed.iter().map(|item| item.delivery.token));
                    }
                    4 if !held.is_empty() => {
                        let token = held.swap_remove(next(held.len() as u64) as usize);
                        let _ = partition.ack(&[token]).await;
                    }
                    5 if !held.is_empty() => {
                        let token = held.swap_remove(next(held.len() as u64) as usize);
                        let delay = (next(2) == 0).then(|| at + 1 + next(3_000));
                        let _ = partition.release(&token, ReleaseReason(2), delay).await;
                    }
                    _ => {
                        // Time passes (leases of 30 s end now and then);
                        // the shard's alarm runs the tick when it is due.
                        clock_now.set(at + next(9_000));
                        partition.tick();
                    }
                }
                if !listed.get() {
                    probes += 1;
                    let probe = partition.claim_ready(&claim_request(1_000), &cancel).await;
                    let probe = probe.unwrap();
                    assert!(
                        probe.claimed.is_empty(),
                        "seed {seed} step {step}: {} claimable messages not listed",
                        probe.claimed.len()
                    );
                    assert!(probe.exhausted, "seed {seed} step {step}");
                }
                if listed.get() && !was_listed {
                    relisted += 1;
                }
            }
            close(opened).await;
            (relisted, probes)
        });
        assert!(probes > 20 && relisted > 10, "seed {seed}: {probes} probes, {relisted} relisted");
    }
}
