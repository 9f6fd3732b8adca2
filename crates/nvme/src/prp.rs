//! Physical Region Page construction: which PRP1/PRP2 (and PRP-list entries) describe a data
//! buffer, and how a transfer is cut into commands no larger than the controller accepts.
//!
//! With 4 KiB pages, PRP1 may start anywhere dword-aligned inside a page; every further entry
//! names a whole page. Two pages fit in PRP1/PRP2; more need a list page, whose 512 entries this
//! driver never chains, so one command covers at most 512 pages after the first.

use crate::regs::PAGE;

/// Entries in one PRP list page.
pub const LIST_ENTRIES: usize = PAGE / 8;

/// Largest transfer one command may carry so that one list page always suffices, whatever the
/// buffer's offset in its first page.
pub const MAX_PRP_TRANSFER: usize = LIST_ENTRIES * PAGE;

/// Why a buffer cannot be described by PRPs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrpError {
    /// PRP1 must be dword aligned.
    Misaligned(u64),
    /// The transfer needs more list entries than one page holds.
    TooLong(usize),
    Empty,
}

/// PRP1/PRP2 for one command; when a list is used, `list` holds its entries (to be written into
/// the list page whose address is PRP2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prps {
    pub prp1: u64,
    pub prp2: u64,
    pub list_len: usize,
}

/// Describes `len` bytes at I/O address `addr`. List entries go into `list`; `list_addr` is the
/// I/O address of that list page.
pub fn build(
    addr: u64,
    len: usize,
    list: &mut [u64; LIST_ENTRIES],
    list_addr: u64,
) -> Result<Prps, PrpError> {
    if len == 0 {
        return Err(PrpError::Empty);
    }
    if !addr.is_multiple_of(4) {
        return Err(PrpError::Misaligned(addr));
    }
    let page = PAGE as u64;
    let offset = (addr % page) as usize;
    let first = PAGE - offset;
    if len <= first {
        return Ok(Prps {
            prp1: addr,
            prp2: 0,
            list_len: 0,
        });
    }
    let rest = len - first;
    let next = addr - offset as u64 + page;
    if rest <= PAGE {
        return Ok(Prps {
            prp1: addr,
            prp2: next,
            list_len: 0,
        });
    }
    let pages = rest.div_ceil(PAGE);
    if pages > LIST_ENTRIES {
        return Err(PrpError::TooLong(len));
    }
    for (i, e) in list.iter_mut().take(pages).enumerate() {
        *e = next + (i as u64) * page;
    }
    Ok(Prps {
        prp1: addr,
        prp2: list_addr,
        list_len: pages,
    })
}

/// The pages a device reads for PRP1/PRP2 (following the list through `read_list`), as
/// `(address, bytes)` segments covering exactly `len` bytes. The simulated controller uses this;
/// it is the inverse of [`build`].
pub fn walk(
    prp1: u64,
    prp2: u64,
    len: usize,
    mut read_list: impl FnMut(u64, usize) -> Option<Vec<u64>>,
) -> Option<Vec<(u64, usize)>> {
    let page = PAGE as u64;
    let offset = (prp1 % page) as usize;
    let first = (PAGE - offset).min(len);
    let mut segs = vec![(prp1, first)];
    let mut rest = len - first;
    if rest == 0 {
        return Some(segs);
    }
    if rest <= PAGE {
        if !prp2.is_multiple_of(page) {
            return None;
        }
        segs.push((prp2, rest));
        return Some(segs);
    }
    let pages = rest.div_ceil(PAGE);
    if pages > LIST_ENTRIES {
        return None;
    }
    let list = read_list(prp2, pages)?;
    for e in list {
        if !e.is_multiple_of(page) {
            return None;
        }
        let n = rest.min(PAGE);
        segs.push((e, n));
        rest -= n;
    }
    Some(segs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn list() -> Box<[u64; LIST_ENTRIES]> {
        Box::new([0u64; LIST_ENTRIES])
    }

    #[test]
    fn one_two_and_many_pages() {
        let mut l = list();
        let p = build(0x10_0000, 4096, &mut l, 0x9000).unwrap();
        assert_eq!((p.prp1, p.prp2, p.list_len), (0x10_0000, 0, 0));
        let p = build(0x10_0000, 8192, &mut l, 0x9000).unwrap();
        assert_eq!((p.prp1, p.prp2, p.list_len), (0x10_0000, 0x10_1000, 0));
        let p = build(0x10_0200, 4096, &mut l, 0x9000).unwrap();
        assert_eq!(
            (p.prp2, p.list_len),
            (0x10_1000, 0),
            "offset crosses into a second page"
        );
        let p = build(0x10_0000, 3 * 4096, &mut l, 0x9000).unwrap();
        assert_eq!((p.prp2, p.list_len), (0x9000, 2));
        assert_eq!(&l[..2], &[0x10_1000, 0x10_2000]);
        assert_eq!(
            build(0x10_0002, 512, &mut l, 0).unwrap_err(),
            PrpError::Misaligned(0x10_0002)
        );
        assert_eq!(build(0, 0, &mut l, 0).unwrap_err(), PrpError::Empty);
    }

    #[test]
    fn the_largest_transfer_fits_one_list_page_at_any_offset() {
        let mut l = list();
        for off in [0u64, 4, 512, 4092] {
            let p = build(0x100_0000 + off, MAX_PRP_TRANSFER, &mut l, 0x9000).unwrap();
            assert!(p.list_len <= LIST_ENTRIES);
        }
        assert!(matches!(
            build(0x100_0000, MAX_PRP_TRANSFER + PAGE + 1, &mut l, 0x9000),
            Err(PrpError::TooLong(_))
        ));
    }

    proptest! {
        #[test]
        fn walk_inverts_build(page_off in 0u64..1024, len_blocks in 1usize..=1024, base_page in 1u64..1000) {
            let addr = base_page * 4096 * 1024 + page_off * 4;
            let len = len_blocks * 512;
            let mut l = list();
            let p = build(addr, len, &mut l, 0x7000).unwrap();
            let segs = walk(p.prp1, p.prp2, len, |a, n| {
                assert_eq!(a, 0x7000);
                Some(l[..n].to_vec())
            }).unwrap();
            prop_assert_eq!(segs.iter().map(|s| s.1).sum::<usize>(), len);
            // The segments describe one contiguous run starting at addr.
            let mut at = addr;
            for (a, n) in segs {
                prop_assert_eq!(a, at);
                at += n as u64;
            }
        }
    }
}
