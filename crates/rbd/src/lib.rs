//! Ceph RBD images as kura block devices: `rbd:POOL/IMAGE?conf=&id=&keyring=&snap=&create=`.
//!
//! DeLiBA's stack (NBD → LRU cache → coalescing scheduler → librbd) is then one spec, e.g.
//! `coalesce(cache(rbd:rbd/img?conf=/c/ceph.conf)?size=32M)`, and AccelFS, the LevelDB port and
//! the genome pipeline run on a Ceph image like on any other device.
//!
//! - `options`: the spec and its checks (no Ceph call);
//! - `ffi` (only with librbd): the hand-written librados/librbd declarations and owning handles,
//!   all of the crate's unsafe code;
//! - `device` (only with librbd): [`RbdDevice`], the `BlockDevice` on librbd's asynchronous API;
//! - `error`: [`RbdError`];
//! - [`testing`]: a throw-away cluster (`scripts/ceph/start.sh`) for tests and benches.
//!
//! No crate wraps librbd: `ceph` 3.x on crates.io binds librados only, and the RBD crates found
//! are unmaintained, so the dozen functions kura needs are declared by hand against Debian's
//! 16.2 headers. `build.rs` links them only where they are installed; elsewhere (or with
//! `KURA_NO_RBD=1`) `rbd:` says kura was built without librbd.

#[cfg(not(kura_no_rbd))]
mod device;
mod error;
#[cfg(not(kura_no_rbd))]
#[allow(unsafe_code)] // the librados/librbd FFI and its owning handles
mod ffi;
pub mod options;
pub mod testing;

#[cfg(not(kura_no_rbd))]
pub use device::RbdDevice;
pub use error::RbdError;
pub use options::RbdSpec;

use kura_engine::registry::ReadOnly;
use kura_engine::{BlockDevice, Kind, OpenError, Registry, Spec};

/// True when this build links librbd (else `rbd:` opens fail with [`RbdError::NotBuilt`]).
pub const BUILT_WITH_LIBRBD: bool = cfg!(not(kura_no_rbd));

/// Adds `rbd:` to `registry`.
pub fn register(registry: &mut Registry) {
    registry.add(Kind {
        name: "rbd",
        group: "Remote devices",
        usage: "rbd:POOL/IMAGE",
        help:
            "a Ceph RBD image through librbd's asynchronous API. Options: conf=PATH (ceph.conf),\n\
               id=NAME (cephx user, default admin), keyring=PATH, mon_host=ADDRS, snap=NAME\n\
               (read-only), create=SIZE (create when missing), ro=1, timeout=SECS (connect and\n\
               every request, default 30); requests are cut at the object size",
        read_only: ReadOnly::RoOption,
        open: |spec, _| open(spec).map(|d| d as Box<dyn BlockDevice>),
    });
}

/// Opens an `rbd:` spec.
pub fn open(spec: &Spec) -> Result<Box<dyn BlockDevice>, OpenError> {
    let parsed = RbdSpec::parse(spec)?;
    open_parsed(&parsed).map_err(|e| e.into_open_error(&parsed.name()))
}

#[cfg(not(kura_no_rbd))]
fn open_parsed(spec: &RbdSpec) -> Result<Box<dyn BlockDevice>, RbdError> {
    Ok(Box::new(RbdDevice::open(spec)?))
}

#[cfg(kura_no_rbd)]
fn open_parsed(_spec: &RbdSpec) -> Result<Box<dyn BlockDevice>, RbdError> {
    Err(RbdError::NotBuilt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rbd_is_registered_with_the_ro_option() {
        let mut reg = Registry::engine();
        register(&mut reg);
        let kind = reg.get("rbd").expect("registered");
        assert_eq!(kind.read_only, ReadOnly::RoOption);
        let mut spec = Spec::parse("cache(rbd:p/i?conf=/x)").unwrap();
        reg.mark_read_only(&mut spec);
        assert_eq!(spec.children[0].option("ro"), Some("1"));
    }

    #[test]
    fn bad_specs_fail_before_any_cluster_is_asked() {
        let mut reg = Registry::engine();
        register(&mut reg);
        let e = reg.open("rbd:noslash").err().expect("refused").to_string();
        assert!(e.contains("POOL/IMAGE"), "{e}");
    }

    #[cfg(kura_no_rbd)]
    #[test]
    fn without_librbd_rbd_says_how_to_get_it() {
        let mut reg = Registry::engine();
        register(&mut reg);
        let e = reg.open("rbd:rbd/x").err().expect("refused").to_string();
        assert!(e.contains("built without librbd"), "{e}");
        assert!(e.contains("librbd-dev librados-dev"), "{e}");
    }
}
