// Goal: damaged files never make spoold serve wrong data or undo an
// acknowledged change: after each kind of damage it either recovers a state
// that keeps every acknowledged enqueue and ack, or refuses (the partition,
// or the shard and so the start) naming the file, and for the journal the
// byte. Method: one real spoold with one shard, ~20 MiB of enqueues over
// 8 MiB journal files (so the shard journal spans three `.wal` files), a
// pause so a dedupe generation seals, acked claims, SIGTERM; then per case a
// copy of the data dir is damaged (bit flips, truncation, a missing file),
// a spoold started on it, and the outcome classified and checked: drained
// payloads must equal what was sent, acked ids must not come back, and a
// refusal must name the damaged file (and, for the journal, the exact byte
// of the damaged entry, found by walking the `.wal` files header by header:
// `spool_tests::fault::journal_entries`, `docs/design/shard-journal.md`
// §2). A last, undamaged copy must recover fully (the control).
//
// The journal cases and the rule they check (shard-journal.md §5): damage
// below the highest durable watermark an intact entry records (`W`) is
// acknowledged data and refuses the shard naming file and byte; damage past
// it is a torn tail and is cut. SIGTERM leaves a witness entry vouching for
// the last commit, so every entry written before the stop is below `W`.
// Cases ending `_without_checkpoint` first remove the partition's
// checkpoint (a partition killed before its first one): then only the
// watermark rule stands between damage and a silent cut, where with the
// checkpoint the partition's own check of it against the journal would
// also refuse.
//
// Cases of the segment log this replaced, and where they went: a flip in
// the tail batch of the active segment → `a_last_data_entry_payload_flip`;
// in a batch of a sealed segment → `a_data_payload_flip_below_watermark`
// (now refused at start: recovery checks every entry from the scan start,
// so there is no "refused on read" any more); before the tail of the
// active segment → `b_data_entry_header_flip` (header) and
// `b_control_entry_payload_flip` (a claim or ack); a sealed and the active
// segment truncated mid-batch → `d_older_wal_truncated_mid_entry` and
// `d_last_wal_truncated_mid_entry` (both refused, but not naming the
// damaged file and byte: see each case); checkpoint flip and truncation →
// `e_checkpoint_*` (a damaged checkpoint now refuses the whole shard: its
// scan start is read before the journal opens); secret flip and truncation
// unchanged. Dropped, their subject gone: `c_index_file` (segment index
// files: the journal has none, a partition's index is rebuilt in memory by
// the scan) and `e_epoch_flip` (the `epoch` side file exists only in
// directories written before the handles table took the epochs; the table
// is damaged in `f_handles_*` instead). New: a torn tail past the last
// commit (cut), a damaged stale `next.prep` (deleted), a missing journal
// file in the middle, an unaligned journal file length, a dedupe
// generation file, the handles table, and a flip in an entry below the
// checkpoint's scan start (never read again: rightly no error).
//
// How it was shown able to fail: against a spoold built from a copy of
// this tree with the watermark rule taken out of recovery (`recovery.rs`
// `repair` cut every damage as a torn tail instead of refusing it below
// `W`), six cases failed: `a_data_payload_flip_below_watermark_without_
// checkpoint` and `b_control_entry_payload_flip_without_checkpoint`
// "recovered" with acked messages delivered again (the cut took the acks)
// and acknowledged enqueues missing; `b_control_entry_payload_flip`
// recovered (outcome not allowed: the SIGTERM checkpoint held the cut
// acks); and the payload, last-entry and header flips with a checkpoint
// were refused only by the partition's checkpoint-against-journal check
// ("the checkpoint covers offset 1280 but the journal holds this
// partition's data only to offset 705"), outcome not allowed. Against the
// spoold of this tree all cases pass; the ignored test at the end fails
// (a known gap, see there).

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use spool_client::spool_wire::batch::MessageId;
use spool_client::spool_wire::proto::{PartitionId, QueueConfig};
use spool_client::spool_wire::ErrorCode;
use spool_client::{Admin, Client, Delivery, Message, Producer, ProducerConfig};
use spool_tests::fault::{
    claim_options, copy_dir_all, drain_partition, files_ending, flip_bit, journal_dir,
    journal_entries, journal_file_base, journal_files, message_id, partition_dirs, payload_for,
    shard_dir, EntryAt, JOURNAL_PREPARED_NAME,
};
use spool_tests::{
    test_queue_config, Spoold, SpooldOptions, StartFailed, SEGMENT_BYTES_TEST, START_TIMEOUT,
};

