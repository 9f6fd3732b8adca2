//! `mirror(A,B,...)` — RAID-1: every leg holds the whole drive.
//!
//! It owns the legs' health. Reads go to the healthy leg with the fewest commands in flight
//! (round-robin among equals), carrying the caller's buffer; a read that fails is retried on
//! another healthy leg, and fails only when every healthy leg has failed it. Writes, write-zeroes,
//! discards and flushes go to every healthy leg (the first gets the caller's buffer, the others a
//! copy) and succeed when at least one leg that is still healthy succeeded; every leg that failed
//! such a command is then marked **degraded** and gets no more I/O until [`Mirror::rebuild`]
//! replaces it. When no healthy leg succeeded, the caller gets the error and no leg is marked
//! (like md, the last good copy is never thrown away). With no healthy leg at all (only possible
//! when marked by hand with [`Mirror::mark_degraded`]) every command fails with
//! [`DeviceError::Offline`] naming the mirror. A failed flush poisons the drive.
//! [`Mirror::status`] and `describe()` say which legs are degraded and why.

use crate::child_request;
use crate::fanout::{combined_geometry, fanout_methods, scratch, Done, Fanout};
use kura_engine::open::ChildOpener;
use kura_engine::{
    BlockDevice, BlockingIo, Completion, DeviceError, DeviceResult, DriveStats, Geometry, Opcode,
    OpenError, Spec,
};

/// Most legs a mirror may have.
pub const MAX_LEGS: usize = 64;
/// Bytes copied per command by [`Mirror::rebuild`].
const REBUILD_CHUNK: u64 = 1 << 20;

/// Whether a leg is in service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LegHealth {
    Healthy,
    /// Out of service since a write or flush failed on it (or it was marked by hand).
    Degraded {
        reason: String,
    },
}

/// `leg I STATE: REASON` for each leg that is not healthy, in leg order; `state` is how the
/// drive names a degraded leg in its description.
pub(crate) fn unhealthy_legs(health: &[LegHealth], state: &str) -> Vec<String> {
    health
        .iter()
        .enumerate()
        .filter_map(|(i, h)| match h {
            LegHealth::Healthy => None,
            LegHealth::Degraded { reason } => Some(format!("leg {i} {state}: {reason}")),
        })
        .collect()
}

/// One leg as [`Mirror::status`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LegStatus {
    pub index: usize,
    /// The leg device's description.
    pub device: String,
    pub health: LegHealth,
    /// Reads that failed on this leg (and were retried elsewhere when possible).
    pub read_errors: u64,
}

/// Why a rebuild could not run or finish.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MirrorError {
    #[error("mirror has no leg {leg} (it has {legs})")]
    NoSuchLeg { leg: usize, legs: usize },
    #[error("rebuild needs an idle mirror; {in_flight} command(s) are in flight")]
    Busy { in_flight: usize },
    #[error("replacement {device} does not fit: it has {have_blocks} blocks of {have_bs} bytes, the mirror needs {need_blocks} blocks of {need_bs} bytes")]
    DoesNotFit {
        device: String,
        have_blocks: u64,
        have_bs: u32,
        need_blocks: u64,
        need_bs: u32,
    },
    #[error("no healthy leg other than leg {leg} to copy from")]
    NoHealthySource { leg: usize },
    #[error("reading blocks {lba}.. from every healthy leg failed: {source}")]
    SourceRead { lba: u64, source: DeviceError },
    #[error("writing the replacement failed: {0}")]
    Replacement(DeviceError),
}

/// What a finished piece means to its parent.
enum MirrorPiece {
    /// A read carrying the caller's buffer; `tried` has a bit for every leg that served it.
    Read { tried: u64 },
    /// A mutation carrying the caller's buffer; hand it back.
    Whole,
    /// A mutation with a copy of the data, or none.
    Copy,
}

/// RAID-1 over its legs.
pub struct Mirror {
    fan: Fanout<MirrorPiece>,
    health: Vec<LegHealth>,
    read_errors: Vec<u64>,
    geo: Geometry,
    next_read: usize,
}

