//! In-memory pair harness: two connections joined by byte pipes that can
//! cut the stream at random points, with simulated time.
#![allow(dead_code, unreachable_pub)]

use std::time::{Duration, Instant};

use warpsock_proto::{
    Access, Config, Connection, Event, PdId, RecvWr, Registry, Role, SendOp, SendWr, Sge, Sgl,
    Stag, WcOpcode, WcStatus, WorkCompletion,
};

pub use warpsock_testkit::Rng;

pub mod rx;

/// How the pipe cuts the stream.
#[derive(Clone)]
pub enum Cut {
    /// Deliver whatever is there at once.
    Whole,
    /// Random chunks of 1..=max bytes.
    Random { rng: Rng, max: usize },
}

pub struct Side {
    pub conn: Connection,
    pub reg: Registry<Vec<u8>>,
    pub pd: PdId,
    pub events: Vec<Event>,
    pub wcs: Vec<WorkCompletion>,
    /// Every byte this side sent, in order.
    pub sent: Vec<u8>,
    inbox: Vec<u8>,
    pub accept_with: Option<Vec<u8>>,
}

impl Side {
    fn new(cfg: Config, reg: Registry<Vec<u8>>, pd: PdId, now: Instant) -> Self {
        Self {
            conn: Connection::new(cfg, now),
            reg,
            pd,
            events: Vec::new(),
            wcs: Vec::new(),
            sent: Vec::new(),
            inbox: Vec::new(),
            accept_with: Some(Vec::new()),
        }
    }

    /// Registers `len` bytes (filled by `fill`) at iova `iova` with `access`.
    pub fn region(&mut self, iova: u64, data: Vec<u8>, access: Access) -> Stag {
        self.reg.register(self.pd, iova, data, access, 0x11)
    }

    pub fn mem(&self, stag: Stag) -> &[u8] {
        self.reg.backing(stag).expect("region")
    }

    pub fn pump(&mut self) {
        self.pump_events();
    }

    fn pump_events(&mut self) {
        while let Some(e) = self.conn.poll_event() {
            if let Event::ConnectRequest(_) = &e {
                if let Some(pd) = self.accept_with.clone() {
                    self.conn.accept(&pd).expect("accept");
                }
            }
            self.events.push(e);
        }
        while let Some(w) = self.conn.poll_completion() {
            self.wcs.push(w);
        }
    }

    pub fn established(&self) -> bool {
        self.events
            .iter()
            .any(|e| matches!(e, Event::Established(_)))
    }
}

pub struct Pair {
    pub a: Side,
    pub b: Side,
    pub now: Instant,
    pub cut: Cut,
    /// Mutates bytes in flight a→b: (offset in the a→b stream, xor mask).
    pub corrupt_a2b: Option<(usize, u8)>,
    a2b_off: usize,
}

impl Pair {
    /// An initiator (`a`) and a responder (`b`), each with its own PD.
    pub fn new(mut ca: impl FnMut(&mut Config), mut cb: impl FnMut(&mut Config), cut: Cut) -> Self {
        let now = Instant::now();
        let mut ra = Registry::new();
        let pa = ra.alloc_pd();
        let mut rb = Registry::new();
        let pb = rb.alloc_pd();
        let mut cfga = Config::new(Role::Initiator, pa);
        ca(&mut cfga);
        let mut cfgb = Config::new(Role::Responder, pb);
        cb(&mut cfgb);
        Self {
            a: Side::new(cfga, ra, pa, now),
            b: Side::new(cfgb, rb, pb, now),
            now,
            cut,
            corrupt_a2b: None,
            a2b_off: 0,
        }
    }

    fn chunk(&mut self, avail: usize) -> usize {
        match &mut self.cut {
            Cut::Whole => avail,
            Cut::Random { rng, max } => (1 + rng.below(*max as u64) as usize).min(avail),
        }
    }

