//! The ledger: what the broker acknowledged, and the checker that compares
//! it with what the broker later shows.
//!
//! Owns every fact the kill loop learns from an answer it received: enqueues
//! acknowledged (message id → partition and offset), acks acknowledged (id →
//! generation and the moment the answer arrived), deliveries seen (id and
//! generation), and acks whose outcome is unknown because the broker died
//! with them in flight. It counts violations of the contract as they are
//! observed and keeps a few examples of each for the report.
//!
//! It does no I/O and knows nothing of time except a logical sequence
//! ([`Ledger::next_seq`]) that orders "this answer arrived" before "that
//! request was sent"; the workers and the orchestrator feed it. Operations in
//! flight at a kill are never counted as acknowledged: only answers are.
//! Pure so the checks themselves can be unit-tested against hand-made
//! histories.

use std::collections::{BTreeMap, HashMap, HashSet};

use spool_client::spool_wire::batch::MessageId;
use spool_client::spool_wire::proto::{Generation, Offset, PartitionId};

use super::order::{Finished, Key, KeyOrder, Verdict};

/// Most example descriptions kept per report (the counts are exact).
pub const VIOLATION_SAMPLES_MAX: usize = 32;

/// Which broker process served an answer: 1 for the first start, +1 per
/// restart. The orchestrator advances it after a killed process is reaped
/// and before the next one starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Instance(pub u64);

/// A position in the logical order of answers and requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Seq(pub u64);

/// Where a message lives: its partition and offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Placement {
    /// The partition.
    pub partition: PartitionId,
    /// The offset in it.
    pub offset: Offset,
}

impl Placement {
    /// Placement of `offset` in `partition`.
    pub fn new(partition: PartitionId, offset: Offset) -> Self {
        Self { partition, offset }
    }
}

/// What a delivery (from a claim answer) tells the ledger.
#[derive(Debug, Clone, Copy)]
pub struct DeliverySeen {
    /// The record's message id.
    pub id: MessageId,
    /// Where it was served from.
    pub placement: Placement,
    /// Its claim generation.
    pub generation: Generation,
    /// The partition's leader epoch its token names. A claim replies before
    /// it is durable, so a crash may lose it and the next process deliver
    /// the same generation again: (epoch, generation) tells them apart.
    pub epoch: u64,
    /// When the claim request was sent (taken before sending).
    pub claim_sent: Seq,
}

/// A token-bearing request (ack, release, extend) whose answer was success.
#[derive(Debug, Clone, Copy)]
pub struct TokenUse {
    /// The message.
    pub id: MessageId,
    /// Where it lives.
    pub placement: Placement,
    /// The token's generation.
    pub generation: Generation,
    /// The process that issued the token, when known (the claim was sent
    /// and answered within one process's life).
    pub token_instance: Option<Instance>,
    /// The process counter read just before the request was sent.
    pub sent_instance: Instance,
}

/// One message as a live listing (peek or dead letters) shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveEntry {
    /// The id read from the stored record; `None` for dead letters, whose
    /// listing carries no record.
    pub id: Option<MessageId>,
    /// Whether it sits in the dead-letter lane.
    pub dead_letter: bool,
}

/// Counts of contract violations. Every field must be 0 on a correct broker.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Violations {
    /// Acknowledged enqueues neither acked, live, nor dead-lettered.
    pub lost: u64,
    /// Deliveries of a message after its ack was acknowledged.
    pub redelivered_after_ack: u64,
    /// Messages still live (or back) after their ack was acknowledged.
    pub acked_but_live: u64,
    /// Acks, releases or extends that succeeded with a token issued by a
    /// process that had been killed before the request was sent.
    pub stale_tokens_accepted: u64,
    /// A message id answered or delivered at two different placements.
    pub dedupe_conflicts: u64,
    /// Two different message ids at one placement.
    pub offset_conflicts: u64,
    /// The same (id, epoch, generation) delivered twice: two claims of one
    /// process handed out one generation.
    pub generation_reused: u64,
    /// Deliveries of an id no producer submitted.
    pub phantom_deliveries: u64,
    /// Dead letters at a placement no acknowledged enqueue names.
    pub dead_letters_unaccounted: u64,
    /// Ordered queue: a key's message delivered after a later message of
    /// the key was (`order.rs`, rule 1).
    pub key_order_regressions: u64,
    /// Ordered queue: a key's later message delivered while its current
    /// one was held with no ack sent (`order.rs`, rule 2).
    pub key_overlaps: u64,
}

