//! Transparent huge pages for large, streamed buffers.
//!
//! A D-RTRL step reads and writes every trace element once, hundreds of
//! megabytes at hidden 512 (277 MB a GRU step at batch 64), in one pass.
//! On 4 KiB pages that pass misses the TLB once every 4 KiB, and the
//! hardware prefetcher stops at every page boundary; on 2 MiB pages it
//! does neither. [`advise_huge`] asks Linux for them (`madvise` with
//! `MADV_HUGEPAGE`: the kernel's `transparent_hugepage` setting of
//! `madvise`, a common default, backs only regions asked for this way).
//! The advice never changes a buffer's contents; where it is refused,
//! or off Linux, it does nothing.

/// Buffers smaller than this are left alone (a huge page is 2 MiB).
pub const MIN_BYTES: usize = 8 << 20;

/// Ask the OS to back `buf` with huge pages, before its first write (a
/// freshly `calloc`ed buffer has no pages yet, so each 2 MiB it faults in
/// is one huge page). Only the whole 4 KiB pages inside `buf` are
/// advised; buffers under [`MIN_BYTES`] are left alone. Returns whether
/// the advice was given and accepted.
pub fn advise_huge<T>(buf: &mut [T]) -> bool {
    let bytes = std::mem::size_of_val(buf);
    if bytes < MIN_BYTES {
        return false;
    }
    #[cfg(target_os = "linux")]
    {
        const PAGE: usize = 4096;
        let start = buf.as_mut_ptr() as usize;
        let first = start.next_multiple_of(PAGE);
        let end = (start + bytes) / PAGE * PAGE;
        if end <= first {
            return false;
        }
        // SAFETY: `[first, end)` is whole pages inside `buf`, which this
        // process owns and the borrow keeps alive; `MADV_HUGEPAGE` only
        // changes how the kernel backs the range, never its contents.
        unsafe { libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE) == 0 }
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The advice keeps every value (a wrong `madvise` code could drop
    /// the pages: `MADV_DONTNEED` reads back zeros), before and after
    /// the first write, and small buffers are left alone.
    #[test]
    fn advice_keeps_the_contents() {
        let mut small = vec![1.5f32; 1000];
        assert!(!advise_huge(&mut small));
        assert!(small.iter().all(|&v| v == 1.5));

        let n = MIN_BYTES / 4 + 12345;
        let mut fresh = vec![0f32; n];
        let advised = advise_huge(&mut fresh);
        assert!(fresh.iter().all(|&v| v == 0.0));
        for (i, v) in fresh.iter_mut().enumerate() {
            *v = i as f32;
        }
        // Advised again after the writes: the values stay.
        assert_eq!(advise_huge(&mut fresh), advised);
        assert!(fresh.iter().enumerate().all(|(i, &v)| v == i as f32));
        // Where the OS takes the advice (Linux, unless huge pages are off).
        if cfg!(target_os = "linux") {
            let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
                .unwrap_or_default();
            if thp.contains("[always]") || thp.contains("[madvise]") {
                assert!(advised, "transparent huge pages: {thp}");
            }
        }
    }
}
