//! Bad input on every backend: each case is a clear, typed error — never a panic, never a
//! request silently dropped.

mod common;

use common::{data_backends, open_or_skip, BLOCKS};
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
fn invalid_requests_are_refused_with_the_reason_on_every_backend() {
    let dir = tempfile::tempdir().unwrap();
    for spec in data_backends(dir.path())
        .iter()
        .chain([&"null:1M?bs=4096".to_string()])
    {
        let Some(mut dev) = open_or_skip(spec) else {
            continue;
        };
        let blocks = dev.geometry().num_blocks;
        let dev = &mut *dev;
        assert!(
            matches!(
                rejected(dev, Request::read(1, 0, 0, IoBuf::zeroed(4096))),
                DeviceError::ZeroLength { .. }
            ),
            "{spec}"
        );
        assert!(
            matches!(rejected(dev, Request::write(2, blocks, 1, IoBuf::zeroed(4096))), DeviceError::OutOfRange { lba, .. } if lba == blocks),
            "{spec}"
        );
        assert!(
            matches!(
                rejected(dev, Request::read(3, blocks - 1, 2, IoBuf::zeroed(8192))),
                DeviceError::OutOfRange { .. }
            ),
            "{spec}"
        );
        assert!(
            matches!(
                rejected(dev, Request::discard(4, u64::MAX, 2)),
                DeviceError::OutOfRange { .. }
            ),
            "{spec}: LBA overflow"
        );
        assert!(
            matches!(
                rejected(dev, Request::read(5, 0, 2, IoBuf::zeroed(4096))),
                DeviceError::BadBuffer { need: 8192, .. }
            ),
            "{spec}"
        );
        let no_buffer = Request {
            tag: 6,
            op: kura_engine::Opcode::Write,
            lba: 0,
            blocks: 1,
            buf: None,
        };
        assert!(
            matches!(
                rejected(dev, no_buffer),
                DeviceError::BadBuffer { have: 0, .. }
            ),
            "{spec}"
        );
        assert_eq!(
            dev.in_flight(),
            0,
            "{spec}: nothing was queued by refused requests"
        );
        let _ = BLOCKS;
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
            Err(OpenError::Unavailable { why, .. }) => eprintln!("SKIPPED: {kind}: {why}"),
            other => panic!(
                "{kind} on a 100-byte file: {:?}",
                other.map(|d| d.describe())
            ),
        }
        let missing = dir.path().join("missing.img");
        match open(&format!("{kind}:{}", missing.display())) {
            Err(OpenError::Os { errno, .. }) => assert_eq!(errno.0, libc::ENOENT),
            Err(OpenError::Unavailable { why, .. }) => eprintln!("SKIPPED: {kind}: {why}"),
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
