//! The written-bytes reservation: a bound `Z` per segment below which every
//! byte the committers ever wrote lies, made durable before any byte at or
//! past it is written, so recovery's search for non-zero bytes after the
//! last valid batch stops at `Z` instead of the segment's capacity
//! (`segment-format.md`, "Written-bytes reservation").
//!
//! The reservation file (`reserve` in the log directory) is one page:
//!
//! ```text
//!  0  4  magic "SPZR"        8  8  segment base offset
//!  4  2  version (1)        16  8  Z (page-aligned file position)
//!  6  2  reserved (0)       24  4  crc32c of [0, 24)
//! 28 ..  zeros to the page end
//! ```
//!
//! It claims: "segment `base` holds zeros from `Z` on". It is rewritten in
//! place (one page write, then `fdatasync`): a torn or lost write leaves the
//! old claim, or a page that does not decode, which claims nothing (the
//! search then runs to the capacity, as without the file). While a write is
//! in flight either claim may be found after a crash, so the committers
//! respect both until the new one is synced.

use std::rc::Rc;

use super::disk::failpoint;
use super::layout::page_ceil;
use super::state::Shared;
use super::FatalCode;
use crate::io::{IoOp, Storage, StorageFile};
use crate::limits::PAGE_BYTES;

/// Name of the reservation file in a log directory.
pub const RESERVE_FILE_NAME: &str = "reserve";
const RESERVE_MAGIC: u32 = u32::from_le_bytes(*b"SPZR");
const RESERVE_VERSION: u16 = 1;
/// Bytes of the record the crc covers (magic, version, base, Z).
const RESERVE_COVERED_BYTES: usize = 24;

/// A reservation claim: segment `base` holds zeros from `bound` on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Claim {
    pub base: u64,
    pub bound: u64,
}

/// The page that records `claim`.
pub(crate) fn encode(claim: Claim, page: &mut [u8]) {
    page.fill(0);
    page[0..4].copy_from_slice(&RESERVE_MAGIC.to_le_bytes());
    page[4..6].copy_from_slice(&RESERVE_VERSION.to_le_bytes());
    page[8..16].copy_from_slice(&claim.base.to_le_bytes());
    page[16..24].copy_from_slice(&claim.bound.to_le_bytes());
    let crc = crc32c::crc32c(&page[..RESERVE_COVERED_BYTES]);
    page[24..28].copy_from_slice(&crc.to_le_bytes());
}

/// The claim a reservation page records; `None` for anything else (empty,
/// torn, flipped, another format): no claim.
pub(crate) fn decode(bytes: &[u8]) -> Option<Claim> {
    let word = |at: usize| -> Option<u64> {
        Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
    };
    let magic = u32::from_le_bytes(bytes.get(0..4)?.try_into().ok()?);
    let version = u16::from_le_bytes(bytes.get(4..6)?.try_into().ok()?);
    let crc = u32::from_le_bytes(bytes.get(24..28)?.try_into().ok()?);
    if magic != RESERVE_MAGIC
        || version != RESERVE_VERSION
        || crc != crc32c::crc32c(&bytes[..RESERVE_COVERED_BYTES])
    {
        return None;
    }
    let claim = Claim { base: word(8)?, bound: word(16)? };
    (claim.bound > 0 && claim.bound.is_multiple_of(PAGE_BYTES)).then_some(claim)
}

/// Writes `claim` over the reservation file's page and syncs it. The
/// caller makes sure no byte at or past the old or the new bound is
/// written until this returns.
pub(crate) async fn write_claim<F: StorageFile>(
    file: &F,
    claim: Claim,
) -> Result<(), (FatalCode, crate::io::IoError)> {
    let mut buf = file.alloc_buf(PAGE_BYTES as usize);
    encode(claim, buf.as_mut());
    let written = async {
        failpoint("log.reserve.write", IoOp::Write, file.path(), Some(0))?;
        file.write_at(Rc::new(buf), 0).await
    };
    written.await.map_err(|error| (FatalCode::WriteFailed, error))?;
    let synced = async {
        failpoint("log.reserve.sync", IoOp::Sync, file.path(), None)?;
        file.fdatasync().await
    };
    synced.await.map_err(|error| (FatalCode::SyncFailed, error))
}

