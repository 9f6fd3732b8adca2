//! TLS with pre-shared keys (TLS-PSK) for the server, as nbdkit and qemu-nbd offer it: keys come
//! from a psktool file (`identity:hexkey` lines), and a client proves it holds the key of its
//! identity during the TLS handshake, before any NBD option is answered.
//!
//! rustls (see [`crate::tls`]) has no external pre-shared keys, so these sessions run on the
//! system's OpenSSL (`openssl.rs`, hand-written declarations of the few libssl calls used). The
//! build script links it only where `pkg-config` finds OpenSSL 1.1.1 or newer and then sets the
//! `kura_openssl` cfg; without it the parser still works and [`PskServer::new`] fails with
//! [`PskError::NoOpenSsl`], which says how to get a build that has it.
//!
//! A session is split for the reader and writer threads of a connection the same way as a
//! rustls one: one OpenSSL object behind a mutex that is never held across a socket call, fed
//! and drained through memory buffers, with only the writer writing to the socket.

#[cfg(kura_openssl)]
#[path = "psk/openssl.rs"]
#[allow(unsafe_code)] // the hand-written libssl declarations and calls
mod imp;
#[cfg(not(kura_openssl))]
#[path = "psk/none.rs"]
mod imp;

pub use imp::{PskReader, PskStream, PskWriter};

use std::io::{self, Read};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The largest psktool file read (a line is well under 1 KiB; this is thousands of clients).
pub const MAX_FILE_BYTES: usize = 1 << 20;
/// The most identities one file may hold.
pub const MAX_KEYS: usize = 10_000;
/// The shortest key accepted, in bytes: a shorter one can be guessed offline from one recorded
/// handshake. psktool makes 32-byte keys.
pub const MIN_KEY_BYTES: usize = 16;
/// The longest key accepted, in bytes (OpenSSL 1.1.1's limit).
pub const MAX_KEY_BYTES: usize = 256;
/// The longest identity accepted, in bytes (OpenSSL's limit is 256 with the terminating NUL).
pub const MAX_IDENTITY_BYTES: usize = 128;

/// Why a line of a psktool file was refused. No variant carries key material.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LineError {
    #[error("no ':' between the identity and the key (psktool lines are identity:hexkey)")]
    MissingColon,
    #[error("the identity is empty")]
    EmptyIdentity,
    #[error("the identity is longer than {MAX_IDENTITY_BYTES} bytes")]
    IdentityTooLong,
    #[error("the identity holds a control character or non-UTF-8 bytes")]
    IdentityNotPrintable,
    #[error("the key has an odd number of hex digits ({0})")]
    OddHexLength(usize),
    #[error("the key has a character that is not a hex digit at column {0}")]
    BadHex(usize),
    #[error("the key is {0} bytes; at least {MIN_KEY_BYTES} are required (psktool makes 32)")]
    KeyTooShort(usize),
    #[error("the key is longer than {MAX_KEY_BYTES} bytes")]
    KeyTooLong,
    #[error("identity already given on line {0}")]
    Duplicate(usize),
    #[error("more than {MAX_KEYS} identities")]
    TooManyKeys,
}

/// A refused line of psktool text and its 1-based number.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {reason}")]
pub struct ParseError {
    pub line: usize,
    pub reason: LineError,
}

/// Why a psktool file could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PskError {
    #[error("reading {path}: {error}")]
    Read { path: PathBuf, error: io::Error },
    #[error(
        "{path} is larger than {MAX_FILE_BYTES} bytes; a psktool file holds one short line per \
         client"
    )]
    TooLarge { path: PathBuf },
    #[error("{path} line {line}: {reason}")]
    Line {
        path: PathBuf,
        line: usize,
        reason: LineError,
    },
    #[error("{0} holds no keys")]
    Empty(PathBuf),
    #[error(
        "this kura was built without OpenSSL, which TLS-PSK needs (install libssl-dev and \
         pkg-config, then rebuild)"
    )]
    NoOpenSsl,
    #[error("setting up OpenSSL for TLS-PSK: {0}")]
    OpenSsl(String),
}

/// Key bytes, overwritten when dropped so they do not linger in freed memory.
struct Secret(Vec<u8>);

