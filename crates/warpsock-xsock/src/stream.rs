//! The sockets protocol over RDMAP Sends, sans-IO: credits, the receive
//! queue, sinks (direct placement of large reads), the peer's one-sided
//! mappings and the end of the stream.
//!
//! A [`Stream`] keeps the books of one DDP-mode socket; it never touches
//! memory, sockets or clocks. The I/O side feeds it every Send that lands
//! in one of our receive slots ([`Stream::on_message`]), posts again the
//! slots it frees ([`Stream::post_reposts`]), sends what it asks for
//! ([`Stream::poll_msg`], [`Stream::tx_data`]) and copies stream bytes out
//! of the slots it names ([`Stream::segments`], [`Stream::consume`]).
//!
//! # Credits (SDP's rule)
//!
//! Each side posts `slots` receive buffers of `slot_size` bytes for the
//! other (announced in the [`Hello`]) and every message is one Send into
//! one of them, so a credit is one slot. The receiver frees a slot when the
//! application has read its bytes (DATA) or at once (every other kind) and,
//! once it has posted them again ([`Stream::post_reposts`]), returns freed
//! slots in the header of its next message, or in a CREDIT
//! message when the sender may be short of them or a quarter of the slots
//! are free (so that one lost return cannot stop the stream: see
//! `Stream::return_every`). A sender needs two
//! credits to send a message; the last credit goes only with a CREDIT,
//! which carries credits back, so the two sides can never both be left
//! without one, and a reader can always return what it read to a peer
//! whose window our own DATA filled. (A slot per send call would let a
//! reader that looks before it reads see only its peer's first few calls:
//! the I/O side moves the bytes of small unread messages out of their
//! slots once half the slots hold them, and frees the slots —
//! `XSocket::merge_unread` — within the window's bound.) A slow reader
//! therefore stops the sender (it
//! blocks, or gets `EAGAIN`), never makes it drop or buffer without bound,
//! and a Send never finds no posted receive (which iWARP answers with a
//! Terminate). (The socket layer keeps a stream-mode send buffer past the
//! credits, bounded in bytes — `Options::sndbuf`, 1 MiB by default — as
//! TCP's socket buffer: a sender stops once it is full. Its bytes go
//! through [`Stream::tx_data`] like any send call's, in order, once
//! credits come back, each call's end kept, so a message-mode reader
//! reads each send as one message.)
//!
//! # Sinks (zero-copy reads)
//!
//! A receiver whose application reads at least a threshold into an empty
//! queue registers the application's buffer and offers it in a SINK message
//! carrying the stream position it would start at. The sender uses a sink
//! only if that position is its own (no stream byte is in flight): then the
//! next bytes go by RDMA Write straight into the reader's buffer, followed
//! by SINK_DONE with the length; otherwise it answers SINK_DONE with length
//! 0 at once. Every SINK gets exactly one SINK_DONE, and a DATA message or
//! EOF that arrives while a sink is offered proves it was declined (the
//! sender sends bytes past the sink's position only after finishing it),
//! so the reader never waits for the decline itself. A reader that gives
//! up (timeout, signal) sends SINK_CANCEL and waits for the SINK_DONE: no
//! Write can reach its buffer after that. (The I/O side bounds that wait,
//! the socket layer's `sink_cancel_timeout` option: a peer that never answers fails the
//! connection, and the buffer's registration is dropped first.)
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, VecDeque};

use crate::wire::{Body, Hello, IoMapAd, Msg, SinkAd};

mod credit;
mod ending;
mod error;
mod maps;
mod sinks;
mod straight;
mod take;
pub use error::{MapError, StreamError};
pub use take::Taken;

/// Most mappings the peer may have announced at once (`riomap`s of its
/// application not unmapped): each is kept until unmapped, so a peer that
/// announces without end would grow our memory without bound; past this
/// the connection fails ([`StreamError::TooMany`]).
pub const PEER_MAPS_MAX: usize = 4096;

