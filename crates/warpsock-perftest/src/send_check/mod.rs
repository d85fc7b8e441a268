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

mod run;

pub use run::{client, server, server_on, Params, Report};

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

use warpsock_engine::{
    Access, Context, Listener, Mr, Progress, QpInit, RecvWr, RtrOffer, RtrType, SendOp, SendWr, Wc,
    WcOpcode,
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