impl Violations {
    /// Sum of all counts.
    pub fn total(&self) -> u64 {
        self.lost
            + self.redelivered_after_ack
            + self.acked_but_live
            + self.stale_tokens_accepted
            + self.dedupe_conflicts
            + self.offset_conflicts
            + self.generation_reused
            + self.phantom_deliveries
            + self.dead_letters_unaccounted
            + self.key_order_regressions
            + self.key_overlaps
    }
}

/// Counters that describe the run (not violations).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Activity {
    /// Deliveries seen (claims by workers, witnesses and the drain).
    pub deliveries: u64,
    /// Enqueue answers that said `Duplicate` (a retry of a durable record).
    pub duplicates_answered: u64,
    /// Acks whose outcome was unknown and that the next check found applied.
    pub ack_unknown_applied: u64,
    /// Acks whose outcome was unknown and that the next check found not
    /// applied (the message was still live).
    pub ack_unknown_not_applied: u64,
    /// Live checks run (one per restart plus the final one).
    pub live_checks: u64,
    /// Ordered queue: deliveries of a key's next message (its lane handed
    /// on).
    pub key_handovers: u64,
}

#[derive(Debug, Clone, Copy)]
struct AckRecord {
    generation: Generation,
    answered: Seq,
    /// The process that answered it; `None` for an unknown ack that a live
    /// check found applied.
    instance: Option<Instance>,
}

/// The ledger; see the module doc.
#[derive(Debug, Default)]
pub struct Ledger {
    seq: u64,
    submitted: HashSet<MessageId>,
    /// Acknowledged enqueues.
    enqueued: HashMap<MessageId, Placement>,
    /// First placement observed per id (enqueue answer or delivery), for
    /// the dedupe check; and its inverse for the offset check.
    placement_of: HashMap<MessageId, Placement>,
    id_at: HashMap<Placement, MessageId>,
    acked: HashMap<MessageId, AckRecord>,
    ack_unknown: HashMap<MessageId, Generation>,
    delivered: HashSet<(MessageId, u64, Generation)>,
    /// Keys of keyed submissions and the per-key order check.
    order: KeyOrder,
    lost_ids: HashSet<MessageId>,
    /// Conflicts, acked-but-live ids and unaccounted dead letters already
    /// counted: a listing repeats them at every check, the count must not.
    reported: HashSet<(MessageId, Placement, &'static str)>,
    violations: Violations,
    activity: Activity,
    samples: Vec<String>,
}

impl Ledger {
    /// An empty ledger.
    pub fn new() -> Self {
        Self::default()
    }

    /// The next logical position: take one before sending a request and one
    /// after its answer arrives.
    pub fn next_seq(&mut self) -> Seq {
        self.seq += 1;
        Seq(self.seq)
    }

    fn violation(&mut self, text: String) {
        if self.samples.len() < VIOLATION_SAMPLES_MAX {
            self.samples.push(text);
        }
    }

    /// A producer is about to send `id` (outcome unknown until answered).
    pub fn submit(&mut self, id: MessageId) {
        self.submitted.insert(id);
    }

    /// [`submit`](Self::submit) of a message with routing key `key` to an
    /// ordered queue: its deliveries are checked for key order.
    pub fn submit_keyed(&mut self, id: MessageId, key: Key) {
        self.submit(id);
        self.order.submit(id, key);
    }

    /// Records that `id` is at `placement`, from whichever answer showed it;
    /// counts a conflict with an earlier observation.
    /// Whether `(id, placement, kind)` is reported for the first time.
    fn first_report(&mut self, id: MessageId, placement: Placement, kind: &'static str) -> bool {
        self.reported.insert((id, placement, kind))
    }

    fn observe_placement(&mut self, id: MessageId, placement: Placement, what: &str) {
        match self.placement_of.get(&id).copied() {
            Some(known) if known != placement && self.first_report(id, placement, "dedupe") => {
                self.violations.dedupe_conflicts += 1;
                self.violation(format!(
                    "dedupe: {} {what} at {placement:?}, earlier at {known:?}",
                    hex(id)
                ));
            }
            Some(_) => {}
            None => {
                self.placement_of.insert(id, placement);
            }
        }
        match self.id_at.get(&placement).copied() {
            Some(other) if other != id && self.first_report(id, placement, "offset") => {
                self.violations.offset_conflicts += 1;
                self.violation(format!(
                    "offset: {placement:?} holds {} ({what}), earlier {}",
                    hex(id),
                    hex(other)
                ));
            }
            Some(_) => {}
            None => {
                self.id_at.insert(placement, id);
            }
        }
    }