/// Most of the peer's sinks we hold unfinished, counting the answers
/// (SINK_DONE) still queued for them. A well-behaved reader offers a sink
/// only once its earlier ones are final to it ([`Stream::post_sink`]),
/// which holds one here, two in passing; a peer that offers sink after
/// sink while keeping our credits short would grow our queue of answers
/// without bound. Past this the connection fails
/// ([`StreamError::TooMany`]).
pub const PEER_SINKS_MAX: usize = 4;

/// Stream bytes waiting in one of our receive slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Seg {
    /// The slot (the receive's number, as given to [`Stream::on_message`]).
    pub slot: u32,
    /// Offset of the first unread byte within the slot.
    pub off: u32,
    /// Unread bytes.
    pub len: u32,
    /// The bytes end one of the peer's send calls (a message).
    pub eom: bool,
}

/// What a sink offered by [`Stream::post_sink`] has become.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SinkState {
    /// Waiting for a credit to be offered.
    Queued,
    /// Offered; the peer may be writing into it.
    Offered,
    /// Withdrawn; waiting for the peer's SINK_DONE.
    Cancelling,
    /// Done: `len` stream bytes were placed into it (`eom`: they end a
    /// send call). The buffer is the application's again.
    Filled {
        /// Bytes placed.
        len: u32,
        /// They end one of the peer's send calls.
        eom: bool,
    },
    /// Done without data (declined, or withdrawn before use). The buffer is
    /// the application's again.
    Declined,
}

impl SinkState {
    /// Whether the peer can no longer write into the buffer.
    pub fn is_final(self) -> bool {
        matches!(self, Self::Filled { .. } | Self::Declined)
    }
}

#[derive(Debug)]
struct MySink {
    ad: SinkAd,
    state: SinkState,
    /// Final by our own reasoning (declined by a DATA or EOF), but its
    /// SINK_DONE is still to come.
    done_pending: bool,
    /// The I/O side is finished with it ([`Stream::release_sink`]).
    released: bool,
}

#[derive(Debug)]
struct PeerSink {
    ad: SinkAd,
    written: u32,
    active: bool,
    /// Offered ahead of the stream (bytes before it were still to come).
    ahead: bool,
}

/// How the next bytes of a send call go out ([`Stream::tx_data`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TxStep {
    /// RDMA-Write the next `len` bytes to `to` in the peer's region `stag`
    /// (a sink), then call [`Stream::tx_wrote`].
    Write {
        /// The sink's STag.
        stag: u32,
        /// Where in it.
        to: u64,
        /// How many bytes.
        len: usize,
    },
    /// Send `msg`'s header followed by the next `len` bytes, in one Send.
    Data {
        /// The header (its credits are already counted as returned).
        msg: Msg,
        /// Payload bytes.
        len: usize,
    },
    /// Send what [`Stream::poll_msg`] gives first.
    Control,
    /// No credit: wait until a message from the peer returns some.
    Blocked,
}

