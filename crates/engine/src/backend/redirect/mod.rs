//! `redirect:PATH` — the paper's baseline made honest on this machine: every command crosses to a
//! separate proxy process (the "host") over a shared-memory channel; the proxy performs the
//! system call on buffered I/O into its own memory and copies the data across, as a host serves
//! an accelerator's system calls.
//!
//! - [`channel`]: the shared mapping, its slots and the publish/wake protocol.
//! - [`proxy`]: the proxy's loop, async-signal-safe because it runs in a forked child of a
//!   possibly multi-threaded process (forking without exec keeps `kura` one binary and works
//!   inside test harnesses; the child touches nothing that could hold a lock).
//!
//! The optional link model (`link=aurora`, or `call_us=`/`copy_gbps=`) adds the paper's measured
//! SX-Aurora costs — 42.7 µs per call and 0.92 GB/s — to every call in the proxy. When it is on,
//! [`BlockDevice::describe`] says "modeled", and so must every report line that uses it.

pub mod channel;
pub mod proxy;

use super::common::{claim_parent, hand_over, release_parent, QueueOptions, COMMON_OPTIONS};
use super::file::{BackingFile, DirectMode};
use super::sync::FILE_OPTIONS;
use crate::device::{BlockDevice, Completion, Geometry, Opcode, Rejected, Request};
use crate::error::{DeviceError, DeviceResult, Errno, OpenError};
use crate::poison::FlushPoison;
use crate::spec::Spec;
use crate::split::SplitParent;
use channel::{Channel, MAX_SLOTS};
use std::collections::VecDeque;
use std::os::unix::io::AsRawFd;
use std::time::{Duration, Instant};

/// The paper's measured cost of one redirected system call on SX-Aurora (42,748 ns).
pub const AURORA_CALL_US: f64 = 42.7;
/// The paper's effective copy bandwidth between host and accelerator (1 MB in 1087 µs).
pub const AURORA_COPY_GBPS: f64 = 0.92;
/// Options of `redirect:` besides the common and file ones.
pub const REDIRECT_OPTIONS: &[&str] = &["link", "call_us", "copy_gbps"];

/// How long a caller waits for one completion before checking that the proxy lives.
const WAIT_SLICE: Duration = Duration::from_millis(100);
/// How long a command may take before the proxy is declared hung.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// A link between caller and proxy with a modeled cost.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkModel {
    pub call_us: f64,
    pub copy_gbps: f64,
}

struct Parent {
    split: SplitParent,
    next_piece: u32,
    pieces: u32,
}

/// A queue pair whose commands a proxy process performs.
pub struct RedirectDevice {
    chan: Channel,
    pid: libc::pid_t,
    path: String,
    geo: Geometry,
    model: Option<LinkModel>,
    parents: Vec<Option<Parent>>,
    free_parents: Vec<u32>,
    /// Parents with pieces not yet given a slot, in order.
    waiting: VecDeque<u32>,
    /// For each channel slot: the (parent, piece) it carries.
    slot_owner: Vec<Option<(u32, u32)>>,
    free_slots: Vec<u32>,
    ready: VecDeque<Completion>,
    in_flight: usize,
    poison: FlushPoison,
    offline: Option<String>,
    /// Kept open (and locked) until the proxy, which shares the open file, has exited: dropping
    /// it unlocks the image for both processes.
    _backing: BackingFile,
    /// Kept so the parent's copy of the staging memory outlives the fork bookkeeping.
    _staging: Vec<u8>,
}

