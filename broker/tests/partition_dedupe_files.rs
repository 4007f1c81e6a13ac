//! Sealed dedupe generations written once as side files, on both log
//! layouts: a checkpoint's bytes follow the live state and the open
//! generation, not the window; a crash between writing a generation file
//! and the checkpoint that refers to it, or while old ones are deleted,
//! recovers the window; a damaged or missing referenced file refuses the
//! open, naming it.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is the failure report

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::path::Path;
use std::rc::Rc;

mod partition_layout;

use glommio::{LocalExecutorBuilder, Placement};
use partition_layout::{open_partition, Layout};
use spool_broker::io::{CrashMode, SimStorage};
use spool_broker::log::{LogConfig, RecordFatal};
use spool_broker::partition::{Clock, EnqueueOutcome, Partition, PartitionError, PartitionName};
use spool_broker::queue::{ClaimRequest, Lane, PartitionId, QueueConfig, QueueId, WorkerId};
use spool_wire::batch::{BatchBytes, DataBatchBuilder, MessageId, Payload, Record};

const START_MS: u64 = 1_700_000_000_000;
/// The dedupe window of these tests: generations of 1 s.
const WINDOW_MS: u64 = 8_000;
/// Ids per batch, and the time between batches.
const BATCH: u64 = 50;
const STEP_MS: u64 = 250;

fn run<T>(future: impl Future<Output = T>) -> T {
    LocalExecutorBuilder::new(Placement::Unbound)
        .io_memory(0)
        .make()
        .expect("glommio executor")
        .run(future)
}

fn dir() -> &'static Path {
    Path::new("/data/p0")
}

fn config() -> QueueConfig {
    QueueConfig { dedupe_window_ms: WINDOW_MS, max_messages: 1 << 30, ..QueueConfig::default() }
}

fn unique_batch(first: u64, count: u64, now_ms: u64) -> BatchBytes {
    let mut builder = DataBatchBuilder::new();
    for id in first..first + count {
        let mut message_id = [0u8; 16];
        message_id[..8].copy_from_slice(&id.to_le_bytes());
        let record = Record {
            message_id: MessageId(message_id),
            routing_key: vec![],
            headers: vec![],
            payload: Payload::Inline(vec![1; 16]),
            priority: 0,
            not_before_ms: 0,
            expiry_ms: 0,
            enqueue_time_ms: now_ms,
        };
        builder.push(&record).unwrap();
    }
    builder.finish().unwrap()
}

type Opened = (Rc<Partition<SimStorage>>, glommio::task::JoinHandle<()>);

async fn try_open(
    layout: Layout,
    disk: &SimStorage,
    now: &Rc<Cell<u64>>,
) -> Result<Opened, PartitionError> {
    let name =
        PartitionName { queue: "jobs".into(), queue_id: QueueId(1), partition: PartitionId(0) };
    let clock: Clock = {
        let now = now.clone();
        Rc::new(move || now.get())
    };
    let (partition, background, _report) = open_partition(
        layout,
        disk.clone(),
        dir(),
        name,
        config(),
        LogConfig { segment_bytes: 8 << 20, ..LogConfig::default() },
        Rc::new(RecordFatal::default()),
        clock,
    )
    .await?;
    let task = glommio::spawn_local(background.into_future()).detach();
    Ok((partition, task))
}

/// Enqueues `BATCH` new ids at the clock's time, claims and acks them:
/// nothing stays live but their dedupe entries.
async fn cycle(partition: &Partition<SimStorage>, first: u64, now: u64) {
    let outcomes = partition.enqueue(&unique_batch(first, BATCH, now)).await.unwrap();
    assert!(outcomes.iter().all(|o| matches!(o, EnqueueOutcome::Appended { .. })));
    let request = ClaimRequest {
        sub: spool_broker::queue::SubscriptionId::DEFAULT,
        worker: WorkerId(1),
        credits: BATCH as u32,
        max_bytes: 1 << 20,
        lease_ms: None,
    };
    let claimed = partition.claim(&request, Lane::Main, 0).await.unwrap();
    assert_eq!(claimed.len() as u64, BATCH);
    let tokens: Vec<_> = claimed.iter().map(|c| c.delivery.token).collect();
    assert!(partition.ack(&tokens).await.iter().all(Result::is_ok));
}