    /// The broker acknowledged the enqueue of `id` at `placement`
    /// (`Appended`, or `Duplicate` naming the original when `duplicate`).
    pub fn enqueue_acknowledged(&mut self, id: MessageId, placement: Placement, duplicate: bool) {
        if duplicate {
            self.activity.duplicates_answered += 1;
        }
        self.observe_placement(id, placement, "enqueue answer");
        self.enqueued.entry(id).or_insert(placement);
    }

    /// A claim answer delivered `seen`.
    pub fn delivered(&mut self, seen: DeliverySeen) {
        let DeliverySeen { id, placement, generation, epoch, claim_sent } = seen;
        self.activity.deliveries += 1;
        if !self.submitted.contains(&id) {
            self.violations.phantom_deliveries += 1;
            self.violation(format!("phantom: {} delivered at {placement:?}", hex(id)));
        }
        self.observe_placement(id, placement, "delivery");
        if !self.delivered.insert((id, epoch, generation)) {
            self.violations.generation_reused += 1;
            self.violation(format!(
                "generation: {} delivered twice with epoch {epoch} generation {}",
                hex(id),
                generation.0
            ));
        }
        if let Some(ack) = self.acked.get(&id).copied() {
            // A claim sent after the ack's answer arrived, or any claim with
            // a newer generation than the acked one (which would have made
            // that ack stale), must not deliver the message.
            if claim_sent > ack.answered || generation > ack.generation {
                self.violations.redelivered_after_ack += 1;
                self.violation(format!(
                    "redelivered: {} at {placement:?} epoch {epoch} generation {} (claim sent \
                     at {:?}) after its ack of generation {} answered at {:?} ({})",
                    hex(id),
                    generation.0,
                    claim_sent,
                    ack.generation.0,
                    ack.answered,
                    match ack.instance {
                        Some(instance) => format!("by process {}", instance.0),
                        None => "an unknown ack a live check found applied".to_owned(),
                    }
                ));
            }
        }
        if let Some(key) = self.order.key(id) {
            self.check_key_order(key, id, placement);
        }
    }

    /// The key-order check of one delivery (`order.rs`).
    fn check_key_order(&mut self, key: Key, id: MessageId, placement: Placement) {
        let (acked, unknown) = (&self.acked, &self.ack_unknown);
        let finished = |held: MessageId| {
            if acked.contains_key(&held) {
                Finished::Confirmed
            } else if unknown.contains_key(&held) {
                Finished::Maybe
            } else {
                Finished::No
            }
        };
        match self.order.delivered(key, id, placement, finished) {
            Verdict::Same => {}
            Verdict::Advanced => self.activity.key_handovers += 1,
            Verdict::Back { highest, handover } => {
                self.violations.key_order_regressions += 1;
                self.violation(format!(
                    "key order: key {key} delivered {} at {placement:?} after {highest:?} (handed \
                     over {})",
                    hex(id),
                    match handover {
                        Finished::Confirmed => "on a confirmed ack",
                        Finished::Maybe => "on an ack not confirmed",
                        Finished::No => "with no ack",
                    }
                ));
            }
            Verdict::Overlap { held } => {
                self.violations.key_overlaps += 1;
                self.violation(format!(
                    "key overlap: key {key} delivered {} at {placement:?} while {held:?} was held \
                     with no ack",
                    hex(id)
                ));
            }
        }
    }

    /// An ack of `id` is about to be sent (the order check counts its
    /// message as possibly finished while it is in flight). Every answer
    /// settles it: [`ack_acknowledged`](Self::ack_acknowledged),
    /// [`ack_unknown`](Self::ack_unknown) or [`ack_refused`](Self::ack_refused).
    pub fn ack_sent(&mut self, id: MessageId) {
        self.order.ack_sent(id);
    }

