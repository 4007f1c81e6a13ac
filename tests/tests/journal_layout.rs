// Goal: the journal (one journal per shard shared by its partitions, the
// only log layout: `docs/design/shard-journal.md`) serves the
// protocol end to end and keeps every promise across a crash: over 2 shards
// and several partitions, create/send/claim/ack work; after a SIGKILL in
// the middle of a stream of enqueues and acks, every acknowledged enqueue
// is there, no acknowledged ack is undone, a token from before the kill is
// STALE_TOKEN while its message is claimable at once (the epoch fence, not
// the lease); and the data directory keeps its shard count (a restart with
// another `--cores` is refused naming both values), and a directory of the
// retired segment layout is refused saying what to do. Method: real spoold processes over
// TCP, a ledger of what the broker acknowledged, compared with a drain
// after the restart.

#![allow(clippy::unwrap_used)]

#[allow(dead_code)]
#[path = "e2e/common.rs"]
mod common;
#[path = "e2e/stream.rs"]
mod stream;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use spool_client::spool_wire::batch::MessageId;
use spool_client::spool_wire::proto::{MessageState, Offset, PartitionId};
use spool_client::spool_wire::ErrorCode;
use spool_client::{Admin, Delivery, Message, Producer, ProducerConfig};
use spool_tests::events::wait_for_metric;
use spool_tests::{test_queue_config, Spoold, SpooldOptions};

use common::{claim_options, count_by_id, drain, id_parts, message_id, unix_ms};
use stream::Stream;

const SHARDS: u16 = 2;
/// Partitions of the streamed queue: several on each shard's journal.
const PARTITIONS: u32 = 4;
/// Lease of the claims held across the kill: still unexpired when their
/// tokens are tried and their messages claimed after the restart.
const HELD_LEASE_MS: u32 = 60_000;
const ENQUEUED_BEFORE_KILL: usize = 2_000;
const ACKED_BEFORE_KILL: usize = 300;

