//! Work requests and work completions: the verbs vocabulary the core speaks
//! (compare `ibv_send_wr`, `ibv_recv_wr`, `ibv_wc` and siw's `siw_verbs.c`).

use crate::mem::Stag;

/// A scatter/gather element: `length` bytes at address `addr` of the local
/// memory region whose STag is `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sge {
    /// Address (in the region's address space, i.e. its iova).
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// STag of the local region.
    pub lkey: Stag,
}

/// The operation of a send-queue work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SendOp {
    /// RDMAP Send; `solicited` sets the SE variant, `invalidate` names the
    /// peer STag to invalidate (Send with Invalidate).
    Send {
        /// Ask the peer for a solicited event.
        solicited: bool,
        /// Remote STag to invalidate on delivery.
        invalidate: Option<Stag>,
    },
    /// RDMA Write of the gather list to `remote_addr` in the peer's `rkey`.
    Write {
        /// Target tagged offset.
        remote_addr: u64,
        /// Target STag.
        rkey: Stag,
    },
    /// RDMA Read from `remote_addr` in the peer's `rkey` into the (single)
    /// local scatter element.
    Read {
        /// Source tagged offset.
        remote_addr: u64,
        /// Source STag.
        rkey: Stag,
    },
}

/// A send-queue work request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWr {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// What to do.
    pub op: SendOp,
    /// Local buffers (gather for Send/Write, scatter for Read).
    pub sgl: Vec<Sge>,
    /// Whether a successful completion is reported (errors always are).
    pub signaled: bool,
}

/// A receive-queue work request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvWr {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// Buffers an incoming Send is scattered into.
    pub sgl: Vec<Sge>,
}

/// Completion status (the subset of `ibv_wc_status` iWARP can produce).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WcStatus {
    /// The operation completed.
    Success,
    /// A local buffer was too small (e.g. an incoming Send exceeded the receive).
    LocalLengthError,
    /// A local STag was invalid, out of bounds, or lacked the access right.
    LocalProtectionError,
    /// The queue pair entered the error state before the request completed.
    WrFlushError,
    /// The peer reported a protection error for this request.
    RemoteAccessError,
    /// The peer reported an operation error for this request.
    RemoteOperationError,
    /// The request itself was malformed (bad gather list, unsupported op).
    LocalQpOperationError,
    /// The stream failed (CRC, framing, Terminate) while the request was active.
    FatalError,
}

/// What a completion is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    /// A Send work request.
    Send,
    /// An RDMA Write work request.
    RdmaWrite,
    /// An RDMA Read work request.
    RdmaRead,
    /// A receive that took an incoming Send.
    Recv,
}

/// Which queue a completion came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WorkQueue {
    /// Send queue.
    Send,
    /// Receive queue.
    Recv,
}

/// A work completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The request's `wr_id`.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// Kind of request.
    pub opcode: WcOpcode,
    /// Which queue.
    pub queue: WorkQueue,
    /// Bytes transferred (received bytes for receives).
    pub byte_len: u32,
    /// For a receive: the STag the peer invalidated (Send with Invalidate).
    pub invalidated: Option<Stag>,
    /// For a receive: the Send asked for a solicited event.
    pub solicited: bool,
}
