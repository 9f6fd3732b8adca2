//! TLS-PSK sessions on the system's OpenSSL (1.1.1 or newer, found by `build.rs`).
//!
//! Only the few libssl calls needed are declared here, by hand, against OpenSSL's documented C
//! API (see `ffi`). The socket is never given to OpenSSL: each session reads from and writes to
//! two memory BIOs, and this module moves bytes between them and the socket. That lets the
//! reader thread wait on the socket without holding the session's lock, exactly as `tls.rs`
//! does for rustls.
//!
//! The key lookup is OpenSSL's "legacy" PSK server callback: it serves TLS 1.2 PSK suites and,
//! in TLS 1.3, external PSKs hashed with SHA-256 (what GnuTLS clients such as libnbd and
//! qemu-nbd send), which is why only SHA-256 TLS 1.3 suites are enabled.

use super::{PskError, PskKeys};
use std::ffi::{c_char, c_int, c_uchar, c_uint, CStr};
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard};

/// Declarations of the libssl/libcrypto functions used, with the types of OpenSSL's headers
/// (`ssl.h`, `bio.h`, `err.h`, `crypto.h`); the structs are opaque.
// The names are OpenSSL's, so a reader can look each one up.
#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
mod ffi {
    use std::ffi::{c_char, c_int, c_long, c_uchar, c_uint, c_ulong, c_void};

    #[repr(C)]
    pub struct SSL_CTX {
        _opaque: [u8; 0],
    }
    #[repr(C)]
    pub struct SSL {
        _opaque: [u8; 0],
    }
    #[repr(C)]
    pub struct SSL_METHOD {
        _opaque: [u8; 0],
    }
    #[repr(C)]
    pub struct BIO {
        _opaque: [u8; 0],
    }
    #[repr(C)]
    pub struct BIO_METHOD {
        _opaque: [u8; 0],
    }

    /// `SSL_psk_server_cb_func`.
    pub type PskServerCallback =
        unsafe extern "C" fn(*mut SSL, *const c_char, *mut c_uchar, c_uint) -> c_uint;

    pub const SSL_ERROR_SSL: c_int = 1;
    pub const SSL_ERROR_WANT_READ: c_int = 2;
    pub const SSL_ERROR_SYSCALL: c_int = 5;
    pub const SSL_ERROR_ZERO_RETURN: c_int = 6;
    pub const SSL_CTRL_SET_MIN_PROTO_VERSION: c_int = 123;
    pub const TLS1_2_VERSION: c_long = 0x0303;
    /// `SSL_CTX_set_app_data` is `SSL_CTX_set_ex_data` at this index.
    pub const APP_DATA: c_int = 0;