const QUEUE: &str = "corrupt";
const P0: PartitionId = PartitionId(0);
/// Payload size: with `MESSAGES` of them the journal (8 MiB files) spans
/// three files.
const PAYLOAD_BYTES: usize = 16 * 1024;
const MESSAGES: u64 = 1280;
/// Messages claimed and acked before the stop (the oldest, FIFO: offsets
/// `0..ACKED`).
const ACKED: usize = 120;
/// The queue's dedupe window: short, so that a generation (an eighth of
/// it) seals during the seed and its side file is written.
const DEDUPE_WINDOW_MS: u64 = 16_000;
/// The seed's pause halfway, longer than a dedupe generation.
const GENERATION_PAUSE: Duration = Duration::from_millis(2_500);
const PAGE_BYTES: u64 = 4096;

/// What the seeded broker acknowledged.
struct Seeded {
    /// The broker, stopped; its data dir is the pristine copy source.
    broker: Spoold,
    enqueued: HashSet<MessageId>,
    acked: HashSet<MessageId>,
}

fn queue_config() -> QueueConfig {
    QueueConfig { dedupe_window_ms: DEDUPE_WINDOW_MS, ..test_queue_config(1, 30_000, 100) }
}

async fn seed() -> Seeded {
    let mut broker = Spoold::start(1);
    let client = broker.client().await;
    Admin::new(client.clone()).create_queue(QUEUE, queue_config()).await.unwrap();
    let producer = Producer::new(client.clone(), ProducerConfig::default()).unwrap();
    let mut enqueued = HashSet::new();
    for chunk in 0..MESSAGES / 64 {
        if chunk == MESSAGES / 64 / 2 {
            // Time under test: a dedupe generation seals as time passes.
            tokio::time::sleep(GENERATION_PAUSE).await;
        }
        let mut pending = Vec::new();
        for sequence in chunk * 64..(chunk + 1) * 64 {
            let id = message_id(1, sequence);
            let message = Message::new(payload_for(id, PAYLOAD_BYTES)).id(id);
            pending.push((id, producer.submit(QUEUE, message).await.unwrap()));
        }
        for (id, future) in pending {
            future.await.unwrap();
            enqueued.insert(id);
        }
    }
    let mut acked = HashSet::new();
    while acked.len() < ACKED {
        let want = u32::try_from(ACKED - acked.len()).unwrap().min(40);
        let batch = client.claim(QUEUE, P0, &claim_options(7, want, 30_000, 1_000)).await.unwrap();
        assert!(!batch.deliveries.is_empty(), "seeded messages are claimable");
        for delivery in &batch.deliveries {
            assert!(delivery.offset().0 < ACKED as u64, "FIFO: offset {}", delivery.offset().0);
        }
        let tokens: Vec<_> = batch.deliveries.iter().map(Delivery::token).collect();
        client.ack(QUEUE, P0, &tokens).await.expect("every token acks");
        acked.extend(batch.deliveries.iter().map(Delivery::message_id));
    }
    drop(client);
    let status = broker.terminate();
    assert!(status.success(), "SIGTERM exit {status}");
    let data_dir = broker.data_dir();
    let dirs = partition_dirs(&data_dir);
    assert_eq!(dirs.len(), 1, "one partition: {dirs:?}");
    assert!(dirs[0].join("checkpoint").is_file(), "SIGTERM writes a checkpoint");
    assert!(!files_ending(&dirs[0], ".gen").is_empty(), "a dedupe generation file");
    assert!(shard_dir(&data_dir, 0).join("handles").is_file(), "the handles table");
    let files = journal_files(&data_dir, 0);
    assert!(files.len() >= 3, "the journal must span three files: {files:?}");
    let journal = Journal::read(&data_dir);
    // Every journal file before the last is full of entries up to its zero
    // tail, and the stop left a witness: a filler vouching for everything
    // before it (its watermark is its own position).
    let last = journal.files.last().unwrap().1.last().copied().unwrap();
    assert!(
        last.is_filler() && last.watermark == last.position,
        "the last entry is a witness: {last:?}"
    );
    Seeded { broker, enqueued, acked }
}

/// The shard journal of a data dir, walked entry by entry.
struct Journal {
    files: Vec<(PathBuf, Vec<EntryAt>)>,
}

