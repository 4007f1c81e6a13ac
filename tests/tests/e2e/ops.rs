//! Every protocol operation end to end through `spool_client` against a
//! two-shard broker: the admin plane, the data path, inspection, dead
//! letters and redrive, purge, delete.

use std::collections::BTreeSet;

use spool_client::spool_wire::proto::{
    DescribeQueueResponse, MessageState, Offset, PartitionId, RedriveTarget,
};
use spool_client::spool_wire::ErrorCode;
use spool_client::{Admin, ClientError, Message, Producer, ProducerConfig};
use spool_tests::{test_queue_config, Spoold};

use crate::common::{claim_options, key_for, message_id, unix_ms};

fn totals(described: &DescribeQueueResponse) -> (u64, u64, u64, u64, u64) {
    described.partitions.iter().fold((0, 0, 0, 0, 0), |sum, stats| {
        (
            sum.0 + stats.ready,
            sum.1 + stats.scheduled,
            sum.2 + stats.claimed,
            sum.3 + stats.quarantined,
            sum.4 + stats.acked,
        )
    })
}

// Goal: CreateQueue/ListQueues/Metadata/DescribeQueue/DeleteQueue behave as
// documented on a 2-shard broker, and DescribeQueue covers every partition
// (each shard reports only its own). Method: create a 2-partition queue, put
// messages on both partitions, check the merged counts, delete it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_plane_and_describe_merges_shards() {
    let broker = Spoold::start(2);
    let client = broker.client().await;
    let admin = Admin::new(client.clone());

    let version = admin.create_queue("orders", test_queue_config(2, 5_000, 3)).await.unwrap();
    let again = admin.create_queue("orders", test_queue_config(2, 5_000, 3)).await.unwrap_err();
    assert_eq!(again.code(), Some(ErrorCode::QueueExists), "{again}");
    let other = admin.create_queue("audit", test_queue_config(1, 5_000, 3)).await.unwrap();
    assert!(other.0 > version.0, "assignment version grows: {version:?} then {other:?}");

    let listed = admin.list_queues().await.unwrap();
    let names: BTreeSet<_> =
        listed.iter().map(|queue| (queue.name.as_str(), queue.partitions)).collect();
    assert_eq!(names, BTreeSet::from([("audit", 1), ("orders", 2)]));

    // Metadata: one entry per partition, placed on both shards.
    let partitions = client.partitions("orders").await.unwrap();
    assert_eq!(partitions.len(), 2);
    let ports: BTreeSet<u16> = partitions.iter().map(|meta| meta.shard_port).collect();
    assert_eq!(ports, BTreeSet::from([broker.port(0), broker.port(1)]));
    assert!(partitions.iter().all(|meta| meta.host == "127.0.0.1"));

    // Two messages on partition 0, three on partition 1.
    let producer = Producer::new(client.clone(), ProducerConfig::default()).unwrap();
    for (partition, count) in [(0u32, 2u64), (1, 3)] {
        let key = key_for(partition, 2, 0);
        for sequence in 0..count {
            let message = Message::new(format!("p{partition}-{sequence}"))
                .key(key.clone())
                .id(message_id(partition, sequence));
            producer.send("orders", message).await.unwrap();
        }
    }

    let described = admin.describe_queue("orders").await.unwrap();
    assert_eq!(described.name, "orders");
    assert_eq!(described.config.partitions, 2);
    assert_eq!(described.config.max_deliveries, 3);
    assert_eq!(described.config.lease_default_ms, 5_000);
    let per_partition: Vec<(u32, u64)> =
        described.partitions.iter().map(|stats| (stats.partition.0, stats.ready)).collect();
    assert_eq!(per_partition, vec![(0, 2), (1, 3)], "describe must merge every shard");
    assert!(described.partitions.iter().all(|stats| stats.bytes > 0));

    let missing = admin.describe_queue("nope").await.unwrap_err();
    assert_eq!(missing.code(), Some(ErrorCode::QueueNotFound), "{missing}");

    admin.delete_queue("orders").await.unwrap();
    let gone = admin.delete_queue("orders").await.unwrap_err();
    assert_eq!(gone.code(), Some(ErrorCode::QueueNotFound), "{gone}");
    let listed = admin.list_queues().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].name, "audit");
    let describe_gone = admin.describe_queue("orders").await.unwrap_err();
    assert_eq!(describe_gone.code(), Some(ErrorCode::QueueNotFound));
    let send_gone = producer.send("orders", Message::new("late")).await.unwrap_err();
    assert_eq!(send_gone.code(), Some(ErrorCode::QueueNotFound), "{send_gone}");

    // A queue created again under the deleted name starts empty.
    admin.create_queue("orders", test_queue_config(2, 5_000, 3)).await.unwrap();
    let fresh = admin.describe_queue("orders").await.unwrap();
    assert_eq!(fresh.partitions.len(), 2);
    assert_eq!(totals(&fresh), (0, 0, 0, 0, 0));
}

