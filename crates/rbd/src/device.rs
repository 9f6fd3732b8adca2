//! `RbdDevice`: one open RBD image as a [`BlockDevice`] on librbd's asynchronous API.
//!
//! `submit` issues each request at once (`rbd_aio_read2/write2/discard/write_zeroes/flush`), cut
//! at object boundaries (or at `max_transfer` when given), so every piece is one RADOS object
//! operation; `ring_doorbell` has nothing left to send. `poll` reaps librbd's finished
//! completions from its event queue (see `ffi`): no callback runs kura code on librbd's threads.
//! Requests in flight are bounded by the queue depth (`qd=`, default 128); one more is refused
//! with `QueueFull`. A failed flush poisons the device; a snapshot or `ro=1` refuses changes.

use crate::error::RbdError;
use crate::ffi::{library, AioOp, Cluster, ConnectStep, Finished, Image, Piece, Pool};
use crate::options::RbdSpec;
use kura_engine::poison::FlushPoison;
use kura_engine::{
    BlockDevice, Completion, DeviceError, DeviceResult, Errno, Geometry, Opcode, Rejected, Request,
};
use std::collections::VecDeque;
use std::sync::Arc;

/// Largest piece when cutting at the object size (objects may be up to 32 MiB).
const MAX_PIECE: u64 = 64 << 20;

/// What a request in flight was, to build its completion.
#[derive(Debug, Clone, Copy)]
struct Meta {
    tag: u64,
    op: Opcode,
    lba: u64,
}

/// An open RBD image (see the module docs).
pub struct RbdDevice {
    image: Image,
    geo: Geometry,
    name: String,
    /// Requests are cut at multiples of this many bytes.
    cut: u64,
    object_size: u64,
    poison: FlushPoison,
    /// Completions decided at submission (refused by the poison or read-only rule).
    ready: VecDeque<Completion>,
    /// Per request in flight, indexed by the token handed to the image.
    meta: Vec<Option<Meta>>,
    free_meta: Vec<usize>,
    pieces: Vec<Piece>,
    finished: Vec<Finished>,
}

impl RbdDevice {
    /// Connects to the cluster, opens (or creates) the image and sizes the device.
    pub fn open(spec: &RbdSpec) -> Result<RbdDevice, RbdError> {
        let lib = library().map_err(|detail| RbdError::Library { detail })?;
        let options = spec.rados_options();
        let user = format!("client.{}", spec.id);
        let conf_name = match (&spec.conf, &spec.mon_host) {
            (_, Some(mon_host)) => format!("mon_host {mon_host}"),
            (Some(conf), None) => conf.clone(),
            (None, None) => "the default ceph.conf ($CEPH_CONF or /etc/ceph)".into(),
        };
        let cluster = Cluster::connect(lib, &spec.id, spec.conf.as_deref(), &options).map_err(
            |(step, errno)| match step {
                ConnectStep::Create => RbdError::User {
                    user: user.clone(),
                    errno,
                },
                ConnectStep::ReadConf => RbdError::Config {
                    path: conf_name.clone(),
                    errno,
                },
                ConnectStep::Set(option) => RbdError::Option { option, errno },
                ConnectStep::Connect => match errno.0 {
                    libc::ETIMEDOUT => RbdError::Timeout {
                        conf: conf_name.clone(),
                        secs: spec.timeout_secs,
                        errno,
                    },
                    libc::EACCES | libc::EPERM => RbdError::Auth {
                        user: user.clone(),
                        errno,
                    },
                    _ => RbdError::Connect {
                        conf: conf_name.clone(),
                        user: user.clone(),
                        errno,
                    },
                },
            },
        )?;
        let pool = Pool::open(Arc::new(cluster), &spec.pool).map_err(|errno| match errno.0 {
            libc::ENOENT => RbdError::NoPool {
                pool: spec.pool.clone(),
            },
            _ => RbdError::Call {
                what: "opening the pool",
                name: spec.pool.clone(),
                errno,
            },
        })?;
        let depth = spec.queue.queue_depth as usize;
        let open = |pool| {
            Image::open(
                pool,
                &spec.image,
                spec.snap.as_deref(),
                spec.read_only,
                depth,
            )
        };
        // `Image::open` consumes the pool: look the image up first when it may need creating.
        let image = match spec.create {
            Some(size) => {
                match pool.create_image(&spec.image, size) {
                    Ok(()) => {}
                    Err(e) if e.0 == libc::EEXIST => {}
                    Err(errno) => {
                        return Err(RbdError::Call {
                            what: "creating the image",
                            name: spec.name(),
                            errno,
                        })
                    }
                }
                open(pool)
            }
            None => open(pool),
        }
        .map_err(|errno| match errno.0 {
            libc::ENOENT => RbdError::NoImage {
                name: spec.name(),
                snapshot: spec.snap.is_some(),
            },
            libc::ETIMEDOUT => RbdError::Timeout {
                conf: conf_name.clone(),
                secs: spec.timeout_secs,
                errno,
            },
            libc::EROFS | libc::EBUSY => RbdError::InUse { name: spec.name() },
            _ => RbdError::Call {
                what: "opening the image",
                name: spec.name(),
                errno,
            },
        })?;
        let info = image.info().map_err(|errno| RbdError::Call {
            what: "reading the image's size",
            name: spec.name(),
            errno,
        })?;
        let bs = u64::from(spec.queue.block_size);
        if info.size < bs {
            return Err(RbdError::TooSmall {
                name: spec.name(),
                size: info.size,
                block_size: spec.queue.block_size,
            });
        }
        let mut queue = spec.queue;
        let cut = if spec.max_transfer_given {
            u64::from(queue.max_transfer)
        } else {
            // One object per piece; max_transfer reported as the object size (a multiple of
            // the block size for every block size rbd: takes, since objects are >= 4 KiB).
            let cut = info.object_size.clamp(bs, MAX_PIECE);
            queue.max_transfer = u32::try_from(cut - cut % bs).unwrap_or(queue.max_transfer);
            u64::from(queue.max_transfer)
        };
        let geo = queue.geometry(info.size, 1);
        let poison = if spec.read_only {
            FlushPoison::read_only()
        } else {
            FlushPoison::default()
        };
        Ok(RbdDevice {
            image,
            geo,
            name: spec.name(),
            cut,
            object_size: info.object_size,
            poison,
            ready: VecDeque::new(),
            meta: (0..depth).map(|_| None).collect(),
            free_meta: (0..depth).rev().collect(),
            pieces: Vec::new(),
            finished: Vec::new(),
        })
    }

