//! Conversions between the wire's control-plane types and the broker's own.
//! Pure functions; every wire value was range-checked by the codec already,
//! and the queue config is validated again by the state machine.

use spool_wire::proto as wire;
use spool_wire::proto::DeliveryToken as WireToken;
use spool_wire::proto::DELIVERY_TOKEN_BYTES as WIRE_TOKEN_BYTES;

use crate::queue::{self, Backoff, DeliveryToken, QueueConfig, DELIVERY_TOKEN_BYTES};

const _: () = assert!(DELIVERY_TOKEN_BYTES <= WIRE_TOKEN_BYTES);

/// Band weights for `bands` priority bands: each band twice the weight of
/// the next, so band 0 gets the most turns and the lowest band still gets
/// one turn per round (it never starves).
pub fn band_weights(bands: u8) -> Vec<u32> {
    let bands = u32::from(bands.max(1));
    (0..bands).map(|band| 1u32 << (bands - 1 - band).min(16)).collect()
}

/// A queue config from a CreateQueue request.
pub fn queue_config_from_wire(config: &wire::QueueConfig) -> QueueConfig {
    let defaults = QueueConfig::default();
    let backoff = match config.backoff.kind {
        wire::BackoffKind::Linear => Backoff::Linear {
            step_ms: u64::from(config.backoff.base_ms),
            max_ms: u64::from(config.backoff.cap_ms),
        },
        wire::BackoffKind::Exponential => Backoff::Exponential {
            base_ms: u64::from(config.backoff.base_ms),
            max_ms: u64::from(config.backoff.cap_ms),
        },
    };
    QueueConfig {
        band_weights: band_weights(config.priority_bands),
        retry_weight: defaults.retry_weight,
        age_promotion_ms: defaults.age_promotion_ms,
        lease_default_ms: u64::from(config.lease_default_ms),
        lease_min_ms: u64::from(config.lease_min_ms),
        lease_max_ms: u64::from(config.lease_max_ms),
        max_lease_lifetime_ms: config.max_lease_lifetime_ms,
        max_deliveries: u16::try_from(config.max_deliveries).unwrap_or(u16::MAX),
        backoff,
        dedupe_window_ms: config.dedupe_window_ms,
        max_messages: config.max_messages,
        max_bytes: config.max_bytes,
        dead_letter_on_expiry: config.dead_letter_on_expiry,
        retention_ms: config.retention_ms,
        retention_bytes: config.retention_bytes,
        ordered: config.ordered,
    }
}

/// The wire form of a queue config, for DescribeQueue.
pub fn queue_config_to_wire(config: &QueueConfig, partitions: u32) -> wire::QueueConfig {
    let clamp = |value: u64| u32::try_from(value).unwrap_or(u32::MAX);
    let backoff = match config.backoff {
        Backoff::None => wire::Backoff { kind: wire::BackoffKind::Linear, base_ms: 0, cap_ms: 0 },
        Backoff::Linear { step_ms, max_ms } => wire::Backoff {
            kind: wire::BackoffKind::Linear,
            base_ms: clamp(step_ms),
            cap_ms: clamp(max_ms),
        },
        Backoff::Exponential { base_ms, max_ms } => wire::Backoff {
            kind: wire::BackoffKind::Exponential,
            base_ms: clamp(base_ms),
            cap_ms: clamp(max_ms),
        },
    };
    wire::QueueConfig {
        partitions,
        priority_bands: u8::try_from(config.bands()).unwrap_or(u8::MAX),
        lease_default_ms: clamp(config.lease_default_ms),
        lease_min_ms: clamp(config.lease_min_ms),
        lease_max_ms: clamp(config.lease_max_ms),
        max_lease_lifetime_ms: config.max_lease_lifetime_ms,
        max_deliveries: u32::from(config.max_deliveries),
        backoff,
        dedupe_window_ms: config.dedupe_window_ms,
        max_messages: config.max_messages,
        max_bytes: config.max_bytes,
        dead_letter_on_expiry: config.dead_letter_on_expiry,
        retention_ms: config.retention_ms,
        retention_bytes: config.retention_bytes,
        ordered: config.ordered,
    }
}

/// The wire form of a delivery token: the broker's token, then zeros.
pub fn token_to_wire(token: &DeliveryToken) -> WireToken {
    let mut bytes = [0u8; WIRE_TOKEN_BYTES];
    bytes[..DELIVERY_TOKEN_BYTES].copy_from_slice(&token.to_bytes());
    WireToken(bytes)
}

