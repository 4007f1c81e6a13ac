//! `spool cluster nodes`: every node's health as the controller's leader
//! sees it (`GET /v1/cluster/nodes` on the admin ports given;
//! `docs/operations.md`, "Node health").
//!
//! Only the controller's leader hears from every node, so the command asks
//! each admin port given (`--admin A,B,C`, at once, each bounded by
//! `--timeout-ms`) and prints the view of the one that leads. It exits with
//! [`EXIT_UNHEALTHY`] after printing when a node is down, or when no node
//! given leads the controller (then it says which node the others name as
//! leader, whose admin port to add).

use std::time::Duration;

use serde_json::{json, Value};
use spool_client::{Credentials, TlsConfig};

use crate::acl::{admin_call, AdminAddr};
use crate::cluster::{ask_each, StatusArgs};
use crate::render::{Output, Table};
use crate::Failure;

/// What one admin port answered.
type Answer = (String, Result<Value, String>);

/// The report: the leader's view when an answer has one.
#[derive(Debug)]
pub struct Nodes {
    leader_view: Option<(String, Value)>,
    /// Nodes that did not answer, with why.
    unreachable: Vec<(String, String)>,
    /// Leaders the non-leading nodes named.
    named_leaders: Vec<u64>,
}

/// Picks the leader's view among the answers.
pub fn pick(answers: Vec<Answer>) -> Nodes {
    let mut nodes = Nodes { leader_view: None, unreachable: Vec::new(), named_leaders: Vec::new() };
    for (admin, answer) in answers {
        match answer {
            Err(error) => nodes.unreachable.push((admin, error)),
            Ok(view) if view["leads"].as_bool() == Some(true) => {
                // Two leaders of different terms: the higher term's is current.
                let newer = nodes
                    .leader_view
                    .as_ref()
                    .is_none_or(|(_, known)| view["term"].as_u64() > known["term"].as_u64());
                if newer {
                    nodes.leader_view = Some((admin, view));
                }
            }
            Ok(view) => {
                if let Some(leader) = view["controller_leader"].as_u64() {
                    if !nodes.named_leaders.contains(&leader) {
                        nodes.named_leaders.push(leader);
                    }
                }
            }
        }
    }
    nodes
}

impl Nodes {
    /// The nodes the leader counts down.
    pub fn down(&self) -> Vec<u64> {
        let Some((_, view)) = &self.leader_view else { return Vec::new() };
        view["nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|node| node["state"] == "down")
            .filter_map(|node| node["node"].as_u64())
            .collect()
    }

    /// Why the command fails, if it does.
    pub fn failure_summary(&self) -> Option<String> {
        if self.leader_view.is_none() {
            let named = match self.named_leaders.as_slice() {
                [] => "none of them knows a leader (an election runs?)".to_owned(),
                leaders => format!("they name node {leaders:?} as leader: add its admin port"),
            };
            return Some(format!("no node given leads the controller; {named}"));
        }
        let down = self.down();
        (!down.is_empty()).then(|| format!("cluster nodes: node(s) {down:?} down"))
    }

    fn render(&self) -> Output {
        let unreachable: Vec<Value> = self
            .unreachable
            .iter()
            .map(|(admin, error)| json!({ "admin": admin, "error": error }))
            .collect();
        let Some((admin, view)) = &self.leader_view else {
            let json = json!({ "leader": null, "named_leaders": self.named_leaders,
                               "unreachable": unreachable });
            return Output::message("no controller leader among the nodes given".to_owned(), json);
        };
        let mut table = Table::new(vec!["node", "state", "silent_s", "role", "heard"]);
        for node in view["nodes"].as_array().into_iter().flatten() {
            let silent_ms = node["silent_ms"].as_u64().unwrap_or(0);
            table.push(vec![
                node["node"].to_string(),
                node["state"].as_str().unwrap_or("?").to_owned(),
                format!("{}.{}", silent_ms / 1000, silent_ms % 1000 / 100),
                if node["voter"] == true { "voter" } else { "learner" }.to_owned(),
                if node["heard"] == true { "yes" } else { "no" }.to_owned(),
            ]);
        }
        let json = json!({ "leader": view, "leader_admin": admin, "unreachable": unreachable });
        Output::table(table, json)
    }
}

/// `spool cluster nodes`.
pub async fn run(
    args: &StatusArgs,
    tls: Option<&TlsConfig>,
    credentials: Option<&Credentials>,
    timeout: Duration,
) -> Result<Output, Failure> {
    let answers = ask_each(args, |admin| {
        let (tls, credentials) = (tls.cloned(), credentials.cloned());
        async move {
            let addr = AdminAddr { admin };
            let path = "/v1/cluster/nodes";
            let answer =
                admin_call(&addr, tls.as_ref(), "GET", path, credentials.as_ref(), timeout).await;
            answer.map_err(|failure| match failure {
                Failure::Admin(message, _) | Failure::Input(message) => message,
                other => format!("{other:?}"),
            })
        }
    })
    .await?;
    let nodes = pick(answers);
    let output = nodes.render();
    match nodes.failure_summary() {
        None => Ok(output),
        Some(summary) => Err(Failure::Unhealthy(Box::new(output), summary)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(node: u64, leads: bool, term: u64, down: &[u64]) -> Value {
        let nodes: Vec<Value> = if leads {
            (1..=4)
                .map(|id| {
                    let state = if down.contains(&id) { "down" } else { "up" };
                    json!({ "node": id, "state": state, "silent_ms": 0, "heard": true,
                            "voter": id <= 3 })
                })
                .collect()
        } else {
            Vec::new()
        };
        json!({ "node": node, "controller_leader": 2, "leads": leads, "term": term,
                "down_after_ms": 30000, "nodes": nodes })
    }

    // Goal: the leader's view is taken (the newest term's), a down node or
    // no leader fails the command, naming the leader the others know.
    #[test]
    fn the_leaders_view_is_taken_and_down_nodes_fail_the_command() {
        let answers = vec![
            ("a".to_owned(), Ok(view(1, false, 3, &[]))),
            ("b".to_owned(), Ok(view(2, true, 3, &[4]))),
            ("c".to_owned(), Ok(view(3, true, 2, &[]))),
            ("d".to_owned(), Err("connection refused".to_owned())),
        ];
        let nodes = pick(answers);
        assert_eq!(nodes.leader_view.as_ref().map(|(admin, _)| admin.as_str()), Some("b"));
        assert_eq!(nodes.down(), [4]);
        assert_eq!(nodes.failure_summary().unwrap(), "cluster nodes: node(s) [4] down");
        assert_eq!(nodes.unreachable.len(), 1);

        let healthy = pick(vec![("b".to_owned(), Ok(view(2, true, 3, &[])))]);
        assert_eq!(healthy.failure_summary(), None);

        let leaderless = pick(vec![("a".to_owned(), Ok(view(1, false, 3, &[])))]);
        let summary = leaderless.failure_summary().unwrap();
        assert!(summary.contains("node [2]"), "{summary}");
    }
}
