//! A queue's subscriptions in the table (`docs/design/subscriptions.md`
//! §2): names and ids live here because a subscription spans every
//! partition of its queue (on several shards, several nodes); each
//! partition starts and ends it in its own log
//! (`Event::SubscriptionStarted`/`Ended`, appended by its leader when the
//! table names a subscription its state lacks, or holds one the table no
//! longer names). Pure, as the rest of the table.

use std::collections::BTreeMap;

use super::{AssignmentChange, AssignmentError, AssignmentTable, AssignmentUpdate, QueueName};
use crate::queue::limits::SUBSCRIPTIONS_PER_QUEUE_MAX;
use crate::queue::SubscriptionId;

/// The name of the subscription every queue has (id 0): it is never
/// listed in [`Subscriptions::named`], created or deleted.
pub use spool_wire::proto::DEFAULT_SUBSCRIPTION;

/// Where a new subscription starts on each partition, resolved by the
/// partition when it appends the start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubscriptionStart {
    /// Every record the partition still has to deliver to some
    /// subscription (its shared index from offset 0).
    Earliest,
    /// Only records enqueued after the partition started it.
    Latest,
    /// The records enqueued at or after this time (Unix ms) that the
    /// partition still has; none that recent: as `Latest`.
    Time(u64),
    /// The records at or above this offset, in every partition, that the
    /// partition still has; an offset past a partition's next: as `Latest`.
    Offset(u64),
}

impl SubscriptionStart {
    /// `earliest`, `latest`, `time:<unix ms>` or `offset:<n>`: the catalog's and the
    /// controller entries' spelling, and the admin API's.
    pub fn text(self) -> String {
        match self {
            SubscriptionStart::Earliest => "earliest".to_owned(),
            SubscriptionStart::Latest => "latest".to_owned(),
            SubscriptionStart::Time(time_ms) => format!("time:{time_ms}"),
            SubscriptionStart::Offset(offset) => format!("offset:{offset}"),
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "earliest" => Some(SubscriptionStart::Earliest),
            "latest" => Some(SubscriptionStart::Latest),
            _ => match text.split_once(':')? {
                ("time", ms) => ms.parse().ok().map(SubscriptionStart::Time),
                ("offset", offset) => offset.parse().ok().map(SubscriptionStart::Offset),
                _ => None,
            },
        }
    }
}

/// One named subscription of a queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubscriptionEntry {
    pub id: SubscriptionId,
    pub start: SubscriptionStart,
}

/// A queue's subscriptions besides the default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscriptions {
    /// By name.
    pub named: BTreeMap<String, SubscriptionEntry>,
    /// The id the next one gets: ids are never reused within a queue, so a
    /// token or event of a deleted subscription never names a new one.
    pub next_id: u16,
}

impl Default for Subscriptions {
    fn default() -> Self {
        Self { named: BTreeMap::new(), next_id: 1 }
    }
}

impl Subscriptions {
    /// The id of subscription `name` (`default` included).
    pub fn id(&self, name: &str) -> Option<SubscriptionId> {
        if name.is_empty() || name == DEFAULT_SUBSCRIPTION {
            return Some(SubscriptionId::DEFAULT);
        }
        self.named.get(name).map(|entry| entry.id)
    }

    /// The name of subscription `id`.
    pub fn name(&self, id: SubscriptionId) -> Option<&str> {
        if id == SubscriptionId::DEFAULT {
            return Some(DEFAULT_SUBSCRIPTION);
        }
        self.named.iter().find(|(_, entry)| entry.id == id).map(|(name, _)| name.as_str())
    }

