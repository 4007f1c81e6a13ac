//! `Lanes`: an ordered subscription's per-key lanes
//! (`docs/design/ordered-lanes.md`). Pure bookkeeping of which message of
//! each routing key is its lane's *head* (the one that may be claimable,
//! claimed, scheduled or retried) and which wait behind it, in offset
//! order; `state/ordered.rs` moves the messages themselves.
//!
//! Every operation is O(log n) in the messages waiting and O(1) in the
//! active keys, so a claim never looks at a waiting message: a hot key
//! with most of the backlog costs its waiting messages nothing until its
//! head finishes.

use std::collections::{BTreeSet, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

use super::types::{Offset, OrderKey};

/// A hasher for keys that are already well spread (`OrderKey`) or
/// sequential (`Offset`): one multiply, no per-map random seed (the maps
/// are never iterated for a decision, so the order does not matter).
#[derive(Default)]
pub(crate) struct SpreadHasher(u64);

impl Hasher for SpreadHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(byte)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = (self.0 ^ value).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type Spread = BuildHasherDefault<SpreadHasher>;

/// One active key: its head, and how many wait behind it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Lane {
    head: Offset,
    waiting: u64,
}

/// Where a new message of an ordered subscription goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Place {
    /// Its key had no message here: it heads a new lane and goes where an
    /// unordered message would.
    Head,
    /// Its key's lane has a head: it waits (in no claim index).
    Waiting,
}

/// The lanes of one ordered subscription (see the module docs).
#[derive(Clone, Debug, Default)]
pub(crate) struct Lanes {
    /// Active keys (a head here), each with its lane.
    lanes: HashMap<OrderKey, Lane, Spread>,
    /// Each head's key.
    head_keys: HashMap<Offset, OrderKey, Spread>,
    /// Waiting messages, by key then offset: a key's next head is the
    /// first of its range.
    waiting: BTreeSet<(OrderKey, Offset)>,
    /// The first waiting message of each key that has one, by offset:
    /// the first is the oldest waiting message (offsets are in enqueue
    /// order), its key the one that blocks longest.
    fronts: BTreeSet<(Offset, OrderKey)>,
}

impl Lanes {
    /// Keys with a head (active lanes).
    pub(crate) fn active_keys(&self) -> usize {
        self.lanes.len()
    }

    /// Keys with a message waiting behind their head.
    pub(crate) fn blocked_keys(&self) -> usize {
        self.fronts.len()
    }

    /// Messages waiting behind a head.
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// The oldest waiting message and its key (the key blocked longest).
    pub(crate) fn oldest_waiting(&self) -> Option<(Offset, OrderKey)> {
        self.fronts.first().copied()
    }

    /// Key `key`'s head.
    pub(crate) fn lane_of_head(&self, key: OrderKey) -> Option<Offset> {
        self.lanes.get(&key).map(|lane| lane.head)
    }

    /// Key `key`'s head and its waiting messages, in order.
    #[cfg(test)]
    pub(crate) fn lane_of(&self, key: OrderKey) -> Option<(Offset, Vec<Offset>)> {
        let lane = self.lanes.get(&key)?;
        let waiting = self.waiting_of(key).collect();
        Some((lane.head, waiting))
    }

    /// Whether `offset` waits in `key`'s lane.
    pub(crate) fn is_waiting(&self, key: OrderKey, offset: Offset) -> bool {
        self.waiting.contains(&(key, offset))
    }

