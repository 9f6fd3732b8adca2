//! TLS-PSK in a build without OpenSSL: the types exist so the server compiles the same way, but
//! none can be made ([`Context::new`] refuses), so every method is unreachable.

use super::{PskError, PskKeys};
use std::convert::Infallible;
use std::io::{self, Read, Write};
use std::net::TcpStream;

pub(super) struct Context(Infallible);

impl Context {
    pub(super) fn new(_keys: PskKeys) -> Result<Context, PskError> {
        Err(PskError::NoOpenSsl)
    }

    pub(super) fn accept(&self, _sock: TcpStream) -> io::Result<PskStream> {
        match self.0 {}
    }
}

/// A TLS-PSK session during the handshake (never made in this build).
pub struct PskStream(Infallible);

impl PskStream {
    /// The read and write halves of the session.
    pub fn split(self) -> io::Result<(PskReader, PskWriter)> {
        match self.0 {}
    }
}

impl Read for PskStream {
    fn read(&mut self, _buf: &mut [u8]) -> io::Result<usize> {
        match self.0 {}
    }
}

impl Write for PskStream {
    fn write(&mut self, _buf: &[u8]) -> io::Result<usize> {
        match self.0 {}
    }

    fn flush(&mut self) -> io::Result<()> {
        match self.0 {}
    }
}

/// The read half of a session (never made in this build).
pub struct PskReader(Infallible);

impl Read for PskReader {
    fn read(&mut self, _buf: &mut [u8]) -> io::Result<usize> {
        match self.0 {}
    }
}

/// The write half of a session (never made in this build).
pub struct PskWriter(Infallible);

impl Write for PskWriter {
    fn write(&mut self, _buf: &[u8]) -> io::Result<usize> {
        match self.0 {}
    }

    fn flush(&mut self) -> io::Result<()> {
        match self.0 {}
    }
}
