//! `send-check`: RDMAP Sends at volume with every byte verified at the
//! receiving end, in either direction, against `scripts/siw/send_check.c`
//! running on Linux siw (or against itself).
//!
//! perftest's `ib_send_bw` never looks at what it receives; this protocol
//! exists so that Send data crossing warpsock ↔ siw is checked end to end.
//!
//! # Protocol "SCK1" (integers big-endian)
//!
//! 1. **MPA Request private data** (client → server, [`REQ_LEN`] bytes):
//!    `"SCK1" | u64 N | u32 S` — N messages of S bytes. The server rejects
//!    any other N/S than its own (MPA Reply with the Reject bit).
//! 2. The server posts W receives of S bytes **before** it sends the MPA
//!    Reply (iWARP has no receiver-not-ready retry: a Send finding no
//!    buffer is a DDP Terminate, RFC 5041 §7.2 "no buffer available",
//!    siw 1/2/02), then replies with private data ([`REP_LEN`] bytes):
//!    `"SCK1" | u32 W | u32 K` (window, credit interval).
//! 3. The client Sends message i = 0..N−1, S bytes of [`fill`]`(i)`. It may
//!    send message i only while i < *posted*; posted starts at W and is
//!    raised by credits.
//! 4. The server checks each message in arrival order — untagged DDP
//!    messages complete in MSN order (RFC 5041 §5.3, RFC 5040 §5.3) — for
//!    length S and every byte against the pattern of its index, folds it
//!    into the [`Fnv`] checksum, re-posts the buffer, and at most once per
//!    K messages (while fewer than N arrived) Sends a [`Msg::Credit`]:
//!    `"SCKC" | u32 0 | u64 posted` (cumulative: count + W). Credits are
//!    cumulative, so one owed while the server's credit buffers are all in
//!    flight is merged into the next.
//! 5. After message N the server Sends [`Msg::Done`]:
//!    `"SCKD" | u32 bad messages | u64 messages | u64 bytes | u64 checksum`;
//!    the client compares it with what it sent and disconnects.
//!
//! The client posts W/K + 2 receives before its first Send: a credit for
//! count c is only sent once c messages arrived, and the client never
//! exceeds the last posted value it has seen, so at most W/K credits plus
//! the result are ever unconsumed ([`client_recvs`]).
//!
//! # Read RTR
//!
//! With [`Params::prefer_read_rtr`] the server is a peer-to-peer responder
//! that picks the zero-length RDMA Read as ready-to-receive (RFC 6581)
//! when the initiator offers both (siw with `peer_to_peer=1` does), through
//! the engine's `QpOptions::prefer_read_rtr`; it refuses an initiator that
//! did not offer both.
//!
//! # Pattern and checksum
//!
//! Word k (8 bytes, little-endian) of message i is
//! `(i + 1) · 0x9e3779b97f4a7c15 ⊕ k · 0xff51afd7ed558ccd` (mod 2^64),
//! truncated at the message end ([`pattern_word`]): a dropped, duplicated,
//! reordered or shifted message fails. The checksum is FNV-1a 64 with one
//! step per 8-byte little-endian word (a message's last partial word
//! zero-padded), over all messages in order.

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

use warpsock_engine::{
    connect, Access, Context, Listener, Mr, Progress, QpInit, RecvWr, RtrOffer, RtrType, SendOp,
    SendWr, Wc, WcOpcode,
};

use crate::chan::Chan;
use crate::Error;

/// Length of the client's MPA Request private data.
pub const REQ_LEN: usize = 16;
/// Length of the server's MPA Reply private data.
pub const REP_LEN: usize = 12;
/// Length of a credit message.
pub const CREDIT_LEN: usize = 16;
/// Length of the result message.
pub const DONE_LEN: usize = 32;
/// Receive buffer size for the server's messages.
const CTL_BUF: usize = 64;
/// Protocol magic in the private data.
const MAGIC: &[u8; 4] = b"SCK1";
/// `wr_id` bit of control messages (credits, result).
const WR_CTL: u64 = 1 << 62;
/// `wr_id` of the result message.
const WR_DONE: u64 = WR_CTL | 1 << 40;
/// Waiting this long for a credit without any completion: kick (siw's
/// accept race, protocol-notes §7.1).
const KICK_AFTER: Duration = Duration::from_secs(1);
const MAX_KICKS: u32 = 3;

