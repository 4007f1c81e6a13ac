//! The before-images of a checkpoint written in steps: what each message
//! below the checkpoint's `covers` held when it began, kept at its first
//! change since, so the encoder (`queue/snapshot/encode.rs`) writes the
//! state of one instant while the partition goes on. Plain data held by
//! the state; the encoder records and reads it.

use std::collections::{BTreeMap, BTreeSet};

use super::{DeadLetter, Warm};
use crate::queue::fresh::FreshView;
use crate::queue::types::{Offset, SubscriptionId};

/// What an offset below a running checkpoint's `covers` held when the
/// checkpoint began, recorded at the first change to it since (a
/// copy-on-write of one message). `touched` names every such offset, also
/// those that held nothing (or, for a table, held nothing in it).
#[derive(Debug, Default)]
pub(crate) struct Capture {
    pub(crate) covers: Offset,
    pub(crate) touched: BTreeSet<Offset>,
    pub(crate) fresh: Vec<BTreeMap<Offset, FreshView>>,
    pub(crate) warm: BTreeMap<Offset, Warm>,
    pub(crate) dead: BTreeMap<Offset, DeadLetter>,
    /// The same for every subscription but the default, by id.
    pub(crate) sub_warm: BTreeMap<SubscriptionId, BTreeMap<Offset, Warm>>,
    pub(crate) sub_dead: BTreeMap<SubscriptionId, BTreeMap<Offset, DeadLetter>>,
}
