//! Subscriptions on this shard's partitions (`docs/design/subscriptions.md`
//! §2): the table names a queue's subscriptions; each partition this shard
//! serves (leads, when replicated) starts and ends them in its own log
//! until its state has exactly the table's (`Partition::log_subscriptions`).
//! Level-triggered: a table change starts a pass over the queue's
//! partitions at once, and the shard's tick checks every partition (a
//! crash between the table change and the append, a leader that changed,
//! a partition opened later all converge at the next turn). One pass per
//! partition at a time.

use std::cell::{Cell, RefCell};
use std::collections::BTreeSet;
use std::rc::Rc;

use super::limits::SUBSCRIPTION_WATCH_INTERVAL;
use super::ShardState;
use crate::clock::{instant_now, Instant};
use crate::control::assignment::{QueueName, SubscriptionStart, Subscriptions};
use crate::partition::StartAt;
use crate::queue::{Offset, PartitionId, QueueId, SubscriptionId};
use crate::shard::report::SubscriptionCounters;

/// The partitions a pass is running for.
#[derive(Debug, Default)]
pub(super) struct Subscribing {
    running: RefCell<BTreeSet<(QueueId, PartitionId)>>,
    watched: Cell<Option<Instant>>,
}

/// A queue, its id and its subscriptions as its partitions take them.
type Wanted = (QueueName, QueueId, Vec<(SubscriptionId, StartAt)>);

/// The table's subscriptions of a queue as a partition takes them.
fn wanted(subscriptions: &Subscriptions) -> Vec<(SubscriptionId, StartAt)> {
    subscriptions
        .named
        .values()
        .map(|entry| {
            let start = match entry.start {
                SubscriptionStart::Earliest => StartAt::Earliest,
                SubscriptionStart::Latest => StartAt::Latest,
                SubscriptionStart::Time(time_ms) => StartAt::Time(time_ms),
                SubscriptionStart::Offset(offset) => StartAt::Offset(Offset(offset)),
            };
            (entry.id, start)
        })
        .collect()
}

impl ShardState {
    /// A partition of `queue`'s counters and loss reports of each
    /// subscription besides the default, with the name the table gives
    /// it, for the shard's report.
    pub(super) fn subscription_report(
        &self,
        queue: &str,
        counters: Vec<(SubscriptionId, crate::queue::QueueCounters, Vec<crate::queue::Loss>)>,
    ) -> Vec<SubscriptionCounters> {
        if counters.is_empty() {
            return Vec::new();
        }
        let table = self.table.borrow();
        let named = QueueName::new(queue).ok().and_then(|name| table.queue(&name));
        counters
            .into_iter()
            .map(|(id, counters, losses)| SubscriptionCounters {
                id,
                name: named
                    .and_then(|entry| entry.subscriptions.name(id))
                    .unwrap_or_default()
                    .to_owned(),
                counters,
                losses,
            })
            .collect()
    }

    /// The table changed `queue`'s subscriptions: bring its partitions
    /// here in step now.
    pub(super) fn subscriptions_changed(self: &Rc<Self>, queue: &QueueName) {
        self.reconcile_subscriptions(Some(queue));
    }

    /// [`subscriptions_changed`](Self::subscriptions_changed) by the
    /// queue's name as a request spells it.
    pub(super) fn subscriptions_changed_by_name(self: &Rc<Self>, queue: &str) {
        if let Ok(queue) = QueueName::new(queue) {
            self.reconcile_subscriptions(Some(&queue));
        }
    }

    /// Starts a pass for every partition served here (of `only`, when
    /// given) whose state's subscriptions differ from the table's.
    fn reconcile_subscriptions(self: &Rc<Self>, only: Option<&QueueName>) {
        let queues: Vec<Wanted> = {
            let table = self.table.borrow();
            table
                .queues()
                .filter(|(name, _)| only.is_none_or(|only| only == *name))
                .map(|(name, entry)| (name.clone(), entry.id, wanted(&entry.subscriptions)))
                .collect()
        };
        for (queue, queue_id, wanted) in queues {
            let served: Vec<_> = {
                let partitions = self.partitions.borrow();
                partitions
                    .iter()
                    .filter(|(name, _, _)| *name == queue.as_str())
                    .map(|(_, partition, served)| (partition, served.partition.clone()))
                    .collect()
            };
            for (partition, part) in served {
                if !part.serving() || part.subscriptions_match(&wanted) {
                    continue;
                }
                if !self.subscribing.running.borrow_mut().insert((queue_id, partition)) {
                    continue;
                }
                let state = self.clone();
                let wanted = wanted.clone();
                let name = queue.clone();
                glommio::spawn_local(async move {
                    if let Err(error) = part.log_subscriptions(&wanted).await {
                        tracing::debug!(queue = %name, partition = partition.0, %error,
                            "subscriptions not in step yet; the next turn tries again");
                    } else {
                        tracing::info!(queue = %name, partition = partition.0,
                            subscriptions = wanted.len(), "subscriptions in step with the table");
                    }
                    state.subscribing.running.borrow_mut().remove(&(queue_id, partition));
                })
                .detach();
            }
        }
    }
}

/// The shard tick's turn, at most every [`SUBSCRIPTION_WATCH_INTERVAL`]:
/// every served partition converges on the table's subscriptions.
pub(super) fn watch(state: &Rc<ShardState>) {
    let now = instant_now();
    let watched = state.subscribing.watched.get();
    if watched.is_some_and(|at| now.duration_since(at) < SUBSCRIPTION_WATCH_INTERVAL) {
        return;
    }
    state.subscribing.watched.set(Some(now));
    state.reconcile_subscriptions(None);
}
