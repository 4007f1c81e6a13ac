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

use super::types::{Millis, Offset};

/// Weighted round-robin credits, one per class (bands, then retry).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Credits {
    remaining: Vec<u32>,
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
        Self { remaining: weights.to_vec() }
    }

    pub fn from_raw(remaining: Vec<u32>) -> Self {
        Self { remaining }
    }

    pub fn raw(&self) -> &[u32] {
        &self.remaining
    }

    /// Starts a new round when no class with a ready message has credit left.
    pub fn begin_pick(&mut self, weights: &[u32], nonempty: &[bool]) {
        assert!(weights.len() == self.remaining.len());
        assert!(nonempty.len() == self.remaining.len());
        let any = self.remaining.iter().zip(nonempty).any(|(&credit, &ready)| ready && credit > 0);
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
        heads.iter().zip(&self.remaining).position(|(head, &credit)| head.is_some() && credit > 0)
    }

    /// The serving class pays one credit.
    pub fn charge(&mut self, class: usize) {
        self.remaining[class] = self.remaining[class].saturating_sub(1);
    }
}