    extern "C" {
        pub fn TLS_server_method() -> *const SSL_METHOD;
        pub fn SSL_CTX_new(method: *const SSL_METHOD) -> *mut SSL_CTX;
        pub fn SSL_CTX_free(ctx: *mut SSL_CTX);
        pub fn SSL_CTX_ctrl(
            ctx: *mut SSL_CTX,
            cmd: c_int,
            larg: c_long,
            parg: *mut c_void,
        ) -> c_long;
        pub fn SSL_CTX_set_cipher_list(ctx: *mut SSL_CTX, list: *const c_char) -> c_int;
        pub fn SSL_CTX_set_ciphersuites(ctx: *mut SSL_CTX, list: *const c_char) -> c_int;
        pub fn SSL_CTX_set_num_tickets(ctx: *mut SSL_CTX, num: usize) -> c_int;
        pub fn SSL_CTX_set_psk_server_callback(ctx: *mut SSL_CTX, cb: Option<PskServerCallback>);
        pub fn SSL_CTX_set_ex_data(ctx: *mut SSL_CTX, idx: c_int, data: *mut c_void) -> c_int;
        pub fn SSL_CTX_get_ex_data(ctx: *const SSL_CTX, idx: c_int) -> *mut c_void;

        pub fn SSL_new(ctx: *mut SSL_CTX) -> *mut SSL;
        pub fn SSL_free(ssl: *mut SSL);
        pub fn SSL_get_SSL_CTX(ssl: *const SSL) -> *mut SSL_CTX;
        pub fn SSL_set_bio(ssl: *mut SSL, rbio: *mut BIO, wbio: *mut BIO);
        pub fn SSL_set_accept_state(ssl: *mut SSL);
        pub fn SSL_do_handshake(ssl: *mut SSL) -> c_int;
        pub fn SSL_read(ssl: *mut SSL, buf: *mut c_void, num: c_int) -> c_int;
        pub fn SSL_write(ssl: *mut SSL, buf: *const c_void, num: c_int) -> c_int;
        pub fn SSL_shutdown(ssl: *mut SSL) -> c_int;
        pub fn SSL_get_error(ssl: *const SSL, ret: c_int) -> c_int;

        pub fn BIO_s_mem() -> *const BIO_METHOD;
        pub fn BIO_new(method: *const BIO_METHOD) -> *mut BIO;
        pub fn BIO_free(bio: *mut BIO) -> c_int;
        pub fn BIO_read(bio: *mut BIO, buf: *mut c_void, len: c_int) -> c_int;
        pub fn BIO_write(bio: *mut BIO, buf: *const c_void, len: c_int) -> c_int;
        pub fn BIO_ctrl_pending(bio: *mut BIO) -> usize;

        pub fn ERR_get_error() -> c_ulong;
        pub fn ERR_error_string_n(e: c_ulong, buf: *mut c_char, len: usize);
        pub fn ERR_clear_error();
    }
}

/// Raw bytes the reader takes off the socket per system call.
const RAW_READ: usize = 64 << 10;
/// The most plaintext one `write` seals, so the sealed buffer stays bounded.
const WRITE_CHUNK: usize = 256 << 10;
/// TLS 1.2 suites: PSK key exchange only (ephemeral ECDH first), AEAD ciphers.
const TLS12_SUITES: &CStr = c"ECDHE-PSK-CHACHA20-POLY1305:PSK-AES256-GCM-SHA384:\
PSK-AES128-GCM-SHA256:PSK-CHACHA20-POLY1305:ECDHE-PSK-AES256-CBC-SHA384:\
ECDHE-PSK-AES128-CBC-SHA256";
/// TLS 1.3 suites with SHA-256, the hash of keys from the legacy callback.
const TLS13_SUITES: &CStr = c"TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256";

/// Everything on OpenSSL's error queue of this thread, emptied, as one line.
fn openssl_errors() -> String {
    let mut parts = Vec::new();
    loop {
        // SAFETY: no arguments; reads and pops this thread's error queue.
        let code = unsafe { ffi::ERR_get_error() };
        if code == 0 {
            break;
        }
        let mut buf = [0 as c_char; 256];
        // SAFETY: `buf` is writable for `buf.len()` bytes; OpenSSL writes a NUL-terminated
        // string of at most that many bytes.
        unsafe { ffi::ERR_error_string_n(code, buf.as_mut_ptr(), buf.len()) };
        // SAFETY: ERR_error_string_n NUL-terminated `buf` within its length.
        let text = unsafe { CStr::from_ptr(buf.as_ptr()) };
        parts.push(text.to_string_lossy().into_owned());
    }
    if parts.is_empty() {
        "no detail from OpenSSL".into()
    } else {
        parts.join("; ")
    }
}

/// The OpenSSL context and the keys its callback reads; freed when the last session and the
/// server are gone (each session holds an `Arc` of it, because the callback dereferences
/// `keys` for as long as any session can run a handshake).
struct CtxInner {
    ctx: NonNull<ffi::SSL_CTX>,
    /// Boxed so the address given to OpenSSL stays put.
    keys: Box<PskKeys>,
}

// SAFETY: an SSL_CTX is safe to share between threads once configured (OpenSSL locks its
// reference count and caches internally); after `Context::new` this code only calls SSL_new on
// it. `keys` is only read.
unsafe impl Send for CtxInner {}
// SAFETY: as above.
unsafe impl Sync for CtxInner {}

