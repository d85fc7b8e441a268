//! What client and server share: rping's buffers and queue pair options,
//! and a connection wrapper that waits for one completion at a time with
//! bounded waits and turns failures into precise [`Error`]s.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use warpsock_engine::proto::wire::terminate::TermCode;
use warpsock_engine::{
    Access, Context, Cq, Event, Mr, Pd, Progress, Qp, QpInit, RecvWr, SendOp, SendWr, Sgl, Wc,
    WcOpcode, WcStatus,
};

use crate::{Args, ConnReport, Error, RdmaInfo, INFO_LEN};

/// `wr_id` of rping's receive.
const WR_RECV: u64 = 1;
/// `wr_id` of rping's Send.
const WR_SEND: u64 = 2;
/// `wr_id` of the RDMA Read / Write.
const WR_RDMA: u64 = 3;
/// `wr_id` of a kick (zero-length RDMA Write, unsignaled).
const WR_KICK: u64 = 4;

/// Linux siw's `siw_accept()` sends the MPA Reply *before* it hands the
/// socket's receive callback to the queue pair (`siw_qp_socket_assoc()`).
/// An FPDU that arrives in between is seen by the connection manager's
/// callback in `RDMA_MODE`, which ignores it, and it then sits unprocessed in
/// the socket until more data arrives (seen under qemu TCG in 2-6 of 12
/// connections). An initiator that sends its first message right after the
/// Reply, as we do, waits forever. If the answer to the first message does
/// not come within [`KICK_AFTER`], the client sends a zero-length RDMA Write
/// (STag 1, TO 0, like siw's own RTR frame; zero-length Writes are accepted
/// without STag checks), whose arrival makes siw read the stalled FPDU.
const KICK_AFTER: Duration = Duration::from_secs(1);
/// Kicks at most (with doubling waits between them).
const MAX_KICKS: u32 = 3;

/// How long a graceful disconnect may take before we just close.
const CLOSE_WAIT: Duration = Duration::from_secs(3);
/// Longest single sleep in a wait, so events are noticed promptly.
const POLL_SLICE: Duration = Duration::from_millis(100);

/// rping's verbs objects: one context, PD and CQ, the 16-byte receive and
/// send buffers, and the data buffers of the side.
pub(crate) struct Bufs {
    // Field order is drop order: regions and queues before the context.
    pub(crate) recv: Mr,
    pub(crate) send: Mr,
    /// Server: the RDMA sink/source. Client: the Write sink.
    pub(crate) rdma: Mr,
    /// Client only: the Read source.
    pub(crate) start: Option<Mr>,
    pub(crate) cq: Cq,
    pub(crate) pd: Pd,
    _ctx: Context,
}

impl Bufs {
    pub(crate) fn new(size: usize, client: bool) -> Result<Self, Error> {
        let ctx = Context::new(Progress::Caller)?;
        let pd = ctx.alloc_pd();
        let cq = ctx.create_cq(32)?;
        // rping registers its data buffers with local write, remote read and
        // remote write (iWARP RNICs need remote write on a Read sink).
        let data = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
        Ok(Self {
            recv: pd.alloc(INFO_LEN, Access::LOCAL_WRITE),
            send: pd.alloc(INFO_LEN, Access::LOCAL_READ),
            rdma: pd.alloc(size, data),
            start: client.then(|| pd.alloc(size, data)),
            cq,
            pd,
            _ctx: ctx,
        })
    }

    fn recv_wr(&self) -> RecvWr {
        RecvWr {
            wr_id: WR_RECV,
            sgl: self.recv.sge(0, INFO_LEN as u32).into(),
        }
    }

    /// Queue pair setup as rping's: IRD = ORD = 1, one receive pre-posted.
    pub(crate) fn init(&self, args: &Args) -> QpInit<'_> {
        let mut init = QpInit::new(&self.pd, &self.cq);
        let o = &mut init.options;
        o.ird = 1;
        o.ord = 1;
        o.crc = args.crc;
        o.peer_to_peer = args.p2p == crate::P2p::Write;
        o.sq_depth = 16;
        o.rq_depth = 2;
        init.recvs.push(self.recv_wr());
        init
    }
}

/// One established rping connection.
pub(crate) struct Link<'a> {
    bufs: &'a Bufs,
    qp: Qp,
    timeout: Duration,
    /// Successful completions not yet asked for.
    pending: VecDeque<Wc>,
    /// The first failed completion.
    failed: Option<Wc>,
    terminate: Option<(TermCode, bool)>,
    started: Instant,
    pub(crate) report: ConnReport,
}

