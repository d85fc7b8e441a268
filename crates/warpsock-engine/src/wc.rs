//! Work completions ([`Wc`], [`WcError`]) and the queue a completion queue
//! keeps them in ([`CqSlot`]).
//!
//! This module knows nothing of contexts or sockets: the socket driver
//! pushes into a [`CqSlot`], the [`crate::Cq`] handle drains it.

use std::collections::VecDeque;
use std::sync::{Arc, OnceLock};

use warpsock_proto::{CloseReason, Connection, Stag, WcOpcode, WcStatus, WorkCompletion};

use crate::sys::EventFd;

/// A work completion (`ibv_wc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wc {
    /// The request's `wr_id`.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// Kind of request.
    pub opcode: WcOpcode,
    /// Bytes transferred (received bytes for a receive; 0 on error).
    pub byte_len: u32,
    /// The queue pair it belongs to ([`crate::Qp::qp_num`]).
    pub qp_num: u32,
    /// Receive of a Send with Invalidate: the local STag the peer invalidated.
    pub invalidated: Option<Stag>,
    /// Receive: the Send asked for a solicited event.
    pub solicited: bool,
    /// A failed completion: why its queue pair failed, when that is known
    /// (peer closed, peer reset, timed out, the Terminate sent or
    /// received, a local error). `None` on success.
    pub cause: Option<CloseReason>,
}

impl Wc {
    pub(crate) fn from_core(wc: WorkCompletion, qp_num: u32, cause: Option<CloseReason>) -> Self {
        Self {
            wr_id: wc.wr_id,
            status: wc.status,
            opcode: wc.opcode,
            byte_len: wc.byte_len,
            qp_num,
            invalidated: wc.invalidated,
            solicited: wc.solicited,
            cause,
        }
    }

    /// Whether the operation succeeded.
    pub fn is_ok(&self) -> bool {
        self.status == WcStatus::Success
    }

    /// The bytes transferred, or why the request failed:
    ///
    /// ```
    /// # use warpsock_engine::Wc;
    /// let wc = Wc::default();
    /// assert_eq!(wc.result().unwrap(), 0);
    /// ```
    pub fn result(&self) -> Result<u32, WcError> {
        if self.is_ok() {
            Ok(self.byte_len)
        } else {
            Err(WcError {
                wr_id: self.wr_id,
                opcode: self.opcode,
                status: self.status,
                cause: self.cause,
            })
        }
    }
}

impl Default for Wc {
    fn default() -> Self {
        Self {
            wr_id: 0,
            status: WcStatus::Success,
            opcode: WcOpcode::Send,
            byte_len: 0,
            qp_num: 0,
            invalidated: None,
            solicited: false,
            cause: None,
        }
    }
}

/// A work request that completed with an error ([`Wc::result`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{} (wr_id {wr_id}) failed: {}{}", opcode_name(*.opcode), status_text(*.status), cause_text(*.cause))]
pub struct WcError {
    /// The request's `wr_id`.
    pub wr_id: u64,
    /// Kind of request.
    pub opcode: WcOpcode,
    /// The error status.
    pub status: WcStatus,
    /// Why the queue pair failed, when known.
    pub cause: Option<CloseReason>,
}

fn opcode_name(op: WcOpcode) -> &'static str {
    match op {
        WcOpcode::Send => "Send",
        WcOpcode::RdmaWrite => "RDMA Write",
        WcOpcode::RdmaRead => "RDMA Read",
        WcOpcode::Recv => "receive",
    }
}

/// What a completion status means, in words.
pub fn status_text(s: WcStatus) -> &'static str {
    match s {
        WcStatus::Success => "success",
        WcStatus::LocalLengthError => "local length error (the message did not fit the receive)",
        WcStatus::LocalProtectionError => "local protection error (bad local buffer or STag)",
        WcStatus::WrFlushError => "flushed (the queue pair left RTS before it ran)",
        WcStatus::RemoteAccessError => "remote access error (the peer refused the STag or range)",
        WcStatus::RemoteOperationError => "remote operation error",
        WcStatus::LocalQpOperationError => "malformed work request",
        WcStatus::FatalError => "fatal stream error",
        _ => "error",
    }
}

fn cause_text(c: Option<CloseReason>) -> String {
    c.map(|c| format!(": {c}")).unwrap_or_default()
}

/// A completion queue's state: its entries and its notification eventfd.
#[derive(Debug)]
pub(crate) struct CqSlot {
    pub(crate) entries: VecDeque<Wc>,
    /// Shared with the [`crate::Cq`] handle, which lends it out as its fd.
    /// Made at the first [`crate::Cq::notify_fd`], before [`Self::arm`]:
    /// a queue nobody asks for it (each XSocket's, in the preload) holds
    /// no descriptor for it.
    pub(crate) notify: Arc<OnceLock<EventFd>>,
    /// The notify fd is readable.
    signaled: bool,
    /// The application asked for the notify fd; until then it is not
    /// maintained (two system calls per completion saved).
    armed: bool,
}

