//! Quotas per principal: what the auth file allows a principal to use, and
//! the pure bookkeeping that enforces it on one shard.
//!
//! A principal's `quota` table in the auth file (`docs/operations.md`,
//! "Quotas") names node-wide figures — `enqueue_messages_per_sec`,
//! `enqueue_bytes_per_sec`, `claims_in_flight_max`, `stored_messages_max`,
//! `stored_bytes_max` — each optional (absent = unlimited). The broker is thread-per-core and no request crosses cores,
//! so each shard enforces an equal **share** of each figure on its own
//! ([`QuotaConfig::share`]): a rate `r` becomes `r / shards` per second per
//! shard with a burst of one share-second ([`Bucket`]), and
//! `claims_in_flight_max` becomes `⌈max / shards⌉` claims per shard
//! ([`ClaimTable`]), and a stored quota is split exactly: shard `i` of `n`
//! gets `max / n`, plus one for the first `max % n` shards
//! ([`QuotaConfig::stored_share`]), so the shares add up to `max` and the
//! node never holds more than `max` for the principal. A principal whose partitions all sit on one shard gets
//! that shard's share, not the whole figure.
//!
//! This module is pure: no clock (time is an argument, milliseconds of the
//! broker's clock), no I/O, no glommio. The shard side is
//! `server::quota`.

use std::collections::{BTreeSet, HashMap};

use serde::Deserialize;

pub use crate::limits::{
    QUOTA_BYTES_PER_SEC_MAX, QUOTA_CLAIMS_IN_FLIGHT_MAX, QUOTA_CLAIM_RETRY_MS,
    QUOTA_MESSAGES_PER_SEC_MAX, QUOTA_STORED_BYTES_MAX, QUOTA_STORED_MESSAGES_MAX,
};

/// Which quota a figure, a refusal or a gauge is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QuotaKind {
    EnqueueMessagesPerSec,
    EnqueueBytesPerSec,
    ClaimsInFlightMax,
    StoredMessagesMax,
    StoredBytesMax,
}

impl QuotaKind {
    /// Every kind, in the order of [`QuotaKind::index`].
    pub const ALL: [QuotaKind; 5] = [
        QuotaKind::EnqueueMessagesPerSec,
        QuotaKind::EnqueueBytesPerSec,
        QuotaKind::ClaimsInFlightMax,
        QuotaKind::StoredMessagesMax,
        QuotaKind::StoredBytesMax,
    ];

    /// Position in [`QuotaKind::ALL`].
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The name used in the auth file, error messages and metric labels.
    pub const fn as_str(self) -> &'static str {
        match self {
            QuotaKind::EnqueueMessagesPerSec => "enqueue_messages_per_sec",
            QuotaKind::EnqueueBytesPerSec => "enqueue_bytes_per_sec",
            QuotaKind::ClaimsInFlightMax => "claims_in_flight_max",
            QuotaKind::StoredMessagesMax => "stored_messages_max",
            QuotaKind::StoredBytesMax => "stored_bytes_max",
        }
    }
}

/// A principal's quotas as the auth file states them: node-wide figures,
/// each `None` when unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuotaConfig {
    /// Messages enqueued per second (records of accepted-for-charge batches).
    pub enqueue_messages_per_sec: Option<u64>,
    /// Bytes of record batches enqueued per second.
    pub enqueue_bytes_per_sec: Option<u64>,
    /// Deliveries under a live lease at once.
    pub claims_in_flight_max: Option<u64>,
    /// Messages the principal enqueued that the node still holds (until
    /// acked, expired without dead-lettering, or purged).
    pub stored_messages_max: Option<u64>,
    /// Record bytes of those messages.
    pub stored_bytes_max: Option<u64>,
}

impl QuotaConfig {
    /// Whether no quota is set.
    pub fn is_unlimited(&self) -> bool {
        QuotaKind::ALL.iter().all(|kind| self.get(*kind).is_none())
    }

    /// Whether a stored quota is set.
    pub fn limits_stored(&self) -> bool {
        self.stored_messages_max.is_some() || self.stored_bytes_max.is_some()
    }

    /// Whether an enqueue rate is set.
    pub fn limits_enqueue(&self) -> bool {
        self.enqueue_messages_per_sec.is_some() || self.enqueue_bytes_per_sec.is_some()
    }

