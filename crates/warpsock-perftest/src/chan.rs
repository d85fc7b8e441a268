//! One queue pair with its own completion queue, bounded waits, and
//! failures turned into precise [`Error`]s (the first Terminate wins).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use warpsock_engine::{connect, Cq, Event, Qp, QpInit, SendOp, SendWr, Sgl, Wc, WcStatus};

use crate::Error;

/// Longest single sleep in a wait, so events are noticed promptly.
const POLL_SLICE: Duration = Duration::from_millis(50);
/// How long a graceful disconnect may take before we just close.
const CLOSE_WAIT: Duration = Duration::from_secs(3);

/// A connected queue pair and its completion queue.
pub(crate) struct Chan {
    pub(crate) qp: Qp,
    pub(crate) cq: Cq,
    /// Successful completions not yet taken.
    pending: VecDeque<Wc>,
    failed: Option<Wc>,
    pub(crate) terminate: Option<(warpsock_engine::proto::wire::terminate::TermCode, bool)>,
    /// Zero-length Writes sent to unstick siw's accept race.
    pub(crate) kicks: u32,
}

impl Chan {
    pub(crate) fn new(qp: Qp, cq: Cq) -> Self {
        Self {
            qp,
            cq,
            pending: VecDeque::new(),
            failed: None,
            terminate: None,
            kicks: 0,
        }
    }

    fn drain_events(&mut self) {
        while let Some(e) = self.qp.poll_event() {
            if let Event::Terminated { code, by_peer } = e {
                self.terminate.get_or_insert((code, by_peer));
            }
        }
    }

    fn absorb(&mut self, wcs: &[Wc]) {
        for wc in wcs {
            if wc.is_ok() {
                self.pending.push_back(*wc);
            } else if self.failed.is_none() {
                self.failed = Some(*wc);
            }
        }
    }

    /// The error for a connection going away under `step`.
    fn lost(&mut self, step: &'static str) -> Error {
        self.drain_events();
        if let Some((code, by_peer)) = self.terminate {
            return Error::Terminated {
                step,
                code,
                by_peer,
            };
        }
        match self.failed.map(|wc| wc.result()) {
            Some(Err(error)) if error.status != WcStatus::WrFlushError || !self.qp.is_closed() => {
                Error::Completion { step, error }
            }
            _ => Error::Disconnected {
                step,
                reason: self.qp.close_reason(),
            },
        }
    }

    /// Waits up to `limit` for the next successful completion that `want`
    /// accepts (others are kept for later). `Ok(None)` on timeout.
    pub(crate) fn wait_for(
        &mut self,
        want: impl Fn(&Wc) -> bool,
        step: &'static str,
        limit: Duration,
    ) -> Result<Option<Wc>, Error> {
        let deadline = Instant::now() + limit;
        let mut wcs = [Wc::default(); 64];
        loop {
            if let Some(i) = self.pending.iter().position(&want) {
                return Ok(self.pending.remove(i));
            }
            if self.failed.is_some() {
                return Err(self.lost(step));
            }
            let now = Instant::now();
            if now >= deadline {
                self.drain_events();
                if self.terminate.is_some() {
                    return Err(self.lost(step));
                }
                return Ok(None);
            }
            let n = self.cq.wait(&mut wcs, (deadline - now).min(POLL_SLICE))?;
            self.absorb(&wcs[..n]);
            if n == 0 {
                self.drain_events();
                if self.terminate.is_some() || self.qp.is_closed() {
                    let n = self.cq.poll(&mut wcs);
                    self.absorb(&wcs[..n]);
                    if let Some(i) = self.pending.iter().position(&want) {
                        return Ok(self.pending.remove(i));
                    }
                    return Err(self.lost(step));
                }
            }
        }
    }

    /// [`Self::wait_for`], a timeout being an error.
    pub(crate) fn wait(
        &mut self,
        want: impl Fn(&Wc) -> bool,
        step: &'static str,
        limit: Duration,
    ) -> Result<Wc, Error> {
        self.wait_for(want, step, limit)?
            .ok_or(Error::Timeout { step, after: limit })
    }

    /// Sends a zero-length RDMA Write (STag 1, TO 0, like siw's RTR frame,
    /// accepted without STag checks): its arrival makes siw read an FPDU it
    /// left in the socket when it arrived right after the MPA Reply (see
    /// `warpsock-rping`'s session module for the race).
    pub(crate) fn kick(&mut self) -> Result<(), Error> {
        self.qp
            .post_send(SendWr {
                wr_id: u64::MAX,
                op: SendOp::Write {
                    remote_addr: 0,
                    rkey: 1,
                },
                sgl: Sgl::new(),
                signaled: false,
            })
            .map_err(|e| Error::Post {
                step: "kick",
                source: e,
            })?;
        self.kicks += 1;
        Ok(())
    }

    /// Graceful disconnect: FIN, then a bounded wait for the peer's.
    pub(crate) fn close(self) {
        self.qp.disconnect();
        let end = Instant::now() + CLOSE_WAIT;
        let mut wcs = [Wc::default(); 16];
        while !self.qp.is_closed() && Instant::now() < end {
            let _ = self.cq.wait(&mut wcs, POLL_SLICE);
        }
    }
}

/// Connects, retrying while nothing listens yet: through qemu's slirp an
/// early attempt is accepted and then reset, and perftest's server restarts
/// between runs (send_check.c restarts between runs too).
pub(crate) fn connect_retrying(
    addr: SocketAddr,
    init: &QpInit<'_>,
    t: Duration,
    step: &'static str,
) -> Result<Qp, Error> {
    let deadline = Instant::now() + t;
    loop {
        match connect(addr, init) {
            Ok(qp) => return Ok(qp),
            Err(e) if Instant::now() < deadline && e.is_retryable() => {
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => return Err(Error::Cm { step, source: e }),
        }
    }
}
