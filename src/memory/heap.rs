//! Giving freed data memory back to the kernel.
//!
//! Owns: when to ask the C allocator to return its free pages (`malloc_trim`), decided on the
//! memory watch's thread from the bytes charged to staging and work. Staged blocks, reads in
//! flight and renders are heap memory; once freed, glibc keeps their pages in its arenas, so
//! after a full staging slice drains the daemon still holds its high-water mark, resident and
//! counted by no budget (about 32 MB at 6,000 files with the default 27 MB slice), and staging
//! room lent to the cache would be held twice. A trim returns it once those charges have fallen
//! well below their mark. Must never run on a FUSE or I/O thread (a trim walks the allocator's
//! arenas, each under its lock), and never trim while charges hold steady or grow (steady churn
//! would fault back in the pages a trim returned).

/// Trim once the heap's charged bytes have fallen this far below their high-water mark since
/// the last trim: far above what one 100 ms tick of churn frees, and the default staging slice
/// of a 128 MiB budget (smaller slices leave less behind than a trim is worth).
pub const SLACK: u64 = 16 << 20;

/// The high-water mark of the heap's charged bytes since the last trim.
#[derive(Debug, Default)]
pub struct Trimmer {
    mark: u64,
}

impl Trimmer {
    /// Whether to trim now, given the bytes charged now; a trim starts a new mark.
    pub fn due(&mut self, charged: u64) -> bool {
        self.mark = self.mark.max(charged);
        if self.mark - charged < SLACK {
            return false;
        }
        self.mark = charged;
        true
    }
}

/// Returns the allocator's free pages to the kernel; whether any were returned. Only glibc has
/// such a call; elsewhere it does nothing.
pub fn trim() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim takes no pointers and only reorganises the allocator's free lists
        // under its own locks; any thread may call it at any time.
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trim_is_due_only_once_charges_fall_a_slack_below_their_mark() {
        let mut t = Trimmer::default();
        assert!(!t.due(10 * SLACK), "growing");
        assert!(!t.due(10 * SLACK - SLACK / 2), "within the slack");
        assert!(!t.due(10 * SLACK), "churn at the mark");
        assert!(t.due(9 * SLACK), "a slack below the mark");
        assert!(!t.due(9 * SLACK), "the trim started a new mark");
        assert!(!t.due(8 * SLACK + 1));
        assert!(t.due(8 * SLACK));
    }

    #[test]
    fn freed_heap_memory_goes_back_to_the_kernel() {
        // A thread of its own: its arena holds only these blocks, which a trim can return whole.
        let resident = || -> u64 {
            let statm = std::fs::read_to_string("/proc/self/statm").expect("statm");
            let pages: Vec<u64> = statm
                .split_whitespace()
                .map(|f| f.parse().expect("a number"))
                .collect();
            (pages[1] - pages[2]) * rustix::param::page_size() as u64
        };
        let (held, after) = std::thread::spawn(move || {
            let blocks: Vec<Vec<u8>> = (0..512).map(|i| vec![i as u8; 96 << 10]).collect();
            let held = resident();
            drop(blocks);
            assert!(trim(), "glibc returned nothing");
            (held, resident())
        })
        .join()
        .expect("the allocating thread");
        // Other tests run beside this one; 48 MB freed, at least half must leave the process.
        assert!(
            held.saturating_sub(after) >= 24 << 20,
            "resident anonymous memory {held} -> {after} after freeing 48 MB and trimming"
        );
    }
}