    /// The node-wide figure of `kind`, if set.
    pub fn get(&self, kind: QuotaKind) -> Option<u64> {
        match kind {
            QuotaKind::EnqueueMessagesPerSec => self.enqueue_messages_per_sec,
            QuotaKind::EnqueueBytesPerSec => self.enqueue_bytes_per_sec,
            QuotaKind::ClaimsInFlightMax => self.claims_in_flight_max,
            QuotaKind::StoredMessagesMax => self.stored_messages_max,
            QuotaKind::StoredBytesMax => self.stored_bytes_max,
        }
    }

    /// Checks every figure against its bound: at least 1 (a quota of 0
    /// would refuse everything; leave the right out of the ACL instead)
    /// and at most the named maximum.
    ///
    /// # Errors
    /// The first figure out of range, named.
    pub fn validate(&self) -> Result<(), String> {
        for kind in QuotaKind::ALL {
            let Some(value) = self.get(kind) else { continue };
            let max = match kind {
                QuotaKind::EnqueueMessagesPerSec => QUOTA_MESSAGES_PER_SEC_MAX,
                QuotaKind::EnqueueBytesPerSec => QUOTA_BYTES_PER_SEC_MAX,
                QuotaKind::ClaimsInFlightMax => QUOTA_CLAIMS_IN_FLIGHT_MAX,
                QuotaKind::StoredMessagesMax => QUOTA_STORED_MESSAGES_MAX,
                QuotaKind::StoredBytesMax => QUOTA_STORED_BYTES_MAX,
            };
            if !(1..=max).contains(&value) {
                return Err(format!("quota {} = {value} outside 1..={max}", kind.as_str()));
            }
        }
        Ok(())
    }

    /// Shard `shard`'s share of the stored quota `kind` (of
    /// `stored_messages_max` or `stored_bytes_max`; `None` for another kind
    /// or when unset): `max / shards`, plus one on the first `max % shards`
    /// shards. The shares of all shards add up to exactly `max`, so the
    /// node-wide figure is never exceeded; a shard may get 0 when `max` is
    /// below the shard count.
    pub fn stored_share(&self, kind: QuotaKind, shard: u16, shards: u16) -> Option<u64> {
        let max = match kind {
            QuotaKind::StoredMessagesMax => self.stored_messages_max?,
            QuotaKind::StoredBytesMax => self.stored_bytes_max?,
            _ => return None,
        };
        let shards = u64::from(shards.max(1));
        let extra = u64::from(u64::from(shard) < max % shards);
        Some(max / shards + extra)
    }

    /// One shard's share of `claims_in_flight_max`: `⌈max / shards⌉`.
    pub fn claims_share(&self, shards: u16) -> Option<u64> {
        let shards = u64::from(shards.max(1));
        self.claims_in_flight_max.map(|max| max.div_ceil(shards))
    }
}

/// A token bucket for one shard's share of a node-wide rate.
///
/// With `rate` units per second over `shards` shards, the shard refills
/// `rate / shards` units a second up to a burst of one share-second
/// (`rate / shards` units). Amounts are kept exactly, as integers in
/// `1 / (1000 · shards)` of a unit, so a refill of one millisecond adds
/// exactly `rate` of them.
///
/// A charge is admitted when the bucket holds at least the charge, or is
/// full when the charge is larger than the whole burst (so a batch larger
/// than one share-second can still pass, then leaves the bucket in debt for
/// as long as it would have taken to earn). Over any interval of `t` ms a
/// bucket admits at most one burst plus `rate · t / (1000 · shards)` units,
/// plus the one charge that may overdraw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucket {
    rate: u64,
    shards: u64,
    /// Current content (negative: in debt), in scaled units.
    level: i128,
    /// When `level` was last brought up to date.
    updated_ms: u64,
}

/// Why a charge was refused: how long until it would be admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    pub retry_after_ms: u64,
}

impl Bucket {
    /// A full bucket for `rate` units per second node-wide, split over
    /// `shards`.
    pub fn new(rate: u64, shards: u16, now_ms: u64) -> Bucket {
        let shards = u64::from(shards.max(1));
        let mut bucket = Bucket { rate, shards, level: 0, updated_ms: now_ms };
        bucket.level = bucket.capacity();
        bucket
    }

    /// The node-wide rate it was made for.
    pub fn rate(&self) -> u64 {
        self.rate
    }

    /// The burst, in scaled units: one share-second.
    fn capacity(&self) -> i128 {
        i128::from(self.rate) * 1000
    }

