//! Work requests and work completions: the verbs vocabulary the core speaks
//! (compare `ibv_send_wr`, `ibv_recv_wr`, `ibv_wc` and siw's `siw_verbs.c`).

use smallvec::SmallVec;

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

/// A work request's scatter/gather list.
///
/// Up to [`Sgl::INLINE`] entries live inside the work request itself; only
/// longer lists take a heap allocation. Posting a one-buffer Send and
/// reposting its receive would otherwise cost two allocations and two
/// frees per message, about 10% of the engine's work for an 8-byte
/// message (callgrind over the engine's `hop` example).
///
/// Build one from a single [`Sge`], an array, a `Vec` or an iterator:
///
/// ```
/// use warpsock_proto::{Sge, Sgl};
/// let a = Sge { addr: 0x1000, length: 8, lkey: 0x100 };
/// let b = Sge { addr: 0x2000, length: 64, lkey: 0x200 };
/// let one: Sgl = a.into();
/// let two: Sgl = [a, b].into();
/// let none = Sgl::new();
/// assert_eq!((one.len(), two.len(), none.len()), (1, 2, 0));
/// assert_eq!(two.iter().map(|s| s.length).sum::<u32>(), 72);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Sgl(SmallVec<[Sge; Self::INLINE]>);

impl Sgl {
    /// Entries stored without a heap allocation.
    pub const INLINE: usize = 3;

    /// An empty list (a zero-length Send or Write).
    pub fn new() -> Self {
        Self(SmallVec::new())
    }

    /// Appends an entry.
    pub fn push(&mut self, sge: Sge) {
        self.0.push(sge);
    }

    /// Whether the list lives on the heap (more than [`Self::INLINE`]
    /// entries).
    pub fn spilled(&self) -> bool {
        self.0.spilled()
    }
}

impl std::ops::Deref for Sgl {
    type Target = [Sge];
    #[inline]
    fn deref(&self) -> &[Sge] {
        &self.0
    }
}

impl std::ops::DerefMut for Sgl {
    fn deref_mut(&mut self) -> &mut [Sge] {
        &mut self.0
    }
}

impl From<Sge> for Sgl {
    fn from(sge: Sge) -> Self {
        let mut v = SmallVec::new();
        v.push(sge);
        Self(v)
    }
}

impl<const N: usize> From<[Sge; N]> for Sgl {
    fn from(a: [Sge; N]) -> Self {
        a.into_iter().collect()
    }
}

impl From<Vec<Sge>> for Sgl {
    fn from(v: Vec<Sge>) -> Self {
        Self(SmallVec::from_vec(v))
    }
}

impl From<&[Sge]> for Sgl {
    fn from(s: &[Sge]) -> Self {
        Self(SmallVec::from_slice(s))
    }
}

impl FromIterator<Sge> for Sgl {
    fn from_iter<I: IntoIterator<Item = Sge>>(it: I) -> Self {
        Self(it.into_iter().collect())
    }
}

impl Extend<Sge> for Sgl {
    fn extend<I: IntoIterator<Item = Sge>>(&mut self, it: I) {
        self.0.extend(it);
    }
}

impl<'a> IntoIterator for &'a Sgl {
    type Item = &'a Sge;
    type IntoIter = std::slice::Iter<'a, Sge>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
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
    pub sgl: Sgl,
    /// Whether a successful completion is reported (errors always are).
    pub signaled: bool,
}

/// A receive-queue work request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvWr {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// Buffers an incoming Send is scattered into.
    pub sgl: Sgl,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn sge(i: u64) -> Sge {
        Sge {
            addr: i * 0x1000,
            length: i as u32 + 1,
            lkey: 0x100 * i as u32,
        }
    }

    /// Up to `INLINE` entries need no heap allocation, whichever way the
    /// list is built; longer lists keep every entry, in order.
    #[test]
    fn short_lists_stay_inline() {
        let three = [sge(1), sge(2), sge(3)];
        for l in [
            Sgl::from(sge(1)),
            Sgl::from(three),
            Sgl::from(three.to_vec()),
            Sgl::from(&three[..2]),
            three.iter().copied().collect(),
            Sgl::new(),
        ] {
            assert!(!l.spilled(), "{l:?}");
        }
        let mut long: Sgl = (1..=Sgl::INLINE as u64 + 2).map(sge).collect();
        assert!(long.spilled());
        long.push(sge(9));
        let addrs: Vec<u64> = long.iter().map(|s| s.addr).collect();
        assert_eq!(addrs, [0x1000, 0x2000, 0x3000, 0x4000, 0x5000, 0x9000]);
        let mut grown = Sgl::from(three);
        grown.extend([sge(4)]);
        assert_eq!(&grown[..], &[sge(1), sge(2), sge(3), sge(4)]);
    }
}