impl RedirectDevice {
    /// Forks the proxy for `backing` (opened buffered) and maps the channel.
    pub fn new(
        backing: BackingFile,
        opts: QueueOptions,
        model: Option<LinkModel>,
    ) -> Result<Self, OpenError> {
        backing.check_block_size(opts.block_size)?;
        let geo = opts.geometry(backing.size, 1);
        let slots = (opts.queue_depth as usize).min(MAX_SLOTS);
        let data = opts.max_transfer as usize;
        let chan = Channel::map(slots, data).map_err(|e| OpenError::Os {
            path: backing.path.clone(),
            errno: Errno::from_io(&e),
        })?;
        let mut staging = vec![0u8; data];
        let (call_ns, ns_per_byte) = match model {
            Some(m) => (
                (m.call_us * 1000.0) as u64,
                if m.copy_gbps > 0.0 {
                    1.0 / m.copy_gbps
                } else {
                    0.0
                },
            ),
            None => (0, 0.0),
        };
        // SAFETY: getpid has no preconditions.
        let parent_pid = unsafe { libc::getpid() };
        let cfg = proxy::ProxyConfig {
            fd: backing.file.as_raw_fd(),
            staging: staging.as_mut_ptr(),
            staging_len: staging.len(),
            call_ns,
            ns_per_byte,
            parent_pid,
        };
        // SAFETY: fork has no memory-safety preconditions. In the child only `proxy::serve` runs,
        // which is async-signal-safe by construction (see its docs), so locks held by other
        // threads of the parent at the moment of the fork are never touched.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(OpenError::Os {
                path: backing.path.clone(),
                errno: Errno::last(),
            });
        }
        if pid == 0 {
            // SAFETY: we are the freshly forked child and the channel and config were prepared
            // before the fork.
            unsafe { proxy::serve(&chan, &cfg) }
        }
        let qd = opts.queue_depth as usize;
        let poison = if backing.read_only() {
            FlushPoison::read_only()
        } else {
            FlushPoison::default()
        };
        Ok(RedirectDevice {
            chan,
            pid,
            path: backing.path.clone(),
            geo,
            model,
            parents: (0..qd).map(|_| None).collect(),
            free_parents: (0..qd as u32).rev().collect(),
            waiting: VecDeque::new(),
            slot_owner: vec![None; slots],
            free_slots: (0..slots as u32).rev().collect(),
            ready: VecDeque::new(),
            in_flight: 0,
            poison,
            offline: None,
            _staging: staging,
            _backing: backing,
        })
    }

    /// The proxy's process id (tests kill it to check that nothing hangs).
    pub fn proxy_pid(&self) -> i32 {
        self.pid
    }

    /// The link model in force, if any.
    pub fn link_model(&self) -> Option<LinkModel> {
        self.model
    }

    fn complete_now(&mut self, req: Request, status: DeviceResult<()>) {
        self.poison.observe(req.op, &status);
        self.ready.push_back(Completion::of(req, status));
        self.in_flight += 1;
    }

    /// Gives free slots to waiting pieces, copies write data in and publishes them.
    fn dispatch(&mut self) {
        let mut published = false;
        while let Some(&parent_id) = self.waiting.front() {
            let Some(slot) = self.free_slots.pop() else {
                break;
            };
            let Some(parent) = self.parents[parent_id as usize].as_mut() else {
                self.free_slots.push(slot);
                self.waiting.pop_front();
                continue;
            };
            let piece = parent.next_piece;
            parent.next_piece += 1;
            if parent.next_piece == parent.pieces {
                self.waiting.pop_front();
            }
            let req = parent.split.request();
            let bs = u64::from(self.geo.block_size);
            let max_blocks = u64::from(self.geo.max_transfer_blocks());
            let (offset, len, buf_at) = if req.op.has_data() {
                let first = u64::from(piece) * max_blocks;
                let blocks = max_blocks.min(req.blocks - first);
                (
                    (req.lba + first) * bs,
                    (blocks * bs) as usize,
                    (first * bs) as usize,
                )
            } else {
                (req.lba * bs, (req.blocks * bs) as usize, 0)
            };
            let op = match req.op {
                Opcode::Read => channel::OP_READ,
                Opcode::Write => channel::OP_WRITE,
                Opcode::Flush => channel::OP_FLUSH,
                Opcode::WriteZeroes => channel::OP_ZERO,
                Opcode::Discard => channel::OP_DISCARD,
            };
            if req.op == Opcode::Write {
                if let Some(buf) = req.buf.as_ref() {
                    // SAFETY: the slot's data area holds max_transfer >= len bytes and is ours
                    // (the slot is free); the source range was validated.
                    unsafe {
                        self.chan
                            .copy_in(slot as usize, buf.as_ptr().add(buf_at), len)
                    };
                }
            }
            self.slot_owner[slot as usize] = Some((parent_id, piece));
            self.chan.submit(
                slot,
                channel::Command {
                    op,
                    offset,
                    len: len as u64,
                },
            );
            published = true;
        }
        if published {
            self.chan.wake_proxy();
        }
    }

    /// Collects finished slots; completed parents go to `out`.
    fn reap(&mut self, out: &mut Vec<Completion>) -> usize {
        let mut finished = 0;
        for slot in 0..self.slot_owner.len() {
            let Some((parent_id, piece)) = self.slot_owner[slot] else {
                continue;
            };
            let Some(errno) = self.chan.take_done(slot) else {
                continue;
            };
            self.slot_owner[slot] = None;
            self.free_slots.push(slot as u32);
            let bs = u64::from(self.geo.block_size);
            let max_blocks = u64::from(self.geo.max_transfer_blocks());
            let Some(parent) = self.parents[parent_id as usize].as_mut() else {
                continue;
            };
            let req = parent.split.request_mut();
            let first = u64::from(piece) * max_blocks;
            let status = if errno != 0 {
                Err(DeviceError::Io {
                    op: req.op,
                    lba: req.lba + if req.op.has_data() { first } else { 0 },
                    errno: Errno(errno as i32),
                })
            } else {
                if req.op == Opcode::Read {
                    let blocks = max_blocks.min(req.blocks - first);
                    let len = (blocks * bs) as usize;
                    if let Some(buf) = req.buf.as_mut() {
                        // SAFETY: the proxy finished with this slot (`take_done`), the data area
                        // holds `len` bytes, and the destination range lies inside the
                        // validated buffer.
                        unsafe {
                            self.chan.copy_out(
                                slot,
                                buf.as_mut_ptr().add((first * bs) as usize),
                                len,
                            )
                        };
                    }
                }
                Ok(())
            };
            if parent.split.piece_done(status) {
                let done = self.parents[parent_id as usize].take().map(|p| p.split);
                release_parent(
                    done,
                    parent_id,
                    &mut self.free_parents,
                    &mut self.poison,
                    out,
                );
                finished += 1;
            }
        }
        self.in_flight -= finished;
        finished
    }

    /// True while the proxy process exists.
    fn proxy_alive(&mut self) -> bool {
        let mut status = 0;
        // SAFETY: waitpid on our own child with WNOHANG.
        let rc = unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) };
        rc == 0
    }

    /// The proxy is gone: every command in flight fails, and so does every later one.
    fn go_offline(&mut self, reason: String, out: &mut Vec<Completion>) -> usize {
        self.offline = Some(reason.clone());
        let mut n = 0;
        for slot in self.slot_owner.iter_mut() {
            *slot = None;
        }
        self.waiting.clear();
        for parent in self.parents.iter_mut() {
            if let Some(p) = parent.take() {
                let mut c = p.split.into_completion();
                c.status = Err(DeviceError::Offline {
                    reason: reason.clone(),
                });
                out.push(c);
                n += 1;
            }
        }
        self.in_flight -= n;
        n
    }
}

