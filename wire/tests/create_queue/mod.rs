//! Test helpers shared by the CreateQueue version tests
//! (`proto_retention.rs`, `proto_ordered.rs`): the config the version-1
//! golden bytes were taken from, its frame, and encode/decode at a chosen
//! version.

#![allow(dead_code)]

use spool_wire::proto::{
    decode_frame, Backoff, BackoffKind, CorrelationId, CreateQueueRequest, ProtoError, QueueConfig,
    Request,
};

/// The config the golden bytes below were taken from (no window,
/// unordered).
pub fn config() -> QueueConfig {
    QueueConfig {
        partitions: 4,
        priority_bands: 2,
        lease_default_ms: 30_000,
        lease_min_ms: 1_000,
        lease_max_ms: 600_000,
        max_lease_lifetime_ms: 3_600_000,
        max_deliveries: 5,
        backoff: Backoff { kind: BackoffKind::Exponential, base_ms: 500, cap_ms: 60_000 },
        dedupe_window_ms: 300_000,
        max_messages: 10_000_000,
        max_bytes: 1 << 34,
        dead_letter_on_expiry: true,
        retention_ms: 0,
        retention_bytes: 0,
        ordered: false,
    }
}

/// CreateQueue of `config` for the queue `events`.
pub fn create(config: QueueConfig) -> Request<'static> {
    Request::CreateQueue(CreateQueueRequest { name: "events".into(), config })
}

/// The version-1 CreateQueue frame (correlation id 7) of `create(config())`
/// written by the codec before version 2 existed.
pub const CREATE_V1_GOLDEN: &str = "\
b800000010000100070000000000000000000000a0000000100000000000000008000c00040008000800000080000000\
200000001c004200080006000c0010001400200018001c0028003000380007001c000000000002010400000030750000\
e8030000c0270900050000003000000080ee360000000000e0930400000000008096980000000000000000000400000000\
000a001000070008000c000a00000000000001f401000060ea0000060000006576656e74730000";

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// `request` framed at `version` with correlation id 7.
pub fn encode(request: &Request<'_>, version: u16) -> Result<Vec<u8>, ProtoError> {
    let mut bytes = Vec::new();
    request.encode_version(CorrelationId(7), version, &mut bytes)?;
    Ok(bytes)
}

pub fn decode(bytes: &[u8]) -> Result<Request<'_>, ProtoError> {
    Request::decode(&decode_frame(bytes).expect("a frame"))
}

/// `bytes` with the header's api version replaced.
pub fn with_version(mut bytes: Vec<u8>, version: u16) -> Vec<u8> {
    bytes[6..8].copy_from_slice(&version.to_le_bytes());
    bytes
}