    /// Whether the table's subscriptions are consistent: ids distinct,
    /// below `next_id`, never the default's; names valid.
    pub(super) fn check(&self, queue: &QueueName) -> Result<(), AssignmentError> {
        let invalid = |reason: String| AssignmentError::InvalidSubscription {
            queue: queue.clone(),
            name: String::new(),
            reason,
        };
        if self.next_id == 0 || self.named.len() >= SUBSCRIPTIONS_PER_QUEUE_MAX {
            return Err(invalid(format!(
                "{} subscriptions, next id {}",
                self.named.len(),
                self.next_id
            )));
        }
        let mut ids: Vec<u16> = self.named.values().map(|entry| entry.id.0).collect();
        ids.sort_unstable();
        let distinct = ids.windows(2).all(|pair| pair[0] < pair[1]);
        if !distinct || ids.first() == Some(&0) || ids.last().is_some_and(|&id| id >= self.next_id)
        {
            return Err(invalid(format!("ids {ids:?} with next id {}", self.next_id)));
        }
        for name in self.named.keys() {
            check_name(queue, name)?;
        }
        Ok(())
    }
}

/// A subscription name: the rules of a queue name, and not `default`.
fn check_name(queue: &QueueName, name: &str) -> Result<(), AssignmentError> {
    let invalid = |reason: &str| AssignmentError::InvalidSubscription {
        queue: queue.clone(),
        name: name.to_owned(),
        reason: reason.to_owned(),
    };
    if name == DEFAULT_SUBSCRIPTION {
        return Err(invalid("`default` names the subscription every queue has"));
    }
    if QueueName::new(name).is_err() {
        return Err(invalid("a name is 1 to 255 bytes of [A-Za-z0-9._-]"));
    }
    Ok(())
}

impl AssignmentTable {
    /// The update that adds subscription `name` to `queue`, starting at
    /// `start` on each partition.
    ///
    /// # Errors
    /// `QueueNotFound`, `InvalidSubscription` (bad or reserved name, the
    /// queue has the most it may), `SubscriptionExists`.
    pub fn plan_subscribe(
        &self,
        queue: QueueName,
        name: String,
        start: SubscriptionStart,
    ) -> Result<AssignmentUpdate, AssignmentError> {
        let entry =
            self.queues.get(&queue).ok_or_else(|| AssignmentError::QueueNotFound(queue.clone()))?;
        let id = SubscriptionId(entry.subscriptions.next_id);
        self.check_subscribe(&queue, &name, id)?;
        Ok(AssignmentUpdate {
            version: self.next_version(),
            change: AssignmentChange::Subscribe { queue, name, id, start },
        })
    }

    pub(super) fn check_subscribe(
        &self,
        queue: &QueueName,
        name: &str,
        id: SubscriptionId,
    ) -> Result<(), AssignmentError> {
        let entry =
            self.queues.get(queue).ok_or_else(|| AssignmentError::QueueNotFound(queue.clone()))?;
        check_name(queue, name)?;
        let subscriptions = &entry.subscriptions;
        if subscriptions.named.contains_key(name) {
            return Err(AssignmentError::SubscriptionExists {
                queue: queue.clone(),
                name: name.to_owned(),
            });
        }
        // The default counts against the limit too.
        if subscriptions.named.len() + 1 >= SUBSCRIPTIONS_PER_QUEUE_MAX {
            return Err(AssignmentError::InvalidSubscription {
                queue: queue.clone(),
                name: name.to_owned(),
                reason: format!(
                    "the queue has the most subscriptions it may ({SUBSCRIPTIONS_PER_QUEUE_MAX}, \
                     the default included)"
                ),
            });
        }
        if id.0 != subscriptions.next_id || id.0 == u16::MAX {
            return Err(AssignmentError::InvalidSubscription {
                queue: queue.clone(),
                name: name.to_owned(),
                reason: format!("id {} is not the next id {}", id.0, subscriptions.next_id),
            });
        }
        Ok(())
    }

    /// The update that deletes subscription `name` of `queue`.
    ///
    /// # Errors
    /// `QueueNotFound`, `SubscriptionNotFound`, `InvalidSubscription` for
    /// the default.
    pub fn plan_unsubscribe(
        &self,
        queue: QueueName,
        name: String,
    ) -> Result<AssignmentUpdate, AssignmentError> {
        self.check_unsubscribe(&queue, &name)?;
        Ok(AssignmentUpdate {
            version: self.next_version(),
            change: AssignmentChange::Unsubscribe { queue, name },
        })
    }