// Goal: the data path (Enqueue, dedupe, Claim, Extend, Ack, Release with a
// delay, Peek) through the client. Method: drive one partition through every
// transition and check each answer and the peeked states.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_path_enqueue_claim_extend_ack_release_peek() {
    let broker = Spoold::start(2);
    let client = broker.client().await;
    let admin = Admin::new(client.clone());
    admin.create_queue("work", test_queue_config(1, 5_000, 5)).await.unwrap();
    let producer = Producer::new(client.clone(), ProducerConfig::default()).unwrap();
    let p0 = PartitionId(0);

    let mut offsets = Vec::new();
    for sequence in 0..3 {
        let message = Message::new(format!("job-{sequence}")).id(message_id(7, sequence));
        offsets.push(producer.send("work", message).await.unwrap());
    }
    assert_eq!(offsets, vec![Offset(0), Offset(1), Offset(2)]);
    // Same id again: deduped to the original offset, nothing appended.
    let duplicate = producer.send("work", Message::new("again").id(message_id(7, 1))).await;
    assert_eq!(duplicate.unwrap(), Offset(1));

    let peeked = admin.peek("work", p0, Offset(0), 10).await.unwrap();
    assert_eq!(peeked.len(), 3, "the duplicate was not stored");
    assert!(peeked.iter().all(|message| message.state == MessageState::Ready));

    let claimed = client.claim("work", p0, &claim_options(1, 2, 2_000, 0)).await.unwrap();
    assert_eq!(claimed.deliveries.len(), 2, "credits bound the claim");
    let (first, second) = (&claimed.deliveries[0], &claimed.deliveries[1]);
    assert_eq!((first.offset(), second.offset()), (Offset(0), Offset(1)));
    assert_eq!((first.attempt(), first.queue(), first.partition()), (1, "work", p0));
    assert_eq!(first.message_id(), message_id(7, 0));
    assert_eq!(first.payload(), spool_client::PayloadView::Inline(b"job-0"));
    let now = unix_ms();
    assert!(
        claimed.lease_deadline_ms > now && claimed.lease_deadline_ms <= now + 2_500,
        "deadline {} vs now {now}",
        claimed.lease_deadline_ms
    );

    let states: Vec<MessageState> =
        admin.peek("work", p0, Offset(0), 10).await.unwrap().iter().map(|m| m.state).collect();
    assert_eq!(states, vec![MessageState::Claimed, MessageState::Claimed, MessageState::Ready]);

    let extended = client.extend("work", p0, first.token(), 10_000).await.unwrap();
    assert!(extended >= claimed.lease_deadline_ms + 7_000, "extend moved the deadline: {extended}");

    client.ack("work", p0, &[first.token()]).await.unwrap();
    // A refused ack is an error naming the token, never a quiet success.
    let twice = client.ack("work", p0, &[first.token()]).await.unwrap_err();
    let ClientError::AckRefused { refused, tokens } = &twice else { panic!("{twice}") };
    assert_eq!((refused.len(), refused[0].index, *tokens), (1, 0, 1));
    assert_eq!(refused[0].code, ErrorCode::StaleToken, "an acked claim is not current");
    assert_eq!(refused[0].token, first.token());
    let extend_acked = client.extend("work", p0, first.token(), 1_000).await.unwrap_err();
    assert_eq!(extend_acked.code(), Some(ErrorCode::StaleToken));

    // Release with a delay: scheduled, not claimable, then claimable again.
    let released_at = unix_ms();
    let due = client.release("work", p0, second.token(), 600, "try later").await.unwrap();
    assert!(due >= released_at + 550 && due <= unix_ms() + 700, "due {due}");
    let peeked = admin.peek("work", p0, Offset(1), 1).await.unwrap();
    assert_eq!((peeked[0].offset, peeked[0].state), (Offset(1), MessageState::Scheduled));
    let stale_release = client.release("work", p0, second.token(), 0, "again").await.unwrap_err();
    assert_eq!(stale_release.code(), Some(ErrorCode::StaleToken));

    let now_claim = client.claim("work", p0, &claim_options(1, 10, 2_000, 0)).await.unwrap();
    let now_offsets: Vec<Offset> = now_claim.deliveries.iter().map(|d| d.offset()).collect();
    assert_eq!(now_offsets, vec![Offset(2)], "the scheduled message is not claimable yet");
    let later = client.claim("work", p0, &claim_options(1, 10, 2_000, 3_000)).await.unwrap();
    let woke_ms = unix_ms();
    assert!(woke_ms + 50 >= due, "claimed only once due");
    let later_offsets: Vec<Offset> = later.deliveries.iter().map(|d| d.offset()).collect();
    assert_eq!(
        later_offsets,
        vec![Offset(1)],
        "the long poll wakes when the release delay ends ({} ms after due)",
        woke_ms.saturating_sub(due)
    );
    assert_eq!((later.deliveries[0].offset(), later.deliveries[0].attempt()), (Offset(1), 2));
    assert_eq!(later.deliveries[0].generation().0, second.generation().0 + 1);

    let tokens = [now_claim.deliveries[0].token(), later.deliveries[0].token()];
    client.ack("work", p0, &tokens).await.unwrap();
    assert!(admin.peek("work", p0, Offset(0), 10).await.unwrap().is_empty());
    let described = admin.describe_queue("work").await.unwrap();
    assert_eq!(totals(&described), (0, 0, 0, 0, 3));
}

