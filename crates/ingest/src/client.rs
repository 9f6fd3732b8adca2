//! The sending side (`kura ingest send`, tests, the bench): connect, say hello, answer the
//! challenge, stream records as `BEGIN`/`DATA`/`END`, and collect the server's answers on a
//! thread of their own so sending never waits for acknowledgements until asked to.

use crate::frame::{self, Frame, Hello, Limits, Welcome, HEADER_LEN, VERSION};
use crate::net::{self, Addr, Stream};
use crate::session::Stage;
use std::io::{self, BufWriter, Read, Write};
use std::sync::mpsc::{self, Receiver};
use std::thread::JoinHandle;

/// Why sending failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    #[error("connection: {0}")]
    Io(#[from] io::Error),
    #[error("bad frame from the server: {0}")]
    Frame(#[from] frame::FrameError),
    #[error("server answered {what} ({code}): {message}")]
    Server {
        code: u16,
        what: &'static str,
        message: String,
    },
    #[error("server sent {0:?} during the handshake")]
    Unexpected(Box<Frame>),
    #[error("the server needs a shared key (--key FILE)")]
    NeedKey,
    #[error("the server closed the connection before answering")]
    Closed,
}

/// How a connection sends.
#[derive(Debug, Clone, Default)]
pub struct ClientOptions {
    pub stage: Option<Stage>,
    /// Acknowledge only on request (`END` flag, `SYNC`) instead of every record.
    pub batch_acks: bool,
    pub key: Option<Vec<u8>>,
}

/// What the server said about the records of a connection.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Answers {
    /// `(seq, id)` of every acknowledged record.
    pub acks: Vec<(u64, u64)>,
    /// `(code, seq, message)` of every error.
    pub errors: Vec<(u16, u64, String)>,
    /// The last `SYNCED`: `(upto, records stored for this connection)`.
    pub synced: Option<(u64, u64)>,
}

impl Answers {
    fn note(&mut self, f: Frame) {
        match f {
            Frame::Ack { seq, id } => self.acks.push((seq, id)),
            Frame::Error { code, seq, message } => self.errors.push((code, seq, message)),
            Frame::Synced { upto, records } => self.synced = Some((upto, records)),
            _ => {}
        }
    }
}

/// One connection to an ingest server.
pub struct Client {
    out: BufWriter<Stream>,
    answers: Receiver<Frame>,
    reader: Option<JoinHandle<()>>,
    seen: Answers,
    next_seq: u64,
    max_frame: usize,
    /// The server's welcome.
    pub welcome: Welcome,
}

fn read_frame(s: &mut impl Read, limits: &Limits) -> Result<Option<Frame>, ClientError> {
    let mut hb = [0u8; HEADER_LEN];
    match s.read_exact(&mut hb) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let h = frame::FrameHeader::parse(&hb, limits)?;
    let mut p = vec![0u8; h.len as usize];
    s.read_exact(&mut p)?;
    h.check(&p)?;
    Ok(Some(Frame::decode(&h, &p)?))
}

fn server_error(f: Frame) -> ClientError {
    match f {
        Frame::Error { code, message, .. } => ClientError::Server {
            code,
            what: crate::server::describe_code(code),
            message,
        },
        other => ClientError::Unexpected(Box::new(other)),
    }
}

