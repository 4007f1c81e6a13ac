//! Which partitions a housekeeping tick visits.
//!
//! A partition's tick (`Partition::tick`: lease expiry, scheduled → ready,
//! expiry, the end of long-poll waits, the sweep wakes while claims wait
//! and messages are ready, tail-cache trimming, a checkpoint due by
//! growth) has something to do only when the partition changed since its
//! last visit or one of its deadlines passed. The plan keeps exactly those:
//!
//! - **touched**: partitions that changed since the last tick (events
//!   applied, a batch appended, a claim started waiting), pushed once each
//!   by the partition's touch hook;
//! - **deadlines**: each partition's next visit (`Partition::next_visit`),
//!   indexed by time, recomputed after every visit;
//! - a **full sweep** of every partition every [`HOUSEKEEPING_FULL_SWEEP_MS`]:
//!   the safety net for a change no hook reports (a disk that filled under
//!   an append), at one visit per partition per sweep.
//!
//! So an idle partition costs one visit per sweep instead of one per tick
//! (a tick is every 5–100 ms), and the shard's next tick is the earliest
//! indexed deadline, found in O(log n) instead of a scan of every
//! partition. Single-threaded; generic over the visited type so it is
//! tested without partitions.
//!
//! [`HOUSEKEEPING_FULL_SWEEP_MS`]: crate::limits::HOUSEKEEPING_FULL_SWEEP_MS

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;

use crate::queue::Millis;

/// A visited item's bookkeeping in the plan.
#[derive(Debug)]
pub struct TickSlot {
    /// Unique per plan: orders equal deadlines in the index.
    serial: u64,
    /// In the touched list now.
    touched: Cell<bool>,
    /// Its key in the deadline index, if any.
    due: Cell<Option<Millis>>,
    /// The last round that visited it (one visit per round).
    visited_round: Cell<u64>,
}

/// Something the plan visits.
pub trait Visited {
    fn tick_slot(&self) -> &TickSlot;
}

/// The plan (see the module docs).
pub struct TickPlan<T> {
    next_serial: Cell<u64>,
    touched: RefCell<Vec<Rc<T>>>,
    deadlines: RefCell<BTreeMap<(Millis, u64), Rc<T>>>,
    round: Cell<u64>,
    next_full_sweep: Cell<Millis>,
    sweep_ms: Millis,
    /// Visits handed out since the plan was made.
    visits: Cell<u64>,
}

impl<T: Visited> TickPlan<T> {
    /// A plan whose first round is a full sweep, then one every `sweep_ms`.
    pub fn new(sweep_ms: Millis) -> Self {
        Self {
            next_serial: Cell::new(0),
            touched: RefCell::new(Vec::new()),
            deadlines: RefCell::new(BTreeMap::new()),
            round: Cell::new(0),
            next_full_sweep: Cell::new(0),
            sweep_ms,
            visits: Cell::new(0),
        }
    }

    /// A slot for a new item (not yet touched, no deadline).
    pub fn slot(&self) -> TickSlot {
        let serial = self.next_serial.get();
        self.next_serial.set(serial + 1);
        TickSlot {
            serial,
            touched: Cell::new(false),
            due: Cell::new(None),
            visited_round: Cell::new(0),
        }
    }

    /// `item` changed: the next round visits it.
    pub fn touch(&self, item: &Rc<T>) {
        if !item.tick_slot().touched.replace(true) {
            self.touched.borrow_mut().push(item.clone());
        }
    }

    /// Indexes `item`'s next visit at `at` (`None`: only when touched or
    /// swept), replacing its previous deadline.
    pub fn schedule(&self, item: &Rc<T>, at: Option<Millis>) {
        let slot = item.tick_slot();
        if slot.due.get() == at {
            return;
        }
        let mut deadlines = self.deadlines.borrow_mut();
        if let Some(old) = slot.due.get() {
            deadlines.remove(&(old, slot.serial));
        }
        if let Some(at) = at {
            deadlines.insert((at, slot.serial), item.clone());
        }
        slot.due.set(at);
    }

    /// Forgets `item` (closed for good): off the index. A touched entry
    /// still listed is dropped at the next round.
    pub fn forget(&self, item: &Rc<T>) {
        self.schedule(item, None);
    }

