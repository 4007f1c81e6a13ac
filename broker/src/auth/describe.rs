//! What an operator may see of the loaded policy: the compiled rules of
//! every principal and the rights one principal has on one queue
//! (`GET /v1/acl`, `spool acl`). Never a secret or a hash.

use serde::Serialize;

use super::{AuthPolicy, Grants, Operation, QueuePattern, ALL_RIGHTS};

/// The names of the operations in `mask`, in [`Operation::ALL`] order.
pub fn operation_names(mask: u8) -> Vec<&'static str> {
    Operation::ALL
        .iter()
        .filter(|operation| mask & operation.bit() != 0)
        .map(|operation| operation.as_str())
        .collect()
}

/// One compiled rule: a queue pattern and the operations it grants.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RuleView {
    /// `*`, `prefix*` or an exact name; `queue/sub` for a rule naming
    /// subscriptions.
    pub queues: String,
    pub operations: Vec<&'static str>,
}

/// One principal's compiled rules (its `*` rules merged into one).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PrincipalView {
    pub name: String,
    pub rules: Vec<RuleView>,
}

impl std::fmt::Display for QueuePattern {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QueuePattern::Any => formatter.write_str("*"),
            QueuePattern::Prefix(stem) => write!(formatter, "{stem}*"),
            QueuePattern::Exact(name) => formatter.write_str(name),
        }
    }
}

impl Grants {
    /// Whether a `*` rule gives `operation` (a right on every queue, the
    /// ones created later included): what the broker-wide operations of the
    /// admin port (auth reload, ACL listing, quotas) require.
    pub fn allows_everywhere(&self, operation: Operation) -> bool {
        self.everywhere & operation.bit() != 0
    }

    /// The compiled rules, `*` first.
    pub fn view(&self) -> PrincipalView {
        let mut rules = Vec::with_capacity(self.rules.len() + 1);
        if self.everywhere != 0 {
            rules.push(RuleView {
                queues: QueuePattern::Any.to_string(),
                operations: operation_names(self.everywhere),
            });
        }
        rules.extend(self.rules.iter().map(|(pattern, mask)| RuleView {
            queues: pattern.to_string(),
            operations: operation_names(*mask),
        }));
        rules.extend(
            self.sub_rules.iter().map(|rule| RuleView {
                queues: rule.text(),
                operations: operation_names(rule.mask),
            }),
        );
        PrincipalView { name: self.name.clone(), rules }
    }
}

impl AuthPolicy {
    /// Every principal's compiled rules, by name; empty when off.
    pub fn describe(&self) -> Vec<PrincipalView> {
        let Some(policy) = self.policy.as_ref() else { return Vec::new() };
        policy.principals.values().map(|principal| principal.grants.view()).collect()
    }

    /// The operations `principal` may do on `queue`: `None` for a principal
    /// the policy does not name; every operation while authentication is
    /// off.
    pub fn rights_of(&self, principal: &str, queue: &str) -> Option<Vec<&'static str>> {
        if !self.is_enabled() {
            return Some(operation_names(ALL_RIGHTS));
        }
        let (_, grants) = self.principal(principal)?;
        Some(operation_names(grants.mask(queue)))
    }

    /// How many compiled rules the policy holds.
    pub fn rule_count(&self) -> usize {
        self.describe().iter().map(|principal| principal.rules.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    // Goal: the view shows each principal's patterns and operations as the
    // file gave them (`*` rules merged), answers one principal's rights on
    // one queue with the broker's own matching, and never shows a hash.
    #[test]
    fn the_view_shows_rules_and_no_hash() {
        let hash = super::super::hash_secret("s3cret").unwrap();
        let text = format!(
            r#"
            [[principals]]
            name = "worker"
            secret_hash = "{hash}"
            [[acl]]
            principal = "worker"
            queues = ["jobs", "mail*"]
            operations = ["claim", "describe"]
            [[acl]]
            principal = "worker"
            queues = ["*"]
            operations = ["peek"]
            "#
        );
        let policy = AuthPolicy::from_toml(&text, Path::new("auth.toml")).unwrap();
        let view = policy.describe();
        assert_eq!(view.len(), 1);
        assert_eq!(view[0].name, "worker");
        let rules: Vec<(String, Vec<&str>)> = view[0]
            .rules
            .iter()
            .map(|rule| (rule.queues.clone(), rule.operations.clone()))
            .collect();
        assert_eq!(
            rules,
            vec![
                ("*".to_owned(), vec!["peek"]),
                ("jobs".to_owned(), vec!["claim", "describe"]),
                ("mail*".to_owned(), vec!["claim", "describe"]),
            ]
        );
        let shown = serde_json::to_string(&view).unwrap();
        assert!(!shown.contains("argon2"), "{shown}");
        assert_eq!(policy.rights_of("worker", "mail-out"), Some(vec!["claim", "peek", "describe"]));
        assert_eq!(policy.rights_of("worker", "other"), Some(vec!["peek"]));
        assert_eq!(policy.rights_of("nobody", "jobs"), None);
        assert_eq!(policy.rule_count(), 3);
        let (_, grants) = policy.principal("worker").unwrap();
        assert!(grants.allows_everywhere(Operation::Peek));
        assert!(!grants.allows_everywhere(Operation::Claim), "a named queue is not everywhere");
        assert_eq!(AuthPolicy::off().rights_of("anyone", "q").map(|ops| ops.len()), Some(7));
    }
}
