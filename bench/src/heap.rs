//! A counting global allocator: live heap bytes, for the memory scenarios.
//!
//! What it owns: one process-wide counter of bytes currently allocated
//! through [`CountingAllocator`], which delegates every call to mimalloc
//! (the load generator allocates per message on its pacer and client
//! threads; glibc malloc cost it ≈10 % of its CPU). What it does not do: install itself. Only the `spool-bench`
//! binary declares it `#[global_allocator]`, so the library (and its unit
//! tests) keep the plain system allocator; [`installed`] tells a scenario
//! whether the counter is live, and scenarios that need it refuse to run
//! without it rather than report zeros.
//!
//! Why sizes, not pages: the target is bytes of state per message, which is
//! what the state machine asks for. Allocator slack (size classes, page
//! rounding) is not counted; RSS would count it, plus everything else.

use std::alloc::{GlobalAlloc, Layout};

use mimalloc::MiMalloc;
use std::sync::atomic::{AtomicIsize, Ordering};

/// Bytes currently allocated through the counting allocator (may dip below
/// zero transiently when memory allocated before installation is freed).
static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

/// Delegates to mimalloc and counts requested sizes.
#[derive(Debug, Default)]
pub struct CountingAllocator;

// SAFETY: every method forwards to the system allocator with the caller's
// arguments unchanged; the counter update has no effect on the memory.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { MiMalloc.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { MiMalloc.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { MiMalloc.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE_BYTES.fetch_add(new_size as isize - layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { MiMalloc.realloc(ptr, layout, new_size) }
    }
}

/// Live heap bytes as counted so far.
pub fn live_bytes() -> isize {
    LIVE_BYTES.load(Ordering::Relaxed)
}

/// Whether the counting allocator is the process's global allocator: a
/// probe allocation must move the counter by exactly its size.
pub fn installed() -> bool {
    const PROBE_BYTES: usize = 4096;
    let before = live_bytes();
    let probe: Vec<u8> = Vec::with_capacity(PROBE_BYTES);
    let during = live_bytes();
    drop(std::hint::black_box(probe));
    during - before == PROBE_BYTES as isize
}
