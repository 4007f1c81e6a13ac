//! The journal entry: a header followed by a payload (a record batch
//! exactly as `wire::batch` validates it), the payload-less marker entries
//! of a partition's log, and the filler entry that closes a commit's last
//! page. Pure: no I/O, and every decode is total — it returns an error for
//! any bytes, never panics.
//!
//! Every entry this build appends has the 48-byte v2 header
//! (`docs/design/shard-journal.md` §14):
//!
//! ```text
//!  0  4  magic "SPJ2"
//!  4  4  partition field (handle, plus the relocated / marker bits)
//!  8  8  journal position of this entry
//! 16  8  durable watermark known to the writer (journal position)
//! 24  8  entry index in its partition's log (0: not a log entry)
//! 32  8  term of the leader that appended it
//! 40  4  entry_len (header + payload, multiple of 8)
//! 44  4  crc32c of bytes [0, 44)
//! ```
//!
//! A journal written before entry indexes existed holds v1 entries, read
//! as ever (index and term 0); fillers keep the v1 form, 32 bytes, since
//! they have no index and must fit the smallest gap a commit leaves:
//!
//! ```text
//!  0  4  magic "SPJ1"
//!  4  4  partition id (u32::MAX: filler)
//!  8  8  journal position of this entry
//! 16  8  durable watermark known to the writer (journal position)
//! 24  4  entry_len (header + payload, multiple of 8)
//! 28  4  crc32c of bytes [0, 28)
//! ```
//!
//! The header crc covers the routing fields only; a payload keeps its own
//! crcs (the batch header's two), checked by [`decode_entry`]. A filler's
//! payload is zeros and is not checked: nothing reads it. A marker
//! ([`MARKER_TRUNCATE`], [`MARKER_COMMIT`] in the partition field) has no
//! payload: its meaning is its header's index.

use std::fmt;

use spool_wire::batch::{BatchHeader, BatchKind};
use spool_wire::limits::BATCH_BYTES_MAX;
use spool_wire::WireError;

use super::{JournalPos, PartitionHandle};

/// Bytes of the header every appended entry gets (v2), and the most any
/// header takes.
pub const ENTRY_HEADER_BYTES: usize = 48;
/// `"SPJ2"` little-endian: the v2 header.
pub const ENTRY_MAGIC: u32 = u32::from_le_bytes(*b"SPJ2");
/// Bytes of a v1 header (entries of journals written before entry indexes,
/// and every filler): the least any header takes.
pub const V1_HEADER_BYTES: usize = 32;
/// `"SPJ1"` little-endian: the v1 header.
pub const V1_MAGIC: u32 = u32::from_le_bytes(*b"SPJ1");
/// Set in a v2 header's partition field (beside the handle) on the marker
/// that cancels the partition's log from the header's index on
/// (`docs/design/shard-journal.md` §14.3).
pub const MARKER_TRUNCATE: u32 = 1 << 30;
/// Set in a v2 header's partition field on the marker recording that the
/// partition's log is committed up to the header's index (§14.4).
pub const MARKER_COMMIT: u32 = 1 << 29;
/// Both marker bits: set together, the marker where a snapshot's install
/// starts the partition's log again after the header's (index, term)
/// (`docs/design/replication.md` §6).
pub const MARKER_BITS: u32 = MARKER_TRUNCATE | MARKER_COMMIT;
/// Entry lengths (and so entry positions inside a commit) are multiples of this.
pub const ENTRY_ALIGN: usize = 8;
/// Largest entry any journal accepts: a header and a maximal batch. Decoding
/// refuses longer lengths, so a damaged length field cannot make a reader
/// ask for more.
pub const ENTRY_BYTES_MAX: u64 = (ENTRY_HEADER_BYTES + BATCH_BYTES_MAX) as u64;
/// Partition id of a filler entry; `append` refuses it.
pub const FILLER_PARTITION: PartitionHandle = PartitionHandle(u32::MAX);

/// Bytes of a v1 header the crc covers.
const V1_CRC_COVERS: usize = 28;
/// Bytes of a v2 header the crc covers.
const CRC_COVERS: usize = 44;

const _: () = assert!(ENTRY_BYTES_MAX <= u32::MAX as u64);
const _: () = assert!(ENTRY_HEADER_BYTES.is_multiple_of(ENTRY_ALIGN));
const _: () = assert!(V1_HEADER_BYTES.is_multiple_of(ENTRY_ALIGN));

