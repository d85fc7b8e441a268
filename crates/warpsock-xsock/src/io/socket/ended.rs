//! The connection's end, as TCP's states after it: the peer's close
//! (CLOSE_WAIT, and the reset a send to a closed peer draws), an end shut
//! both ways (FIN_WAIT with `RCV_SHUTDOWN`: bytes that come reset the
//! connection), and TCP's CLOSE (`getpeername` and `shutdown` answer
//! `ENOTCONN`). The rules are Linux's `tcp_rcv_state_process`,
//! `tcp_reset` and `inet_shutdown`; the differential fuzzer
//! (`warpsock-preload`'s `tests/ddp_diffuzz.rs`) compares them with
//! kernel TCP.

use warpsock_engine::CloseReason;

use super::{State, XSocket};

impl State {
    /// [`XSocket::tcp_closed`], at this look.
    pub(crate) fn tcp_closed(&self) -> bool {
        self.error.is_some() || self.streams_ended()
    }

    /// Both streams ended: this end's end of stream left (TCP's FIN sent:
    /// not one still waiting for a credit, behind buffered bytes, which
    /// TCP's LAST_ACK or FIN_WAIT would be; helper 61's review), and the
    /// peer's end of stream or close came.
    pub(crate) fn streams_ended(&self) -> bool {
        self.s.eof_sent() && (self.s.eof() || self.peer_closed)
    }
}

impl XSocket {
    /// Records that this end is shut both ways (its `SHUT_RDWR`, or its
    /// close), at the stream bytes received so far: TCP's FIN_WAIT with
    /// `RCV_SHUTDOWN`.
    pub(crate) fn shut_both(st: &mut State) {
        if st.shut_both_at.is_none() {
            st.shut_both_at = Some(st.s.rx_seq());
        }
    }

    /// Stream bytes that came after this end was shut both ways reset the
    /// connection, as Linux's `tcp_rcv_state_process` does in FIN_WAIT
    /// with `RCV_SHUTDOWN` (RFC 1122 §4.2.2.13, RFC 2525 §2.17): this end
    /// fails with `ECONNRESET`, the peer gets the reset (`ECONNRESET`, or
    /// `EPIPE` in its CLOSE_WAIT); the bytes are not read, as TCP queues
    /// none of the segment that reset it. Before, they were taken or
    /// discarded and the sender never learnt its bytes went nowhere
    /// (diffuzz `shutrdwr` and a send to a closing end).
    #[cold]
    #[inline(never)]
    pub(super) fn data_after_shutdown(&self, st: &mut State) {
        let Some(at) = st.shut_both_at else {
            return;
        };
        if st.s.rx_seq() > at && st.error.is_none() {
            let came = st.s.rx_seq() - at;
            st.s.drop_received_after(at);
            self.fail(
                st,
                libc::ECONNRESET,
                format!("{came} stream bytes came after this end shut both ways: TCP's reset"),
            );
            crate::io::sndbuf::reset(self.tcp_fd);
        }
    }

    /// Stream bytes of ours reached the peer after it closed its socket
    /// (its EOF says what it had received then:
    /// [`crate::stream::Stream::sent_into_peer_close`]): a send that went
    /// straight, before a round took in the peer's EOF (diffuzz's close
    /// race: an end shut for reading sent into its peer's close, and no
    /// reset ever came — the peer's engine, disconnected, discarded the
    /// bytes). Over TCP they met a closed socket, whose kernel answered
    /// with a reset: `EPIPE` in our CLOSE_WAIT (`tcp_reset`), `ECONNRESET`
    /// once our end was shut too. So here, and the reset goes to the
    /// peer, whose linger then ends as TCP's closed socket would. Reads
    /// end (0) first, as over TCP (the peer's end of stream is in).
    #[cold]
    #[inline(never)]
    pub(super) fn sent_into_peer_close(&self, st: &mut State) {
        let errno = if crate::io::rio::write_shut(st) {
            libc::ECONNRESET
        } else {
            libc::EPIPE
        };
        self.fail(
            st,
            errno,
            "stream bytes we sent reached the peer after its close: TCP's reset".into(),
        );
        crate::io::sndbuf::reset(self.tcp_fd);
    }

