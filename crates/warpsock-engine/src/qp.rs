//! Queue pairs ([`Qp`]): posting work, connection state and events,
//! disconnect.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use warpsock_proto::{CloseReason, Event, Negotiated, PostError, QpState, RecvWr, SendWr, Sgl};

use crate::context::{Inner, Progress, Shared, State};
use crate::driver::IoStats;
use crate::error::BatchPostError;

/// A connected queue pair (one TCP connection). Created by
/// [`crate::connect`] or [`crate::ConnectRequest::accept`].
///
/// Dropping it disconnects gracefully (outstanding requests are flushed,
/// FIN is sent) and leaves the socket to linger (see `Drop`).
#[derive(Debug)]
pub struct Qp {
    pub(crate) sh: Arc<Shared>,
    pub(crate) qi: usize,
    pub(crate) local: SocketAddr,
    pub(crate) peer: SocketAddr,
}

/// What a caller driving a queue pair from readiness needs to know after
/// each call — whether the engine holds a send backlog (it must watch the
/// socket for output space) and whether connection events wait — read
/// under the lock the call took anyway. The `*_news` calls
/// ([`Qp::post_send_news`], [`crate::Cq::poll_news`],
/// [`crate::Cq::poll_queued_news`], [`crate::Cq::wait_news`]) return it,
/// so a small-message data path takes the context's lock once per call
/// instead of again for [`Qp::send_backlog`] and [`Qp::poll_event`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QpNews {
    /// [`Qp::send_backlog`] at the end of the call.
    pub backlog: u64,
    /// Whether [`Qp::poll_event`] has an event to return.
    pub events: bool,
    /// Of the news of a round ([`crate::Cq::poll_news_idle`], and the
    /// queued completions after it): the connection's last read since the
    /// round began came back short, found nothing, or read the end of the
    /// stream — the kernel held no more of its bytes at that instant, and
    /// bytes that come later make its socket readable anew (a new edge
    /// for an edge-triggered watch). `false` when no read was made, or
    /// the last filled its buffer (the round stopped at its budget, or
    /// input waits for a receive): ask the kernel (`FIONREAD`) before
    /// taking the socket as drained. Other news (a post's, [`Qp::news`])
    /// carry the flag of whatever round read last, which may be old.
    pub rx_drained: bool,
}

impl State {
    /// Queue pair `qi`'s news (nothing, once its slot is gone).
    pub(crate) fn news(&self, qi: usize) -> QpNews {
        match self.qps.get(qi) {
            Some(Some(q)) => QpNews {
                backlog: q.tx_backlog(),
                events: !q.events.is_empty(),
                rx_drained: q.rx_drained,
            },
            _ => QpNews::default(),
        }
    }
}

impl Qp {
    fn with<R>(&self, f: impl FnOnce(&mut State, &Inner) -> R) -> R {
        let inner = &self.sh.inner;
        let mut st = inner.lock();
        f(&mut st, inner)
    }

    /// The queue pair number reported in [`crate::Wc::qp_num`].
    pub fn qp_num(&self) -> u32 {
        self.qi as u32
    }

    /// Posts a send-queue request (Send, RDMA Write, RDMA Read) and starts
    /// transmitting it at once. Errors in the request itself (bad local
    /// buffers) and a dead queue pair surface as completions.
    pub fn post_send(&self, wr: SendWr) -> Result<(), PostError> {
        self.with(|st, inner| {
            st.qp(self.qi).conn.post_send(wr)?;
            inner.kick(st, self.qi);
            Ok(())
        })
    }

    /// [`Self::post_send`], then the queue pair's news at the end of its
    /// transmit, under the same lock.
    pub fn post_send_news(&self, wr: SendWr) -> Result<QpNews, PostError> {
        self.with(|st, inner| {
            st.qp(self.qi).conn.post_send(wr)?;
            inner.kick(st, self.qi);
            Ok(st.news(self.qi))
        })
    }