    fn scaled(&self, units: u64) -> i128 {
        i128::from(units) * i128::from(self.shards) * 1000
    }

    /// Refills for the time since the last update (a clock that went back
    /// refills nothing).
    fn refill(&mut self, now_ms: u64) {
        let elapsed = now_ms.saturating_sub(self.updated_ms);
        if elapsed > 0 {
            let added = i128::from(self.rate) * i128::from(elapsed);
            self.level = (self.level + added).min(self.capacity());
            self.updated_ms = now_ms;
        }
    }

    /// The scaled amount that must be present to admit `units`.
    fn needed(&self, units: u64) -> i128 {
        self.scaled(units).min(self.capacity())
    }

    /// Whether `units` would be admitted at `now_ms`, without charging;
    /// when not, how long until it would be.
    ///
    /// # Errors
    /// [`Refused`] with the wait.
    pub fn check(&mut self, units: u64, now_ms: u64) -> Result<(), Refused> {
        self.refill(now_ms);
        let needed = self.needed(units);
        if self.level >= needed {
            return Ok(());
        }
        let missing = needed - self.level;
        let rate = i128::from(self.rate.max(1));
        let wait = (missing + rate - 1) / rate;
        Err(Refused { retry_after_ms: u64::try_from(wait).unwrap_or(u64::MAX).max(1) })
    }

    /// Takes `units` out (after a successful [`Bucket::check`] at the same
    /// `now_ms`).
    pub fn charge(&mut self, units: u64, now_ms: u64) {
        self.refill(now_ms);
        self.level -= self.scaled(units);
    }

    /// How much of the burst is used at `now_ms`, in units of this shard
    /// rounded up (0 only when full; more than the share while in debt).
    pub fn used(&mut self, now_ms: u64) -> u64 {
        self.refill(now_ms);
        let unit = i128::from(self.shards * 1000);
        let used = (self.capacity() - self.level + unit - 1) / unit;
        u64::try_from(used.max(0)).unwrap_or(u64::MAX)
    }
}

/// The identity of one delivery: its token's bytes (queue, partition,
/// offset, generation, epoch, worker and MAC), unique per claim.
pub type DeliveryKey = [u8; crate::queue::DELIVERY_TOKEN_BYTES];

/// One principal's claims in flight on a shard.
#[derive(Debug, Default)]
struct Holder {
    by_token: HashMap<DeliveryKey, u64>,
    by_deadline: BTreeSet<(u64, DeliveryKey)>,
    /// Credits granted to claims still being served (long-polls).
    reserved: u64,
}

impl Holder {
    fn expire(&mut self, now_ms: u64, owners: &mut HashMap<DeliveryKey, String>) {
        while let Some(&(deadline, key)) = self.by_deadline.first() {
            if deadline > now_ms {
                break;
            }
            self.by_deadline.pop_first();
            self.by_token.remove(&key);
            owners.remove(&key);
        }
    }

    fn live(&self) -> u64 {
        self.by_token.len() as u64
    }
}

/// The claims in flight of the principals that have a
/// `claims_in_flight_max`, on one shard: delivery → (principal, lease
/// deadline).
///
/// A claim first [reserves](ClaimTable::reserve) credits — clamped to what
/// the principal's share leaves — and, when it returns, [settles]
/// (ClaimTable::settle) them: the reservation goes and each delivery is
/// recorded. Ack and release [remove](ClaimTable::remove) a delivery,
/// extend [moves its deadline](ClaimTable::extend); a delivery whose
/// deadline has passed stops counting at once (it is dropped when next
/// seen, and by [`ClaimTable::expire`] on the housekeeping tick).
///
/// Bound: a principal's deliveries plus reservations never pass its share
/// (reservations are clamped to it and a settle records at most what was
/// reserved), so the table holds at most the sum of the shares of the
/// principals with this quota.
#[derive(Debug, Default)]
pub struct ClaimTable {
    holders: HashMap<String, Holder>,
    owners: HashMap<DeliveryKey, String>,
}

impl ClaimTable {
    /// Claims of `principal` counted at `now_ms`: live deliveries and
    /// reservations.
    pub fn in_use(&mut self, principal: &str, now_ms: u64) -> u64 {
        let Some(holder) = self.holders.get_mut(principal) else { return 0 };
        holder.expire(now_ms, &mut self.owners);
        holder.live() + holder.reserved
    }

