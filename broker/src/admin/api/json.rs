//! The JSON bodies of the API: requests (serde, unknown fields refused) and
//! the renderings of the protocol's answers.

use std::collections::BTreeMap;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use spool_client::spool_wire::proto::{
    Backoff, BackoffKind, DeadLetter, LaneStats, PartitionStats, QueueConfig,
};
use spool_client::{default_queue_config, Delivery, PayloadView};

use super::error::ApiError;

/// `POST /v1/queues`. Every field but `name` defaults to the client
/// library's defaults ([`default_queue_config`]).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateQueue {
    pub name: String,
    #[serde(default = "one")]
    pub partitions: u32,
    pub priority_bands: Option<u8>,
    pub lease_default_ms: Option<u32>,
    pub lease_min_ms: Option<u32>,
    pub lease_max_ms: Option<u32>,
    pub max_lease_lifetime_ms: Option<u64>,
    pub max_deliveries: Option<u32>,
    pub backoff: Option<BackoffBody>,
    pub dedupe_window_ms: Option<u64>,
    pub max_messages: Option<u64>,
    pub max_bytes: Option<u64>,
    pub dead_letter_on_expiry: Option<bool>,
    /// Retention window by time (ms); none when absent or 0.
    pub retention_ms: Option<u64>,
    /// Retention window by size (bytes); none when absent or 0.
    pub retention_bytes: Option<u64>,
    /// Ordered lanes (`docs/design/ordered-lanes.md`): per routing key one
    /// message at a time, in order. Default false; set at creation only.
    pub ordered: Option<bool>,
}

fn one() -> u32 {
    1
}

/// A release backoff policy.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackoffBody {
    pub kind: BackoffKindBody,
    pub base_ms: u32,
    pub cap_ms: u32,
}

/// `linear` or `exponential`.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackoffKindBody {
    Linear,
    Exponential,
}

impl CreateQueue {
    /// The protocol's config: the defaults with every given field over them.
    pub fn config(&self) -> QueueConfig {
        let mut config = default_queue_config(self.partitions);
        let set = |field: &mut u32, value: Option<u32>| *field = value.unwrap_or(*field);
        set(&mut config.lease_default_ms, self.lease_default_ms);
        set(&mut config.lease_min_ms, self.lease_min_ms);
        set(&mut config.lease_max_ms, self.lease_max_ms);
        set(&mut config.max_deliveries, self.max_deliveries);
        config.priority_bands = self.priority_bands.unwrap_or(config.priority_bands);
        config.max_lease_lifetime_ms =
            self.max_lease_lifetime_ms.unwrap_or(config.max_lease_lifetime_ms);
        config.dedupe_window_ms = self.dedupe_window_ms.unwrap_or(config.dedupe_window_ms);
        config.max_messages = self.max_messages.unwrap_or(config.max_messages);
        config.max_bytes = self.max_bytes.unwrap_or(config.max_bytes);
        config.dead_letter_on_expiry =
            self.dead_letter_on_expiry.unwrap_or(config.dead_letter_on_expiry);
        config.retention_ms = self.retention_ms.unwrap_or(config.retention_ms);
        config.retention_bytes = self.retention_bytes.unwrap_or(config.retention_bytes);
        config.ordered = self.ordered.unwrap_or(config.ordered);
        if let Some(backoff) = &self.backoff {
            config.backoff = Backoff {
                kind: match backoff.kind {
                    BackoffKindBody::Linear => BackoffKind::Linear,
                    BackoffKindBody::Exponential => BackoffKind::Exponential,
                },
                base_ms: backoff.base_ms,
                cap_ms: backoff.cap_ms,
            };
        }
        config
    }
}

/// `POST /v1/queues/{q}/messages`: one message. Exactly one of `payload`
/// (UTF-8 text) and `payload_base64`; at most one of `delay_ms` and
/// `not_before_ms`, and of `expiry_ms` and `ttl_ms`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SendMessage {
    pub payload: Option<String>,
    pub payload_base64: Option<String>,
    pub key: Option<String>,
    /// 32 hex digits: the dedupe identity (random when absent).
    pub id: Option<String>,
    pub priority: Option<u8>,
    pub delay_ms: Option<u64>,
    pub not_before_ms: Option<u64>,
    pub expiry_ms: Option<u64>,
    pub ttl_ms: Option<u64>,
    pub headers: Option<BTreeMap<String, String>>,
}