// Goal: DeadLetters, Redrive and Purge (dry run, then real) end to end.
// Method: release one message past max_deliveries (2), list and redrive it;
// purge a partition holding ready and claimed messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_redrive_and_purge() {
    let broker = Spoold::start(2);
    let client = broker.client().await;
    let admin = Admin::new(client.clone());
    admin.create_queue("flaky", test_queue_config(1, 5_000, 2)).await.unwrap();
    let producer = Producer::new(client.clone(), ProducerConfig::default()).unwrap();
    let p0 = PartitionId(0);
    producer.send("flaky", Message::new("poison").key("k").id(message_id(1, 0))).await.unwrap();

    // Two claims ending in release: the second is the max_deliveries-th.
    for attempt in 1..=2u32 {
        let batch = client.claim("flaky", p0, &claim_options(9, 1, 2_000, 3_000)).await.unwrap();
        assert_eq!(batch.deliveries.len(), 1, "attempt {attempt}");
        assert_eq!(batch.deliveries[0].attempt(), attempt);
        client.release("flaky", p0, batch.deliveries[0].token(), 1, "boom").await.unwrap();
    }
    let empty = client.claim("flaky", p0, &claim_options(9, 1, 2_000, 300)).await.unwrap();
    assert!(empty.deliveries.is_empty(), "a dead letter is not claimable");
    let letters = admin.dead_letters("flaky", p0, Offset(0), 10).await.unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!((letters[0].original_offset, letters[0].attempts), (Offset(0), 2));
    assert!(letters[0].quarantined_at_ms > 0);
    let described = admin.describe_queue("flaky").await.unwrap();
    assert_eq!(totals(&described), (0, 0, 0, 1, 0));

    let redriven = admin.redrive("flaky", p0, RedriveTarget::All).await.unwrap();
    assert_eq!(redriven, 1);
    assert!(admin.dead_letters("flaky", p0, Offset(0), 10).await.unwrap().is_empty());
    let back = client.claim("flaky", p0, &claim_options(9, 1, 2_000, 3_000)).await.unwrap();
    assert_eq!(back.deliveries.len(), 1);
    assert_eq!(back.deliveries[0].attempt(), 1, "redrive resets attempts");
    assert_eq!(back.deliveries[0].message_id(), message_id(1, 0));
    client.ack("flaky", p0, &[back.deliveries[0].token()]).await.unwrap();

    // Redrive by offset of a second dead letter.
    // (Offsets count log records, state changes included, so it is not 1.)
    let second = producer.send("flaky", Message::new("poison-2").id(message_id(1, 1))).await;
    let second = second.unwrap();
    assert!(second > Offset(0));
    for _ in 0..2 {
        let batch = client.claim("flaky", p0, &claim_options(9, 1, 2_000, 3_000)).await.unwrap();
        client.release("flaky", p0, batch.deliveries[0].token(), 1, "boom").await.unwrap();
    }
    let letters = admin.dead_letters("flaky", p0, Offset(0), 10).await.unwrap();
    assert_eq!(letters.iter().map(|l| l.original_offset).collect::<Vec<_>>(), vec![second]);
    let wrong = admin.redrive("flaky", p0, RedriveTarget::Offsets(vec![Offset(0)])).await;
    let wrong = wrong.unwrap_err();
    assert_eq!(
        wrong.code(),
        Some(ErrorCode::InvalidArgument),
        "offset 0 is no dead letter: {wrong}"
    );
    let by_offset = admin.redrive("flaky", p0, RedriveTarget::Offsets(vec![second])).await;
    assert_eq!(by_offset.unwrap(), 1);

    // Purge: 1 redriven + 4 new ready, 1 of them claimed (purge keeps claims).
    for sequence in 10..14 {
        producer.send("flaky", Message::new("bulk").id(message_id(1, sequence))).await.unwrap();
    }
    let held = client.claim("flaky", p0, &claim_options(9, 1, 10_000, 0)).await.unwrap();
    assert_eq!(held.deliveries.len(), 1);
    let dry = admin.purge("flaky", p0, true).await.unwrap();
    let peeked_before = admin.peek("flaky", p0, Offset(0), 100).await.unwrap();
    assert_eq!(peeked_before.len(), 5, "a dry run removes nothing");
    let purged = admin.purge("flaky", p0, false).await.unwrap();
    assert_eq!(purged, 4, "every unclaimed message is purged");
    assert_eq!(dry, purged, "the dry run counts what a purge removes");
    let left = admin.peek("flaky", p0, Offset(0), 100).await.unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].state, MessageState::Claimed);
    client
        .ack("flaky", p0, &[held.deliveries[0].token()])
        .await
        .expect("a claim survives the purge");
    let described = admin.describe_queue("flaky").await.unwrap();
    assert_eq!(totals(&described), (0, 0, 0, 0, 2));
    // Nothing purged is ever delivered.
    let after = client.claim("flaky", p0, &claim_options(9, 10, 2_000, 300)).await.unwrap();
    assert!(after.deliveries.is_empty());
}

