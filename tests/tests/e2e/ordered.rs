//! Ordered lanes end to end (`docs/design/ordered-lanes.md`): 100 keys ×
//! 1,000 messages through a real `spoold` with random releases, `spool
//! recv` workers SIGKILLed while they hold claims in a session, and two
//! SIGKILLs of the broker; a checker over (key, sequence) finds no message
//! of a key delivered before an earlier one was finished.
//!
//! Scale: the full 100 × 1,000 (see the test's comment for the
//! time it takes). The checker fails when ordering is off: with the queue
//! created `ordered = false` (tried, then put back) the first 80
//! deliveries already gave 77 violations ("(5,1) delivered while (5,0) was
//! unfinished", "... while (5,0) was held by 0").
//!
//! An ack is applied before it is durable (`partition/delivery.rs`), so
//! the next message of its key can be claimed before the ack's reply; but
//! a claim of an ordered queue replies only once its own events are
//! durable, and with them every event before it
//! (`Partition::append_claim_events`). So an ack lost in a crash never
//! handed its key on to anyone: a message delivered again after a later
//! one of its key is a violation, even when its ack's reply was lost.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use spool_client::spool_wire::proto::{MessageState, Offset, PartitionId};
use spool_client::{Admin, Client, ClientError, Delivery, Message, Producer, ProducerConfig};
use spool_tests::killloop::rng::Rng;
use spool_tests::{test_queue_config, Spoold};
use tokio::sync::RwLock;

use crate::common::{claim_options, id_parts, message_id, unix_ms};

const QUEUE: &str = "ordered-e2e";
const KEYS: u32 = 100;
const PER_KEY: u32 = 1_000;
const PARTITIONS: u32 = 4;
/// In-test workers (tokio tasks, one client each).
const WORKERS: u64 = 6;
const CREDITS: u32 = 16;
/// Far above any processing time: no in-test claim expires while held.
const LEASE_MS: u32 = 30_000;
/// The `spool recv` workers' session timeout: their claims must be
/// claimable again within it once they are SIGKILLed.
const SESSION_MS: u32 = 3_000;
/// Claims each `spool recv` worker holds.
const RECV_HOLDS: u32 = 8;
/// The worker id the checker gives the `spool recv` processes.
const RECV: u64 = u64::MAX;
/// The whole run after the produce, or the test fails.
const RUN_TIMEOUT: Duration = Duration::from_secs(150);
/// Violations kept with their text (all are counted).
const VIOLATIONS_KEPT: usize = 10;

#[derive(Debug, Default, Clone, Copy)]
struct Seq {
    /// Acked with a successful reply.
    confirmed: bool,
    /// Acks sent and not answered yet (the ack may be applied already).
    in_flight: u32,
    /// An ack whose outcome is unknown (its reply failed): maybe finished.
    maybe: bool,
    /// When its confirmed ack was sent (the checker's count of acks sent).
    confirmed_sent: u64,
}

#[derive(Debug)]
struct Lane {
    seqs: Vec<Seq>,
    /// Every seq below it is confirmed.
    confirmed_prefix: u32,
    max_delivered: Option<u32>,
    /// The seq held now and its worker (claimed, not yet acked or released).
    held: Option<(u32, u64)>,
    /// Every delivery: seq and when it was seen.
    history: Vec<(u32, Instant)>,
}

/// How an ack ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AckOutcome {
    Confirmed,
    /// The broker answered and refused the token: not finished.
    Refused,
    /// No answer: maybe finished.
    Unknown,
}

/// Every delivery, ack and release, checked as it is seen.
#[derive(Debug)]
struct Checker {
    lanes: Vec<Lane>,
    violations: Vec<String>,
    violation_count: u64,
    deliveries: u64,
    releases: u64,
    confirmed: u64,
    refused: u64,
    unknown: u64,
    /// A maybe-finished message delivered again (its ack was lost).
    lost_acks: u64,
    /// ... after a later message of its key had been delivered: the ack
    /// was applied (the next one handed out) but lost in the crash.
    reordered_by_crash: u64,
    /// Sequences confirmed or maybe finished.
    done: u64,
    /// Acks sent so far.
    acks_sent: u64,
}

