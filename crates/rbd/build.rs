//! kura-rbd links nothing from Ceph: librbd and librados are loaded at run time on the first
//! `rbd:` open (`src/ffi.rs`). `KURA_NO_RBD=1` leaves `rbd:` out of the build altogether (cfg
//! `kura_no_rbd`), for targets where it is not wanted (the aarch64 cross build).

fn main() {
    println!("cargo::rustc-check-cfg=cfg(kura_no_rbd)");
    println!("cargo:rerun-if-env-changed=KURA_NO_RBD");
    if std::env::var_os("KURA_NO_RBD").is_some_and(|v| v != "0") {
        println!("cargo:warning=KURA_NO_RBD is set: kura-rbd builds without rbd:");
        println!("cargo:rustc-cfg=kura_no_rbd");
    }
}
