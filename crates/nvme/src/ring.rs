//! Queue-pair ring arithmetic: submission tail and the head the controller reports back,
//! completion head and phase tag, and command identifiers. No memory and no registers here, so
//! the wrap-around rules are tested on their own.

/// A submission queue's indices. One slot always stays empty so that full and empty differ.
#[derive(Debug, Clone)]
pub struct SqRing {
    size: u16,
    tail: u16,
    head: u16,
}

impl SqRing {
    pub fn new(size: u16) -> SqRing {
        SqRing {
            size: size.max(2),
            tail: 0,
            head: 0,
        }
    }

    pub fn size(&self) -> u16 {
        self.size
    }

    pub fn tail(&self) -> u16 {
        self.tail
    }

    /// Entries the controller has not consumed yet.
    pub fn used(&self) -> u16 {
        (self.tail + self.size - self.head) % self.size
    }

    pub fn is_full(&self) -> bool {
        self.used() == self.size - 1
    }

    /// Claims the slot at the tail and advances it; `None` when full.
    pub fn push(&mut self) -> Option<u16> {
        if self.is_full() {
            return None;
        }
        let slot = self.tail;
        self.tail = (self.tail + 1) % self.size;
        Some(slot)
    }

    /// Records the SQ head a completion reported (entries before it are free again).
    pub fn set_head(&mut self, head: u16) {
        if head < self.size {
            self.head = head;
        }
    }
}

/// A completion queue's head and the phase value that marks a new entry.
#[derive(Debug, Clone)]
pub struct CqRing {
    size: u16,
    head: u16,
    phase: bool,
}

impl CqRing {
    /// A fresh queue: memory zeroed, so the first pass expects phase 1.
    pub fn new(size: u16) -> CqRing {
        CqRing {
            size: size.max(2),
            head: 0,
            phase: true,
        }
    }

    pub fn head(&self) -> u16 {
        self.head
    }

    /// True when the entry at the head carries the current phase, i.e. was posted in this pass.
    pub fn is_new(&self, status_word: u16) -> bool {
        (status_word & 1 == 1) == self.phase
    }

    /// Consumes the entry at the head; the phase flips on every wrap.
    pub fn advance(&mut self) {
        self.head += 1;
        if self.head == self.size {
            self.head = 0;
            self.phase = !self.phase;
        }
    }
}

/// Free command identifiers of one queue, `0..n`.
#[derive(Debug, Clone)]
pub struct CidPool {
    free: Vec<u16>,
}

impl CidPool {
    pub fn new(n: u16) -> CidPool {
        CidPool {
            free: (0..n).rev().collect(),
        }
    }

    pub fn take(&mut self) -> Option<u16> {
        self.free.pop()
    }

    pub fn give(&mut self, cid: u16) {
        self.free.push(cid);
    }

    pub fn available(&self) -> usize {
        self.free.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sq_keeps_one_slot_free_and_wraps() {
        let mut sq = SqRing::new(4);
        assert_eq!(
            (sq.push(), sq.push(), sq.push()),
            (Some(0), Some(1), Some(2))
        );
        assert!(sq.is_full());
        assert_eq!(sq.push(), None);
        sq.set_head(2);
        assert_eq!(sq.used(), 1);
        assert_eq!(
            (sq.push(), sq.push()),
            (Some(3), Some(0)),
            "tail wraps to 0"
        );
        assert_eq!(sq.tail(), 1);
        sq.set_head(9);
        assert_eq!(sq.used(), 3, "a head past the ring is ignored");
    }

    #[test]
    fn cq_phase_flips_on_each_wrap() {
        let mut cq = CqRing::new(3);
        assert!(cq.is_new(1) && !cq.is_new(0));
        for _ in 0..3 {
            cq.advance();
        }
        assert_eq!(cq.head(), 0);
        assert!(cq.is_new(0) && !cq.is_new(1), "second pass expects phase 0");
        for _ in 0..3 {
            cq.advance();
        }
        assert!(cq.is_new(1));
    }

    #[test]
    fn cids_are_unique_until_given_back() {
        let mut p = CidPool::new(3);
        let a: Vec<_> = (0..3).map(|_| p.take().unwrap()).collect();
        assert_eq!(p.take(), None);
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, vec![0, 1, 2]);
        p.give(a[1]);
        assert_eq!(p.take(), Some(a[1]));
        assert_eq!(p.available(), 0);
    }
}
