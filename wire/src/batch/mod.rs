//! Record batches: the unit the producer sends, the log appends and the
//! consumer receives. See `docs/design/segment-format.md` for the layout.

mod header;

pub use header::{write_filler, BatchHeader, BatchKind, BATCH_FORMAT_VERSION, BATCH_MAGIC};