/// The books of one DDP-mode socket. See the [module docs](self).
#[derive(Debug)]
pub struct Stream {
    local: Hello,
    peer: Hello,
    // Transmit side.
    credits: u32,
    tx_seq: u64,
    peer_sinks: VecDeque<PeerSink>,
    out: VecDeque<Body>,
    /// [`Self::EOF_QUEUED`]: our end is shut, the EOF queued after
    /// everything sent. [`Self::TX_WAITING`]: [`Self::tx_data`]'s last
    /// answer was [`TxStep::Blocked`], a send call of ours waits for a
    /// credit (or gave up waiting, and no call went through `tx_data`
    /// since; see `Stream::send_waits`). One byte, so that
    /// [`Self::tx_straight`] declines both with the one test it made for
    /// the EOF alone: a straight send does not clear `TX_WAITING`, and a
    /// call that finds it set goes the general path once, which clears it
    /// (a stale flag held CREDITs' slots back for a message that no
    /// longer waited; review r20-xdead2b #1).
    tx_flags: u8,
    // Receive side.
    rx_seq: u64,
    segs: VecDeque<Seg>,
    /// Peer messages in our slots not yet returned (holding data, or freed
    /// and not yet reported).
    used: u32,
    /// Of `used`, slots freed and posted again, not yet returned: what the
    /// next message returns.
    unreturned: u32,
    /// Of `unreturned`, slots freed from messages other than CREDIT: only
    /// these make a CREDIT of our own due, so two idle sides never trade
    /// CREDITs that only return each other's CREDITs.
    trigger: u32,
    eof: bool,
    /// A message other than CREDIT or SINK_DONE (a SINK, SINK_CANCEL,
    /// IOMAP or IOUNMAP) arrived after the peer's EOF: the peer is alive
    /// and still reading, so it gets its returns after the EOF as before
    /// it (see `Stream::after_eof_return_due`).
    rx_after_eof: bool,
    /// The carrier's TCP connection has the peer's FIN (the I/O layer saw
    /// it, [`Self::set_peer_fin`]): the peer can send nothing more, so no
    /// CREDIT goes to it (see `Stream::credit_due`).
    peer_fin: bool,
    /// Our last credit went on a CREDIT with a message of ours queued
    /// behind our EOF (`credit_due`'s ask, `stream/credit.rs`): not again
    /// until that message has gone. Two half-closed ends, each holding
    /// one credit with such a message queued and neither reading, traded
    /// one-slot CREDITs for ever (review r28-d item 1).
    asked_after_eof: bool,
    sinks: VecDeque<MySink>,
    next_sink: u32,
    peer_maps: BTreeMap<u64, IoMapAd>,
    /// Freed slots not yet posted again: not creditable until they are
    /// ([`Self::post_reposts`]).
    reposts: Vec<u32>,
    /// Of `reposts`, slots of messages other than CREDIT (to join
    /// `trigger` when posted).
    freed_trigger: u32,
    readable_bytes: usize,
    /// The last stream bytes to arrive as DATA did not end one of the
    /// peer's send calls (see [`Self::peer_mid_call`]).
    rx_mid_call: bool,
    /// The stream position up to which a message-mode peek saw part of a
    /// message ([`Self::peeked_part`]): those bytes stay readable until
    /// read ([`Self::msg_part_readable`]).
    rx_peeked: u64,
    /// Sinks the peer declined in a row (see [`Self::sink_due`]).
    declines: u32,
    /// Reads that could have offered a sink since the last offer.
    passed: u32,
}

impl Stream {
    /// [`Stream`]'s `tx_flags`: the EOF is queued.
    const EOF_QUEUED: u8 = 1;
    /// [`Stream`]'s `tx_flags`: a send call waits for a credit.
    const TX_WAITING: u8 = 2;
    /// [`Stream`]'s `tx_flags`: the peer closed its socket
    /// ([`Self::peer_socket_closed`]; a straight send, which needs the
    /// flags clear, takes the general path that answers it).
    const PEER_CLOSED: u8 = 4;
    /// [`Stream`]'s `tx_flags`: our socket closes ([`Self::mark_closing`]).
    const CLOSING: u8 = 8;
    /// [`Stream`]'s `tx_flags`: stream bytes of ours reached the peer after
    /// it closed its socket ([`Self::sent_into_peer_close`]).
    const SENT_INTO_CLOSE: u8 = 16;
    /// [`Stream`]'s `tx_flags`: our socket closed after our end of stream
    /// had left, and the word that says so ([`Body::ClosedLate`]) waits
    /// for [`Self::poll_msg`] ([`Self::mark_closing`]).
    const CLOSED_LATE_DUE: u8 = 32;

    /// Books for a connection where we posted `local.slots` receives and
    /// the peer announced `peer`.
    pub fn new(local: Hello, peer: Hello) -> Self {
        Self {
            local,
            peer,
            credits: u32::from(peer.slots),
            tx_seq: 0,
            peer_sinks: VecDeque::new(),
            out: VecDeque::new(),
            tx_flags: 0,
            rx_seq: 0,
            segs: VecDeque::new(),
            used: 0,
            unreturned: 0,
            trigger: 0,
            eof: false,
            rx_after_eof: false,
            peer_fin: false,
            asked_after_eof: false,
            sinks: VecDeque::new(),
            next_sink: 1,
            peer_maps: BTreeMap::new(),
            reposts: Vec::new(),
            freed_trigger: 0,
            readable_bytes: 0,
            rx_mid_call: false,
            rx_peeked: 0,
            declines: 0,
            passed: 0,
        }
    }

