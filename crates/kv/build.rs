//! Compiles the C++ bridge to Google LevelDB (`cpp/kura_leveldb.cc`) and links Debian's
//! libleveldb. Without its headers (`libleveldb-dev`), the crate builds without the engine and
//! `Db::open` says how to install it. `KURA_NO_LEVELDB=1` forces that build even where LevelDB is
//! present (to build and lint it).

fn main() {
    println!("cargo::rustc-check-cfg=cfg(kura_no_leveldb)");
    println!("cargo:rerun-if-changed=cpp/kura_leveldb.cc");
    println!("cargo:rerun-if-env-changed=KURA_NO_LEVELDB");
    if std::env::var_os("KURA_NO_LEVELDB").is_some_and(|v| v != "0") {
        println!("cargo:warning=KURA_NO_LEVELDB is set: kura-kv builds without Google LevelDB");
        println!("cargo:rustc-cfg=kura_no_leveldb");
        return;
    }
    let header = [
        "/usr/include/leveldb/env.h",
        "/usr/local/include/leveldb/env.h",
    ]
    .iter()
    .any(|p| std::path::Path::new(p).exists());
    if !header {
        println!("cargo:warning=libleveldb-dev not found: kura-kv builds without Google LevelDB");
        println!("cargo:rustc-cfg=kura_no_leveldb");
        return;
    }
    let mut build = cc::Build::new();
    if std::env::var_os("CARGO_FEATURE_TEST_HOOKS").is_some() {
        // kura_test_throw: tests make the bridge throw (see src/lib.rs, test_hooks).
        build.define("KURA_TEST_HOOKS", None);
    }
    build
        .cpp(true)
        .file("cpp/kura_leveldb.cc")
        .flag("-std=c++17")
        // Debian's libleveldb is built without RTTI; the Env subclass must match.
        .flag("-fno-rtti")
        .warnings(true)
        .compile("kura_leveldb");
    println!("cargo:rustc-link-lib=leveldb");
}