    /// Sends the bytes of `parts` (in order) as an unsignalled Send of one
    /// FPDU, now, under one take of the lock — when nothing is queued ahead
    /// of it (no request posted and not yet handed out, no Read Response,
    /// no unwritten segment, the connection in RTS) and the bytes fit one
    /// FPDU: the FPDU is built by the core's encoder
    /// ([`warpsock_proto::Connection::send_inline`]: byte for byte the
    /// FPDU [`Self::post_send`] of the same Send gives, the same MSN
    /// sequence) and written with one system call. No send-queue entry, no
    /// completion (a Send is complete once handed to the transport), and
    /// the bytes are copied before the call returns, so `parts` needs no
    /// registration. Bytes the socket does not take at once are queued as
    /// any transmit's ([`QpNews::backlog`]). Returns the queue pair's news
    /// after it, or `None` having done nothing: post the Send instead.
    pub fn send_inline_news(&self, parts: &[&[u8]]) -> Option<QpNews> {
        self.with(|st, inner| {
            // Region borrows hold transmits back (`State::allowed`).
            if !st.allowed().tx {
                return None;
            }
            let State {
                reg,
                qps,
                cqs,
                watching,
                ..
            } = st;
            let q = qps.get_mut(self.qi)?.as_mut()?;
            let full = q.tx_inline(reg, cqs, parts)?;
            if full && !q.dead {
                // The socket took the FPDU in part or not at all: the rest
                // waits for writability (watched, with a progress thread)
                // or the next pass. A transmit pass now would write into
                // the socket that just refused it (one more `sendmsg`,
                // `EAGAIN`, per blocked send).
                q.update_interest(self.qi as u64, watching.then_some(&inner.epoll));
            } else if q.tx_backlog() > 0 || q.dead {
                // What an interrupted write left, or its error: a transmit
                // pass writes, watches and reports it as after a post.
                inner.kick(st, self.qi);
                return Some(st.news(self.qi));
            }
            // `State::news` of the queue pair in hand (no second look-up).
            Some(QpNews {
                backlog: q.tx_backlog(),
                events: !q.events.is_empty(),
                rx_drained: q.rx_drained,
            })
        })
    }

    /// [`Self::send_inline_news`] for a Send of any length (at most 64
    /// FPDUs): framed by the core, its payload written from `parts` in the
    /// same gathered system call — no copy but of what the socket does not
    /// take at once, which is queued as any transmit's
    /// ([`QpNews::backlog`]; `QpSlot::tx_gathered`). The FPDUs and their
    /// MSN are those a posted unsignalled Send of the same bytes gives.
    /// Returns `None`, having done nothing, when anything is queued ahead
    /// of it (or MPA markers are on): post the Send instead.
    pub fn send_gathered_news(&self, parts: &[&[u8]]) -> Option<QpNews> {
        self.send_gathered_list_news(&[parts]).map(|(_, news)| news)
    }

    /// [`Self::send_gathered_news`] of several messages (`msgs`, each its
    /// parts) in one gathered system call: the Sends, in order, that
    /// posted unsignalled Sends of the same bytes give. At most 64 FPDUs
    /// and 4 MiB of payload in all (unless the first message alone is
    /// more): returns how many
    /// messages, from the first, it took (post the rest), or `None`
    /// having done nothing.
    pub fn send_gathered_list_news(&self, msgs: &[&[&[u8]]]) -> Option<(usize, QpNews)> {
        self.with(|st, inner| {
            if !st.allowed().tx {
                return None;
            }
            let State {
                qps, cqs, watching, ..
            } = st;
            let q = qps.get_mut(self.qi)?.as_mut()?;
            let (taken, full) = q.tx_gathered(cqs, msgs)?;
            if full && !q.dead {
                // As `send_inline_news`: the rest waits for writability.
                q.update_interest(self.qi as u64, watching.then_some(&inner.epoll));
            } else if q.tx_backlog() > 0 || q.dead {
                inner.kick(st, self.qi);
            }
            Some((taken, st.news(self.qi)))
        })
    }

    /// Send backlog and pending events in one look ([`QpNews`]).
    pub fn news(&self) -> QpNews {
        self.with(|st, _| st.news(self.qi))
    }

    /// Posts several send-queue requests, then transmits. Stops at the
    /// first that fails to post; the error says how many were posted
    /// before it (those are transmitted and will complete).
    pub fn post_send_batch(
        &self,
        wrs: impl IntoIterator<Item = SendWr>,
    ) -> Result<usize, BatchPostError> {
        self.post_send_batch_news(wrs).0
    }

    /// [`Self::post_send_batch`], then the queue pair's news at the end of
    /// its transmit, under the same lock (as [`Self::post_send_news`]): a
    /// write of the batch that met the connection's end shows in
    /// [`QpNews::events`], and no other thread's round of progress, taking
    /// in an end that came after the batch was written, can show there.
    pub fn post_send_batch_news(
        &self,
        wrs: impl IntoIterator<Item = SendWr>,
    ) -> (Result<usize, BatchPostError>, QpNews) {
        self.with(|st, inner| {
            let mut posted = 0;
            let mut res = Ok(());
            for wr in wrs {
                if let Err(source) = st.qp(self.qi).conn.post_send(wr) {
                    res = Err(BatchPostError { posted, source });
                    break;
                }
                posted += 1;
            }
            inner.kick(st, self.qi);
            (res.map(|()| posted), st.news(self.qi))
        })
    }

