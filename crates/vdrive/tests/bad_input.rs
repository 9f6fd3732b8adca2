//! Bad specs are refused with a message that says what is wrong, and bad requests are refused
//! whole, never panicking.

use kura_engine::{BlockDevice, DeviceError, IoBuf, Request};

fn error_of(spec: &str) -> String {
    match kura_vdrive::open(spec) {
        Ok(dev) => panic!("{spec} opened as {}", dev.describe()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_specs_are_refused_with_clear_messages() {
    for (spec, want) in [
        ("stripe(mem:1M)", "takes at least 2 devices, got 1"),
        ("concat(mem:1M)", "takes at least 2 devices, got 1"),
        ("mirror(mem:1M)", "takes 2 to 64 devices, got 1"),
        ("split(mem:1M,mem:1M)", "takes exactly 1 device, got 2"),
        ("cache(mem:1M,mem:1M)", "takes exactly 1 device, got 2"),
        ("stripe:/tmp/x", "takes no `:` target"),
        (
            "stripe(mem:1M,mem:1M)?chunk=6K",
            "not a non-zero multiple of the block size",
        ),
        (
            "stripe(mem:1M,mem:1M)?chunk=0",
            "not a non-zero multiple of the block size",
        ),
        ("stripe(mem:1M,mem:1M)?chunk=2M", "smaller than one chunk"),
        ("stripe(mem:1M,mem:1M?bs=512)", "different block sizes"),
        ("concat(mem:1M,mem:1M?bs=512)", "different block sizes"),
        ("mirror(mem:1M,mem:1M?bs=512)", "different block sizes"),
        (
            "split(mem:1M)?offset=768K&len=512K",
            "runs past the end of the device",
        ),
        (
            "split(mem:1M)?offset=2M",
            "len 0 must be a non-zero multiple",
        ),
        (
            "split(mem:1M)?offset=1000",
            "offset 1000 is not a multiple of the block size",
        ),
        (
            "split(mem:1M)?len=6000",
            "len 6000 must be a non-zero multiple",
        ),
        ("cache(mem:1M)?mode=wx", "mode `wx` is not a cache mode"),
        ("cache(mem:1M)?size=100", "smaller than one 4096-byte block"),
        ("cache(mem:1M)?size=lots", "option `size`"),
        ("mirorr(mem:1M,mem:1M)", "did you mean `mirror`"),
        ("stripe(mem:1M,mem:1M)?chunkk=64K", "did you mean `chunk`"),
        ("concat(mem:1M,mem:1M)?chunk=64K", "has no option `chunk`"),
        ("stripe(mem:1M,bogus:1M)", "unknown device kind `bogus`"),
        (
            "mirror(stripe(mem:1M,mem:1M)?chunk=3K,mem:2M)",
            "chunk 3072",
        ),
        ("fault(stripe(mem:1M))", "takes at least 2 devices"),
        ("stripe(mem:1M,mem:1M", "missing its closing"),
    ] {
        let err = error_of(spec);
        assert!(err.contains(want), "{spec}: `{err}` does not say `{want}`");
    }
}

#[test]
fn bad_requests_are_refused_whole() {
    for spec in [
        "split(mem:1M)?len=64K",
        "concat(mem:64K,mem:64K)",
        "stripe(mem:64K,mem:64K)?chunk=8K",
        "mirror(mem:128K,mem:128K)",
        "cache(mem:128K)",
    ] {
        let mut dev = kura_vdrive::open(spec).unwrap();
        let blocks = dev.geometry().num_blocks;
        let err = dev
            .submit(Request::read(7, blocks - 1, 2, IoBuf::zeroed(8192)))
            .unwrap_err();
        assert!(
            matches!(err.error, DeviceError::OutOfRange { .. }),
            "{spec}: {}",
            err.error
        );
        assert_eq!(err.request.tag, 7);
        assert!(err.request.buf.is_some(), "{spec}: the buffer comes back");
        let err = dev.submit(Request::write_zeroes(8, 0, 0)).unwrap_err();
        assert!(
            matches!(err.error, DeviceError::ZeroLength { .. }),
            "{spec}"
        );
        let err = dev
            .submit(Request::write(9, 0, 2, IoBuf::zeroed(4096)))
            .unwrap_err();
        assert!(matches!(err.error, DeviceError::BadBuffer { .. }), "{spec}");
        assert_eq!(dev.in_flight(), 0);
    }
}

#[test]
fn a_failed_flush_poisons_a_stripe() {
    use kura_engine::BlockingIo;
    let mut dev = kura_vdrive::open("stripe(fault(mem:64K)?flush_eio=1,mem:64K)?chunk=4K").unwrap();
    dev.write_blocks(0, &[1u8; 8192]).unwrap();
    assert!(dev.flush_all().is_err());
    let err = dev.write_blocks(1, &[2u8; 4096]).unwrap_err();
    assert!(matches!(err, DeviceError::Poisoned { .. }), "{err}");
    let mut out = vec![0u8; 8192];
    dev.read_blocks(0, &mut out).unwrap();
    assert!(out.iter().all(|&b| b == 1), "reads still work");
}
