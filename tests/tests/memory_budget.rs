// Goal: no client can grow the broker past its memory budget. Hostile
// connections each start a frame as large as frame_bytes_max and never
// finish it (nor read anything), and the broker still holds at most its
// requests pool of them, its resident memory grows by less than that pool
// plus a fixed overhead, and a well-behaved client beside them completes
// every enqueue + claim + ack round trip within GOOD_ROUND_TRIP_MAX (served
// beside the load, not after it: the hostile frames end only when their
// peers close, 60 s later at the latest), every acknowledged message
// claimed back; once the hostile peers close (as killed clients
// do: their close queued behind their unsent bytes), every grant comes back
// within seconds — long before the frames' deadline — and resident memory
// returns near its start.
//
// Method: a real spoold with one shard and `--memory-bytes 128 MiB` (a
// requests pool of 30 MiB), 48 connections that each write a 4 MiB frame
// header and 4 MiB less 64 bytes of body; the pool's figures from
// /metrics, VmRSS from /proc. Measured: RSS grew by 41–53 MiB with the budget (5 runs),
// by 336 MiB with a budget too large to bite (each buffer grew to 4 MiB).
//
// How it can fail: with the read buffers unbounded, RSS grows by 336 MiB
// and nobody waits for the pool (both checked, seen failing);
// with the budget but no waiting (a connection refused instead of paused),
// the waits counter stays 0; with read buffers grown in parts (each
// connection holding part of its frame and waiting for more, reading
// nothing, so no close is seen) the pool stays held until the 60 s frame
// deadline (seen failing: 33 MB still held 5 s after the closes).

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use spool_tests::admin::{http_get, Exposition};
use spool_tests::fault::{good_round_trip, hold_unfinished_frames, message_id, warmed_good_client};
use spool_tests::{now, Spoold, SpooldOptions};

const QUEUE: &str = "budget";
const MEMORY_BYTES: u64 = 128 << 20;
/// The admin port's pool, carved off the top of `MEMORY_BYTES`: its floor
/// of 8 MiB (two 4 MiB API requests with their answers; 5 % is less).
const ADMIN_POOL_BYTES: u64 = 8 << 20;
/// The requests pool of the one shard: 25 % of what the admin pool leaves.
const REQUESTS_POOL_BYTES: u64 = (MEMORY_BYTES - ADMIN_POOL_BYTES) / 100 * 25;
const FRAME_BYTES: u32 = 4 << 20;
const HOSTILE_CONNECTIONS: usize = 48;
/// Resident growth allowed besides the pool: the connections' read-buffer
/// floors (64 KiB each), and the blocks a buffer left as it grew (freed,
/// not yet purged by the allocator: up to the pool again). Measured: 41
/// and 53 MiB in all; without the budget the growth was 336 MiB.
const RSS_OVERHEAD_KIB: u64 = 48 * 1024;
/// After the load, resident memory is back within this of where it started
/// (the peak was the pool and more above it) ...
const RSS_RETURN_MARGIN_KIB: u64 = 12 * 1024;
/// ... within this long of the pool emptying.
const RSS_RETURN_WITHIN: Duration = Duration::from_secs(10);
const ROUND_TRIPS: u64 = 40;
/// Far beyond the test's waits: the hostile connections must end by their
/// peers' closes.
const FRAME_TIMEOUT_MS: u64 = 60_000;
/// Every grant is back this soon after the hostile peers close (measured:
/// ≈ 120 ms; the rest is a margin for a loaded machine).
const PEER_GONE_WITHIN: Duration = Duration::from_secs(5);
/// The slowest good round trip beside the hostile load: a client starved
/// until the hostile connections end would wait for their peers' closes
/// (after the round trips, at most `FRAME_TIMEOUT_MS`). Not a latency
/// target (those live in `spool-bench memory`): loaded and unloaded p99s
/// are printed for the record (measured ≈ 2 ms alone, 2–160 ms beside the
/// load on a shared 2-vCPU machine running other tests).
const GOOD_ROUND_TRIP_MAX: Duration = Duration::from_secs(5);

/// The 99th percentile of `samples` (the largest of fewer than 100).
fn p99(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples[(samples.len() * 99 / 100).min(samples.len() - 1)]
}