impl SendMessage {
    /// The payload bytes.
    ///
    /// # Errors
    /// `INVALID_ARGUMENT` unless exactly one of the two forms is given and
    /// the base64 decodes.
    pub fn payload_bytes(&self) -> Result<Vec<u8>, ApiError> {
        match (&self.payload, &self.payload_base64) {
            (Some(text), None) => Ok(text.as_bytes().to_vec()),
            (None, Some(encoded)) => STANDARD
                .decode(encoded)
                .map_err(|error| ApiError::invalid(format!("payload_base64: {error}"))),
            _ => Err(ApiError::invalid("give exactly one of payload and payload_base64")),
        }
    }

    /// The message id, if given.
    ///
    /// # Errors
    /// `INVALID_ARGUMENT` unless it is 32 hex digits.
    pub fn message_id(&self) -> Result<Option<[u8; 16]>, ApiError> {
        let Some(text) = &self.id else { return Ok(None) };
        let invalid = || ApiError::invalid("id must be 32 hex digits");
        if text.len() != 32 {
            return Err(invalid());
        }
        let mut id = [0u8; 16];
        for (index, byte) in id.iter_mut().enumerate() {
            let pair = text.get(index * 2..index * 2 + 2).ok_or_else(invalid)?;
            *byte = u8::from_str_radix(pair, 16).map_err(|_| invalid())?;
        }
        Ok(Some(id))
    }
}

/// `POST /v1/queues/{q}/claims`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Claim {
    pub credits: Option<u32>,
    pub lease_ms: Option<u32>,
    pub wait_ms: Option<u32>,
    pub max_bytes: Option<u32>,
    /// Claim from this partition only (default: any).
    pub partition: Option<u32>,
    /// Claim in this subscription (default: the queue's default one).
    pub subscription: Option<String>,
}

/// `POST /v1/acks`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ack {
    pub tokens: Vec<String>,
}

/// `POST /v1/extends`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Extend {
    pub token: String,
    /// Default: the queue's `lease_default_ms`.
    pub lease_ms: Option<u32>,
}

/// `POST /v1/releases`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Release {
    pub token: String,
    /// 0 (the default): the queue's backoff.
    #[serde(default)]
    pub delay_ms: u32,
    #[serde(default)]
    pub reason: String,
}

/// `POST /v1/queues/{q}/redrive`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Redrive {
    pub partition: Option<u32>,
    /// Original offsets (needs `partition`); default: every dead letter.
    pub offsets: Option<Vec<u64>>,
    /// Redrive in this subscription (default: the queue's default one).
    #[serde(default)]
    pub subscription: String,
}

/// A queue's key map as `GET /v1/queues/{q}` shows it.
pub fn key_map(keys: &spool_client::spool_wire::proto::KeyMapStats) -> Value {
    let draining: Vec<u32> = keys.draining.iter().map(|partition| partition.0).collect();
    json!({ "version": keys.version, "held_from": keys.held_from, "draining": draining })
}

/// `POST /v1/queues/{q}/purge`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Purge {
    /// Without `true` nothing is dropped: the answer is the count.
    #[serde(default)]
    pub confirm: bool,
    pub partition: Option<u32>,
    /// Purge in this subscription (default: the queue's default one).
    #[serde(default)]
    pub subscription: String,
}

/// `bytes` as `name` (UTF-8 text) or `name_base64`.
fn put_bytes(object: &mut Map<String, Value>, name: &str, bytes: &[u8]) {
    match std::str::from_utf8(bytes) {
        Ok(text) => object.insert(name.to_owned(), text.into()),
        Err(_) => object.insert(format!("{name}_base64"), STANDARD.encode(bytes).into()),
    };
}

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// One delivery of a claim.
pub fn delivery(delivery: &Delivery, token: String) -> Value {
    let mut object = Map::new();
    object.insert("token".to_owned(), token.into());
    object.insert("partition".to_owned(), delivery.partition().0.into());
    object.insert("offset".to_owned(), delivery.offset().0.into());
    object.insert("attempt".to_owned(), delivery.attempt().into());
    object.insert("lease_deadline_ms".to_owned(), delivery.lease_deadline_ms().into());
    object.insert("message_id".to_owned(), hex(&delivery.message_id().0).into());
    object.insert("priority".to_owned(), delivery.priority().into());
    object.insert("enqueue_time_ms".to_owned(), delivery.enqueue_time_ms().into());
    if !delivery.routing_key().is_empty() {
        put_bytes(&mut object, "key", delivery.routing_key());
    }
    let headers: Vec<Value> = delivery
        .headers()
        .map(|(key, value)| {
            let mut header = Map::new();
            put_bytes(&mut header, "key", key);
            put_bytes(&mut header, "value", value);
            Value::Object(header)
        })
        .collect();
    if !headers.is_empty() {
        object.insert("headers".to_owned(), headers.into());
    }
    match delivery.payload() {
        PayloadView::Inline(bytes) => put_bytes(&mut object, "payload", bytes),
        PayloadView::Reference { location, len_bytes, digest } => {
            object.insert(
                "payload_reference".to_owned(),
                json!({ "location": location, "len_bytes": len_bytes, "digest": hex(digest) }),
            );
        }
    }
    Value::Object(object)
}

