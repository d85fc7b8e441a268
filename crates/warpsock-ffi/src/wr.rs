//! Work requests as C sees them: scatter/gather elements, send and
//! receive work requests (used by queue pairs, their configurations'
//! initial receives, and memory regions).

use warpsock_engine::Sge;

/// `warpsock_send_wr.send_flags` bit: report a completion when the request
/// succeeds (errors are always reported).
pub const WARPSOCK_SEND_SIGNALED: u32 = 1;
/// `warpsock_send_wr.send_flags` bit: Send with Solicited Event.
pub const WARPSOCK_SEND_SOLICITED: u32 = 2;

/// A scatter/gather element: `length` bytes at `addr` of the local region
/// whose lkey is `lkey` (`warpsock_mr_sge` builds one).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct warpsock_sge {
    /// Address in the region (`warpsock_mr_addr` + offset).
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// The region's `warpsock_mr_lkey`.
    pub lkey: u32,
}

impl From<Sge> for warpsock_sge {
    fn from(s: Sge) -> Self {
        Self {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        }
    }
}

impl From<&warpsock_sge> for Sge {
    fn from(s: &warpsock_sge) -> Self {
        Self {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        }
    }
}

/// The operation of a send work request (`warpsock_send_wr.opcode`).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum warpsock_wr_opcode {
    /// RDMAP Send of the gather list into the peer's next posted receive.
    Send = 0,
    /// Send with Invalidate: also invalidates the peer's STag
    /// `invalidate_rkey`.
    SendWithInv = 1,
    /// RDMA Write of the gather list to `remote_addr` in the peer's `rkey`.
    RdmaWrite = 2,
    /// RDMA Read from `remote_addr` in the peer's `rkey` into the (single)
    /// local scatter element.
    RdmaRead = 3,
}

/// A send-queue work request (Send, RDMA Write, RDMA Read).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct warpsock_send_wr {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// A `warpsock_wr_opcode` value.
    pub opcode: u32,
    /// `WARPSOCK_SEND_*` bits.
    pub send_flags: u32,
    /// Local buffers: gather list for Send and Write, the one scatter
    /// element for Read. Read only during the post call.
    pub sg_list: *const warpsock_sge,
    /// Number of elements in `sg_list`.
    pub num_sge: usize,
    /// Write and Read: the peer's tagged offset.
    pub remote_addr: u64,
    /// Write and Read: the peer's STag.
    pub rkey: u32,
    /// Send with Invalidate: the peer's STag to invalidate.
    pub invalidate_rkey: u32,
}

/// A receive-queue work request: buffers an incoming Send is scattered
/// into.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct warpsock_recv_wr {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// Local buffers. Read only during the post call.
    pub sg_list: *const warpsock_sge,
    /// Number of elements in `sg_list`.
    pub num_sge: usize,
}
