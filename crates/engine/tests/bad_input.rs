//! Bad input: each case is a clear, typed error — never a panic, never a request silently
//! dropped. (Invalid requests on every backend are part of the device-interface suite,
//! `tests/conformance.rs`.)

mod common;

use common::open_or_skip;
use kura_engine::{open, BlockDevice, DeviceError, IoBuf, OpenError, Request};

fn rejected(dev: &mut dyn BlockDevice, req: Request) -> DeviceError {
    let tag = req.tag;
    match dev.submit(req) {
        Ok(()) => panic!("{}: request {tag} was accepted", dev.describe()),
        Err(r) => {
            assert_eq!(r.request.tag, tag, "the request comes back whole");
            r.error
        }
    }
}

#[test]
fn misaligned_buffers_are_refused_before_reaching_o_direct() {
    let dir = tempfile::tempdir().unwrap();
    let specs = [
        format!("sync:{}/a.img?size=1M&direct=1", dir.path().display()),
        format!("uring:{}/b.img?size=1M&direct=1", dir.path().display()),
    ];
    for spec in &specs {
        let Some(mut dev) = open_or_skip(spec) else {
            continue;
        };
        let err = rejected(
            &mut *dev,
            Request::write(1, 0, 1, IoBuf::heap_offset(4096, 1)),
        );
        assert!(
            matches!(
                err,
                DeviceError::Misaligned {
                    what: "buffer address",
                    ..
                }
            ),
            "{spec}: {err}"
        );
    }
    // Buffered I/O takes any alignment.
    let mut dev = open(&format!("sync:{}/c.img?size=1M", dir.path().display())).unwrap();
    let done = kura_engine::BlockingIo::run(
        &mut *dev,
        Request::write(1, 0, 1, IoBuf::heap_offset(4096, 1)),
    )
    .unwrap();
    assert!(done.status.is_ok());
}

#[test]
fn unusable_targets_give_clear_open_errors() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = dir.path().join("tiny.img");
    std::fs::write(&tiny, [0u8; 100]).unwrap();
    for kind in ["sync", "uring", "redirect"] {
        match open(&format!("{kind}:{}", tiny.display())) {
            Err(OpenError::TooSmall { actual: 100, .. }) => {}
            Err(OpenError::Unavailable { feature, why, .. })
                if kind == "uring" && feature == "io_uring" =>
            {
                kura_testkit::skip("unusable_targets_give_clear_open_errors", "io_uring", &why)
            }
            other => panic!(
                "{kind} on a 100-byte file: {:?}",
                other.map(|d| d.describe())
            ),
        }
        let missing = dir.path().join("missing.img");
        match open(&format!("{kind}:{}", missing.display())) {
            Err(OpenError::Os { errno, .. }) => assert_eq!(errno.0, libc::ENOENT),
            Err(OpenError::Unavailable { feature, why, .. })
                if kind == "uring" && feature == "io_uring" =>
            {
                kura_testkit::skip("unusable_targets_give_clear_open_errors", "io_uring", &why)
            }
            other => panic!(
                "{kind} on a missing file: {:?}",
                other.map(|d| d.describe())
            ),
        }
    }
    let dir_err = open(&format!("sync:{}", dir.path().display()))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(!dir_err.is_empty(), "a directory is not a device");
}

#[test]
fn spec_typos_get_a_did_you_mean() {
    let cases = [
        ("mme:64M", "did you mean `mem`"),
        ("mem:64M?qdd=4", "did you mean `qd`"),
        ("mem:64Q", "unknown unit"),
        ("mem:0", "larger than zero"),
        ("mem:64M?bs=1000", "power of two"),
        ("mem:64M?qd=0", "queue depth"),
        ("mem:64M?max_transfer=100", "multiple of the block size"),
        ("sync:/tmp/x.img?direct=maybe", "not a boolean"),
        ("fault(mem:64M", "closing `)`"),
        ("sync", "followed by `:`"),
        ("sync:", "needs a target"),
    ];
    for (spec, want) in cases {
        let err = open(spec)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_else(|| panic!("{spec} opened"));
        assert!(
            err.contains(want),
            "{spec}: `{err}` should mention `{want}`"
        );
    }
}

#[test]
fn spec_parser_never_panics_on_arbitrary_text() {
    use proptest::prelude::*;
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 2000,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    runner
        .run(&"[a-z:(),?&=0-9/._MKG]{0,40}", |text| {
            let _ = kura_engine::Spec::parse(&text);
            if !text.contains('/') {
                let _ = open(&text);
            }
            Ok(())
        })
        .unwrap();
}
