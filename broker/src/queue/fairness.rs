//! Which class serves the next claim: weighted round-robin with age promotion.
//!
//! Classes are the priority bands (index 0 = highest) plus one retry class
//! (messages ready again after a failed claim) with its own weight, so retries
//! draw from their own budget. A round gives every class `weight` credits; a
//! claim is served by the highest-priority class that has credits and a ready
//! message; when no class with a ready message has credits left a new round
//! starts. Age promotion overrides the weights: when some class head has been
//! ready for `age_promotion_ms`, the oldest such head is served first, without
//! starting a round. Either way the serving class pays one credit if it has
//! one.
//!
//! The credits are state, so both the claim decision (on a copy) and `apply`
//! of a `Claimed` event run the same step, `serve`, and it reads only the
//! credits and the claimed message: a new round starts exactly when a claim
//! chosen by the weights (not promoted) comes from a class with no credit
//! left, which the decision does only when no class with a durable ready
//! message has any. Replay therefore reproduces the credits exactly, in
//! run-time order and in the shard journal's order alike (where a claim may
//! be replayed before records that were not yet durable when it was decided;
//! `docs/design/shard-journal.md` §12).

use std::ops::{Deref, DerefMut};

use super::limits::CLASSES_MAX;
use super::types::{Millis, Offset};

/// One value per class of a partition, held inline. The claim decision and
/// `apply(Claimed)` build several of these for every message claimed; as
/// `Vec`s they were most of the heap allocations of the claim path
/// (`tests/queue_allocations.rs` counts them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PerClass<T: Copy + Default> {
    items: [T; CLASSES_MAX],
    len: usize,
}

impl<T: Copy + Default> PerClass<T> {
    pub fn new() -> Self {
        Self { items: [T::default(); CLASSES_MAX], len: 0 }
    }

    /// # Panics
    /// More than [`CLASSES_MAX`] values: configs with more bands than
    /// `PRIORITY_BANDS_MAX` are refused by `QueueConfig::validate`.
    pub fn from_slice(values: &[T]) -> Self {
        let mut per_class = Self::new();
        for &value in values {
            per_class.push(value);
        }
        per_class
    }

    /// # Panics
    /// Past [`CLASSES_MAX`] values (see [`PerClass::from_slice`]).
    pub fn push(&mut self, value: T) {
        assert!(self.len < CLASSES_MAX, "more than {CLASSES_MAX} classes");
        self.items[self.len] = value;
        self.len += 1;
    }
}

impl<T: Copy + Default> Deref for PerClass<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        &self.items[..self.len]
    }
}

impl<T: Copy + Default> DerefMut for PerClass<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.items[..self.len]
    }
}

/// Weighted round-robin credits, one per class (bands, then retry).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Credits {
    remaining: PerClass<u32>,
}

/// The head of one class as the chooser sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ClassHead {
    pub since_ms: Millis,
    pub offset: Offset,
}

impl Credits {
    /// Full credits for a fresh round.
    pub fn new(weights: &[u32]) -> Self {
        Self { remaining: PerClass::from_slice(weights) }
    }

    /// Credits as a snapshot stored them (at most [`CLASSES_MAX`]).
    pub fn from_raw(remaining: &[u32]) -> Self {
        Self { remaining: PerClass::from_slice(remaining) }
    }

    pub fn raw(&self) -> &[u32] {
        &self.remaining
    }

    /// The class that serves the next claim, and whether age promotion
    /// chose it; `None` if no class has a (durable) ready message. Age
    /// promotion first: the oldest head ready for `age_promotion_ms`. Else
    /// the highest-priority class with a head and credit; when no class with
    /// a head has credit left, the first class with a head (the round that
    /// [`Credits::serve`] then starts gives it credit).
    pub fn choose(
        &self,
        heads: &[Option<ClassHead>],
        now: Millis,
        age_promotion_ms: Millis,
    ) -> Option<(usize, bool)> {
        let promoted = heads
            .iter()
            .enumerate()
            .filter_map(|(class, head)| head.map(|h| (class, h)))
            .filter(|(_, h)| promoted(h.since_ms, now, age_promotion_ms))
            .min_by_key(|(_, h)| (h.since_ms, h.offset));
        if let Some((class, _)) = promoted {
            return Some((class, true));
        }
        heads
            .iter()
            .zip(self.remaining.iter())
            .position(|(head, &credit)| head.is_some() && credit > 0)
            .or_else(|| heads.iter().position(Option::is_some))
            .map(|class| (class, false))
    }

    /// The round bookkeeping of one claim served by `class`, in the claim
    /// decision and in `apply(Claimed)` alike. A claim chosen by the weights
    /// from a class without credit means no class with a ready message had
    /// any (else [`Credits::choose`] would have taken that one): a new round
    /// starts (credits back to the weights). A promoted claim never starts a
    /// round. Then the serving class pays one credit (none when it has none).
    ///
    /// The rule reads only the credits and the claimed message (its class,
    /// and whether it was promoted: its ready age at the claim), never which
    /// other classes hold messages, so a replay reproduces the credits
    /// whichever records not yet durable at the decision it holds (the
    /// journal's control lane may place the claim ahead of their data).
    pub fn serve(&mut self, class: usize, promoted: bool, weights: &[u32]) {
        assert!(weights.len() == self.remaining.len());
        if !promoted && self.remaining[class] == 0 {
            self.remaining.copy_from_slice(weights);
        }
        self.remaining[class] = self.remaining[class].saturating_sub(1);
    }
}

/// Whether a head ready since `since_ms` is served by age promotion at `now`.
pub(crate) fn promoted(since_ms: Millis, now: Millis, age_promotion_ms: Millis) -> bool {
    now.saturating_sub(since_ms) >= age_promotion_ms
}