impl Client {
    /// Connects and completes the handshake (`HELLO`, `WELCOME`, `AUTH`, `READY`).
    pub fn connect(addr: &Addr, opts: &ClientOptions) -> Result<Client, ClientError> {
        let mut stream = Stream::connect(addr)?;
        let client_nonce: [u8; 16] = rand::random();
        let hello = Frame::Hello(Hello {
            min_version: VERSION,
            max_version: VERSION,
            stage: opts.stage.unwrap_or(Stage::Crc32c) as u8,
            ack: u8::from(opts.batch_acks),
            client_nonce,
        });
        stream.write_all(&hello.encode())?;
        let limits = Limits {
            max_frame: 64 << 10,
            max_record: u64::MAX,
        };
        let welcome = match read_frame(&mut stream, &limits)? {
            Some(Frame::Welcome(w)) => w,
            Some(other) => return Err(server_error(other)),
            None => return Err(ClientError::Closed),
        };
        if welcome.auth == 1 {
            let key = opts.key.as_deref().ok_or(ClientError::NeedKey)?;
            let mac = net::auth_mac(key, &client_nonce, &welcome.server_nonce);
            stream.write_all(&Frame::Auth { mac }.encode())?;
        }
        match read_frame(&mut stream, &limits)? {
            Some(Frame::Ready) => {}
            Some(other) => return Err(server_error(other)),
            None => return Err(ClientError::Closed),
        }
        let mut input = stream.try_clone()?;
        let (tx, answers) = mpsc::channel();
        let reader = std::thread::Builder::new()
            .name("ingest-answers".into())
            .spawn(move || {
                while let Ok(Some(f)) = read_frame(&mut input, &limits) {
                    if tx.send(f).is_err() {
                        break;
                    }
                }
            })?;
        Ok(Client {
            out: BufWriter::with_capacity(256 << 10, stream),
            answers,
            reader: Some(reader),
            seen: Answers::default(),
            next_seq: 0,
            max_frame: (welcome.max_frame as usize).min(1 << 20),
            welcome,
        })
    }

    /// Sends one record; returns its `seq`. `ack` asks for an acknowledgement (always given
    /// without batch acks).
    pub fn send(&mut self, data: &[u8], ack: bool) -> Result<u64, ClientError> {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.out.write_all(
            &Frame::Begin {
                seq,
                size: data.len() as u64,
            }
            .encode(),
        )?;
        for piece in data.chunks(self.max_frame) {
            self.out
                .write_all(&frame::header(frame::FrameType::Data, 0, piece))?;
            self.out.write_all(piece)?;
        }
        self.out.write_all(
            &Frame::End {
                record_crc: frame::record_crc(data),
                ack,
            }
            .encode(),
        )?;
        self.drain();
        Ok(seq)
    }

    /// Writes raw bytes (tests use it to send what a well-behaved sender never would).
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        self.out.write_all(bytes)?;
        self.out.flush()?;
        Ok(())
    }

    fn drain(&mut self) {
        while let Ok(f) = self.answers.try_recv() {
            self.seen.note(f);
        }
    }

    /// Asks for every record so far to be acknowledged and waits for `SYNCED`.
    pub fn sync(&mut self) -> Result<(u64, u64), ClientError> {
        let upto = self.next_seq.saturating_sub(1);
        self.out.write_all(&Frame::Sync { upto }.encode())?;
        self.out.flush()?;
        loop {
            match self.answers.recv() {
                Ok(Frame::Synced { upto: u, records }) if u == upto => {
                    self.seen.synced = Some((u, records));
                    return Ok((u, records));
                }
                Ok(f) => self.seen.note(f),
                Err(_) => return Err(ClientError::Closed),
            }
        }
    }

    /// Says `BYE`, then collects every answer until the server closes. A server that closed
    /// first (it is stopping, or it answered an error) cannot take the `BYE`; what it said
    /// before closing is still collected.
    pub fn finish(mut self) -> Result<Answers, ClientError> {
        let bye = self
            .out
            .write_all(&Frame::Bye.encode())
            .and_then(|()| self.out.flush());
        if bye.is_err() {
            let _ = self.out.get_ref().shutdown(std::net::Shutdown::Write);
        }
        while let Ok(f) = self.answers.recv() {
            self.seen.note(f);
        }
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        Ok(std::mem::take(&mut self.seen))
    }

    /// Drops the connection without `BYE` after writing `partial` (a record cut short).
    pub fn abort(mut self, partial: &[u8]) -> Result<(), ClientError> {
        self.out.write_all(partial)?;
        self.out.flush()?;
        let stream = self.out.get_ref();
        stream.shutdown(std::net::Shutdown::Both)?;
        Ok(())
    }

    /// Answers received so far.
    pub fn answers(&mut self) -> &Answers {
        self.drain();
        &self.seen
    }
}
