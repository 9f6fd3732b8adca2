//! Model check of the redirect channel's protocol (`kura_engine::backend::redirect::channel`):
//! the shipped `submit` / `wake_proxy` / `take_done` / `completions` / `wait_completion` /
//! `shutdown` on the caller's side and `serve` on the proxy's, built on loom's atomics, fences
//! and a futex modeled without timeouts (`RUSTFLAGS="--cfg loom"`, see scripts/loom.sh).
//!
//! loom runs the caller and the proxy under every interleaving (up to `LOOM_MAX_PREEMPTIONS`
//! preemptions) and lets every weakly ordered load return any value the memory model allows. It
//! fails the test on a data race on a slot's data (caller and proxy touching it without the
//! protocol ordering them), on a lost wake-up (both sides asleep: a deadlock, as no sleep times
//! out in the model) and on a wrong result. The caller's loop is `RedirectDevice::poll`'s:
//! read the completion count, reap, and only then wait for the count to move.
#![cfg(loom)]
// The slot data copies are unsafe by contract (the protocol decides who owns a slot); checking that
// contract is this test's point.
#![allow(unsafe_code)]

use kura_engine::backend::redirect::channel::{Channel, Command, OP_READ, OP_WRITE};
use kura_engine::sync::Arc;
use std::time::Duration;

const BLOCK: usize = 8;
const SLICE: Duration = Duration::from_millis(100);

/// The caller's view: which slots are free and what each in-flight slot will read into.
struct Caller {
    chan: Arc<Channel>,
    free: Vec<u32>,
    reads: Vec<Option<[u8; BLOCK]>>,
    busy: usize,
    /// Data returned by finished reads, in completion order.
    got: Vec<[u8; BLOCK]>,
}

impl Caller {
    fn new(chan: Arc<Channel>) -> Caller {
        let slots = chan.slots();
        Caller {
            chan,
            free: (0..slots as u32).rev().collect(),
            reads: vec![None; slots],
            busy: 0,
            got: Vec::new(),
        }
    }

    /// One round of `poll`: count, reap, wait if nothing finished.
    fn reap_or_wait(&mut self) {
        let seen = self.chan.completions();
        let mut reaped = 0;
        for slot in 0..self.chan.slots() {
            if self.free.contains(&(slot as u32)) {
                continue;
            }
            let Some(errno) = self.chan.take_done(slot) else {
                continue;
            };
            assert_eq!(errno, 0);
            if let Some(mut data) = self.reads[slot].take() {
                // SAFETY: the slot is ours again (take_done) and holds BLOCK bytes.
                unsafe { self.chan.copy_out(slot, data.as_mut_ptr(), BLOCK) };
                self.got.push(data);
            }
            self.free.push(slot as u32);
            self.busy -= 1;
            reaped += 1;
        }
        if reaped == 0 {
            self.chan.wait_completion(seen, SLICE);
        }
    }

    fn submit(&mut self, op: u32, block: u64, fill: u8) {
        let slot = loop {
            if let Some(slot) = self.free.pop() {
                break slot;
            }
            self.reap_or_wait();
        };
        if op == OP_WRITE {
            let data = [fill; BLOCK];
            // SAFETY: a free slot is the caller's; BLOCK bytes fit.
            unsafe { self.chan.copy_in(slot as usize, data.as_ptr(), BLOCK) };
        } else {
            self.reads[slot as usize] = Some([0; BLOCK]);
        }
        self.chan.submit(
            slot,
            Command {
                op,
                offset: block,
                len: BLOCK as u64,
            },
        );
        self.chan.wake_proxy();
        self.busy += 1;
    }

    fn drain(&mut self) {
        while self.busy > 0 {
            self.reap_or_wait();
        }
    }
}

/// Runs the proxy on its own thread over a two-block "disk"; returns the commands it served.
fn spawn_proxy(chan: &Arc<Channel>) -> loom::thread::JoinHandle<usize> {
    let chan = Arc::clone(chan);
    loom::thread::spawn(move || {
        let mut disk = [[0u8; BLOCK]; 2];
        let mut served = 0;
        chan.serve(
            SLICE,
            |slot, cmd| {
                served += 1;
                let block = &mut disk[cmd.offset as usize];
                // SAFETY: the proxy owns a slot while serving it; both sides hold BLOCK bytes.
                unsafe {
                    match cmd.op {
                        OP_WRITE => chan.copy_out(slot, block.as_mut_ptr(), BLOCK),
                        OP_READ => chan.copy_in(slot, block.as_ptr(), BLOCK),
                        _ => return 22,
                    }
                }
                0
            },
            || true,
        );
        served
    })
}

/// Three commands through two slots: the third waits for a slot to come back, so slot reuse, the
/// ring's wrap (positions 0..4 over indices 0,1), both sleep paths and shutdown are all explored.
#[test]
fn commands_complete_in_order_with_their_data_and_nothing_sleeps_for_ever() {
    loom::model(|| {
        let chan = Arc::new(Channel::map(2, BLOCK).expect("model channel"));
        let proxy = spawn_proxy(&chan);
        let mut caller = Caller::new(Arc::clone(&chan));
        caller.submit(OP_WRITE, 0, 0xa1);
        caller.submit(OP_WRITE, 1, 0xb2);
        // Served after both writes (the ring is in order), whenever the caller sees them finish.
        caller.submit(OP_READ, 0, 0);
        caller.drain();
        assert_eq!(caller.got, [[0xa1; BLOCK]]);
        chan.shutdown();
        assert_eq!(proxy.join().expect("proxy"), 3);
    });
}

/// The caller waits for one command while the proxy goes to sleep and wakes, twice in a row:
/// the smallest shape of the two sleep/wake handshakes, explored more deeply.
#[test]
fn one_command_at_a_time_never_loses_a_wake_up() {
    loom::model(|| {
        let chan = Arc::new(Channel::map(1, BLOCK).expect("model channel"));
        let proxy = spawn_proxy(&chan);
        let mut caller = Caller::new(Arc::clone(&chan));
        caller.submit(OP_WRITE, 1, 0x5c);
        caller.drain();
        caller.submit(OP_READ, 1, 0);
        caller.drain();
        assert_eq!(caller.got, [[0x5c; BLOCK]]);
        chan.shutdown();
        assert_eq!(proxy.join().expect("proxy"), 2);
    });
}