/// Which header form an entry has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeaderForm {
    /// 32 bytes, no index: fillers, and entries of older journals.
    V1,
    /// 48 bytes, with the entry index and term.
    V2,
}

impl HeaderForm {
    pub const fn bytes(self) -> usize {
        match self {
            Self::V1 => V1_HEADER_BYTES,
            Self::V2 => ENTRY_HEADER_BYTES,
        }
    }
}

/// The decoded header of one entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryHeader {
    pub partition: PartitionHandle,
    /// Where this entry starts in the journal: a copy at another position is
    /// not this entry.
    pub position: JournalPos,
    /// Every journal byte below this was durable when the entry's commit was
    /// built.
    pub watermark: JournalPos,
    /// Header plus payload.
    pub entry_len: u32,
    /// The entry's index in its partition's log (both lanes, dense from 1);
    /// 0 for an entry that is not part of one (v1, relocated copies,
    /// fillers).
    pub entry_index: u64,
    /// The term of the leader that appended it (0 in v1).
    pub term: u64,
    pub form: HeaderForm,
}

/// Why bytes are not an intact entry header or entry.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EntryError {
    /// Fewer bytes than the header, or than `entry_len`.
    Truncated {
        needed: usize,
        available: usize,
    },
    /// The first 32 header bytes are zero: no entry was written here.
    Zero,
    BadMagic(u32),
    CrcMismatch {
        stored: u32,
        computed: u32,
    },
    /// `entry_len` below a header, above [`ENTRY_BYTES_MAX`] or not a multiple of 8.
    BadLength(u32),
    /// The header names a position other than where it was found.
    WrongPosition {
        expected: JournalPos,
        found: JournalPos,
    },
    /// A writer never knows a watermark past its own entry.
    WatermarkAhead {
        position: JournalPos,
        watermark: JournalPos,
    },
    /// The payload is not one intact batch.
    Payload(WireError),
    /// The payload's batch is shorter or longer than the entry holds.
    PayloadLength {
        batch_len: u32,
        payload_len: usize,
    },
    /// A filler batch as payload: only the journal closes pages, with
    /// filler entries.
    FillerPayload,
}

impl fmt::Display for EntryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Truncated { needed, available } => {
                write!(f, "truncated entry: {available} of {needed} bytes")
            }
            Self::Zero => f.write_str("zero header where an entry was expected"),
            Self::BadMagic(magic) => write!(f, "bad entry magic {magic:#010x}"),
            Self::CrcMismatch { stored, computed } => {
                write!(f, "entry header crc {stored:#010x}, computed {computed:#010x}")
            }
            Self::BadLength(len) => write!(f, "invalid entry length {len}"),
            Self::WrongPosition { expected, found } => {
                write!(f, "entry names position {found}, found at {expected}")
            }
            Self::WatermarkAhead { position, watermark } => {
                write!(f, "entry at {position} records watermark {watermark} past itself")
            }
            Self::Payload(error) => write!(f, "invalid payload batch: {error}"),
            Self::PayloadLength { batch_len, payload_len } => {
                write!(f, "payload batch of {batch_len} bytes in a {payload_len}-byte payload")
            }
            Self::FillerPayload => f.write_str("a filler batch is not a journal payload"),
        }
    }
}

fn le_u32(bytes: &[u8], at: usize) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(word)
}