    /// One round: each side transmits, the other receives. Returns whether
    /// anything moved.
    pub fn step(&mut self) -> bool {
        let mut moved = false;
        for dir in 0..2 {
            let (tx, rx) = if dir == 0 {
                (&mut self.a, &mut self.b)
            } else {
                (&mut self.b, &mut self.a)
            };
            tx.pump_events();
            let mut out = Vec::new();
            tx.conn.poll_transmit(&tx.reg, &mut out, 1 << 20);
            tx.pump_events();
            if dir == 0 {
                if let Some((at, mask)) = self.corrupt_a2b {
                    if at >= self.a2b_off && at < self.a2b_off + out.len() {
                        out[at - self.a2b_off] ^= mask;
                    }
                }
                self.a2b_off += out.len();
            }
            tx.sent.extend_from_slice(&out);
            rx.inbox.extend_from_slice(&out);
            moved |= !out.is_empty();
        }
        for dir in 0..2 {
            loop {
                let avail = if dir == 0 {
                    self.b.inbox.len()
                } else {
                    self.a.inbox.len()
                };
                if avail == 0 {
                    break;
                }
                let n = self.chunk(avail);
                let side = if dir == 0 { &mut self.b } else { &mut self.a };
                let chunk: Vec<u8> = side.inbox[..n].to_vec();
                let used = side.conn.handle_input(&chunk, &mut side.reg);
                side.inbox.drain(..used);
                side.pump_events();
                if used > 0 {
                    moved = true;
                }
                if used < n {
                    break;
                }
            }
        }
        self.a.pump_events();
        self.b.pump_events();
        moved
    }

    /// Steps until nothing moves (bounded).
    pub fn run(&mut self) {
        for _ in 0..100_000 {
            if !self.step() {
                return;
            }
        }
        panic!("pair did not settle");
    }

    /// Advances simulated time and fires due timers.
    pub fn advance(&mut self, d: Duration) {
        self.now += d;
        for s in [&mut self.a, &mut self.b] {
            if s.conn.poll_timeout().is_some_and(|t| t <= self.now) {
                s.conn.handle_timeout(self.now);
            }
            s.pump_events();
        }
    }

    /// Runs setup to completion and checks both sides are established.
    pub fn establish(&mut self) {
        self.run();
        assert!(
            self.a.established(),
            "initiator events: {:?}",
            self.a.events
        );
    }
}

/// A receive of `sgl`.
pub fn recv_wr(wr_id: u64, sgl: Sgl) -> RecvWr {
    RecvWr { wr_id, sgl }
}

/// A plain signaled Send (not solicited, no invalidation) of `sgl`.
pub fn send_wr(wr_id: u64, sgl: Sgl) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::Send {
            solicited: false,
            invalidate: None,
        },
        sgl,
        signaled: true,
    }
}

/// One scatter/gather entry.
pub fn sge(addr: u64, length: u32, lkey: u32) -> Sge {
    Sge { addr, length, lkey }
}

impl Pair {
    /// `stream`, the unsignalled Sends `a` built (of `lens` bytes each, in
    /// order), made no completion on `a`, and `b` takes every one whole
    /// into its posted receives, in order, CRC checked when on.
    pub fn unsignalled_sends_arrive(&mut self, stream: &[u8], lens: &[usize], what: &str) {
        self.a.pump();
        assert!(self.a.wcs.is_empty(), "{what}: {:?}", self.a.wcs);
        assert_eq!(
            self.b.conn.handle_input(stream, &mut self.b.reg),
            stream.len(),
            "{what}"
        );
        self.b.pump();
        let got: Vec<u32> = self.b.wcs.iter().map(|w| w.byte_len).collect();
        let want: Vec<u32> = lens.iter().map(|&l| l as u32).collect();
        assert_eq!(got, want, "{what}");
        assert!(
            self.b
                .wcs
                .iter()
                .all(|w| w.status == WcStatus::Success && w.opcode == WcOpcode::Recv),
            "{what}: {:?}",
            self.b.wcs
        );
    }
}

/// Two established pairs of one configuration, for comparing a Send built
/// at once by `x.a` with the same Send posted by `y.a`: each `a` has
/// `data` (4 KiB) registered at 0x1000 (`xs`, `ys`), and `x.b` a 4 KiB
/// region at 0x8000 (`dst`) to receive into.
pub struct Twins {
    pub x: Pair,
    pub y: Pair,
    pub data: Vec<u8>,
    pub xs: Stag,
    pub ys: Stag,
    pub dst: Stag,
}

impl Twins {
    pub fn new(cfg: impl Fn(&mut Config) + Copy) -> Self {
        let mut x = Pair::new(cfg, cfg, Cut::Whole);
        let mut y = Pair::new(cfg, cfg, Cut::Whole);
        x.establish();
        y.establish();
        let data = pattern(4096, 7);
        let xs = x.a.region(0x1000, data.clone(), Access::LOCAL_READ);
        let ys = y.a.region(0x1000, data.clone(), Access::LOCAL_READ);
        let dst = x.b.region(0x8000, vec![0; 4096], Access::LOCAL_WRITE);
        Self {
            x,
            y,
            data,
            xs,
            ys,
            dst,
        }
    }
}

pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}
