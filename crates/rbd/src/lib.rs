//! Ceph RBD images as kura block devices: `rbd:POOL/IMAGE?conf=&id=&keyring=&snap=&create=`.
//!
//! DeLiBA's stack (NBD → LRU cache → coalescing scheduler → librbd) is then one spec, e.g.
//! `coalesce(cache(rbd:rbd/img?conf=/c/ceph.conf)?size=32M)`, and AccelFS, the LevelDB port and
//! the genome pipeline run on a Ceph image like on any other device.
//!
//! - `options`: the spec and its checks (no Ceph call);
//! - `ffi`: the hand-written librados/librbd declarations, loaded with `dlopen` on the first
//!   `rbd:` open, and owning handles, all of the crate's unsafe code;
//! - `device`: [`RbdDevice`], the `BlockDevice` on librbd's asynchronous API;
//! - `error`: [`RbdError`];
//! - [`testing`]: a throw-away cluster (`scripts/ceph/start.sh`) for tests and benches.
//!
//! No crate wraps librbd: `ceph` 3.x on crates.io binds librados only, and the RBD crates found
//! are unmaintained, so the two dozen functions kura needs are declared by hand against Debian's
//! 16.2 headers. They are not linked: `librbd.so.1` and `librados.so.2` are loaded the first
//! time an `rbd:` spec is opened, so a kura process that never opens one maps none of Ceph
//! (about 8 MiB of resident memory in every process otherwise), and the same binary runs where
//! librbd is not installed, where opening `rbd:` says which package to install. `KURA_NO_RBD=1`
//! at build time leaves `rbd:` out altogether (the aarch64 cross build).

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

/// True when this build has `rbd:` (else `rbd:` opens fail with [`RbdError::NotBuilt`]).
pub const BUILT_WITH_LIBRBD: bool = cfg!(not(kura_no_rbd));

/// `Ok` when `rbd:` can be opened here: built in, and librbd and librados load (the first call
/// loads them); else why not.
pub fn librbd_available() -> Result<(), RbdError> {
    #[cfg(not(kura_no_rbd))]
    return ffi::library()
        .map(|_| ())
        .map_err(|detail| RbdError::Library { detail });
    #[cfg(kura_no_rbd)]
    return Err(RbdError::NotBuilt);
}

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
        assert!(e.contains("built without rbd: support"), "{e}");
        assert!(e.contains("KURA_NO_RBD"), "{e}");
    }
}
