//! The spec kinds this crate adds to a [`Registry`]: `nbd:` (a plain client of any NBD server)
//! and `remote:` (the drive with bounded waits, reconnect and TLS, [`crate::remote`]).

use crate::client::connect;
use crate::NbdClient;
use kura_engine::registry::ReadOnly;
use kura_engine::{BlockDevice, Kind, OpenError, Registry};

const REMOTE: &str = "Remote devices";

/// Adds `nbd:` and `remote:` to `registry`.
pub fn register(registry: &mut Registry) {
    registry.add(Kind {
        name: "nbd",
        group: REMOTE,
        usage: "nbd:HOST:PORT/EXPORT",
        help: "an NBD export (kura serve, qemu-nbd, nbdkit); also nbd://HOST[:PORT][/EXPORT]",
        read_only: ReadOnly::NotEnforced,
        open: |spec, _| {
            let address = spec.target.as_deref().unwrap_or("");
            open_address(address).map(|c| Box::new(c) as Box<dyn BlockDevice>)
        },
    });
    registry.add(Kind {
        name: "remote",
        group: REMOTE,
        usage: "remote:HOST[:PORT][/EXPORT]",
        help: "an NBD export with bounded waits, one reconnect per drop (unacknowledged\n\
               commands replayed; a flush across it fails if acknowledged writes were\n\
               unflushed) and TLS. Options: tls=1&ca=PATH&timeout=10&reconnect=1",
        read_only: ReadOnly::NotEnforced,
        open: |spec, _| crate::remote::open(spec).map(|d| Box::new(d) as Box<dyn BlockDevice>),
    });
}

/// Connects to `HOST[:PORT][/EXPORT]`: an export of any NBD server (another `kura serve`,
/// qemu-nbd, nbdkit) used as a device. The default port is 10809 and the default export the
/// server's.
pub fn open_address(address: &str) -> Result<NbdClient, OpenError> {
    let (host, export) = address.split_once('/').unwrap_or((address, ""));
    if host.is_empty() {
        return Err(OpenError::Invalid(format!(
            "nbd:{address}: no host in the NBD address"
        )));
    }
    // A bare IPv6 literal in brackets, or a name without a port, gets the default port.
    let addr = if host.contains(':') && !host.ends_with(']') {
        host.to_string()
    } else {
        format!("{host}:10809")
    };
    connect(addr.as_str(), export).map_err(|e| OpenError::Invalid(format!("nbd:{address}: {e}")))
}
