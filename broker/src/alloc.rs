//! The allocator's purge policy: when memory the broker freed goes back to
//! the kernel.
//!
//! `spoold` allocates with mimalloc (v3, as built by libmimalloc-sys). A
//! freed range is *scheduled* for purging (`MADV_DONTNEED`) after
//! `purge_delay`, and pages a thread freed stay on that thread's heap until
//! it collects; both happen only inside later allocator calls on that
//! thread. A shard that goes idle after a drain therefore kept everything it
//! had freed (docs/performance.md, "Allocator": 47 MiB of 149 MiB after draining a
//! 100k backlog). [`configure`] shortens the delay and every executor calls
//! [`collect`] from its housekeeping timer every
//! [`HEAP_COLLECT_INTERVAL`](crate::limits::HEAP_COLLECT_INTERVAL), so
//! freed memory leaves RSS within about `PURGE_DELAY_MS + HEAP_COLLECT_INTERVAL`.
//!
//! What it does not do: bound how much the broker allocates (the caches and
//! limits do that), or anything when mimalloc is not the global allocator
//! (tests): then it collects mimalloc's empty heaps, which costs nothing.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::os::raw::{c_int, c_long};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};

// Links mimalloc's static library into every binary that uses this crate
// (tests included), not only into `spoold`, which installs it as the global
// allocator: `mi_collect` and `mi_option_set_default` live there.
extern crate mimalloc as _;

/// How long freed memory stays committed before it is purged.
pub const PURGE_DELAY_MS: c_long = crate::limits::ALLOC_PURGE_DELAY_MS as c_long;

/// mimalloc's option number of `purge_delay` (`mi_option_t` of mimalloc v3,
/// part of its ABI).
const MI_OPTION_PURGE_DELAY: c_int = 15;

extern "C" {
    fn mi_option_set_default(option: c_int, value: c_long);
    fn mi_collect(force: bool);
}

/// Sets the purge delay unless `MIMALLOC_PURGE_DELAY` set one. Call once, at
/// start.
pub fn configure() {
    // SAFETY: records an option value; no memory is touched.
    unsafe { mi_option_set_default(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) };
}

/// Frees this thread's empty pages and applies the process-wide purges that
/// are due. Never frees live memory.
pub fn collect() {
    // SAFETY: mi_collect(false) only releases free pages of the calling
    // thread's heap and purges ranges already scheduled.
    unsafe { mi_collect(false) };
}

/// The global allocator `spoold` installs: mimalloc, counting the bytes it
/// hands out that are not yet freed (the live heap), so an operator can
/// tell live data from what the allocator holds besides
/// (`spool_heap_live_bytes` against `spool_process_resident_bytes`; for a
/// 7.2 M backlog the difference was ≈ 130 MiB, docs/performance.md "Allocator").
///
/// Cost: each thread adds to its own cache line (no lock prefix, no line
/// shared between shards) for the first [`COUNTED_THREADS`] threads; later
/// threads share one slot with atomic adds.
pub struct CountingMimalloc;

/// Threads with a slot of their own.
pub const COUNTED_THREADS: usize = 63;

#[repr(align(64))]
struct Slot(AtomicI64);

static LIVE: [Slot; COUNTED_THREADS + 1] = [const { Slot(AtomicI64::new(0)) }; COUNTED_THREADS + 1];
static NEXT_SLOT: AtomicUsize = AtomicUsize::new(0);
static COUNTING: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// This thread's slot; `usize::MAX` until its first allocation. A
    /// `const` initializer and no destructor: reading it never allocates
    /// and works while the thread exits.
    static SLOT: Cell<usize> = const { Cell::new(usize::MAX) };
}

fn count(delta: i64) {
    let slot = SLOT
        .try_with(|slot| {
            let index = slot.get();
            if index != usize::MAX {
                return index;
            }
            let index = NEXT_SLOT.fetch_add(1, Ordering::Relaxed).min(COUNTED_THREADS);
            slot.set(index);
            index
        })
        .unwrap_or(COUNTED_THREADS);
    let live = &LIVE[slot].0;
    if slot < COUNTED_THREADS {
        // Only this thread writes its slot: a plain read-modify-write.
        live.store(live.load(Ordering::Relaxed).wrapping_add(delta), Ordering::Relaxed);
    } else {
        live.fetch_add(delta, Ordering::Relaxed);
    }
}

fn signed(bytes: usize) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

// SAFETY: every call is forwarded unchanged to mimalloc, a correct global
// allocator; the counting touches no allocator state.
unsafe impl GlobalAlloc for CountingMimalloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's layout.
        let pointer = unsafe { mimalloc::MiMalloc.alloc(layout) };
        if !pointer.is_null() {
            count(signed(layout.size()));
        }
        pointer
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's layout.
        let pointer = unsafe { mimalloc::MiMalloc.alloc_zeroed(layout) };
        if !pointer.is_null() {
            count(signed(layout.size()));
        }
        pointer
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        count(-signed(layout.size()));
        // SAFETY: the caller's pointer and layout, from this allocator.
        unsafe { mimalloc::MiMalloc.dealloc(pointer, layout) }
    }

    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's pointer, layout and size.
        let moved = unsafe { mimalloc::MiMalloc.realloc(pointer, layout, new_size) };
        if !moved.is_null() {
            count(signed(new_size) - signed(layout.size()));
        }
        moved
    }
}

impl CountingMimalloc {
    /// Marks the counting allocator as installed (call once in `main` of a
    /// binary that declares it `#[global_allocator]`).
    pub fn installed(&self) {
        COUNTING.store(true, Ordering::Relaxed);
    }
}

/// Bytes allocated and not freed, process-wide; `None` unless
/// [`CountingMimalloc`] is the global allocator.
pub fn live_heap_bytes() -> Option<u64> {
    if !COUNTING.load(Ordering::Relaxed) {
        return None;
    }
    let sum: i64 = LIVE.iter().map(|slot| slot.0.load(Ordering::Relaxed)).sum();
    Some(u64::try_from(sum).unwrap_or(0))
}

/// The process's resident set (`/proc/self/statm`), in bytes.
pub fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * crate::limits::PAGE_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: the count follows allocations, frees and reallocations of the
    // calling thread. Method: drive the allocator directly (it is not the
    // test binary's global allocator) and read this thread's slot.
    #[test]
    fn the_count_follows_allocations_frees_and_reallocations() {
        let allocator = CountingMimalloc;
        let before = LIVE.iter().map(|slot| slot.0.load(Ordering::Relaxed)).sum::<i64>();
        let live = || LIVE.iter().map(|slot| slot.0.load(Ordering::Relaxed)).sum::<i64>() - before;
        let layout = Layout::from_size_align(1000, 8).expect("layout");
        // SAFETY: a valid layout; the pointer is freed with the same one.
        unsafe {
            let pointer = allocator.alloc(layout);
            assert!(!pointer.is_null());
            assert_eq!(live(), 1000);
            let grown = allocator.realloc(pointer, layout, 3000);
            assert!(!grown.is_null());
            assert_eq!(live(), 3000);
            allocator.dealloc(grown, Layout::from_size_align(3000, 8).expect("layout"));
        }
        assert_eq!(live(), 0);
        assert_eq!(live_heap_bytes(), None, "not installed in this binary");
        assert!(resident_bytes().expect("statm") > 0);
    }
}