impl Drop for CtxInner {
    fn drop(&mut self) {
        // SAFETY: `ctx` came from SSL_CTX_new and this is the one reference this code owns;
        // sessions keep OpenSSL's own references and an `Arc` to this.
        unsafe { ffi::SSL_CTX_free(self.ctx.as_ptr()) };
    }
}

/// OpenSSL's PSK server callback: copies the key of `identity` into `psk` and returns its
/// length, or 0 (unknown identity: the handshake fails).
unsafe extern "C" fn find_key(
    ssl: *mut ffi::SSL,
    identity: *const c_char,
    psk: *mut c_uchar,
    max_psk_len: c_uint,
) -> c_uint {
    // No panic may unwind into OpenSSL; nothing below should panic, but an unwind would be
    // undefined behaviour, so catch it and refuse the client instead.
    std::panic::catch_unwind(|| {
        if ssl.is_null() || identity.is_null() || psk.is_null() {
            return 0;
        }
        // SAFETY: `ssl` is the live session OpenSSL is calling back for.
        let ctx = unsafe { ffi::SSL_get_SSL_CTX(ssl) };
        if ctx.is_null() {
            return 0;
        }
        // SAFETY: `ctx` is the session's live context; index APP_DATA holds what
        // `Context::new` stored (a `*const PskKeys`), or null.
        let keys = unsafe { ffi::SSL_CTX_get_ex_data(ctx, ffi::APP_DATA) }.cast::<PskKeys>();
        // SAFETY: the pointer is to the `PskKeys` boxed in the `CtxInner` that every session
        // holds an `Arc` of, so it outlives this handshake; it is only read.
        let Some(keys) = (unsafe { keys.as_ref() }) else {
            return 0;
        };
        // SAFETY: OpenSSL passes the client's identity as a NUL-terminated string.
        let identity = unsafe { CStr::from_ptr(identity) };
        let Some(key) = keys.key(identity.to_bytes()) else {
            return 0;
        };
        if key.len() > max_psk_len as usize {
            return 0;
        }
        // SAFETY: `psk` is writable for `max_psk_len` bytes and `key.len()` fits; the buffers
        // are distinct allocations.
        unsafe { std::ptr::copy_nonoverlapping(key.as_ptr(), psk, key.len()) };
        key.len() as c_uint
    })
    .unwrap_or(0)
}

/// A configured context (see [`super::PskServer`]).
pub(super) struct Context(Arc<CtxInner>);

impl Context {
    pub(super) fn new(keys: PskKeys) -> Result<Context, PskError> {
        let fail = |what: &str| PskError::OpenSsl(format!("{what}: {}", openssl_errors()));
        // SAFETY: plain constructor calls; a null result is handled below.
        let ctx = unsafe {
            ffi::ERR_clear_error();
            ffi::SSL_CTX_new(ffi::TLS_server_method())
        };
        let ctx = NonNull::new(ctx).ok_or_else(|| fail("SSL_CTX_new"))?;
        let inner = CtxInner {
            ctx,
            keys: Box::new(keys),
        };
        let c = inner.ctx.as_ptr();
        // SAFETY: `c` is a live context owned by `inner` (freed on every return below by its
        // Drop); the strings are NUL-terminated constants; the callback has OpenSSL's
        // signature; the app-data pointer stays valid for the context's life (see `CtxInner`).
        unsafe {
            if ffi::SSL_CTX_ctrl(
                c,
                ffi::SSL_CTRL_SET_MIN_PROTO_VERSION,
                ffi::TLS1_2_VERSION,
                std::ptr::null_mut(),
            ) != 1
            {
                return Err(fail("setting TLS 1.2 as the oldest version"));
            }
            if ffi::SSL_CTX_set_cipher_list(c, TLS12_SUITES.as_ptr()) != 1 {
                return Err(fail("choosing the TLS 1.2 PSK cipher suites"));
            }
            if ffi::SSL_CTX_set_ciphersuites(c, TLS13_SUITES.as_ptr()) != 1 {
                return Err(fail("choosing the TLS 1.3 cipher suites"));
            }
            // No resumption tickets: every connection proves it holds the key again.
            if ffi::SSL_CTX_set_num_tickets(c, 0) != 1 {
                return Err(fail("turning off session tickets"));
            }
            let keys: *const PskKeys = &*inner.keys;
            if ffi::SSL_CTX_set_ex_data(c, ffi::APP_DATA, keys.cast_mut().cast()) != 1 {
                return Err(fail("attaching the keys"));
            }
            ffi::SSL_CTX_set_psk_server_callback(c, Some(find_key));
        }
        Ok(Context(Arc::new(inner)))
    }