fn le_u64(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

impl EntryHeader {
    /// A v2 header (what appends write).
    pub fn v2(
        partition: PartitionHandle,
        position: JournalPos,
        watermark: JournalPos,
        entry_len: u32,
        entry_index: u64,
        term: u64,
    ) -> Self {
        Self { partition, position, watermark, entry_len, entry_index, term, form: HeaderForm::V2 }
    }

    /// The header bytes in its form ([`HeaderForm::bytes`] of them), crc
    /// included. A v1 header drops the index and term.
    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = vec![0u8; self.form.bytes()];
        self.write_to(&mut bytes);
        bytes
    }

    /// Writes the header over the first [`HeaderForm::bytes`] of `bytes`.
    ///
    /// # Panics
    /// If `bytes` is shorter than that: the appender sizes entries itself.
    pub fn write_to(&self, bytes: &mut [u8]) {
        let bytes = &mut bytes[..self.form.bytes()];
        bytes[4..8].copy_from_slice(&self.partition.0.to_le_bytes());
        bytes[8..16].copy_from_slice(&self.position.0.to_le_bytes());
        bytes[16..24].copy_from_slice(&self.watermark.0.to_le_bytes());
        match self.form {
            HeaderForm::V1 => {
                bytes[0..4].copy_from_slice(&V1_MAGIC.to_le_bytes());
                bytes[24..28].copy_from_slice(&self.entry_len.to_le_bytes());
                let crc = crc32c::crc32c(&bytes[..V1_CRC_COVERS]);
                bytes[28..32].copy_from_slice(&crc.to_le_bytes());
            }
            HeaderForm::V2 => {
                bytes[0..4].copy_from_slice(&ENTRY_MAGIC.to_le_bytes());
                bytes[24..32].copy_from_slice(&self.entry_index.to_le_bytes());
                bytes[32..40].copy_from_slice(&self.term.to_le_bytes());
                bytes[40..44].copy_from_slice(&self.entry_len.to_le_bytes());
                let crc = crc32c::crc32c(&bytes[..CRC_COVERS]);
                bytes[44..48].copy_from_slice(&crc.to_le_bytes());
            }
        }
    }

    /// Bytes of this header.
    pub fn header_bytes(&self) -> usize {
        self.form.bytes()
    }

    /// Decodes and checks the header at the start of `bytes`: magic, crc and
    /// length rules. Does not require the payload to be present. Needs
    /// [`V1_HEADER_BYTES`] to tell the form, [`ENTRY_HEADER_BYTES`] for a
    /// v2 header.
    ///
    /// # Errors
    /// [`EntryError::Truncated`], [`EntryError::Zero`],
    /// [`EntryError::BadMagic`], [`EntryError::CrcMismatch`],
    /// [`EntryError::BadLength`].
    pub fn decode(bytes: &[u8]) -> Result<Self, EntryError> {
        let Some(head) = bytes.get(..V1_HEADER_BYTES) else {
            return Err(EntryError::Truncated { needed: V1_HEADER_BYTES, available: bytes.len() });
        };
        if head.iter().all(|byte| *byte == 0) {
            return Err(EntryError::Zero);
        }
        let magic = le_u32(head, 0);
        let (form, covers, crc_at, len_at) = match magic {
            V1_MAGIC => (HeaderForm::V1, V1_CRC_COVERS, 28, 24),
            ENTRY_MAGIC => (HeaderForm::V2, CRC_COVERS, 44, 40),
            other => return Err(EntryError::BadMagic(other)),
        };
        let Some(header) = bytes.get(..form.bytes()) else {
            return Err(EntryError::Truncated { needed: form.bytes(), available: bytes.len() });
        };
        let stored = le_u32(header, crc_at);
        let computed = crc32c::crc32c(&header[..covers]);
        if stored != computed {
            return Err(EntryError::CrcMismatch { stored, computed });
        }
        let entry_len = le_u32(header, len_at);
        let len = u64::from(entry_len);
        if len < form.bytes() as u64
            || len > ENTRY_BYTES_MAX
            || !len.is_multiple_of(ENTRY_ALIGN as u64)
        {
            return Err(EntryError::BadLength(entry_len));
        }
        let partition = PartitionHandle(le_u32(header, 4));
        let (entry_index, term) = match form {
            HeaderForm::V1 => (0, 0),
            HeaderForm::V2 => (le_u64(header, 24), le_u64(header, 32)),
        };
        let decoded = Self {
            partition,
            position: JournalPos(le_u64(header, 8)),
            watermark: JournalPos(le_u64(header, 16)),
            entry_len,
            entry_index,
            term,
            form,
        };
        // A marker is a v2 header alone, naming an index; a filler is v1.
        if decoded.is_filler() && form != HeaderForm::V1 {
            return Err(EntryError::BadLength(entry_len));
        }
        if decoded.marker().is_some() && (len != form.bytes() as u64 || entry_index == 0) {
            return Err(EntryError::BadLength(entry_len));
        }
        Ok(decoded)
    }

    /// [`EntryHeader::decode`] plus the checks that tie a header to where it
    /// was found: its own position, and a watermark not past it.
    ///
    /// # Errors
    /// As [`EntryHeader::decode`], plus [`EntryError::WrongPosition`] and
    /// [`EntryError::WatermarkAhead`].
    pub fn decode_at(bytes: &[u8], at: JournalPos) -> Result<Self, EntryError> {
        let header = Self::decode(bytes)?;
        if header.position != at {
            return Err(EntryError::WrongPosition { expected: at, found: header.position });
        }
        if header.watermark > header.position {
            return Err(EntryError::WatermarkAhead {
                position: header.position,
                watermark: header.watermark,
            });
        }
        Ok(header)
    }

    pub fn is_filler(&self) -> bool {
        self.partition == FILLER_PARTITION
    }

    /// Which marker a v2 header is, if any (never a filler's or a v1
    /// entry's: their fields are not marker bits).
    pub fn marker(&self) -> Option<Marker> {
        if self.form != HeaderForm::V2 || self.is_filler() {
            return None;
        }
        match self.partition.0 & MARKER_BITS {
            MARKER_TRUNCATE => Some(Marker::Truncate),
            MARKER_COMMIT => Some(Marker::Commit),
            MARKER_BITS => Some(Marker::Install),
            _ => None,
        }
    }
}

