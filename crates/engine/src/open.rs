//! The engine's spec kinds (its backends and the `fault` wrapper) and [`open`], which opens a
//! spec with those kinds only. Programs that know more kinds build a [`Registry`] with them (see
//! [`crate::registry`]) and open through it.

use crate::backend::{mem, redirect, sync, uring};
use crate::device::BlockDevice;
use crate::error::OpenError;
use crate::fault;
use crate::registry::{Kind, ReadOnly, Registry};
use crate::spec::Spec;

/// Opens a device from its spec string, with the engine's kinds only.
pub fn open(spec: &str) -> Result<Box<dyn BlockDevice>, OpenError> {
    Registry::engine().open(spec)
}

/// Opens a parsed spec with the engine's kinds only.
pub fn open_spec(spec: &Spec) -> Result<Box<dyn BlockDevice>, OpenError> {
    Registry::engine().open_spec(spec)
}

/// Opens the devices a wrapper holds.
pub type ChildOpener<'a> = &'a dyn Fn(&Spec) -> Result<Box<dyn BlockDevice>, OpenError>;

const BACKENDS: &str = "Backends";
const WRAPPERS: &str = "Wrappers";

/// Adds the engine's kinds to `registry`.
pub fn register(registry: &mut Registry) {
    for kind in [
        Kind {
            name: "mem",
            group: BACKENDS,
            usage: "mem:SIZE",
            help: "RAM disk (SIZE like 64M, 1G). Options: shuffle=SEED (completions out of order)",
            read_only: ReadOnly::ThroughChildren,
            open: |spec, _| boxed(mem::open_mem(spec)),
        },
        Kind {
            name: "null",
            group: BACKENDS,
            usage: "null:SIZE",
            help: "completes every command at once, stores nothing (measures the stack's own cost)",
            read_only: ReadOnly::ThroughChildren,
            open: |spec, _| boxed(mem::open_null(spec)),
        },
        Kind {
            name: "file",
            group: BACKENDS,
            usage: "file:PATH",
            help: "image file on the best path the kernel allows: io_uring + O_DIRECT, else\n\
                   buffered io_uring, else plain system calls. Options: size=SIZE creates or grows it",
            read_only: ReadOnly::RoOption,
            open: |spec, _| open_file(spec),
        },
        Kind {
            name: "uring",
            group: BACKENDS,
            usage: "uring:PATH",
            help: "io_uring on a file or block device (e.g. /dev/loop0). Options: size=, direct=0|1,\n\
                   sqpoll=0|1, iopoll=0|1, fixed=0|1 (registered file and buffers),\n\
                   batch=0|1 (hold commands until the doorbell), spin_us=N (hybrid polling)",
            read_only: ReadOnly::RoOption,
            open: |spec, _| boxed(uring::open(spec)),
        },
        Kind {
            name: "sync",
            group: BACKENDS,
            usage: "sync:PATH",
            help: "plain pread/pwrite/fdatasync through the page cache, the kernel-mediated\n\
                   baseline. Options: size=, direct=0|1",
            read_only: ReadOnly::RoOption,
            open: |spec, _| boxed(sync::open(spec)),
        },
        Kind {
            name: "redirect",
            group: BACKENDS,
            usage: "redirect:PATH",
            help: "every command served by a separate proxy process over shared memory, which\n\
                   does buffered system calls and copies the data back (the paper's baseline).\n\
                   Options: size=, link=none|aurora, call_us=F, copy_gbps=F (a modeled link;\n\
                   results that use it are labelled \"modeled\")",
            read_only: ReadOnly::RoOption,
            open: |spec, _| boxed(redirect::open(spec)),
        },
        Kind {
            name: "fault",
            group: WRAPPERS,
            usage: "fault(SPEC)",
            help: "injects faults: read_eio=N, write_eio=N, flush_eio=N (the Nth command fails with\n\
                   EIO), cut_after=N (power cut at the Nth write: unflushed blocks survive with\n\
                   probability keep=P, seeded by seed=S), record=1 (trace writes and flushes)",
            read_only: ReadOnly::ThroughChildren,
            open: |spec, registry| boxed(fault::open(spec, &|child| registry.open_spec(child))),
        },
    ] {
        registry.add(kind);
    }
}

fn boxed<D: BlockDevice + 'static>(
    opened: Result<D, OpenError>,
) -> Result<Box<dyn BlockDevice>, OpenError> {
    opened.map(|d| Box::new(d) as Box<dyn BlockDevice>)
}

/// `file:PATH` — an image file on the fastest path the kernel allows: io_uring with O_DIRECT,
/// falling back to buffered io_uring, then to synchronous system calls.
fn open_file(spec: &Spec) -> Result<Box<dyn BlockDevice>, OpenError> {
    let as_uring = Spec {
        kind: "uring".into(),
        ..spec.clone()
    };
    match uring::open(&as_uring) {
        Ok(dev) => Ok(Box::new(dev)),
        Err(OpenError::Unavailable { .. }) => {
            let as_sync = Spec {
                kind: "sync".into(),
                ..spec.clone()
            };
            let mut allowed: Vec<&str> = crate::backend::common::COMMON_OPTIONS.to_vec();
            allowed.extend(sync::FILE_OPTIONS);
            as_sync.check_options(&allowed)?;
            Ok(Box::new(sync::open(&as_sync)?))
        }
        Err(e) => Err(e),
    }
}
