//! Relocation of live journal entries (`docs/design/shard-journal.md` §6,
//! "Built: relocation"): one live record in the oldest journal file, lots
//! of acked data after it; relocation copies the record to the head, the
//! shard's release pass then lets every old file go, and the record still
//! claims and acks with its offset and payload — also after a crash at
//! any write, sync or remove of the relocation, its checkpoint and the
//! release.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is the failure report

mod common;
mod partition_layout;

use std::cell::{Cell, RefCell};
use std::collections::BTreeSet;
use std::path::Path;
use std::rc::Rc;

use partition_layout::{open_partition, Layout};
use spool_broker::io::{CrashMode, IoOp, SimStorage};
use spool_broker::log::journal::Journal;
use spool_broker::log::{LogConfig, RecordFatal};
use spool_broker::partition::{relocate_pass, Clock, EnqueueOutcome, Partition, PartitionName};
use spool_broker::queue::{
    ClaimRequest, DeliveryToken, Lane, PartitionId, QueueConfig, QueueId, WorkerId,
};
use spool_wire::batch::{BatchBytes, DataBatchBuilder, MessageId, Payload, Record};

const START_MS: u64 = 1_700_000_000_000;
const DIR: &str = "/data/p0";
/// The payload of the record kept live (claimed) in the oldest file.
const KEPT: &[u8] = b"the one record nobody acks, in the oldest journal file";
/// The payload of a second live record (scheduled far ahead, so never
/// claimed), enqueued halfway through the workload: its entry lies below
/// the first one's copy until a pass reaches its own file.
const MIDDLE: &[u8] = b"a later live record, in a middle journal file";

fn log_config() -> LogConfig {
    // The smallest journal files the partition settings give (the commit
    // span bounds them from below).
    LogConfig {
        segment_bytes: 64 * 1024,
        commit_bytes: 16 * 1024,
        batch_bytes_max: 64 * 1024,
        inflight_commits_max: 2,
        pending_bytes_max: 256 * 1024,
        data_pending_bytes_max: 128 * 1024,
        tail_cache_bytes: 64 * 1024,
    }
}

/// A batch of `payloads`, the record of `payloads[i]` with message id
/// `first_id + i` (ids are deduplicated: each must be new).
fn batch(first_id: u64, payloads: &[Vec<u8>]) -> BatchBytes {
    batch_due(first_id, payloads, 0)
}

/// [`batch`] of records not claimable before `not_before_ms` (0: at once).
fn batch_due(first_id: u64, payloads: &[Vec<u8>], not_before_ms: u64) -> BatchBytes {
    let mut builder = DataBatchBuilder::new();
    for (index, payload) in payloads.iter().enumerate() {
        let mut id = [0u8; 16];
        id[..8].copy_from_slice(&(first_id + index as u64).to_le_bytes());
        builder
            .push(&Record {
                message_id: MessageId(id),
                routing_key: vec![],
                headers: vec![],
                payload: Payload::Inline(payload.clone()),
                priority: 0,
                not_before_ms,
                expiry_ms: 0,
                enqueue_time_ms: START_MS,
            })
            .unwrap();
    }
    builder.finish().unwrap()
}

fn filler_payload(tag: u64) -> Vec<u8> {
    let mut bytes = tag.to_le_bytes().to_vec();
    bytes.resize(6000, (tag % 251) as u8);
    bytes
}

type Opened = (Rc<Partition<SimStorage>>, glommio::task::JoinHandle<()>);

async fn open(disk: &SimStorage, now: &Rc<Cell<u64>>) -> Opened {
    open_on(Layout::Journal, disk, now).await
}

