//! A two-level free-slot bitmap.
//!
//! Level 0 has one bit per slot (1 = free); level 1 has one bit per level-0 word (1 = that word
//! has a free slot). Finding the next free slot from any position reads at most a handful of
//! words at any occupancy: 262,144 slots are 4,096 words summarised by 64. A round-robin cursor
//! makes consecutive allocations walk forward, so a freed address is handed out again as late
//! as possible (host-local does the same with `last_reserved_ip`).

#[derive(Debug, Clone)]
pub struct FreeBitmap {
    words: Vec<u64>,
    summary: Vec<u64>,
    len: usize,
    free: usize,
    /// Where the next search starts.
    cursor: usize,
}

impl FreeBitmap {
    /// A bitmap of `len` slots, all taken.
    pub fn new_taken(len: usize) -> Self {
        let nwords = len.div_ceil(64);
        Self {
            words: vec![0; nwords],
            summary: vec![0; nwords.div_ceil(64)],
            len,
            free: 0,
            cursor: 0,
        }
    }

    /// A bitmap of `len` slots, all free.
    pub fn new_free(len: usize) -> Self {
        let mut b = Self::new_taken(len);
        for w in 0..b.words.len() {
            let bits = (len - w * 64).min(64);
            b.words[w] = if bits == 64 {
                u64::MAX
            } else {
                (1u64 << bits) - 1
            };
            b.summary[w / 64] |= 1 << (w % 64);
        }
        b.free = len;
        b
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Add slots up to `len`, all taken (metadata pools grow as addresses appear).
    pub fn grow(&mut self, len: usize) {
        if len <= self.len {
            return;
        }
        let nwords = len.div_ceil(64);
        self.words.resize(nwords, 0);
        self.summary.resize(nwords.div_ceil(64), 0);
        self.len = len;
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn free_count(&self) -> usize {
        self.free
    }

    pub fn is_free(&self, i: usize) -> bool {
        self.words[i / 64] & (1 << (i % 64)) != 0
    }

    /// Mark slot `i` free. Returns false if it already was.
    pub fn set_free(&mut self, i: usize) -> bool {
        debug_assert!(i < self.len);
        let (w, b) = (i / 64, i % 64);
        if self.words[w] & (1 << b) != 0 {
            return false;
        }
        self.words[w] |= 1 << b;
        self.summary[w / 64] |= 1 << (w % 64);
        self.free += 1;
        true
    }

    /// Mark slot `i` taken. Returns false if it already was.
    pub fn take(&mut self, i: usize) -> bool {
        debug_assert!(i < self.len);
        let (w, b) = (i / 64, i % 64);
        if self.words[w] & (1 << b) == 0 {
            return false;
        }
        self.words[w] &= !(1 << b);
        if self.words[w] == 0 {
            self.summary[w / 64] &= !(1 << (w % 64));
        }
        self.free -= 1;
        true
    }

    /// Take the next free slot at or after the cursor (wrapping) and advance the cursor past it.
    pub fn take_next(&mut self) -> Option<usize> {
        let i = self.find_from(self.cursor).or_else(|| self.find_from(0))?;
        self.take(i);
        self.cursor = if i + 1 >= self.len { 0 } else { i + 1 };
        Some(i)
    }

    /// Start the round-robin search after slot `i` unless it is already past it (a restart
    /// continues after the highest slot in use).
    pub fn start_after(&mut self, i: usize) {
        // Past the last slot, the next search wraps to the first.
        self.cursor = self.cursor.max(i + 1);
    }

    /// First free slot >= `start`, without wrapping.
    fn find_from(&self, start: usize) -> Option<usize> {
        if self.free == 0 || start >= self.len {
            return None;
        }
        let (w, b) = (start / 64, start % 64);
        // The rest of the starting word.
        let rest = self.words[w] & (u64::MAX << b);
        if rest != 0 {
            return Some(w * 64 + rest.trailing_zeros() as usize);
        }
        // Then the summary, from the word after `w`.
        let next = w + 1;
        let (mut s, sb) = (next / 64, next % 64);
        if s >= self.summary.len() {
            return None;
        }
        let mut bits = if sb == 0 {
            self.summary[s]
        } else {
            self.summary[s] & (u64::MAX << sb)
        };
        loop {
            if bits != 0 {
                let word = s * 64 + bits.trailing_zeros() as usize;
                let i = word * 64 + self.words[word].trailing_zeros() as usize;
                return Some(i);
            }
            s += 1;
            if s >= self.summary.len() {
                return None;
            }
            bits = self.summary[s];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_robin_and_wrap() {
        let mut b = FreeBitmap::new_taken(200);
        for i in 0..200 {
            b.set_free(i);
        }
        assert_eq!(b.free_count(), 200);
        assert_eq!(b.take_next(), Some(0));
        assert_eq!(b.take_next(), Some(1));
        // A freed slot is not reused before the cursor wraps around.
        b.set_free(0);
        for want in 2..200 {
            assert_eq!(b.take_next(), Some(want));
        }
        assert_eq!(b.take_next(), Some(0));
        assert_eq!(b.take_next(), None);
        assert_eq!(b.free_count(), 0);
    }

    #[test]
    fn finds_sparse_free_slots_across_summary_words() {
        // 262,144 slots: 4,096 words, summary of 64 words.
        let n = 1 << 18;
        let mut b = FreeBitmap::new_taken(n);
        for i in [5, 64 * 64 * 3 + 7, n - 1] {
            assert!(b.set_free(i));
            assert!(!b.set_free(i));
        }
        assert_eq!(b.take_next(), Some(5));
        assert_eq!(b.take_next(), Some(64 * 64 * 3 + 7));
        assert_eq!(b.take_next(), Some(n - 1));
        assert_eq!(b.take_next(), None);
        b.set_free(3);
        assert_eq!(b.take_next(), Some(3));
    }

    #[test]
    fn new_free_matches_set_free() {
        for n in [1, 63, 64, 65, 4096, 4097, 5000] {
            let mut a = FreeBitmap::new_free(n);
            let mut b = FreeBitmap::new_taken(n);
            for i in 0..n {
                b.set_free(i);
            }
            assert_eq!(a.free_count(), n);
            for _ in 0..n {
                assert_eq!(a.take_next(), b.take_next());
            }
            assert_eq!(a.take_next(), None);
        }
    }

    #[test]
    fn grown_slots_start_taken() {
        let mut b = FreeBitmap::new_free(3);
        b.grow(200);
        assert_eq!(b.free_count(), 3);
        assert!(!b.is_free(150));
        assert!(b.set_free(150));
        for want in [0, 1, 2, 150] {
            assert_eq!(b.take_next(), Some(want));
        }
        assert_eq!(b.take_next(), None);
    }

    #[test]
    fn take_specific_slot_updates_summary() {
        let mut b = FreeBitmap::new_taken(130);
        b.set_free(70);
        assert!(b.take(70));
        assert!(!b.take(70));
        assert_eq!(b.take_next(), None);
        assert!(!b.is_free(70));
    }
}