impl Journal {
    fn read(data_dir: &Path) -> Self {
        let files = journal_files(data_dir, 0)
            .into_iter()
            .map(|path| {
                let entries = journal_entries(&path).unwrap();
                (path, entries)
            })
            .collect();
        Self { files }
    }

    /// Every entry matching `keep`, with its file, in journal order.
    fn entries(&self, keep: impl Fn(&EntryAt) -> bool) -> Vec<(PathBuf, EntryAt)> {
        self.files
            .iter()
            .flat_map(|(path, entries)| {
                entries.iter().filter(|entry| keep(entry)).map(|entry| (path.clone(), *entry))
            })
            .collect()
    }

    /// Data entries holding only records that were not acked.
    fn unacked_data(&self, file: usize) -> Vec<EntryAt> {
        self.files[file]
            .1
            .iter()
            .filter(|entry| entry.is_data() && entry.base_offset >= ACKED as u64)
            .copied()
            .collect()
    }
}

/// How a damaged copy ended.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum Outcome {
    /// Served everything acknowledged, correctly.
    Recovered,
    /// Kept running but refused the partition, naming the damage.
    RefusedPartition,
    /// Exited non-zero naming the damage (a shard that cannot recover its
    /// journal or handles table refuses the start).
    RefusedStart,
    /// Opened, served every record before the damage correctly, and
    /// refused a damaged batch on read with STORAGE_FAILED. Allowed by no
    /// case: recovery checks every entry it scans, and every live record's
    /// entry is scanned; it is told apart only to report it clearly.
    RefusedOnRead,
}

/// One kind of damage and the outcomes it may have.
struct Case {
    name: &'static str,
    /// What a refusal must mention: the damaged file's name, and more
    /// (the position of a missing file).
    names: Vec<String>,
    /// The byte a refusal must name (`byte N`): the file offset of the
    /// damaged journal entry.
    byte: Option<u64>,
    allowed: &'static [Outcome],
    /// What a refusal of the partition must mention instead of `names`
    /// and `byte` (a partition refuses on its own checks, which name it).
    partition_names: Option<Vec<String>>,
    /// What a recovery must have logged (that it cut, or deleted).
    recovery_logs: Option<String>,
}

fn name_of(path: &Path) -> String {
    path.file_name().unwrap().to_string_lossy().into_owned()
}

fn truncate(path: &Path, len: u64) {
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.set_len(len).unwrap();
    file.sync_all().unwrap();
}

/// The journal position a partition's checkpoint makes its recovery start
/// from (the side file's value, bytes 16..24; `partition/files.rs`).
fn checkpoint_scan_start(partition_dir: &Path) -> u64 {
    let bytes = std::fs::read(partition_dir.join("checkpoint")).unwrap();
    assert_eq!(&bytes[0..4], b"SPCK", "a checkpoint side file");
    u64::from_le_bytes(bytes[16..24].try_into().unwrap())
}

/// Suffix of a case applied to a copy whose partition has no checkpoint
/// (removed first: the state of a partition killed before its first one,
/// whose recovery replays the journal from its oldest file). Nothing but
/// the journal's own watermark rule then tells acknowledged entries from a
/// torn tail: the partition's check of its checkpoint against the journal
/// cannot stand in for it.
const WITHOUT_CHECKPOINT: &str = "_without_checkpoint";

