//! Interrupting a long command: SIGINT, SIGTERM and SIGHUP ask the running job to stop at its
//! next safe point (between chunks or files), where it keeps what is complete, commits, says what
//! was kept and exits 128 + the signal (130, 143, 129). A second signal exits at once with that
//! code; the image is still consistent then, because only journal commits change its metadata.
//!
//! `kura mount` and `kura serve` have their own handling (they detach or drain first), so only
//! commands that do one bounded job install this.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// The process's watcher, once a command installed it.
static GLOBAL: OnceLock<Interrupt> = OnceLock::new();

/// Installs the process's watcher (once) and returns it.
pub fn install() -> anyhow::Result<&'static Interrupt> {
    if let Some(i) = GLOBAL.get() {
        return Ok(i);
    }
    let i = Interrupt::install()?;
    Ok(GLOBAL.get_or_init(|| i))
}

/// The signal that asked the running job to stop, if a watcher is installed and one came.
pub fn requested() -> Option<i32> {
    GLOBAL.get().and_then(Interrupt::requested)
}

/// `Err` once a signal came (never without [`install`]), with `kept()` saying what stays.
pub fn check(kept: impl FnOnce() -> String) -> Result<(), Interrupted> {
    match requested() {
        None => Ok(()),
        Some(signal) => Err(Interrupted {
            signal,
            kept: kept(),
        }),
    }
}

const SIGNALS: [i32; 3] = [
    signal_hook::consts::SIGINT,
    signal_hook::consts::SIGTERM,
    signal_hook::consts::SIGHUP,
];

/// The job was asked to stop; what was kept is in the message.
#[derive(Debug, thiserror::Error)]
#[error("interrupted by signal {signal}: {kept}")]
pub struct Interrupted {
    pub signal: i32,
    pub kept: String,
}

impl Interrupted {
    /// The exit status a shell expects after this signal.
    pub fn exit_code(&self) -> i32 {
        128 + self.signal
    }
}

/// Watches for the signals above; cheap to check between chunks.
#[derive(Clone)]
pub struct Interrupt {
    signal: Arc<AtomicUsize>,
}

impl Interrupt {
    /// Installs the handlers; use the module's [`install`], which does it once per process.
    fn install() -> anyhow::Result<Interrupt> {
        let seen = Arc::new(AtomicBool::new(false));
        let signal = Arc::new(AtomicUsize::new(0));
        for sig in SIGNALS {
            // Registered first so that it sees the flag as it was before this signal.
            signal_hook::flag::register_conditional_shutdown(sig, 128 + sig, Arc::clone(&seen))?;
            signal_hook::flag::register_usize(sig, Arc::clone(&signal), sig as usize)?;
            signal_hook::flag::register(sig, Arc::clone(&seen))?;
        }
        Ok(Interrupt { signal })
    }

    /// The signal that asked us to stop, if one did.
    pub fn requested(&self) -> Option<i32> {
        match self.signal.load(Ordering::SeqCst) {
            0 => None,
            s => Some(s as i32),
        }
    }
}