    pub(super) fn accept(&self, sock: TcpStream) -> io::Result<PskStream> {
        let mut stream = PskStream {
            session: Session::new(&self.0)?,
            sock,
            raw: vec![0; RAW_READ],
            out: Vec::new(),
        };
        stream.handshake()?;
        Ok(stream)
    }
}

/// What a read from the session gave.
enum Got {
    Data(usize),
    /// It needs more bytes from the peer.
    WantRead,
    /// The peer sent `close_notify`.
    Closed,
}

/// One OpenSSL session over two memory BIOs: `rbio` holds bytes from the peer not yet
/// processed, `wbio` records to send.
struct Session {
    ssl: NonNull<ffi::SSL>,
    /// Owned by `ssl` (SSL_set_bio); valid while it is.
    rbio: NonNull<ffi::BIO>,
    wbio: NonNull<ffi::BIO>,
    /// Keeps the keys the callback reads alive (see `CtxInner`).
    _ctx: Arc<CtxInner>,
}

// SAFETY: an SSL object may be used from any thread as long as calls on it do not overlap; a
// `Session` is used through `&mut` only (behind a mutex once split).
unsafe impl Send for Session {}

impl Drop for Session {
    fn drop(&mut self) {
        // SAFETY: `ssl` came from SSL_new and is freed once; it frees both BIOs it owns.
        unsafe { ffi::SSL_free(self.ssl.as_ptr()) };
    }
}

impl Session {
    fn new(ctx: &Arc<CtxInner>) -> io::Result<Session> {
        let err = |what: &str| io::Error::other(format!("{what}: {}", openssl_errors()));
        // SAFETY: `ctx.ctx` is a live, configured context. Each object made here is either
        // handed to one that frees it (the BIOs to `ssl` by SSL_set_bio) or freed before the
        // error return.
        unsafe {
            ffi::ERR_clear_error();
            let ssl = NonNull::new(ffi::SSL_new(ctx.ctx.as_ptr())).ok_or_else(|| err("SSL_new"))?;
            let rbio = NonNull::new(ffi::BIO_new(ffi::BIO_s_mem()));
            let wbio = NonNull::new(ffi::BIO_new(ffi::BIO_s_mem()));
            let (Some(rbio), Some(wbio)) = (rbio, wbio) else {
                let e = err("BIO_new");
                for bio in [rbio, wbio].into_iter().flatten() {
                    ffi::BIO_free(bio.as_ptr());
                }
                ffi::SSL_free(ssl.as_ptr());
                return Err(e);
            };
            ffi::SSL_set_bio(ssl.as_ptr(), rbio.as_ptr(), wbio.as_ptr());
            ffi::SSL_set_accept_state(ssl.as_ptr());
            Ok(Session {
                ssl,
                rbio,
                wbio,
                _ctx: Arc::clone(ctx),
            })
        }
    }