/// Applies case `name` to the copy at `data_dir` and says what to expect.
#[allow(clippy::too_many_lines)]
fn damage(name: &'static str, data_dir: &Path) -> Case {
    use Outcome::{Recovered, RefusedPartition, RefusedStart};
    let partition = partition_dirs(data_dir).remove(0);
    if let Some(base) = name.strip_suffix(WITHOUT_CHECKPOINT) {
        std::fs::remove_file(partition.join("checkpoint")).unwrap();
        let base: &'static str = CASES.iter().find(|case| **case == base).unwrap();
        return Case { name, ..damage(base, data_dir) };
    }
    let journal = Journal::read(data_dir);
    let files: Vec<PathBuf> = journal.files.iter().map(|(path, _)| path.clone()).collect();
    let last_file = files.len() - 1;
    let case = |file: &Path, byte: Option<u64>, allowed: &'static [Outcome]| Case {
        name,
        names: vec![name_of(file)],
        byte,
        allowed,
        partition_names: None,
        recovery_logs: None,
    };
    match name {
        "a_data_payload_flip_below_watermark" => {
            // An unacked data entry in the middle of the journal: its
            // batch's body crc no longer matches.
            let entries = journal.unacked_data(1);
            let entry = entries[entries.len() / 2];
            flip_bit(
                &files[1],
                entry.payload_pos() + (entry.len_bytes - entry.header_bytes) / 2,
                5,
            )
            .unwrap();
            case(&files[1], Some(entry.pos), &[RefusedStart])
        }
        "a_last_data_entry_payload_flip" => {
            // The newest enqueue: below `W` only because later entries (the
            // acks, the checkpoint's, the witness) record a watermark past it.
            let (file, entry) = journal.entries(EntryAt::is_data).pop().unwrap();
            flip_bit(&file, entry.payload_pos() + 70, 3).unwrap();
            case(&file, Some(entry.pos), &[RefusedStart])
        }
        "b_data_entry_header_flip" => {
            // The watermark field of an unacked data entry's header: its
            // header crc no longer matches.
            let entries = journal.unacked_data(0);
            let entry = entries[entries.len() * 2 / 3];
            flip_bit(&files[0], entry.pos + 17, 1).unwrap();
            case(&files[0], Some(entry.pos), &[RefusedStart])
        }
        "b_control_entry_payload_flip" => {
            // A claim or ack written after every enqueue: a journal that cut
            // it would undo acknowledged acks.
            let last_data = journal.entries(EntryAt::is_data).pop().unwrap().1.position;
            let controls =
                journal.entries(|entry| entry.is_control() && entry.position > last_data);
            assert!(!controls.is_empty(), "the claims and acks follow the enqueues");
            let (file, entry) = controls[controls.len() / 2].clone();
            flip_bit(&file, entry.end() - 8, 6).unwrap();
            case(&file, Some(entry.pos), &[RefusedStart])
        }
        "c_torn_tail_past_the_last_commit" => {
            // Bytes past the witness, where the next commit would have gone:
            // what a commit torn by a crash leaves. Past `W`: cut.
            let (file, witness) = journal.entries(|_| true).pop().unwrap();
            let end = witness.end();
            assert_eq!(end % PAGE_BYTES, 0, "commits end on a page");
            flip_bit(&file, end + 3, 0).unwrap();
            flip_bit(&file, end + 2 * PAGE_BYTES + 100, 4).unwrap();
            Case {
                recovery_logs: Some(format!("torn_tail_cut_at=Some({end})")),
                ..case(&file, None, &[Recovered])
            }
        }
        "c_garbage_next_prep" => {
            // A `next.prep` whose zero-fill a crash cut short: never part of
            // the journal, deleted at start.
            let prepared = journal_dir(data_dir, 0).join(JOURNAL_PREPARED_NAME);
            assert!(prepared.is_file(), "the stop left a prepared file");
            flip_bit(&prepared, 4096 * 3 + 5, 2).unwrap();
            truncate(&prepared, 1 << 20);
            Case {
                recovery_logs: Some("prepared_removed=true".to_owned()),
                ..case(&prepared, None, &[Recovered])
            }
        }
        "d_older_wal_truncated_mid_entry" => {
            // The first file cut at a page boundary inside an unacked entry
            // (its length stays a whole number of pages). Recovery checks
            // that each file starts where the one before ends before it
            // reads any entry, so the refusal names the next file, at byte
            // 0, and the position where the short one now ends (inside the
            // first file), not the short file itself.
            let entry = journal
                .unacked_data(0)
                .into_iter()
                .rev()
                .find(|entry| entry.end() / PAGE_BYTES * PAGE_BYTES > entry.pos)
                .unwrap();
            let len = entry.end() / PAGE_BYTES * PAGE_BYTES;
            truncate(&files[0], len);
            let base = journal_file_base(&files[0]).unwrap();
            Case {
                names: vec![name_of(&files[1]), format!("expected {}", base + len)],
                ..case(&files[1], Some(0), &[RefusedStart])
            }
        }
        "d_last_wal_truncated_mid_entry" => {
            // The newest file cut at a page boundary inside its last data
            // entry: every entry after it (the acks, the witness) is gone
            // with it, so no intact entry records a watermark past the cut
            // and recovery takes it for a torn tail and cuts there. What
            // refuses is the partition's check of its checkpoint against
            // the journal (the checkpoint covers offsets the journal no
            // longer holds), naming the partition, not the file. Refusing
            // the shard naming file and byte would do too.
            let entry = *journal.files[last_file]
                .1
                .iter()
                .rev()
                .find(|entry| entry.is_data() && entry.end() / PAGE_BYTES * PAGE_BYTES > entry.pos)
                .unwrap();
            truncate(&files[last_file], entry.end() / PAGE_BYTES * PAGE_BYTES);
            let partition_names = vec![
                name_of(&partition),
                format!("journal holds this partition's data only to offset {}", entry.base_offset),
                "acknowledged batches are damaged or missing".to_owned(),
            ];
            Case {
                partition_names: Some(partition_names),
                ..case(&files[last_file], Some(entry.pos), &[RefusedStart, RefusedPartition])
            }
        }
        "d_last_wal_truncated_unaligned" => {
            // The newest file cut to a length no journal file has.
            let len = std::fs::metadata(&files[last_file]).unwrap().len();
            truncate(&files[last_file], len - 1000);
            case(&files[last_file], Some(0), &[RefusedStart])
        }
        "e_checkpoint_flip" => {
            let checkpoint = partition.join("checkpoint");
            flip_bit(&checkpoint, 100, 2).unwrap();
            case(&checkpoint, None, &[Recovered, RefusedPartition, RefusedStart])
        }
        "e_checkpoint_truncated" => {
            let checkpoint = partition.join("checkpoint");
            truncate(&checkpoint, 100);
            case(&checkpoint, None, &[Recovered, RefusedPartition, RefusedStart])
        }
        "e_dedupe_generation_flip" => {
            // A sealed generation the checkpoint refers to: restoring
            // without it would silently empty the dedupe window.
            let generation = files_ending(&partition, ".gen").remove(0);
            flip_bit(&generation, 40, 3).unwrap();
            case(&generation, None, &[RefusedPartition, RefusedStart])
        }
        "f_handles_flip" => {
            // An entry's row (its handle, queue, partition, epoch): a flip
            // in the entries' crc range.
            let handles = shard_dir(data_dir, 0).join("handles");
            flip_bit(&handles, 32 + 4, 0).unwrap();
            case(&handles, None, &[RefusedStart])
        }
        "f_handles_truncated" => {
            let handles = shard_dir(data_dir, 0).join("handles");
            truncate(&handles, 20);
            case(&handles, None, &[RefusedStart])
        }
        "g_missing_wal_in_the_middle" => {
            // The refusal names the file after the hole and the position
            // the missing one started at.
            let missing = journal_file_base(&files[1]).unwrap();
            std::fs::remove_file(&files[1]).unwrap();
            Case {
                names: vec![name_of(&files[2]), format!("expected {missing}")],
                ..case(&files[2], Some(0), &[RefusedStart])
            }
        }
        "h_acked_entry_below_the_scan_start_flip" => {
            // An entry all of whose records are acked, wholly below where
            // the checkpoint makes recovery start: never read again, which
            // is rightly no error.
            let start = checkpoint_scan_start(&partition);
            let (file, entry) = journal
                .entries(|entry| {
                    entry.is_data()
                        && entry.position + entry.len_bytes <= start
                        && entry.base_offset + u64::from(entry.record_count) <= ACKED as u64
                })
                .pop()
                .expect("an acked entry below the checkpoint's scan start");
            flip_bit(&file, entry.payload_pos() + 200, 7).unwrap();
            case(&file, None, &[Recovered])
        }
        "i_secret_flip" => {
            let secret = data_dir.join("secret");
            flip_bit(&secret, 9, 7).unwrap();
            // Any 32 bytes are a valid key; only old tokens die with it.
            case(&secret, None, &[Recovered])
        }
        "i_secret_truncated" => {
            let secret = data_dir.join("secret");
            truncate(&secret, 20);
            case(&secret, None, &[RefusedStart])
        }
        other => panic!("unknown case {other}"),
    }
}