impl BlockDevice for RedirectDevice {
    fn geometry(&self) -> Geometry {
        self.geo
    }

    fn stats(&self, out: &mut Vec<crate::DriveStats>) {
        out.push(crate::DriveStats::new("redirect"));
    }

    fn describe(&self) -> String {
        match self.model {
            Some(m) => format!(
                "redirect:{} (proxy pid {}, modeled link: {} µs/call, {} GB/s)",
                self.path, self.pid, m.call_us, m.copy_gbps
            ),
            None => format!("redirect:{} (proxy pid {})", self.path, self.pid),
        }
    }

    fn submit(&mut self, req: Request) -> Result<(), Rejected> {
        let req = req.admit(&self.geo, self.in_flight)?;
        if let Some(reason) = &self.offline {
            return Err(Rejected::new(
                req,
                DeviceError::Offline {
                    reason: reason.clone(),
                },
            ));
        }
        if let Err(e) = self.poison.check(req.op) {
            self.complete_now(req, Err(e));
            return Ok(());
        }
        let (parent_id, split, pieces) = claim_parent(&mut self.free_parents, req, &self.geo)?;
        self.parents[parent_id as usize] = Some(Parent {
            split,
            next_piece: 0,
            pieces,
        });
        self.waiting.push_back(parent_id);
        self.in_flight += 1;
        self.dispatch();
        Ok(())
    }