/// A payload-less entry of a partition's log: its meaning is its index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Marker {
    /// The partition's log from this index on, as written before the
    /// marker, is cancelled.
    Truncate,
    /// The partition's log is committed up to this index.
    Commit,
    /// A snapshot install: the partition's log starts again after this
    /// (index, term), its state from the checkpoint the install writes;
    /// the relocated copies that follow are the snapshot's live records.
    /// In effect only once that checkpoint names the marker's position
    /// (`route::settle_installs`).
    Install,
}

impl Marker {
    /// The bit this marker sets in the partition field.
    pub fn bit(self) -> u32 {
        match self {
            Self::Truncate => MARKER_TRUNCATE,
            Self::Commit => MARKER_COMMIT,
            Self::Install => MARKER_BITS,
        }
    }
}

/// One intact entry: its header and its payload (a batch whose crcs were
/// checked; empty for a filler).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry<'a> {
    pub header: EntryHeader,
    pub payload: &'a [u8],
}

/// Decodes the entry starting at `bytes[0]`, found at journal position
/// `at`: the header ([`EntryHeader::decode_at`]), then — unless it is a
/// filler — the payload must be exactly one batch passing both its crcs.
///
/// # Errors
/// Every [`EntryError`].
pub fn decode_entry(bytes: &[u8], at: JournalPos) -> Result<Entry<'_>, EntryError> {
    let header = EntryHeader::decode_at(bytes, at)?;
    let len = header.entry_len as usize;
    let Some(entry) = bytes.get(..len) else {
        return Err(EntryError::Truncated { needed: len, available: bytes.len() });
    };
    if header.is_filler() || header.marker().is_some() {
        return Ok(Entry { header, payload: &[] });
    }
    let payload = &entry[header.header_bytes()..];
    check_payload(payload)?;
    Ok(Entry { header, payload })
}

/// The payload rule, shared by append and recovery: exactly one batch
/// passing both crcs, not a filler batch.
///
/// # Errors
/// [`EntryError::Payload`], [`EntryError::PayloadLength`].
pub fn check_payload(payload: &[u8]) -> Result<BatchHeader, EntryError> {
    let batch = BatchHeader::verify(payload).map_err(EntryError::Payload)?;
    if batch.batch_len as usize != payload.len() {
        return Err(EntryError::PayloadLength {
            batch_len: batch.batch_len,
            payload_len: payload.len(),
        });
    }
    if batch.kind == BatchKind::Filler {
        return Err(EntryError::FillerPayload);
    }
    Ok(batch)
}