impl Drop for Secret {
    fn drop(&mut self) {
        wipe(&mut self.0);
    }
}

/// Overwrites `bytes` with zeros in a way the optimiser may not remove as a dead store.
#[allow(unsafe_code)] // write_volatile
fn wipe(bytes: &mut [u8]) {
    for b in bytes.iter_mut() {
        // SAFETY: `b` is a valid, aligned, exclusive reference to one byte.
        unsafe { std::ptr::write_volatile(b, 0) };
    }
    std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
}

/// Identities and their keys, from a psktool file. `Debug` shows identities only.
pub struct PskKeys {
    entries: Vec<(String, Secret)>,
}

impl std::fmt::Debug for PskKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PskKeys")
            .field("identities", &self.identities().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl PskKeys {
    /// Parses psktool text: one `identity:hexkey` per line (the identity runs to the first
    /// colon), blank lines ignored, nothing else accepted. Errors name the 1-based line.
    pub fn parse(text: &[u8]) -> Result<PskKeys, ParseError> {
        let mut entries: Vec<(String, Secret, usize)> = Vec::new();
        for (i, line) in text.split(|&b| b == b'\n').enumerate() {
            let number = i + 1;
            if line.is_empty() {
                continue;
            }
            let err = |reason: LineError| ParseError {
                line: number,
                reason,
            };
            let colon = line
                .iter()
                .position(|&b| b == b':')
                .ok_or(err(LineError::MissingColon))?;
            let (identity, hex) = (&line[..colon], &line[colon + 1..]);
            if identity.is_empty() {
                return Err(err(LineError::EmptyIdentity));
            }
            if identity.len() > MAX_IDENTITY_BYTES {
                return Err(err(LineError::IdentityTooLong));
            }
            let identity = std::str::from_utf8(identity)
                .ok()
                .filter(|s| !s.chars().any(char::is_control))
                .ok_or(err(LineError::IdentityNotPrintable))?;
            let key = decode_hex(hex).map_err(|e| match e {
                // Columns count from the start of the line, 1-based.
                LineError::BadHex(c) => err(LineError::BadHex(colon + 1 + c)),
                other => err(other),
            })?;
            if let Some((_, _, first)) = entries.iter().find(|(id, _, _)| id == identity) {
                return Err(err(LineError::Duplicate(*first)));
            }
            if entries.len() == MAX_KEYS {
                return Err(err(LineError::TooManyKeys));
            }
            entries.push((identity.to_owned(), key, number));
        }
        Ok(PskKeys {
            entries: entries.into_iter().map(|(id, key, _)| (id, key)).collect(),
        })
    }

    /// Reads and parses the psktool file at `path` (at most [`MAX_FILE_BYTES`]); a file with
    /// no keys is an error. The file's bytes are wiped from memory once parsed.
    pub fn load(path: &Path) -> Result<PskKeys, PskError> {
        let read_err = |error| PskError::Read {
            path: path.to_owned(),
            error,
        };
        let file = std::fs::File::open(path).map_err(read_err)?;
        let mut text = Vec::new();
        let read = file
            .take(MAX_FILE_BYTES as u64 + 1)
            .read_to_end(&mut text)
            .map_err(read_err);
        let parsed = match read {
            Err(e) => Err(e),
            Ok(_) if text.len() > MAX_FILE_BYTES => Err(PskError::TooLarge {
                path: path.to_owned(),
            }),
            Ok(_) => PskKeys::parse(&text).map_err(|ParseError { line, reason }| PskError::Line {
                path: path.to_owned(),
                line,
                reason,
            }),
        };
        // The vector may have reallocated while growing; only its final buffer is wiped.
        wipe(&mut text);
        let keys = parsed?;
        if keys.is_empty() {
            return Err(PskError::Empty(path.to_owned()));
        }
        Ok(keys)
    }

    /// The identities, in file order.
    pub fn identities(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(id, _)| id.as_str())
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The key of `identity`, if the file has one.
    #[cfg_attr(not(kura_openssl), allow(dead_code))]
    pub(crate) fn key(&self, identity: &[u8]) -> Option<&[u8]> {
        self.entries
            .iter()
            .find(|(id, _)| id.as_bytes() == identity)
            .map(|(_, key)| key.0.as_slice())
    }
}

/// Decodes the hex key of a line; a `BadHex` column is 1-based within `hex`.
fn decode_hex(hex: &[u8]) -> Result<Secret, LineError> {
    if let Some(c) = hex.iter().position(|b| !b.is_ascii_hexdigit()) {
        return Err(LineError::BadHex(c + 1));
    }
    if !hex.len().is_multiple_of(2) {
        return Err(LineError::OddHexLength(hex.len()));
    }
    let bytes = hex.len() / 2;
    if bytes < MIN_KEY_BYTES {
        return Err(LineError::KeyTooShort(bytes));
    }
    if bytes > MAX_KEY_BYTES {
        return Err(LineError::KeyTooLong);
    }
    let nibble = |b: u8| match b {
        b'0'..=b'9' => b - b'0',
        b'a'..=b'f' => b - b'a' + 10,
        _ => b - b'A' + 10,
    };
    let mut key = Secret(Vec::with_capacity(bytes));
    for pair in hex.chunks_exact(2) {
        key.0.push(nibble(pair[0]) << 4 | nibble(pair[1]));
    }
    Ok(key)
}

/// Whether this build has TLS-PSK (OpenSSL was found when it was compiled).
pub fn openssl_available() -> bool {
    cfg!(kura_openssl)
}

/// `Ok` when `available`, else [`PskError::NoOpenSsl`]: what a build without OpenSSL answers.
pub fn require_openssl(available: bool) -> Result<(), PskError> {
    if available {
        Ok(())
    } else {
        Err(PskError::NoOpenSsl)
    }
}

/// A TLS-PSK server configuration: the keys and an OpenSSL context (TLS 1.2 and 1.3, PSK
/// cipher suites only, no session tickets). Shared by every connection.
pub struct PskServer {
    ctx: imp::Context,
    identities: usize,
}

impl std::fmt::Debug for PskServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PskServer")
            .field("identities", &self.identities)
            .finish_non_exhaustive()
    }
}