impl Checker {
    fn new() -> Self {
        let lane = || Lane {
            seqs: vec![Seq::default(); PER_KEY as usize],
            confirmed_prefix: 0,
            max_delivered: None,
            held: None,
            history: Vec::new(),
        };
        Self {
            lanes: (0..KEYS).map(|_| lane()).collect(),
            violations: Vec::new(),
            violation_count: 0,
            deliveries: 0,
            releases: 0,
            confirmed: 0,
            refused: 0,
            unknown: 0,
            lost_acks: 0,
            reordered_by_crash: 0,
            done: 0,
            acks_sent: 0,
        }
    }

    fn violation(&mut self, text: String) {
        self.violation_count += 1;
        if self.violations.len() < VIOLATIONS_KEPT {
            self.violations.push(text);
        }
    }

    fn delivered(&mut self, key: u32, seq: u32, worker: u64) {
        self.deliveries += 1;
        let lane = &mut self.lanes[key as usize];
        lane.history.push((seq, spool_tests::now()));
        let mut found = Vec::new();
        if lane.seqs[seq as usize].confirmed {
            found.push(format!("({key},{seq}) delivered again after its ack was confirmed"));
        }
        let unfinished = (lane.confirmed_prefix..seq).find(|&earlier| {
            let state = lane.seqs[earlier as usize];
            !(state.confirmed || state.in_flight > 0 || state.maybe)
        });
        if let Some(earlier) = unfinished {
            found.push(format!("({key},{seq}) delivered while ({key},{earlier}) was unfinished"));
        }
        if let Some((held, holder)) = lane.held {
            found.push(format!(
                "({key},{seq}) delivered to worker {worker} while ({key},{held}) was held by {holder}"
            ));
        }
        let state = &mut lane.seqs[seq as usize];
        if state.maybe {
            state.maybe = false;
            self.lost_acks += 1;
            if !state.confirmed {
                self.done -= 1;
            }
            if let Some(max) = lane.max_delivered.filter(|&max| max > seq) {
                self.reordered_by_crash += 1;
                found.push(format!(
                    "({key},{seq}) delivered again (its ack lost) after ({key},{max}) was"
                ));
            }
        }
        lane.held = Some((seq, worker));
        lane.max_delivered = lane.max_delivered.max(Some(seq));
        for text in found {
            self.violation(text);
        }
    }

    /// The worker gave `(key, seq)` back or sent its ack: no longer held.
    fn let_go(&mut self, key: u32, seq: u32, worker: u64) {
        let lane = &mut self.lanes[key as usize];
        if lane.held == Some((seq, worker)) {
            lane.held = None;
        }
    }

    fn released(&mut self, key: u32, seq: u32, worker: u64) {
        self.releases += 1;
        self.let_go(key, seq, worker);
    }

    /// Returns the ack's number, for [`Checker::ack_ended`].
    fn ack_sent(&mut self, key: u32, seq: u32, worker: u64) -> u64 {
        self.let_go(key, seq, worker);
        self.lanes[key as usize].seqs[seq as usize].in_flight += 1;
        self.acks_sent += 1;
        self.acks_sent
    }

    fn ack_ended(&mut self, key: u32, seq: u32, sent: u64, outcome: AckOutcome) {
        let lane = &mut self.lanes[key as usize];
        let max_delivered = lane.max_delivered;
        let state = &mut lane.seqs[seq as usize];
        state.in_flight -= 1;
        let was_done = state.confirmed || state.maybe;
        let mut found = None;
        match outcome {
            AckOutcome::Confirmed => {
                self.confirmed += 1;
                if state.confirmed {
                    found = Some(format!("({key},{seq}) acked twice"));
                }
                state.confirmed = true;
                state.confirmed_sent = sent;
                while lane.seqs.get(lane.confirmed_prefix as usize).is_some_and(|s| s.confirmed) {
                    lane.confirmed_prefix += 1;
                }
            }
            AckOutcome::Refused => {
                self.refused += 1;
                // A later one handed out while this ack was in flight was
                // handed out early: this ack did not finish it.
                let covered = state.confirmed || state.in_flight > 0 || state.maybe;
                if !covered && max_delivered.is_some_and(|max| max > seq) {
                    found = Some(format!(
                        "({key},{seq})'s ack was refused after a later one was delivered"
                    ));
                }
            }
            AckOutcome::Unknown => {
                self.unknown += 1;
                state.maybe = true;
            }
        }
        let state = self.lanes[key as usize].seqs[seq as usize];
        if !was_done && (state.confirmed || state.maybe) {
            self.done += 1;
        }
        if let Some(text) = found {
            self.violation(text);
        }
    }