/// Writes a filler entry over all of `bytes` (its length is the filler's:
/// at least a v1 header, a multiple of 8): a v1 header, then zeros.
///
/// # Panics
/// If `bytes` is shorter than a v1 header, longer than [`ENTRY_BYTES_MAX`] or
/// not a multiple of 8: the appender sizes fillers itself.
pub fn write_filler(bytes: &mut [u8], position: JournalPos, watermark: JournalPos) {
    assert!(bytes.len() >= V1_HEADER_BYTES);
    assert!(bytes.len().is_multiple_of(ENTRY_ALIGN));
    let entry_len = u32::try_from(bytes.len()).expect("filler length fits u32");
    assert!(u64::from(entry_len) <= ENTRY_BYTES_MAX);
    let header = EntryHeader {
        partition: FILLER_PARTITION,
        position,
        watermark,
        entry_len,
        entry_index: 0,
        term: 0,
        form: HeaderForm::V1,
    };
    header.write_to(bytes);
    bytes[V1_HEADER_BYTES..].fill(0);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use spool_wire::limits::BATCH_HEADER_BYTES;

    fn batch(body: usize, tag: u8) -> Vec<u8> {
        let len = BATCH_HEADER_BYTES + body;
        let mut bytes = vec![tag; len];
        BatchHeader {
            kind: BatchKind::Data,
            batch_len: len as u32,
            body_crc: 0,
            base_offset: 0,
            leader_epoch: 0,
            header_crc: 0,
            record_count: 1,
            flags: 0,
            first_timestamp_ms: 0,
            max_timestamp_ms: 0,
        }
        .write(&mut bytes);
        bytes
    }

    fn entry(partition: u32, position: u64, watermark: u64, payload: &[u8]) -> Vec<u8> {
        let header = EntryHeader::v2(
            PartitionHandle(partition),
            JournalPos(position),
            JournalPos(watermark),
            (ENTRY_HEADER_BYTES + payload.len()) as u32,
            9,
            2,
        );
        let mut bytes = header.encode();
        bytes.extend_from_slice(payload);
        bytes
    }

    fn v1_entry(partition: u32, position: u64, payload: &[u8]) -> Vec<u8> {
        let header = EntryHeader {
            partition: PartitionHandle(partition),
            position: JournalPos(position),
            watermark: JournalPos(0),
            entry_len: (V1_HEADER_BYTES + payload.len()) as u32,
            entry_index: 0,
            term: 0,
            form: HeaderForm::V1,
        };
        let mut bytes = header.encode();
        bytes.extend_from_slice(payload);
        bytes
    }

    #[test]
    fn an_entry_round_trips_and_names_its_fields() {
        // Goal: encode then decode gives the same fields and the payload back.
        let payload = batch(64, 7);
        let bytes = entry(3, 4096, 1024, &payload);
        let decoded = decode_entry(&bytes, JournalPos(4096)).unwrap();
        assert_eq!(decoded.header.partition, PartitionHandle(3));
        assert_eq!(decoded.header.watermark, JournalPos(1024));
        assert_eq!(decoded.header.entry_len as usize, bytes.len());
        assert_eq!(decoded.payload, &payload[..]);
        assert_eq!((decoded.header.entry_index, decoded.header.term), (9, 2));
        assert_eq!(&bytes[0..4], b"SPJ2");
    }

    #[test]
    fn a_v1_entry_of_an_older_journal_still_decodes_without_an_index() {
        // Goal: journals written before entry indexes stay readable: the
        // payload starts after 32 bytes and the index reads as 0.
        let payload = batch(40, 5);
        let bytes = v1_entry(4, 8192, &payload);
        let decoded = decode_entry(&bytes, JournalPos(8192)).unwrap();
        assert_eq!(decoded.header.form, HeaderForm::V1);
        assert_eq!(decoded.header.entry_index, 0);
        assert_eq!(decoded.payload, &payload[..]);
        assert_eq!(decoded.header.marker(), None);
    }

    #[test]
    fn markers_are_header_only_and_name_an_index() {
        // Goal: a marker decodes with no payload; one with a payload, or
        // with index 0, is refused; a v1 field with the bit is no marker.
        let field = 7 | MARKER_TRUNCATE;
        let marker = EntryHeader::v2(
            PartitionHandle(field),
            JournalPos(4096),
            JournalPos(0),
            ENTRY_HEADER_BYTES as u32,
            12,
            3,
        );
        let bytes = marker.encode();
        let decoded = decode_entry(&bytes, JournalPos(4096)).unwrap();
        assert_eq!(decoded.header.marker(), Some(Marker::Truncate));
        assert!(decoded.payload.is_empty());
        let zero_index = EntryHeader { entry_index: 0, ..marker };
        assert!(decode_entry(&zero_index.encode(), JournalPos(4096)).is_err());
        let with_payload = entry(field, 4096, 0, &batch(8, 1));
        assert!(matches!(
            decode_entry(&with_payload, JournalPos(4096)),
            Err(EntryError::BadLength(_))
        ));
        let v1 = v1_entry(7 | MARKER_COMMIT, 0, &batch(8, 1));
        assert_eq!(decode_entry(&v1, JournalPos(0)).unwrap().header.marker(), None);
    }

    #[test]
    fn a_copy_at_another_position_is_not_the_entry() {
        // Goal: the self-describing position rejects an entry found elsewhere,
        // and a watermark past the entry is refused.
        let bytes = entry(1, 8192, 0, &batch(8, 1));
        assert!(matches!(
            decode_entry(&bytes, JournalPos(4096)),
            Err(EntryError::WrongPosition { .. })
        ));
        let ahead = entry(1, 8192, 8200, &batch(8, 1));
        assert!(matches!(
            decode_entry(&ahead, JournalPos(8192)),
            Err(EntryError::WatermarkAhead { .. })
        ));
    }

    #[test]
    fn payload_damage_and_length_mismatch_are_refused() {
        // Goal: the batch's own crc guards the payload; the entry must hold exactly one batch.
        let mut bytes = entry(1, 0, 0, &batch(64, 9));
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        assert!(matches!(decode_entry(&bytes, JournalPos(0)), Err(EntryError::Payload(_))));
        let mut padded = batch(64, 9);
        padded.extend_from_slice(&[0u8; 8]);
        let bytes = entry(1, 0, 0, &padded);
        assert!(matches!(
            decode_entry(&bytes, JournalPos(0)),
            Err(EntryError::PayloadLength { .. })
        ));
    }

    #[test]
    fn fillers_are_recognised_and_their_payload_is_not_read() {
        // Goal: a filler decodes as a filler of its whole length with an empty payload.
        let mut bytes = vec![0xA5u8; 96];
        write_filler(&mut bytes, JournalPos(4000), JournalPos(0));
        let decoded = decode_entry(&bytes, JournalPos(4000)).unwrap();
        assert!(decoded.header.is_filler());
        assert_eq!(decoded.header.entry_len, 96);
        assert!(decoded.payload.is_empty());
        assert_eq!(decoded.header.form, HeaderForm::V1);
        assert!(bytes[32..].iter().all(|byte| *byte == 0));
    }

    #[test]
    fn zero_bytes_are_no_entry() {
        // Goal: an all-zero header (never written) is told apart from damage,
        // and a v2 magic with fewer than 48 bytes is short, not decoded.
        assert_eq!(EntryHeader::decode(&[0u8; 32]), Err(EntryError::Zero));
        assert!(matches!(EntryHeader::decode(&[0u8; 31]), Err(EntryError::Truncated { .. })));
        let v2 = entry(1, 0, 0, &batch(8, 1));
        assert_eq!(
            EntryHeader::decode(&v2[..40]),
            Err(EntryError::Truncated { needed: ENTRY_HEADER_BYTES, available: 40 })
        );
    }

    proptest! {
        #[test]
        fn decode_is_total(bytes in proptest::collection::vec(any::<u8>(), 0..200), at in any::<u64>()) {
            // Goal: no input makes the decoders panic.
            let _ = EntryHeader::decode(&bytes);
            let _ = decode_entry(&bytes, JournalPos(at));
        }

        #[test]
        fn header_round_trips(partition in 0u32..1 << 16, position in any::<u64>(),
                              watermark in any::<u64>(), len in 6u32..100_000,
                              entry_index in any::<u64>(), term in any::<u64>()) {
            // Goal: every valid field combination encodes and decodes unchanged.
            let header = EntryHeader::v2(
                PartitionHandle(partition),
                JournalPos(position),
                JournalPos(watermark),
                len * 8,
                entry_index,
                term,
            );
            prop_assert_eq!(EntryHeader::decode(&header.encode()), Ok(header));
        }

        #[test]
        fn any_header_bit_flip_is_detected(bit in 0usize..384, position in 0u64..1 << 40) {
            // Goal: a single flipped bit anywhere in the header never decodes as the same entry.
            let payload = batch(16, 3);
            let mut bytes = entry(5, position * 8, 0, &payload);
            bytes[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(decode_entry(&bytes, JournalPos(position * 8)).is_err());
        }
    }
}