/// [`open`] on `layout`: `Layout::JournalOrdered` has the shard's ordered
/// pass replay the partition, as spoold does at start.
async fn open_on(layout: Layout, disk: &SimStorage, now: &Rc<Cell<u64>>) -> Opened {
    let name =
        PartitionName { queue: "jobs".into(), queue_id: QueueId(1), partition: PartitionId(0) };
    let clock: Clock = {
        let now = now.clone();
        Rc::new(move || now.get())
    };
    let (partition, background, _report) = open_partition(
        layout,
        disk.clone(),
        Path::new(DIR),
        name,
        QueueConfig::default(),
        log_config(),
        Rc::new(RecordFatal::default()),
        clock,
    )
    .await
    .unwrap();
    let task = glommio::spawn_local(background.into_future()).detach();
    (partition, task)
}

fn journal(partition: &Partition<SimStorage>) -> &Journal<SimStorage> {
    partition.log().journal().shard().journal()
}

async fn claim_all(partition: &Partition<SimStorage>) -> Vec<(DeliveryToken, u64, Vec<u8>)> {
    let request = ClaimRequest {
        sub: spool_broker::queue::SubscriptionId::DEFAULT,
        worker: WorkerId(1),
        credits: 64,
        max_bytes: 1 << 20,
        lease_ms: Some(60_000),
    };
    let mut out = Vec::new();
    loop {
        let claimed = partition.claim(&request, Lane::Main, 0).await.unwrap();
        if claimed.is_empty() {
            return out;
        }
        out.extend(
            claimed.iter().map(|c| (c.delivery.token, c.delivery.offset.0, c.record.to_vec())),
        );
    }
}

/// Enqueues the kept record (offset 0), then `batches` batches of four
/// 6,000-byte records, claiming and acking each batch, with the middle
/// record enqueued halfway (scheduled far ahead): the kept record's file and
/// many more are written, every record but those two acked. Returns the
/// acked offsets and the middle record's offset.
async fn workload(partition: &Partition<SimStorage>, batches: u64) -> (BTreeSet<u64>, u64) {
    let outcomes = partition.enqueue(&batch(0, &[KEPT.to_vec()])).await.unwrap();
    assert!(matches!(outcomes[0], EnqueueOutcome::Appended { offset } if offset.0 == 0));
    // Claim the kept record and release nothing: it stays claimed until the
    // end (a slow consumer), then ready again after the reopen's fence.
    let request = ClaimRequest {
        sub: spool_broker::queue::SubscriptionId::DEFAULT,
        worker: WorkerId(9),
        credits: 1,
        max_bytes: 1 << 20,
        lease_ms: Some(600_000),
    };
    let kept = partition.claim(&request, Lane::Main, 0).await.unwrap();
    assert_eq!(kept[0].delivery.offset.0, 0);
    let mut acked = BTreeSet::new();
    let mut middle = None;
    for tag in 0..batches {
        if tag == batches / 2 {
            let outcomes = partition
                .enqueue(&batch_due(1_000_000, &[MIDDLE.to_vec()], START_MS + 86_400_000))
                .await;
            let outcomes = outcomes.unwrap();
            let EnqueueOutcome::Appended { offset } = outcomes[0] else { panic!("{outcomes:?}") };
            middle = Some(offset.0);
        }
        let payloads: Vec<Vec<u8>> = (0..4).map(|i| filler_payload(tag * 4 + i)).collect();
        partition.enqueue(&batch(1 + tag * 4, &payloads)).await.unwrap();
        let claimed = claim_all(partition).await;
        let tokens: Vec<DeliveryToken> = claimed.iter().map(|(token, ..)| *token).collect();
        for result in partition.ack(&tokens).await {
            result.unwrap();
        }
        acked.extend(claimed.iter().map(|(_, offset, _)| *offset));
    }
    (acked, middle.expect("the middle record was enqueued"))
}