    fn waiting_of(&self, key: OrderKey) -> impl Iterator<Item = Offset> + '_ {
        self.waiting.range((key, Offset(0))..=(key, Offset(u64::MAX))).map(|&(_, offset)| offset)
    }

    /// Every head with its key (checkpoints), in no particular order.
    pub(crate) fn heads(&self) -> impl Iterator<Item = (Offset, OrderKey)> + '_ {
        self.head_keys.iter().map(|(&offset, &key)| (offset, key))
    }

    /// Places a new message of `key` at `offset` (above every offset
    /// placed before).
    pub(crate) fn arrive(&mut self, key: OrderKey, offset: Offset) -> Place {
        match self.lanes.get_mut(&key) {
            Some(lane) => {
                if lane.waiting == 0 {
                    assert!(self.fronts.insert((offset, key)));
                }
                lane.waiting += 1;
                assert!(self.waiting.insert((key, offset)));
                Place::Waiting
            }
            None => {
                self.lanes.insert(key, Lane { head: offset, waiting: 0 });
                assert!(self.head_keys.insert(offset, key).is_none());
                Place::Head
            }
        }
    }

    /// Head `offset` finished (acked, dead-lettered, expired, purged):
    /// its key's first waiting message becomes the head and is returned,
    /// or the key leaves. `None` also when `offset` heads no lane (an
    /// unkeyed message, or one that came back outside its lane: redrive).
    pub(crate) fn head_left(&mut self, offset: Offset) -> Option<Offset> {
        let key = self.head_keys.remove(&offset)?;
        let next = self.waiting_of(key).next();
        let Some(next) = next else {
            self.lanes.remove(&key).expect("a head's lane");
            return None;
        };
        self.take_waiting(key, next);
        let lane = self.lanes.get_mut(&key).expect("a head's lane");
        lane.head = next;
        assert!(self.head_keys.insert(next, key).is_none());
        Some(next)
    }

    /// Waiting message `offset` of `key` left out of turn (a purge).
    pub(crate) fn waiting_left(&mut self, key: OrderKey, offset: Offset) {
        self.take_waiting(key, offset);
    }

    fn take_waiting(&mut self, key: OrderKey, offset: Offset) {
        assert!(self.waiting.remove(&(key, offset)), "waiting message {offset:?} not in its lane");
        let lane = self.lanes.get_mut(&key).expect("a waiting message's lane");
        lane.waiting -= 1;
        if self.fronts.remove(&(offset, key)) {
            let front = self.waiting_of(key).next();
            if let Some(front) = front {
                assert!(self.fronts.insert((front, key)));
            }
        }
    }

    /// Restores a head (checkpoints: heads first, then waiting messages).
    pub(crate) fn restore_head(&mut self, offset: Offset, key: OrderKey) -> bool {
        if self.lanes.contains_key(&key) || self.head_keys.contains_key(&offset) {
            return false;
        }
        self.lanes.insert(key, Lane { head: offset, waiting: 0 });
        self.head_keys.insert(offset, key);
        true
    }

    /// Restores a waiting message behind its key's restored head; false
    /// when the key has no head or the message is not after it.
    pub(crate) fn restore_waiting(&mut self, key: OrderKey, offset: Offset) -> bool {
        let Some(lane) = self.lanes.get_mut(&key) else { return false };
        if offset <= lane.head || !self.waiting.insert((key, offset)) {
            return false;
        }
        lane.waiting += 1;
        let front = self.waiting_of(key).next().expect("just inserted");
        if front == offset {
            let old = self.fronts.iter().find(|&&(_, k)| k == key).copied();
            if let Some(old) = old {
                self.fronts.remove(&old);
            }
            self.fronts.insert((offset, key));
        }
        true
    }

    /// Checks the structures against each other (tests, `check`).
    pub(crate) fn check(&self) -> Result<(), String> {
        if self.lanes.len() != self.head_keys.len() {
            return Err(format!("{} lanes, {} heads", self.lanes.len(), self.head_keys.len()));
        }
        let mut waiting = 0;
        for (key, lane) in &self.lanes {
            if self.head_keys.get(&lane.head) != Some(key) {
                return Err(format!("lane {key:?}: head {:?} not keyed to it", lane.head));
            }
            let mine: Vec<Offset> = self.waiting_of(*key).collect();
            if mine.len() as u64 != lane.waiting {
                return Err(format!(
                    "lane {key:?}: {} waiting, counted {}",
                    mine.len(),
                    lane.waiting
                ));
            }
            if mine.first().is_some_and(|&first| first <= lane.head) {
                return Err(format!("lane {key:?}: a message waits ahead of its head"));
            }
            if mine.first().is_some_and(|&first| !self.fronts.contains(&(first, *key))) {
                return Err(format!("lane {key:?}: its front is not indexed"));
            }
            waiting += mine.len();
        }
        if waiting != self.waiting.len() {
            return Err(format!("{} waiting in lanes, {} in all", waiting, self.waiting.len()));
        }
        let blocked = self.lanes.values().filter(|lane| lane.waiting > 0).count();
        if blocked != self.fronts.len() {
            return Err(format!("{blocked} blocked lanes, {} fronts", self.fronts.len()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: a key's messages come out in offset order, one head at a
    // time, whatever the interleaving of keys; a purge out of turn keeps
    // the rest in order; the counters follow.
    #[test]
    fn lanes_hand_out_heads_in_offset_order_per_key() {
        let mut lanes = Lanes::default();
        let (a, b) = (OrderKey(1), OrderKey(2));
        assert_eq!(lanes.arrive(a, Offset(0)), Place::Head);
        assert_eq!(lanes.arrive(b, Offset(1)), Place::Head);
        assert_eq!(lanes.arrive(a, Offset(2)), Place::Waiting);
        assert_eq!(lanes.arrive(a, Offset(3)), Place::Waiting);
        assert_eq!(lanes.arrive(b, Offset(4)), Place::Waiting);
        assert_eq!(lanes.arrive(a, Offset(5)), Place::Waiting);
        lanes.check().unwrap();
        assert_eq!((lanes.active_keys(), lanes.blocked_keys(), lanes.waiting()), (2, 2, 4));
        assert_eq!(lanes.oldest_waiting(), Some((Offset(2), a)));
        lanes.waiting_left(a, Offset(3));
        lanes.check().unwrap();
        assert_eq!(lanes.head_left(Offset(0)), Some(Offset(2)));
        assert_eq!(lanes.oldest_waiting(), Some((Offset(4), b)));
        assert_eq!(lanes.head_left(Offset(1)), Some(Offset(4)));
        assert_eq!(lanes.head_left(Offset(4)), None);
        assert_eq!(lanes.head_left(Offset(2)), Some(Offset(5)));
        assert_eq!(lanes.head_left(Offset(5)), None);
        assert_eq!(lanes.head_left(Offset(9)), None, "an unkeyed message heads nothing");
        lanes.check().unwrap();
        assert_eq!((lanes.active_keys(), lanes.blocked_keys(), lanes.waiting()), (0, 0, 0));
        // A key that left starts a new lane.
        assert_eq!(lanes.arrive(a, Offset(10)), Place::Head);
    }

    // Goal: restoring heads then waiting messages (in any order) rebuilds
    // what arrivals built, and a waiting message without a head, or ahead
    // of it, is refused.
    #[test]
    fn restore_rebuilds_the_same_lanes() {
        let mut live = Lanes::default();
        for (key, offset) in [(1, 0), (2, 1), (1, 2), (1, 3), (2, 4)] {
            live.arrive(OrderKey(key), Offset(offset));
        }
        let mut restored = Lanes::default();
        for (offset, key) in live.heads() {
            assert!(restored.restore_head(offset, key));
        }
        for (key, offset) in [(2, 4), (1, 3), (1, 2)] {
            assert!(restored.restore_waiting(OrderKey(key), Offset(offset)));
        }
        restored.check().unwrap();
        assert_eq!(restored.lane_of(OrderKey(1)), live.lane_of(OrderKey(1)));
        assert_eq!(restored.oldest_waiting(), live.oldest_waiting());
        assert!(!restored.restore_waiting(OrderKey(7), Offset(9)), "no head");
        assert!(!restored.restore_waiting(OrderKey(2), Offset(0)), "ahead of its head");
        assert!(!restored.restore_head(Offset(20), OrderKey(1)), "a second head");
    }
}
