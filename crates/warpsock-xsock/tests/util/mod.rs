//! An in-memory RDMA pair for the stream core: each direction delivers
//! Sends into the receiver's posted slots (in posting order) and RDMA
//! Writes into its registered buffers, in order, after a simulated delay.
//! A Send that finds no posted receive fails the test: in iWARP it would
//! be a Terminate, and the credit rule exists to make it impossible.
#![allow(dead_code, unreachable_pub)]

use std::collections::{HashMap, VecDeque};

use warpsock_xsock::wire::{Hello, Msg, HDR_LEN, MAX_CONTROL_LEN};
use warpsock_xsock::{SinkState, Stream, TxStep};

/// xorshift64*: deterministic, seedable.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// The byte at stream position `i` of a side's stream.
pub fn stream_byte(seed: u64, i: u64) -> u8 {
    let x = (i ^ seed.rotate_left(17)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (x >> 56) as u8
}

#[derive(Debug)]
pub enum Op {
    Send(Vec<u8>),
    Write { stag: u32, to: u64, data: Vec<u8> },
}

/// What one side's application does.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Sizes of its send calls.
    pub sends: Vec<usize>,
    /// Read buffer sizes to draw from.
    pub read_min: usize,
    pub read_max: usize,
    /// Reads at least this large on an empty queue offer a sink (0: never).
    pub zcopy_min: usize,
    /// Percent of sink waits that give up (cancel) after a while.
    pub cancel_percent: u64,
    /// Percent of steps in which the reader does not read at all.
    pub stall_percent: u64,
    /// Message mode: every read returns at most one message.
    pub msg_mode: bool,
    /// Shut the stream after the last send.
    pub shutdown: bool,
    /// Start each send call only once the reader offered a sink (a reader
    /// that posts its read before the data is sent).
    pub wait_sink: bool,
    /// Start send call `i` only once this side received `after[i]` bytes
    /// (a request/answer exchange; calls past the list start at once).
    pub after: Vec<u64>,
    /// Read only once the last send call ended (a one-thread program that
    /// sends, then reads).
    pub read_after_sends: bool,
}

impl Plan {
    pub fn idle() -> Self {
        Self {
            sends: Vec::new(),
            read_min: 1,
            read_max: 1 << 16,
            zcopy_min: 0,
            cancel_percent: 0,
            stall_percent: 0,
            msg_mode: false,
            shutdown: true,
            wait_sink: false,
            after: Vec::new(),
            read_after_sends: false,
        }
    }
}

#[derive(Debug)]
struct PendingSink {
    id: u32,
    stag: u32,
    len: usize,
    age: u32,
    cancelled: bool,
}

pub struct Side {
    pub s: Stream,
    seed: u64,
    slots: Vec<Vec<u8>>,
    posted: VecDeque<u32>,
    mem: HashMap<u32, Vec<u8>>,
    next_stag: u32,
    pub plan: Plan,
    call: usize,
    call_off: usize,
    sent: u64,
    pub received: Vec<u8>,
    /// Lengths of the reads (message mode: one per message).
    pub reads: Vec<(usize, bool)>,
    sink: Option<PendingSink>,
    pub saw_eof: bool,
    pub sink_bytes: u64,
    pub copied_bytes: u64,
    pub msgs_sent: u64,
    /// Slots freed by reads are posted again only when the books want it
    /// ([`Stream::repost_due`]), as the socket does for the messages a
    /// waiting reader takes (`XSocket::repost`): asked at the points the
    /// socket asks — an arrival (its `process`), a read, a message the
    /// books block (`XSocket::repost_if_due`: a send call's data, a queued
    /// control message) —, every freed slot posted when any slot other
    /// than a read's was freed.
    pub lazy_reposts: bool,
    /// Freed slots that reads freed, left unposted (the socket's
    /// `taken_unposted`).
    taken_unposted: usize,
    /// Times freed slots were left unposted.
    pub left_reposts: u64,
}

