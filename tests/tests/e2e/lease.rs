//! The lease trace over the network: a lease that runs out moves the message
//! to the next claimer with a new generation, and the old holder's token is
//! dead for ack, extend and release.

use spool_client::spool_wire::proto::{Offset, PartitionId};
use spool_client::spool_wire::ErrorCode;
use spool_client::{Admin, Message, Producer, ProducerConfig};
use spool_tests::{test_queue_config, Spoold};

use crate::common::{claim_options, message_id, unix_ms};

// Goal: A's lease expires without A's help; B then holds generation + 1; A's
// ack is STALE_TOKEN and changes nothing; B's ack succeeds; the message is
// acked exactly once. Method: A claims with a 300 ms lease and sleeps past
// it; B long-polls a claim; both ack; check the counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_lease_passes_to_next_claimer_and_old_token_is_stale() {
    let broker = Spoold::start(2);
    let client = broker.client().await;
    let admin = Admin::new(client.clone());
    admin.create_queue("leases", test_queue_config(1, 5_000, 10)).await.unwrap();
    let producer = Producer::new(client.clone(), ProducerConfig::default()).unwrap();
    producer.send("leases", Message::new("task").id(message_id(3, 0))).await.unwrap();
    let p0 = PartitionId(0);

    let lease_ms = 300;
    let a = client.claim("leases", p0, &claim_options(0xa, 1, lease_ms, 0)).await.unwrap();
    assert_eq!(a.deliveries.len(), 1);
    let a_delivery = &a.deliveries[0];
    assert_eq!(a_delivery.attempt(), 1);

    // While A's lease runs, B gets nothing.
    let early = client.claim("leases", p0, &claim_options(0xb, 1, 5_000, 0)).await.unwrap();
    assert!(early.deliveries.is_empty(), "a leased message is not claimable");

    // B long-polls; the broker's lease timer hands the message over.
    let b = client.claim("leases", p0, &claim_options(0xb, 1, 5_000, 5_000)).await.unwrap();
    let claimed_at = unix_ms();
    assert_eq!(b.deliveries.len(), 1, "the message comes back after the lease");
    let b_delivery = &b.deliveries[0];
    assert!(claimed_at + 20 >= a.lease_deadline_ms, "not before A's deadline");
    assert_eq!(b_delivery.offset(), a_delivery.offset());
    assert_eq!(b_delivery.message_id(), message_id(3, 0));
    assert_eq!(b_delivery.generation().0, a_delivery.generation().0 + 1);
    assert_eq!(b_delivery.attempt(), 2);

    let late_ack = client.ack("leases", p0, &[a_delivery.token()]).await.unwrap_err();
    assert_eq!(late_ack.refused_codes(), vec![ErrorCode::StaleToken], "{late_ack}");
    assert_eq!(late_ack.code(), Some(ErrorCode::StaleToken));
    let extend = client.extend("leases", p0, a_delivery.token(), 5_000).await.unwrap_err();
    assert_eq!(extend.code(), Some(ErrorCode::StaleToken), "{extend}");
    let release = client.release("leases", p0, a_delivery.token(), 0, "late").await.unwrap_err();
    assert_eq!(release.code(), Some(ErrorCode::StaleToken), "{release}");
    // A's failed attempts changed nothing: B still holds the claim.
    let peeked = admin.peek("leases", p0, Offset(0), 10).await.unwrap();
    assert_eq!(peeked.len(), 1);
    assert_eq!(peeked[0].state, spool_client::spool_wire::proto::MessageState::Claimed);

    client.ack("leases", p0, &[b_delivery.token()]).await.unwrap();
    let described = admin.describe_queue("leases").await.unwrap();
    let stats = &described.partitions[0];
    assert_eq!((stats.acked, stats.ready, stats.claimed, stats.scheduled), (1, 0, 0, 0));
    let after = client.claim("leases", p0, &claim_options(0xc, 1, 5_000, 500)).await.unwrap();
    assert!(after.deliveries.is_empty(), "an acked message never comes back");
}

// Goal: a token cannot be forged. Method: flip one byte of a live token in
// its fields, its MAC and its padding (INVALID_TOKEN each time), then check
// the real token still acks (the forgeries changed nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_token_is_rejected_and_changes_nothing() {
    let broker = Spoold::start(1);
    let client = broker.client().await;
    Admin::new(client.clone()).create_queue("mac", test_queue_config(1, 5_000, 10)).await.unwrap();
    let producer = Producer::new(client.clone(), ProducerConfig::default()).unwrap();
    producer.send("mac", Message::new("x")).await.unwrap();
    let p0 = PartitionId(0);
    let claimed = client.claim("mac", p0, &claim_options(1, 1, 5_000, 0)).await.unwrap();
    let token = claimed.deliveries[0].token();
    // Byte 32 (worker id) is inside the MAC'd fields, byte 48 is in the MAC
    // itself, the last byte is wire padding that must stay zero.
    for index in [32, 48, token.0.len() - 1] {
        let mut forged = token;
        forged.0[index] ^= 0x01;
        let codes = client.ack("mac", p0, &[forged]).await.unwrap_err().refused_codes();
        assert_eq!(codes, vec![ErrorCode::InvalidToken], "flipped byte {index}");
    }
    client.ack("mac", p0, &[token]).await.unwrap();
}

// Goal: the client claims a partition's dead letters by the lane's name
// (`<queue>.dlq`, routed to the shard of `<queue>`'s partition, not looked
// up as a queue of its own) and acks them there. Method: a queue on 2
// shards with max_deliveries 1; a message on partition 1 is claimed and
// released, so it is a dead letter; `leases2.dlq` partition 1 is claimed
// through the client and the delivery acked; the dead letters count drops
// to 0 and nothing is left to claim in either lane.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_claimed_and_acked_by_the_lane_name_through_the_client() {
    let broker = Spoold::start(2);
    let client = broker.client().await;
    let admin = Admin::new(client.clone());
    admin.create_queue("leases2", test_queue_config(1, 5_000, 1)).await.unwrap();
    let p0 = PartitionId(0);
    let producer = Producer::new(client.clone(), ProducerConfig::default()).unwrap();
    producer.send("leases2", Message::new("poison").id(message_id(4, 0))).await.unwrap();
    let first = client.claim("leases2", p0, &claim_options(0xa, 1, 5_000, 1_000)).await.unwrap();
    assert_eq!(first.deliveries.len(), 1);
    client.release("leases2", p0, first.deliveries[0].token(), 0, "poison").await.unwrap();
    let described = admin.describe_queue("leases2").await.unwrap();
    assert_eq!(described.partitions[0].quarantined, 1, "a dead letter after one delivery");

    let dead = client.claim("leases2.dlq", p0, &claim_options(0xd, 4, 5_000, 1_000)).await;
    let dead = dead.expect("the lane is routed by its queue");
    assert_eq!(dead.deliveries.len(), 1);
    assert_eq!(dead.deliveries[0].message_id(), message_id(4, 0));
    client.ack("leases2.dlq", p0, &[dead.deliveries[0].token()]).await.unwrap();
    let described = admin.describe_queue("leases2").await.unwrap();
    assert_eq!(described.partitions[0].quarantined, 0, "the dead letter was acked");
    for lane in ["leases2", "leases2.dlq"] {
        let left = client.claim(lane, p0, &claim_options(0xe, 4, 5_000, 0)).await.unwrap();
        assert!(left.deliveries.is_empty(), "{lane} still delivers");
    }
}