    /// What we announced.
    pub fn local(&self) -> Hello {
        self.local
    }

    /// What the peer announced.
    pub fn peer(&self) -> Hello {
        self.peer
    }

    /// Credits we hold (free slots at the peer).
    pub fn credits(&self) -> u32 {
        self.credits
    }

    /// Stream bytes sent so far.
    pub fn tx_seq(&self) -> u64 {
        self.tx_seq
    }

    /// Stream bytes received so far (read or not).
    pub fn rx_seq(&self) -> u64 {
        self.rx_seq
    }

    // ----------------------------------------------------------------
    // Input.

    /// A Send landed in our receive slot `slot`, carrying `bytes`. DATA
    /// keeps the slot until its bytes are consumed; any other message frees
    /// it at once (see [`Self::post_reposts`]).
    pub fn on_message(&mut self, slot: u32, bytes: &[u8]) -> Result<(), StreamError> {
        let msg = Msg::parse(bytes)?;
        self.admit(&msg)?;
        match msg.body {
            Body::Data { eom } => {
                let len = bytes.len() - crate::wire::HDR_LEN;
                if !self.data_arrived(len, eom)? {
                    self.free(slot);
                    return Ok(());
                }
                self.readable_bytes += len;
                self.segs.push_back(Seg {
                    slot,
                    off: crate::wire::HDR_LEN as u32,
                    len: len as u32,
                    eom,
                });
                return Ok(());
            }
            Body::Credit => {
                self.free_credit(slot);
                return Ok(());
            }
            Body::ClosedLate { received } => {
                self.free_credit(slot);
                return self.on_closed_late(received);
            }
            Body::Sink(ad) => {
                self.rx_after_eof |= self.eof;
                let answers = self
                    .out
                    .iter()
                    .filter(|b| matches!(b, Body::SinkDone { .. }))
                    .count();
                if self.peer_sinks.len() + answers >= PEER_SINKS_MAX {
                    return Err(StreamError::TooMany {
                        what: "sinks",
                        max: PEER_SINKS_MAX,
                    });
                }
                self.peer_sinks.push_back(PeerSink {
                    ad,
                    written: 0,
                    active: false,
                    ahead: false,
                });
                self.settle_peer_sinks();
            }
            Body::SinkDone { id, len, eom } => self.on_sink_done(id, len, eom)?,
            Body::SinkCancel { id } => {
                self.rx_after_eof |= self.eof;
                if let Some(i) = self.peer_sinks.iter().position(|s| s.ad.id == id) {
                    let s = self.peer_sinks.remove(i).expect("index just found");
                    self.out.push_back(Body::SinkDone {
                        id,
                        len: s.written,
                        eom: true,
                    });
                    self.settle_peer_sinks();
                }
                // Otherwise its SINK_DONE is already on the way.
            }
            Body::IoMap(ad) => {
                self.rx_after_eof |= self.eof;
                if self.peer_maps.len() >= PEER_MAPS_MAX && !self.peer_maps.contains_key(&ad.offset)
                {
                    return Err(StreamError::TooMany {
                        what: "mappings",
                        max: PEER_MAPS_MAX,
                    });
                }
                self.peer_maps.insert(ad.offset, ad);
            }
            Body::IoUnmap { offset } => {
                self.rx_after_eof |= self.eof;
                self.peer_maps.remove(&offset);
            }
            Body::Eof | Body::Closed { .. } => {
                if self.eof {
                    return Err(StreamError::DataAfterEof);
                }
                self.eof = true;
                if let Body::Closed { received } = msg.body {
                    self.peer_closed_with(received);
                }
                self.sinks_declined_by_stream(None);
            }
        }
        self.free(slot);
        Ok(())
    }

