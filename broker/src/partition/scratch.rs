//! Buffers a partition reuses from one request to the next, so the
//! enqueue, claim, ack, extend and release paths allocate nothing for their
//! own bookkeeping: each is cleared before use and keeps its capacity,
//! unless a request made it larger than [`REQUEST_SCRATCH_ENTRIES_MAX`]
//! entries or [`CONTROL_SCRATCH_BYTES_MAX`] bytes, in which case it is
//! dropped after that request (one huge request does not pin memory for
//! the partition's life).
//!
//! Each buffer is borrowed only inside a section with no await (the
//! decision → append → apply step), so two requests of the same partition
//! never hold one at once. The claim's decision is awaited across (its
//! records are read after the append), so it is taken out of its cell
//! instead and put back when the claim is done; a claim that runs while
//! another holds it starts from an empty one.

use std::cell::{Cell, RefCell};
use std::collections::HashSet;

use spool_wire::batch::{BatchBytes, ControlBatchBuilder};

pub use crate::limits::{CONTROL_SCRATCH_BYTES_MAX, REQUEST_SCRATCH_ENTRIES_MAX};
use crate::queue::{
    AdmissionIds, ClaimDecision, EnqueueDecision, EnqueueRequest, Event, Lane, Millis, Offset,
    OrderKey, CLAIMED_EVENT_BYTES,
};

/// What `append_events` reuses: the builder, one event's encoding and the
/// finished batch.
#[derive(Default)]
pub(super) struct ControlScratch {
    pub builder: ControlBatchBuilder,
    pub encoded: Vec<u8>,
    pub batch: BatchBytes,
}

impl ControlScratch {
    /// Empties it for the next batch; drops what grew past the byte cap.
    pub fn recycle(&mut self) {
        self.builder.clear();
        self.encoded.clear();
        self.batch.clear();
        let held = self.builder.capacity_bytes() + self.batch.capacity();
        if held > CONTROL_SCRATCH_BYTES_MAX || self.encoded.capacity() > CLAIMED_EVENT_BYTES * 4 {
            *self = Self::default();
        }
    }
}

/// What an enqueue reuses: each record's admission request, clock stamp
/// and lane key (an ordered queue's; `None` otherwise), the decisions, the
/// accepted indices and the admission's in-batch ids.
#[derive(Default)]
pub(super) struct EnqueueScratch {
    pub requests: Vec<(EnqueueRequest, Millis, Option<OrderKey>)>,
    pub decisions: Vec<EnqueueDecision>,
    pub accepted: Vec<u32>,
    pub ids: AdmissionIds,
}

impl EnqueueScratch {
    /// Empties it for the next batch; drops what grew past the entry cap.
    pub fn recycle(&mut self) {
        self.requests.clear();
        self.decisions.clear();
        self.accepted.clear();
        self.ids.clear();
        let largest = self
            .requests
            .capacity()
            .max(self.decisions.capacity())
            .max(self.accepted.capacity())
            .max(self.ids.capacity());
        if largest > REQUEST_SCRATCH_ENTRIES_MAX {
            *self = Self::default();
        }
    }
}

/// What an ack reuses: the events decided and the (lane, offset) of each
/// token seen, to refuse a token repeated in one request.
#[derive(Default)]
pub(super) struct AckScratch {
    pub events: Vec<Event>,
    pub seen: HashSet<(u8, Offset)>,
}

impl AckScratch {
    /// Empties it for the next ack; drops what grew past the entry cap.
    pub fn recycle(&mut self) {
        self.events.clear();
        self.seen.clear();
        if self.events.capacity().max(self.seen.capacity()) > REQUEST_SCRATCH_ENTRIES_MAX {
            *self = Self::default();
        }
    }
}

/// Every scratch buffer of one partition.
#[derive(Default)]
pub(super) struct Scratch {
    pub control: RefCell<ControlScratch>,
    pub enqueue: RefCell<EnqueueScratch>,
    pub ack: RefCell<AckScratch>,
    /// The claim decision, taken out for the claim's life (see the module
    /// doc).
    pub claim: Cell<ClaimDecision>,
    /// The batches a claim or peek read back, taken out the same way (its
    /// reads await).
    pub read: Cell<super::read::BatchCache>,
}

impl Scratch {
    /// The claim decision to fill (empty, with the capacity of an earlier
    /// claim's when no other claim holds it).
    pub fn take_claim(&self) -> ClaimDecision {
        self.claim.take()
    }

    /// Gives a claim decision back for the next claim, emptied; dropped
    /// instead when it grew past the entry cap.
    pub fn give_claim(&self, mut decision: ClaimDecision) {
        decision.events.clear();
        decision.deliveries.clear();
        decision.exhausted = false;
        let largest = decision.events.capacity().max(decision.deliveries.capacity());
        if largest <= REQUEST_SCRATCH_ENTRIES_MAX {
            self.claim.set(decision);
        }
    }
}

/// The key under which an ack remembers a token it has seen.
pub(super) fn seen_key(lane: Lane, offset: Offset) -> (u8, Offset) {
    (lane as u8, offset)
}