fn requests_pool(broker: &Spoold, figure: &str) -> f64 {
    let page = http_get(&broker.admin_addr(), "/metrics");
    assert_eq!(page.status, 200, "{}", page.body);
    let exposition = Exposition::parse(&page.body).unwrap();
    exposition
        .value(figure, &[("shard", "0"), ("pool", "requests")])
        .unwrap_or_else(|| panic!("{figure} not in /metrics"))
}

/// One shard with `MEMORY_BYTES`, frames up to `FRAME_BYTES` and a frame
/// deadline far past the tests' waits (the unfinished frames are held while
/// a test measures; their peers' closes or resets end them).
fn start_budgeted() -> Spoold {
    let mut options = SpooldOptions::new(1);
    options.args = vec![
        "--memory-bytes".into(),
        MEMORY_BYTES.to_string(),
        "--frame-bytes-max".into(),
        (FRAME_BYTES + 4096).to_string(),
        "--frame-timeout-ms".into(),
        FRAME_TIMEOUT_MS.to_string(),
    ];
    Spoold::start_with(options)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hostile_frames_stay_inside_the_memory_budget() {
    let broker = start_budgeted();
    assert_eq!(
        requests_pool(&broker, "spool_shard_memory_budget_bytes"),
        REQUESTS_POOL_BYTES as f64
    );
    let (client, producer) = warmed_good_client(&broker, QUEUE).await;
    // The good client's round trips alone, for the ratio below.
    let mut unloaded = Vec::new();
    for round in 0..ROUND_TRIPS {
        let id = message_id(2, round);
        unloaded.push(good_round_trip(&client, &producer, QUEUE, id, round).await);
    }
    let unloaded_p99 = p99(&mut unloaded);
    let rss_start_kib = broker.rss_kib().unwrap();

    let hostile = hold_unfinished_frames(&broker.addr(), HOSTILE_CONNECTIONS, FRAME_BYTES, false);
    // The pool fills and connections wait for it (the event, bounded).
    spool_tests::events::wait_for_metric(
        &broker,
        "spool_shard_memory_waits_total",
        "a connection waiting for the requests pool",
        |waits| waits >= 1.0,
    )
    .await;

    // Each round trip enqueues a message, claims that very message back
    // and acks it: nothing acknowledged is lost beside the hostile load.
    let mut loaded = Vec::new();
    for round in 0..ROUND_TRIPS {
        loaded.push(good_round_trip(&client, &producer, QUEUE, message_id(1, round), round).await);
    }
    let slowest = loaded.iter().max().copied().unwrap_or_default();
    let loaded_p99 = p99(&mut loaded);
    eprintln!(
        "good round trips' p99 {loaded_p99:?} beside the hostile load, {unloaded_p99:?} alone"
    );
    assert!(
        slowest <= GOOD_ROUND_TRIP_MAX,
        "a good round trip took {slowest:?} beside the hostile load (p99 {loaded_p99:?}, \
         {unloaded_p99:?} alone): it waited for the hostile connections"
    );

    let used = requests_pool(&broker, "spool_shard_memory_used_bytes");
    let peak = requests_pool(&broker, "spool_shard_memory_peak_bytes");
    let rss_end_kib = broker.rss_kib().unwrap();
    eprintln!(
        "requests pool {REQUESTS_POOL_BYTES}: used {used}, peak {peak}; RSS {rss_start_kib} → \
         {rss_end_kib} KiB; good round trip p99 {slowest:?} (alone {unloaded_p99:?})"
    );
    assert!(
        used > 0.0 && peak > (REQUESTS_POOL_BYTES / 2) as f64,
        "the hostile buffers drew from the pool"
    );
    assert!(
        peak <= (REQUESTS_POOL_BYTES + u64::from(FRAME_BYTES) + 4096) as f64,
        "the pool held {peak} bytes, over its {REQUESTS_POOL_BYTES} and one frame"
    );
    assert!(
        rss_end_kib < rss_start_kib + REQUESTS_POOL_BYTES / 1024 + RSS_OVERHEAD_KIB,
        "RSS grew from {rss_start_kib} KiB to {rss_end_kib} KiB with a {} KiB pool",
        REQUESTS_POOL_BYTES / 1024
    );
    for task in hostile {
        task.abort();
    }
    // The peers close and every grant comes back: a connection holding
    // memory holds room for its whole frame and reads, so it sees the close,
    // and a waiting one holds nothing of the pool until it is granted.
    let closed_at = now();
    let deadline = closed_at + PEER_GONE_WITHIN;
    loop {
        let used = requests_pool(&broker, "spool_shard_memory_used_bytes");
        if used == 0.0 {
            eprintln!("pool empty {:?} after the closes", now() - closed_at);
            break;
        }
        assert!(now() < deadline, "{used} bytes still held {PEER_GONE_WITHIN:?} after the closes");
        // A bounded poll: the figure is read again each time.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // And the memory goes back to the kernel within seconds (buffers shrink
    // when empty; the allocator purges what was freed about a second later).
    let returned_by = now() + RSS_RETURN_WITHIN;
    loop {
        let rss_kib = broker.rss_kib().unwrap();
        if rss_kib < rss_start_kib + RSS_RETURN_MARGIN_KIB {
            eprintln!("RSS back to {rss_kib} KiB (start {rss_start_kib} KiB)");
            break;
        }
        assert!(
            now() < returned_by,
            "RSS still {rss_kib} KiB {RSS_RETURN_WITHIN:?} after the pool emptied (start \
             {rss_start_kib} KiB)"
        );
        // A bounded poll: the figure is read again each time.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn peers_closed(broker: &Spoold) -> f64 {
    let page = http_get(&broker.admin_addr(), "/metrics");
    assert_eq!(page.status, 200, "{}", page.body);
    let exposition = Exposition::parse(&page.body).unwrap();
    exposition
        .value("spool_shard_connections_closed_total", &[("shard", "0"), ("reason", "peer_closed")])
        .expect("spool_shard_connections_closed_total{reason=\"peer_closed\"} in /metrics")
}

/// Connections waiting for memory read nothing; while the pool stays held
/// by others, a waiter whose peer resets is ended within a second or so
/// (its socket is asked every 200 ms), not at its frame deadline (60 s).
/// How it can fail: with waiters blind to their socket, the closed count
/// does not move until the deadline (seen failing: 0 of 8 after 3 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_connection_waiting_for_memory_sees_its_peer_reset() {
    const HOLDERS: usize = 12;
    const WAITERS: usize = 8;
    const ENDED_WITHIN: Duration = Duration::from_secs(3);
    let broker = start_budgeted();
    // More frames than the pool holds: it is spent and stays spent.
    let holders = hold_unfinished_frames(&broker.addr(), HOLDERS, FRAME_BYTES, false);
    let waits = spool_tests::events::wait_for_metric(
        &broker,
        "spool_shard_memory_waits_total",
        "the holders spending the requests pool",
        |waits| waits >= 1.0,
    )
    .await;
    let waiters = hold_unfinished_frames(&broker.addr(), WAITERS, FRAME_BYTES, true);
    spool_tests::events::wait_for_metric(
        &broker,
        "spool_shard_memory_waits_total",
        "the waiters in line for the requests pool",
        |now| now >= waits + WAITERS as f64,
    )
    .await;
    let closed_before = peers_closed(&broker);
    let held = requests_pool(&broker, "spool_shard_memory_used_bytes");
    for task in waiters {
        task.abort();
    }
    let reset_at = now();
    loop {
        let closed = peers_closed(&broker);
        if closed >= closed_before + WAITERS as f64 {
            eprintln!("{WAITERS} waiters ended {:?} after their resets", now() - reset_at);
            break;
        }
        assert!(
            now() < reset_at + ENDED_WITHIN,
            "{} of {WAITERS} waiting connections ended {ENDED_WITHIN:?} after their peers reset",
            closed - closed_before
        );
        // A bounded poll: the figure is read again each time.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The holders were untouched: the pool is still theirs.
    let still = requests_pool(&broker, "spool_shard_memory_used_bytes");
    assert!(still >= held / 2.0, "the holders' memory went too ({held} → {still})");
    for task in holders {
        task.abort();
    }
}