    /// Stream bytes past a sink's position arrived (DATA ending at `end`),
    /// or the stream ended (`None`), while it was offered: the peer declined
    /// it. (DATA that ends at or before the position of a sink offered
    /// ahead of the stream, [`Self::post_sink_after`], is the bytes before
    /// it.)
    ///
    /// Inlined as its first test: every DATA message comes here (a
    /// predicted take's too), and without sinks there is nothing to look
    /// at (as a call, ~19 instructions a message; issue 12).
    #[inline(always)]
    fn sinks_declined_by_stream(&mut self, end: Option<u64>) {
        if !self.sinks.is_empty() {
            self.sinks_declined(end);
        }
    }

    /// [`Self::sinks_declined_by_stream`] with sinks offered.
    #[inline(never)]
    fn sinks_declined(&mut self, end: Option<u64>) {
        let out = &mut self.out;
        for s in &mut self.sinks {
            if end.is_some_and(|e| e <= s.ad.rx_seq) {
                continue;
            }
            match s.state {
                SinkState::Queued => {
                    out.retain(|b| !matches!(b, Body::Sink(ad) if ad.id == s.ad.id));
                    s.state = SinkState::Declined;
                    self.declines += 1;
                }
                SinkState::Offered => {
                    s.state = SinkState::Declined;
                    s.done_pending = true;
                    self.declines += 1;
                }
                SinkState::Cancelling => {
                    s.state = SinkState::Declined;
                    s.done_pending = true;
                }
                _ => {}
            }
        }
        self.sinks
            .retain(|s| !(s.released && s.state.is_final() && !s.done_pending));
    }

    fn on_sink_done(&mut self, id: u32, len: u32, eom: bool) -> Result<(), StreamError> {
        // SINK_DONEs come in the order the sinks were offered.
        let i = self
            .sinks
            .iter()
            .position(|s| {
                matches!(s.state, SinkState::Offered | SinkState::Cancelling) || s.done_pending
            })
            .ok_or(StreamError::UnknownSink(id))?;
        let s = &mut self.sinks[i];
        if s.ad.id != id {
            return Err(StreamError::UnknownSink(id));
        }
        if s.done_pending {
            // Declined already (we saw stream bytes after it).
            if len != 0 {
                return Err(StreamError::SinkMisuse { id, len });
            }
            s.done_pending = false;
        } else if len == 0 {
            if s.state == SinkState::Offered {
                self.declines += 1;
            }
            s.state = SinkState::Declined;
        } else {
            if len > s.ad.len || self.rx_seq != s.ad.rx_seq || self.eof {
                return Err(StreamError::SinkMisuse { id, len });
            }
            self.rx_seq += u64::from(len);
            s.state = SinkState::Filled { len, eom };
            // The peer was at the sink's position when it took it: a
            // sink it may use again (whether or not its call ended).
            self.rx_mid_call = false;
            self.declines = 0;
        }
        self.sinks
            .retain(|s| !(s.released && s.state.is_final() && !s.done_pending));
        Ok(())
    }

    // ----------------------------------------------------------------
    // Output.

    /// The next message other than stream bytes to send now (sink offers
    /// and completions, mappings, end of stream, credit returns), or
    /// `None`. Call it until `None` after every input and before
    /// [`Self::tx_data`].
    pub fn poll_msg(&mut self) -> Option<Msg> {
        // A queued message needs two credits (`may_send`); our last one
        // still carries a return due, ahead of it.
        if !self.out.is_empty() && self.may_send() {
            let body = self.out.pop_front().expect("not empty");
            self.asked_after_eof = false;
            if let Body::Sink(ad) = body {
                if let Some(s) = self.sinks.iter_mut().find(|s| s.ad.id == ad.id) {
                    s.state = SinkState::Offered;
                }
            }
            return Some(self.stamp(body));
        }
        if self.tx_flags & Self::CLOSED_LATE_DUE != 0 {
            if let Some(m) = self.closed_late() {
                return Some(m);
            }
        }
        if self.credit_due() {
            if self.credits == 1 && !self.out.is_empty() {
                self.asked_after_eof = true;
            }
            return Some(self.stamp(Body::Credit));
        }
        None
    }