    /// An ack sent with [`ack_sent`](Self::ack_sent) was refused.
    pub fn ack_refused(&mut self, id: MessageId) {
        self.order.ack_settled(id);
    }

    /// Checks a successful ack, release or extend against the kill history.
    fn check_token_use(&mut self, used: &TokenUse, what: &str) {
        if let Some(issued) = used.token_instance {
            if used.sent_instance > issued {
                self.violations.stale_tokens_accepted += 1;
                self.violation(format!(
                    "stale token: {what} of {} (token from process {}, sent to process {}) \
                     succeeded",
                    hex(used.id),
                    issued.0,
                    used.sent_instance.0
                ));
            }
        }
    }

    /// The broker answered an ack with success.
    pub fn ack_acknowledged(&mut self, used: TokenUse) {
        self.check_token_use(&used, "ack");
        self.order.ack_settled(used.id);
        let answered = self.next_seq();
        self.ack_unknown.remove(&used.id);
        self.acked.entry(used.id).or_insert(AckRecord {
            generation: used.generation,
            answered,
            instance: Some(used.sent_instance),
        });
    }

    /// An ack got no answer (the broker died or the connection broke): it
    /// may or may not have been applied. Resolved by the next live check.
    pub fn ack_unknown(&mut self, id: MessageId, generation: Generation) {
        self.order.ack_settled(id);
        if !self.acked.contains_key(&id) {
            self.ack_unknown.insert(id, generation);
        }
    }

    /// The broker answered a release or extend with success.
    pub fn token_use_succeeded(&mut self, used: TokenUse, what: &str) {
        self.check_token_use(&used, what);
    }

    /// Acknowledged enqueues.
    pub fn enqueued_count(&self) -> usize {
        self.enqueued.len()
    }

    /// Distinct partitions holding an acknowledged enqueue.
    pub fn partitions_enqueued(&self) -> usize {
        self.enqueued.values().map(|placement| placement.partition).collect::<HashSet<_>>().len()
    }

    /// Acknowledged acks.
    pub fn acked_count(&self) -> usize {
        self.acked.len()
    }

    /// Compares the complete live contents of the queue (main lane and dead
    /// letters, every partition), taken while nothing else talks to the
    /// broker, with the ledger. Resolves unknown acks: a message still live
    /// was not acked; one gone was (or was lost, which nobody can tell
    /// apart; counted in [`Activity::ack_unknown_applied`]).
    pub fn live_check(&mut self, live: &BTreeMap<Placement, LiveEntry>) {
        self.activity.live_checks += 1;
        for (&placement, entry) in live {
            match entry.id {
                Some(id) => self.observe_placement(id, placement, "live listing"),
                None if !self.id_at.contains_key(&placement)
                    && self.first_report(MessageId([0; 16]), placement, "dead letter") =>
                {
                    self.violations.dead_letters_unaccounted += 1;
                    self.violation(format!("dead letter at {placement:?} names no enqueue"));
                }
                None => {}
            }
        }
        let unknown: Vec<(MessageId, Generation)> = self.ack_unknown.drain().collect();
        for (id, generation) in unknown {
            // Where the message lives: its enqueue answer, or (when the
            // producer never got one) the delivery its ack came from.
            let placement = self.enqueued.get(&id).or_else(|| self.placement_of.get(&id));
            let still_live = placement.is_some_and(|at| live.contains_key(at));
            if still_live {
                self.activity.ack_unknown_not_applied += 1;
            } else {
                self.activity.ack_unknown_applied += 1;
                let answered = self.next_seq();
                self.acked.entry(id).or_insert(AckRecord { generation, answered, instance: None });
            }
        }
        let mut lost = Vec::new();
        let mut acked_live = Vec::new();
        for (&id, &placement) in &self.enqueued {
            let is_live = live.contains_key(&placement);
            let is_acked = self.acked.contains_key(&id);
            if is_acked && is_live && !live[&placement].dead_letter {
                acked_live.push((id, placement));
            }
            if !is_acked && !is_live && !self.lost_ids.contains(&id) {
                lost.push((id, placement));
            }
        }
        for (id, placement) in acked_live {
            if !self.first_report(id, placement, "acked live") {
                continue;
            }
            self.violations.acked_but_live += 1;
            self.violation(format!("acked but live: {} at {placement:?}", hex(id)));
        }
        for (id, placement) in lost {
            self.lost_ids.insert(id);
            self.violations.lost += 1;
            self.violation(format!("lost: {} at {placement:?}", hex(id)));
        }
    }