    /// The items this round (at `now`) visits, each once: the touched ones,
    /// those whose deadline is at or before `now` (taken off the index:
    /// the caller schedules each again after its visit), and, when a full
    /// sweep is due, every item `all` returns.
    pub fn round(&self, now: Millis, all: impl FnOnce() -> Vec<Rc<T>>) -> Vec<Rc<T>> {
        let round = self.round.get() + 1;
        self.round.set(round);
        let mut visit = Vec::new();
        let mut take = |item: Rc<T>| {
            let slot = item.tick_slot();
            if slot.visited_round.replace(round) != round {
                visit.push(item);
            }
        };
        for item in std::mem::take(&mut *self.touched.borrow_mut()) {
            item.tick_slot().touched.set(false);
            take(item);
        }
        {
            let mut deadlines = self.deadlines.borrow_mut();
            while let Some(entry) = deadlines.first_entry() {
                if entry.key().0 > now {
                    break;
                }
                let item = entry.remove();
                item.tick_slot().due.set(None);
                take(item);
            }
        }
        if now >= self.next_full_sweep.get() {
            self.next_full_sweep.set(now.saturating_add(self.sweep_ms));
            for item in all() {
                take(item);
            }
        }
        self.visits.set(self.visits.get() + visit.len() as u64);
        visit
    }

    /// When the next round has something to do: the earliest indexed
    /// deadline or the next full sweep, whichever is first.
    pub fn next_round_at(&self) -> Millis {
        let sweep = self.next_full_sweep.get();
        self.deadlines.borrow().first_key_value().map_or(sweep, |(&(at, _), _)| at.min(sweep))
    }

    /// Visits handed out since the plan was made.
    pub fn visits(&self) -> u64 {
        self.visits.get()
    }

    /// Items in the deadline index.
    pub fn scheduled(&self) -> usize {
        self.deadlines.borrow().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Item(TickSlot, u32);

    impl Visited for Item {
        fn tick_slot(&self) -> &TickSlot {
            &self.0
        }
    }

    fn ids(items: &[Rc<Item>]) -> Vec<u32> {
        let mut ids: Vec<u32> = items.iter().map(|item| item.1).collect();
        ids.sort_unstable();
        ids
    }

    #[test]
    fn a_round_visits_the_touched_and_the_due_once_each_and_sweeps_all_on_schedule() {
        // Goal: idle items cost nothing between sweeps; touched and due items are visited
        // once per round even when both; a deadline is taken off the index when visited;
        // rescheduling replaces the old deadline; the next round is the earliest deadline
        // or the next sweep. Method: 1,000 items, a 1,000 ms sweep; rounds at chosen times.
        let plan = TickPlan::<Item>::new(1_000);
        let items: Vec<Rc<Item>> = (0..1_000).map(|id| Rc::new(Item(plan.slot(), id))).collect();
        let all = || items.clone();
        assert_eq!(plan.round(0, all).len(), 1_000, "the first round sweeps");
        assert_eq!(plan.next_round_at(), 1_000);
        assert!(plan.round(5, all).is_empty(), "idle items are not visited between sweeps");
        plan.touch(&items[3]);
        plan.touch(&items[3]);
        plan.schedule(&items[3], Some(7));
        plan.schedule(&items[9], Some(50));
        plan.schedule(&items[9], Some(20));
        plan.schedule(&items[11], Some(900));
        assert_eq!(plan.next_round_at(), 7);
        assert_eq!(ids(&plan.round(10, all)), vec![3], "touched and due: once");
        assert_eq!(plan.next_round_at(), 20, "item 9's old deadline 50 was replaced");
        assert_eq!(ids(&plan.round(20, all)), vec![9]);
        assert!(plan.round(49, all).is_empty());
        assert!(plan.round(50, all).is_empty(), "the replaced deadline is gone");
        plan.forget(&items[11]);
        assert_eq!(plan.scheduled(), 0);
        assert_eq!(plan.round(1_000, all).len(), 1_000, "the next sweep");
        assert_eq!(plan.visits(), 2_002);
    }
}