    /// Activates or declines the sinks the peer offered, oldest first.
    fn settle_peer_sinks(&mut self) {
        while let Some(h) = self.peer_sinks.front_mut() {
            if h.active {
                return;
            }
            if h.ad.rx_seq == self.tx_seq && self.tx_flags & Self::EOF_QUEUED == 0 {
                h.active = true;
                return;
            }
            if h.ad.rx_seq > self.tx_seq && self.tx_flags & Self::EOF_QUEUED == 0 {
                // Offered ahead of the stream: the bytes before it go as
                // DATA first (`tx_data` stops them at its position).
                h.ahead = true;
                return;
            }
            let id = h.ad.id;
            self.peer_sinks.pop_front();
            self.out.push_back(Body::SinkDone {
                id,
                len: 0,
                eom: false,
            });
        }
    }

    fn finish_peer_sink(&mut self, eom: bool) {
        if let Some(s) = self.peer_sinks.pop_front() {
            self.out.push_back(Body::SinkDone {
                id: s.ad.id,
                len: s.written,
                eom,
            });
        }
        self.settle_peer_sinks();
    }

    /// How to send the next (at most `avail`, > 0) bytes of a send call;
    /// `eom`: they are the call's last bytes.
    pub fn tx_data(&mut self, avail: usize, eom: bool) -> TxStep {
        debug_assert!(avail > 0 && self.tx_flags & Self::EOF_QUEUED == 0);
        self.tx_flags &= !Self::TX_WAITING;
        if !self.out.is_empty() {
            return if self.may_send() {
                TxStep::Control
            } else {
                self.blocked()
            };
        }
        if let Some(s) = self.peer_sinks.front() {
            if s.active {
                let room = (s.ad.len - s.written) as usize;
                return TxStep::Write {
                    stag: s.ad.stag,
                    // The peer's tagged offset: wrapping, as the engine's
                    // own sums over it (a peer's `to` near the top of the
                    // range panicked a debug build here, under the lock).
                    to: s.ad.to.wrapping_add(u64::from(s.written)),
                    len: avail.min(room),
                };
            }
        }
        if !self.may_send() {
            return self.blocked();
        }
        let mut len = avail.min(self.peer.payload());
        // A sink offered ahead: DATA up to its position, not past it.
        let ahead = self
            .peer_sinks
            .front()
            .map(|s| s.ad.rx_seq.saturating_sub(self.tx_seq));
        if let Some(gap) = ahead {
            len = len.min(usize::try_from(gap).unwrap_or(usize::MAX));
        }
        let msg = self.stamp(Body::Data {
            eom: eom && len == avail,
        });
        self.tx_seq += len as u64;
        if ahead.is_some() {
            self.settle_peer_sinks();
        }
        TxStep::Data { msg, len }
    }

    /// `len` bytes were written into the active sink ([`TxStep::Write`]).
    pub fn tx_wrote(&mut self, len: usize) {
        let s = self
            .peer_sinks
            .front_mut()
            .filter(|s| s.active)
            .expect("tx_wrote follows TxStep::Write");
        s.written += len as u32;
        self.tx_seq += len as u64;
        if s.written == s.ad.len {
            self.finish_peer_sink(false);
        }
    }

    /// The send call is over: a sink it wrote into (and that does not want
    /// to be filled) is finished, so the reader gets the bytes now.
    ///
    /// A sink offered ahead that the call did not write into is declined:
    /// the reader holds the bytes before it (all of them, or the call
    /// ended short of its position), and over TCP its read would return
    /// them now rather than wait for our next call.
    #[inline]
    pub fn tx_end_call(&mut self) {
        // No sink offered: every small send call (inline, no call frame).
        if !self.peer_sinks.is_empty() {
            self.end_call_sinks();
        }
    }

    fn end_call_sinks(&mut self) {
        if let Some(s) = self.peer_sinks.front() {
            if s.active && s.written > 0 && !s.ad.waitall {
                self.finish_peer_sink(true);
            } else if s.ahead && s.written == 0 {
                let id = s.ad.id;
                self.peer_sinks.pop_front();
                self.out.push_back(Body::SinkDone {
                    id,
                    len: 0,
                    eom: false,
                });
                self.settle_peer_sinks();
            }
        }
    }

