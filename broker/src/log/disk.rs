//! Failpoints at the log's file operations.

use std::path::Path;

use crate::io::{IoError, IoOp};

/// Evaluates failpoint `point` (see `crate::failpoint`) as a failure of
/// `op` on `path`: `Ok` unless the point is armed with `error`.
pub(crate) fn failpoint(
    point: &str,
    op: IoOp,
    path: &Path,
    pos: Option<u64>,
) -> Result<(), IoError> {
    crate::failpoint::eval(point).map_err(|error| IoError::new(op, path, pos, error))
}