/// A queue's configuration.
pub fn config(config: &QueueConfig) -> Value {
    json!({
        "partitions": config.partitions,
        "priority_bands": config.priority_bands,
        "lease_default_ms": config.lease_default_ms,
        "lease_min_ms": config.lease_min_ms,
        "lease_max_ms": config.lease_max_ms,
        "max_lease_lifetime_ms": config.max_lease_lifetime_ms,
        "max_deliveries": config.max_deliveries,
        "backoff": {
            "kind": match config.backoff.kind {
                BackoffKind::Linear => "linear",
                BackoffKind::Exponential => "exponential",
            },
            "base_ms": config.backoff.base_ms,
            "cap_ms": config.backoff.cap_ms,
        },
        "dedupe_window_ms": config.dedupe_window_ms,
        "max_messages": config.max_messages,
        "max_bytes": config.max_bytes,
        "dead_letter_on_expiry": config.dead_letter_on_expiry,
        "retention_ms": config.retention_ms,
        "retention_bytes": config.retention_bytes,
        "ordered": config.ordered,
    })
}

/// One partition's counts.
pub fn partition_stats(stats: &PartitionStats) -> Value {
    json!({
        "partition": stats.partition.0,
        "ready": stats.ready,
        "scheduled": stats.scheduled,
        "claimed": stats.claimed,
        "dead_lettered": stats.quarantined,
        "expired": stats.expired,
        "acked": stats.acked,
        "bytes": stats.bytes,
        "oldest_ready_age_ms": stats.oldest_ready_age_ms,
        "released": stats.released,
        "lease_expired": stats.lease_expired,
        "retained_messages": stats.retained.messages,
        "retained_bytes": stats.retained.bytes,
        "oldest_retained_age_ms": stats.retained.oldest_age_ms,
        "lanes": lanes(&stats.lanes),
        "replication": stats.replication.map(|replication| json!({
            "leader_node": replication.leader_node,
            "term": replication.term,
            "committed_index": replication.committed_index,
            "lag_entries": replication.lag_entries,
        })),
    })
}

/// An ordered queue's lanes (all 0 for an unordered queue): active and
/// blocked keys, waiting messages, the oldest waiting message's age and
/// the key blocked longest (`blocked_longest_key`, or
/// `blocked_longest_key_base64` when it is not UTF-8; absent when no key
/// is blocked).
pub fn lanes(lanes: &LaneStats) -> Value {
    let mut object = Map::new();
    object.insert("active_keys".to_owned(), lanes.active_keys.into());
    object.insert("blocked_keys".to_owned(), lanes.blocked_keys.into());
    object.insert("waiting".to_owned(), lanes.waiting.into());
    object.insert("oldest_waiting_age_ms".to_owned(), lanes.oldest_waiting_age_ms.into());
    if !lanes.blocked_longest_key.is_empty() {
        put_bytes(&mut object, "blocked_longest_key", &lanes.blocked_longest_key);
    }
    Value::Object(object)
}

/// The lanes of a queue over `partitions`: counts summed, the oldest
/// waiting age with its key ([`LaneStats::merge`]).
pub fn merged_lanes(partitions: &[PartitionStats]) -> Value {
    let mut merged = LaneStats::default();
    for stats in partitions {
        merged.merge(&stats.lanes);
    }
    lanes(&merged)
}

/// What a queue keeps for replay over `partitions`: the retained records
/// and bytes summed, the oldest's age the largest (0: none).
pub fn retained(partitions: &[PartitionStats]) -> (u64, u64, u64) {
    let messages = partitions.iter().map(|stats| stats.retained.messages).sum();
    let bytes = partitions.iter().map(|stats| stats.retained.bytes).sum();
    let oldest = partitions.iter().map(|stats| stats.retained.oldest_age_ms).max().unwrap_or(0);
    (messages, bytes, oldest)
}

/// One dead letter.
pub fn dead_letter(partition: u32, entry: &DeadLetter) -> Value {
    json!({
        "partition": partition,
        "offset": entry.original_offset.0,
        "key": entry.routing_key,
        "attempts": entry.attempts,
        "last_reason": entry.last_reason,
        "enqueued_at_ms": entry.enqueued_at_ms,
        "last_claimed_at_ms": entry.last_claimed_at_ms,
        "dead_lettered_at_ms": entry.quarantined_at_ms,
    })
}