/// The generation files in the partition directory.
fn generation_files(disk: &SimStorage) -> Vec<String> {
    disk.names_in(dir()).into_iter().filter(|name| name.starts_with("dedupe-")).collect()
}

/// Whether resending id `id` is answered as a duplicate.
async fn is_duplicate(partition: &Partition<SimStorage>, id: u64, now: u64) -> bool {
    let outcomes = partition.enqueue(&unique_batch(id, 1, now)).await.unwrap();
    matches!(outcomes[0], EnqueueOutcome::Duplicate { .. })
}

both_layouts!(
    checkpoint_bytes_follow_the_open_generation_not_the_window,
    a_crash_around_generation_files_recovers_the_window,
    a_damaged_or_missing_generation_file_refuses_the_open_naming_it,
);

// Goal: after many checkpoints at a high id rate with nothing live, each
// checkpoint's own bytes stay bounded by the open generation (plus a
// reference per sealed one), and each id goes to a generation file at most
// once: the bytes written per checkpoint follow the live state, not the
// window. Method: 8 s window, 200 ids/s enqueued and acked for 30 s, a
// checkpoint after every batch; compare each checkpoint's stats with the
// bounds, and the directory's generation files with the window.
fn checkpoint_bytes_follow_the_open_generation_not_the_window(layout: Layout) {
    let now = Rc::new(Cell::new(START_MS));
    run(async move {
        let disk = SimStorage::new();
        let (partition, _task) = try_open(layout, &disk, &now).await.unwrap();
        let per_generation = (WINDOW_MS / 8 / STEP_MS + 1) * BATCH;
        let (mut generation_bytes, mut largest, mut next) = (0u64, 0u64, 0u64);
        let mut snapshot_floor = u64::MAX;
        for _ in 0..(30_000 / STEP_MS) {
            cycle(&partition, next, now.get()).await;
            next += BATCH;
            partition.checkpoint().await.unwrap().expect("written");
            let stats = partition.last_checkpoint().unwrap();
            snapshot_floor = snapshot_floor.min(stats.bytes);
            largest = largest.max(stats.bytes);
            generation_bytes += stats.generation_bytes;
            assert!(stats.generations <= 9, "{} generations referred to", stats.generations);
            now.set(now.get() + STEP_MS);
        }
        // One generation inline at most (32 B per id), 28 B per reference.
        let bound = snapshot_floor + per_generation * 32 + 9 * 28;
        assert!(largest <= bound, "largest checkpoint {largest} B, bound {bound} B");
        let window_bytes = WINDOW_MS / STEP_MS * BATCH * 32;
        assert!(largest * 3 < window_bytes, "{largest} B against {window_bytes} B of window");
        assert!(generation_bytes <= next * 32, "{generation_bytes} B of files for {next} ids");
        assert!(generation_bytes >= (next - 2 * per_generation) * 32);
        // Generations that left the window lost their files.
        let files = generation_files(&disk);
        assert!((7..=10).contains(&files.len()), "{files:?}");
        assert!(is_duplicate(&partition, next - 10, now.get()).await);
    });
}