impl CqSlot {
    pub(crate) fn new() -> Self {
        Self {
            entries: VecDeque::new(),
            notify: Arc::new(OnceLock::new()),
            signaled: false,
            armed: false,
        }
    }

    /// Raises the notify fd. Only armed queues signal, and a queue is
    /// armed only once its fd was made (`Cq::notify_fd`).
    fn signal(&self) {
        if let Some(fd) = self.notify.get() {
            fd.notify();
        }
    }

    /// Whether the notify fd is maintained ([`Self::arm`]).
    pub(crate) fn armed(&self) -> bool {
        self.armed
    }

    /// Starts maintaining the notify fd (readable iff entries are queued).
    pub(crate) fn arm(&mut self) {
        self.armed = true;
        if !self.entries.is_empty() && !self.signaled {
            self.signaled = true;
            self.signal();
        }
    }

    pub(crate) fn push(&mut self, wc: Wc) {
        self.entries.push_back(wc);
        if self.armed && !self.signaled {
            self.signaled = true;
            self.signal();
        }
    }

    /// Nothing queued and the notify fd clear: a drain would change
    /// nothing. (The fd is set only with entries queued and cleared when
    /// they run out: its term is defence.)
    pub(crate) fn is_drained(&self) -> bool {
        self.entries.is_empty() && !self.signaled
    }

    /// Moves up to `out.len()` completions out; clears the notify fd when
    /// the queue runs empty.
    pub(crate) fn drain_into(&mut self, out: &mut [Wc]) -> usize {
        let n = out.len().min(self.entries.len());
        for (slot, wc) in out.iter_mut().zip(self.entries.drain(..n)) {
            *slot = wc;
        }
        if self.entries.is_empty() && self.signaled {
            self.signaled = false;
            if let Some(fd) = self.notify.get() {
                fd.clear();
            }
        }
        n
    }
}

/// Pushes a core completion of `conn` to completion queue `cq` (if it
/// still exists); a failed one carries why `conn` ended (looked up only
/// then: the success path stays as cheap as it was).
pub(crate) fn push_wc(
    cqs: &mut [Option<CqSlot>],
    cq: usize,
    qp_num: u32,
    wc: WorkCompletion,
    conn: &Connection,
) {
    if let Some(Some(cq)) = cqs.get_mut(cq) {
        let cause = if wc.status == WcStatus::Success {
            None
        } else {
            conn.close_reason()
        };
        cq.push(Wc::from_core(wc, qp_num, cause));
    }
}

/// Entries queued in completion queues `a` and `b` (to tell whether a
/// round of progress produced any).
pub(crate) fn cq_lens(cqs: &[Option<CqSlot>], a: usize, b: usize) -> (usize, usize) {
    let len = |i: usize| {
        cqs.get(i)
            .and_then(|c| c.as_ref())
            .map_or(0, |c| c.entries.len())
    };
    (len(a), len(b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use warpsock_proto::wire::terminate::TermCode;
    use warpsock_proto::TransportError;

    /// A failed completion tells what failed and why; a successful one
    /// gives its length and carries no cause.
    #[test]
    fn result_names_the_request_the_status_and_the_cause() {
        let core = WorkCompletion {
            wr_id: 42,
            status: WcStatus::WrFlushError,
            opcode: WcOpcode::RdmaRead,
            queue: warpsock_proto::WorkQueue::Send,
            byte_len: 0,
            invalidated: None,
            solicited: false,
        };
        let reset = Some(CloseReason::Transport(TransportError::Reset));
        let e = Wc::from_core(core, 3, reset).result().unwrap_err();
        assert_eq!(e.cause, reset);
        assert_eq!(
            e.to_string(),
            "RDMA Read (wr_id 42) failed: flushed (the queue pair left RTS before it ran): \
             peer reset the connection"
        );
        let term = CloseReason::Terminated {
            code: TermCode::DDP_UNTAGGED_NO_BUFFER,
            by_peer: true,
        };
        let e = Wc::from_core(core, 3, Some(term)).result().unwrap_err();
        assert!(
            e.to_string().ends_with(&format!(
                "peer sent Terminate {}",
                TermCode::DDP_UNTAGGED_NO_BUFFER
            )),
            "{e}"
        );
        let ok = WorkCompletion {
            status: WcStatus::Success,
            byte_len: 9,
            ..core
        };
        // `push_wc` looks the cause up for failures only.
        let mut cqs = vec![Some(CqSlot::new())];
        let conn = Connection::new(
            warpsock_proto::Config::new(warpsock_proto::Role::Initiator, warpsock_proto::PdId(1)),
            std::time::Instant::now(),
        );
        push_wc(&mut cqs, 0, 3, ok, &conn);
        let wc = cqs[0].as_ref().unwrap().entries[0];
        assert_eq!((wc.result(), wc.cause), (Ok(9), None));
    }
}