const CASES: &[&str] = &[
    "a_data_payload_flip_below_watermark",
    "a_data_payload_flip_below_watermark_without_checkpoint",
    "a_last_data_entry_payload_flip",
    "b_data_entry_header_flip",
    "b_control_entry_payload_flip",
    "b_control_entry_payload_flip_without_checkpoint",
    "c_torn_tail_past_the_last_commit",
    "c_garbage_next_prep",
    "d_older_wal_truncated_mid_entry",
    "d_last_wal_truncated_mid_entry",
    "d_last_wal_truncated_unaligned",
    "e_checkpoint_flip",
    "e_checkpoint_truncated",
    "e_dedupe_generation_flip",
    "f_handles_flip",
    "f_handles_truncated",
    "g_missing_wal_in_the_middle",
    "h_acked_entry_below_the_scan_start_flip",
    "i_secret_flip",
    "i_secret_truncated",
];

/// Checks a broker that answered a claim: every acknowledged enqueue that
/// was not acked is delivered exactly once with its own payload, and no
/// acked one comes back.
async fn check_recovered(client: &Client, seeded: &Seeded) -> Result<(), String> {
    let drained =
        drain_partition(client, QUEUE, P0, 500).await.map_err(|error| error.to_string())?;
    let mut problems = Vec::new();
    for (id, (offset, payload)) in &drained {
        if seeded.acked.contains(id) {
            problems.push(format!("acked {id:?} came back at offset {offset}"));
        } else if !seeded.enqueued.contains(id) {
            problems.push(format!("unknown id {id:?} at offset {offset}"));
        } else if *payload != payload_for(*id, PAYLOAD_BYTES) {
            problems.push(format!("wrong payload for {id:?} at offset {offset}"));
        }
    }
    let expected: HashSet<&MessageId> = seeded.enqueued.difference(&seeded.acked).collect();
    let got: HashSet<&MessageId> = drained.keys().collect();
    let missing = expected.difference(&got).count();
    if missing > 0 {
        let what = format!("{missing} of {} acknowledged enqueues missing", expected.len());
        problems.insert(0, what);
    }
    if problems.is_empty() {
        Ok(())
    } else {
        problems.truncate(5);
        Err(problems.join("; "))
    }
}