    fn ring_doorbell(&mut self) -> DeviceResult<()> {
        self.dispatch();
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Completion>, min_complete: usize) -> DeviceResult<usize> {
        let want = min_complete.min(self.in_flight);
        let mut got = hand_over(self.ready.drain(..), out, &mut self.in_flight);
        let started = Instant::now();
        loop {
            // Before reaping: a completion the reap misses then still moves the count past `seen`.
            let seen = self.chan.completions();
            self.dispatch();
            got += self.reap(out);
            if got >= want || self.in_flight == self.ready.len() {
                return Ok(got);
            }
            if !self.chan.wait_completion(seen, WAIT_SLICE) {
                if !self.proxy_alive() {
                    got += self.go_offline("the redirect proxy process exited".into(), out);
                    return Ok(got);
                }
                if started.elapsed() > COMMAND_TIMEOUT {
                    // SAFETY: killing our own child.
                    unsafe { libc::kill(self.pid, libc::SIGKILL) };
                    got += self.go_offline(
                        format!("the redirect proxy did not answer within {COMMAND_TIMEOUT:?}"),
                        out,
                    );
                    return Ok(got);
                }
            }
        }
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }
}

impl Drop for RedirectDevice {
    fn drop(&mut self) {
        self.chan.shutdown();
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut status = 0;
        loop {
            // SAFETY: reaping our own child.
            let rc = unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) };
            if rc != 0 {
                return;
            }
            if Instant::now() > deadline {
                // SAFETY: killing and reaping our own child that did not stop in time.
                unsafe {
                    libc::kill(self.pid, libc::SIGKILL);
                    libc::waitpid(self.pid, &mut status, 0);
                }
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Opens `redirect:PATH[?size=&link=none|aurora&call_us=&copy_gbps=&bs=&qd=&max_transfer=]`.
pub fn open(spec: &Spec) -> Result<RedirectDevice, OpenError> {
    let allowed: Vec<&str> = COMMON_OPTIONS
        .iter()
        .copied()
        .chain(FILE_OPTIONS.iter().copied().filter(|o| *o != "direct"))
        .chain(REDIRECT_OPTIONS.iter().copied())
        .collect();
    spec.check_options(&allowed)?;
    let opts = QueueOptions::from_spec(spec)?;
    let mut model = match spec.option("link") {
        None | Some("none") => None,
        Some("aurora") => Some(LinkModel {
            call_us: AURORA_CALL_US,
            copy_gbps: AURORA_COPY_GBPS,
        }),
        Some(other) => {
            return Err(OpenError::Invalid(format!(
                "{spec}: link `{other}` is not known (use none or aurora)"
            )))
        }
    };
    let call_us = spec.num_option::<f64>("call_us")?;
    let copy_gbps = spec.num_option::<f64>("copy_gbps")?;
    if call_us.is_some() || copy_gbps.is_some() {
        let base = model.unwrap_or(LinkModel {
            call_us: 0.0,
            copy_gbps: 0.0,
        });
        model = Some(LinkModel {
            call_us: call_us.unwrap_or(base.call_us),
            copy_gbps: copy_gbps.unwrap_or(base.copy_gbps),
        });
    }
    if let Some(m) = model {
        if !(m.call_us >= 0.0 && m.call_us < 1e7 && m.copy_gbps >= 0.0 && m.copy_gbps.is_finite()) {
            return Err(OpenError::Invalid(format!(
                "{spec}: call_us and copy_gbps must be non-negative numbers"
            )));
        }
    }
    let backing = BackingFile::open_spec(spec, DirectMode::Off)?;
    RedirectDevice::new(backing, opts, model)
}