    /// Grants up to `credits` of `share` to a claim of `principal`.
    ///
    /// # Errors
    /// [`Refused`] when nothing is left, with a hint: the earliest lease
    /// deadline of its deliveries (an ack may free one sooner), or
    /// [`QUOTA_CLAIM_RETRY_MS`] when only other claims' reservations hold
    /// the share.
    pub fn reserve(
        &mut self,
        principal: &str,
        share: u64,
        credits: u64,
        now_ms: u64,
    ) -> Result<u64, Refused> {
        let holder = self.holders.entry(principal.to_owned()).or_default();
        holder.expire(now_ms, &mut self.owners);
        let used = holder.live() + holder.reserved;
        let left = share.saturating_sub(used);
        if left == 0 || credits == 0 {
            let retry_after_ms = holder
                .by_deadline
                .first()
                .map_or(QUOTA_CLAIM_RETRY_MS, |(deadline, _)| deadline.saturating_sub(now_ms))
                .max(1);
            if holder.live() == 0 && holder.reserved == 0 {
                self.holders.remove(principal);
            }
            return Err(Refused { retry_after_ms });
        }
        let granted = credits.min(left);
        holder.reserved += granted;
        Ok(granted)
    }

    /// Ends a reservation of `granted` credits and records `deliveries`
    /// (key, lease deadline); at most `granted` of them are recorded.
    pub fn settle(
        &mut self,
        principal: &str,
        granted: u64,
        deliveries: impl IntoIterator<Item = (DeliveryKey, u64)>,
    ) {
        let Some(holder) = self.holders.get_mut(principal) else { return };
        holder.reserved = holder.reserved.saturating_sub(granted);
        for (key, deadline) in deliveries.into_iter().take(granted as usize) {
            if let Some(previous) = holder.by_token.insert(key, deadline) {
                holder.by_deadline.remove(&(previous, key));
            }
            holder.by_deadline.insert((deadline, key));
            self.owners.insert(key, principal.to_owned());
        }
        if holder.live() == 0 && holder.reserved == 0 {
            self.holders.remove(principal);
        }
    }

    /// Forgets a delivery (acked, released, or its token went stale).
    pub fn remove(&mut self, key: &DeliveryKey) {
        let Some(principal) = self.owners.remove(key) else { return };
        let Some(holder) = self.holders.get_mut(&principal) else { return };
        if let Some(deadline) = holder.by_token.remove(key) {
            holder.by_deadline.remove(&(deadline, *key));
        }
        if holder.live() == 0 && holder.reserved == 0 {
            self.holders.remove(&principal);
        }
    }

    /// Moves a delivery's lease deadline (an extend).
    pub fn extend(&mut self, key: &DeliveryKey, deadline_ms: u64) {
        let Some(principal) = self.owners.get(key) else { return };
        let Some(holder) = self.holders.get_mut(principal) else { return };
        if let Some(previous) = holder.by_token.insert(*key, deadline_ms) {
            holder.by_deadline.remove(&(previous, *key));
        }
        holder.by_deadline.insert((deadline_ms, *key));
    }

    /// Drops every delivery whose deadline is at or before `now_ms`.
    pub fn expire(&mut self, now_ms: u64) {
        let owners = &mut self.owners;
        for holder in self.holders.values_mut() {
            holder.expire(now_ms, owners);
        }
        self.holders.retain(|_, holder| holder.live() > 0 || holder.reserved > 0);
    }

    /// Deliveries recorded (live or not yet dropped), over all principals.
    pub fn len(&self) -> usize {
        self.owners.len()
    }