/// Word `k` of message `msg`'s pattern.
pub fn pattern_word(msg: u64, k: u64) -> u64 {
    (msg.wrapping_add(1)).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ k.wrapping_mul(0xff51_afd7_ed55_8ccd)
}

/// Fills `buf` with message `msg`'s pattern.
pub fn fill(buf: &mut [u8], msg: u64) {
    for (k, w) in buf.chunks_mut(8).enumerate() {
        let v = pattern_word(msg, k as u64).to_le_bytes();
        w.copy_from_slice(&v[..w.len()]);
    }
}

/// FNV-1a 64 over 8-byte little-endian words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fnv(pub u64);

impl Default for Fnv {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn step(&mut self, w: u64) {
        self.0 = (self.0 ^ w).wrapping_mul(0x0000_0100_0000_01b3);
    }
}

fn le_word(w: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b[..w.len()].copy_from_slice(w);
    u64::from_le_bytes(b)
}

/// Checks `buf` against message `msg`'s pattern and folds it into `h`;
/// the first differing byte, if any.
pub fn check(buf: &[u8], msg: u64, h: &mut Fnv) -> Option<usize> {
    let mut bad = None;
    for (k, w) in buf.chunks(8).enumerate() {
        let got = le_word(w);
        h.step(got);
        if bad.is_none() {
            let want = pattern_word(msg, k as u64).to_le_bytes();
            if w != &want[..w.len()] {
                let i = w.iter().zip(want.iter()).position(|(a, b)| a != b);
                bad = Some(k * 8 + i.unwrap_or(0));
            }
        }
    }
    bad
}

/// The client's MPA Request private data.
pub fn encode_request(n: u64, s: u32) -> [u8; REQ_LEN] {
    let mut b = [0u8; REQ_LEN];
    b[..4].copy_from_slice(MAGIC);
    b[4..12].copy_from_slice(&n.to_be_bytes());
    b[12..].copy_from_slice(&s.to_be_bytes());
    b
}

/// `(N, S)` from a client's private data.
pub fn decode_request(b: &[u8]) -> Option<(u64, u32)> {
    if b.len() < REQ_LEN || &b[..4] != MAGIC {
        return None;
    }
    Some((be64(&b[4..12]), be32(&b[12..16])))
}

/// The server's MPA Reply private data.
pub fn encode_reply(w: u32, k: u32) -> [u8; REP_LEN] {
    let mut b = [0u8; REP_LEN];
    b[..4].copy_from_slice(MAGIC);
    b[4..8].copy_from_slice(&w.to_be_bytes());
    b[8..].copy_from_slice(&k.to_be_bytes());
    b
}

/// `(W, K)` from a server's private data (both non-zero, K ≤ W).
pub fn decode_reply(b: &[u8]) -> Option<(u32, u32)> {
    if b.len() < REP_LEN || &b[..4] != MAGIC {
        return None;
    }
    let (w, k) = (be32(&b[4..8]), be32(&b[8..12]));
    (w > 0 && k > 0 && k <= w).then_some((w, k))
}

/// Receives the client keeps posted for window `w`, credit interval `k`.
pub fn client_recvs(w: u32, k: u32) -> u32 {
    w / k + 2
}

/// The server's credit interval for window `w`.
pub fn credit_interval(w: u32) -> u32 {
    (w / 4).max(1)
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().expect("4 bytes"))
}

fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().expect("8 bytes"))
}

/// A message from the server to the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Msg {
    /// Cumulative receives posted.
    Credit(u64),
    /// The server's verdict.
    Done(Summary),
}

/// What the receiving end saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Summary {
    /// Messages that failed the length or pattern check.
    pub bad: u64,
    /// Messages received.
    pub messages: u64,
    /// Bytes received.
    pub bytes: u64,
    /// FNV-1a 64 of the received bytes.
    pub checksum: u64,
}