/// What the shard's release pass does (`server::release_journal`), for one
/// partition: a checkpoint when it would free a file, then the release of
/// every file below what the partition needs; when nothing can go, a
/// relocation pass. Returns the files released.
async fn reclaim_round(partition: &Rc<Partition<SimStorage>>) -> usize {
    let journal = journal(partition);
    if partition.journal_checkpoint_frees() {
        partition.checkpoint().await.unwrap();
    }
    let needed = journal.durable_position().min(partition.journal_pin());
    if journal.file_base(needed) > journal.oldest_file() {
        return journal.release_below(needed).await.unwrap().files;
    }
    relocate_pass(journal, std::slice::from_ref(partition), 0.5, 8 << 20).await.unwrap();
    // Let the copies' commit become durable.
    let (data, control) = partition.log().journal().last_tickets();
    for ticket in [data, control].into_iter().flatten() {
        let _ = ticket.durable().await;
    }
    futures_lite::future::yield_now().await;
    0
}

/// Checks a (re)opened partition: the kept and the middle record are the
/// only live messages, the kept one claims once at offset 0 with its
/// payload and acks, the middle one reads back with its payload.
async fn kept_records_claim_and_ack(partition: &Partition<SimStorage>, middle: u64, context: &str) {
    let live: Vec<u64> =
        partition.with_state(|state| state.messages()).iter().map(|view| view.offset.0).collect();
    assert_eq!(live, vec![0, middle], "{context}: live messages");
    let claimed = claim_all(partition).await;
    let offsets: Vec<u64> = claimed.iter().map(|(_, offset, _)| *offset).collect();
    assert_eq!(offsets, vec![0], "{context}: one delivery");
    let (token, _, record) = &claimed[0];
    assert!(record.windows(KEPT.len()).any(|window| window == KEPT), "{context}: its payload");
    let scheduled = partition.record(spool_broker::queue::Offset(middle)).await.unwrap();
    assert!(
        scheduled.windows(MIDDLE.len()).any(|window| window == MIDDLE),
        "{context}: the middle record's payload"
    );
    partition.ack(&[*token]).await[0].as_ref().unwrap();
    let live: Vec<u64> =
        partition.with_state(|state| state.messages()).iter().map(|view| view.offset.0).collect();
    assert_eq!(live, vec![middle], "{context}");
}

#[test]
fn one_live_record_no_longer_pins_the_journal_after_relocation() {
    // Goal: with one claimed record in the oldest journal file and ≈ 5 MiB
    // acked after it, the release alone holds every file (the record pins
    // them); relocation copies it to the head, the release passes then
    // leave O(live) files, and the record still claims with its offset and
    // payload and acks — live and after a crash image of the end state.
    common::run_glommio(async {
        let now = Rc::new(Cell::new(START_MS));
        let disk = SimStorage::new();
        let (partition, task) = open(&disk, &now).await;
        let (acked, middle) = workload(&partition, 200).await;
        assert_eq!(acked.len(), 800);
        let journal = journal(&partition);
        let written = journal.file_count();
        assert!(written >= 8, "the workload spans many files: {written}");
        // The release alone (what ran before relocation) frees nothing:
        // the kept record pins the oldest file and so every later one.
        for _ in 0..3 {
            if partition.journal_checkpoint_frees() {
                partition.checkpoint().await.unwrap();
            }
            let needed = journal.durable_position().min(partition.journal_pin());
            assert_eq!(journal.release_below(needed).await.unwrap().files, 0);
        }
        assert_eq!(journal.file_count(), written);
        // With relocation, rounds of the shard's pass bring it down.
        let mut released = 0;
        for _ in 0..(4 * written) {
            released += reclaim_round(&partition).await;
        }
        let held = journal.file_count();
        assert!(held <= 3, "files held after relocation: {held} of {written}");
        assert!(released >= written - 3, "{released}");
        // The kept record's batch is read from its copy, in a file still
        // held (dead batches of the newest files stay indexed until a
        // checkpoint cuts them or a pass reaches their file).
        let index = partition.log().journal().index();
        assert_eq!(index[0].first_offset, 0);
        assert!(index[0].position >= journal.oldest_file(), "{index:?}");
        // A crash now (a killed process) brings back the record, once
        // (reopened through the shard's ordered pass, as at a start).
        let image = disk.process_crash_image();
        now.set(now.get() + 1_000);
        let (reopened, reopened_task) = open_on(Layout::JournalOrdered, &image, &now).await;
        kept_records_claim_and_ack(&reopened, middle, "after a crash").await;
        reopened.log().close();
        reopened_task.await;
        // The original keeps serving it too (the copy is what it reads).
        now.set(now.get() + 700_000);
        partition.tick();
        kept_records_claim_and_ack(&partition, middle, "live").await;
        partition.log().close();
        task.await;
    });
}