impl Mirror {
    /// A mirror over `legs` (2 to [`MAX_LEGS`], one block size); its size is the smallest leg's.
    /// The legs are taken to hold the same data already (fresh, or copied by [`Mirror::rebuild`]).
    pub fn new(legs: Vec<Box<dyn BlockDevice>>) -> Result<Self, OpenError> {
        if !(2..=MAX_LEGS).contains(&legs.len()) {
            return Err(OpenError::Invalid(format!(
                "mirror: needs 2 to {MAX_LEGS} legs, got {}",
                legs.len()
            )));
        }
        crate::mapped::check_block_sizes("mirror", &legs)?;
        let geos: Vec<Geometry> = legs.iter().map(|l| l.geometry()).collect();
        let blocks = geos.iter().map(|g| g.num_blocks).min().unwrap_or(0);
        let n = legs.len();
        Ok(Mirror {
            fan: Fanout::new(legs),
            health: vec![LegHealth::Healthy; n],
            read_errors: vec![0; n],
            geo: combined_geometry(&geos, blocks),
            next_read: 0,
        })
    }

    /// Every leg's device, health and read errors.
    pub fn status(&self) -> Vec<LegStatus> {
        self.fan.leg_status(&self.health, &self.read_errors)
    }

    /// True when every leg is healthy.
    pub fn is_clean(&self) -> bool {
        self.health.iter().all(|h| *h == LegHealth::Healthy)
    }

    /// Takes leg `leg` out of service by hand (as before pulling it).
    pub fn mark_degraded(&mut self, leg: usize, reason: &str) -> Result<(), MirrorError> {
        self.check_leg(leg)?;
        self.health[leg] = LegHealth::Degraded {
            reason: reason.to_string(),
        };
        Ok(())
    }

    /// Direct access to one leg's device, for inspection; only while the mirror is idle.
    pub fn leg_mut(&mut self, leg: usize) -> Option<&mut (dyn BlockDevice + 'static)> {
        self.fan.idle_leg_mut(leg)
    }

    fn check_leg(&self, leg: usize) -> Result<(), MirrorError> {
        if leg >= self.health.len() {
            return Err(MirrorError::NoSuchLeg {
                leg,
                legs: self.health.len(),
            });
        }
        Ok(())
    }

    fn healthy(&self, leg: usize) -> bool {
        self.health[leg] == LegHealth::Healthy
    }

    fn no_healthy_leg(&self, op: Opcode) -> DeviceError {
        let legs: Vec<String> = self
            .health
            .iter()
            .enumerate()
            .map(|(i, h)| match h {
                LegHealth::Healthy => format!("leg {i} healthy"),
                LegHealth::Degraded { reason } => format!("leg {i} degraded ({reason})"),
            })
            .collect();
        DeviceError::Offline {
            reason: format!("mirror has no healthy leg for {op}: {}", legs.join("; ")),
        }
    }

    /// The healthy leg not in `tried` with the fewest commands in flight, round-robin among equals.
    fn pick_read_leg(&mut self, tried: u64) -> Option<usize> {
        let n = self.health.len();
        let start = self.next_read % n;
        let best = (0..n)
            .map(|k| (start + k) % n)
            .filter(|&l| self.healthy(l) && tried & (1 << l) == 0)
            .min_by_key(|&l| self.fan.legs[l].load())?;
        self.next_read = best + 1;
        Some(best)
    }