    /// Final accounting after the drain acked everything live: every
    /// acknowledged enqueue must be acked or a dead letter. Ids already
    /// counted lost are not counted again.
    pub fn final_check(&mut self, dead_letters: &HashSet<Placement>) {
        let mut lost = Vec::new();
        for (&id, &placement) in &self.enqueued {
            if !self.acked.contains_key(&id)
                && !dead_letters.contains(&placement)
                && !self.lost_ids.contains(&id)
            {
                lost.push((id, placement));
            }
        }
        for (id, placement) in lost {
            self.lost_ids.insert(id);
            self.violations.lost += 1;
            self.violation(format!("lost at the end: {} at {placement:?}", hex(id)));
        }
    }

    /// Violation counts so far.
    pub fn violations(&self) -> Violations {
        self.violations
    }

    /// Activity counters so far.
    pub fn activity(&self) -> Activity {
        self.activity
    }

    /// Example descriptions of violations (at most [`VIOLATION_SAMPLES_MAX`]).
    pub fn samples(&self) -> &[String] {
        &self.samples
    }

    /// The placement an acknowledged enqueue or a delivery reported for `id`.
    pub fn placement(&self, id: MessageId) -> Option<Placement> {
        self.placement_of.get(&id).copied()
    }
}

/// A message id as hex, for reports.
pub fn hex(id: MessageId) -> String {
    id.0.iter().map(|byte| format!("{byte:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> MessageId {
        MessageId([n; 16])
    }

    fn at(partition: u32, offset: u64) -> Placement {
        Placement::new(PartitionId(partition), Offset(offset))
    }

    fn seen(ledger: &mut Ledger, n: u8, placement: Placement, generation: u64) -> DeliverySeen {
        DeliverySeen {
            id: id(n),
            placement,
            generation: Generation(generation),
            epoch: 1,
            claim_sent: ledger.next_seq(),
        }
    }

    fn token_use(n: u8, placement: Placement, issued: u64, sent: u64) -> TokenUse {
        TokenUse {
            id: id(n),
            placement,
            generation: Generation(1),
            token_instance: Some(Instance(issued)),
            sent_instance: Instance(sent),
        }
    }

    fn live_of(entries: &[(Placement, u8)]) -> BTreeMap<Placement, LiveEntry> {
        entries
            .iter()
            .map(|&(placement, n)| (placement, LiveEntry { id: Some(id(n)), dead_letter: false }))
            .collect()
    }

    // Goal: a clean history (enqueue, deliver, ack; another enqueue still
    // live) has no violations. Method: feed it, run both checks.
    #[test]
    fn clean_history_has_no_violations() {
        let mut ledger = Ledger::new();
        ledger.submit(id(1));
        ledger.submit(id(2));
        ledger.enqueue_acknowledged(id(1), at(0, 0), false);
        ledger.enqueue_acknowledged(id(2), at(0, 1), false);
        ledger.enqueue_acknowledged(id(2), at(0, 1), true);
        let delivery = seen(&mut ledger, 1, at(0, 0), 1);
        ledger.delivered(delivery);
        ledger.ack_acknowledged(token_use(1, at(0, 0), 1, 1));
        ledger.live_check(&live_of(&[(at(0, 1), 2)]));
        assert_eq!(ledger.violations(), Violations::default());
        assert_eq!(ledger.activity().duplicates_answered, 1);
    }

    // Goal: each check fires on the history it exists for. Method: one
    // hand-made violation per counter.
    #[test]
    fn each_violation_is_counted() {
        let mut ledger = Ledger::new();
        for n in 1..=6 {
            ledger.submit(id(n));
        }
        // Lost: acknowledged, not acked, not live.
        ledger.enqueue_acknowledged(id(1), at(0, 0), false);
        // Dedupe: a retry answered with another offset.
        ledger.enqueue_acknowledged(id(2), at(0, 1), false);
        ledger.enqueue_acknowledged(id(2), at(0, 7), true);
        // Offset reuse: another id at offset 1.
        ledger.enqueue_acknowledged(id(3), at(0, 1), false);
        // Redelivery after an acknowledged ack, by a later claim.
        ledger.enqueue_acknowledged(id(4), at(1, 0), false);
        let first = seen(&mut ledger, 4, at(1, 0), 1);
        ledger.delivered(first);
        ledger.ack_acknowledged(token_use(4, at(1, 0), 1, 1));
        let again = seen(&mut ledger, 4, at(1, 0), 2);
        ledger.delivered(again);
        // Generation reuse.
        ledger.enqueue_acknowledged(id(5), at(1, 1), false);
        let once = seen(&mut ledger, 5, at(1, 1), 3);
        ledger.delivered(once);
        let twice = seen(&mut ledger, 5, at(1, 1), 3);
        ledger.delivered(twice);
        // Not a reuse: the same generation again under a newer epoch (the
        // first claim was lost in a crash before its sync).
        let next_epoch = DeliverySeen { epoch: 2, ..seen(&mut ledger, 5, at(1, 1), 3) };
        ledger.delivered(next_epoch);
        // Stale token accepted: issued by process 1, used on process 2.
        ledger.token_use_succeeded(token_use(5, at(1, 1), 1, 2), "release");
        // Phantom: never submitted.
        let phantom = seen(&mut ledger, 9, at(2, 0), 1);
        ledger.delivered(phantom);
        // Acked but live; and a dead letter nobody enqueued.
        let mut live = live_of(&[(at(0, 1), 2), (at(1, 0), 4), (at(1, 1), 5)]);
        live.insert(at(3, 3), LiveEntry { id: None, dead_letter: true });
        ledger.live_check(&live);
        let violations = ledger.violations();
        assert_eq!(violations.lost, 1, "{:?}", ledger.samples());
        assert_eq!(violations.dedupe_conflicts, 1);
        assert_eq!(violations.offset_conflicts, 1);
        assert_eq!(violations.redelivered_after_ack, 1);
        assert_eq!(violations.generation_reused, 1);
        assert_eq!(violations.stale_tokens_accepted, 1);
        assert_eq!(violations.phantom_deliveries, 1);
        assert_eq!(violations.acked_but_live, 1);
        assert_eq!(violations.dead_letters_unaccounted, 1);
        assert_eq!(violations.total(), 9);
        // A check that sees the same state counts nothing again.
        ledger.live_check(&live);
        assert_eq!(ledger.violations(), violations);
        // After the drain, what was not acked is lost, counted once per id:
        // ids 2 and 5 (live, never acked) join id 1; id 3 shares id 2's
        // placement, so it is lost too.
        ledger.final_check(&HashSet::new());
        assert_eq!(ledger.violations().lost, 4);
        ledger.final_check(&HashSet::new());
        assert_eq!(ledger.violations().lost, 4);
    }

    // Goal: an ack with unknown outcome is resolved by the next live check:
    // live means not applied (and must be found later), gone means applied.
    // Method: two unknown acks, one still live; then the live one vanishes.
    #[test]
    fn unknown_acks_resolve_at_the_live_check() {
        let mut ledger = Ledger::new();
        ledger.submit(id(1));
        ledger.submit(id(2));
        ledger.enqueue_acknowledged(id(1), at(0, 0), false);
        ledger.enqueue_acknowledged(id(2), at(0, 1), false);
        ledger.ack_unknown(id(1), Generation(1));
        ledger.ack_unknown(id(2), Generation(1));
        ledger.live_check(&live_of(&[(at(0, 1), 2)]));
        assert_eq!(ledger.activity().ack_unknown_applied, 1);
        assert_eq!(ledger.activity().ack_unknown_not_applied, 1);
        assert_eq!(ledger.violations(), Violations::default());
        ledger.live_check(&live_of(&[]));
        assert_eq!(ledger.violations().lost, 1, "id 2 was not acked and is gone");
    }

    // Goal: an unknown ack of a message whose enqueue answer never arrived
    // (the producer was killed after the record was durable and delivered)
    // is resolved by where the delivery showed the message, not taken as
    // applied because no enqueue answer names its placement; a later
    // delivery of the still-live message is not a redelivery after an ack.
    // Method: deliver id 1 at (0, 4) with no enqueue answer, ack unknown,
    // live check with (0, 4) live, deliver it again in the next epoch.
    #[test]
    fn an_unknown_ack_of_a_message_known_only_by_its_delivery_resolves_by_that_placement() {
        let mut ledger = Ledger::new();
        ledger.submit(id(1));
        let first = seen(&mut ledger, 1, at(0, 4), 1);
        ledger.delivered(first);
        ledger.ack_unknown(id(1), Generation(1));
        ledger.live_check(&live_of(&[(at(0, 4), 1)]));
        assert_eq!(ledger.activity().ack_unknown_not_applied, 1);
        assert_eq!(ledger.activity().ack_unknown_applied, 0);
        let again = DeliverySeen { epoch: 2, ..seen(&mut ledger, 1, at(0, 4), 1) };
        ledger.delivered(again);
        assert_eq!(ledger.violations(), Violations::default(), "{:?}", ledger.samples());
    }

    // Goal: the key-order counters fire on the histories they exist for and
    // stay 0 on a clean ordered history, unknown and in-flight acks
    // included. Method: key 7's messages at offsets 0, 1, 2, 3 of one
    // partition. Clean: 0 delivered twice (a release), acked, then 1
    // delivered, its ack in flight when 2 is delivered (the broker hands
    // the lane on before the ack's answer), the ack answered. Then 3 is
    // delivered while 2 is held with no ack sent (an overlap). Key 8: 4's
    // ack has unknown outcome (the broker died with it in flight), 5 is
    // delivered (fine: 4 may be finished), then 4 again (the ack was lost:
    // the key went back, a regression). An unkeyed message is not checked.
    #[test]
    fn key_order_violations_are_counted() {
        let mut ledger = Ledger::new();
        for n in 0..4 {
            ledger.submit_keyed(id(n), 7);
        }
        ledger.submit(id(9));
        ledger.submit(id(10));
        let first = seen(&mut ledger, 0, at(0, 0), 1);
        ledger.delivered(first);
        let again = seen(&mut ledger, 0, at(0, 0), 2);
        ledger.delivered(again);
        ledger.ack_sent(id(0));
        ledger.ack_acknowledged(token_use(0, at(0, 0), 1, 1));
        let next = seen(&mut ledger, 1, at(0, 1), 1);
        ledger.delivered(next);
        ledger.ack_sent(id(1));
        let handed = seen(&mut ledger, 2, at(0, 2), 1);
        ledger.delivered(handed);
        ledger.ack_acknowledged(token_use(1, at(0, 1), 1, 1));
        for (n, offset) in [(9, 5), (10, 3)] {
            let unkeyed = seen(&mut ledger, n, at(2, offset), 1);
            ledger.delivered(unkeyed);
        }
        assert_eq!(ledger.violations(), Violations::default(), "{:?}", ledger.samples());
        assert_eq!(ledger.activity().key_handovers, 2);
        let overlap = seen(&mut ledger, 3, at(0, 3), 1);
        ledger.delivered(overlap);
        ledger.submit_keyed(id(4), 8);
        ledger.submit_keyed(id(5), 8);
        let maybe = seen(&mut ledger, 4, at(1, 0), 1);
        ledger.delivered(maybe);
        ledger.ack_sent(id(4));
        ledger.ack_unknown(id(4), Generation(1));
        let later = seen(&mut ledger, 5, at(1, 1), 1);
        ledger.delivered(later);
        let back = DeliverySeen { epoch: 2, ..seen(&mut ledger, 4, at(1, 0), 1) };
        ledger.delivered(back);
        let violations = ledger.violations();
        assert_eq!(violations.key_overlaps, 1, "{:?}", ledger.samples());
        assert_eq!(violations.key_order_regressions, 1, "{:?}", ledger.samples());
        assert_eq!(violations.total(), 2);
        assert!(ledger.samples()[1].contains("on an ack not confirmed"), "{:?}", ledger.samples());
    }

    // Goal: a token used on the process that issued it is fine; a delivery
    // whose claim was sent before the ack answer with the same generation is
    // not a redelivery (the answers crossed). Method: feed both.
    #[test]
    fn same_process_tokens_and_crossing_answers_are_not_violations() {
        let mut ledger = Ledger::new();
        ledger.submit(id(1));
        ledger.enqueue_acknowledged(id(1), at(0, 0), false);
        let delivery = seen(&mut ledger, 1, at(0, 0), 1);
        ledger.ack_acknowledged(token_use(1, at(0, 0), 2, 2));
        ledger.delivered(delivery);
        assert_eq!(ledger.violations(), Violations::default());
    }
}