    /// Whether messages wait for credits (or for [`Self::poll_msg`]).
    pub fn has_output(&self) -> bool {
        !self.out.is_empty() || self.tx_flags & Self::CLOSED_LATE_DUE != 0
    }

    /// Whether a send call could move bytes now (a sink to write into, or
    /// a credit for DATA).
    pub fn writable(&self) -> bool {
        self.tx_flags & Self::EOF_QUEUED == 0
            && self.out.is_empty()
            && (self.peer_sinks.front().is_some_and(|s| s.active) || self.may_send())
    }

    // ----------------------------------------------------------------
    // Receive side for the application.

    /// Unread stream bytes in our slots.
    pub fn readable(&self) -> usize {
        self.readable_bytes
    }

    /// Receive slots holding unread stream bytes.
    pub fn unread_slots(&self) -> usize {
        self.segs.len()
    }

    /// Drops the unread stream bytes received past stream offset `at`
    /// (the newest bytes, from the back), freeing the slots they emptied;
    /// returns how many went. For bytes that reset the connection instead
    /// of arriving (TCP's data at an end shut both ways): a read must not
    /// return them.
    pub fn drop_received_after(&mut self, at: u64) -> usize {
        let want = (self.rx_seq.saturating_sub(at) as usize).min(self.readable_bytes);
        let mut left = want;
        while left > 0 {
            let Some(seg) = self.segs.back_mut() else {
                break;
            };
            let take = left.min(seg.len as usize);
            seg.len -= take as u32;
            left -= take;
            self.readable_bytes -= take;
            if seg.len == 0 {
                let slot = seg.slot;
                self.segs.pop_back();
                self.free(slot);
            }
        }
        want - left
    }

    /// Whether [`Self::poll_msg`] would give a CREDIT now, alone (no
    /// queued message may go ahead of it): the I/O layer then asks its
    /// carrier whether the peer's FIN has arrived ([`Self::set_peer_fin`]).
    pub fn credit_next(&self) -> bool {
        !self.peer_fin && (self.out.is_empty() || !self.may_send()) && self.credit_due()
    }

    /// The carrier's TCP connection has received the peer's FIN (Linux's
    /// `POLLRDHUP`, shown while bytes are still queued before it): the
    /// peer's TCP can send nothing more, so credits are of no use to it,
    /// and it may have exited — its kernel answers a segment to the
    /// closed socket with a reset (`tcp_rcv_state_process`: data after
    /// `RCV_SHUTDOWN`), which drops what we had not read yet (issue 12:
    /// a reader that reads only after the writer's `_exit` got 36 KiB of
    /// 96, then `ECONNRESET`). From now on no CREDIT is sent; a return
    /// still rides on our DATA, which the peer cannot read either (it
    /// then fails as TCP's send to a closed peer).
    pub fn set_peer_fin(&mut self) {
        self.peer_fin = true;
    }

    /// Whether [`Self::set_peer_fin`] was called.
    pub fn peer_fin(&self) -> bool {
        self.peer_fin
    }

    /// Whether the peer ended its stream (and, with nothing left to read,
    /// reads return 0).
    pub fn eof(&self) -> bool {
        self.eof
    }

    /// The unread bytes, in order.
    pub fn segments(&self) -> impl Iterator<Item = &Seg> {
        self.segs.iter()
    }

    /// Bytes up to the end of the first message (its `eom`), if that end
    /// has arrived.
    pub fn message_end(&self) -> Option<usize> {
        let mut n = 0;
        for s in &self.segs {
            n += s.len as usize;
            if s.eom {
                return Some(n);
            }
        }
        None
    }

    /// Whether the last stream bytes to arrive as DATA were not the end of
    /// one of the peer's send calls: the rest of that call is on its way
    /// (or waits for credits) as DATA, and a sink offered now would be
    /// declined — the peer uses one only at its own position. (A filled
    /// sink clears it.)
    pub fn peer_mid_call(&self) -> bool {
        self.rx_mid_call
    }
}
