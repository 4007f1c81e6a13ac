//! Claims that reply before their commit is durable, on the simulated disk:
//! the log's background future (which writes and syncs commits) is polled
//! only when a test lets it, so "not yet durable" is a state the test holds
//! for as long as it wants, and crash images taken there show what a power
//! loss would leave.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is the failure report

mod common;
mod partition_layout;

use std::cell::Cell;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::rc::Rc;
use std::task::Poll;

use futures_lite::future::{block_on, poll_once};
use partition_layout::{open_partition, Layout};
use spool_broker::io::{CrashMode, SimStorage};
use spool_broker::log::{LogConfig, RecordFatal};
use spool_broker::partition::{Clock, OpenReport, Partition, PartitionName};
use spool_broker::queue::{
    ClaimRequest, Lane, Offset, PartitionId, QueueConfig, QueueId, ReleaseReason, WorkerId,
};
use spool_wire::batch::BatchBytes;
use spool_wire::ErrorCode;

const START_MS: u64 = 1_700_000_000_000;
/// Polls a future gets before a test calls it stuck (it only needs one when
/// nothing waits on the disk).
const POLLS_MAX: usize = 64;

type Background = Pin<Box<dyn Future<Output = ()>>>;

fn log_config() -> LogConfig {
    LogConfig {
        segment_bytes: 1 << 20,
        commit_bytes: 16 * 1024,
        batch_bytes_max: 64 * 1024,
        ..LogConfig::default()
    }
}

fn clock(now: &Rc<Cell<u64>>) -> Clock {
    let now = now.clone();
    Rc::new(move || now.get())
}

fn batch(ids: &[u8], now_ms: u64) -> BatchBytes {
    common::id_batch(ids, now_ms)
}

fn claim_request(credits: u32) -> ClaimRequest {
    // A long lease: anything claimable again after a restart is so because
    // of the fence, not because the lease ran out.
    ClaimRequest {
        sub: spool_broker::queue::SubscriptionId::DEFAULT,
        worker: WorkerId(4),
        credits,
        max_bytes: 1 << 20,
        lease_ms: Some(60_000),
    }
}

/// Opens the partition in `/p` of `disk`, driving the log while open runs
/// (the fence waits for its own commit); returns the background future
/// unspawned, so the test decides when the disk makes progress.
fn open(
    layout: Layout,
    disk: &SimStorage,
    now: &Rc<Cell<u64>>,
) -> (Rc<Partition<SimStorage>>, Background, OpenReport) {
    let name =
        PartitionName { queue: "jobs".into(), queue_id: QueueId(1), partition: PartitionId(0) };
    // Default config: leases up to 15 min, an exponential backoff from 1 s.
    let config = QueueConfig::default();
    let (partition, background, report) = block_on(open_partition(
        layout,
        disk.clone(),
        Path::new("/p"),
        name,
        config,
        log_config(),
        Rc::new(RecordFatal::default()),
        clock(now),
    ))
    .expect("open");
    (partition, Box::pin(background.into_future()), report)
}

/// Polls `work` without the log making progress; panics unless it finishes.
fn without_sync<T>(work: impl Future<Output = T>) -> T {
    let mut work = std::pin::pin!(work);
    block_on(async {
        for _ in 0..POLLS_MAX {
            if let Some(value) = poll_once(work.as_mut()).await {
                return value;
            }
        }
        panic!("still waiting after {POLLS_MAX} polls with every commit held back");
    })
}

/// Runs `work` while polling the log's background future.
fn with_sync<T>(background: &mut Background, work: impl Future<Output = T>) -> T {
    let mut work = std::pin::pin!(work);
    block_on(std::future::poll_fn(|cx| {
        if let Poll::Ready(value) = work.as_mut().poll(cx) {
            return Poll::Ready(value);
        }
        assert!(background.as_mut().poll(cx).is_pending(), "the log stopped");
        Poll::Pending
    }))
}

both_layouts!(
    claim_replies_before_its_commit_and_only_hands_out_durable_records,
    claim_lost_before_its_sync_is_ready_after_reopen_and_its_token_is_stale,
);

