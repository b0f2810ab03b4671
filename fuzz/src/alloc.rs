//! Per-thread allocation accounting: the largest single allocation and the peak of live bytes
//! while a closure runs, so a target can assert that a decoder's memory is bounded by its
//! input (a 4 GiB length prefix must be refused, not allocated).
//!
//! Install in a test binary with
//! `#[global_allocator] static A: aliasnet_fuzz::alloc::Counting = aliasnet_fuzz::alloc::Counting;`.
//! Without it [`measure`] reports zeros; [`installed`] tells.

use std::{
    alloc::{GlobalAlloc, Layout, System},
    cell::Cell,
};

/// The system allocator, counting per thread.
pub struct Counting;

thread_local! {
    // Const-initialised plain cells: touching them never allocates, so the allocator may.
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
    static CALLS: Cell<u64> = const { Cell::new(0) };
}

fn grew(size: usize) {
    let _ = LIVE.try_with(|l| {
        let v = l.get().saturating_add(size as isize);
        l.set(v);
        let _ = PEAK.try_with(|p| p.set(p.get().max(v)));
    });
    let _ = LARGEST.try_with(|m| m.set(m.get().max(size)));
    let _ = CALLS.try_with(|c| c.set(c.get() + 1));
}

fn shrank(size: usize) {
    let _ = LIVE.try_with(|l| l.set(l.get().saturating_sub(size as isize)));
}

// SAFETY: every call is forwarded to the system allocator unchanged; the bookkeeping only
// touches thread-local cells.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        shrank(layout.size());
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        shrank(layout.size());
        grew(new_size);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// What a closure allocated on its thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Largest single allocation (or reallocation target), in bytes.
    pub largest: usize,
    /// Peak of live bytes above the level at the start.
    pub peak: usize,
    /// Allocation calls.
    pub calls: u64,
}

/// Run `f`, returning its result and what it allocated on this thread.
pub fn measure<R>(f: impl FnOnce() -> R) -> (R, Usage) {
    let start = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(start));
    LARGEST.with(|m| m.set(0));
    let calls = CALLS.with(Cell::get);
    let r = f();
    let usage = Usage {
        largest: LARGEST.with(Cell::get),
        peak: usize::try_from(PEAK.with(Cell::get) - start).unwrap_or(0),
        calls: CALLS.with(Cell::get) - calls,
    };
    (r, usage)
}

/// Whether [`Counting`] is the global allocator of this binary.
pub fn installed() -> bool {
    let (_, u) = measure(|| std::hint::black_box(vec![0u8; 64]));
    u.calls > 0
}
