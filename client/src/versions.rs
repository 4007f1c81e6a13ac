//! Which api version the client sends each request as: the newest its
//! codec speaks unless an older one does the same job, so a request that
//! needs nothing new reaches brokers from before that version too.

use spool_wire::proto::{
    Request, CLAIM_VERSION_NOT_LEADER, CREATE_QUEUE_VERSION_ORDERED,
    CREATE_QUEUE_VERSION_RETENTION, DESCRIBE_QUEUE_VERSION_SUBSCRIPTIONS,
    INSPECT_VERSION_SUBSCRIPTION,
};

/// The version this client sends `request` as: the newest its codec
/// speaks, except a Claim that names no subscription, which goes as
/// [`CLAIM_VERSION_NOT_LEADER`] (v2, the newest a broker from before
/// subscriptions speaks): only a claim for a named subscription needs
/// [`CLAIM_VERSION_SUBSCRIPTION`](spool_wire::proto::CLAIM_VERSION_SUBSCRIPTION),
/// so the default one is claimed from old
/// and new brokers alike. A DescribeQueue goes as v1 for the same reason:
/// only a caller that wants the subscriptions asks
/// [`DESCRIBE_QUEUE_VERSION_SUBSCRIPTIONS`] by name (as
/// [`Admin::describe_queue`](crate::Admin::describe_queue) does, falling
/// back to v1 when the broker does not speak it). Peek, DeadLetters,
/// Purge and Redrive go as v1 unless they name a subscription, which needs
/// [`INSPECT_VERSION_SUBSCRIPTION`] (v2). A CreateQueue goes as v1 unless
/// its queue has a retention window, which needs
/// [`CREATE_QUEUE_VERSION_RETENTION`] (v2): a broker from before windows
/// refuses that version (`UNSUPPORTED_VERSION`) rather than create the
/// queue without its window; an ordered queue goes as
/// [`CREATE_QUEUE_VERSION_ORDERED`] (v3) for the same reason.
/// An Enqueue goes as the newest, v3 (it may be answered
/// `ACTIVE_KEYS_FULL`); the connection sends it again as v2 to a broker
/// that predates v3 (`Connection`'s enqueue fallback).
pub fn request_version(request: &Request<'_>) -> u16 {
    let inspect_default = INSPECT_VERSION_SUBSCRIPTION - 1;
    match request {
        Request::CreateQueue(create) if create.config.ordered => CREATE_QUEUE_VERSION_ORDERED,
        Request::CreateQueue(create) if create.config.has_window() => {
            CREATE_QUEUE_VERSION_RETENTION
        }
        Request::CreateQueue(_) => CREATE_QUEUE_VERSION_RETENTION - 1,
        Request::Claim(claim) if claim.subscription.is_empty() => CLAIM_VERSION_NOT_LEADER,
        Request::DescribeQueue(_) => DESCRIBE_QUEUE_VERSION_SUBSCRIPTIONS - 1,
        Request::Peek(peek) if peek.subscription.is_empty() => inspect_default,
        Request::DeadLetters(list) if list.subscription.is_empty() => inspect_default,
        Request::Purge(purge) if purge.subscription.is_empty() => inspect_default,
        Request::Redrive(redrive) if redrive.subscription.is_empty() => inspect_default,
        other => other.api_key().max_version(),
    }
}