impl<'a> Link<'a> {
    pub(crate) fn new(bufs: &'a Bufs, qp: Qp, timeout: Duration, attempts: u32) -> Self {
        let neg = qp.negotiated();
        let report = ConnReport {
            local: qp.local_addr(),
            peer: qp.peer_addr(),
            iterations: 0,
            validated: 0,
            read_bytes: 0,
            write_bytes: 0,
            send_bytes: 0,
            mpa_revision: neg.as_ref().map_or(0, |n| n.revision),
            crc: neg.as_ref().is_some_and(|n| n.crc),
            rtr: neg.as_ref().and_then(|n| n.rtr),
            attempts,
            kicks: 0,
            elapsed: Duration::ZERO,
        };
        Self {
            bufs,
            qp,
            timeout,
            pending: VecDeque::new(),
            failed: None,
            terminate: None,
            started: Instant::now(),
            report,
        }
    }

    /// Sends `info` (rping's `sq_wr` on `send_buf`) and waits until the
    /// buffer may be reused.
    pub(crate) fn send_info(
        &mut self,
        info: &[u8; INFO_LEN],
        step: &'static str,
    ) -> Result<(), Error> {
        self.bufs.send.write(0, info);
        self.qp.post_send(SendWr {
            wr_id: WR_SEND,
            op: SendOp::Send {
                solicited: false,
                invalidate: None,
            },
            sgl: self.bufs.send.sge(0, INFO_LEN as u32).into(),
            signaled: true,
        })?;
        self.wait(WcOpcode::Send, step)?;
        self.report.send_bytes += INFO_LEN as u64;
        Ok(())
    }

    /// Waits for the next Send from the peer, checks it is 16 bytes,
    /// re-posts the receive (as rping's completion handler does) and returns
    /// the message.
    pub(crate) fn recv_info(&mut self, step: &'static str) -> Result<[u8; INFO_LEN], Error> {
        let wc = self.wait(WcOpcode::Recv, step)?;
        self.take_info(&wc)
    }

    /// Checks and copies a received message, re-posts the receive.
    fn take_info(&mut self, wc: &Wc) -> Result<[u8; INFO_LEN], Error> {
        if wc.byte_len as usize != INFO_LEN {
            return Err(Error::BogusData { len: wc.byte_len });
        }
        let mut msg = [0u8; INFO_LEN];
        self.bufs.recv.read(0, &mut msg);
        self.qp.post_recv(self.bufs.recv_wr())?;
        self.report.send_bytes += INFO_LEN as u64;
        Ok(msg)
    }