fn journal_options() -> SpooldOptions {
    SpooldOptions::new(SHARDS)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn journal_layout_keeps_acknowledged_work_across_sigkill_and_keeps_its_shape() {
    let mut broker = Spoold::start_with(journal_options());
    let data_dir = broker.data_dir();
    let format = std::fs::read_to_string(data_dir.join("format")).unwrap();
    assert!(format.contains("log_layout = journal") && format.contains("shards = 2"), "{format}");

    let client = broker.client().await;
    let admin = Admin::new(client.clone());
    admin.create_queue("stream", test_queue_config(PARTITIONS, 5_000, 100)).await.unwrap();
    admin.create_queue("held", test_queue_config(1, 5_000, 100)).await.unwrap();
    // Every shard applied the creates, so each recovered its journal first
    // (a shard's port accepts before that, so not earlier), and every
    // partition has a handle in its shard's table, made before its first
    // append.
    for shard in 0..SHARDS {
        let journal = data_dir.join(format!("shard-{shard:02}")).join("journal");
        assert!(journal.is_dir(), "{} missing", journal.display());
        let handles = data_dir.join(format!("shard-{shard:02}")).join("handles");
        assert!(handles.is_file(), "{} missing", handles.display());
    }

    // Send, claim and ack on every partition of both shards.
    let producer = Producer::new(client.clone(), ProducerConfig::default()).unwrap();
    for sequence in 0..40 {
        producer.send("stream", Message::new("first").id(message_id(3, sequence))).await.unwrap();
    }
    let first = drain(&client, "stream", 200, 2).await;
    let counts = count_by_id(&first);
    assert_eq!(counts.len(), 40, "every message delivered");
    assert!(counts.values().all(|count| *count == 1), "each once: {counts:?}");
    let partitions: HashSet<PartitionId> = first.iter().map(Delivery::partition).collect();
    assert_eq!(partitions.len(), PARTITIONS as usize, "every partition served");

    for sequence in 0..5 {
        producer.send("held", Message::new("held").id(message_id(2, sequence))).await.unwrap();
    }

    let stream = Stream::start(
        broker.client().await,
        broker.client().await,
        PARTITIONS,
        (ENQUEUED_BEFORE_KILL, ACKED_BEFORE_KILL),
        Duration::from_secs(60),
    )
    .await;

    // Claims held across the kill, their leases unexpired afterwards.
    let held =
        client.claim("held", PartitionId(0), &claim_options(7, 5, HELD_LEASE_MS, 0)).await.unwrap();
    assert_eq!(held.deliveries.len(), 5);

    broker.kill();
    let ledger = Arc::clone(&stream.ledger);
    let (produced, consumed) = stream.finish().await;
    eprintln!("at the kill: producer {produced}; consumer {consumed}");
    broker.restart();

    let client = broker.client().await;
    let admin = Admin::new(client.clone());
    let tokens: Vec<_> = held.deliveries.iter().map(Delivery::token).collect();
    let codes = client.ack("held", PartitionId(0), &tokens).await.unwrap_err().refused_codes();
    assert!(unix_ms() < held.lease_deadline_ms, "restart too slow: the held leases expired");
    assert_eq!(codes, vec![ErrorCode::StaleToken; 5], "pre-kill tokens are stale");
    let peeked = admin.peek("held", PartitionId(0), Offset(0), 10).await.unwrap();
    assert_eq!(peeked.len(), 5);
    assert!(peeked.iter().all(|message| message.state == MessageState::Ready), "{peeked:?}");
    let held_back = drain(&client, "held", 500, 1).await;
    assert!(unix_ms() < held.lease_deadline_ms, "the held messages waited for their lease");
    let mut held_ids: Vec<_> = held_back.iter().map(Delivery::message_id).collect();
    held_ids.sort_by_key(|id| id.0);
    let expected: Vec<_> = (0..5).map(|sequence| message_id(2, sequence)).collect();
    assert_eq!(held_ids, expected);

    let drained = drain(&client, "stream", 300, 2).await;
    let counts: HashMap<MessageId, usize> = count_by_id(&drained);
    let ledger = std::mem::take(&mut *ledger.lock().unwrap());
    let duplicates: Vec<_> = counts.iter().filter(|(_, count)| **count > 1).collect();
    assert!(duplicates.is_empty(), "delivered twice after the restart: {duplicates:?}");
    let missing: Vec<_> = ledger
        .enqueued
        .iter()
        .filter(|id| !ledger.acked.contains(id) && !ledger.ack_unknown.contains(id))
        .filter(|id| !counts.contains_key(id))
        .collect();
    assert!(
        missing.is_empty(),
        "{} acknowledged enqueues lost, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
    let resurrected: Vec<_> = ledger.acked.iter().filter(|id| counts.contains_key(id)).collect();
    assert!(resurrected.is_empty(), "acked messages came back: {resurrected:?}");
    let unknown: Vec<_> = counts.keys().filter(|id| !ledger.submitted.contains(id)).collect();
    assert!(unknown.is_empty(), "delivered ids nobody sent: {unknown:?}");
    let first_again: Vec<_> = counts.keys().filter(|id| id_parts(**id).0 == 3).collect();
    assert!(first_again.is_empty(), "acked messages of the first round came back: {first_again:?}");
    eprintln!(
        "journal layout kill: {} enqueued, {} acked, {} unknown acks before the kill; {} \
         drained after",
        ledger.enqueued.len(),
        ledger.acked.len(),
        ledger.ack_unknown.len(),
        drained.len()
    );
    assert!(!drained.is_empty(), "no backlog at the kill: the test proved nothing");
    let described = admin.describe_queue("stream").await.unwrap();
    assert!(described.partitions.iter().all(|p| p.ready + p.claimed + p.scheduled == 0));
    drop(client);
    let status = broker.terminate();
    assert!(status.success(), "SIGTERM exits 0 on the journal layout, got {status}");

    // The shard count is fixed: each shard's partitions live in its journal.
    broker.options_mut().cores = 1;
    let refused = broker.try_restart().unwrap_err();
    assert!(refused.status.is_some_and(|status| !status.success()), "{refused}");
    assert!(
        refused.log.contains("for 2 shards") && refused.log.contains("with 1 shards"),
        "the refusal names both shard counts:\n{}",
        refused.log
    );
    // A data directory of the retired segment layout is refused, saying
    // what it is and what to do, and is left as it was.
    broker.options_mut().cores = SHARDS;
    let format_path = data_dir.join("format");
    let journal_format = std::fs::read_to_string(&format_path).unwrap();
    std::fs::write(&format_path, "log_layout = segments\n").unwrap();
    let refused = broker.try_restart().unwrap_err();
    assert!(refused.status.is_some_and(|status| !status.success()), "{refused}");
    assert!(
        refused.log.contains("segment log layout") && refused.log.contains("new data directory"),
        "the refusal says what the directory is and what to do:\n{}",
        refused.log
    );
    assert_eq!(std::fs::read_to_string(&format_path).unwrap(), "log_layout = segments\n");
    // Its journal record back: what was drained stays drained, and a
    // message sent now is there after a restart.
    std::fs::write(&format_path, journal_format).unwrap();
    broker.restart();
    let client = broker.client().await;
    let after = drain(&client, "stream", 100, 1).await;
    assert!(after.is_empty(), "acked messages came back after a clean restart: {after:?}");
    let producer = Producer::new(client.clone(), ProducerConfig::default()).unwrap();
    producer.send("stream", Message::new("later").id(message_id(4, 0))).await.unwrap();
    drop((producer, client));
    assert!(broker.terminate().success());
    broker.restart();
    let client = broker.client().await;
    let after = drain(&client, "stream", 100, 1).await;
    assert_eq!(after.len(), 1, "the message sent after the refused start: {after:?}");
}

/// Bulk records enqueued one by one (each its own commit) into the
/// partition that is drained: 40 MiB, five 8 MiB journal files.
const BULK_RECORDS: u64 = 160;
const BULK_PAYLOAD_BYTES: usize = 256 << 10;
/// Three of the broker's release passes (`JOURNAL_RELEASE_INTERVAL_MS`, 1 s).
const RELEASE_PASSES_WAIT: Duration = Duration::from_secs(3);

/// Journal files (`*.wal`) in `dir`.
fn wal_files(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|entry| entry.file_name().to_string_lossy().ends_with(".wal"))
        .count()
}

/// GET /metrics, checked.
fn scrape(broker: &Spoold) -> spool_tests::admin::Exposition {
    let answer = tokio::task::block_in_place(|| {
        spool_tests::admin::http_get(&broker.admin_addr(), "/metrics")
    });
    assert_eq!(answer.status, 200, "{}", answer.body);
    spool_tests::admin::Exposition::parse(&answer.body)
        .unwrap_or_else(|error| panic!("the metrics do not parse: {error}\n{}", answer.body))
}

/// Claims and acks every ready message of `queue`/`partition`, `expected`
/// in all; returns their ids.
async fn ack_all(
    client: &spool_client::Client,
    queue: &str,
    partition: u32,
    expected: usize,
) -> Vec<MessageId> {
    let mut ids = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while ids.len() < expected {
        assert!(tokio::time::Instant::now() < deadline, "only {} of {expected} claimed", ids.len());
        let claimed = client
            .claim(queue, PartitionId(partition), &claim_options(9, 8, 30_000, 200))
            .await
            .unwrap();
        if claimed.deliveries.is_empty() {
            continue;
        }
        let tokens: Vec<_> = claimed.deliveries.iter().map(Delivery::token).collect();
        client.ack(queue, PartitionId(partition), &tokens).await.unwrap();
        ids.extend(claimed.deliveries.iter().map(Delivery::message_id));
    }
    ids
}

/// Polls until `wal_files(dir)` is at most `most`, up to 20 s.
async fn wait_files_at_most(dir: &std::path::Path, most: usize) -> usize {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let files = wal_files(dir);
        if files <= most || tokio::time::Instant::now() >= deadline {
            return files;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What the release tests share: one shard on the journal layout started
/// with `args` too, the path of its journal files, and a queue `queue` of
/// two partitions with a client, its admin and a producer.
struct OneShardJournal {
    broker: Spoold,
    journal_dir: std::path::PathBuf,
    client: spool_client::Client,
    admin: Admin,
    producer: Producer,
}

impl OneShardJournal {
    async fn start(args: &[&str], queue: &str) -> Self {
        let mut options = SpooldOptions::new(1);
        options.args.extend(args.iter().map(|arg| (*arg).to_owned()));
        let broker = Spoold::start_with(options);
        let journal_dir = broker.data_dir().join("shard-00").join("journal");
        let client = broker.client().await;
        let admin = Admin::new(client.clone());
        admin.create_queue(queue, test_queue_config(2, 30_000, 100)).await.unwrap();
        let producer = Producer::new(client.clone(), ProducerConfig::default()).unwrap();
        Self { broker, journal_dir, client, admin, producer }
    }
}

/// Keys of partitions 0 and 1 of a two-partition queue.
fn two_keys() -> (String, String) {
    (common::key_for(0, 2, 1), common::key_for(1, 2, 1))
}

/// Sends the bulk (`BULK_RECORDS` of `BULK_PAYLOAD_BYTES` filled with
/// `fill`, one at a time, ids `message_id(source, 0..)`) with `key`.
async fn send_bulk(producer: &Producer, queue: &str, key: &str, fill: u8, source: u32) {
    let payload = vec![fill; BULK_PAYLOAD_BYTES];
    for sequence in 0..BULK_RECORDS {
        let message = Message::new(payload.clone()).key(key).id(message_id(source, sequence));
        producer.send(queue, message).await.unwrap();
    }
}

// Goal: a journal broker releases the journal files nobody needs once
// their records are acked and the partitions checkpointed (so its data
// directory does not grow forever), keeps every file an unacked record
// still lies in when relocation is off (`--journal-garbage-ratio-max 1`:
// files go as a prefix, one old live record holds them all),
// loses nothing acknowledged when it is SIGKILLed after a release, and its
// journal commits reach the shard commit metrics (and the witness entries
// written after each awaited send their counter). Method: one shard, a
// queue of two partitions; one early record left unacked on partition 0,
// then 40 MiB enqueued one record at a time on partition 1 (scrape before
// and after: the commit size and duration histograms count every commit),
// all acked; the file count holds while the early record is live, drops to
// at most two once it is acked; then fresh unacked records, SIGKILL,
// restart: exactly those come back, once each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn journal_files_are_released_after_acks_and_a_kill_after_the_release_loses_nothing() {
    // Relocation off: this is the release alone (files go as a prefix);
    // no retain budget: every file goes as soon as nobody needs it.
    let args = ["--journal-garbage-ratio-max", "1", "--journal-retain-bytes", "0"];
    let OneShardJournal { mut broker, journal_dir, client, admin, producer } =
        OneShardJournal::start(&args, "rel").await;
    let (key0, key1) = two_keys();
    producer
        .send("rel", Message::new("early").key(key0.clone()).id(message_id(10, 0)))
        .await
        .unwrap();

    let before = scrape(&broker);
    send_bulk(&producer, "rel", &key1, 7, 11).await;
    // Idle past the witness delay (`WITNESS_DELAY_MS`, 5 ms), the journal
    // writes a witness: wait for the counter to show one.
    let witnessed = before.sum("spool_journal_witnesses_total") + 1.0;
    let what = "a witness entry after the bulk";
    wait_for_metric(&broker, "spool_journal_witnesses_total", what, |witnesses| {
        witnesses >= witnessed
    })
    .await;
    let after = scrape(&broker);
    let delta = |name: &str| after.sum(name) - before.sum(name);
    let commits = delta("spool_shard_commit_size_bytes_count");
    assert!(commits >= BULK_RECORDS as f64, "{commits} commits counted for {BULK_RECORDS} sends");
    // Each send waits for its reply: the committers go idle after each
    // commit, mostly for less than the witness delay (the next send's
    // commit vouches instead); the journal left idle after the last one
    // writes its witness.
    let witnesses = delta("spool_journal_witnesses_total");
    assert!(
        witnesses >= 1.0 && witnesses <= commits,
        "{witnesses} witness entries for {BULK_RECORDS} sends awaited one by one"
    );
    assert!(
        delta("spool_shard_commit_size_bytes_sum")
            >= (BULK_RECORDS as usize * BULK_PAYLOAD_BYTES) as f64,
        "the commit sizes do not hold the bulk"
    );
    assert_eq!(delta("spool_shard_commit_duration_seconds_count"), commits, "each commit timed");
    assert!(delta("spool_shard_commit_duration_seconds_sum") > 0.0);

    let bulk = ack_all(&client, "rel", 1, BULK_RECORDS as usize).await;
    assert_eq!(bulk.len(), BULK_RECORDS as usize);
    let full = wal_files(&journal_dir);
    assert!(full >= 5, "40 MiB over 8 MiB files: {full} files");
    // The early record lies in the first file: nothing can go yet (files
    // are released as a prefix). Several release passes run meanwhile.
    // Time under test (nothing happens): no metric counts release passes.
    tokio::time::sleep(RELEASE_PASSES_WAIT).await;
    assert_eq!(wal_files(&journal_dir), full, "a file holding a live record was released");
    let pinned = scrape(&broker);
    assert_eq!(pinned.sum("spool_journal_files"), full as f64);
    assert!(
        pinned.sum("spool_journal_files_without_live") >= (full - 2) as f64,
        "the drained files hold no live bytes: {}",
        pinned.sum("spool_journal_files_without_live")
    );
    assert_eq!(pinned.sum("spool_journal_released_files_total"), 0.0);

    let early = ack_all(&client, "rel", 0, 1).await;
    assert_eq!(early, vec![message_id(10, 0)]);
    let left = wait_files_at_most(&journal_dir, 2).await;
    assert!(left <= 2, "{full} journal files, {left} left after every record was acked");
    // A release pass unlists a file before it removes it: compare the
    // figures with the directory once the two agree (or the wait ends).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let (left, released) = loop {
        let released = scrape(&broker);
        let left = wal_files(&journal_dir);
        if released.sum("spool_journal_files") == left as f64
            || tokio::time::Instant::now() >= deadline
        {
            break (left, released);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(left <= 2, "{full} journal files, {left} left after every record was acked");
    assert!(released.sum("spool_journal_released_files_total") >= (full - 2) as f64);
    assert_eq!(released.sum("spool_journal_files"), left as f64);

    // Unacked records after the release, then a kill.
    for sequence in 0..6 {
        let key = if sequence % 2 == 0 { &key0 } else { &key1 };
        producer
            .send(
                "rel",
                Message::new(format!("late-{sequence}"))
                    .key(key.clone())
                    .id(message_id(12, sequence)),
            )
            .await
            .unwrap();
    }
    drop(producer);
    drop(admin);
    drop(client);
    broker.kill();
    broker.restart();
    let client = broker.client().await;
    let drained = drain(&client, "rel", 300, 2).await;
    let counts = count_by_id(&drained);
    let mut ids: Vec<_> = counts.keys().copied().collect();
    ids.sort_by_key(|id| id.0);
    let expected: Vec<_> = (0..6).map(|sequence| message_id(12, sequence)).collect();
    assert_eq!(ids, expected, "exactly the unacked records come back after the release and kill");
    assert!(counts.values().all(|count| *count == 1), "{counts:?}");
    for delivery in &drained {
        let (_, sequence) = id_parts(delivery.message_id());
        let expected = format!("late-{sequence}");
        assert_eq!(delivery.payload(), spool_client::PayloadView::Inline(expected.as_bytes()));
    }
}

// Goal: with relocation on (the default garbage ratio, 0.5), one early
// unacked record no longer holds the journal: after 40 MiB acked behind it
// the shard copies the record to the head, releases the old files and
// keeps a bounded number; the relocation metrics count it; a SIGKILL after
// that brings the record back, once, with its payload, and nothing acked.
// Method: one shard, a queue of two partitions; the early record on
// partition 0, the bulk on partition 1 acked; poll the journal directory,
// scrape, kill, restart, drain both partitions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_early_unacked_record_is_relocated_and_the_journal_stays_bounded_across_a_kill() {
    let OneShardJournal { mut broker, journal_dir, client, admin, producer } =
        OneShardJournal::start(&["--journal-retain-bytes", "0"], "reloc").await;
    let (key0, key1) = two_keys();
    producer
        .send("reloc", Message::new("early, never acked").key(key0).id(message_id(20, 0)))
        .await
        .unwrap();
    send_bulk(&producer, "reloc", &key1, 9, 21).await;
    let bulk = ack_all(&client, "reloc", 1, BULK_RECORDS as usize).await;
    assert_eq!(bulk.len(), BULK_RECORDS as usize);
    let full = wal_files(&journal_dir);
    assert!(full >= 5, "40 MiB over 8 MiB files: {full} files");
    // Relocation, the checkpoints it needs and the releases after it.
    let left = wait_files_at_most(&journal_dir, 3).await;
    assert!(left <= 3, "{full} journal files, {left} left with one early record live");
    let figures = scrape(&broker);
    assert!(figures.sum("spool_journal_relocated_bytes_total") > 0.0, "nothing relocated");
    assert!(figures.sum("spool_journal_relocated_entries_total") >= 1.0);
    assert!(figures.sum("spool_journal_released_files_total") >= (full - 3) as f64);
    drop(producer);
    drop(admin);
    drop(client);
    broker.kill();
    broker.restart();
    let client = broker.client().await;
    let drained = drain(&client, "reloc", 10, 2).await;
    let counts = count_by_id(&drained);
    assert_eq!(counts.len(), 1, "only the early record comes back: {counts:?}");
    assert_eq!(counts.get(&message_id(20, 0)), Some(&1), "{counts:?}");
    assert_eq!(
        drained[0].payload(),
        spool_client::PayloadView::Inline(b"early, never acked".as_slice())
    );
    assert!(wal_files(&journal_dir) <= 3);
}

// Goal: below its retain budget a shard asks no checkpoint of an idle
// partition pinning its oldest journal file (that costs a side file and a
// sync per partition; with thousands of partitions, per file written), so
// the files stay; once the shard holds more than the budget, the pass asks
// for the checkpoint and the files go; nothing acked comes back across
// the SIGKILL in between. Method: one shard, relocation off; partition 0
// gets one record, acked (idle, no checkpoint: it pins the first file);
// partition 1 gets 40 MiB one record at a time, acked. With a 1 GiB budget
// three release passes leave every file and ask nothing; SIGKILL, restart
// with a 16 MiB budget (the shard holds five 8 MiB files): the idle
// partition is asked, files drop to at most two; then a drain finds
// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn below_its_retain_budget_a_shard_asks_no_checkpoint_and_above_it_files_go() {
    let args = ["--journal-garbage-ratio-max", "1", "--journal-retain-bytes", "1073741824"];
    let OneShardJournal { mut broker, journal_dir, client, admin, producer } =
        OneShardJournal::start(&args, "budget").await;
    let (key0, key1) = two_keys();
    producer.send("budget", Message::new("idle").key(key0).id(message_id(30, 0))).await.unwrap();
    assert_eq!(ack_all(&client, "budget", 0, 1).await, vec![message_id(30, 0)]);
    send_bulk(&producer, "budget", &key1, 5, 31).await;
    let bulk = ack_all(&client, "budget", 1, BULK_RECORDS as usize).await;
    assert_eq!(bulk.len(), BULK_RECORDS as usize);
    let full = wal_files(&journal_dir);
    assert!(full >= 5, "40 MiB over 8 MiB files: {full} files");
    // Time under test (nothing happens): no metric counts release passes.
    tokio::time::sleep(RELEASE_PASSES_WAIT).await;
    let held = scrape(&broker);
    assert_eq!(
        held.sum("spool_journal_release_checkpoints_total"),
        0.0,
        "a checkpoint was asked below the budget"
    );
    assert_eq!(wal_files(&journal_dir), full, "the idle partition's pin was moved below budget");
    assert_eq!(held.sum("spool_journal_released_files_total"), 0.0);

    drop(producer);
    drop(admin);
    drop(client);
    broker.kill();
    let args = &mut broker.options_mut().args;
    let at = args.iter().position(|arg| arg == "--journal-retain-bytes").unwrap();
    args[at + 1] = (16u64 << 20).to_string();
    broker.restart();
    let left = wait_files_at_most(&journal_dir, 2).await;
    assert!(left <= 2, "{full} journal files, {left} left over the budget");
    let over = scrape(&broker);
    assert!(
        over.sum("spool_journal_release_checkpoints_total") >= 1.0,
        "over the budget the idle partition was not asked for a checkpoint"
    );
    let client = broker.client().await;
    let drained = drain(&client, "budget", 300, 2).await;
    assert!(drained.is_empty(), "acked records came back: {} of them", drained.len());
}