    /// What a non-positive return `ret` of an SSL call means.
    fn outcome(&self, ret: c_int) -> io::Result<Got> {
        // SAFETY: `ssl` is live; `ret` is the return of the call just made on it, on this
        // thread, so the error queue is that call's.
        match unsafe { ffi::SSL_get_error(self.ssl.as_ptr(), ret) } {
            ffi::SSL_ERROR_WANT_READ => Ok(Got::WantRead),
            ffi::SSL_ERROR_ZERO_RETURN => Ok(Got::Closed),
            ffi::SSL_ERROR_SSL | ffi::SSL_ERROR_SYSCALL => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("TLS-PSK: {}", openssl_errors()),
            )),
            other => Err(io::Error::other(format!(
                "TLS-PSK: unexpected SSL_get_error {other}: {}",
                openssl_errors()
            ))),
        }
    }

    /// Hands bytes from the peer to the session.
    fn feed(&mut self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let n = data.len().min(c_int::MAX as usize);
            // SAFETY: `rbio` is live (owned by `ssl`) and `data` readable for `n` bytes. A
            // memory BIO takes everything it is given.
            let put =
                unsafe { ffi::BIO_write(self.rbio.as_ptr(), data.as_ptr().cast(), n as c_int) };
            if put <= 0 {
                return Err(io::Error::other("TLS-PSK: the memory BIO refused input"));
            }
            data = &data[put as usize..];
        }
        Ok(())
    }

    /// Moves every record the session has produced to the end of `out`.
    fn drain(&mut self, out: &mut Vec<u8>) {
        loop {
            // SAFETY: `wbio` is live (owned by `ssl`).
            let pending = unsafe { ffi::BIO_ctrl_pending(self.wbio.as_ptr()) };
            if pending == 0 {
                return;
            }
            let n = pending.min(c_int::MAX as usize);
            out.reserve(n);
            let spare = out.spare_capacity_mut();
            // SAFETY: `spare` is writable for at least `n` bytes (reserved above); BIO_read
            // writes at most `n` and returns how many.
            let got =
                unsafe { ffi::BIO_read(self.wbio.as_ptr(), spare.as_mut_ptr().cast(), n as c_int) };
            if got <= 0 {
                return;
            }
            // SAFETY: BIO_read initialised the first `got` (≤ n ≤ spare capacity) bytes.
            unsafe { out.set_len(out.len() + got as usize) };
        }
    }

    /// One step of the handshake: `Ok(None)` when it is complete.
    fn handshake_step(&mut self) -> io::Result<Option<Got>> {
        // SAFETY: `ssl` is live; the error queue is cleared first so SSL_get_error sees only
        // this call's errors.
        let ret = unsafe {
            ffi::ERR_clear_error();
            ffi::SSL_do_handshake(self.ssl.as_ptr())
        };
        if ret == 1 {
            return Ok(None);
        }
        self.outcome(ret).map(Some)
    }

    fn read(&mut self, out: &mut [u8]) -> io::Result<Got> {
        let n = out.len().min(c_int::MAX as usize) as c_int;
        // SAFETY: `ssl` is live and `out` writable for `n` bytes.
        let ret = unsafe {
            ffi::ERR_clear_error();
            ffi::SSL_read(self.ssl.as_ptr(), out.as_mut_ptr().cast(), n)
        };
        if ret > 0 {
            return Ok(Got::Data(ret as usize));
        }
        self.outcome(ret)
    }

    /// Seals up to [`WRITE_CHUNK`] bytes of `data` (not empty) into records in `wbio`.
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = data.len().min(WRITE_CHUNK) as c_int;
        // SAFETY: `ssl` is live and `data` readable for `n` bytes. Without partial-write mode
        // and with a memory BIO that never blocks, SSL_write takes all `n` or fails.
        let ret = unsafe {
            ffi::ERR_clear_error();
            ffi::SSL_write(self.ssl.as_ptr(), data.as_ptr().cast(), n)
        };
        if ret > 0 {
            return Ok(ret as usize);
        }
        match self.outcome(ret)? {
            Got::Closed => Err(io::ErrorKind::BrokenPipe.into()),
            // Only a renegotiation could make a write wait for the peer; it is not served.
            _ => Err(io::Error::other(
                "TLS-PSK: the session wants to renegotiate",
            )),
        }
    }

    /// Queues a `close_notify` alert.
    fn close_notify(&mut self) {
        // SAFETY: `ssl` is live. The result only says whether the peer's alert came too.
        unsafe {
            ffi::ERR_clear_error();
            ffi::SSL_shutdown(self.ssl.as_ptr());
            ffi::ERR_clear_error();
        }
    }
}

