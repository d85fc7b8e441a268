//! The program's buffers mapped for the peer's one-sided access
//! (`riomap`, `riounmap`): registered, announced to the peer under an
//! offset, and ended (the peer told). What a close does with them:
//! [`super::detach_program_memory`].

use std::io;

use warpsock_engine::{Access, Mr};

use super::super::socket::XSocket;
use crate::wire::{IoMapAd, ACCESS_READ, ACCESS_WRITE};

/// A local buffer the peer may access.
#[derive(Debug)]
pub(crate) struct LocalMap {
    pub(super) mr: Mr,
    /// The buffer's address, which `riounmap` names (the registration's
    /// tagged offsets start at 0, not there).
    pub(super) ptr: usize,
    /// The peer may read it (`rioread`): Read Responses from it may be
    /// queued behind our last bytes at a close
    /// ([`super::detach_program_memory`]).
    pub(super) readable: bool,
}

impl XSocket {
    /// Registers `len` bytes at `ptr` for the peer's one-sided access
    /// (`writable`: `riowrite`, `readable`: `rioread`) and announces it
    /// under `offset` (`None`: one the library chooses, no address of
    /// ours: the registration's private offset). Returns the offset;
    /// `EEXIST` for an offset range another mapping holds, `ENOBUFS` with
    /// [`crate::stream::PEER_MAPS_MAX`] mappings live (the most a peer
    /// holds).
    ///
    /// # Safety
    /// The memory must stay valid until [`Self::riounmap`] or the socket's
    /// close begins ([`Self::close`], [`Self::close_begin`]: the mapping
    /// ends then, or goes on from a copy, `detach_program_memory`) or its
    /// drop, and the
    /// application must expect the peer to change it at any time while
    /// mapped.
    #[allow(unsafe_code)]
    pub unsafe fn riomap(
        &self,
        ptr: *mut u8,
        len: usize,
        writable: bool,
        readable: bool,
        offset: Option<u64>,
    ) -> io::Result<u64> {
        if len == 0 || (!writable && !readable) {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let mut access = Access::LOCAL_WRITE;
        if writable {
            access = access | Access::REMOTE_WRITE;
        }
        if readable {
            access = access | Access::REMOTE_READ;
        }
        // At a private tagged offset: the announcement tells the peer no
        // address of ours (`private_iova`), nor does the offset the library
        // chooses, that one (where `rsockets` takes the buffer's address).
        let iova = crate::io::sink::private_iova(len);
        let offset = offset.unwrap_or(iova);
        let mut st = self.lock();
        if let Some((errno, _)) = st.error {
            return Err(io::Error::from_raw_os_error(errno));
        }
        let overlaps = st
            .maps
            .range(..offset.saturating_add(len as u64))
            .next_back()
            // Saturating: an offset the program chose near 2^64 (helper
            // 68's review: the sum overflowed).
            .is_some_and(|(o, m)| o.saturating_add(m.mr.len() as u64) > offset);
        if overlaps {
            return Err(io::Error::from_raw_os_error(libc::EEXIST));
        }
        // The peer holds at most this many of ours (a peer of this build
        // fails the connection past it: `StreamError::TooMany`): the call
        // fails here instead (helper 33's review, session 35).
        if st.maps.len() >= crate::stream::PEER_MAPS_MAX {
            return Err(io::Error::from_raw_os_error(libc::ENOBUFS));
        }
        // SAFETY: forwarded from this function's contract.
        let mr = unsafe { self.pd.register_raw_iova(ptr, len, iova, access) };
        let ad = IoMapAd {
            offset,
            len: len as u64,
            to: mr.addr(),
            stag: mr.rkey(),
            access: if writable { ACCESS_WRITE } else { 0 }
                | if readable { ACCESS_READ } else { 0 },
        };
        st.maps.insert(
            offset,
            LocalMap {
                mr,
                ptr: ptr as usize,
                readable,
            },
        );
        st.s.announce_map(ad);
        self.flush(&mut st);
        Ok(offset)
    }

    /// Ends the mapping of the buffer at `ptr`: tells the peer, and
    /// deregisters. The peer must have stopped accessing it (as with
    /// `rsockets`); an access that arrives later ends the connection with a
    /// remote protection error.
    pub fn riounmap(&self, ptr: *mut u8) -> io::Result<()> {
        let mut st = self.lock();
        let key = st
            .maps
            .iter()
            .find(|(_, m)| m.ptr == ptr as usize)
            .map(|(o, _)| *o)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
        st.maps.remove(&key);
        st.s.announce_unmap(key);
        self.flush(&mut st);
        Ok(())
    }
}