    /// Per key, the confirmed acks in the order they were sent have
    /// increasing seqs (their replies may come in any order: the next
    /// message can be claimed and acked before the previous ack's reply).
    fn check_ack_order(&mut self) {
        let mut found = Vec::new();
        for (key, lane) in self.lanes.iter().enumerate() {
            let mut acks: Vec<(u64, usize)> = (lane.seqs.iter().enumerate())
                .filter(|(_, state)| state.confirmed)
                .map(|(seq, state)| (state.confirmed_sent, seq))
                .collect();
            acks.sort_unstable();
            if let Some(pair) = acks.windows(2).find(|pair| pair[0].1 > pair[1].1) {
                let (first, then) = (pair[0].1, pair[1].1);
                found.push(format!("({key},{first})'s ack was sent after ({key},{then})'s"));
            }
        }
        for text in found {
            self.violation(text);
        }
    }

    /// Sequences that are neither confirmed nor maybe finished.
    fn open(&self) -> u64 {
        u64::from(KEYS * PER_KEY) - self.done
    }

    fn summary(&self) -> String {
        format!(
            "{} deliveries, {} releases, acks {} confirmed / {} refused / {} unknown, \
             {} lost acks ({} redelivered after a later one), {} violations: {:?}",
            self.deliveries,
            self.releases,
            self.confirmed,
            self.refused,
            self.unknown,
            self.lost_acks,
            self.reordered_by_crash,
            self.violation_count,
            self.violations
        )
    }
}

/// What the workers and the test share.
struct Shared {
    checker: Mutex<Checker>,
    /// Held (read) by a worker from its claim until its acks and releases
    /// are answered and recorded; the test takes it to pause the workers
    /// (and, after a broker SIGKILL, to know every request to the dead
    /// process was recorded before the new one serves).
    gate: RwLock<()>,
    stop: AtomicBool,
}