fn read_socket(sock: &mut TcpStream, raw: &mut [u8]) -> io::Result<usize> {
    loop {
        match sock.read(raw) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            other => return other,
        }
    }
}

/// A TLS-PSK session over a TCP socket as one stream, for the handshake phase (one thread);
/// [`PskStream::split`] turns it into halves for transmission.
pub struct PskStream {
    session: Session,
    sock: TcpStream,
    raw: Vec<u8>,
    out: Vec<u8>,
}

impl PskStream {
    /// Sends whatever the session has produced.
    fn send(&mut self) -> io::Result<()> {
        self.session.drain(&mut self.out);
        let sent = self.sock.write_all(&self.out);
        self.out.clear();
        sent
    }

    /// Reads what the peer sent next into the session.
    fn fill(&mut self) -> io::Result<()> {
        let n = read_socket(&mut self.sock, &mut self.raw)?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        self.session.feed(&self.raw[..n])
    }

    fn handshake(&mut self) -> io::Result<()> {
        loop {
            let step = self.session.handshake_step();
            // Sent even on failure: it carries the alert that tells the client why.
            let sent = self.send();
            match step? {
                None => return sent,
                Some(Got::WantRead) => {
                    sent?;
                    self.fill()?;
                }
                Some(Got::Closed | Got::Data(_)) => {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
            }
        }
    }

    /// A read half and a write half sharing the session (see the module docs of `psk`).
    pub fn split(mut self) -> io::Result<(PskReader, PskWriter)> {
        self.send()?;
        let read_sock = self.sock.try_clone()?;
        let shared = Arc::new(Mutex::new(self.session));
        Ok((
            PskReader {
                session: Arc::clone(&shared),
                sock: read_sock,
                raw: self.raw,
            },
            PskWriter {
                session: shared,
                sock: self.sock,
                sealed: self.out,
            },
        ))
    }
}

impl Read for PskStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            let got = self.session.read(buf);
            self.send()?;
            match got? {
                Got::Data(n) => return Ok(n),
                Got::Closed => return Ok(0),
                Got::WantRead => self.fill()?,
            }
        }
    }
}

impl Write for PskStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let n = self.session.write(buf)?;
        self.send()?;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.send()
    }
}

fn lock(session: &Mutex<Session>) -> MutexGuard<'_, Session> {
    session.lock().unwrap_or_else(|p| p.into_inner())
}

/// The read half of a split session: reads the socket unlocked, decrypts locked.
pub struct PskReader {
    session: Arc<Mutex<Session>>,
    sock: TcpStream,
    raw: Vec<u8>,
}

impl Read for PskReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        loop {
            // Anything this produces (alerts, a key update's answer) stays queued in `wbio`
            // and goes out with the writer's next write, so only the writer writes the socket.
            match lock(&self.session).read(out)? {
                Got::Data(n) => return Ok(n),
                Got::Closed => return Ok(0),
                Got::WantRead => {}
            }
            let n = read_socket(&mut self.sock, &mut self.raw)?;
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            lock(&self.session).feed(&self.raw[..n])?;
        }
    }
}

/// The write half of a split session: encrypts locked, writes the socket unlocked.
pub struct PskWriter {
    session: Arc<Mutex<Session>>,
    sock: TcpStream,
    sealed: Vec<u8>,
}

impl PskWriter {
    fn seal_and_send(&mut self, data: &[u8]) -> io::Result<usize> {
        self.sealed.clear();
        let n = {
            let mut s = lock(&self.session);
            let n = if data.is_empty() { 0 } else { s.write(data)? };
            s.drain(&mut self.sealed);
            n
        };
        self.sock.write_all(&self.sealed)?;
        Ok(n)
    }

    /// Sends a TLS `close_notify` (best effort; the caller closes the socket next).
    pub fn close_notify(&mut self) {
        lock(&self.session).close_notify();
        let _ = self.seal_and_send(&[]);
    }
}

impl Write for PskWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.seal_and_send(data)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.seal_and_send(&[]).map(|_| ())
    }
}