impl PskServer {
    /// A server accepting the identities and keys of `keys`.
    pub fn new(keys: PskKeys) -> Result<Arc<PskServer>, PskError> {
        require_openssl(openssl_available())?;
        let identities = keys.len();
        Ok(Arc::new(PskServer {
            ctx: imp::Context::new(keys)?,
            identities,
        }))
    }

    /// [`PskKeys::load`] then [`PskServer::new`]. Without OpenSSL this fails before reading.
    pub fn from_file(path: &Path) -> Result<Arc<PskServer>, PskError> {
        require_openssl(openssl_available())?;
        PskServer::new(PskKeys::load(path)?)
    }

    /// Runs the server side of the TLS handshake on `sock` (bounded by its timeouts). A client
    /// with an unknown identity or the wrong key fails here, with an alert and an error.
    pub fn accept(&self, sock: TcpStream) -> io::Result<PskStream> {
        self.ctx.accept(sock)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "0123456789abcdef0123456789ABCDEF0123456789abcdef0123456789abcdef";

    fn parse(text: &str) -> Result<PskKeys, (usize, LineError)> {
        PskKeys::parse(text.as_bytes()).map_err(|e| (e.line, e.reason))
    }

    #[test]
    fn parses_psktool_lines() {
        let keys = parse(&format!("alice:{KEY}\n\nbob:{}\n", &KEY[..32])).unwrap();
        assert_eq!(keys.identities().collect::<Vec<_>>(), ["alice", "bob"]);
        let alice = keys.key(b"alice").unwrap();
        assert_eq!(alice.len(), 32);
        assert_eq!(&alice[..2], &[0x01, 0x23]);
        assert_eq!(alice[15], 0xef);
        assert_eq!(keys.key(b"bob").unwrap().len(), 16);
        assert!(keys.key(b"carol").is_none());
        // Only the first colon separates; the key part then has a ':' that is not hex.
        assert_eq!(
            parse(&format!("a:b:{KEY}")).unwrap_err(),
            (1, LineError::BadHex(4))
        );
    }

    #[test]
    fn refuses_malformed_lines_with_their_numbers() {
        let cases: Vec<(String, (usize, LineError))> = vec![
            (format!("alice{KEY}"), (1, LineError::MissingColon)),
            (
                format!("alice:{KEY}\n:{KEY}"),
                (2, LineError::EmptyIdentity),
            ),
            (
                format!("alice:{}", &KEY[..63]),
                (1, LineError::OddHexLength(63)),
            ),
            (format!("alice:{}g", &KEY[..63]), (1, LineError::BadHex(70))),
            (format!("alice:{KEY}\r"), (1, LineError::BadHex(71))),
            (format!("alice: {KEY}"), (1, LineError::BadHex(7))),
            ("alice:00112233".into(), (1, LineError::KeyTooShort(4))),
            ("alice:".into(), (1, LineError::KeyTooShort(0))),
            (
                format!("alice:{}", "ab".repeat(257)),
                (1, LineError::KeyTooLong),
            ),
            (
                format!("{}:{KEY}", "a".repeat(129)),
                (1, LineError::IdentityTooLong),
            ),
            (
                format!("al\tice:{KEY}"),
                (1, LineError::IdentityNotPrintable),
            ),
            (
                format!("alice:{KEY}\n\nbob:{KEY}\nalice:{KEY}"),
                (4, LineError::Duplicate(1)),
            ),
        ];
        for (text, want) in cases {
            assert_eq!(parse(&text).unwrap_err(), want, "{text:?}");
        }
        let mut invalid = b"al".to_vec();
        invalid.extend([0xff, b':']);
        invalid.extend(KEY.as_bytes());
        let err = PskKeys::parse(&invalid).unwrap_err();
        assert_eq!(
            (err.line, &err.reason),
            (1, &LineError::IdentityNotPrintable)
        );
        assert_eq!(
            err.to_string(),
            "line 1: the identity holds a control character or non-UTF-8 bytes"
        );
    }

    #[test]
    fn bounds_the_number_of_keys_and_the_file_size() {
        let mut text = String::new();
        for i in 0..=MAX_KEYS {
            text.push_str(&format!("u{i}:{KEY}\n"));
        }
        assert_eq!(
            parse(&text).unwrap_err(),
            (MAX_KEYS + 1, LineError::TooManyKeys)
        );

        let dir = tempfile::tempdir().unwrap();
        let huge = dir.path().join("huge.psk");
        let line = format!("alice:{KEY}\n");
        let copies = MAX_FILE_BYTES / line.len() + 1;
        std::fs::write(&huge, line.repeat(copies)).unwrap();
        let err = PskKeys::load(&huge).unwrap_err();
        assert!(matches!(err, PskError::TooLarge { .. }), "{err}");

        let empty = dir.path().join("empty.psk");
        std::fs::write(&empty, "\n\n").unwrap();
        assert!(matches!(
            PskKeys::load(&empty).unwrap_err(),
            PskError::Empty(_)
        ));

        let bad = dir.path().join("bad.psk");
        std::fs::write(&bad, format!("alice:{KEY}\nbob\n")).unwrap();
        let msg = PskKeys::load(&bad).unwrap_err().to_string();
        assert!(msg.contains("line 2") && msg.contains("no ':'"), "{msg}");
        assert!(!msg.contains(&KEY[..8]), "an error shows no key: {msg}");
    }

    #[test]
    fn debug_and_errors_show_no_keys() {
        let keys = parse(&format!("alice:{KEY}")).unwrap();
        let shown = format!("{keys:?}");
        assert!(shown.contains("alice") && !shown.contains("01"), "{shown}");
    }

    #[test]
    fn a_build_without_openssl_says_how_to_get_psk() {
        let msg = require_openssl(false).unwrap_err().to_string();
        assert!(msg.contains("built without OpenSSL"), "{msg}");
        assert!(
            msg.contains("libssl-dev") && msg.contains("pkg-config"),
            "{msg}"
        );
        assert!(require_openssl(true).is_ok());
        // Without OpenSSL the file is not even read; with it, reading it fails.
        let err = PskServer::from_file(Path::new("/nonexistent")).unwrap_err();
        assert_eq!(
            matches!(err, PskError::NoOpenSsl),
            !openssl_available(),
            "{err}"
        );
    }
}