impl Msg {
    /// Wire form.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Self::Credit(p) => {
                let mut b = b"SCKC\0\0\0\0".to_vec();
                b.extend_from_slice(&p.to_be_bytes());
                b
            }
            Self::Done(s) => {
                let mut b = b"SCKD".to_vec();
                b.extend_from_slice(&(s.bad.min(u64::from(u32::MAX)) as u32).to_be_bytes());
                b.extend_from_slice(&s.messages.to_be_bytes());
                b.extend_from_slice(&s.bytes.to_be_bytes());
                b.extend_from_slice(&s.checksum.to_be_bytes());
                b
            }
        }
    }

    /// Parses a received message (exact lengths).
    pub fn decode(b: &[u8]) -> Option<Self> {
        match (b.len(), b.get(..4)) {
            (CREDIT_LEN, Some(b"SCKC")) => Some(Self::Credit(be64(&b[8..16]))),
            (DONE_LEN, Some(b"SCKD")) => Some(Self::Done(Summary {
                bad: u64::from(be32(&b[4..8])),
                messages: be64(&b[8..16]),
                bytes: be64(&b[16..24]),
                checksum: be64(&b[24..32]),
            })),
            _ => None,
        }
    }
}

/// The receiving end's bookkeeping ([`server`]): verification in arrival
/// order, the checksum, and when a credit is due.
#[derive(Debug, Clone)]
pub struct Receiver {
    n: u64,
    s: u32,
    w: u32,
    k: u32,
    sum: Summary,
    h: Fnv,
    first_bad: Option<(u64, Option<usize>)>,
    credited: u64,
}

impl Receiver {
    /// For N messages of S bytes with a window of W receives.
    pub fn new(n: u64, s: u32, w: u32) -> Self {
        Self {
            n,
            s,
            w,
            k: credit_interval(w),
            sum: Summary::default(),
            h: Fnv::default(),
            first_bad: None,
            credited: 0,
        }
    }

    /// The credit interval K.
    pub fn k(&self) -> u32 {
        self.k
    }

    /// The next message arrived with `byte_len` bytes; `data` is its
    /// buffer (at least `byte_len` bytes when that is S).
    pub fn take(&mut self, data: &[u8], byte_len: u32) {
        let i = self.sum.messages;
        let bad = if byte_len == self.s {
            check(&data[..self.s as usize], i, &mut self.h).map(Some)
        } else {
            Some(None)
        };
        if let Some(b) = bad {
            self.sum.bad += 1;
            self.first_bad.get_or_insert((i, b));
        }
        self.sum.messages += 1;
        self.sum.bytes += u64::from(byte_len);
    }

    /// The credit to send now, if one is due (at most one per K messages,
    /// none once all N arrived); call [`Self::credit_sent`] after sending.
    pub fn credit_due(&self) -> Option<Msg> {
        (self.sum.messages - self.credited >= u64::from(self.k) && self.sum.messages < self.n)
            .then(|| Msg::Credit(self.sum.messages + u64::from(self.w)))
    }

    /// The credit from [`Self::credit_due`] went out.
    pub fn credit_sent(&mut self) {
        self.credited = self.sum.messages;
    }

    /// All N messages arrived.
    pub fn done(&self) -> bool {
        self.sum.messages >= self.n
    }

    /// Counts and checksum so far.
    pub fn summary(&self) -> Summary {
        Summary {
            checksum: self.h.0,
            ..self.sum
        }
    }

    /// The first bad message and byte (`None` byte: wrong length).
    pub fn first_bad(&self) -> Option<(u64, Option<usize>)> {
        self.first_bad
    }
}

/// Client or server parameters.
#[derive(Debug, Clone)]
pub struct Params {
    /// Server address (client) or listen address (server).
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// Messages.
    pub n: u64,
    /// Bytes per message.
    pub s: u32,
    /// Server: receives kept posted.
    pub window: u32,
    /// Client: outstanding Sends (and send buffers).
    pub depth: usize,
    /// Ask for MPA CRC.
    pub crc: bool,
    /// Client: peer-to-peer RTR offer (`None`: classic setup).
    pub p2p: Option<RtrOffer>,
    /// Server: choose the Read RTR; the initiator must offer both.
    pub prefer_read_rtr: bool,
    /// Bound on the accept / connect and every wait.
    pub timeout: Duration,
}

/// The outcome at one end.
#[derive(Debug, Clone)]
pub struct Report {
    /// What this end sent (client) or received (server).
    pub local: Summary,
    /// The server's verdict as the client received it.
    pub remote: Option<Summary>,
    /// First bad message and byte offset (`None` offset: wrong length).
    pub first_bad: Option<(u64, Option<usize>)>,
    /// Time from the first message to the last.
    pub elapsed: Duration,
    /// CRC in use.
    pub crc: bool,
    /// The RTR message of peer-to-peer setup, if any.
    pub rtr: Option<RtrType>,
    /// Zero-length Writes sent to unstick siw's accept race.
    pub kicks: u32,
}

