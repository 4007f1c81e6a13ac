//! The admin port's route table: every method and path it serves, and
//! nothing else. The router dispatches only through [`ROUTES`], and a test
//! checks that `docs/openapi.json` lists exactly these.

use hyper::Method;

/// What a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Metrics,
    Live,
    Ready,
    ListQueues,
    CreateQueue,
    DescribeQueue,
    DeleteQueue,
    Send,
    Claim,
    Ack,
    Extend,
    Release,
    DeadLetters,
    Redrive,
    Purge,
    ResizeQueue,
    ReloadAuth,
    Acl,
    Quotas,
    ClusterNodes,
    ClusterPartitions,
    ClusterMove,
    ListSubscriptions,
    CreateSubscription,
    DescribeSubscription,
    DeleteSubscription,
    SeekSubscription,
}

/// One served route: `{queue}` (and `{name}`, a subscription) in a path
/// matches one non-empty segment.
#[derive(Debug, Clone)]
pub struct Route {
    pub method: Method,
    pub path: &'static str,
    pub operation: Operation,
}

const fn route(method: Method, path: &'static str, operation: Operation) -> Route {
    Route { method, path, operation }
}

/// Every route of the admin port.
pub const ROUTES: &[Route] = &[
    route(Method::GET, "/metrics", Operation::Metrics),
    route(Method::GET, "/health/live", Operation::Live),
    route(Method::GET, "/health/ready", Operation::Ready),
    route(Method::GET, "/v1/queues", Operation::ListQueues),
    route(Method::POST, "/v1/queues", Operation::CreateQueue),
    route(Method::GET, "/v1/queues/{queue}", Operation::DescribeQueue),
    route(Method::DELETE, "/v1/queues/{queue}", Operation::DeleteQueue),
    route(Method::POST, "/v1/queues/{queue}/messages", Operation::Send),
    route(Method::POST, "/v1/queues/{queue}/claims", Operation::Claim),
    route(Method::POST, "/v1/acks", Operation::Ack),
    route(Method::POST, "/v1/extends", Operation::Extend),
    route(Method::POST, "/v1/releases", Operation::Release),
    route(Method::GET, "/v1/queues/{queue}/dead-letters", Operation::DeadLetters),
    route(Method::POST, "/v1/queues/{queue}/redrive", Operation::Redrive),
    route(Method::POST, "/v1/queues/{queue}/purge", Operation::Purge),
    route(Method::POST, "/v1/queues/{queue}/resize", Operation::ResizeQueue),
    route(Method::GET, "/v1/queues/{queue}/subscriptions", Operation::ListSubscriptions),
    route(Method::POST, "/v1/queues/{queue}/subscriptions", Operation::CreateSubscription),
    route(Method::GET, "/v1/queues/{queue}/subscriptions/{name}", Operation::DescribeSubscription),
    route(Method::DELETE, "/v1/queues/{queue}/subscriptions/{name}", Operation::DeleteSubscription),
    route(
        Method::POST,
        "/v1/queues/{queue}/subscriptions/{name}/seek",
        Operation::SeekSubscription,
    ),
    route(Method::POST, "/v1/auth/reload", Operation::ReloadAuth),
    route(Method::GET, "/v1/acl", Operation::Acl),
    route(Method::GET, "/v1/quotas", Operation::Quotas),
    route(Method::GET, "/v1/cluster/nodes", Operation::ClusterNodes),
    route(Method::GET, "/v1/cluster/partitions", Operation::ClusterPartitions),
    route(Method::POST, "/v1/cluster/move", Operation::ClusterMove),
];

/// Why a request matched no route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unrouted {
    /// No route has this path.
    NotFound,
    /// The path is served, with these methods only.
    MethodNotAllowed(Vec<Method>),
}

/// The queue named by a path's `{queue}` segment, if it has one; for a
/// route with a `{name}` segment too, `queue/name` (neither may hold `/`).
pub type QueueSegment = Option<String>;

/// Finds the route of `method` `path`.
///
/// # Errors
/// [`Unrouted`] when no route matches.
pub fn resolve(method: &Method, path: &str) -> Result<(Operation, QueueSegment), Unrouted> {
    let mut allowed = Vec::new();
    for route in ROUTES {
        let Some(queue) = matches(route.path, path) else { continue };
        if route.method == method {
            return Ok((route.operation, queue));
        }
        allowed.push(route.method.clone());
    }
    if allowed.is_empty() {
        Err(Unrouted::NotFound)
    } else {
        Err(Unrouted::MethodNotAllowed(allowed))
    }
}

/// `Some(queue segment)` when `path` matches `pattern`.
fn matches(pattern: &str, path: &str) -> Option<QueueSegment> {
    let mut queue = None;
    let mut want = pattern.split('/');
    let mut have = path.split('/');
    loop {
        match (want.next(), have.next()) {
            (None, None) => return Some(queue),
            (Some("{queue}"), Some(segment)) if !segment.is_empty() => {
                queue = Some(segment.to_owned());
            }
            (Some("{name}"), Some(segment)) if !segment.is_empty() => {
                queue = queue.map(|queue| format!("{queue}/{segment}"));
            }
            (Some(want), Some(have)) if want == have => {}
            _ => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: the table resolves what it lists, names the allowed methods of
    // a served path, and refuses near misses. Method: spot checks.
    #[test]
    fn resolves_routes_and_refuses_near_misses() {
        assert_eq!(
            resolve(&Method::POST, "/v1/queues/jobs/claims"),
            Ok((Operation::Claim, Some("jobs".to_owned())))
        );
        assert_eq!(resolve(&Method::GET, "/v1/queues"), Ok((Operation::ListQueues, None)));
        assert_eq!(
            resolve(&Method::PUT, "/v1/queues/jobs"),
            Err(Unrouted::MethodNotAllowed(vec![Method::GET, Method::DELETE]))
        );
        assert_eq!(resolve(&Method::GET, "/v1/queues/"), Err(Unrouted::NotFound));
        assert_eq!(resolve(&Method::GET, "/v1/queues/a/b"), Err(Unrouted::NotFound));
        assert_eq!(resolve(&Method::POST, "/v1/acks/"), Err(Unrouted::NotFound));
        assert_eq!(
            resolve(&Method::POST, "/metrics"),
            Err(Unrouted::MethodNotAllowed(vec![Method::GET]))
        );
    }

    // Goal: docs/openapi.json describes exactly the routes served: same
    // paths, same methods, no more and no fewer. Method: read the document
    // and compare both sets.
    #[test]
    fn openapi_document_lists_exactly_the_served_routes() {
        let text = include_str!("../../../../docs/openapi.json");
        let document: serde_json::Value = serde_json::from_str(text).expect("openapi.json parses");
        assert!(document["openapi"].as_str().is_some_and(|version| version.starts_with("3.")));
        let mut documented = std::collections::BTreeSet::new();
        let paths = document["paths"].as_object().expect("paths");
        for (path, item) in paths {
            for method in item.as_object().expect("path item").keys() {
                if ["get", "post", "put", "delete", "patch", "head", "options"]
                    .contains(&method.as_str())
                {
                    documented.insert((method.to_uppercase(), path.clone()));
                }
            }
        }
        let served: std::collections::BTreeSet<(String, String)> = ROUTES
            .iter()
            .map(|route| (route.method.as_str().to_owned(), route.path.to_owned()))
            .collect();
        assert_eq!(documented, served);
    }
}
