//! Allocator tuning for a daemon that decodes large TOCs: fixed glibc thresholds
//! ([`tune_allocator`], once at start) and an explicit trim after a TOC is dropped
//! ([`release_free_heap`]). No-ops on other C libraries.

/// Makes the allocator give freed memory back (call once, before threads start): glibc raises
/// its mmap and trim thresholds on its own after a large block is freed (up to 32/64 MiB), so
/// a decoded TOC freed in a worker thread's arena stayed resident (300k entries: +120 B/entry
/// after the TOC was gone). Fixed thresholds: blocks over 256 KiB are mmapped (unmapped on
/// free) and an arena's free top over 1 MiB is trimmed.
pub fn tune_allocator() {
    #[cfg(target_env = "gnu")]
    // Raw libc: nix does not wrap glibc's allocator tuning.
    // SAFETY: mallopt only sets allocator parameters; no pointer is passed.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 10);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 20);
    }
}

/// Returns freed heap pages to the kernel: a decoded TOC is millions of small allocations, and
/// glibc keeps freed chunks below the top of the heap mapped (RSS would stay at its peak).
pub(super) fn release_free_heap() {
    #[cfg(target_env = "gnu")]
    // Raw libc: nix does not wrap malloc_trim.
    // SAFETY: malloc_trim only walks the allocator's own free lists; no pointer is passed.
    unsafe {
        libc::malloc_trim(0);
    }
}