// Goal: an all-duplicate enqueue (a producer's retry) that waits for the
// partition's last commit must not stop other appends on the partition.
// Method: two tasks on one partition, one re-sending an already stored
// message id, one appending fresh ids, concurrently; every request must
// succeed and the broker must stay up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_enqueues_racing_appends_keep_the_broker_up() {
    use spool_client::spool_wire::batch::{DataBatchBuilder, Payload, Record};

    fn batch(id: spool_client::spool_wire::batch::MessageId) -> Vec<u8> {
        let mut builder = DataBatchBuilder::new();
        builder
            .push(&Record {
                message_id: id,
                routing_key: Vec::new(),
                headers: Vec::new(),
                payload: Payload::Inline(b"x".to_vec()),
                priority: 0,
                not_before_ms: 0,
                expiry_ms: 0,
                enqueue_time_ms: unix_ms(),
            })
            .unwrap();
        builder.finish().unwrap().as_slice().to_vec()
    }

    let broker = Spoold::start(1);
    let client = broker.client().await;
    Admin::new(client.clone()).create_queue("race", test_queue_config(1, 5_000, 5)).await.unwrap();
    let p0 = PartitionId(0);
    let original = client.enqueue("race", p0, &batch(message_id(1, 0))).await.unwrap();
    let mut tasks = Vec::new();
    for worker in 0..4u32 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            for round in 0..200u64 {
                let id =
                    if worker % 2 == 0 { message_id(1, 0) } else { message_id(2 + worker, round) };
                client.enqueue("race", p0, &batch(id)).await?;
            }
            Ok::<(), spool_client::ClientError>(())
        }));
    }
    for task in tasks {
        task.await.unwrap().unwrap_or_else(|error| {
            panic!("enqueue failed while duplicates raced appends: {error}")
        });
    }
    let again = client.enqueue("race", p0, &batch(message_id(1, 0))).await.unwrap();
    assert_eq!(
        again.records,
        original
            .records
            .iter()
            .map(|outcome| match outcome {
                spool_client::spool_wire::proto::RecordOutcome::Appended { offset } => {
                    spool_client::spool_wire::proto::RecordOutcome::Duplicate {
                        original_offset: *offset,
                    }
                }
                other => panic!("first enqueue not appended: {other:?}"),
            })
            .collect::<Vec<_>>()
    );
    let described = Admin::new(client).describe_queue("race").await.unwrap();
    assert_eq!(described.partitions[0].ready, 1 + 2 * 200, "{described:?}");
}
