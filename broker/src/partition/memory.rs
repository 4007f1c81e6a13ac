//! The queue-state share of a shard's memory budget: one [`StateMemory`]
//! per shard, charged by every partition the shard serves with what its
//! state may take ([`crate::queue::PartitionState::memory_charge`]) plus a
//! fixed part for the partition itself ([`PARTITION_MEMORY_BYTES_FIXED`]).
//!
//! Only an enqueue is refused for memory (`THROTTLED`, with the figures):
//! a held message is charged the most any phase of it costs, so the claims,
//! releases and dead letters that follow its admission never need more.
//! A queue create is refused when its partitions' fixed parts do not fit
//! what is left. The meter is plain counters on the shard's thread; it
//! allocates nothing and never waits.

use std::cell::Cell;
use std::rc::Rc;

use crate::limits::PARTITION_MEMORY_BYTES_FIXED;

/// The figures of a shard's state share.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StateMemoryStats {
    pub size_bytes: u64,
    pub used_bytes: u64,
    pub peak_bytes: u64,
    /// Enqueues and creates refused because the share was spent.
    pub refusals: u64,
}

/// A request for state memory that did not fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateMemoryFull {
    pub shard: u16,
    pub needed_bytes: u64,
    pub used_bytes: u64,
    pub size_bytes: u64,
}

impl std::fmt::Display for StateMemoryFull {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "shard {}'s memory for queue state is spent: {} B charged of its {} B share, {} B \
             more needed (memory_bytes sets the share; acks, purges and expiries return it)",
            self.shard, self.used_bytes, self.size_bytes, self.needed_bytes
        )
    }
}

/// One shard's state share (single-threaded, like the shard).
#[derive(Debug)]
pub struct StateMemory {
    shard: u16,
    size: u64,
    used: Cell<u64>,
    peak: Cell<u64>,
    refusals: Cell<u64>,
}

impl StateMemory {
    /// A share of `size_bytes` for shard `shard`.
    pub fn new(shard: u16, size_bytes: u64) -> Rc<Self> {
        Rc::new(Self {
            shard,
            size: size_bytes,
            used: Cell::new(0),
            peak: Cell::new(0),
            refusals: Cell::new(0),
        })
    }

    /// A share no partition can spend (partitions opened alone, in tests).
    pub fn unbounded() -> Rc<Self> {
        Self::new(0, u64::MAX / 2)
    }

    /// Whether `bytes` more fit; counts a refusal when they do not.
    ///
    /// # Errors
    /// [`StateMemoryFull`] with the figures.
    pub fn admit(&self, bytes: u64) -> Result<(), StateMemoryFull> {
        let used = self.used.get();
        if used.saturating_add(bytes) <= self.size {
            return Ok(());
        }
        self.refusals.set(self.refusals.get() + 1);
        Err(StateMemoryFull {
            shard: self.shard,
            needed_bytes: bytes,
            used_bytes: used,
            size_bytes: self.size,
        })
    }

    /// Whether `partitions` new partitions' fixed parts fit.
    ///
    /// # Errors
    /// As [`admit`](Self::admit).
    pub fn admit_partitions(&self, partitions: u64) -> Result<(), StateMemoryFull> {
        self.admit(partitions.saturating_mul(PARTITION_MEMORY_BYTES_FIXED))
    }

    /// Moves a charge from `from` bytes to `to` (a partition's charge after
    /// its state changed). Never refuses: what was admitted is charged.
    pub fn recharge(&self, from: u64, to: u64) {
        let used = self.used.get().saturating_sub(from).saturating_add(to);
        self.used.set(used);
        if used > self.peak.get() {
            self.peak.set(used);
        }
    }

    pub fn stats(&self) -> StateMemoryStats {
        StateMemoryStats {
            size_bytes: self.size,
            used_bytes: self.used.get(),
            peak_bytes: self.peak.get(),
            refusals: self.refusals.get(),
        }
    }
}

/// One partition's current charge on its shard's [`StateMemory`]: given
/// back whole when dropped (the partition closed or was deleted), on every
/// path.
#[derive(Debug)]
pub struct StateCharge {
    meter: Rc<StateMemory>,
    bytes: Cell<u64>,
}

impl StateCharge {
    /// A charge of nothing yet on `meter`.
    pub fn new(meter: Rc<StateMemory>) -> Self {
        Self { meter, bytes: Cell::new(0) }
    }

    /// Charges `state_bytes` plus the partition's fixed part, in place of
    /// what was charged before.
    pub fn set(&self, state_bytes: u64) {
        let bytes = state_bytes.saturating_add(PARTITION_MEMORY_BYTES_FIXED);
        let before = self.bytes.replace(bytes);
        if before != bytes {
            self.meter.recharge(before, bytes);
        }
    }

    pub fn bytes(&self) -> u64 {
        self.bytes.get()
    }

    pub fn meter(&self) -> &Rc<StateMemory> {
        &self.meter
    }
}

impl Drop for StateCharge {
    fn drop(&mut self) {
        self.meter.recharge(self.bytes.get(), 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // Goal: a share admits up to its size and refuses past it with the
    // figures, counting each refusal; charges move and return whole.
    #[test]
    fn a_share_admits_to_its_size_and_charges_return_when_dropped() {
        let meter = StateMemory::new(3, 2 * PARTITION_MEMORY_BYTES_FIXED + 1_000);
        let first = StateCharge::new(meter.clone());
        first.set(600);
        assert_eq!(meter.stats().used_bytes, PARTITION_MEMORY_BYTES_FIXED + 600);
        meter.admit(400).expect("fits exactly");
        let refused = meter.admit(PARTITION_MEMORY_BYTES_FIXED + 401).unwrap_err();
        assert_eq!(refused.shard, 3);
        assert_eq!(refused.used_bytes, PARTITION_MEMORY_BYTES_FIXED + 600);
        assert!(refused.to_string().contains("memory_bytes"), "{refused}");
        assert_eq!(meter.stats().refusals, 1);
        assert!(meter.admit_partitions(2).is_err());
        assert!(meter.admit_partitions(1).is_ok());
        first.set(0);
        assert_eq!(meter.stats().used_bytes, PARTITION_MEMORY_BYTES_FIXED);
        drop(first);
        assert_eq!(meter.stats().used_bytes, 0);
        assert_eq!(meter.stats().peak_bytes, PARTITION_MEMORY_BYTES_FIXED + 600);
    }

    proptest! {
        // Goal: whatever charges are set and dropped in whatever order, the
        // meter's use is the sum of the live charges, and zero once all are
        // dropped (no leak, no underflow).
        #[test]
        fn use_is_the_sum_of_live_charges(
            steps in proptest::collection::vec((0usize..6, 0u64..1_000_000, any::<bool>()), 1..200)
        ) {
            let meter = StateMemory::new(0, u64::MAX / 4);
            let mut charges: Vec<Option<StateCharge>> = (0..6).map(|_| None).collect();
            for (slot, bytes, drop_it) in steps {
                if drop_it {
                    charges[slot] = None;
                } else {
                    charges[slot].get_or_insert_with(|| StateCharge::new(meter.clone())).set(bytes);
                }
                let live: u64 = charges.iter().flatten().map(StateCharge::bytes).sum();
                prop_assert_eq!(meter.stats().used_bytes, live);
            }
            charges.clear();
            prop_assert_eq!(meter.stats().used_bytes, 0);
        }
    }
}
