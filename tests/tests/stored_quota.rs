//! Stored quotas per principal against a real `spoold` with an auth file:
//! a principal with `stored_messages_max = N` stores N messages, the next
//! enqueue is refused `QUOTA_EXCEEDED` naming the quota, and acks make room
//! again; records written while authentication was off, and records of
//! other principals, count against no one; the counts survive a SIGKILL and
//! restart (replay of the `Attributed` events), and the metrics show them.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use spool_client::spool_wire::proto::PartitionId;
use spool_client::spool_wire::ErrorCode;
use spool_client::{
    Admin, ClaimOptions, Client, ClientConfig, ClientError, ConnectionConfig, Credentials, Message,
    Producer, ProducerConfig,
};
use spool_tests::admin::{http_get, Exposition};
use spool_tests::auth::{write_auth_file, Principal};
use spool_tests::{now, test_queue_config, Spoold, SpooldOptions};

const OPS: &str = "ops";
const CAPPED: &str = "capped";
const FREE: &str = "free";
const SECRET: &str = "stored-quota-secret";
const QUEUE: &str = "stored";
/// `stored_messages_max` of [`CAPPED`].
const CAP: u64 = 5;
/// How long a test polls for an event before it fails.
const PATIENCE: Duration = Duration::from_secs(20);

/// `capped` may hold [`CAP`] messages; `free` has no quota; `ops`
/// administers.
fn auth_file(dir: &Path) -> PathBuf {
    let path = dir.join("auth.toml");
    write_auth_file(
        &path,
        &[
            Principal::new(OPS, SECRET, &["*"], &["admin", "describe", "enqueue", "claim"]),
            Principal::new(CAPPED, SECRET, &["*"], &["enqueue", "claim", "describe"])
                .with_quota(&[("stored_messages_max", CAP)]),
            Principal::new(FREE, SECRET, &["*"], &["enqueue", "claim"]),
        ],
    );
    path
}

async fn client_as(broker: &Spoold, principal: &str) -> Client {
    let config = ClientConfig {
        connection: ConnectionConfig {
            request_timeout: Duration::from_secs(15),
            ..ConnectionConfig::default()
        },
    }
    .with_credentials(Credentials::new(principal, SECRET));
    Client::connect_with(&broker.addr(), config).await.unwrap()
}

/// A producer that does not retry, so a refusal reaches the test.
fn producer(client: &Client) -> Producer {
    Producer::new(client.clone(), ProducerConfig { retries: 0, ..ProducerConfig::default() })
        .unwrap()
}

fn in_use(broker: &Spoold, principal: &str, quota: &str) -> Option<f64> {
    let page = http_get(&broker.admin_addr(), "/metrics");
    assert_eq!(page.status, 200, "{page:?}");
    Exposition::parse(&page.body)
        .unwrap()
        .value("spool_quota_in_use", &[("principal", principal), ("quota", quota)])
}

