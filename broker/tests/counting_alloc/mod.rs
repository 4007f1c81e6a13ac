//! A global allocator for tests that count heap allocations per thread
//! (`queue_allocations.rs`, `partition_allocations.rs`): it delegates to the
//! system allocator and counts alloc, alloc_zeroed and realloc calls made by
//! a thread while that thread has counting switched on. Each test binary
//! installs it with `#[global_allocator]`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

pub struct Counting;

thread_local! {
    /// Whether this thread's allocations are counted now. `const`
    /// initializers, no destructors: reading them never allocates.
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    /// Allocation calls (alloc, alloc_zeroed, realloc) counted so far.
    static CALLS: Cell<u64> = const { Cell::new(0) };
}

/// Switches counting on or off for the calling thread (off at start).
pub fn set_counting(on: bool) {
    COUNTING.with(|counting| counting.set(on));
}

/// Allocation calls counted on the calling thread so far.
pub fn calls() -> u64 {
    CALLS.with(Cell::get)
}

fn counted() {
    let _ = COUNTING.try_with(|on| {
        if on.get() {
            let _ = CALLS.try_with(|calls| calls.set(calls.get() + 1));
        }
    });
}

// SAFETY: delegates to the system allocator and only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        counted();
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        counted();
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        counted();
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