impl Report {
    /// Whether everything checked out.
    pub fn ok(&self) -> bool {
        match self.remote {
            None => self.local.bad == 0,
            Some(r) => {
                r == Summary {
                    bad: 0,
                    ..self.local
                }
            }
        }
    }

    fn mb_per_sec(&self) -> f64 {
        self.local.bytes as f64 / self.elapsed.as_secs_f64().max(1e-9) / 1e6
    }

    fn tail(&self) -> String {
        format!(
            "CRC {}; RTR {}; kicks {}; result {}",
            if self.crc { "on" } else { "off" },
            match self.rtr {
                None => "none",
                Some(RtrType::Write) => "write",
                Some(RtrType::Read) => "read",
                Some(RtrType::Send) => "send",
            },
            self.kicks,
            if self.ok() { "ok" } else { "FAIL" }
        )
    }

    /// The server's one-line result (same fields as `send_check.c`).
    pub fn server_line(&self) -> String {
        let l = &self.local;
        format!(
            "send-check server: messages {} bytes {} bad_messages {} first_bad {} checksum {:#018x} seconds {:.3} MBps {:.1}; {}",
            l.messages,
            l.bytes,
            l.bad,
            match self.first_bad {
                None => "-1".into(),
                Some((i, Some(off))) => format!("{i}@{off}"),
                Some((i, None)) => format!("{i}@length"),
            },
            l.checksum,
            self.elapsed.as_secs_f64(),
            self.mb_per_sec(),
            self.tail()
        )
    }

    /// The client's one-line result (same fields as `send_check.c`).
    pub fn client_line(&self) -> String {
        let l = &self.local;
        let r = self.remote.unwrap_or_default();
        format!(
            "send-check client: sent {} messages = {} bytes checksum {:#018x} seconds {:.3} MBps {:.1}; server: messages {} bytes {} bad_messages {} checksum {:#018x}; {}",
            l.messages,
            l.bytes,
            l.checksum,
            self.elapsed.as_secs_f64(),
            self.mb_per_sec(),
            r.messages,
            r.bytes,
            r.bad,
            r.checksum,
            self.tail()
        )
    }
}

fn resolve(host: &str, port: u16) -> Result<SocketAddr, Error> {
    (host, port)
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| Error::Io(std::io::Error::other("address did not resolve")))
}

fn post(ch: &Chan, wr: SendWr, step: &'static str) -> Result<(), Error> {
    ch.qp
        .post_send(wr)
        .map_err(|e| Error::Post { step, source: e })
}

fn post_recv(ch: &Chan, wr: RecvWr, step: &'static str) -> Result<(), Error> {
    ch.qp
        .post_recv(wr)
        .map_err(|e| Error::Post { step, source: e })
}

fn send_wr(wr_id: u64, mr: &Mr, off: usize, len: u32) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::Send {
            solicited: false,
            invalidate: None,
        },
        sgl: mr.sge(off, len).into(),
        signaled: true,
    }
}

