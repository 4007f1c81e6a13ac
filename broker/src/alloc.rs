//! The allocator's purge policy: when memory the broker freed goes back to
//! the kernel.
//!
//! `spoold` allocates with mimalloc (v3, as built by libmimalloc-sys). A
//! freed range is *scheduled* for purging (`MADV_DONTNEED`) after
//! `purge_delay`, and pages a thread freed stay on that thread's heap until
//! it collects; both happen only inside later allocator calls on that
//! thread. A shard that goes idle after a drain therefore kept everything it
//! had freed (bench/README.md, "`rss`": 47 MiB of 149 MiB after draining a
//! 100k backlog). [`configure`] shortens the delay and every executor calls
//! [`collect`] from its housekeeping timer every
//! [`HEAP_COLLECT_INTERVAL`](crate::limits::HEAP_COLLECT_INTERVAL), so
//! freed memory leaves RSS within about `PURGE_DELAY_MS + HEAP_COLLECT_INTERVAL`.
//!
//! What it does not do: bound how much the broker allocates (the caches and
//! limits do that), or anything when mimalloc is not the global allocator
//! (tests): then it collects mimalloc's empty heaps, which costs nothing.

use std::os::raw::{c_int, c_long};

// Links mimalloc's static library into every binary that uses this crate
// (tests included), not only into `spoold`, which installs it as the global
// allocator: `mi_collect` and `mi_option_set_default` live there.
extern crate mimalloc as _;

/// How long freed memory stays committed before it is purged (mimalloc's
/// default is 1 s). Memory freed and reused within one burst of requests is
/// still not faulted back in page by page.
pub const PURGE_DELAY_MS: c_long = 250;

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
