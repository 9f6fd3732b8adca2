//! The receiving side's conversation rules (`docs/ingest-protocol.md` §3) as a pure state
//! machine: which frame may come next, how many record bytes are still owed, what each frame
//! asks the server to do. No I/O, so every rule is testable on its own and a hostile sender can
//! only drive it into a typed [`SessionError`].

use crate::frame::{Frame, FrameHeader, FrameType, Hello, Limits, VERSION};

/// Stages a stream may ask for (`HELLO.stage`, §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Stage {
    None = 0,
    Crc32c = 1,
    Zstd = 2,
    Classify = 3,
}

impl Stage {
    pub fn from_byte(b: u8) -> Option<Stage> {
        Some(match b {
            0 => Stage::None,
            1 => Stage::Crc32c,
            2 => Stage::Zstd,
            3 => Stage::Classify,
            _ => return None,
        })
    }
}

/// Why a frame breaks the conversation: a bad frame (code 1) unless said otherwise.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    #[error("{got:?} frame while {state}")]
    Unexpected { got: FrameType, state: &'static str },
    #[error("sender speaks versions {min}..={max}, server speaks {VERSION}")]
    Version { min: u16, max: u16 },
    #[error("unknown stage {0}")]
    Stage(u8),
    #[error("record seq {seq} not above the previous {last}")]
    SeqOrder { seq: u64, last: u64 },
    #[error("record of {size} bytes; allowed 1..={max}")]
    RecordSize { size: u64, max: u64 },
    #[error("DATA of {len} bytes overruns record {seq}: {received} of {size} received")]
    Overrun {
        seq: u64,
        size: u64,
        received: u64,
        len: u32,
    },
    #[error("END of record {seq} after {received} of {size} bytes")]
    Short { seq: u64, size: u64, received: u64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    AwaitHello,
    AwaitAuth,
    Streaming,
    Closed,
}

impl State {
    fn name(self) -> &'static str {
        match self {
            State::AwaitHello => "waiting for HELLO",
            State::AwaitAuth => "waiting for AUTH",
            State::Streaming => "streaming",
            State::Closed => "closed",
        }
    }
}

/// The record being received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenRecord {
    pub seq: u64,
    pub size: u64,
    pub received: u64,
}

/// What a control frame asks of the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Send `WELCOME` (and `READY` unless authentication follows).
    Hello { stage: Stage, ack_each: bool },
    /// Check this MAC, then `READY` or `ERROR` 3.
    Auth { mac: [u8; 32] },
    /// A record starts.
    Begin { seq: u64, size: u64 },
    /// The record is complete: verify `crc`, store it, acknowledge it when `ack`.
    End {
        seq: u64,
        size: u64,
        crc: u32,
        ack: bool,
    },
    /// Acknowledge everything up to `upto`.
    Sync { upto: u64 },
    /// The sender is done.
    Bye,
}

/// One connection's receiving state.
#[derive(Debug, Clone)]
pub struct Session {
    state: State,
    limits: Limits,
    auth: bool,
    ack_each: bool,
    last_seq: Option<u64>,
    open: Option<OpenRecord>,
}

impl Session {
    /// A connection that requires `AUTH` after `HELLO` when `auth`.
    pub fn new(limits: Limits, auth: bool) -> Session {
        Session {
            state: State::AwaitHello,
            limits,
            auth,
            ack_each: true,
            last_seq: None,
            open: None,
        }
    }

    /// The record being received, if any.
    pub fn open(&self) -> Option<OpenRecord> {
        self.open
    }

    /// Checks that a frame with this header may come now, before its payload is read.
    pub fn admit(&self, h: &FrameHeader) -> Result<(), SessionError> {
        let unexpected = Err(SessionError::Unexpected {
            got: h.ty,
            state: self.state.name(),
        });
        match (self.state, h.ty) {
            (State::AwaitHello, FrameType::Hello) | (State::AwaitAuth, FrameType::Auth) => Ok(()),
            (State::Streaming, FrameType::Data) => match self.open {
                Some(r) if r.received + u64::from(h.len) <= r.size => Ok(()),
                Some(r) => Err(SessionError::Overrun {
                    seq: r.seq,
                    size: r.size,
                    received: r.received,
                    len: h.len,
                }),
                None => unexpected,
            },
            (State::Streaming, FrameType::End) if self.open.is_some() => Ok(()),
            (State::Streaming, FrameType::Begin | FrameType::Sync | FrameType::Bye)
                if self.open.is_none() =>
            {
                Ok(())
            }
            _ => unexpected,
        }
    }

    /// Counts `len` bytes of `DATA` that [`Session::admit`] accepted.
    pub fn data(&mut self, len: u32) -> Result<(), SessionError> {
        match &mut self.open {
            Some(r) if r.received + u64::from(len) <= r.size => {
                r.received += u64::from(len);
                Ok(())
            }
            _ => Err(SessionError::Unexpected {
                got: FrameType::Data,
                state: self.state.name(),
            }),
        }
    }

    /// Applies a decoded control frame (every type but `DATA`) and says what it asks for.
    pub fn control(&mut self, f: &Frame) -> Result<Step, SessionError> {
        let ty = f.frame_type();
        let unexpected = SessionError::Unexpected {
            got: ty,
            state: self.state.name(),
        };
        let step = match (self.state, f) {
            (State::AwaitHello, Frame::Hello(h)) => self.hello(h)?,
            (State::AwaitAuth, Frame::Auth { mac }) => {
                self.state = State::Streaming;
                Step::Auth { mac: *mac }
            }
            (State::Streaming, Frame::Begin { seq, size }) if self.open.is_none() => {
                if let Some(last) = self.last_seq.filter(|last| seq <= last) {
                    return Err(SessionError::SeqOrder { seq: *seq, last });
                }
                if *size == 0 || *size > self.limits.max_record {
                    return Err(SessionError::RecordSize {
                        size: *size,
                        max: self.limits.max_record,
                    });
                }
                self.last_seq = Some(*seq);
                self.open = Some(OpenRecord {
                    seq: *seq,
                    size: *size,
                    received: 0,
                });
                Step::Begin {
                    seq: *seq,
                    size: *size,
                }
            }
            (State::Streaming, Frame::End { record_crc, ack }) => {
                let r = self.open.ok_or(unexpected)?;
                if r.received != r.size {
                    return Err(SessionError::Short {
                        seq: r.seq,
                        size: r.size,
                        received: r.received,
                    });
                }
                self.open = None;
                Step::End {
                    seq: r.seq,
                    size: r.size,
                    crc: *record_crc,
                    ack: *ack || self.ack_each,
                }
            }
            (State::Streaming, Frame::Sync { upto }) if self.open.is_none() => {
                Step::Sync { upto: *upto }
            }
            (State::Streaming, Frame::Bye) if self.open.is_none() => {
                self.state = State::Closed;
                Step::Bye
            }
            _ => return Err(unexpected),
        };
        Ok(step)
    }

    fn hello(&mut self, h: &Hello) -> Result<Step, SessionError> {
        if h.min_version > VERSION || h.max_version < VERSION {
            return Err(SessionError::Version {
                min: h.min_version,
                max: h.max_version,
            });
        }
        let stage = Stage::from_byte(h.stage).ok_or(SessionError::Stage(h.stage))?;
        self.ack_each = h.ack == 0;
        self.state = if self.auth {
            State::AwaitAuth
        } else {
            State::Streaming
        };
        Ok(Step::Hello {
            stage,
            ack_each: self.ack_each,
        })
    }
}
