//! Addresses, listeners and streams for both transports: TCP (`HOST:PORT`) and Unix sockets
//! (`unix:/path`, created mode 0600 so only the owner's processes connect), plus the shared
//! key of the HMAC challenge (`docs/ingest-protocol.md` §3).

use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::time::Duration;

use crate::frame::AUTH_CONTEXT;

/// Shortest shared key accepted.
pub const MIN_KEY_LEN: usize = 16;

/// Where a server listens or a sender connects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Addr {
    Tcp(String),
    Unix(PathBuf),
}

impl std::str::FromStr for Addr {
    type Err = String;
    fn from_str(s: &str) -> Result<Addr, String> {
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err("unix: needs a path, e.g. unix:/run/kura-ingest.sock".into());
            }
            return Ok(Addr::Unix(PathBuf::from(path)));
        }
        if !s.contains(':') {
            return Err(format!(
                "{s:?} is not HOST:PORT or unix:/path (e.g. 127.0.0.1:7070)"
            ));
        }
        Ok(Addr::Tcp(s.to_string()))
    }
}

impl std::fmt::Display for Addr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Addr::Tcp(a) => f.write_str(a),
            Addr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// A bound listener.
#[derive(Debug)]
pub enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener, PathBuf),
}

impl Listener {
    /// Binds `addr`. A Unix socket path must not exist yet; the socket is made mode 0600.
    pub fn bind(addr: &Addr) -> io::Result<Listener> {
        match addr {
            Addr::Tcp(a) => Ok(Listener::Tcp(TcpListener::bind(a)?)),
            Addr::Unix(p) => {
                if p.exists() {
                    return Err(io::Error::new(
                        io::ErrorKind::AlreadyExists,
                        format!("{} exists; remove it first", p.display()),
                    ));
                }
                let l = UnixListener::bind(p)?;
                std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600))?;
                Ok(Listener::Unix(l, p.clone()))
            }
        }
    }

    /// The address actually bound (the port chosen for `:0`).
    pub fn local_addr(&self) -> io::Result<Addr> {
        match self {
            Listener::Tcp(l) => Ok(Addr::Tcp(l.local_addr()?.to_string())),
            Listener::Unix(_, p) => Ok(Addr::Unix(p.clone())),
        }
    }

    /// True for TCP: a network listener, which must authenticate senders.
    pub fn is_network(&self) -> bool {
        matches!(self, Listener::Tcp(_))
    }

    pub(crate) fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        match self {
            Listener::Tcp(l) => l.set_nonblocking(on),
            Listener::Unix(l, _) => l.set_nonblocking(on),
        }
    }

    pub(crate) fn accept(&self) -> io::Result<Stream> {
        let s = match self {
            Listener::Tcp(l) => {
                let (s, _) = l.accept()?;
                s.set_nodelay(true)?;
                Stream::Tcp(s)
            }
            Listener::Unix(l, _) => Stream::Unix(l.accept()?.0),
        };
        s.set_nonblocking(false)?;
        Ok(s)
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix(_, p) = self {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// A connected stream of either transport.
#[derive(Debug)]
pub enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    /// Connects to `addr`.
    pub fn connect(addr: &Addr) -> io::Result<Stream> {
        Ok(match addr {
            Addr::Tcp(a) => {
                let s = TcpStream::connect(a)?;
                s.set_nodelay(true)?;
                Stream::Tcp(s)
            }
            Addr::Unix(p) => Stream::Unix(UnixStream::connect(p)?),
        })
    }

    pub fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
        })
    }

    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.shutdown(how),
            Stream::Unix(s) => s.shutdown(how),
        }
    }

    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(t),
            Stream::Unix(s) => s.set_read_timeout(t),
        }
    }

    fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_nonblocking(on),
            Stream::Unix(s) => s.set_nonblocking(on),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.flush(),
            Stream::Unix(s) => s.flush(),
        }
    }
}

/// Reads a shared key file: its bytes, at least [`MIN_KEY_LEN`] of them (trailing newline
/// dropped, so `head -c 32 /dev/urandom | base64 > key` works).
pub fn read_key(path: &std::path::Path) -> io::Result<Vec<u8>> {
    let mut key = std::fs::read(path)?;
    while key.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        key.pop();
    }
    if key.len() < MIN_KEY_LEN {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "key file {} holds {} bytes; at least {MIN_KEY_LEN} are needed",
                path.display(),
                key.len()
            ),
        ));
    }
    Ok(key)
}

fn mac_for(key: &[u8], client: &[u8; 16], server: &[u8; 16]) -> Hmac<Sha256> {
    // HMAC takes keys of any length, so this cannot fail.
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).unwrap_or_else(|_| unreachable!());
    m.update(AUTH_CONTEXT);
    m.update(client);
    m.update(server);
    m
}

/// The `AUTH` MAC a sender holding `key` sends.
pub fn auth_mac(key: &[u8], client: &[u8; 16], server: &[u8; 16]) -> [u8; 32] {
    mac_for(key, client, server).finalize().into_bytes().into()
}

/// Checks an `AUTH` MAC in constant time.
pub fn auth_ok(key: &[u8], client: &[u8; 16], server: &[u8; 16], mac: &[u8; 32]) -> bool {
    mac_for(key, client, server).verify_slice(mac).is_ok()
}
