//! A partition's place in its queue's key map (`partition/keys.rs`): after
//! a resize it refuses keyed records whose key maps elsewhere now (but
//! still answers a retry of a record it took as a duplicate), hands out
//! nothing while a resize holds it, wakes a waiting claim when the hold
//! ends, and reports when everything below a barrier is finished. The key
//! map a server took keys by is written to the log, and a partition whose
//! log names a newer version than its node applied does not serve.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is the failure report

use std::cell::Cell;
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

mod partition_layout;

use glommio::{LocalExecutorBuilder, Placement};
use partition_layout::{open_partition, Layout};
use spool_broker::io::SimStorage;
use spool_broker::log::{LogConfig, RecordFatal};
use spool_broker::partition::{EnqueueOutcome, KeyRoute, PartitionName};
use spool_broker::queue::{ClaimRequest, Lane, PartitionId, QueueConfig, QueueId, WorkerId};
use spool_wire::batch::{BatchBytes, DataBatchBuilder, MessageId, Payload, Record};
use spool_wire::routing::key_partition;

const START_MS: u64 = 1_700_000_000_000;

/// Records `(id, key)`, each with a small body.
fn batch(records: &[(u64, &str)]) -> BatchBytes {
    let mut builder = DataBatchBuilder::new();
    for (id, key) in records {
        let mut message_id = [0u8; 16];
        message_id[..8].copy_from_slice(&id.to_le_bytes());
        builder
            .push(&Record {
                message_id: MessageId(message_id),
                routing_key: key.as_bytes().to_vec(),
                headers: vec![],
                payload: Payload::Inline(vec![7; 32]),
                priority: 0,
                not_before_ms: 0,
                expiry_ms: 0,
                enqueue_time_ms: START_MS,
            })
            .unwrap();
    }
    builder.finish().unwrap()
}

/// The first key of the form `k<n>` that partition 0 of 4 holds and that
/// a resize to 5 moves (`moves`) or keeps (`!moves`).
fn key(moves: bool, skip: usize) -> String {
    (0..)
        .map(|n| format!("k{n}"))
        .filter(|key| key_partition(key.as_bytes(), 4) == 0)
        .filter(|key| (key_partition(key.as_bytes(), 5) == 4) == moves)
        .nth(skip)
        .unwrap()
}

// Goal: the key checks of a resized queue's older and added partitions.
// Method: partition 0 of a queue grown 4 → 5: a batch with a kept key, a
// moved key, a keyless record and a retry of a record taken before the
// resize (key moved since); then a hold on the same partition while a
// claim waits, lifted; then the drain check before and after the acks.
#[test]
fn moved_keys_are_refused_held_partitions_hand_out_nothing_until_released() {
    LocalExecutorBuilder::new(Placement::Unbound).io_memory(0).make().unwrap().run(async {
        let now = Rc::new(Cell::new(START_MS));
        let partition = open_on(&SimStorage::new(), &now).await;
        let (kept, moved) = (key(false, 0), key(true, 0));
        let early = key(true, 1);

        // Before the resize: 4 partitions, both keys belong here.
        partition.set_key_route(KeyRoute { version: 1, partitions: 4, held: false });
        let before = partition.enqueue(&batch(&[(1, &early)])).await.unwrap();
        assert!(matches!(before[0], EnqueueOutcome::Appended { .. }));

        partition.set_key_route(KeyRoute { version: 2, partitions: 5, held: false });
        let barrier = partition.next_offset();
        let outcomes = partition
            .enqueue(&batch(&[(2, &kept), (3, &moved), (4, ""), (1, &early), (3, &moved)]))
            .await
            .unwrap();
        assert!(matches!(outcomes[0], EnqueueOutcome::Appended { .. }), "{outcomes:?}");
        assert_eq!(outcomes[1], EnqueueOutcome::Moved);
        assert!(matches!(outcomes[2], EnqueueOutcome::Appended { .. }), "{outcomes:?}");
        // Taken before the resize: a retry is still a duplicate, never a
        // second copy in the partition the key moved to.
        assert!(matches!(outcomes[3], EnqueueOutcome::Duplicate { .. }), "{outcomes:?}");
        assert_eq!(outcomes[4], EnqueueOutcome::Moved);
        assert_eq!(partition.counters().live_messages, 3);

        // Held: a claim waits; the hold's end wakes it with messages.
        partition.set_key_route(KeyRoute { version: 2, partitions: 5, held: true });
        let request = ClaimRequest {
            sub: spool_broker::queue::SubscriptionId::DEFAULT,
            worker: WorkerId(1),
            credits: 10,
            max_bytes: 1 << 20,
            lease_ms: None,
        };
        assert!(partition.claim(&request, Lane::Main, 0).await.unwrap().is_empty());
        let lifted = Rc::new(Cell::new(false));
        let lifter = {
            let (partition, lifted) = (partition.clone(), lifted.clone());
            glommio::spawn_local(async move {
                glommio::timer::sleep(Duration::from_millis(50)).await;
                lifted.set(true);
                partition.set_key_route(KeyRoute { version: 2, partitions: 5, held: false });
            })
        };
        let claimed = partition.claim(&request, Lane::Main, 5_000).await.unwrap();
        assert!(lifted.get(), "a held partition handed out messages");
        assert_eq!(claimed.len(), 3);
        lifter.await;

        // Drained below the barrier only once every message below it is
        // finished (the one taken before the resize).
        assert!(!partition.drained_below(barrier));
        let first: Vec<_> = claimed
            .iter()
            .filter(|item| item.delivery.offset < barrier)
            .map(|item| item.delivery.token)
            .collect();
        assert_eq!(first.len(), 1);
        assert!(partition.ack(&first).await.iter().all(Result::is_ok));
        assert!(partition.drained_below(barrier));
        assert!(!partition.drained_below(partition.next_offset()));
        now.set(START_MS + 1);
    });
}

