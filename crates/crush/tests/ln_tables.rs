//! The generated `crush_ln` tables against the ones Ceph maps with: the installed
//! `libceph-common` (Debian `ceph-base`) carries them as data; every one of the 258 + 256
//! entries must match.

use std::path::PathBuf;

use kura_crush::ln::{LL, RH_LH};

fn library() -> Option<PathBuf> {
    [
        "/usr/lib/x86_64-linux-gnu/ceph/libceph-common.so.2",
        "/usr/lib/aarch64-linux-gnu/ceph/libceph-common.so.2",
        "/usr/lib64/ceph/libceph-common.so.2",
        "/usr/lib/ceph/libceph-common.so.2",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.exists())
}

fn le_bytes(v: &[u64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn read_table(bytes: &[u8], at: usize, n: usize) -> Vec<u64> {
    bytes[at..at + n * 8]
        .chunks_exact(8)
        .map(|c| {
            let mut a = [0u8; 8];
            a.copy_from_slice(c);
            u64::from_le_bytes(a)
        })
        .collect()
}

#[test]
fn generated_tables_equal_ceph_library_tables() {
    let Some(lib) = library() else {
        kura_testkit::skip(
            "generated_tables_equal_ceph_library_tables",
            "crushtool",
            "libceph-common is not installed (apt-get install ceph-base)",
        );
        return;
    };
    let bytes = std::fs::read(&lib).expect("read libceph-common");
    // Find each table by its first entries (as generated here), then compare all of it.
    let at = find(&bytes, &le_bytes(&RH_LH[..4])).expect("RH/LH table in libceph-common");
    let theirs = read_table(&bytes, at, RH_LH.len());
    for (k, (a, b)) in RH_LH.iter().zip(&theirs).enumerate() {
        assert_eq!(a, b, "RH_LH[{k}]: generated {a:#x}, Ceph {b:#x}");
    }
    let at = find(&bytes, &le_bytes(&LL[..3])).expect("LL table in libceph-common");
    let theirs = read_table(&bytes, at, LL.len());
    for (k, (a, b)) in LL.iter().zip(&theirs).enumerate() {
        assert_eq!(a, b, "LL[{k}]: generated {a:#x}, Ceph {b:#x}");
    }
}