/// Runs the sending side: connects, Sends N patterned messages under the
/// server's credits, and returns once the server's verdict arrived.
pub fn client(p: &Params) -> Result<Report, Error> {
    let addr = resolve(&p.host, p.port)?;
    let t = p.timeout;
    let s = p.s as usize;
    let depth = p.depth.max(1);
    let ctx = Context::new(Progress::Caller)?;
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(2 * depth + 512)?;
    let mut init = QpInit::new(&pd, &cq);
    let o = &mut init.options;
    o.crc = p.crc;
    o.peer_to_peer = p.p2p.is_some();
    o.rtr = p.p2p.unwrap_or_default();
    o.private_data = encode_request(p.n, p.s).to_vec();
    o.sq_depth = depth + 8;
    o.rq_depth = 512;
    o.connect_timeout = t;
    o.mpa_timeout = t;
    let data = pd.alloc(s * depth, Access::LOCAL_READ);
    let ctl = pd.alloc(CTL_BUF * 512, Access::LOCAL_WRITE);
    let qp = connect_retrying(addr, &init, t)?;
    let neg = qp.negotiated().ok_or_else(not_negotiated)?;
    let mut ch = Chan::new(qp, cq);
    let (w, k) = decode_reply(&neg.peer_private_data).ok_or_else(|| Error::Protocol {
        step: "MPA Reply",
        what: format!(
            "the server's private data is not SCK1 window/credit interval: {:02x?}",
            neg.peer_private_data
        ),
    })?;
    let nrecv = client_recvs(w, k);
    if nrecv > 512 {
        return Err(Error::Protocol {
            step: "MPA Reply",
            what: format!("window {w} / credit interval {k} need {nrecv} receives (max 512)"),
        });
    }
    // The server sends nothing before our first message: posting now is
    // in time.
    for i in 0..u64::from(nrecv) {
        post_recv(
            &ch,
            RecvWr {
                wr_id: WR_CTL | i,
                sgl: ctl.sge(i as usize * CTL_BUF, CTL_BUF as u32).into(),
            },
            "posting credit receives",
        )?;
    }

    let (mut sent, mut completed, mut posted) = (0u64, 0u64, u64::from(w));
    let mut h = Fnv::default();
    let mut verdict = None;
    let start = Instant::now();
    let mut last_progress = Instant::now();
    while verdict.is_none() || completed < p.n {
        while sent < p.n && sent < posted && sent - completed < depth as u64 {
            let slot = (sent % depth as u64) as usize * s;
            data.with_bytes_mut(|b| {
                let m = &mut b[slot..slot + s];
                fill(m, sent);
                check(m, sent, &mut h);
            });
            post(&ch, send_wr(sent, &data, slot, p.s), "sending")?;
            sent += 1;
        }
        let step = if sent < p.n {
            "sending (waiting for credits or completions)"
        } else {
            "waiting for the server's result"
        };
        let kick = ch.kicks < MAX_KICKS && sent == posted.min(p.n) && completed == sent;
        let limit = if kick { KICK_AFTER } else { t };
        let Some(wc) = ch.wait_for(|_| true, step, limit)? else {
            if kick && last_progress.elapsed() >= KICK_AFTER {
                ch.kick()?;
                continue;
            }
            if last_progress.elapsed() < t {
                continue;
            }
            return Err(Error::Timeout { step, after: t });
        };
        last_progress = Instant::now();
        match wc.opcode {
            WcOpcode::Send => completed += 1,
            WcOpcode::Recv => {
                let off = (wc.wr_id & !WR_CTL) as usize * CTL_BUF;
                let mut b = vec![0u8; wc.byte_len as usize];
                ctl.read(off, &mut b);
                match Msg::decode(&b) {
                    Some(Msg::Credit(c)) => {
                        posted = posted.max(c);
                        post_recv(
                            &ch,
                            RecvWr {
                                wr_id: wc.wr_id,
                                sgl: ctl.sge(off, CTL_BUF as u32).into(),
                            },
                            "re-posting a credit receive",
                        )?;
                    }
                    Some(Msg::Done(sm)) => verdict = Some(sm),
                    None => {
                        return Err(Error::Protocol {
                            step,
                            what: format!("unexpected {}-byte message {b:02x?}", b.len()),
                        })
                    }
                }
            }
            _ => {}
        }
    }
    let elapsed = start.elapsed();
    let rep = Report {
        local: Summary {
            bad: 0,
            messages: sent,
            bytes: sent * u64::from(p.s),
            checksum: h.0,
        },
        remote: verdict,
        first_bad: None,
        elapsed,
        crc: neg.crc,
        rtr: neg.rtr,
        kicks: ch.kicks,
    };
    ch.close();
    Ok(rep)
}

fn not_negotiated() -> Error {
    Error::Protocol {
        step: "connection setup",
        what: "an established queue pair without negotiated parameters".into(),
    }
}