    /// Whether nothing is recorded or reserved.
    pub fn is_empty(&self) -> bool {
        self.holders.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(n: u8) -> DeliveryKey {
        let mut key = [0u8; crate::queue::DELIVERY_TOKEN_BYTES];
        key[0] = n;
        key
    }

    // Goal: shares are what the docs say: rate / shards with one
    // share-second of burst, claims ⌈max / shards⌉.
    #[test]
    fn shares_split_the_node_figures() {
        let config = QuotaConfig { claims_in_flight_max: Some(5), ..QuotaConfig::default() };
        assert_eq!(config.claims_share(2), Some(3));
        assert_eq!(config.claims_share(1), Some(5));
        assert_eq!(config.claims_share(0), Some(5));
        // 10 messages/s over 2 shards: a burst of 5, then 5 a second.
        let mut bucket = Bucket::new(10, 2, 1_000);
        for _ in 0..5 {
            bucket.check(1, 1_000).unwrap();
            bucket.charge(1, 1_000);
        }
        let refused = bucket.check(1, 1_000).unwrap_err();
        assert_eq!(refused.retry_after_ms, 200, "one message every 200 ms");
        assert!(bucket.check(1, 1_199).is_err());
        assert!(bucket.check(1, 1_200).is_ok());
        assert_eq!(bucket.used(1_200), 4);
        // Used is rounded up: a bucket one scaled unit short of full is not
        // taken for a full one (the tick drops only full buckets).
        assert_eq!(bucket.used(1_999), 1);
        assert_eq!(bucket.used(2_000), 0);
    }

    // Goal: the stored quotas are split exactly: the shares of all shards
    // add up to the node-wide figure (no overshoot), differ by at most one,
    // and only the stored kinds have one. Method: every figure 0..40 over
    // 1..=8 shards.
    #[test]
    fn stored_shares_add_up_to_the_figure() {
        for max in 1..40u64 {
            for shards in 1..=8u16 {
                let config = QuotaConfig {
                    stored_messages_max: Some(max),
                    stored_bytes_max: Some(max * 1_000),
                    ..QuotaConfig::default()
                };
                for (kind, figure) in
                    [(QuotaKind::StoredMessagesMax, max), (QuotaKind::StoredBytesMax, max * 1_000)]
                {
                    let shares: Vec<u64> = (0..shards)
                        .map(|shard| config.stored_share(kind, shard, shards).unwrap())
                        .collect();
                    assert_eq!(shares.iter().sum::<u64>(), figure, "{max} over {shards}");
                    let (low, high) = (shares.iter().min(), shares.iter().max());
                    assert!(high.unwrap() - low.unwrap() <= 1);
                }
                assert_eq!(config.stored_share(QuotaKind::ClaimsInFlightMax, 0, shards), None);
            }
        }
        assert_eq!(QuotaConfig::default().stored_share(QuotaKind::StoredMessagesMax, 0, 1), None);
        let config = QuotaConfig { stored_messages_max: Some(1), ..QuotaConfig::default() };
        assert!(config.limits_stored() && !config.is_unlimited());
        assert!(config.validate().is_ok());
        let zero = QuotaConfig { stored_bytes_max: Some(0), ..QuotaConfig::default() };
        assert!(zero.validate().unwrap_err().contains("stored_bytes_max"));
    }

    // Goal: a charge larger than the whole burst passes on a full bucket
    // and leaves it in debt for as long as it would have taken to earn.
    #[test]
    fn an_oversized_charge_passes_once_then_waits() {
        let mut bucket = Bucket::new(100, 1, 0);
        bucket.check(250, 0).unwrap();
        bucket.charge(250, 0);
        let refused = bucket.check(1, 0).unwrap_err();
        assert_eq!(refused.retry_after_ms, 1_510, "150 of debt and one unit at 100/s");
        assert!(bucket.check(1, 1_509).is_err());
        assert!(bucket.check(1, 1_510).is_ok());
    }

    #[test]
    fn validation_names_the_figure() {
        let zero = QuotaConfig { enqueue_bytes_per_sec: Some(0), ..QuotaConfig::default() };
        assert!(zero.validate().unwrap_err().contains("enqueue_bytes_per_sec"));
        let huge = QuotaConfig {
            claims_in_flight_max: Some(QUOTA_CLAIMS_IN_FLIGHT_MAX + 1),
            ..QuotaConfig::default()
        };
        assert!(huge.validate().unwrap_err().contains("claims_in_flight_max"));
        assert!(QuotaConfig::default().validate().is_ok());
        assert!(QuotaConfig::default().is_unlimited());
    }

    // Goal: a reservation is clamped to what is left; acking frees the
    // allowance; an expired lease stops counting without any call.
    #[test]
    fn claims_are_clamped_freed_by_ack_and_by_expiry() {
        let mut table = ClaimTable::default();
        assert_eq!(table.reserve("w", 3, 10, 0), Ok(3));
        table.settle("w", 3, [(key(1), 1_000), (key(2), 5_000)]);
        assert_eq!(table.in_use("w", 0), 2);
        assert_eq!(table.reserve("w", 3, 10, 0), Ok(1));
        table.settle("w", 1, [(key(3), 9_000)]);
        assert_eq!(
            table.reserve("w", 3, 1, 10),
            Err(Refused { retry_after_ms: 990 }),
            "the hint is the earliest lease deadline"
        );
        table.remove(&key(2));
        assert_eq!(table.in_use("w", 10), 2);
        assert_eq!(table.in_use("w", 1_000), 1, "key 1's lease ran out");
        table.extend(&key(3), 20_000);
        assert_eq!(table.in_use("w", 10_000), 1, "extended past 9 000");
        table.expire(20_000);
        assert!(table.is_empty());
        assert_eq!(table.len(), 0);
        assert_eq!(table.in_use("other", 0), 0);
    }

    // Goal: with only reservations holding the share, the hint is the
    // named default.
    #[test]
    fn reservations_alone_give_the_default_hint() {
        let mut table = ClaimTable::default();
        assert_eq!(table.reserve("w", 2, 2, 0), Ok(2));
        assert_eq!(
            table.reserve("w", 2, 1, 0),
            Err(Refused { retry_after_ms: QUOTA_CLAIM_RETRY_MS })
        );
        table.settle("w", 2, []);
        assert!(table.is_empty());
    }

    proptest! {
        // Goal: a bucket never admits more than one burst plus what its
        // rate earns over the interval, plus the one charge that may
        // overdraw it; and a refusal's hint is exact: admitted at
        // now + hint, not one ms before.
        // Method: random rates, shards and charge sequences at random times.
        #[test]
        fn bucket_admits_at_most_its_rate(
            rate in 1u64..5_000,
            shards in 1u16..8,
            steps in proptest::collection::vec((0u64..400, 1u64..50), 1..200),
        ) {
            let mut bucket = Bucket::new(rate, shards, 0);
            let mut now = 0u64;
            let mut admitted: u128 = 0;
            let mut largest: u128 = 0;
            for (advance, units) in steps {
                now += advance;
                match bucket.check(units, now) {
                    Ok(()) => {
                        bucket.charge(units, now);
                        admitted += u128::from(units);
                        largest = largest.max(u128::from(units));
                    }
                    Err(refused) => {
                        let mut probe = bucket.clone();
                        prop_assert!(refused.retry_after_ms >= 1);
                        if refused.retry_after_ms > 1 {
                            prop_assert!(
                                probe.check(units, now + refused.retry_after_ms - 1).is_err()
                            );
                        }
                        prop_assert!(probe.check(units, now + refused.retry_after_ms).is_ok());
                    }
                }
                // admitted * shards * 1000 <= rate*1000 (burst) + rate*now + overdraw
                let budget = u128::from(rate) * 1000
                    + u128::from(rate) * u128::from(now)
                    + largest * u128::from(shards) * 1000;
                prop_assert!(admitted * u128::from(shards) * 1000 <= budget);
            }
        }

        // Goal: the claim table never lets a principal hold more than its
        // share (deliveries plus reservations), whatever order claims,
        // acks, extends and expiry come in, and agrees with a naive model.
        #[test]
        fn claim_table_never_passes_the_share(
            share in 1u64..6,
            ops in proptest::collection::vec((0u8..4, 0u8..16, 0u64..50, 1u64..5), 1..300),
        ) {
            let mut table = ClaimTable::default();
            // The model: key -> deadline.
            let mut model: std::collections::BTreeMap<u8, u64> = Default::default();
            let mut now = 0u64;
            let mut next_key = 0u8;
            for (op, which, advance, credits) in ops {
                now += advance;
                model.retain(|_, deadline| *deadline > now);
                match op {
                    0 => {
                        let live = model.len() as u64;
                        match table.reserve("p", share, credits, now) {
                            Ok(granted) => {
                                prop_assert_eq!(granted, credits.min(share - live));
                                let deliveries: Vec<(DeliveryKey, u64)> = (0..granted)
                                    .map(|_| {
                                        next_key = next_key.wrapping_add(1);
                                        model.insert(next_key, now + 100);
                                        (key(next_key), now + 100)
                                    })
                                    .collect();
                                table.settle("p", granted, deliveries);
                            }
                            Err(_) => prop_assert_eq!(live, share),
                        }
                    }
                    1 => {
                        table.remove(&key(which));
                        model.remove(&which);
                    }
                    2 => {
                        if let Some(deadline) = model.get_mut(&which) {
                            *deadline = now + 200;
                            table.extend(&key(which), now + 200);
                        }
                    }
                    _ => table.expire(now),
                }
                prop_assert!(table.in_use("p", now) <= share);
                prop_assert_eq!(table.in_use("p", now), model.len() as u64);
            }
        }
    }
}
