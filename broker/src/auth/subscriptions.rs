//! ACL rules that name a subscription (`docs/design/subscriptions.md` §6):
//! an entry `queue/sub` in a rule's `queues` grants its operations within
//! the subscriptions `sub` names of the queues `queue` names, and nowhere
//! else. Both halves are patterns like a queue pattern: an exact name, a
//! prefix (`audit*`) or `*`. Only `claim` may be granted this way (with it
//! the acks, extends and releases of that subscription's deliveries): it is
//! the one operation that acts within one subscription; peeks, purges,
//! redrives and admin act on a queue as a whole and need a rule without a
//! subscription. A rule without `/` covers every subscription of its
//! queues, as before subscriptions existed.

use spool_wire::proto::{validate_subscription_name, DEFAULT_SUBSCRIPTION};

use super::{Grants, Operation, QueuePattern};

/// One compiled rule naming subscriptions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SubscriptionRule {
    pub(super) queues: QueuePattern,
    pub(super) subscriptions: QueuePattern,
    pub(super) mask: u8,
}

/// The operations a rule naming a subscription may grant.
const SUBSCRIPTION_RIGHTS: u8 = Operation::Claim.bit();

impl SubscriptionRule {
    /// Parses `queue/sub` (the text after the first `/` is the
    /// subscription pattern) granting `mask`; `None` when `text` names no
    /// subscription.
    pub(super) fn parse(text: &str, mask: u8) -> Option<Result<Self, String>> {
        let (queue, sub) = text.split_once('/')?;
        Some(Self::parse_parts(text, queue, sub, mask))
    }

    fn parse_parts(text: &str, queue: &str, sub: &str, mask: u8) -> Result<Self, String> {
        if mask & !SUBSCRIPTION_RIGHTS != 0 {
            return Err(format!(
                "{text:?} names a subscription, so it may grant only claim (peek, purge, \
                 redrive, describe and admin act on a queue as a whole: grant them on {queue:?})"
            ));
        }
        let queues = QueuePattern::parse(queue)?;
        let subscriptions = match sub.strip_suffix('*') {
            Some("") => QueuePattern::Any,
            Some(stem) => {
                validate_subscription_name(stem)
                    .map_err(|error| format!("subscription pattern {sub:?}: {error}"))?;
                QueuePattern::Prefix(stem.to_owned())
            }
            None => {
                validate_subscription_name(sub)
                    .map_err(|error| format!("subscription pattern {sub:?}: {error}"))?;
                QueuePattern::Exact(sub.to_owned())
            }
        };
        Ok(Self { queues, subscriptions, mask })
    }

    /// `queue/sub` as written (patterns in their text form).
    pub(super) fn text(&self) -> String {
        format!("{}/{}", self.queues, self.subscriptions)
    }
}

impl Grants {
    /// Whether the principal may do `operation` within subscription `sub`
    /// (its name; empty: the default) of `queue`: a right on the queue as a
    /// whole, or a rule naming the subscription.
    pub fn allows_in(&self, queue: &str, sub: &str, operation: Operation) -> bool {
        self.allows(queue, operation) || self.allows_only_in(queue, sub, operation)
    }

    /// Whether a rule naming subscription `sub` of `queue` grants
    /// `operation` (rights on the whole queue not counted).
    pub fn allows_only_in(&self, queue: &str, sub: &str, operation: Operation) -> bool {
        let sub = if sub.is_empty() { DEFAULT_SUBSCRIPTION } else { sub };
        self.sub_rules.iter().any(|rule| {
            rule.mask & operation.bit() != 0
                && rule.queues.matches(queue)
                && rule.subscriptions.matches(sub)
        })
    }

    /// Whether any rule of the principal names a subscription.
    pub fn names_subscriptions(&self) -> bool {
        !self.sub_rules.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::AuthPolicy;
    use super::*;

    fn policy(acl: &str) -> Result<AuthPolicy, String> {
        let hash = super::super::hash_secret("s3cret").map_err(|error| error.to_string())?;
        let text =
            format!("[[principals]]\nname = \"reporter\"\nsecret_hash = \"{hash}\"\n\n{acl}");
        AuthPolicy::from_toml(&text, Path::new("auth.toml")).map_err(|error| error.to_string())
    }

    // Goal: `queue/sub` grants claim within the named subscriptions only,
    // patterns work on both halves, a rule without a subscription still
    // covers every subscription, and a rule naming one may grant nothing
    // but claim. Method: compile small files and ask.
    #[test]
    fn a_rule_naming_a_subscription_grants_claim_there_only() {
        let acl = "[[acl]]\nprincipal = \"reporter\"\nqueues = [\"events/report*\", \"jobs*/default\"]\noperations = [\"claim\"]\n\n[[acl]]\nprincipal = \"reporter\"\nqueues = [\"audit\"]\noperations = [\"claim\", \"describe\"]\n";
        let compiled = policy(acl).unwrap();
        let (_, grants) = compiled.principal("reporter").unwrap();
        assert!(grants.names_subscriptions());
        assert!(grants.allows_in("events", "report", Operation::Claim));
        assert!(grants.allows_in("events", "reporting-eu", Operation::Claim));
        assert!(!grants.allows_in("events", "billing", Operation::Claim));
        assert!(!grants.allows_in("events", "", Operation::Claim), "the default is not report*");
        assert!(!grants.allows("events", Operation::Claim), "no right on the queue as a whole");
        assert!(grants.allows_in("jobs-eu", "", Operation::Claim), "empty names the default");
        assert!(grants.allows_in("jobs-eu", "default", Operation::Claim));
        assert!(!grants.allows_in("jobs-eu", "other", Operation::Claim));
        assert!(!grants.allows_in("events", "report", Operation::Describe));
        // A rule without a subscription: every subscription of its queue.
        assert!(grants.allows_in("audit", "anything", Operation::Claim));
        assert!(grants.allows_in("audit", "", Operation::Describe));
        let view = grants.view();
        let texts: Vec<&str> = view.rules.iter().map(|rule| rule.queues.as_str()).collect();
        assert!(texts.contains(&"events/report*") && texts.contains(&"jobs*/default"), "{texts:?}");

        for (bad, why) in [
            ("[\"events/report\"]\noperations = [\"claim\", \"peek\"]", "only claim"),
            ("[\"events/\"]\noperations = [\"claim\"]", "subscription pattern"),
            ("[\"events/a b\"]\noperations = [\"claim\"]", "subscription pattern"),
            ("[\"/report\"]\noperations = [\"claim\"]", "queue pattern"),
        ] {
            let acl = format!("[[acl]]\nprincipal = \"reporter\"\nqueues = {bad}\n");
            let error = policy(&acl).unwrap_err();
            assert!(error.contains(why), "{bad}: {error}");
        }
    }
}