impl Side {
    pub fn new(local: Hello, peer: Hello, seed: u64, plan: Plan) -> Self {
        let slots: Vec<Vec<u8>> = (0..local.slots)
            .map(|_| vec![0; local.slot_size as usize])
            .collect();
        Self {
            s: Stream::new(local, peer),
            seed,
            posted: (0..u32::from(local.slots)).collect(),
            slots,
            mem: HashMap::new(),
            next_stag: 1,
            plan,
            call: 0,
            call_off: 0,
            sent: 0,
            received: Vec::new(),
            reads: Vec::new(),
            sink: None,
            saw_eof: false,
            sink_bytes: 0,
            copied_bytes: 0,
            msgs_sent: 0,
            lazy_reposts: false,
            taken_unposted: 0,
            left_reposts: 0,
        }
    }

    fn deliver(&mut self, op: Op) {
        match op {
            Op::Send(bytes) => {
                let slot = self
                    .posted
                    .pop_front()
                    .expect("a Send found no posted receive: credits were violated");
                let buf = &mut self.slots[slot as usize];
                assert!(bytes.len() <= buf.len(), "a Send larger than the slot");
                buf[..bytes.len()].copy_from_slice(&bytes);
                self.s
                    .on_message(slot, &bytes)
                    .unwrap_or_else(|e| panic!("protocol error: {e}"));
                self.repost();
            }
            Op::Write { stag, to, data } => {
                let m = self
                    .mem
                    .get_mut(&stag)
                    .expect("an RDMA Write to a region that is not registered");
                let to = to as usize;
                m[to..to + data.len()].copy_from_slice(&data);
            }
        }
    }

    fn send_msg(&mut self, m: Msg, payload: &[u8], out: &mut Vec<Op>) {
        let mut b = vec![0; MAX_CONTROL_LEN];
        let n = m.encode(&mut b);
        b.truncate(n);
        b.extend_from_slice(payload);
        self.msgs_sent += 1;
        out.push(Op::Send(b));
    }

    /// Posts the freed slots unless only reads' slots are left and the
    /// books allow leaving them (`XSocket::repost`).
    fn repost(&mut self) {
        let left = self.s.unposted();
        if left == 0 {
            return;
        }
        if self.lazy_reposts && left == self.taken_unposted && !self.s.repost_due() {
            self.left_reposts += 1;
            return;
        }
        self.repost_now();
    }

    fn repost_now(&mut self) {
        self.taken_unposted = 0;
        let posted = &mut self.posted;
        self.s.post_reposts(|freed| {
            posted.extend(freed);
            Ok(())
        });
    }

    /// `XSocket::repost_if_due`, where the books block a message.
    fn repost_if_due(&mut self) -> bool {
        if self.s.unposted() > 0 && self.s.repost_due() {
            self.repost_now();
            return true;
        }
        false
    }

    fn flush_control(&mut self, out: &mut Vec<Op>) {
        loop {
            // The socket asks `owes_msg` first (`XSocket::flush`): it must
            // never say no while a message is due.
            let owes = self.s.owes_msg();
            let Some(m) = self.s.poll_msg() else {
                if self.s.has_output() && self.repost_if_due() {
                    continue;
                }
                break;
            };
            assert!(owes, "poll_msg gave {m:?} after owes_msg said none");
            self.send_msg(m, &[], out);
        }
    }

    /// One round of application work; returns the operations it put on the
    /// wire.
    pub fn run(&mut self, rng: &mut Rng) -> Vec<Op> {
        let mut out = Vec::new();
        self.flush_control(&mut out);
        self.write(&mut out);
        let before = self.s.unposted();
        self.read(rng);
        let freed = self.s.unposted() - before;
        if freed > 0 {
            // A read point: only where a read freed slots (a reader that
            // found nothing waits, and decides at the arrivals).
            self.taken_unposted += freed;
            self.repost();
        }
        self.flush_control(&mut out);
        out
    }