impl Shared {
    fn checker(&self) -> std::sync::MutexGuard<'_, Checker> {
        self.checker.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn key_name(key: u32) -> String {
    format!("key-{key}")
}

/// `(key, seq)` of a delivery, by its message id.
fn key_seq(delivery: &Delivery) -> (u32, u32) {
    let (key, seq) = id_parts(delivery.message_id());
    assert_eq!(delivery.routing_key(), key_name(key).as_bytes(), "key of ({key},{seq})");
    (key, u32::try_from(seq).unwrap())
}

/// One in-test worker: claims, then randomly acks (75 %), releases with
/// the queue's backoff (15 %) or releases with its own short delay
/// (10 %), now and then after a short pause.
async fn worker(shared: Arc<Shared>, client: Client, index: u64, mut rng: Rng) {
    let options = claim_options(index, CREDITS, LEASE_MS, 100);
    while !shared.stop.load(Ordering::Acquire) {
        let gate = shared.gate.read().await;
        let deliveries = match client.claim_any(QUEUE, &options).await {
            Ok(deliveries) => deliveries,
            Err(_) => {
                drop(gate);
                tokio::time::sleep(Duration::from_millis(30)).await;
                continue;
            }
        };
        {
            let mut checker = shared.checker();
            for delivery in &deliveries {
                let (key, seq) = key_seq(delivery);
                checker.delivered(key, seq, index);
            }
        }
        if rng.percent(10) {
            tokio::time::sleep(Duration::from_millis(rng.range(1, 5))).await;
        }
        let mut acks: HashMap<PartitionId, Vec<&Delivery>> = HashMap::new();
        for delivery in &deliveries {
            let (key, seq) = key_seq(delivery);
            let roll = rng.range(0, 99);
            if roll < 75 {
                acks.entry(delivery.partition()).or_default().push(delivery);
                continue;
            }
            let delay_ms = if roll < 90 { 0 } else { rng.range(1, 20) as u32 };
            shared.checker().released(key, seq, index);
            let token = delivery.token();
            let _ = client.release(QUEUE, delivery.partition(), token, delay_ms, "test").await;
        }
        for (partition, group) in acks {
            let keys: Vec<(u32, u32)> = group.iter().map(|delivery| key_seq(delivery)).collect();
            let sent: Vec<u64> = {
                let mut checker = shared.checker();
                keys.iter().map(|&(key, seq)| checker.ack_sent(key, seq, index)).collect()
            };
            let tokens: Vec<_> = group.iter().map(|delivery| delivery.token()).collect();
            let mut outcomes = vec![AckOutcome::Confirmed; tokens.len()];
            match client.ack(QUEUE, partition, &tokens).await {
                Ok(()) => {}
                Err(ClientError::AckRefused { refused, .. }) => {
                    for refused in refused {
                        outcomes[refused.index] = AckOutcome::Refused;
                    }
                }
                Err(_) => outcomes.fill(AckOutcome::Unknown),
            }
            let mut checker = shared.checker();
            for ((&(key, seq), sent), outcome) in keys.iter().zip(sent).zip(outcomes) {
                checker.ack_ended(key, seq, sent, outcome);
            }
        }
        drop(gate);
    }
}

/// Kills its `spool recv` when dropped (a failed test leaves none behind).
struct RecvProcess(Child);

impl Drop for RecvProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `spool recv` holding up to [`RECV_HOLDS`] claims (60 s lease) in a
/// session of [`SESSION_MS`]; returns once it said how many it holds.
fn holding_recv(broker: &Spoold) -> (RecvProcess, usize) {
    let mut command = Command::new(spool_tests::spool_bin());
    command.args(["--addr", &broker.addr(), "recv", QUEUE, "-n", &RECV_HOLDS.to_string()]);
    command.args(["--lease-ms", "60000", "--wait-ms", "5000", "--hold-ms", "600000"]);
    command.args(["--session-timeout-ms", &SESSION_MS.to_string()]);
    let child = command.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let mut recv = RecvProcess(child);
    let mut stderr = BufReader::new(recv.0.stderr.take().unwrap());
    let mut line = String::new();
    let held = loop {
        line.clear();
        assert!(stderr.read_line(&mut line).unwrap() > 0, "spool recv ended before holding");
        if let Some(rest) = line.strip_prefix("holding ") {
            break rest.split(' ').next().unwrap().parse::<usize>().unwrap();
        }
    };
    std::thread::spawn(move || for _ in stderr.lines() {});
    (recv, held)
}

/// The claimed messages of the queue, by peek (while the in-test workers
/// hold nothing, they are the `spool recv`'s): `(key, seq)` of each.
async fn claimed_by_peek(
    admin: &Admin,
    placed: &HashMap<(u32, u64), (u32, u32)>,
    want: usize,
) -> Vec<(u32, u32)> {
    let mut claimed = Vec::new();
    for partition in 0..PARTITIONS {
        let mut from = 0;
        while claimed.len() < want {
            let page = admin.peek(QUEUE, PartitionId(partition), Offset(from), 1_000).await;
            let page = page.unwrap();
            let Some(last) = page.last() else { break };
            from = last.offset.0 + 1;
            for message in page.iter().filter(|message| message.state == MessageState::Claimed) {
                claimed.push(placed[&(partition, message.offset.0)]);
            }
        }
    }
    claimed
}

/// Pauses the workers, lets a `spool recv` claim a few heads in a session,
/// resumes them, SIGKILLs the recv after a while and checks its claims are
/// delivered again (each first of its key) within the session timeout.
async fn recv_killed(
    shared: &Shared,
    broker: &Spoold,
    admin: &Admin,
    placed: &HashMap<(u32, u64), (u32, u32)>,
) {
    let gate = shared.gate.write().await;
    // A claim_any's long polls on other partitions may still deliver after
    // it returned; the client releases those: wait for nothing claimed.
    let settled = spool_tests::now();
    while claimed_in_queue(admin).await > 0 {
        assert!(settled.elapsed() < Duration::from_secs(10), "claims left while paused");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (recv, count) = tokio::task::block_in_place(|| holding_recv(broker));
    assert!(count > 0, "spool recv claimed nothing");
    assert_eq!(claimed_in_queue(admin).await, count as u64, "only spool recv holds claims");
    let held = claimed_by_peek(admin, placed, count).await;
    assert_eq!(held.len(), count, "peek shows what spool recv holds");
    {
        let mut checker = shared.checker();
        for &(key, seq) in &held {
            checker.delivered(key, seq, RECV);
        }
    }
    drop(gate);
    // The workers go on; none may get a message of a held key meanwhile.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let seen: Vec<usize> = {
        let checker = shared.checker();
        held.iter().map(|&(key, _)| checker.lanes[key as usize].history.len()).collect()
    };
    // Paused again for the kill, so the recv's holds end in the checker
    // before a worker can be handed them.
    let gate = shared.gate.write().await;
    drop(recv);
    let killed = spool_tests::now();
    {
        let mut checker = shared.checker();
        for &(key, seq) in &held {
            checker.let_go(key, seq, RECV);
        }
    }
    drop(gate);
    let within = Duration::from_millis(SESSION_MS.into());
    loop {
        let back: Vec<Option<(u32, Instant)>> = {
            let checker = shared.checker();
            let first_after = |(&(key, _), &seen): (&(u32, u32), &usize)| {
                checker.lanes[key as usize].history.get(seen).copied()
            };
            held.iter().zip(&seen).map(first_after).collect()
        };
        if back.iter().all(Option::is_some) {
            for (&(key, seq), again) in held.iter().zip(back) {
                let (next, at) = again.unwrap();
                assert_eq!(next, seq, "key {key}: after the recv's ({key},{seq}) came {next}");
                let took = at.duration_since(killed);
                assert!(took <= within, "({key},{seq}) back {took:?} after the SIGKILL");
            }
            return;
        }
        assert!(killed.elapsed() <= within, "held claims not back in {within:?}: {back:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// SIGKILL of the broker with requests in flight, then restart; the
/// workers wait at the gate until every request to the dead process was
/// recorded.
async fn broker_killed(shared: &Shared, broker: &mut Spoold) {
    tokio::task::block_in_place(|| broker.kill());
    let gate = shared.gate.write().await;
    tokio::task::block_in_place(|| broker.restart());
    drop(gate);
}

/// Waits until `fraction` of the messages are (maybe) finished.
async fn progress(shared: &Shared, fraction: f64, started: Instant) {
    let total = KEYS * PER_KEY;
    loop {
        let (done, violations, summary) = {
            let checker = shared.checker();
            (checker.done, checker.violation_count, checker.summary())
        };
        assert_eq!(violations, 0, "{summary}");
        if done as f64 >= fraction * f64::from(total) {
            return;
        }
        assert!(started.elapsed() < RUN_TIMEOUT, "stuck before {fraction}: {summary}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Messages claimed now.
async fn claimed_in_queue(admin: &Admin) -> u64 {
    let described = admin.describe_queue(QUEUE).await.unwrap();
    described.partitions.iter().map(|p| p.claimed).sum()
}

/// Messages the queue still holds (ready, scheduled, claimed, waiting).
async fn held_by_queue(admin: &Admin) -> u64 {
    let described = admin.describe_queue(QUEUE).await.unwrap();
    described.partitions.iter().map(|p| p.ready + p.scheduled + p.claimed + p.lanes.waiting).sum()
}

// Goal: the end-to-end case: per key one message at a time, in
// offset order, through random releases (with and without a delay), two
// `spool recv` workers SIGKILLed holding claims in a 3 s session (their
// claims back within it, each still first of its key) and two SIGKILLs of
// the broker; every message finished. Method: 100 keys × 1,000 messages
// on 4 partitions (seq order = offset order, checked), 6 claiming tasks;
// the checker records every delivery and ack: no delivery of (k, s) while
// an earlier (k, s') is neither acked (confirmed, or in flight) nor maybe
// acked (reply lost with the broker); no two of a key held at once;
// confirmed acks per key in increasing seq; at the end every (k, s)
// finished and the queue empty. Run time: about 20 s (the dev profile, 2
// cores), so the full scale stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_keys_hold_through_releases_and_sigkills() {
    let mut broker = Spoold::start(2);
    let client = broker.client().await;
    let admin = Admin::new(client.clone());
    let mut config = test_queue_config(PARTITIONS, 5_000, 100);
    config.ordered = true;
    config.backoff.base_ms = 10;
    config.backoff.cap_ms = 10;
    admin.create_queue(QUEUE, config).await.unwrap();

    let produce_started = spool_tests::now();
    let producer_config = ProducerConfig { in_flight_per_partition: 1, ..Default::default() };
    let producer = Producer::new(client.clone(), producer_config).unwrap();
    let mut sends = Vec::new();
    for seq in 0..PER_KEY {
        for key in 0..KEYS {
            let message = Message::new(format!("{key}:{seq}"))
                .key(key_name(key))
                .id(message_id(key, u64::from(seq)));
            let send = producer.submit(QUEUE, message).await.unwrap();
            sends.push((key, seq, send.partition().0, send));
        }
    }
    let mut placed: HashMap<(u32, u64), (u32, u32)> = HashMap::new();
    let mut last_offset: HashMap<u32, u64> = HashMap::new();
    for (key, seq, partition, send) in sends {
        let offset = send.await.unwrap().0;
        if let Some(&before) = last_offset.get(&key) {
            assert!(offset > before, "({key},{seq}) stored before its key's earlier message");
        }
        last_offset.insert(key, offset);
        placed.insert((partition, offset), (key, seq));
    }
    assert_eq!(placed.len(), (KEYS * PER_KEY) as usize);
    eprintln!("produced {} in {:?}", placed.len(), produce_started.elapsed());

    let shared = Arc::new(Shared {
        checker: Mutex::new(Checker::new()),
        gate: RwLock::new(()),
        stop: AtomicBool::new(false),
    });
    let seed = unix_ms();
    eprintln!("seed {seed}");
    let mut workers = Vec::new();
    for index in 0..WORKERS {
        let client = broker.client().await;
        let rng = Rng::new(seed, index);
        workers.push(tokio::spawn(worker(Arc::clone(&shared), client, index, rng)));
    }

    let started = spool_tests::now();
    progress(&shared, 0.15, started).await;
    recv_killed(&shared, &broker, &admin, &placed).await;
    progress(&shared, 0.35, started).await;
    broker_killed(&shared, &mut broker).await;
    progress(&shared, 0.5, started).await;
    let admin = Admin::new(broker.client().await);
    recv_killed(&shared, &broker, &admin, &placed).await;
    progress(&shared, 0.7, started).await;
    broker_killed(&shared, &mut broker).await;
    let admin = Admin::new(broker.client().await);
    progress(&shared, 1.0, started).await;
    // Every message is (maybe) finished; a maybe whose ack was lost is
    // still in the queue and comes again.
    while held_by_queue(&admin).await > 0 || shared.checker().open() > 0 {
        let summary = shared.checker().summary();
        assert!(started.elapsed() < RUN_TIMEOUT, "not drained: {summary}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shared.stop.store(true, Ordering::Release);
    for worker in workers {
        worker.await.unwrap();
    }
    let took = started.elapsed();

    {
        let mut checker = shared.checker();
        checker.check_ack_order();
        eprintln!("ordered run: {took:?}; {}", checker.summary());
        assert_eq!(checker.violation_count, 0, "{}", checker.summary());
        assert_eq!(checker.open(), 0, "every message finished");
        let seqs = checker.lanes.iter().flat_map(|lane| &lane.seqs);
        let maybe = seqs.filter(|s| !s.confirmed).count();
        assert_eq!(checker.confirmed as usize + maybe, (KEYS * PER_KEY) as usize);
        assert!(checker.releases > 0 && checker.deliveries > u64::from(KEYS * PER_KEY));
    }
    let described = admin.describe_queue(QUEUE).await.unwrap();
    let dead: u64 = described.partitions.iter().map(|p| p.quarantined + p.expired).sum();
    assert_eq!(dead, 0, "nothing dead-lettered or expired");
    assert_eq!(held_by_queue(&admin).await, 0);
}