    /// Like [`Self::recv_info`] for the answer to the first message: kicks
    /// a peer that stalls in siw's accept race (see [`KICK_AFTER`]).
    pub(crate) fn recv_info_kicking(
        &mut self,
        step: &'static str,
    ) -> Result<[u8; INFO_LEN], Error> {
        let start = Instant::now();
        let mut slice = KICK_AFTER;
        loop {
            let left = self.timeout.saturating_sub(start.elapsed());
            let kick = self.report.kicks < MAX_KICKS && left > slice;
            let limit = if kick { slice } else { left };
            match self.wait_within(WcOpcode::Recv, step, limit) {
                Ok(wc) => return self.take_info(&wc),
                Err(Error::Timeout { .. }) if kick => {
                    self.qp.post_send(SendWr {
                        wr_id: WR_KICK,
                        op: SendOp::Write {
                            remote_addr: 0,
                            rkey: 1,
                        },
                        sgl: Sgl::new(),
                        signaled: false,
                    })?;
                    self.report.kicks += 1;
                    slice *= 2;
                }
                Err(Error::Timeout { .. }) => {
                    return Err(Error::Timeout {
                        step,
                        after: self.timeout,
                    })
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// RDMA Reads `len` bytes from the peer's buffer into ours (server).
    pub(crate) fn read(
        &mut self,
        from: &RdmaInfo,
        len: u32,
        step: &'static str,
    ) -> Result<(), Error> {
        self.rdma(
            SendOp::Read {
                remote_addr: from.buf,
                rkey: from.rkey,
            },
            len,
            WcOpcode::RdmaRead,
            step,
        )?;
        self.report.read_bytes += u64::from(len);
        Ok(())
    }

    /// RDMA Writes `len` bytes of ours into the peer's buffer (server).
    pub(crate) fn write(
        &mut self,
        to: &RdmaInfo,
        len: u32,
        step: &'static str,
    ) -> Result<(), Error> {
        self.rdma(
            SendOp::Write {
                remote_addr: to.buf,
                rkey: to.rkey,
            },
            len,
            WcOpcode::RdmaWrite,
            step,
        )?;
        self.report.write_bytes += u64::from(len);
        Ok(())
    }

    fn rdma(
        &mut self,
        op: SendOp,
        len: u32,
        kind: WcOpcode,
        step: &'static str,
    ) -> Result<(), Error> {
        self.qp.post_send(SendWr {
            wr_id: WR_RDMA,
            op,
            sgl: self.bufs.rdma.sge(0, len).into(),
            signaled: true,
        })?;
        self.wait(kind, step).map(drop)
    }

    /// Notes connection events (the first Terminate is the cause).
    fn drain_events(&mut self) {
        while let Some(e) = self.qp.poll_event() {
            if let Event::Terminated { code, by_peer } = e {
                self.terminate.get_or_insert((code, by_peer));
            }
        }
    }

    /// The error for a connection that is going away under `step`.
    fn lost(&mut self, step: &'static str, wc: Option<&Wc>) -> Error {
        self.drain_events();
        if let Some((code, by_peer)) = self.terminate {
            return Error::Terminated {
                step,
                code,
                by_peer,
            };
        }
        match wc.map(Wc::result) {
            Some(Err(error)) if error.status != WcStatus::WrFlushError || !self.qp.is_closed() => {
                Error::Completion { step, error }
            }
            _ => Error::Disconnected {
                step,
                reason: self.qp.close_reason(),
            },
        }
    }

    /// Keeps successful completions for later and remembers the first
    /// failed one.
    fn absorb(&mut self, wcs: &[Wc]) {
        for wc in wcs {
            if wc.is_ok() {
                self.pending.push_back(*wc);
            } else if self.failed.is_none() {
                self.failed = Some(*wc);
            }
        }
    }

    /// Waits (at most the step timeout) for the next successful completion
    /// of kind `op`; other successful completions are kept for later. A
    /// completion already delivered wins over a failure that came with or
    /// after it.
    pub(crate) fn wait(&mut self, op: WcOpcode, step: &'static str) -> Result<Wc, Error> {
        self.wait_within(op, step, self.timeout)
    }

    /// [`Self::wait`] with an explicit limit.
    fn wait_within(
        &mut self,
        op: WcOpcode,
        step: &'static str,
        limit: Duration,
    ) -> Result<Wc, Error> {
        let deadline = Instant::now() + limit;
        let mut wcs = [Wc::default(); 8];
        loop {
            if let Some(i) = self.pending.iter().position(|w| w.opcode == op) {
                return Ok(self.pending.remove(i).expect("index from position"));
            }
            if let Some(bad) = self.failed {
                return Err(self.lost(step, Some(&bad)));
            }
            let now = Instant::now();
            if now >= deadline {
                self.drain_events();
                if let Some((code, by_peer)) = self.terminate {
                    return Err(Error::Terminated {
                        step,
                        code,
                        by_peer,
                    });
                }
                return Err(Error::Timeout { step, after: limit });
            }
            let n = self
                .bufs
                .cq
                .wait(&mut wcs, (deadline - now).min(POLL_SLICE))?;
            self.absorb(&wcs[..n]);
            if n == 0 {
                self.drain_events();
                if self.terminate.is_some() || self.qp.is_closed() {
                    // Completions of the last moments may still be queued.
                    let n = self.bufs.cq.poll(&mut wcs);
                    self.absorb(&wcs[..n]);
                    if let Some(i) = self.pending.iter().position(|w| w.opcode == op) {
                        return Ok(self.pending.remove(i).expect("index from position"));
                    }
                    let bad = self.failed;
                    return Err(self.lost(step, bad.as_ref()));
                }
            }
        }
    }

    /// Graceful disconnect (`rdma_disconnect`): FIN, then wait a little for
    /// the peer's FIN so neither side sees a reset.
    pub(crate) fn close(mut self) -> ConnReport {
        self.report.elapsed = self.started.elapsed();
        self.qp.disconnect();
        let end = Instant::now() + CLOSE_WAIT;
        let mut wcs = [Wc::default(); 8];
        while !self.qp.is_closed() && Instant::now() < end {
            let _ = self.bufs.cq.wait(&mut wcs, POLL_SLICE);
        }
        self.report
    }
}