    fn write(&mut self, out: &mut Vec<Op>) {
        while self.call < self.plan.sends.len() {
            let size = self.plan.sends[self.call];
            if self.plan.wait_sink && self.call_off == 0 && !self.s.sink_ready() {
                return;
            }
            let after = self.plan.after.get(self.call).copied().unwrap_or(0);
            if self.call_off == 0 && (self.received.len() as u64) < after {
                return;
            }
            // The socket's straight path first (`XSocket::send_straight`):
            // a call of one message with nothing else to do, stamped by
            // one look; anything else takes the general loop below.
            if self.call_off == 0 && size > 0 {
                if let Some(msg) = self.s.tx_straight(size) {
                    let payload: Vec<u8> = (0..size as u64)
                        .map(|i| stream_byte(self.seed, self.sent + i))
                        .collect();
                    self.send_msg(msg, &payload, out);
                    self.sent += size as u64;
                    self.call_off = size;
                    // Its promise: the call's end and flush have nothing
                    // to do (the socket skips them).
                    assert!(!self.s.owes_msg(), "a straight send left a message owed");
                }
            }
            while self.call_off < size {
                let avail = size - self.call_off;
                match self.s.tx_data(avail, true) {
                    TxStep::Write { stag, to, len } => {
                        let data = (0..len as u64)
                            .map(|i| stream_byte(self.seed, self.sent + i))
                            .collect();
                        out.push(Op::Write { stag, to, data });
                        self.s.tx_wrote(len);
                        self.sent += len as u64;
                        self.call_off += len;
                    }
                    TxStep::Data { msg, len } => {
                        let payload: Vec<u8> = (0..len as u64)
                            .map(|i| stream_byte(self.seed, self.sent + i))
                            .collect();
                        self.send_msg(msg, &payload, out);
                        self.sent += len as u64;
                        self.call_off += len;
                    }
                    TxStep::Control => self.flush_control(out),
                    TxStep::Blocked if self.repost_if_due() => {}
                    TxStep::Blocked => return,
                }
            }
            self.s.tx_end_call();
            self.flush_control(out);
            self.call += 1;
            self.call_off = 0;
        }
        if self.plan.shutdown && !self.s.is_write_shut() {
            self.s.shutdown_write();
            self.flush_control(out);
        }
    }

    fn take_from_slots(&mut self, n: usize) {
        let mut left = n;
        let mut pieces = Vec::new();
        for seg in self.s.segments() {
            if left == 0 {
                break;
            }
            let k = left.min(seg.len as usize);
            pieces.push((seg.slot, seg.off as usize, k));
            left -= k;
        }
        for (slot, off, k) in pieces {
            self.received
                .extend_from_slice(&self.slots[slot as usize][off..off + k]);
        }
        self.copied_bytes += n as u64;
        self.s.consume(n);
    }

    fn read(&mut self, rng: &mut Rng) {
        if let Some(mut p) = self.sink.take() {
            match self.s.sink_state(p.id) {
                SinkState::Filled { len, .. } => {
                    let m = self.mem.remove(&p.stag).expect("sink memory");
                    self.received.extend_from_slice(&m[..len as usize]);
                    self.reads.push((len as usize, false));
                    self.sink_bytes += u64::from(len);
                    self.s.release_sink(p.id);
                }
                SinkState::Declined => {
                    self.mem.remove(&p.stag);
                    self.s.release_sink(p.id);
                }
                _ => {
                    p.age += 1;
                    if !p.cancelled && p.age > 3 && rng.chance(self.plan.cancel_percent) {
                        self.s.cancel_sink(p.id);
                        p.cancelled = true;
                    }
                    self.sink = Some(p);
                    return;
                }
            }
        }
        if rng.chance(self.plan.stall_percent)
            || (self.plan.read_after_sends && self.call < self.plan.sends.len())
        {
            return;
        }
        let want = rng.range(self.plan.read_min as u64, self.plan.read_max as u64) as usize;
        let avail = self.s.readable();
        if avail == 0 {
            if self.s.eof() {
                self.saw_eof = true;
            } else if self.plan.zcopy_min > 0 && want >= self.plan.zcopy_min && self.s.sink_room() {
                let stag = self.next_stag;
                self.next_stag += 1;
                self.mem.insert(stag, vec![0; want]);
                let id = self.s.post_sink(stag, 0, want as u32, false);
                self.sink = Some(PendingSink {
                    id,
                    stag,
                    len: want,
                    age: 0,
                    cancelled: false,
                });
            }
            return;
        }
        if self.plan.msg_mode {
            let (n, eor) = match self.s.message_end() {
                Some(end) if end <= want => (end, true),
                Some(_) => (want, false),
                // An incomplete message is read only when its rest may
                // need a return from us (`Stream::msg_part_due`), or it
                // fills the buffer: as `XSocket`'s `read_readable`. Peeks
                // are not modelled: the socket also releases a part a peek
                // saw (`Stream::msg_part_readable`), and the model says nothing of
                // peeks.
                None if self.s.msg_part_due() || avail >= want => (avail.min(want), false),
                None => return,
            };
            self.take_from_slots(n);
            self.reads.push((n, eor));
        } else {
            let n = avail.min(want);
            self.take_from_slots(n);
            self.reads.push((n, false));
        }
    }