fn claim_replies_before_its_commit_and_only_hands_out_durable_records(layout: Layout) {
    // Goal: a claim replies once appended and applied, with its own commit
    // still not durable; it never delivers a record whose enqueue is not
    // durable; a long-polling claim is woken when an enqueue becomes durable.
    // Method: SimStorage with the log's background future held (no commit is
    // written or synced unless the test polls it): enqueue [1,2] durably,
    // start enqueue [3,4] (appended, held), claim: only 1 and 2 come back,
    // the durable watermark at reply is below the claim's own events. Then a
    // long-poll for more waits, and releasing the held commit wakes it with 3
    // and 4 while the clock stands still.
    let disk = SimStorage::new();
    let now = Rc::new(Cell::new(START_MS));
    let (partition, mut background, _) = open(layout, &disk, &now);
    with_sync(&mut background, partition.enqueue(&batch(&[1, 2], START_MS))).unwrap();
    let durable_before = partition.log().durable_offset();
    let second = batch(&[3, 4], START_MS);
    let mut held = Box::pin(partition.enqueue(&second));
    assert!(without_sync_once(held.as_mut()).is_none(), "the enqueue waits for its sync");
    assert_eq!(partition.log().durable_offset(), durable_before);

    let claimed = without_sync(partition.claim(&claim_request(10), Lane::Main, 0)).unwrap();
    let offsets: Vec<Offset> = claimed.iter().map(|c| c.delivery.offset).collect();
    assert_eq!(offsets, vec![Offset(0), Offset(1)], "only records whose enqueue is durable");
    assert!(
        partition.log().durable_offset() < partition.log().next_offset(),
        "the claim replied with its events not yet durable"
    );
    assert_eq!(partition.log().durable_offset(), durable_before);
    // Extend and release reply without their sync too.
    without_sync(partition.extend(&claimed[0].delivery.token, Some(90_000))).unwrap();
    without_sync(partition.release(&claimed[1].delivery.token, ReleaseReason(1), None)).unwrap();
    assert_eq!(partition.log().durable_offset(), durable_before);

    // A long-poll (the clock never moves, so only a wake-up can end it)
    // gets 3 and 4 once their commit is synced; offset 1, released into a
    // 1 s backoff, is not ready yet.
    let request = ClaimRequest { credits: 2, ..claim_request(2) };
    let waiting = partition.claim(&request, Lane::Main, 60_000);
    let (claimed_late, enqueued) = with_sync(&mut background, async {
        futures_lite::future::zip(waiting, held.as_mut()).await
    });
    enqueued.unwrap();
    let offsets: Vec<Offset> = claimed_late.unwrap().iter().map(|c| c.delivery.offset).collect();
    assert_eq!(offsets, vec![Offset(2), Offset(3)]);
}

/// One poll of `work`, with every commit held back.
fn without_sync_once<T>(work: Pin<&mut impl Future<Output = T>>) -> Option<T> {
    block_on(poll_once(work))
}

fn claim_lost_before_its_sync_is_ready_after_reopen_and_its_token_is_stale(layout: Layout) {
    // Goal: a crash after a claim replied but before its commit was synced
    // leaves the message ready at once after reopen (long before the lease),
    // with the old token STALE_TOKEN; a claim that did reach the disk is
    // released by the epoch fence just as fast, and counts as an attempt.
    // Method: SimStorage; enqueue 1..4 durably, claim 1 and 2 durably (a
    // later ack's sync carries them), claim 3 and 4 with the commit held,
    // take the durable-only crash image, reopen it at the same instant.
    let disk = SimStorage::new();
    let now = Rc::new(Cell::new(START_MS));
    let (partition, mut background, _) = open(layout, &disk, &now);
    with_sync(&mut background, partition.enqueue(&batch(&[1, 2, 3, 4, 5], START_MS))).unwrap();
    let synced = without_sync(partition.claim(&claim_request(3), Lane::Main, 0)).unwrap();
    // The ack of the third claim waits for its commit, which holds all three.
    let acked = with_sync(&mut background, partition.ack(&[synced[2].delivery.token]));
    assert!(acked[0].is_ok());
    let lost = without_sync(partition.claim(&claim_request(2), Lane::Main, 0)).unwrap();
    assert_eq!(lost.len(), 2);
    let image = disk.crash_image(CrashMode::DurableOnly);
    drop((partition, background));

    now.set(START_MS + 1_000);
    let (partition, mut background, report) = open(layout, &image, &now);
    assert_eq!(report.fenced_claims, 2, "the two durable claims were fenced");
    let counters = partition.counters();
    assert_eq!((counters.claimed, counters.live_messages), (0, 4), "{counters:?}");
    for old in synced.iter().chain(&lost) {
        let result = with_sync(&mut background, partition.ack(&[old.delivery.token]));
        assert_eq!(result[0].as_ref().unwrap_err().code(), ErrorCode::StaleToken);
    }
    // Well before the 60 s lease, all four are claimable now.
    let again = without_sync(partition.claim(&claim_request(10), Lane::Main, 0)).unwrap();
    let mut found: Vec<(Offset, u16)> =
        again.iter().map(|c| (c.delivery.offset, c.delivery.attempt)).collect();
    found.sort();
    assert_eq!(
        found,
        vec![(Offset(0), 2), (Offset(1), 2), (Offset(3), 1), (Offset(4), 1)],
        "fenced claims count as an attempt; claims lost before their sync do not"
    );
    for claim in &again {
        assert!(claim.delivery.token.claim().epoch > lost[0].delivery.token.claim().epoch);
    }
    // The fence is in the log: a second crash right away changes nothing.
    let acks: Vec<_> = again.iter().map(|c| c.delivery.token).collect();
    let results = with_sync(&mut background, partition.ack(&acks));
    assert!(results.iter().all(Result::is_ok));
    let image = image.crash_image(CrashMode::DurableOnly);
    let (partition, _background, report) = open(layout, &image, &now);
    assert_eq!(report.fenced_claims, 0);
    assert_eq!(partition.counters().live_messages, 0);
}
