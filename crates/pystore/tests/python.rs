//! Runs the Python tests of the `kura` module (`tests/test_*.py`) under pytest: the built
//! extension is copied into a temporary directory as `kura.so`, the name Python imports, and that
//! directory is put on `PYTHONPATH`. The LevelDB tests also get an AccelFS image formatted here
//! (`KURA_TEST_ACCELFS_IMAGE`), and plyvel for the interoperability checks; what is missing skips
//! through kura_testkit (so CI, where scripts/setup.sh installs both, fails instead), and the
//! pytest suite is told with `KURA_TEST_NO_LEVELDB` / `KURA_TEST_NO_PLYVEL`.

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The extension cargo built for this test: `target/<profile>/deps/libkura_store.so`, beside the
/// test binary (`cargo test` builds the library first but copies it up to `target/<profile>`
/// only in `cargo build`, so the copy there may be older). Built on the spot when absent (a
/// test binary run on its own, after a `cargo clean -p kura-pystore`).
fn extension() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let deps = exe.parent().expect("the test binary's directory");
    let candidates = [
        Some(deps.join("libkura_store.so")),
        deps.parent().map(|d| d.join("libkura_store.so")),
    ];
    if let Some(found) = candidates.iter().flatten().find(|p| p.is_file()) {
        return found.clone();
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "-p", "kura-pystore"])
        .status()
        .expect("running cargo build -p kura-pystore");
    assert!(status.success(), "cargo build -p kura-pystore failed");
    candidates
        .iter()
        .flatten()
        .find(|p| p.is_file())
        .cloned()
        .expect("libkura_store.so after cargo build -p kura-pystore")
}

fn python_has(module: &str) -> bool {
    Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn kura_module_passes_its_pytest_suites() {
    if kura_testkit::which("python3").is_none() {
        kura_testkit::skip(
            "pystore::python",
            "python3",
            "python3 is not installed (scripts/setup.sh installs it)",
        );
        return;
    }
    if !python_has("pytest") {
        kura_testkit::skip(
            "pystore::python",
            "pytest",
            "pytest is not installed for python3 (scripts/setup.sh installs it)",
        );
        return;
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::fs::copy(extension(), dir.path().join("kura.so")).expect("copying the extension");
    run_suites(Path::new("python3"), Some(dir.path()), dir.path());
}

/// `pip install ./crates/pystore` (maturin, a release build: minutes, and PyPI access for
/// maturin), then the same suites against the installed module. Ignored by default, so it
/// shows as ignored rather than passing without running: `cargo test -p kura-pystore --test
/// python -- --ignored`. CI runs the suites on the cargo-built module above.
#[test]
#[ignore = "a release build through maturin from PyPI (minutes): run with --ignored"]
fn pip_installed_module_passes_its_pytest_suites() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let venv = dir.path().join("venv");
    // System site packages: pytest and plyvel come from there, kura from the venv.
    let made = Command::new("python3")
        .args(["-m", "venv", "--system-site-packages"])
        .arg(&venv)
        .status()
        .expect("running python3 -m venv");
    assert!(made.success(), "python3 -m venv failed");
    let started = std::time::Instant::now();
    let installed = Command::new(venv.join("bin/pip"))
        .args(["install", "--disable-pip-version-check"])
        .arg(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("running pip install");
    assert!(installed.success(), "pip install ./crates/pystore failed");
    println!("pip install took {:.0?}", started.elapsed());
    run_suites(&venv.join("bin/python"), None, dir.path());
}

/// Runs `tests/test_*.py` under pytest with `python`, the module found through `pythonpath`
/// (or installed), in the temporary directory `dir`.
fn run_suites(python: &Path, pythonpath: Option<&Path>, dir: &Path) {
    let mut pytest = Command::new(python);
    pytest
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests"))
        // pytest's own temporary files stay inside this test's directory.
        .arg("--basetemp")
        .arg(dir.join("pytest"))
        .env("PYTHONDONTWRITEBYTECODE", "1");
    if let Some(path) = pythonpath {
        pytest.env("PYTHONPATH", path);
    }
    if !kura_kv::leveldb_available() {
        kura_testkit::skip(
            "pystore::python leveldb engine",
            "leveldb",
            "kura-kv was built without LevelDB (install libleveldb-dev; scripts/setup.sh does)",
        );
        pytest.env("KURA_TEST_NO_LEVELDB", "1");
    } else if !python_has("plyvel") {
        kura_testkit::skip(
            "pystore::python plyvel interop",
            "plyvel",
            "plyvel is not installed for python3 (scripts/setup.sh installs it)",
        );
        pytest.env("KURA_TEST_NO_PLYVEL", "1");
    }
    // An AccelFS for kura.DB(engine="leveldb", dev=...), as `kura mkfs` would make it.
    let image = dir.join("accelfs.img");
    let dev = kura_engine::open(&format!("file:{}?size=64M", image.display()))
        .expect("creating the AccelFS image");
    kura_accelfs::FileSystem::format(
        dev,
        kura_accelfs::MkfsOptions {
            block_size: 4096,
            inodes: None,
        },
        kura_accelfs::MountOptions::default(),
    )
    .expect("formatting the AccelFS image")
    .unmount()
    .expect("unmounting the AccelFS image");
    pytest.env("KURA_TEST_ACCELFS_IMAGE", &image);
    let out = pytest.output().expect("running python3 -m pytest");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    assert!(
        out.status.success(),
        "pytest failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    // Exit 0 also when pytest collected nothing: make sure the suite ran.
    assert!(stdout.contains(" passed"), "pytest ran no test:\n{stdout}");
}
