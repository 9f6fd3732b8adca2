//! Finds OpenSSL (libssl and libcrypto, 1.1.1 or newer) with `pkg-config` for TLS-PSK
//! (`src/psk/`). rustls, kura's TLS for certificates, has no external pre-shared keys, so PSK
//! sessions run on the system's OpenSSL through a few hand-written declarations.
//!
//! Without `pkg-config` or OpenSSL's development files (`libssl-dev`) the crate still builds,
//! with no `kura_openssl` cfg: certificates keep working and `--tls-psk` says how to get PSK.
//! `KURA_NO_OPENSSL=1` forces that build even where OpenSSL is present (to test it).

use std::process::Command;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(kura_openssl)");
    println!("cargo:rerun-if-env-changed=KURA_NO_OPENSSL");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    if std::env::var_os("KURA_NO_OPENSSL").is_some_and(|v| v != "0") {
        println!("cargo:warning=KURA_NO_OPENSSL is set: kura-nbd builds without TLS-PSK");
        return;
    }
    match probe() {
        Ok(flags) => {
            for flag in flags.split_whitespace() {
                if let Some(dir) = flag.strip_prefix("-L") {
                    println!("cargo:rustc-link-search=native={dir}");
                } else if let Some(lib) = flag.strip_prefix("-l") {
                    println!("cargo:rustc-link-lib={lib}");
                }
            }
            println!("cargo:rustc-cfg=kura_openssl");
        }
        Err(why) => {
            // Installing libssl-dev later must bring PSK in without a `cargo clean`: it adds
            // headers under /usr/include, which reruns this probe.
            if std::path::Path::new("/usr/include").is_dir() {
                println!("cargo:rerun-if-changed=/usr/include");
            }
            println!(
                "cargo:warning=kura-nbd builds without TLS-PSK ({why}; install libssl-dev and \
                 pkg-config)"
            );
        }
    }
}

/// The linker flags of OpenSSL 1.1.1 or newer (the first with TLS 1.3 and
/// `SSL_CTX_set_num_tickets`), or why there are none.
fn probe() -> Result<String, String> {
    let pkg_config = |args: &[&str]| {
        Command::new("pkg-config")
            .args(args)
            .output()
            .map_err(|e| format!("pkg-config could not run: {e}"))
    };
    let exists = pkg_config(&["--atleast-version=1.1.1", "openssl"])?;
    if !exists.status.success() {
        return Err("pkg-config finds no OpenSSL 1.1.1 or newer".into());
    }
    let libs = pkg_config(&["--libs", "openssl"])?;
    if !libs.status.success() {
        return Err("pkg-config --libs openssl failed".into());
    }
    let flags = String::from_utf8(libs.stdout).map_err(|_| "pkg-config printed non-UTF-8")?;
    // An upgraded or removed OpenSSL reruns the probe.
    if let Ok(dir) = pkg_config(&["--variable=pcfiledir", "openssl"]) {
        let dir = String::from_utf8_lossy(&dir.stdout).trim().to_owned();
        if !dir.is_empty() {
            println!("cargo:rerun-if-changed={dir}/openssl.pc");
        }
    }
    if !flags.contains("-lssl") {
        return Err(format!(
            "pkg-config --libs openssl names no libssl: {flags}"
        ));
    }
    Ok(flags)
}