    /// The image's object size in bytes.
    pub fn object_size(&self) -> u64 {
        self.object_size
    }

    /// Cuts `bytes` bytes at `offset` into pieces at multiples of `self.cut`.
    fn cut_pieces(&mut self, offset: u64, bytes: u64) {
        self.pieces.clear();
        let mut at = offset;
        let end = offset + bytes;
        while at < end {
            let boundary = (at / self.cut + 1) * self.cut;
            let next = boundary.min(end);
            self.pieces.push(Piece {
                offset: at,
                len: next - at,
                buf_offset: (at - offset) as usize,
            });
            at = next;
        }
    }
}

impl BlockDevice for RbdDevice {
    fn geometry(&self) -> Geometry {
        self.geo
    }

    fn describe(&self) -> String {
        format!("rbd:{}", self.name)
    }

    fn submit(&mut self, req: Request) -> Result<(), Rejected> {
        let req = req.admit(&self.geo, self.in_flight())?;
        if let Err(e) = self.poison.check(req.op) {
            self.ready.push_back(Completion::of(req, Err(e)));
            return Ok(());
        }
        let Some(token) = self.free_meta.pop() else {
            let depth = self.geo.queue_depth;
            return Err(Rejected::new(req, DeviceError::QueueFull { depth }));
        };
        let bs = u64::from(self.geo.block_size);
        let op = match req.op {
            Opcode::Read => AioOp::Read,
            Opcode::Write => AioOp::Write,
            Opcode::Discard => AioOp::Discard,
            Opcode::WriteZeroes => AioOp::WriteZeroes,
            Opcode::Flush => AioOp::Flush,
        };
        if op == AioOp::Flush {
            self.pieces.clear();
            self.pieces.push(Piece {
                offset: 0,
                len: 0,
                buf_offset: 0,
            });
        } else {
            self.cut_pieces(req.lba * bs, req.blocks * bs);
        }
        let Request {
            tag,
            op: opcode,
            lba,
            blocks,
            buf,
        } = req;
        match self.image.start(token as u64, op, buf, &self.pieces) {
            Ok(()) => {
                self.meta[token] = Some(Meta {
                    tag,
                    op: opcode,
                    lba,
                });
                Ok(())
            }
            Err((buf, errno)) => {
                self.free_meta.push(token);
                let req = Request {
                    tag,
                    op: opcode,
                    lba,
                    blocks,
                    buf,
                };
                let error = if errno.0 == libc::EAGAIN {
                    DeviceError::QueueFull {
                        depth: self.geo.queue_depth,
                    }
                } else {
                    DeviceError::Io {
                        op: opcode,
                        lba,
                        errno,
                    }
                };
                Err(Rejected::new(req, error))
            }
        }
    }

    fn ring_doorbell(&mut self) -> DeviceResult<()> {
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Completion>, min_complete: usize) -> DeviceResult<usize> {
        let mut n = self.ready.len();
        out.extend(self.ready.drain(..));
        let want = min_complete.saturating_sub(n);
        self.image
            .reap(&mut self.finished, want)
            .map_err(|errno| DeviceError::Offline {
                reason: format!(
                    "rbd:{}: waiting for librbd's completions failed: {errno}",
                    self.name
                ),
            })?;
        for f in self.finished.drain(..) {
            let token = f.token as usize;
            let Some(meta) = self.meta.get_mut(token).and_then(Option::take) else {
                continue;
            };
            self.free_meta.push(token);
            let status = f.status.map_err(|errno: Errno| DeviceError::Io {
                op: meta.op,
                lba: meta.lba,
                errno,
            });
            self.poison.observe(meta.op, &status);
            out.push(Completion {
                tag: meta.tag,
                op: meta.op,
                status,
                buf: f.buf,
            });
            n += 1;
        }
        Ok(n)
    }

    fn in_flight(&self) -> usize {
        self.image.requests_in_flight() + self.ready.len()
    }
}
