//! Named limits of the wire and disk formats. Every length a peer can choose
//! is bounded by one of these, checked before any work is done.

/// Alignment of every record inside a batch and of every batch inside a log:
/// rkyv's archived types need 8-byte alignment.
pub const RECORD_ALIGN: usize = 8;

/// Size of the fixed batch header, in bytes.
pub const BATCH_HEADER_BYTES: usize = 64;

/// Largest batch (header + position table + records) a producer may send or
/// the log may hold.
pub const BATCH_BYTES_MAX: usize = 4 << 20;

/// Most records in one batch.
pub const BATCH_RECORDS_MAX: u32 = 16 * 1024;

/// Largest single archived record.
pub const RECORD_BYTES_MAX: usize = 1 << 20;

/// Largest inline payload; larger payloads travel by reference. Leaves
/// [`RECORD_ENVELOPE_BYTES_MAX`] of [`RECORD_BYTES_MAX`] for everything else,
/// so a record within the field limits always fits the record limit.
pub const PAYLOAD_INLINE_BYTES_MAX: usize = RECORD_BYTES_MAX - RECORD_ENVELOPE_BYTES_MAX;

/// Room in a record for everything but an inline payload: routing key,
/// headers with their archived length fields and padding, and the fixed
/// fields. A test archives a record with every field at its limit to check
/// this bound.
pub const RECORD_ENVELOPE_BYTES_MAX: usize = 64 * 1024;

/// Longest routing key.
pub const ROUTING_KEY_BYTES_MAX: usize = 256;

/// Most headers on one record.
pub const HEADER_COUNT_MAX: usize = 64;

/// Total bytes of header keys and values on one record.
pub const HEADER_BYTES_MAX: usize = 16 * 1024;

/// Longest payload-reference location string.
pub const PAYLOAD_REF_LOCATION_BYTES_MAX: usize = 1024;

/// Largest payload a reference may point at. Bounds what a consumer may be
/// asked to fetch; the bytes themselves never pass through the broker.
pub const PAYLOAD_REF_BYTES_MAX: u64 = 1 << 40;

/// Largest control record (one state-machine event in its fixed-size binary
/// form). Events are small structs; this bounds what a corrupt table can claim.
pub const CONTROL_RECORD_BYTES_MAX: usize = 1024;

/// Farthest ahead of the broker's clock a record's `not_before_ms` or
/// `expiry_ms` may lie: 365 days. A year covers every real schedule; a
/// value past it is almost always a unit mistake (µs or ns for ms, or a
/// relative delay where an absolute time belongs) that would otherwise
/// hold the message unseen for centuries. Brokers refuse such an enqueue
/// with `INVALID_ARGUMENT`; clients check a relative delay against it
/// before sending.
pub const SCHEDULE_HORIZON_MS: u64 = 365 * 24 * 60 * 60 * 1000;

/// Number of priority bands a record may name (0 = highest).
pub const PRIORITY_BANDS_MAX: u8 = 8;

/// Bytes of one position-table entry: `(u32 position, u32 len)`.
pub const POSITION_ENTRY_BYTES: usize = 8;

const _: () = assert!(BATCH_HEADER_BYTES.is_multiple_of(RECORD_ALIGN));
const _: () = assert!(POSITION_ENTRY_BYTES.is_multiple_of(RECORD_ALIGN));
// The fullest batch's header and table must fit, or BATCH_RECORDS_MAX lies.
const _: () = assert!(
    BATCH_HEADER_BYTES + BATCH_RECORDS_MAX as usize * (POSITION_ENTRY_BYTES + RECORD_ALIGN)
        <= BATCH_BYTES_MAX
);
// Routing key, header bytes, and per header two 8-byte archived vectors plus
// up to 2 × 7 padding bytes, with 1 KiB for the fixed fields and reference.
const _: () = assert!(
    ROUTING_KEY_BYTES_MAX + HEADER_BYTES_MAX + HEADER_COUNT_MAX * (16 + 14) + 1024
        <= RECORD_ENVELOPE_BYTES_MAX
);
const _: () = assert!(CONTROL_RECORD_BYTES_MAX <= RECORD_BYTES_MAX);
// Positions and lengths are stored as u32.
const _: () = assert!(BATCH_BYTES_MAX <= u32::MAX as usize);
const _: () = assert!(BATCH_BYTES_MAX.is_multiple_of(RECORD_ALIGN));
const _: () = assert!(RECORD_BYTES_MAX + BATCH_HEADER_BYTES + 8 <= BATCH_BYTES_MAX);