    fn dispatch(&mut self, id: usize) {
        let Some(parent) = self.fan.parent_mut(id) else {
            return;
        };
        let (op, lba, blocks) = (parent.req.op, parent.req.lba, parent.req.blocks);
        if op == Opcode::Read {
            match self.pick_read_leg(0) {
                Some(leg) => {
                    let buf = self.fan.parent_mut(id).and_then(|p| p.req.buf.take());
                    let req = child_request(op, lba, blocks, buf);
                    self.fan
                        .send(id, leg, req, MirrorPiece::Read { tried: 1 << leg });
                }
                None => {
                    let e = self.no_healthy_leg(op);
                    self.fan.complete_parent(id, Err(e));
                }
            }
            return;
        }
        let legs: Vec<usize> = (0..self.health.len())
            .filter(|&l| self.healthy(l))
            .collect();
        let Some((&first, rest)) = legs.split_first() else {
            let e = self.no_healthy_leg(op);
            self.fan.complete_parent(id, Err(e));
            return;
        };
        let bytes = (blocks * u64::from(self.geo.block_size)) as usize;
        for &leg in rest {
            let buf = if op == Opcode::Write {
                self.fan
                    .parent_mut(id)
                    .and_then(|p| p.req.buf.as_ref())
                    .map(|src| {
                        let mut b = scratch(bytes);
                        b.copy_from_slice(&src[..bytes]);
                        b
                    })
            } else {
                None
            };
            let req = child_request(op, lba, blocks, buf);
            self.fan.send(id, leg, req, MirrorPiece::Copy);
        }
        self.fan
            .send_whole(id, first, lba, MirrorPiece::Whole, MirrorPiece::Copy);
    }

    fn on_done(
        fan: &mut Fanout<MirrorPiece>,
        health: &mut [LegHealth],
        read_errors: &mut [u64],
        done: Done<MirrorPiece>,
    ) {
        let Done {
            parent,
            leg,
            meta,
            completion,
        } = done;
        let status = completion.status;
        match meta {
            MirrorPiece::Read { tried } => {
                if status.is_err() {
                    read_errors[leg] += 1;
                    let retry = (0..health.len())
                        .filter(|&l| health[l] == LegHealth::Healthy && tried & (1 << l) == 0)
                        .min_by_key(|&l| fan.legs[l].load());
                    if let (Some(next), Some(p)) = (retry, fan.parent_mut(parent)) {
                        let req =
                            child_request(Opcode::Read, p.req.lba, p.req.blocks, completion.buf);
                        fan.send(
                            parent,
                            next,
                            req,
                            MirrorPiece::Read {
                                tried: tried | (1 << next),
                            },
                        );
                        // This attempt is over; the retry now carries the request.
                        fan.piece_done(parent, leg, Ok(()));
                        return;
                    }
                }
                if let Some(p) = fan.parent_mut(parent) {
                    p.req.buf = completion.buf;
                }
            }
            MirrorPiece::Whole => {
                if let Some(p) = fan.parent_mut(parent) {
                    p.req.buf = completion.buf;
                }
            }
            MirrorPiece::Copy => {}
        }
        if !fan.piece_done(parent, leg, status) {
            return;
        }
        let Some(mut p) = fan.take_parent(parent) else {
            return;
        };
        if p.req.op == Opcode::Read {
            let status = p.first_status();
            fan.complete(p.req, status);
            return;
        }
        let good = p.ok_legs.iter().any(|&l| health[l] == LegHealth::Healthy);
        let status = if good {
            for (l, e) in p.failures.drain(..) {
                if health[l] == LegHealth::Healthy {
                    health[l] = LegHealth::Degraded {
                        reason: e.to_string(),
                    };
                }
            }
            Ok(())
        } else {
            p.first_status()
        };
        fan.complete(p.req, status);
    }