// Goal: a crash at any write, sync, rename, directory sync or removal of a
// checkpoint that writes a new generation file and lets an old one go
// reopens (from the old or the new checkpoint), keeps no unreferenced
// generation file, and still answers a resent id of the window as a
// duplicate, also one whose generation was written by that checkpoint.
// Method: on the simulator, 12 s of traffic with checkpoints, then a hook
// takes crash images (synced only, and all written) after every
// operation of one more checkpoint; open each.
fn a_crash_around_generation_files_recovers_the_window(layout: Layout) {
    let now = Rc::new(Cell::new(START_MS));
    run(async move {
        let disk = SimStorage::new();
        let (partition, _task) = try_open(layout, &disk, &now).await.unwrap();
        let mut next = 0u64;
        for round in 0..48u64 {
            cycle(&partition, next, now.get()).await;
            next += BATCH;
            if round % 4 == 3 {
                partition.checkpoint().await.unwrap().expect("written");
            }
            now.set(now.get() + STEP_MS);
        }
        let before = generation_files(&disk);
        // Past the next generation boundary: one more sealed generation to
        // write, and the oldest has left the window.
        for _ in 0..5 {
            cycle(&partition, next, now.get()).await;
            next += BATCH;
            now.set(now.get() + STEP_MS);
        }
        let images: Rc<RefCell<Vec<SimStorage>>> = Rc::default();
        disk.set_hook({
            let images = images.clone();
            move |disk, _op, _count| {
                let mut images = images.borrow_mut();
                images.push(disk.crash_image(CrashMode::DurableOnly));
                images.push(disk.crash_image(CrashMode::AllWritten));
            }
        });
        partition.checkpoint().await.unwrap().expect("written");
        disk.clear_hook();
        let stats = partition.last_checkpoint().unwrap();
        assert!(stats.generation_files >= 1, "{stats:?}");
        let after = generation_files(&disk);
        assert!(before.iter().any(|name| !after.contains(name)), "no file deleted: {after:?}");
        // Ids in the newest sealed generation, and the oldest still live.
        let probes = [next - 3 * BATCH - 1, next - (WINDOW_MS / STEP_MS - 2) * BATCH];
        let images = images.take();
        assert!(images.len() >= 2 * 8, "{} images", images.len());
        for (index, image) in images.into_iter().enumerate() {
            let (reopened, _task) = try_open(layout, &image, &now)
                .await
                .unwrap_or_else(|error| panic!("image {index}: {error}"));
            for name in generation_files(&image) {
                assert!(!name.ends_with(".tmp"), "image {index}: {name} left after open");
            }
            for probe in probes {
                assert!(
                    is_duplicate(&reopened, probe, now.get()).await,
                    "image {index}: id {probe} not a duplicate"
                );
            }
            reopened.close().await.unwrap();
        }
    });
}

// Goal: a referenced generation file that is damaged (one flipped bit) or
// missing refuses the open with an error naming it: the window is never
// silently emptied. Method: a checkpoint referring to sealed generations,
// a clean crash image; flip a payload bit of one file in one copy, remove
// it in another.
fn a_damaged_or_missing_generation_file_refuses_the_open_naming_it(layout: Layout) {
    let now = Rc::new(Cell::new(START_MS));
    run(async move {
        let disk = SimStorage::new();
        let (partition, _task) = try_open(layout, &disk, &now).await.unwrap();
        let mut next = 0u64;
        for _ in 0..20 {
            cycle(&partition, next, now.get()).await;
            next += BATCH;
            now.set(now.get() + STEP_MS);
        }
        partition.checkpoint().await.unwrap().expect("written");
        let files = generation_files(&disk);
        assert!(files.len() >= 2, "{files:?}");
        let victim = dir().join(&files[0]);

        let image = disk.crash_image(CrashMode::DurableOnly);
        let mut bytes = image.file_bytes(&victim).unwrap();
        bytes[40] ^= 0x10;
        image.set_file_bytes(&victim, bytes);
        let Err(error) = try_open(layout, &image, &now).await else { panic!("opened") };
        assert!(error.to_string().contains(&files[0]), "{error}");

        let image = disk.crash_image(CrashMode::DurableOnly);
        remove(&image, &victim).await;
        let Err(error) = try_open(layout, &image, &now).await else { panic!("opened") };
        assert!(error.to_string().contains(&files[0]), "{error}");
        assert!(error.to_string().contains("missing"), "{error}");

        // The untouched image opens and keeps the window.
        let image = disk.crash_image(CrashMode::DurableOnly);
        let (reopened, _task) = try_open(layout, &image, &now).await.unwrap();
        assert!(is_duplicate(&reopened, 3, now.get()).await);
    });
}

async fn remove(disk: &SimStorage, path: &Path) {
    use spool_broker::io::Storage;
    disk.remove(path).await.unwrap();
}