    /// The queue pair's close ([`warpsock_engine::Event::Closed`]): the
    /// peer's FIN, or a reset.
    pub(super) fn on_closed(&self, st: &mut State, reason: CloseReason) {
        // A new look where the close changes what a program
        // sees: the end of stream (the peer's process ended
        // with no end-of-stream message: FIN alone) or the
        // credits' gate opening (a send fails at once now).
        // Not otherwise: the close is no event of TCP's after
        // the FIN (review 57; `process`).
        let r = Self::readiness_of(st);
        if !st.peer_closed && (!r.rdhup || !r.writable) {
            st.arrivals += 1;
        }
        st.peer_closed = true;
        let reset = self.qp.socket_error();
        st.fin = reset.is_none() && st.error.is_none();
        if let Some(e) = reset {
            // Linux reports a reset once (ECONNRESET), then EPIPE
            // to later sends: when the engine's send of a credit
            // met it first, the program still sees the reset.
            let errno = match e.raw_os_error() {
                Some(libc::EPIPE) | None => libc::ECONNRESET,
                Some(n) => n,
            };
            // After the peer's end of stream, with this end's
            // still open (TCP's CLOSE_WAIT), Linux's reset is
            // `EPIPE` (`tcp_reset`), and reads end first (review
            // r23-a item 8).
            let errno = match errno {
                libc::ECONNRESET if st.s.eof() && !crate::io::rio::write_shut(st) => libc::EPIPE,
                n => n,
            };
            self.fail(st, errno, format!("connection lost ({reason}): {e}"));
        } else if st.aio.sends_queued() {
            // Bytes our send calls returned for never left
            // (no credit came back before the peer's close):
            // TCP would have sent them, and the closed peer's
            // kernel answered with a reset — `EPIPE` in our
            // CLOSE_WAIT (`tcp_reset`: the peer's FIN is in,
            // ours not sent), else `ECONNRESET`. Before, they
            // were dropped with no error (diffuzz seed 104: a
            // send to a closing end).
            // (Our `SHUT_WR` behind the queued bytes is TCP's FIN_WAIT1
            // already: `rio::write_shut`.)
            let errno = if !crate::io::rio::write_shut(st) {
                libc::EPIPE
            } else {
                libc::ECONNRESET
            };
            self.fail(
                st,
                errno,
                format!("the peer closed ({reason}) before our queued bytes left: TCP's reset"),
            );
        }
    }

    /// Whether TCP's socket would be CLOSED by now, after a round of
    /// progress (so that the peer's end is seen): the connection failed
    /// (a reset, a Terminate, a timeout: `tcp_done`), or both ways ended,
    /// this end's `SHUT_WR` and the peer's end of stream or close (TCP's
    /// FIN_WAIT2 or LAST_ACK, then CLOSE). `getpeername` and `shutdown`
    /// then fail with `ENOTCONN` (Linux's `inet_getname`,
    /// `inet_shutdown`); before, after the peer's close alone (TCP's
    /// CLOSE_WAIT), they still work.
    pub fn tcp_closed(&self) -> bool {
        let mut st = self.lock();
        self.drive_now(&mut st);
        st.tcp_closed()
    }

    // ------------------------------------------------------------------
    // Shutdown and close.

    /// `shutdown`: `read` stops receiving (reads return 0), `write` sends
    /// the end of stream after everything sent so far.
    pub fn shutdown(&self, read: bool, write: bool) {
        let mut st = self.lock();
        if read && !st.shut_rd {
            st.shut_rd = true;
            // Readable (reads return 0) with no completion: a look from
            // now on is newer than every look before
            // ([`Readiness::arrivals`]; the preload's doorbell skips an
            // older look, so one from before, not readable, cannot drain
            // the bell rung for the end of stream).
            st.arrivals += 1;
        }
        if write {
            crate::io::rio::shut_write(self, &mut st);
            self.flush(&mut st);
        }
        // Shut both ways once both were asked, our end of stream still
        // behind queued asynchronous sends or not (`rio::write_shut`):
        // TCP's `SHUT_RDWR` with bytes unsent is FIN_WAIT1 with
        // `RCV_SHUTDOWN` at once, its FIN queued behind them (helper 61's
        // review: the point went unset, and bytes that came drew no reset).
        if st.shut_rd && crate::io::rio::write_shut(&st) && st.shut_both_at.is_none() {
            // What arrived before the call was received before it: taken
            // in first, not counted as after.
            self.drive_now(&mut st);
            Self::shut_both(&mut st);
        }
        self.wake(&st);
    }
}
