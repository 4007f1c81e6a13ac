//! `Delivery`: one subscription's delivery state over the partition's
//! stored records (`docs/design/subscriptions.md`, §2 and §7). Everything
//! a worker's claims change lives here: the warm map (claimed, scheduled
//! and retried messages) and its indexes, the leases, the dead letters,
//! the fairness credits and the counters. The log side (the shared
//! never-claimed index `fresh`, dedupe, enqueue facts, stored counts, the
//! key map and members) stays in `PartitionState`, once per partition.
//!
//! `PartitionState::subs` holds one per subscription, the default first;
//! the methods of `apply.rs` and `decide/` take the index of the one they
//! act for. The never-claimed backlog is shared (`shared.rs`): a
//! subscription keeps only its cursors and skipped marks over it.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::view::Totals;
use super::window::Loss;
use super::{DeadLetter, Warm};
use crate::queue::chunk_map::ChunkMap;
use crate::queue::claim_age::ClaimAges;
use crate::queue::fairness::Credits;
use crate::queue::lanes::Lanes;
use crate::queue::types::{Millis, Offset, SubscriptionId};

/// One subscription's delivery state (see the module docs).
#[derive(Debug)]
pub(crate) struct Delivery {
    pub(crate) id: SubscriptionId,
    /// Per band: no entry of the shared index below it is this
    /// subscription's to deliver (`shared.rs`).
    pub(crate) cursors: Vec<Offset>,
    /// Per band: entries of the shared index at or above the cursor this
    /// subscription took out while another still has them fresh.
    pub(crate) skipped: Vec<BTreeSet<Offset>>,
    /// Per band: how many shared entries are fresh for this subscription,
    /// and their record bytes.
    pub(crate) fresh_len: Vec<u64>,
    pub(crate) fresh_bytes: Vec<u64>,
    pub(crate) warm: ChunkMap<Warm>,
    /// Warm ready messages with no failed attempt, per band: (since, offset).
    pub(crate) band_ready: Vec<BTreeSet<(Millis, Offset)>>,
    /// Warm ready messages with at least one failed attempt: (since, offset).
    pub(crate) retry: BTreeSet<(Millis, Offset)>,
    /// Scheduled messages by min(due, expiry): when tick must look at them.
    pub(crate) scheduled: BTreeSet<(Millis, Offset)>,
    /// Warm ready messages that expire: (expiry, offset). Scheduled ones are
    /// due at min(not_before, expiry) in `scheduled`; claimed ones are looked
    /// at when their lease ends.
    pub(crate) warm_expiry: BTreeSet<(Millis, Offset)>,
    pub(crate) warm_bytes: u64,
    /// Live leases of both lanes: (deadline, offset).
    pub(crate) claims: BTreeSet<(Millis, Offset)>,
    /// The same leases by claim time (`claim_age.rs`): the oldest claim
    /// still held, without a scan. Kept beside `claims` by
    /// `insert_warm`/`take_main`/`insert_dead`/`take_dead`.
    pub(crate) claim_ages: ClaimAges,
    pub(crate) dlq: BTreeMap<Offset, DeadLetter>,
    pub(crate) dlq_ready: BTreeSet<(Millis, Offset)>,
    /// Record bytes of every dead letter, kept beside `dlq` by
    /// `insert_dead`/`take_dead` (restore goes through them too) so that
    /// admission reads it without a scan.
    pub(crate) dlq_bytes: u64,
    /// Weighted round-robin over the bands and the retry lane.
    pub(crate) credits: Credits,
    pub(crate) totals: Totals,
    /// What retention windows dropped before this subscription delivered
    /// it, the newest `LOSS_REPORTS_MAX` reports (`window.rs`).
    pub(crate) losses: VecDeque<Loss>,
    /// An ordered subscription's lanes (`ordered.rs`); `None`: unordered.
    pub(crate) lanes: Option<Lanes>,
}

impl Delivery {
    /// An empty delivery state of subscription `id` starting at `from`,
    /// for `bands` priority bands, with class weights `weights` (the
    /// bands', then the retry lane's).
    pub(crate) fn new(id: SubscriptionId, from: Offset, bands: usize, weights: &[u32]) -> Self {
        Self {
            id,
            cursors: vec![from; bands],
            skipped: vec![BTreeSet::new(); bands],
            fresh_len: vec![0; bands],
            fresh_bytes: vec![0; bands],
            warm: ChunkMap::default(),
            band_ready: vec![BTreeSet::new(); bands],
            retry: BTreeSet::new(),
            scheduled: BTreeSet::new(),
            warm_expiry: BTreeSet::new(),
            warm_bytes: 0,
            claims: BTreeSet::new(),
            claim_ages: ClaimAges::default(),
            dlq: BTreeMap::new(),
            dlq_ready: BTreeSet::new(),
            dlq_bytes: 0,
            credits: Credits::new(weights),
            totals: Totals::default(),
            losses: VecDeque::new(),
            lanes: None,
        }
    }

    /// The same, ordered by routing key when `ordered` (`ordered.rs`).
    #[must_use]
    pub(crate) fn ordered(mut self, ordered: bool) -> Self {
        self.lanes = ordered.then(Lanes::default);
        self
    }
}