    pub fn sent(&self) -> u64 {
        self.sent
    }

    pub fn expected(&self, n: u64) -> Vec<u8> {
        (0..n).map(|i| stream_byte(self.seed, i)).collect()
    }

    pub fn done_sending(&self) -> bool {
        self.call == self.plan.sends.len() && (!self.plan.shutdown || !self.s.has_output())
    }
}

/// Two sides joined by in-order links with random delay.
pub struct Pair {
    pub a: Side,
    pub b: Side,
    a_to_b: VecDeque<(u64, Op)>,
    b_to_a: VecDeque<(u64, Op)>,
    pub now: u64,
    rng: Rng,
    max_delay: u64,
}

impl Pair {
    pub fn new(seed: u64, a: (Hello, Plan), b: (Hello, Plan), max_delay: u64) -> Self {
        Self {
            a: Side::new(a.0, b.0, seed ^ 0xA, a.1),
            b: Side::new(b.0, a.0, seed ^ 0xB, b.1),
            a_to_b: VecDeque::new(),
            b_to_a: VecDeque::new(),
            now: 0,
            rng: Rng::new(seed),
            max_delay,
        }
    }

    fn queue(link: &mut VecDeque<(u64, Op)>, ops: Vec<Op>, now: u64, rng: &mut Rng, max: u64) {
        let mut at = link.back().map_or(now, |(t, _)| (*t).max(now));
        for op in ops {
            at += rng.range(0, max);
            link.push_back((at, op));
        }
    }

    /// One time step: both applications work, then due operations land.
    pub fn step(&mut self) {
        let ops = self.a.run(&mut self.rng);
        Self::queue(
            &mut self.a_to_b,
            ops,
            self.now,
            &mut self.rng,
            self.max_delay,
        );
        let ops = self.b.run(&mut self.rng);
        Self::queue(
            &mut self.b_to_a,
            ops,
            self.now,
            &mut self.rng,
            self.max_delay,
        );
        self.now += 1;
        while self.a_to_b.front().is_some_and(|(t, _)| *t <= self.now) {
            let (_, op) = self.a_to_b.pop_front().expect("front");
            self.b.deliver(op);
        }
        while self.b_to_a.front().is_some_and(|(t, _)| *t <= self.now) {
            let (_, op) = self.b_to_a.pop_front().expect("front");
            self.a.deliver(op);
        }
    }

    pub fn in_flight(&self) -> usize {
        self.a_to_b.len() + self.b_to_a.len()
    }

    /// Steps until both streams are fully delivered and read, and both
    /// sides saw the end of stream; panics after `limit` steps (deadlock).
    pub fn run_to_end(&mut self, limit: u64) {
        while !(self.a.saw_eof && self.b.saw_eof && self.in_flight() == 0) {
            assert!(
                self.now < limit,
                "no progress after {limit} steps: a sent {} (credits {}), received {}; b sent {} (credits {}), received {}",
                self.a.sent(),
                self.a.s.credits(),
                self.a.received.len(),
                self.b.sent(),
                self.b.s.credits(),
                self.b.received.len()
            );
            self.step();
        }
    }
}

/// Slots of 256 bytes (small, so messages span many) or 64 KiB.
pub fn hello(slots: u16, slot_size: u32) -> Hello {
    Hello { slots, slot_size }
}

pub const PAYLOAD_SMALL: usize = 256 - HDR_LEN;

/// Posts every freed slot again ([`Stream::post_reposts`]); returns them.
pub fn repost_all(s: &mut Stream) -> Vec<u32> {
    let mut posted = Vec::new();
    assert!(!s.post_reposts(|slots| {
        posted.extend_from_slice(slots);
        Ok(())
    }));
    posted
}

/// `m` as it goes on the wire (header and control body).
pub fn encode(m: Msg) -> Vec<u8> {
    let mut b = vec![0; MAX_CONTROL_LEN];
    let n = m.encode(&mut b);
    b.truncate(n);
    b
}