/// Polls until `capped`'s stored messages in use read `expected`.
async fn await_in_use(broker: &Spoold, expected: u64) {
    let deadline = now() + PATIENCE;
    loop {
        let seen = in_use(broker, CAPPED, "stored_messages_max");
        if seen == Some(expected as f64) {
            return;
        }
        assert!(now() < deadline, "stored_messages_max in use {seen:?}, expected {expected}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The refusal must be the stored quota's, with its retry hint.
fn stored_refusal(error: &ClientError) -> Duration {
    assert_eq!(error.code(), Some(ErrorCode::QuotaExceeded), "{error}");
    assert!(error.to_string().contains("stored_messages_max"), "{error}");
    assert!(error.to_string().contains(CAPPED), "{error}");
    error.retry_after().unwrap_or_else(|| panic!("no retry hint in {error}"))
}

/// Sends until one send passes, waiting out each refusal's hint (acks
/// lower the shard's figure at its next housekeeping tick).
async fn send_when_room(producer: &Producer, body: &str) {
    let deadline = now() + PATIENCE;
    loop {
        match producer.send(QUEUE, Message::new(body.to_owned())).await {
            Ok(_) => return,
            Err(error) if now() < deadline => {
                // A bounded poll at the refusal's hint (the next tick lowers the figure).
                tokio::time::sleep(stored_refusal(&error)).await;
            }
            Err(error) => panic!("still refused after {PATIENCE:?}: {error}"),
        }
    }
}

/// Claims and acks `count` messages (oldest first) as `client`.
async fn claim_and_ack(client: &Client, count: u32) {
    let options = ClaimOptions::new(count).lease_ms(60_000).wait_ms(0);
    let claimed = client.claim(QUEUE, PartitionId(0), &options).await.unwrap().deliveries;
    assert_eq!(claimed.len(), count as usize);
    let tokens: Vec<_> = claimed.iter().map(|delivery| delivery.token()).collect();
    client.ack(QUEUE, PartitionId(0), &tokens).await.unwrap();
}

// Goal: the stored-messages quota end to end. Records written with
// authentication off count against no one (3 of them do not take capped's
// room); capped stores exactly CAP, the next send is refused
// QUOTA_EXCEEDED naming stored_messages_max with a retry hint; another
// principal's records do not count; acking capped's messages gives the room
// back (and acking unattributed ones does not lower capped's figure below
// what it stores); after SIGKILL and restart the counts are the same (the
// first send is refused at once) and an ack still frees room.
// Method: one shard, one partition (the share is the whole figure), FIFO
// claims so the test knows whose messages each ack takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_messages_quota_refuses_frees_on_ack_and_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = auth_file(dir.path());
    // Authentication off first: three anonymous records.
    let mut broker = Spoold::start_with(SpooldOptions::new(1));
    {
        let anonymous = broker.client().await;
        Admin::new(anonymous.clone())
            .create_queue(QUEUE, test_queue_config(1, 60_000, 100))
            .await
            .unwrap();
        let anonymous = producer(&anonymous);
        for index in 0..3 {
            anonymous.send(QUEUE, Message::new(format!("anonymous {index}"))).await.unwrap();
        }
    }
    broker.terminate();
    broker.options_mut().args.push(format!("--auth-file={}", path.display()));
    broker.restart();

    let capped = client_as(&broker, CAPPED).await;
    let capped_producer = producer(&capped);
    for index in 0..CAP {
        capped_producer.send(QUEUE, Message::new(format!("capped {index}"))).await.unwrap();
    }
    let refused = capped_producer.send(QUEUE, Message::new("one too many")).await.unwrap_err();
    let hint = stored_refusal(&refused);
    assert!(hint <= Duration::from_secs(1), "{hint:?}");
    // Another principal's records are not capped's.
    let free = client_as(&broker, FREE).await;
    let free_producer = producer(&free);
    for index in 0..3 {
        free_producer.send(QUEUE, Message::new(format!("free {index}"))).await.unwrap();
    }
    await_in_use(&broker, CAP).await;
    assert!(in_use(&broker, FREE, "stored_messages_max").is_none(), "free has no series");

    // The three anonymous records and capped's first two are the oldest:
    // acking them frees two of capped's places, no more.
    let ops = client_as(&broker, OPS).await;
    claim_and_ack(&ops, 5).await;
    await_in_use(&broker, CAP - 2).await;
    send_when_room(&capped_producer, "after the acks 1").await;
    capped_producer.send(QUEUE, Message::new("after the acks 2")).await.unwrap();
    let refused = capped_producer.send(QUEUE, Message::new("full again")).await.unwrap_err();
    stored_refusal(&refused);

    // SIGKILL and restart: the counts come back from the log.
    broker.kill();
    broker.restart();
    let capped = client_as(&broker, CAPPED).await;
    let capped_producer = producer(&capped);
    let refused = capped_producer.send(QUEUE, Message::new("after restart")).await.unwrap_err();
    stored_refusal(&refused);
    await_in_use(&broker, CAP).await;
    // capped's three oldest remaining, then free's three: ack one of capped's.
    let ops = client_as(&broker, OPS).await;
    claim_and_ack(&ops, 1).await;
    await_in_use(&broker, CAP - 1).await;
    send_when_room(&capped_producer, "after restart and ack").await;
}