#[test]
fn a_crash_at_any_step_of_relocation_and_release_keeps_every_answer() {
    // Goal: at every write, sync, rename and remove of the relocation, the
    // checkpoint it asks for and the release after it, two crash images
    // (synced only, everything written) each reopen with the kept record
    // live exactly once, claimable at offset 0 with its payload, and no
    // acked record live again.
    let (images, middle): (Vec<SimStorage>, u64) = common::run_glommio(async {
        let now = Rc::new(Cell::new(START_MS));
        let disk = SimStorage::new();
        let (partition, task) = open(&disk, &now).await;
        let (acked, middle) = workload(&partition, 120).await;
        assert_eq!(acked.len(), 480);
        let images = Rc::new(RefCell::new(Vec::new()));
        {
            let images = images.clone();
            disk.set_hook(move |disk, op, _count| {
                if matches!(
                    op,
                    IoOp::Write | IoOp::Sync | IoOp::SyncDir | IoOp::Rename | IoOp::Remove
                ) {
                    images.borrow_mut().push(disk.crash_image(CrashMode::DurableOnly));
                    images.borrow_mut().push(disk.crash_image(CrashMode::AllWritten));
                }
            });
        }
        let journal = journal(&partition);
        let written = journal.file_count();
        let mut released = 0;
        for _ in 0..(4 * written) {
            released += reclaim_round(&partition).await;
        }
        disk.clear_hook();
        assert!(released >= written - 3, "released {released} of {written}");
        partition.log().close();
        task.await;
        (images.take(), middle)
    });
    assert!(images.len() >= 40, "{} images", images.len());
    eprintln!("{} crash images", images.len());
    let count = images.len();
    for (index, image) in images.into_iter().enumerate() {
        common::run_glommio(async move {
            let now = Rc::new(Cell::new(START_MS + 1_000_000));
            // Half the images of each crash mode (they come in pairs, synced
            // only then everything written) reopen through the shard's
            // ordered pass.
            let ordered = (index / 2) % 2 == 1;
            let layout = if ordered { Layout::JournalOrdered } else { Layout::Journal };
            let (partition, task) = open_on(layout, &image, &now).await;
            let context = format!("image {index} of {count}");
            kept_records_claim_and_ack(&partition, middle, &context).await;
            partition.log().close();
            task.await;
        });
    }
}

#[test]
fn relocation_waits_for_a_checkpoint_covering_the_record() {
    // Goal: a live record past the partition's durable checkpoint is not
    // copied (replay would need it as an event); the pass writes a
    // checkpoint instead, and a later pass copies it.
    common::run_glommio(async {
        let now = Rc::new(Cell::new(START_MS));
        let disk = SimStorage::new();
        let (partition, task) = open(&disk, &now).await;
        workload(&partition, 120).await;
        let journal = journal(&partition);
        let oldest = journal.oldest_file();
        let next = journal.next_file(oldest).unwrap();
        let step = partition.journal_relocate(oldest, next, 8 << 20).await.unwrap();
        assert!(step.needs_checkpoint, "{step:?}");
        assert_eq!(step.copied_entries, 0, "{step:?}");
        partition.checkpoint().await.unwrap();
        let step = partition.journal_relocate(oldest, next, 8 << 20).await.unwrap();
        assert!(!step.needs_checkpoint, "{step:?}");
        assert_eq!(step.copied_entries, 1, "{step:?}");
        assert!(step.dropped_entries > 0, "{step:?}");
        partition.log().close();
        task.await;
    });
}
