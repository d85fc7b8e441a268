//! Protection domains ([`Pd`]) and memory registration.

use std::sync::Arc;

use warpsock_proto::{Access, PdId};

use crate::context::{Context, Shared};
use crate::mem::Mem;
use crate::mr::Mr;
use crate::sys;

/// A protection domain: memory regions and queue pairs in one domain may
/// be used together; the peer's STags are checked against it.
#[derive(Debug)]
pub struct Pd {
    pub(crate) sh: Arc<Shared>,
    pub(crate) id: PdId,
}

impl Context {
    /// Allocates a protection domain.
    pub fn alloc_pd(&self) -> Pd {
        let id = self.sh.inner.lock().reg.alloc_pd();
        Pd {
            sh: Arc::clone(&self.sh),
            id,
        }
    }
}

/// A fresh STag key: unpredictable (RFC 5042 §5: a peer must not be able
/// to guess a valid STag from the ones it was given), kept in the low 8
/// bits as siw lays STags out (`index << 8 | key`).
fn stag_key() -> u8 {
    let mut b = [0u8];
    // getrandom fails only without a kernel random source (not on any
    // Linux this runs on); fall back to the clock's low bits rather than
    // fail a registration.
    if sys::random_bytes(&mut b).is_err() {
        b[0] = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos() as u8);
    }
    b[0]
}

impl Pd {
    /// The context this domain belongs to.
    pub fn context(&self) -> Context {
        Context {
            sh: Arc::clone(&self.sh),
        }
    }

    /// Registers an owned buffer. Its bytes are reached through
    /// [`Mr::read`], [`Mr::write`] and [`Mr::with_bytes`]; the buffer is
    /// freed when the `Mr` is dropped.
    pub fn register(&self, buf: Vec<u8>, access: Access) -> Mr {
        self.insert(Mem::owned(buf.into_boxed_slice()), access)
    }

    /// Registers a zeroed owned buffer of `len` bytes.
    pub fn alloc(&self, len: usize, access: Access) -> Mr {
        self.register(vec![0; len], access)
    }

    /// Registers caller memory: `len` bytes at `ptr`. The region's address
    /// ([`Mr::addr`]) is `ptr`.
    ///
    /// # Safety
    ///
    /// Like `ibv_reg_mr`: the memory must be valid for reads and writes of
    /// `len` bytes until the returned `Mr` is dropped, and the caller must
    /// not read or write any part of it that an operation is using — posted
    /// and not yet completed locally, or exposed to the peer through the
    /// rkey — since the engine may write or read it from another thread at
    /// any time (see the `mem` module's contract).
    #[allow(unsafe_code)]
    pub unsafe fn register_raw(&self, ptr: *mut u8, len: usize, access: Access) -> Mr {
        // SAFETY: forwarded from this function's contract.
        self.insert(unsafe { Mem::raw(ptr, len) }, access)
    }

    /// Like [`Self::register_raw`], but the region's address space starts
    /// at `iova` instead of `ptr` (`ibv_reg_mr_iova2`): byte `k` of the
    /// memory is tagged offset `iova + k`, in local SGEs and for the peer.
    ///
    /// # Safety
    ///
    /// As for [`Self::register_raw`].
    #[allow(unsafe_code)]
    pub unsafe fn register_raw_iova(
        &self,
        ptr: *mut u8,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Mr {
        // SAFETY: forwarded from this function's contract.
        self.insert_at(unsafe { Mem::raw(ptr, len) }, iova, access)
    }

    fn insert(&self, mem: Mem, access: Access) -> Mr {
        let addr = mem.addr();
        self.insert_at(mem, addr, access)
    }

    /// Registers `mem` with its byte 0 at tagged offset `iova`.
    fn insert_at(&self, mem: Mem, iova: u64, access: Access) -> Mr {
        let (base, len) = (mem.addr(), mem.len());
        let key = stag_key();
        let mut st = self.sh.inner.lock();
        let stag = st.reg.register(self.id, iova, mem, access, key);
        drop(st);
        Mr::new(Arc::clone(&self.sh), stag, iova, base, len)
    }
}
