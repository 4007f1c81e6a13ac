//! The client's one wall-clock read. Records carry absolute Unix-ms times
//! (`enqueue_time_ms`, `not_before_ms` for a delayed send) because the batch
//! format stores them so; nothing else in the client reads a clock, and timers
//! go through tokio's (which tests can pause).

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch; 0 if the system clock is before 1970.
#[allow(clippy::disallowed_methods)] // the client's single clock read, see the module doc
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX))
}
