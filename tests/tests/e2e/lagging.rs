//! A consumer that lags behind what the commit cache holds, over many
//! partitions of one shard whose entries lie interleaved in its journal:
//! its claims of `ANY` walk the journal forward, so each chunk read from a
//! file serves every partition with entries in it, and the shard reads its
//! journal about once — not once per partition
//! (`docs/design/shard-journal.md` §13).

use std::time::Duration;

use spool_client::{Admin, ClaimOptions, Delivery, Message, PayloadView, Producer, ProducerConfig};
use spool_tests::{test_queue_config, Spoold, SpooldOptions};

use crate::common::{key_for, metric_sum};

fn payload_len(delivery: &Delivery) -> usize {
    match delivery.payload() {
        PayloadView::Inline(bytes) => bytes.len(),
        PayloadView::Reference { .. } => 0,
    }
}

// Goal: a consumer that starts after 4 MB of 1 KB messages were enqueued
// round-robin over 100 partitions of one shard (one message per partition
// per round, so their journal entries interleave at message granularity)
// drains them with claims of ANY reading the journal files about once
// (at most 1.2 × the journal's bytes). Visiting partitions in turn instead,
// each partition's 40 messages span the whole journal and each visit reads
// it again (≈ 100× with 1 MiB of kept chunks). Method: one shard,
// `--tail-cache-bytes 1048576` (commit cache and kept chunks 1 MiB each);
// claims of 64 credits, no wait, each batch acked; the shard's
// `spool_shard_read_bytes_total` against the payload bytes delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_consumer_reads_the_journal_about_once_not_once_per_partition() {
    const PARTITIONS: u32 = 100;
    const ROUNDS: u32 = 40;
    const BODY: usize = 1_000;
    let mut options = SpooldOptions::new(1);
    options.args.extend(["--tail-cache-bytes".to_owned(), "1048576".to_owned()]);
    let broker = Spoold::start_with(options);
    let client = broker.client().await;
    let admin = Admin::new(client.clone());
    admin.create_queue("lag", test_queue_config(PARTITIONS, 60_000, 5)).await.unwrap();
    let config = ProducerConfig { linger: Duration::ZERO, ..ProducerConfig::default() };
    let producer = Producer::new(client.clone(), config).unwrap();
    let keys: Vec<String> = (0..PARTITIONS).map(|p| key_for(p, PARTITIONS, 3)).collect();
    for round in 0..ROUNDS {
        let mut sends = Vec::new();
        for key in &keys {
            let mut body = vec![b'x'; BODY];
            body[..4].copy_from_slice(&round.to_le_bytes());
            sends.push(producer.submit("lag", Message::new(body).key(key.clone())).await.unwrap());
        }
        for send in sends {
            send.await.unwrap();
        }
    }
    let read_before = metric_sum(&broker, "spool_shard_read_bytes_total");
    let journal = metric_sum(&broker, "spool_shard_commit_bytes_total");
    let targets = client.claim_targets("lag").await.unwrap();
    assert_eq!(targets.len(), 1);
    let options = ClaimOptions::new(64).lease_ms(60_000).wait_ms(0);
    let (mut delivered, mut bytes) = (0u32, 0usize);
    while delivered < PARTITIONS * ROUNDS {
        let batch = client.claim_shard("lag", targets[0], &options).await.unwrap();
        assert!(!batch.deliveries.is_empty(), "{delivered} delivered, then nothing");
        delivered += batch.deliveries.len() as u32;
        bytes += batch.deliveries.iter().map(payload_len).sum::<usize>();
        let tokens: Vec<_> = batch.deliveries.iter().map(Delivery::token).collect();
        client.ack("lag", targets[0], &tokens).await.unwrap();
    }
    let read = metric_sum(&broker, "spool_shard_read_bytes_total") - read_before;
    let ratio = read / bytes as f64;
    println!(
        "read {read} bytes from the journal for {bytes} delivered: {ratio:.2}×; the journal \
         held {journal} bytes: {:.2}× read",
        read / journal
    );
    assert_eq!(bytes, (PARTITIONS * ROUNDS) as usize * BODY);
    // The journal's own overhead at one message per batch (entry and batch
    // headers, commit pages) is ≈ 1.4× the payload; reading it once is the
    // floor, each partition reading its stretch again is ≈ 100×.
    assert!(read <= 1.2 * journal, "read {:.2}× the journal", read / journal);
    assert!(ratio <= 2.0, "read {ratio:.2}× the bytes delivered");
}