/// Connects, retrying while nothing listens yet (slirp accepts the TCP
/// connection before the guest does; send_check.c restarts between runs).
fn connect_retrying(
    addr: SocketAddr,
    init: &QpInit<'_>,
    t: Duration,
) -> Result<warpsock_engine::Qp, Error> {
    let deadline = Instant::now() + t;
    loop {
        match connect(addr, init) {
            Ok(qp) => return Ok(qp),
            Err(e) if Instant::now() < deadline && e.is_retryable() => {
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => {
                return Err(Error::Cm {
                    step: "connecting",
                    source: e,
                })
            }
        }
    }
}

/// Runs the receiving side: accepts one client on `host:port`, verifies
/// its N messages, and returns the verdict it sent back.
pub fn server(p: &Params) -> Result<Report, Error> {
    let t = p.timeout;
    let s = p.s as usize;
    let w = p.window.max(1);
    let k = credit_interval(w);
    let ring = client_recvs(w, k) as usize;
    let mut listener = Listener::bind(resolve(&p.host, p.port)?)?;
    listener.set_mpa_timeout(t);
    let req = listener.accept(Some(t)).map_err(|e| Error::Cm {
        step: "accepting",
        source: e,
    })?;
    if decode_request(req.private_data()) != Some((p.n, p.s)) {
        let what = format!(
            "the client's private data {:02x?} is not SCK1 N={} S={}; rejected",
            req.private_data(),
            p.n,
            p.s
        );
        let _ = req.reject(b"");
        return Err(Error::Protocol {
            step: "MPA Request",
            what,
        });
    }
    let ctx = Context::new(Progress::Caller)?;
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(w as usize + ring + 16)?;
    let data = pd.alloc(s * w as usize, Access::LOCAL_WRITE);
    let ctl = pd.alloc(CTL_BUF * ring, Access::LOCAL_READ);
    let mut init = QpInit::new(&pd, &cq);
    init.options.crc = p.crc;
    init.options.sq_depth = ring + 4;
    init.options.rq_depth = w as usize + 4;
    init.options.mpa_timeout = t;
    init.options.prefer_read_rtr = p.prefer_read_rtr;
    // Posted before the MPA Reply leaves (QpInit::recvs).
    for i in 0..w as usize {
        init.recvs.push(RecvWr {
            wr_id: i as u64,
            sgl: data.sge(i * s, p.s).into(),
        });
    }
    let qp = req
        .accept(&init, &encode_reply(w, k))
        .map_err(|e| Error::Cm {
            step: "accepting",
            source: e,
        })?;
    let neg = qp.negotiated().ok_or_else(not_negotiated)?;
    if p.prefer_read_rtr && neg.rtr != Some(RtrType::Read) {
        return Err(Error::Protocol {
            step: "MPA Request",
            what: format!(
                "the initiator did not offer both Write and Read RTR (chosen: {:?})",
                neg.rtr
            ),
        });
    }
    let mut ch = Chan::new(qp, cq);

    let mut rx = Receiver::new(p.n, p.s, w);
    let (mut ctl_out, mut ctl_slot) = (0usize, 0usize);
    let mut start = None;
    let step = "receiving";
    while !rx.done() {
        let wc: Wc = ch.wait(|_| true, step, t)?;
        if wc.wr_id & WR_CTL != 0 {
            ctl_out -= 1;
            continue;
        }
        if wc.opcode != WcOpcode::Recv {
            continue;
        }
        start.get_or_insert_with(Instant::now);
        let off = wc.wr_id as usize * s;
        data.with_bytes(|b| rx.take(&b[off..off + s], wc.byte_len));
        if wc.byte_len != p.s {
            eprintln!(
                "send-check server: message {} has {} bytes, expected {}",
                rx.summary().messages - 1,
                wc.byte_len,
                p.s
            );
        }
        post_recv(
            &ch,
            RecvWr {
                wr_id: wc.wr_id,
                sgl: data.sge(off, p.s).into(),
            },
            "re-posting a receive",
        )?;
        if let Some(m) = rx.credit_due().filter(|_| ctl_out < ring) {
            let m = m.encode();
            let o = (ctl_slot % ring) * CTL_BUF;
            ctl.write(o, &m);
            post(
                &ch,
                send_wr(WR_CTL | ctl_slot as u64, &ctl, o, m.len() as u32),
                "sending a credit",
            )?;
            ctl_slot += 1;
            ctl_out += 1;
            rx.credit_sent();
        }
    }
    let elapsed = start.map_or(Duration::ZERO, |s| s.elapsed());
    while ctl_out > 0 {
        ch.wait(|w| w.wr_id & WR_CTL != 0, "sending credits", t)?;
        ctl_out -= 1;
    }
    let sum = rx.summary();
    let m = Msg::Done(sum).encode();
    let o = (ctl_slot % ring) * CTL_BUF;
    ctl.write(o, &m);
    post(
        &ch,
        send_wr(WR_DONE, &ctl, o, m.len() as u32),
        "sending the result",
    )?;
    ch.wait(|w| w.wr_id == WR_DONE, "sending the result", t)?;
    // The client disconnects once it has the result.
    let end = Instant::now() + t.min(Duration::from_secs(10));
    while !ch.qp.is_closed() && Instant::now() < end {
        let _ = ch.wait_for(
            |_| false,
            "waiting for the client to disconnect",
            Duration::from_millis(200),
        );
    }
    let rep = Report {
        local: sum,
        remote: None,
        first_bad: rx.first_bad(),
        elapsed,
        crc: neg.crc,
        rtr: neg.rtr,
        kicks: 0,
    };
    ch.close();
    Ok(rep)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_pinned() {
        // The C side (scripts/siw/send_check.c) computes the same words.
        assert_eq!(pattern_word(0, 0), 0x9e37_79b9_7f4a_7c15);
        assert_eq!(
            pattern_word(0, 1),
            0x9e37_79b9_7f4a_7c15 ^ 0xff51_afd7_ed55_8ccd
        );
        assert_eq!(pattern_word(1, 0), 0x3c6e_f372_fe94_f82a);
        let mut b = [0u8; 11];
        fill(&mut b, 0);
        assert_eq!(&b[..8], &0x9e37_79b9_7f4a_7c15u64.to_le_bytes());
        assert_eq!(
            b[8..],
            (0x9e37_79b9_7f4a_7c15u64 ^ 0xff51_afd7_ed55_8ccd).to_le_bytes()[..3]
        );
    }

    fn msg(i: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0; len];
        fill(&mut b, i);
        b
    }

    #[test]
    fn check_accepts_the_pattern_and_checksums_it() {
        for len in [1, 7, 8, 9, 1000, 65537] {
            let mut h = Fnv::default();
            assert_eq!(check(&msg(5, len), 5, &mut h), None, "len {len}");
            assert_ne!(h, Fnv::default());
        }
        // FNV-1a over one word, by hand.
        let mut h = Fnv::default();
        check(&[1, 0, 0, 0, 0, 0, 0, 0], 0, &mut h);
        assert_eq!(
            h.0,
            (0xcbf2_9ce4_8422_2325u64 ^ 1).wrapping_mul(0x100_0000_01b3)
        );
        // A partial word is zero-padded.
        let (mut a, mut b) = (Fnv::default(), Fnv::default());
        check(&[1, 2, 3], 0, &mut a);
        check(&[1, 2, 3, 0, 0, 0, 0, 0], 0, &mut b);
        assert_eq!(a, b);
    }

    #[test]
    fn check_catches_drop_duplicate_reorder_shift_and_flips() {
        let len = 4099;
        let mut h = Fnv::default();
        // Dropped message 3: message 4 arrives as the 4th.
        assert_eq!(check(&msg(4, len), 3, &mut h), Some(0));
        // Duplicate of message 2 where 3 is due.
        assert!(check(&msg(2, len), 3, &mut h).is_some());
        // Shift by one byte, and by one word.
        let m = msg(7, len + 8);
        assert!(check(&m[1..=len], 7, &mut h).is_some());
        assert!(check(&m[8..8 + len], 7, &mut h).is_some());
        // One flipped bit deep inside, and in a partial last word.
        for pos in [2049, len - 1] {
            let mut m = msg(9, len);
            m[pos] ^= 0x10;
            assert_eq!(check(&m, 9, &mut h), Some(pos));
        }
    }

    #[test]
    fn checksum_depends_on_order() {
        let (mut a, mut b) = (Fnv::default(), Fnv::default());
        check(&msg(0, 64), 0, &mut a);
        check(&msg(1, 64), 1, &mut a);
        check(&msg(1, 64), 1, &mut b);
        check(&msg(0, 64), 0, &mut b);
        assert_ne!(a, b);
    }

    #[test]
    fn receiver_verifies_in_order_and_credits_once_per_k() {
        let (n, s, w) = (20u64, 100u32, 8u32);
        let mut rx = Receiver::new(n, s, w);
        assert_eq!(rx.k(), 2);
        let mut credits = Vec::new();
        for i in 0..n {
            // Message 5 arrives twice (duplicate), so 6 is missing.
            let m = msg(if i == 6 { 5 } else { i }, s as usize);
            rx.take(&m, s);
            if let Some(c) = rx.credit_due() {
                credits.push(c);
                rx.credit_sent();
            }
        }
        assert!(rx.done());
        let sm = rx.summary();
        assert_eq!((sm.messages, sm.bytes, sm.bad), (n, n * u64::from(s), 1));
        assert_eq!(rx.first_bad(), Some((6, Some(0))));
        // Credits at 2, 4, ..., 18 (none at N), cumulative: count + W.
        let want: Vec<_> = (1..10).map(|j| Msg::Credit(2 * j + 8)).collect();
        assert_eq!(credits, want);
        // A short message counts as bad without a byte offset.
        let mut rx = Receiver::new(2, 16, 4);
        rx.take(&msg(0, 16)[..8], 8);
        assert_eq!(rx.first_bad(), Some((0, None)));
        assert_eq!(rx.summary().bytes, 8);
    }

    #[test]
    fn private_data_round_trips() {
        let r = encode_request(256, 1 << 20);
        assert_eq!(&r[..4], b"SCK1");
        assert_eq!(r[4..12], 256u64.to_be_bytes());
        assert_eq!(decode_request(&r), Some((256, 1 << 20)));
        assert_eq!(decode_request(&r[..15]), None);
        assert_eq!(decode_request(b"SCK2\0\0\0\0\0\0\0\x01\0\0\0\x01"), None);
        let p = encode_reply(32, 8);
        assert_eq!(p, *b"SCK1\0\0\0\x20\0\0\0\x08");
        assert_eq!(decode_reply(&p), Some((32, 8)));
        assert_eq!(decode_reply(&encode_reply(4, 8)), None);
        assert_eq!(decode_reply(&encode_reply(0, 0)), None);
    }

    #[test]
    fn messages_round_trip_with_exact_lengths() {
        let c = Msg::Credit(40);
        let e = c.encode();
        assert_eq!(e.len(), CREDIT_LEN);
        assert_eq!(e, b"SCKC\0\0\0\0\0\0\0\0\0\0\0\x28");
        assert_eq!(Msg::decode(&e), Some(c));
        let d = Msg::Done(Summary {
            bad: 1,
            messages: 2,
            bytes: 3,
            checksum: 0xdead_beef_0bad_f00d,
        });
        let e = d.encode();
        assert_eq!(e.len(), DONE_LEN);
        assert_eq!(Msg::decode(&e), Some(d));
        assert_eq!(Msg::decode(&e[..31]), None);
        let mut x = e.clone();
        x.push(0);
        assert_eq!(Msg::decode(&x), None);
        assert_eq!(Msg::decode(b"SCKX\0\0\0\0\0\0\0\0\0\0\0\x28"), None);
    }

    #[test]
    fn client_receives_cover_every_unconsumed_credit() {
        // Worst case: the client sends as far as credits allow and consumes
        // a credit (oldest first) only when blocked; the server credits at
        // most once per K messages while fewer than N arrived, then sends
        // the result. Every message from the server must find a receive.
        for (w, n) in [
            (32u32, 1000u64),
            (1, 10),
            (5, 17),
            (64, 4096),
            (3, 3),
            (32, 256),
        ] {
            let k = u64::from(credit_interval(w));
            let recvs = client_recvs(w, credit_interval(w)) as usize;
            let mut seen_posted = u64::from(w);
            let mut in_flight = std::collections::VecDeque::new();
            let (mut received, mut credited) = (0u64, 0u64);
            while received < n {
                while received < seen_posted.min(n) {
                    received += 1;
                    if received - credited >= k && received < n {
                        credited = received;
                        in_flight.push_back(received + u64::from(w));
                        assert!(
                            in_flight.len() <= recvs,
                            "w {w}: credit overruns the client"
                        );
                    }
                }
                if received == n {
                    break;
                }
                let c = in_flight
                    .pop_front()
                    .expect("blocked without a credit: deadlock");
                seen_posted = seen_posted.max(c);
            }
            assert!(
                in_flight.len() < recvs,
                "w {w}: no receive left for the result"
            );
        }
    }
}