    /// Posts a receive for an incoming Send.
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), PostError> {
        self.with(|st, inner| {
            let conn = &mut st.qp(self.qi).conn;
            conn.post_recv(wr)?;
            // A receive posted to a QP that is not in RTS completes at once
            // (flushed): deliver that. In RTS a receive produces neither
            // output nor a completion, so no transmit round (a ping-pong
            // reposts a receive per message).
            if conn.state() != QpState::Rts {
                inner.kick(st, self.qi);
            }
            Ok(())
        })
    }

    /// Posts several receives under one take of the lock, in order (a
    /// socket's freed slots posted again together: issue 12). Stops at
    /// the first that fails to post; the error says how many were posted
    /// before it. As [`Self::post_recv`], outside RTS they complete at
    /// once (flushed).
    pub fn post_recv_batch(
        &self,
        wrs: impl IntoIterator<Item = RecvWr>,
    ) -> Result<usize, BatchPostError> {
        self.with(|st, inner| {
            let conn = &mut st.qp(self.qi).conn;
            let mut posted = 0;
            let mut res = Ok(());
            for wr in wrs {
                if let Err(source) = conn.post_recv(wr) {
                    res = Err(BatchPostError { posted, source });
                    break;
                }
                posted += 1;
            }
            if conn.state() != QpState::Rts {
                inner.kick(st, self.qi);
            }
            res.map(|()| posted)
        })
    }

    /// Changes the buffers of posted receives that no Send has started to
    /// fill: visits them oldest first (the order Sends consume them) until
    /// `f` returns `false`, passing each one's `wr_id` and its scatter
    /// list, or `None` for the one a Send is being placed into now. See
    /// [`warpsock_proto::Connection::retarget_recvs`]: the new buffers are checked
    /// when a Send starts into them, so they must stay registered until
    /// the receive completes or is pointed elsewhere again.
    pub fn retarget_recvs(&self, f: impl FnMut(u64, Option<&mut Sgl>) -> bool) {
        self.with(|st, _| st.qp(self.qi).conn.retarget_recvs(f));
    }

    /// Bytes of transmitted requests the engine holds because the kernel's
    /// send buffer was full (0: everything posted so far is in the kernel,
    /// or still waits for the peer's flow control, not for socket space).
    /// In caller-driven mode only a round of progress after the buffer
    /// drains sends them, so whoever drives the queue pair from readiness
    /// must watch the socket for output space exactly while this is
    /// non-zero.
    pub fn send_backlog(&self) -> u64 {
        self.with(|st, _| st.qp(self.qi).tx_backlog())
    }

    /// Whether output still to be written reads the region `stag` (a
    /// Read Response from it the peer asked for, queued or under way): a
    /// socket layer's close keeps such a region, on a copy, and lets the
    /// others go without reading them.
    pub fn reads_region(&self, stag: crate::proto::Stag) -> bool {
        self.with(|st, _| st.qp(self.qi).reads_region(stag))
    }

    /// Whether the engine has read the end of the peer's byte stream (its
    /// FIN), or the connection is over: its socket then stays readable
    /// (EOF) for good, and the engine stops watching it for input (a
    /// poller that still asked for `POLLIN` would wake at once, every
    /// time).
    pub fn read_closed(&self) -> bool {
        self.with(|st, _| {
            let q = st.qp(self.qi);
            q.rd_closed || q.is_done()
        })
    }

    /// Receive system calls made on this queue pair's socket so far (a
    /// diagnostic: compared with the FPDUs received, it shows how many
    /// FPDUs one read takes in).
    pub fn socket_reads(&self) -> u64 {
        self.io_stats().reads
    }

    /// The socket's system calls and the bytes they moved, and what this
    /// queue pair's Read Requests and control messages waited behind (a
    /// diagnostic: per MiB moved, these are counts that mean the same on
    /// a loaded machine).
    pub fn io_stats(&self) -> IoStats {
        self.with(|st, _| st.qp(self.qi).io_stats())
    }

    /// [`Self::send_backlog`] and [`IoStats::write_bytes`] together, or
    /// `None` if the context's lock is taken now: one try, no wait (for
    /// an exit that may have interrupted its own thread inside a call
    /// holding that lock, where a wait would never end).
    pub fn try_send_backlog(&self) -> Option<(u64, u64)> {
        let mut st = self.sh.inner.try_lock()?;
        let q = st.qp(self.qi);
        Some((q.tx_backlog(), q.io_stats().write_bytes))
    }

    /// The largest ULPDU this queue pair sends (MULPDU, RFC 5044 §5.2):
    /// what each FPDU it builds carries at most, fixed at setup from the
    /// path ([`QpOptions::mulpdu`](crate::QpOptions::mulpdu)).
    pub fn mulpdu(&self) -> usize {
        self.with(|st, _| st.qp(self.qi).conn.config().mulpdu)
    }

    /// Queue pair state.
    pub fn state(&self) -> QpState {
        self.with(|st, _| st.qp(self.qi).conn.state())
    }

    /// What MPA negotiated (CRC, IRD/ORD, RTR, the peer's private data).
    pub fn negotiated(&self) -> Option<Negotiated> {
        self.with(|st, _| st.qp(self.qi).conn.negotiated().cloned())
    }

    /// The next connection event ([`Event::Established`],
    /// [`Event::Terminated`], [`Event::Closed`] with its cause, ...), if
    /// any.
    pub fn poll_event(&self) -> Option<Event> {
        self.with(|st, _| st.qp(self.qi).events.pop_front())
    }

    /// Why the connection ended, once it has: closed locally, peer closed
    /// (FIN), peer reset, timed out, a Terminate (sent or received, with
    /// its code), a local error. The same cause every failed completion
    /// carries in [`crate::Wc::cause`].
    pub fn close_reason(&self) -> Option<CloseReason> {
        self.with(|st, _| st.qp(self.qi).close_reason())
    }

    /// The socket error that ended the connection (`ECONNRESET`,
    /// `ETIMEDOUT` from `TCP_USER_TIMEOUT`/keepalive, ...), if one did. A
    /// connection that ended with FIN, a Terminate or a local close has
    /// none.
    pub fn socket_error(&self) -> Option<io::Error> {
        self.with(|st, _| st.qp(self.qi).error.map(io::Error::from_raw_os_error))
    }

    /// Whether the TCP connection is finished in both directions (closed,
    /// reset or failed).
    pub fn is_closed(&self) -> bool {
        self.with(|st, _| st.qp(self.qi).is_done())
    }

    /// Local socket address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Peer socket address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// Graceful disconnect (`rdma_disconnect`): outstanding requests are
    /// flushed with [`warpsock_proto::WcStatus::WrFlushError`], bytes
    /// already handed to the socket are delivered, then FIN is sent.
    pub fn disconnect(&self) {
        self.with(|st, inner| {
            st.qp(self.qi).conn.close();
            inner.kick(st, self.qi);
        });
    }

    /// Ends the connection with a Terminate carrying `code`, for an upper
    /// layer that found the peer broke *its* protocol (a malformed message
    /// in a receive, a credit overrun): outstanding requests are flushed,
    /// the Terminate goes out (RFC 5040 §7; untagged, QN 2), then FIN. The
    /// peer sees [`Event::Terminated`] with `code`.
    pub fn terminate(&self, code: crate::proto::wire::terminate::TermCode) {
        self.with(|st, inner| {
            st.qp(self.qi).conn.fail_local(Some(code), false);
            inner.kick(st, self.qi);
        });
    }

    /// Abortive close: everything outstanding is flushed and the peer gets
    /// a TCP reset (`SO_LINGER` 0).
    pub fn abort(self) {
        self.with(|st, inner| {
            let State {
                qps,
                cqs,
                reg,
                watching,
                ..
            } = st;
            let q = qps[self.qi].as_mut().expect("slot");
            q.abort();
            // Flush what the abort failed (no I/O happens on a dead slot,
            // so this is safe while closures borrow region bytes).
            q.service_tx(self.qi as u64, reg, cqs, watching.then_some(&inner.epoll));
            q.unregister(&inner.epoll);
        });
        if self.sh.inner.progress == Progress::Thread {
            self.sh.inner.notify();
        }
        // Drop closes the socket, which now resets the connection.
    }
}

impl Drop for Qp {
    /// Disconnects (flush, FIN) and leaves the socket to linger: it stays
    /// open, its input discarded, until the peer's FIN (or the context's
    /// [`crate::ContextOptions::linger`], 2 s by default), and is closed by
    /// later progress (any call on the context in caller-driven mode, the
    /// progress thread otherwise) or when the context goes. Closing at
    /// once would make the kernel answer the peer's further bytes with a
    /// reset, and a reset makes the *peer's* kernel drop what we sent
    /// last and it has not read yet. Requests whose bytes are still
    /// unwritten when the linger ends complete as flushed.
    fn drop(&mut self) {
        let inner = &self.sh.inner;
        let mut st = inner.lock();
        if let Some(q) = st.qps[self.qi].as_mut() {
            if !q.is_done() {
                q.conn.close();
            }
        }
        st.service(self.qi, &inner.epoll);
        if let Some(q) = st.qps[self.qi].as_mut() {
            q.detached = Some(Instant::now() + inner.linger);
            st.detached += 1;
        }
        st.reap(&inner.epoll);
        drop(st);
        if inner.progress == Progress::Thread {
            inner.notify();
        }
    }
}