    pub(super) fn check_unsubscribe(
        &self,
        queue: &QueueName,
        name: &str,
    ) -> Result<(), AssignmentError> {
        let entry =
            self.queues.get(queue).ok_or_else(|| AssignmentError::QueueNotFound(queue.clone()))?;
        if name == DEFAULT_SUBSCRIPTION {
            return Err(AssignmentError::InvalidSubscription {
                queue: queue.clone(),
                name: name.to_owned(),
                reason: "the default subscription cannot be deleted".to_owned(),
            });
        }
        if !entry.subscriptions.named.contains_key(name) {
            return Err(AssignmentError::SubscriptionNotFound {
                queue: queue.clone(),
                name: name.to_owned(),
            });
        }
        Ok(())
    }

    /// The update that starts subscription `name` of `queue` over at
    /// `start` under the queue's next id (a rewind).
    ///
    /// # Errors
    /// As [`plan_unsubscribe`](Self::plan_unsubscribe).
    pub fn plan_reseek(
        &self,
        queue: QueueName,
        name: String,
        start: SubscriptionStart,
    ) -> Result<AssignmentUpdate, AssignmentError> {
        let entry =
            self.queues.get(&queue).ok_or_else(|| AssignmentError::QueueNotFound(queue.clone()))?;
        let id = SubscriptionId(entry.subscriptions.next_id);
        self.check_reseek(&queue, &name, id)?;
        Ok(AssignmentUpdate {
            version: self.next_version(),
            change: AssignmentChange::Reseek { queue, name, id, start },
        })
    }

    pub(super) fn check_reseek(
        &self,
        queue: &QueueName,
        name: &str,
        id: SubscriptionId,
    ) -> Result<(), AssignmentError> {
        self.check_unsubscribe(queue, name)?;
        let next_id = self.queues.get(queue).map_or(0, |entry| entry.subscriptions.next_id);
        if id.0 != next_id || id.0 == u16::MAX {
            return Err(AssignmentError::InvalidSubscription {
                queue: queue.clone(),
                name: name.to_owned(),
                reason: format!("id {} is not the next id {next_id}", id.0),
            });
        }
        Ok(())
    }

