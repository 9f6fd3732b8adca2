//! Shared by the engine's integration tests: the list of backends every device-interface test
//! runs on, each named by the spec string a user would type.

// Each test binary compiles this module and uses a different part of it.
#![allow(dead_code)]

use kura_engine::{open, BlockDevice, OpenError};
use std::path::Path;

/// Geometry used by the model tests: small blocks and a small max transfer so that splitting and
/// many in-flight requests happen on every run.
pub const BLOCK: usize = 4096;
pub const BLOCKS: u64 = 256;
pub const OPTS: &str = "bs=4096&max_transfer=16K&qd=8";

/// Spec strings for every backend that stores data, with image files under `dir`.
pub fn data_backends(dir: &Path) -> Vec<String> {
    let img = |name: &str| dir.join(name).display().to_string();
    let size = BLOCKS * BLOCK as u64;
    vec![
        format!("mem:{size}?{OPTS}"),
        format!("mem:{size}?{OPTS}&shuffle=7"),
        format!("sync:{}?size={size}&{OPTS}", img("sync.img")),
        format!(
            "sync:{}?size={size}&direct=1&{OPTS}",
            img("sync-direct.img")
        ),
        format!("uring:{}?size={size}&{OPTS}", img("uring.img")),
        format!(
            "uring:{}?size={size}&direct=0&{OPTS}",
            img("uring-buffered.img")
        ),
        format!(
            "uring:{}?size={size}&batch=1&sqpoll=1&{OPTS}",
            img("uring-batched.img")
        ),
        format!("file:{}?size={size}&{OPTS}", img("file.img")),
        format!("redirect:{}?size={size}&{OPTS}", img("redirect.img")),
        format!("fault(mem:{size}?{OPTS})"),
        format!("fault(sync:{}?size={size}&{OPTS})", img("fault-sync.img")),
    ]
}

/// Opens `spec`, or says visibly why this test cannot run it here (a kernel without io_uring).
pub fn open_or_skip(spec: &str) -> Option<Box<dyn BlockDevice>> {
    match open(spec) {
        Ok(dev) => Some(dev),
        Err(OpenError::Unavailable {
            backend,
            feature,
            why,
        }) => {
            // Only the kernel refusing io_uring, or a file system refusing O_DIRECT, is a
            // missing capability; any other Unavailable is a failure.
            let capability = match feature.as_str() {
                "io_uring" => "io_uring",
                "O_DIRECT" => "o_direct",
                _ => panic!("{spec}: {backend}: {feature} unavailable: {why}"),
            };
            kura_testkit::skip(
                &format!("open {spec}"),
                capability,
                &format!("{backend}: {feature} unavailable here: {why}"),
            );
            None
        }
        Err(e) => panic!("{spec}: {e}"),
    }
}