async fn open_on(
    storage: &SimStorage,
    now: &Rc<Cell<u64>>,
) -> Rc<spool_broker::partition::Partition<SimStorage>> {
    let clock_now = now.clone();
    let name =
        PartitionName { queue: "jobs".into(), queue_id: QueueId(1), partition: PartitionId(0) };
    let (partition, background, _) = open_partition(
        Layout::Journal,
        storage.clone(),
        Path::new("/data/p0"),
        name,
        QueueConfig::default(),
        LogConfig::default(),
        Rc::new(RecordFatal::default()),
        Rc::new(move || clock_now.get()),
    )
    .await
    .expect("open");
    glommio::spawn_local(background.into_future()).detach();
    partition
}

// Goal: a partition whose log names a newer key map than its node applied
// does not serve (the resize gap: a new leader that had not applied the
// resize would take moved keys after the old leader's drain report).
// Method: route v2 written to the log and checkpointed, one more message,
// a crash image; reopened under v1 (a node behind the table) it does not
// serve; v2 applied, it serves. An older version written later changes
// nothing; a log that never named one serves under any route.
#[test]
fn a_log_naming_a_newer_key_map_than_applied_keeps_the_partition_from_serving() {
    LocalExecutorBuilder::new(Placement::Unbound).io_memory(0).make().unwrap().run(async {
        let now = Rc::new(Cell::new(START_MS));
        let storage = SimStorage::new();
        let partition = open_on(&storage, &now).await;
        partition.set_key_route(KeyRoute { version: 1, partitions: 4, held: false });
        assert!(partition.serving());
        assert!(!partition.logs_key_map(1));
        partition.set_key_route(KeyRoute { version: 2, partitions: 5, held: false });
        partition.log_key_map().await.expect("key map logged");
        assert!(partition.logs_key_map(2) && !partition.logs_key_map(3));
        partition.log_key_map().await.expect("a second write is a no-op");
        // The checkpoint carries it (snapshot version 4), the entry after
        // it is replayed.
        partition.checkpoint().await.expect("checkpoint").expect("a checkpoint was taken");
        partition.enqueue(&batch(&[(1, &key(false, 0))])).await.unwrap();
        let image = storage.process_crash_image();
        partition.log().close();
        drop(partition);

        let reopened = open_on(&image, &now).await;
        assert!(reopened.logs_key_map(2), "the checkpoint lost the key map");
        assert_eq!(reopened.counters().live_messages, 1);
        reopened.set_key_route(KeyRoute { version: 1, partitions: 4, held: false });
        assert!(reopened.key_map_behind());
        assert!(!reopened.serving(), "a node behind the logged key map serves");
        reopened.set_key_route(KeyRoute { version: 2, partitions: 5, held: false });
        assert!(!reopened.key_map_behind() && reopened.serving());
        // An older version never replaces the newer one named.
        reopened.set_key_route(KeyRoute { version: 1, partitions: 4, held: false });
        reopened.log_key_map().await.expect("an older key map is not written");
        reopened.set_key_route(KeyRoute { version: 3, partitions: 6, held: false });
        assert!(reopened.serving() && !reopened.logs_key_map(3));
        reopened.set_key_route(KeyRoute { version: 2, partitions: 5, held: false });
        assert!(reopened.serving());
        reopened.log().close();

        // A log that never named a key map: any route serves.
        let fresh = SimStorage::new();
        let plain = open_on(&fresh, &now).await;
        plain.set_key_route(KeyRoute { version: 1, partitions: 4, held: false });
        assert!(plain.serving() && !plain.key_map_behind());
        plain.log().close();
    });
}