    pub(super) fn apply_subscription(&mut self, change: &AssignmentChange) {
        match change {
            AssignmentChange::Subscribe { queue, name, id, start }
            | AssignmentChange::Reseek { queue, name, id, start } => {
                if let Some(entry) = self.queues.get_mut(queue) {
                    let subscription = SubscriptionEntry { id: *id, start: *start };
                    entry.subscriptions.named.insert(name.clone(), subscription);
                    entry.subscriptions.next_id = id.0 + 1;
                }
            }
            AssignmentChange::Unsubscribe { queue, name } => {
                if let Some(entry) = self.queues.get_mut(queue) {
                    entry.subscriptions.named.remove(name);
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::queue::{QueueConfig, QueueId};

    fn table() -> AssignmentTable {
        let mut table = AssignmentTable::new(2);
        let name = QueueName::new("jobs").unwrap();
        let create =
            table.plan_create_queue(name, QueueId(1), 2, Arc::new(QueueConfig::default())).unwrap();
        table.apply(&create).unwrap();
        table
    }

    // Goal: a subscription's name is checked, unique and not `default`;
    // the count is bounded; only an existing one is deleted, never the
    // default; a stale id is refused at apply (a replayed or late update).
    // Method: plan each refusal; apply a subscribe carrying a wrong id.
    #[test]
    fn subscribe_and_unsubscribe_refuse_what_does_not_fit() {
        let mut table = table();
        let jobs = QueueName::new("jobs").unwrap();
        let plan = |table: &AssignmentTable, sub: &str| {
            table.plan_subscribe(jobs.clone(), sub.to_owned(), SubscriptionStart::Latest)
        };
        assert!(matches!(
            plan(&table, "default"),
            Err(AssignmentError::InvalidSubscription { .. })
        ));
        assert!(matches!(plan(&table, "a/b"), Err(AssignmentError::InvalidSubscription { .. })));
        let missing = table.plan_subscribe(
            QueueName::new("nope").unwrap(),
            "x".to_owned(),
            SubscriptionStart::Latest,
        );
        assert!(matches!(missing, Err(AssignmentError::QueueNotFound(_))));
        let first = plan(&table, "audit").unwrap();
        let stale = first.clone();
        table.apply(&first).unwrap();
        assert!(matches!(plan(&table, "audit"), Err(AssignmentError::SubscriptionExists { .. })));
        let replayed = AssignmentUpdate { version: table.next_version(), ..stale };
        assert!(table.apply(&replayed).is_err(), "a second subscribe of one name");
        for n in 0..SUBSCRIPTIONS_PER_QUEUE_MAX - 2 {
            let update = plan(&table, &format!("s{n}")).unwrap();
            table.apply(&update).unwrap();
        }
        let full = plan(&table, "one-more");
        assert!(matches!(full, Err(AssignmentError::InvalidSubscription { .. })), "{full:?}");
        let gone = table.plan_unsubscribe(jobs.clone(), "nope".to_owned());
        assert!(matches!(gone, Err(AssignmentError::SubscriptionNotFound { .. })));
        let default = table.plan_unsubscribe(jobs.clone(), "default".to_owned());
        assert!(matches!(default, Err(AssignmentError::InvalidSubscription { .. })));
        let delete = table.plan_unsubscribe(jobs.clone(), "audit".to_owned()).unwrap();
        table.apply(&delete).unwrap();
        assert_eq!(table.queue(&jobs).unwrap().subscriptions.id("audit"), None);
    }

    // Goal: a rewind keeps the name and the count but gives the next id
    // (never one used before) and the new start; only an existing, named
    // subscription is rewound; a stale rewind is refused at apply.
    // Method: subscribe, rewind twice, check ids and refusals.
    #[test]
    fn a_reseek_gives_the_next_id_and_the_new_start() {
        let mut table = table();
        let jobs = QueueName::new("jobs").unwrap();
        let first = table
            .plan_subscribe(jobs.clone(), "audit".to_owned(), SubscriptionStart::Latest)
            .unwrap();
        table.apply(&first).unwrap();
        let subs = |table: &AssignmentTable| table.queue(&jobs).unwrap().subscriptions.clone();
        assert_eq!(subs(&table).id("audit"), Some(SubscriptionId(1)));
        let rewind = table
            .plan_reseek(jobs.clone(), "audit".to_owned(), SubscriptionStart::Earliest)
            .unwrap();
        let stale = rewind.clone();
        table.apply(&rewind).unwrap();
        let after = subs(&table);
        assert_eq!(after.named.len(), 1);
        assert_eq!(after.id("audit"), Some(SubscriptionId(2)));
        assert_eq!(after.named["audit"].start, SubscriptionStart::Earliest);
        let replayed = AssignmentUpdate { version: table.next_version(), ..stale };
        assert!(table.apply(&replayed).is_err(), "a stale rewind names a used id");
        let by_time = table
            .plan_reseek(jobs.clone(), "audit".to_owned(), SubscriptionStart::Time(5))
            .unwrap();
        table.apply(&by_time).unwrap();
        assert_eq!(subs(&table).id("audit"), Some(SubscriptionId(3)));
        for (name, refused) in [("default", "invalid"), ("nope", "not found")] {
            let plan = table.plan_reseek(jobs.clone(), name.to_owned(), SubscriptionStart::Latest);
            match (refused, plan) {
                ("invalid", Err(AssignmentError::InvalidSubscription { .. }))
                | ("not found", Err(AssignmentError::SubscriptionNotFound { .. })) => {}
                (_, other) => panic!("{name}: {other:?}"),
            }
        }
    }
}