    /// Copies the drive's contents from a healthy leg onto `replacement`, flushes it, and puts it
    /// in service as leg `leg` (healthy), dropping the old leg device. `progress(done, total)` is
    /// called in blocks after every chunk. The mirror must be idle; on failure nothing changes.
    pub fn rebuild(
        &mut self,
        leg: usize,
        mut replacement: Box<dyn BlockDevice>,
        mut progress: impl FnMut(u64, u64),
    ) -> Result<(), MirrorError> {
        self.check_leg(leg)?;
        if self.fan.in_flight() > 0 {
            return Err(MirrorError::Busy {
                in_flight: self.fan.in_flight(),
            });
        }
        let rg = replacement.geometry();
        if rg.block_size != self.geo.block_size || rg.num_blocks < self.geo.num_blocks {
            return Err(MirrorError::DoesNotFit {
                device: replacement.describe(),
                have_blocks: rg.num_blocks,
                have_bs: rg.block_size,
                need_blocks: self.geo.num_blocks,
                need_bs: self.geo.block_size,
            });
        }
        let sources: Vec<usize> = (0..self.health.len())
            .filter(|&l| l != leg && self.healthy(l))
            .collect();
        if sources.is_empty() {
            return Err(MirrorError::NoHealthySource { leg });
        }
        let bs = u64::from(self.geo.block_size);
        let total = self.geo.num_blocks;
        let step = (REBUILD_CHUNK / bs).max(1);
        let mut data = vec![0u8; (step * bs) as usize];
        let mut lba = 0;
        while lba < total {
            let n = step.min(total - lba);
            let chunk = &mut data[..(n * bs) as usize];
            let mut last_err = None;
            let mut ok = false;
            for &src in &sources {
                match self.fan.legs[src].dev.read_blocks(lba, chunk) {
                    Ok(()) => {
                        ok = true;
                        break;
                    }
                    Err(e) => {
                        self.read_errors[src] += 1;
                        last_err = Some(e);
                    }
                }
            }
            if !ok {
                return Err(MirrorError::SourceRead {
                    lba,
                    source: last_err.unwrap_or(DeviceError::Offline {
                        reason: "no source leg".into(),
                    }),
                });
            }
            replacement
                .write_blocks(lba, chunk)
                .map_err(MirrorError::Replacement)?;
            lba += n;
            progress(lba, total);
        }
        replacement.flush_all().map_err(MirrorError::Replacement)?;
        self.fan.legs[leg].dev = replacement;
        self.health[leg] = LegHealth::Healthy;
        self.read_errors[leg] = 0;
        Ok(())
    }
}

/// Resynchronises leg `leg` of `mirror` onto `replacement`; see [`Mirror::rebuild`].
pub fn rebuild(
    mirror: &mut Mirror,
    leg: usize,
    replacement: Box<dyn BlockDevice>,
    progress: impl FnMut(u64, u64),
) -> Result<(), MirrorError> {
    mirror.rebuild(leg, replacement, progress)
}

impl Mirror {
    /// This drive's entry in a stats report: reads failed on a leg, legs degraded.
    fn layer_stats(&self) -> DriveStats {
        let degraded = self
            .health
            .iter()
            .filter(|h| !matches!(h, LegHealth::Healthy))
            .count();
        DriveStats::new("mirror")
            .with("read_errors", self.read_errors.iter().sum())
            .with("degraded_legs", degraded as u64)
    }
}

impl BlockDevice for Mirror {
    fn geometry(&self) -> Geometry {
        self.geo
    }

    fn describe(&self) -> String {
        let legs: Vec<String> = self.fan.legs.iter().map(|l| l.dev.describe()).collect();
        let degraded = unhealthy_legs(&self.health, "degraded");
        if degraded.is_empty() {
            format!("mirror({})", legs.join(","))
        } else {
            format!("mirror({}) [{}]", legs.join(","), degraded.join("; "))
        }
    }

    fanout_methods!(stats = layer_stats);

    fn poll(&mut self, out: &mut Vec<Completion>, min_complete: usize) -> DeviceResult<usize> {
        let Mirror {
            fan,
            health,
            read_errors,
            ..
        } = self;
        fan.poll_with(out, min_complete, |fan, done| {
            Self::on_done(fan, health, read_errors, done)
        })
    }
}

/// Opens `mirror(A,B,...)`.
pub fn open(spec: &Spec, children: ChildOpener<'_>) -> Result<Mirror, OpenError> {
    spec.check_options(&[])?;
    let legs = crate::open_children(spec, children, 2, Some(MAX_LEGS))?;
    Mirror::new(legs).map_err(|e| crate::in_spec(spec, e))
}
