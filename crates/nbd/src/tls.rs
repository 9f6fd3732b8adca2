//! TLS for NBD (`NBD_OPT_STARTTLS`) with certificates, on rustls: loading certificates and keys,
//! and splitting a TLS session into a read half and a write half for the two threads of a
//! connection. Pre-shared keys are in [`crate::psk`] (rustls has none).
//!
//! Both the server and the client read on one thread and write on another, but a TLS session is
//! one state machine. [`TlsStream::split`] shares it behind a mutex that is never held across a
//! blocking socket call: the reader reads raw bytes from its own handle of the socket with the
//! lock released, then locks only to decrypt them; the writer locks only to encrypt, then writes
//! the records with the lock released. Only the writer ever writes to the socket, so records go out
//! in the order they were sealed; anything the reader's processing wants to send (alerts, key
//! updates) goes out with the writer's next write.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, Connection, RootCertStore, ServerConfig};
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

/// Raw bytes the reader takes off the socket per system call.
const RAW_READ: usize = 64 << 10;

/// Why TLS material could not be loaded or a session could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    #[error("reading {what} from {path}: {reason}")]
    Pem {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("{path} holds no {what}")]
    Empty { what: &'static str, path: PathBuf },
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
    #[error("{0:?} is not a valid TLS server name (a DNS name or an IP address)")]
    ServerName(String),
    #[error("verifying client certificates: {0}")]
    ClientVerifier(String),
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certs(path: &Path, what: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem_err = |reason: String| TlsError::Pem {
        what,
        path: path.to_owned(),
        reason,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| pem_err(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_err(e.to_string()))?;
    if certs.is_empty() {
        return Err(TlsError::Empty {
            what,
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

/// A server configuration from a PEM certificate chain and a PEM private key (PKCS#8, PKCS#1 or
/// SEC1). Clients are not asked for certificates.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, TlsError> {
    server_config_with_clients(cert, key, None)
}

/// Like [`server_config`]; with `client_ca`, every client must present a certificate signed by
/// a CA in that PEM file (mutual TLS, checked by rustls' WebPKI client verifier). A client
/// without one fails the TLS handshake, before any NBD option is answered, so it learns nothing
/// about the exports.
pub fn server_config_with_clients(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let chain = certs(cert, "certificates")?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::Pem {
        what: "a private key",
        path: key.to_owned(),
        reason: e.to_string(),
    })?;
    let builder =
        ServerConfig::builder_with_provider(provider()).with_safe_default_protocol_versions()?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for c in certs(ca, "client CA certificates")? {
                roots.add(c)?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                .build()
                .map_err(|e| TlsError::ClientVerifier(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let config = builder.with_single_cert(chain, key)?;
    Ok(Arc::new(config))
}

/// A client configuration that trusts the certificate authorities in the PEM file `ca`.
pub fn client_config(ca: &Path) -> Result<Arc<ClientConfig>, TlsError> {
    let mut roots = RootCertStore::empty();
    for c in certs(ca, "CA certificates")? {
        roots.add(c)?;
    }
    let config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// Like [`client_config`], presenting the PEM certificate chain `cert` with its private key
/// `key` to servers that ask for one (mutual TLS, `kura serve --tls-ca`).
pub fn client_config_with_cert(
    ca: &Path,
    cert: &Path,
    key: &Path,
) -> Result<Arc<ClientConfig>, TlsError> {
    let mut roots = RootCertStore::empty();
    for c in certs(ca, "CA certificates")? {
        roots.add(c)?;
    }
    let chain = certs(cert, "client certificates")?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::Pem {
        what: "a private key",
        path: key.to_owned(),
        reason: e.to_string(),
    })?;
    let config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)?;
    Ok(Arc::new(config))
}

/// What a client needs to start TLS: its configuration and the name the server's certificate
/// must carry (the host it connects to).
#[derive(Clone)]
pub struct ClientTls {
    pub config: Arc<ClientConfig>,
    pub server_name: ServerName<'static>,
}

impl ClientTls {
    /// Trust `ca`, expect a certificate for `host` (a DNS name or an IP address).
    pub fn new(ca: &Path, host: &str) -> Result<ClientTls, TlsError> {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let server_name = ServerName::try_from(host.to_owned())
            .map_err(|_| TlsError::ServerName(host.to_owned()))?;
        Ok(ClientTls {
            config: client_config(ca)?,
            server_name,
        })
    }

    /// Like [`ClientTls::new`], also presenting a client certificate (see
    /// [`client_config_with_cert`]).
    pub fn with_client_cert(
        ca: &Path,
        host: &str,
        cert: &Path,
        key: &Path,
    ) -> Result<ClientTls, TlsError> {
        let mut tls = ClientTls::new(ca, host)?;
        tls.config = client_config_with_cert(ca, cert, key)?;
        Ok(tls)
    }

    pub(crate) fn connection(&self) -> io::Result<Connection> {
        rustls::ClientConnection::new(Arc::clone(&self.config), self.server_name.clone())
            .map(Connection::from)
            .map_err(io::Error::other)
    }
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

/// A TLS session over a TCP socket as one `Read + Write` stream, for the handshake phase (one
/// thread). [`TlsStream::split`] turns it into halves for transmission.
pub struct TlsStream {
    conn: Connection,
    sock: TcpStream,
}

impl TlsStream {
    /// Starts a session on `sock`; the TLS handshake runs on the first read or write, or in
    /// [`TlsStream::handshake`].
    pub fn new(conn: Connection, sock: TcpStream) -> TlsStream {
        TlsStream { conn, sock }
    }

    /// Runs the TLS handshake to its end (bounded by the socket's timeouts).
    pub fn handshake(&mut self) -> io::Result<()> {
        while self.conn.is_handshaking() {
            self.conn.complete_io(&mut self.sock)?;
        }
        // Send whatever the last handshake step queued (the client's Finished).
        while self.conn.wants_write() {
            self.conn.write_tls(&mut self.sock)?;
        }
        Ok(())
    }

    /// The socket, e.g. to change its timeouts.
    pub fn socket(&self) -> &TcpStream {
        &self.sock
    }

    /// A read half and a write half sharing the session (see the module docs).
    pub fn split(self) -> io::Result<(TlsReader, TlsWriter)> {
        let read_sock = self.sock.try_clone()?;
        let shared = Arc::new(Mutex::new(self.conn));
        Ok((
            TlsReader {
                conn: Arc::clone(&shared),
                sock: read_sock,
                raw: vec![0; RAW_READ],
                pending: 0..0,
                eof: false,
            },
            TlsWriter {
                conn: shared,
                sock: self.sock,
                sealed: Vec::new(),
            },
        ))
    }
}

impl TlsStream {
    fn send_queued(&mut self) -> io::Result<()> {
        while self.conn.wants_write() {
            self.conn.write_tls(&mut self.sock)?;
        }
        Ok(())
    }
}

impl Read for TlsStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            match self.conn.reader().read(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                other => return other,
            }
            self.send_queued()?;
            let n = self.conn.read_tls(&mut self.sock)?;
            self.conn
                .process_new_packets()
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            if n == 0 {
                return match self.conn.reader().read(buf) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        Err(io::ErrorKind::UnexpectedEof.into())
                    }
                    other => other,
                };
            }
        }
    }
}

impl Write for TlsStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.conn.is_handshaking() {
            self.handshake()?;
        }
        let n = self.conn.writer().write(buf)?;
        self.send_queued()?;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.conn.writer().flush()?;
        self.send_queued()
    }
}