/// The lines of a broker log that report a failure (what a refusal must
/// be found in: not an info line that happens to name the file).
fn failure_lines(log: &str) -> String {
    log.lines()
        .filter(|line| line.contains("ERROR") || line.contains("WARN") || line.contains("fatal"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Waits until `broker` logs that it started (every shard recovered and
/// serving), or exits: then its status.
fn wait_started(broker: &mut Spoold) -> Option<ExitStatus> {
    let started = spool_tests::now();
    while !broker.log().contains("spoold started") {
        if let Some(status) = broker.wait_exit(Duration::from_millis(50)) {
            return Some(status);
        }
        assert!(started.elapsed() < START_TIMEOUT, "spoold neither started nor exited");
    }
    None
}

/// Runs one case on a fresh copy; returns the outcome or why it is wrong.
async fn run_case(name: &'static str, seeded: &Seeded, scratch: &Path) -> Result<Outcome, String> {
    let data_dir: PathBuf = scratch.join(name);
    copy_dir_all(&seeded.broker.data_dir(), &data_dir).unwrap();
    // The copy holds the seeded broker's LOCK file; the lock is a flock, so
    // the stale file is harmless (the seeded process is gone).
    let case = damage(name, &data_dir);
    let mut options = SpooldOptions::new(1);
    options.data_dir = Some(data_dir);
    let started = Spoold::try_start_with(options).and_then(|mut broker| {
        // The shard ports accept before the shards have recovered: a shard
        // that refuses its journal ends the process a moment later.
        match wait_started(&mut broker) {
            Some(status) => Err(StartFailed { status: Some(status), log: broker.log() }),
            None => Ok(broker),
        }
    });
    let (outcome, detail) = match started {
        Err(failed) => {
            let exited = failed.status.is_some_and(|status| !status.success());
            if !exited {
                return Err(format!("start neither served nor exited non-zero: {failed}"));
            }
            (Outcome::RefusedStart, failure_lines(&failed.log))
        }
        Ok(broker) => {
            let client = broker.client().await;
            let outcome = match client.claim(QUEUE, P0, &claim_options(9, 1, 1_000, 0)).await {
                Err(error) if error.code() == Some(ErrorCode::StorageFailed) => {
                    let log = broker.log();
                    if !log.contains("refused to open") {
                        return Err(format!("no 'refused to open' in the log:\n{log}"));
                    }
                    (Outcome::RefusedPartition, format!("{error}\n{}", failure_lines(&log)))
                }
                Err(error) => return Err(format!("claim failed otherwise: {error}")),
                Ok(batch) => {
                    // Give the probe claim back before draining.
                    let tokens: Vec<_> = batch.deliveries.iter().map(Delivery::token).collect();
                    for token in tokens {
                        client
                            .release(QUEUE, P0, token, 0, "probe")
                            .await
                            .map_err(|e| e.to_string())?;
                    }
                    match check_recovered(&client, seeded).await {
                        Ok(()) => (Outcome::Recovered, String::new()),
                        // Only a typed refusal counts; wrong payloads or
                        // lost acks stay failures.
                        Err(why) if why.contains("STORAGE_FAILED") && why.contains("corrupt") => {
                            (Outcome::RefusedOnRead, why)
                        }
                        Err(why) => return Err(why),
                    }
                }
            };
            if outcome.0 == Outcome::Recovered {
                if let Some(logged) = &case.recovery_logs {
                    let log = broker.log();
                    if !log.contains(logged) {
                        return Err(format!("recovered without logging {logged:?}:\n{log}"));
                    }
                }
            }
            outcome
        }
    };
    if !case.allowed.contains(&outcome) {
        return Err(format!("outcome {outcome:?} not in {:?}: {detail}", case.allowed));
    }
    let (names, byte) = match (&case.partition_names, outcome) {
        (Some(names), Outcome::RefusedPartition) => (names, None),
        _ => (&case.names, case.byte),
    };
    if outcome != Outcome::Recovered {
        for named in names {
            if !detail.contains(named) {
                return Err(format!("refusal does not name {named}: {detail}"));
            }
        }
        if let Some(byte) = byte {
            if !detail.contains(&format!("byte {byte}:")) {
                return Err(format!("refusal does not name byte {byte}: {detail}"));
            }
        }
    }
    let last = detail.lines().last().unwrap_or("");
    eprintln!("case {}: {outcome:?} {last}", case.name);
    Ok(outcome)
}

// Goal and method: see the file comment. Every case runs even if an
// earlier one fails, so one run reports them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_files_recover_everything_acknowledged_or_refuse_by_name() {
    assert_eq!(SEGMENT_BYTES_TEST, 8 << 20, "the seed's sizes assume 8 MiB journal files");
    let seeded = seed().await;
    assert_eq!(seeded.enqueued.len() as u64, MESSAGES);
    assert_eq!(seeded.acked.len(), ACKED);
    let scratch = tempfile::Builder::new().prefix("spool-corrupt-").tempdir().unwrap();
    let mut outcomes = BTreeMap::new();
    let mut failures = Vec::new();
    for name in CASES {
        match run_case(name, &seeded, scratch.path()).await {
            Ok(outcome) => {
                outcomes.insert(*name, outcome);
            }
            Err(why) => failures.push(format!("{name}: {why}")),
        }
    }
    eprintln!("outcomes: {outcomes:?}");
    assert!(failures.is_empty(), "{} case(s) failed:\n{}", failures.len(), failures.join("\n\n"));
    // The control: an undamaged copy must recover fully (else the checks
    // above would pass for a broker that refuses everything).
    let control = scratch.path().join("control");
    copy_dir_all(&seeded.broker.data_dir(), &control).unwrap();
    let mut options = SpooldOptions::new(1);
    options.data_dir = Some(control);
    let broker = Spoold::start_with(options);
    let client = broker.client().await;
    check_recovered(&client, &seeded).await.unwrap();
}

// Goal: the newest journal file cut at a page boundary inside an entry, in
// a shard whose partition has no checkpoint (a partition killed before its
// first one), is refused naming the file and byte — never taken for a torn
// tail. Method: as the main test, one case.
//
// How it was shown able to fail: before recovery refused an intact entry
// header whose entry runs past the end of its file (`JournalDamage::
// RunsPastFileEnd`), it cut there as a torn tail: the acks after the cut
// were undone (acked messages delivered again) and the last acknowledged
// enqueues were gone, silently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_newest_journal_file_without_a_checkpoint_is_refused() {
    let seeded = seed().await;
    let scratch = tempfile::Builder::new().prefix("spool-corrupt-").tempdir().unwrap();
    let name = "d_last_wal_truncated_mid_entry_without_checkpoint";
    let outcome = run_case(name, &seeded, scratch.path()).await;
    assert_eq!(outcome, Ok(Outcome::RefusedStart));
}
