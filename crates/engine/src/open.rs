//! Turning a spec string into a device: the registry of the engine's backend and wrapper kinds.
//!
//! Upper layers that add kinds (virtual drives) call [`open_engine_kind`] for everything they do
//! not know, passing their own opener so that wrappers can hold any kind of child.

use crate::backend::{mem, redirect, sync, uring};
use crate::device::BlockDevice;
use crate::error::OpenError;
use crate::fault;
use crate::spec::{suggest, Spec, SpecError};

/// The kinds the engine itself opens.
pub const ENGINE_KINDS: &[&str] = &["mem", "null", "file", "uring", "sync", "redirect", "fault"];

/// Opens a device from its spec string.
pub fn open(spec: &str) -> Result<Box<dyn BlockDevice>, OpenError> {
    open_spec(&Spec::parse(spec)?)
}

/// Opens a parsed spec with the engine's kinds only.
pub fn open_spec(spec: &Spec) -> Result<Box<dyn BlockDevice>, OpenError> {
    open_engine_kind(spec, &open_spec).unwrap_or_else(|| Err(unknown_kind(spec, ENGINE_KINDS)))
}

/// Opens the devices a wrapper holds; upper layers pass their own to add kinds.
pub type ChildOpener<'a> = &'a dyn Fn(&Spec) -> Result<Box<dyn BlockDevice>, OpenError>;

/// Opens `spec` if its kind is one of the engine's; `children` opens wrapped specs.
/// Returns `None` for kinds the engine does not know.
pub fn open_engine_kind(
    spec: &Spec,
    children: ChildOpener<'_>,
) -> Option<Result<Box<dyn BlockDevice>, OpenError>> {
    Some(match spec.kind.as_str() {
        "mem" => boxed(mem::open_mem(spec)),
        "null" => boxed(mem::open_null(spec)),
        "file" => open_file(spec),
        "uring" => boxed(uring::open(spec)),
        "sync" => boxed(sync::open(spec)),
        "redirect" => boxed(redirect::open(spec)),
        "fault" => boxed(fault::open(spec, children)),
        _ => return None,
    })
}

fn boxed<D: BlockDevice + 'static>(
    opened: Result<D, OpenError>,
) -> Result<Box<dyn BlockDevice>, OpenError> {
    opened.map(|d| Box::new(d) as Box<dyn BlockDevice>)
}

/// The error for a kind nobody registered, with the closest known kind as a hint.
pub fn unknown_kind(spec: &Spec, known: &[&str]) -> OpenError {
    let hint = suggest(&spec.kind, known)
        .map(|s| format!("; did you mean `{s}`?"))
        .unwrap_or_default();
    OpenError::Spec(SpecError::new(
        &spec.to_string(),
        format!(
            "unknown device kind `{}`{hint} (known: {})",
            spec.kind,
            known.join(", ")
        ),
    ))
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