/// The broker's token inside a wire token. The trailing bytes must be zero,
/// so no two wire tokens name the same claim.
///
/// # Errors
/// Nonzero padding or a token that does not decode.
pub fn token_from_wire(token: &WireToken) -> Result<DeliveryToken, queue::CodecError> {
    if token.0[DELIVERY_TOKEN_BYTES..].iter().any(|&byte| byte != 0) {
        return Err(queue::CodecError::Reserved);
    }
    DeliveryToken::from_bytes(&token.0[..DELIVERY_TOKEN_BYTES])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_round_trips_through_the_wire() {
        // Goal: DescribeQueue shows what CreateQueue asked for, the
        // retention window included.
        let asked = wire::QueueConfig {
            partitions: 3,
            priority_bands: 4,
            lease_default_ms: 30_000,
            lease_min_ms: 100,
            lease_max_ms: 600_000,
            max_lease_lifetime_ms: 3_600_000,
            max_deliveries: 7,
            backoff: wire::Backoff {
                kind: wire::BackoffKind::Exponential,
                base_ms: 500,
                cap_ms: 60_000,
            },
            dedupe_window_ms: 120_000,
            max_messages: 1000,
            max_bytes: 1 << 30,
            dead_letter_on_expiry: true,
            retention_ms: 3_600_000,
            retention_bytes: 1 << 25,
            ordered: false,
        };
        let config = queue_config_from_wire(&asked);
        config.validate().expect("valid");
        assert_eq!(config.band_weights, vec![8, 4, 2, 1]);
        assert_eq!((config.retention_ms, config.retention_bytes), (3_600_000, 1 << 25));
        assert!(config.has_window());
        assert_eq!(queue_config_to_wire(&config, 3), asked);
        // No window: none on either side.
        let plain = wire::QueueConfig { retention_ms: 0, retention_bytes: 0, ..asked };
        assert!(!queue_config_from_wire(&plain).has_window());
        assert_eq!(queue_config_to_wire(&queue_config_from_wire(&plain), 3), plain);
        // Ordered (without a window, as the queue requires): both ways.
        let ordered = wire::QueueConfig { ordered: true, ..plain };
        let config = queue_config_from_wire(&ordered);
        assert!(config.ordered);
        config.validate().expect("an ordered queue without a window is valid");
        assert_eq!(queue_config_to_wire(&config, 3), ordered);
        // With a window: refused by the queue's own validation.
        let both = wire::QueueConfig { ordered: true, ..asked };
        assert!(queue_config_from_wire(&both).validate().is_err());
    }

    #[test]
    fn windows_the_wire_passes_the_state_machine_may_refuse() {
        // Goal: what the wire's absolute ranges let through but the queue's
        // own bounds refuse is a ConfigError (mapped to INVALID_ARGUMENT
        // with its message by the create path): a size window above the
        // queue's max_bytes. Method: convert and validate.
        let asked = wire::QueueConfig {
            partitions: 1,
            priority_bands: 4,
            lease_default_ms: 30_000,
            lease_min_ms: 1_000,
            lease_max_ms: 60_000,
            max_lease_lifetime_ms: 3_600_000,
            max_deliveries: 3,
            backoff: wire::Backoff { kind: wire::BackoffKind::Linear, base_ms: 0, cap_ms: 0 },
            dedupe_window_ms: 0,
            max_messages: 1000,
            max_bytes: 1 << 21,
            dead_letter_on_expiry: false,
            retention_ms: 0,
            retention_bytes: 1 << 22,
            ordered: false,
        };
        asked.validate().expect("the wire's ranges pass");
        let refused = queue_config_from_wire(&asked).validate().unwrap_err();
        assert!(matches!(refused, crate::queue::ConfigError::RetentionBytes { .. }), "{refused:?}");
        assert!(refused.to_string().contains("max_bytes"), "{refused}");
    }

    #[test]
    fn wire_token_padding_must_be_zero() {
        // Goal: a token with altered padding is rejected, not accepted as equal.
        let mut raw = WireToken([0u8; WIRE_TOKEN_BYTES]);
        raw.0[WIRE_TOKEN_BYTES - 1] = 1;
        assert!(token_from_wire(&raw).is_err());
    }
}
