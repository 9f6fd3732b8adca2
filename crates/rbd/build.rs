//! Links Ceph's librbd and librados (Debian's `librbd-dev`/`librados-dev`, 16.2) where their
//! headers and libraries are installed; `src/ffi.rs` declares the few functions kura calls by hand.
//! Without them the crate still builds (cfg `kura_no_rbd`) and opening `rbd:` says how to get
//! librbd. `KURA_NO_RBD=1` forces that build even where Ceph is present (to build and lint it).

use std::path::Path;

const INCLUDE_DIRS: &[&str] = &["/usr/include", "/usr/local/include"];
const LIB_DIRS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/lib",
];

fn main() {
    println!("cargo::rustc-check-cfg=cfg(kura_no_rbd)");
    println!("cargo:rerun-if-env-changed=KURA_NO_RBD");
    if std::env::var_os("KURA_NO_RBD").is_some_and(|v| v != "0") {
        println!("cargo:warning=KURA_NO_RBD is set: kura-rbd builds without librbd");
        println!("cargo:rustc-cfg=kura_no_rbd");
        return;
    }
    let headers = INCLUDE_DIRS.iter().any(|dir| {
        Path::new(dir).join("rbd/librbd.h").exists()
            && Path::new(dir).join("rados/librados.h").exists()
    });
    let lib_dir = LIB_DIRS.iter().find(|dir| {
        Path::new(dir).join("librbd.so").exists() && Path::new(dir).join("librados.so").exists()
    });
    match (headers, lib_dir) {
        (true, Some(dir)) => {
            println!("cargo:rerun-if-changed={dir}/librbd.so");
            println!("cargo:rustc-link-search=native={dir}");
            println!("cargo:rustc-link-lib=rbd");
            println!("cargo:rustc-link-lib=rados");
        }
        _ => {
            // Installing the packages later must bring rbd: in without a `cargo clean`.
            for dir in INCLUDE_DIRS.iter().filter(|d| Path::new(d).is_dir()) {
                println!("cargo:rerun-if-changed={dir}");
            }
            println!(
                "cargo:warning=librbd-dev/librados-dev not found: kura-rbd builds without librbd"
            );
            println!("cargo:rustc-cfg=kura_no_rbd");
        }
    }
}