fn lock(conn: &Mutex<Connection>) -> MutexGuard<'_, Connection> {
    conn.lock().unwrap_or_else(|p| p.into_inner())
}

/// The read half of a split session.
pub struct TlsReader {
    conn: Arc<Mutex<Connection>>,
    sock: TcpStream,
    raw: Vec<u8>,
    /// Raw bytes read from the socket and not yet handed to the session.
    pending: std::ops::Range<usize>,
    eof: bool,
}

impl Read for TlsReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        loop {
            {
                let mut c = lock(&self.conn);
                match c.reader().read(out) {
                    Ok(n) => return Ok(n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
                // No plaintext is buffered now, so the session has room for more records.
                if !self.pending.is_empty() || self.eof {
                    let mut data = &self.raw[self.pending.clone()];
                    let before = data.len();
                    let taken = c.read_tls(&mut data)?;
                    self.pending.start += before - data.len();
                    c.process_new_packets()
                        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                    if taken == 0 && !self.pending.is_empty() {
                        // No plaintext is waiting, so a session refusing input is stuck for good.
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            "the TLS session accepts no more input",
                        ));
                    }
                    if taken == 0 && self.eof && self.pending.is_empty() {
                        return match c.reader().read(out) {
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                                Err(io::ErrorKind::UnexpectedEof.into())
                            }
                            other => other,
                        };
                    }
                    continue;
                }
            }
            let n = loop {
                match self.sock.read(&mut self.raw) {
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    other => break other?,
                }
            };
            self.pending = 0..n;
            self.eof = n == 0;
        }
    }
}

/// The write half of a split session.
pub struct TlsWriter {
    conn: Arc<Mutex<Connection>>,
    sock: TcpStream,
    sealed: Vec<u8>,
}

impl TlsWriter {
    /// Seals `data` (if any) and everything the session has queued, then sends it unlocked.
    fn seal_and_send(&mut self, data: &[u8]) -> io::Result<usize> {
        self.sealed.clear();
        let n = {
            let mut c = lock(&self.conn);
            let n = if data.is_empty() {
                0
            } else {
                c.writer().write(data)?
            };
            while c.wants_write() {
                c.write_tls(&mut self.sealed)?;
            }
            n
        };
        self.sock.write_all(&self.sealed)?;
        Ok(n)
    }

    /// Sends a TLS `close_notify` (best effort; the caller closes the socket next).
    pub fn close_notify(&mut self) {
        lock(&self.conn).send_close_notify();
        let _ = self.seal_and_send(&[]);
    }
}

impl Write for TlsWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.seal_and_send(data)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.seal_and_send(&[]).map(|_| ())
    }
}
