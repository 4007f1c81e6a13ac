//! The key-order check of an ordered queue (`docs/design/ordered-lanes.md`):
//! per routing key, at most one message at a time, in offset order.
//!
//! Owns, per key, the message most recently handed over to (the highest
//! delivered so far, its *current* message) and the acks in flight per
//! message; the [`Ledger`](super::ledger::Ledger) feeds it every delivery of
//! a keyed message and asks it for a verdict. A key's sequence is its
//! messages' offsets: producers route a key to one partition, and the
//! broker's order is offset order (a producer's own counter could disagree
//! with it when a resent batch appends a record after a later one).
//!
//! The ledger sees deliveries in the order their answers arrive, not the
//! broker's; the two rules hold in that order all the same, because a key's
//! next message is claimable only after the previous one finished, and the
//! consumer records a delivery before it sends the ack that finishes it:
//!
//! 1. **Never back** ([`Verdict::Back`]): a key's deliveries never go to a
//!    lower offset once a higher one was delivered. This also catches an ack
//!    whose outcome was unknown (the broker died with it in flight) that the
//!    broker handed the lane on for and then lost: the earlier message is
//!    delivered again after the later one was.
//! 2. **Never two at once** ([`Verdict::Overlap`]): a higher offset is
//!    delivered only while the key's current message is finished or may be:
//!    acked with a confirmed answer, its ack's outcome unknown, or an ack of
//!    it in flight (it may be applied, and the broker hands the lane on
//!    before the ack's answer). Releases, lease expiries, session ends and
//!    the epoch fence do not finish a message, so a redelivery of the
//!    current message is fine and changes nothing. Dead letters, expiries and
//!    purges would finish it unseen, so the ordered mode keeps none of them.
//!
//! Pure: no I/O, no time.

use std::collections::HashMap;

use spool_client::spool_wire::batch::MessageId;

use super::ledger::Placement;

/// A routing key of the loop's load (an index into its key set).
pub type Key = u32;

/// What one delivery of a keyed message means for its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The key's first delivery, or its current message again.
    Same,
    /// The key moved on to a later message, its current one finished (or
    /// possibly finished).
    Advanced,
    /// A message earlier than one already delivered: the key went back.
    Back {
        /// The key's highest delivered message.
        highest: Placement,
        /// What was known of its predecessor when it was handed over
        /// ([`Finished::Maybe`]: an ack unknown or in flight).
        handover: Finished,
    },
    /// A later message while the key's current one was not finished and
    /// no ack of it had been sent: two messages of the key held at once.
    Overlap {
        /// The key's current message, still held.
        held: Placement,
    },
}

#[derive(Debug, Clone, Copy)]
struct Current {
    placement: Placement,
    id: MessageId,
    handover: Finished,
}

/// Finishing state of a message, as the ledger knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finished {
    /// Acked with a confirmed answer (or an unknown ack a check found
    /// applied).
    Confirmed,
    /// An ack whose outcome is unknown.
    Maybe,
    /// No ack known.
    No,
}

/// The per-key state; see the module doc.
#[derive(Debug, Default)]
pub struct KeyOrder {
    key_of: HashMap<MessageId, Key>,
    current: HashMap<Key, Current>,
    acks_in_flight: HashMap<MessageId, u32>,
}

impl KeyOrder {
    /// `id` was submitted with routing key `key`.
    pub fn submit(&mut self, id: MessageId, key: Key) {
        self.key_of.insert(id, key);
    }

    /// The key `id` was submitted with, if any.
    pub fn key(&self, id: MessageId) -> Option<Key> {
        self.key_of.get(&id).copied()
    }

    /// An ack of `id` is about to be sent.
    pub fn ack_sent(&mut self, id: MessageId) {
        *self.acks_in_flight.entry(id).or_insert(0) += 1;
    }

    /// An ack of `id` was answered (or failed): no longer in flight.
    pub fn ack_settled(&mut self, id: MessageId) {
        if let Some(count) = self.acks_in_flight.get_mut(&id) {
            *count -= 1;
            if *count == 0 {
                self.acks_in_flight.remove(&id);
            }
        }
    }

    /// `id` of `key` at `placement` was delivered; `finished` says what the
    /// ledger knows of a message's acks.
    pub fn delivered(
        &mut self,
        key: Key,
        id: MessageId,
        placement: Placement,
        finished: impl Fn(MessageId) -> Finished,
    ) -> Verdict {
        let Some(current) = self.current.get(&key).copied() else {
            let first = Current { placement, id, handover: Finished::Confirmed };
            self.current.insert(key, first);
            return Verdict::Same;
        };
        if placement == current.placement {
            return Verdict::Same;
        }
        if placement < current.placement {
            return Verdict::Back { highest: current.placement, handover: current.handover };
        }
        let state = match finished(current.id) {
            Finished::No if self.acks_in_flight.contains_key(&current.id) => Finished::Maybe,
            state => state,
        };
        self.current.insert(key, Current { placement, id, handover: state });
        if state == Finished::No {
            Verdict::Overlap { held: current.placement }
        } else {
            Verdict::Advanced
        }
    }
}

#[cfg(test)]
mod tests {
    use spool_client::spool_wire::proto::{Offset, PartitionId};

    use super::*;

    fn id(n: u8) -> MessageId {
        MessageId([n; 16])
    }

    fn at(offset: u64) -> Placement {
        Placement::new(PartitionId(0), Offset(offset))
    }

    // Goal: each verdict on the history it names, with acks in flight
    // counted as possibly finishing. Method: one key through a clean
    // hand-over, a redelivery, an overlap, a hand-over on an ack in flight,
    // and a step back.
    #[test]
    fn verdicts_follow_the_rules() {
        let mut order = KeyOrder::default();
        let none = |_| Finished::No;
        let confirmed = |_| Finished::Confirmed;
        assert_eq!(order.delivered(1, id(1), at(0), none), Verdict::Same);
        assert_eq!(order.delivered(1, id(1), at(0), none), Verdict::Same, "a redelivery");
        assert_eq!(order.delivered(1, id(2), at(3), confirmed), Verdict::Advanced);
        assert_eq!(order.delivered(1, id(3), at(5), none), Verdict::Overlap { held: at(3) });
        order.ack_sent(id(3));
        assert_eq!(order.delivered(1, id(4), at(6), none), Verdict::Advanced, "ack in flight");
        order.ack_settled(id(3));
        assert_eq!(
            order.delivered(1, id(3), at(5), confirmed),
            Verdict::Back { highest: at(6), handover: Finished::Maybe }
        );
        assert_eq!(order.delivered(2, id(9), at(1), none), Verdict::Same, "another key");
        assert!(order.acks_in_flight.is_empty());
    }
}
