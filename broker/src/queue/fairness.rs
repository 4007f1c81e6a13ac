//! Which class serves the next claim: weighted round-robin with age promotion.
//!
//! Classes are the priority bands (index 0 = highest) plus one retry class
//! (messages ready again after a failed claim) with its own weight, so retries
//! draw from their own budget. A round gives every class `weight` credits; a
//! claim is served by the highest-priority class that has credits and a ready
//! message; when no class with a ready message has credits left a new round
//! starts. Age promotion overrides the weights: when some class head has been
//! ready for `age_promotion_ms`, the oldest such head is served first. Either
//! way the serving class pays one credit.
//!
//! The credits are state, so both the claim decision (on a copy) and `apply`
//! of a `Claimed` event run the same two steps, `begin_pick` then `charge`,
//! over the same "which classes have a ready message" view; replay therefore
//! reproduces the credits exactly.

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

    /// Starts a new round when no class with a ready message has credit left.
    pub fn begin_pick(&mut self, weights: &[u32], nonempty: &[bool]) {
        assert!(weights.len() == self.remaining.len());
        assert!(nonempty.len() == self.remaining.len());
        let any =
            self.remaining.iter().zip(nonempty.iter()).any(|(&credit, &ready)| ready && credit > 0);
        if !any {
            self.remaining.copy_from_slice(weights);
        }
    }

    /// The class that serves the next claim (after `begin_pick`), or `None`
    /// if no class has a ready message.
    pub fn choose(
        &self,
        heads: &[Option<ClassHead>],
        now: Millis,
        age_promotion_ms: Millis,
    ) -> Option<usize> {
        let promoted = heads
            .iter()
            .enumerate()
            .filter_map(|(class, head)| head.map(|h| (class, h)))
            .filter(|(_, h)| now.saturating_sub(h.since_ms) >= age_promotion_ms)
            .min_by_key(|(_, h)| (h.since_ms, h.offset));
        if let Some((class, _)) = promoted {
            return Some(class);
        }
        heads
            .iter()
            .zip(self.remaining.iter())
            .position(|(head, &credit)| head.is_some() && credit > 0)
    }

    /// The serving class pays one credit.
    pub fn charge(&mut self, class: usize) {
        self.remaining[class] = self.remaining[class].saturating_sub(1);
    }
}