/// The appender's view of the reservation file.
pub(super) struct Reservation<F> {
    pub(super) file: Rc<F>,
    /// What the file claims durably (recovery synced what it read).
    pub(super) durable: Option<Claim>,
    /// A write in flight and the claim it records: until it is synced a
    /// crash may leave either claim.
    pub(super) inflight: Option<Claim>,
}

impl<F> Reservation<F> {
    /// Every byte of segment `base` at or past this position must stay
    /// unwritten: the lowest bound any claim that a crash could leave
    /// makes for it (`u64::MAX`: none does).
    pub(super) fn limit(&self, base: u64) -> u64 {
        [self.durable, self.inflight]
            .into_iter()
            .flatten()
            .filter(|claim| claim.base == base)
            .map(|claim| claim.bound)
            .min()
            .unwrap_or(u64::MAX)
    }
}

impl<S: Storage> Shared<S> {
    /// Before bytes up to `end` of segment `base` (capacity `capacity`) are
    /// written: waits until every claim a crash could leave lies at or past
    /// `end`, extending the reservation (and waiting for its sync) when it
    /// does not. Returns an extension the caller runs beside its write
    /// when the bound comes within half a step of `end` (ahead of need, so
    /// the commit path rarely waits), or when no claim covers the segment
    /// yet. `Err` when the log failed.
    pub(super) async fn reserve(
        &self,
        base: u64,
        capacity: u64,
        end: u64,
    ) -> Result<Option<Claim>, ()> {
        let step = self.config.reserve_step_bytes;
        loop {
            let extend = {
                let mut state = self.state.borrow_mut();
                if state.failed.is_some() {
                    return Err(());
                }
                let reservation = &mut state.reservation;
                let limit = reservation.limit(base);
                let want = Claim { base, bound: capacity.min(page_ceil(end) + step) };
                let idle = reservation.inflight.is_none();
                if end <= limit {
                    // No claim for this segment: recovery searches it to
                    // its capacity; a claim below it shortens that search.
                    let ahead = if limit == u64::MAX {
                        want.bound < capacity
                    } else {
                        limit < capacity && end + step / 2 > limit
                    };
                    if ahead && idle {
                        reservation.inflight = Some(want);
                        return Ok(Some(want));
                    }
                    return Ok(None);
                }
                if idle {
                    reservation.inflight = Some(want);
                    Some(want)
                } else {
                    None
                }
            };
            match extend {
                Some(claim) => self.extend_reservation(claim).await?,
                None => self.reserved.wait().await,
            }
        }
    }

    /// Writes and syncs `claim` (already recorded as in flight by
    /// [`Shared::reserve`]); fatal on failure, as every segment write.
    pub(super) async fn extend_reservation(&self, claim: Claim) -> Result<(), ()> {
        let file = self.state.borrow().reservation.file.clone();
        if let Err((code, error)) = write_claim(&*file, claim).await {
            self.fail(code, &error);
            return Err(());
        }
        {
            let mut state = self.state.borrow_mut();
            let reservation = &mut state.reservation;
            assert_eq!(reservation.inflight, Some(claim), "one reservation write at a time");
            reservation.durable = reservation.inflight.take();
            state.stats.reservations += 1;
        }
        self.reserved.notify_all();
        Ok(())
    }
}

/// The `(segment base, bound)` a reservation file's bytes claim, if they
/// decode (for tests and operators).
pub fn reserve_claim_of(bytes: &[u8]) -> Option<(u64, u64)> {
    decode(bytes).map(|claim| (claim.base, claim.bound))
}

/// The page a reservation file holds when it claims `bound` for segment
/// `base` (for tests and operators).
pub fn reserve_page(base: u64, bound: u64) -> Vec<u8> {
    let mut page = vec![0; PAGE_BYTES as usize];
    encode(Claim { base, bound }, &mut page);
    page
}
