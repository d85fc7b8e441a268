//! Registered memory regions ([`Mr`]) and the application's access to
//! their bytes.
//!
//! # Borrowing region bytes without deadlock
//!
//! [`Mr::with_bytes`] and [`Mr::with_bytes_mut`] run the caller's closure
//! *outside* the context lock: the borrow is registered under the lock
//! (counts in the context's state, and per region here), the lock is
//! released, the closure runs, and the borrow is ended under the lock
//! again. So a closure may call back into the engine —
//! `mr.with_bytes(|b| qp.post_send(…))` posts and transmits — instead of
//! deadlocking on a lock its own thread holds.
//!
//! While borrows last, the engine keeps out of region memory: it places
//! nothing while any closure reads or writes region bytes, and gathers
//! nothing while one writes. What it held back is made up when the last
//! borrow ends (posts made meanwhile are transmitted then; received bytes
//! wait in the socket). A closure should therefore stay short, and a
//! closure that waits for a completion on the same context
//! ([`crate::Cq::wait`]) gets only what is already queued.
//!
//! Per region, one writer or many readers: a second thread waits; the
//! same thread borrowing a region it already writes (or writing one it
//! reads) is a bug, reported by a panic (as `RefCell` does).

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use warpsock_proto::{Access, Backing, Sge, Stag};

use crate::context::{Inner, Shared};
use crate::error::{Error, Result};
use crate::mem::Mem;
use crate::sys;

thread_local! {
    /// Region borrows this thread holds: (context, STag, exclusive).
    static BORROWS: RefCell<Vec<(usize, Stag, bool)>> = const { RefCell::new(Vec::new()) };
}

/// Whether the calling thread is inside a [`Mr`] closure of this context
/// (then progress on it cannot wait for borrows to end).
pub(crate) fn thread_borrows(inner: &Inner) -> bool {
    let ctx = inner as *const Inner as usize;
    BORROWS.with(|b| b.borrow().iter().any(|&(c, _, _)| c == ctx))
}

/// A registered memory region. Its STag serves as both lkey and rkey.
/// Dropping it deregisters the region (and frees an owned buffer).
#[derive(Debug)]
pub struct Mr {
    sh: Arc<Shared>,
    stag: Stag,
    /// Tagged offset of byte 0 (the memory's address unless registered
    /// with an iova).
    addr: u64,
    /// Where byte 0 is in this process's memory (the private copy's, once
    /// [`Mr::keep_private_copy`] made one; changed under the context lock,
    /// with no closure on the region running).
    base: AtomicU64,
    len: usize,
    locked: AtomicBool,
    /// Closures reading this region's bytes (changed under the context
    /// lock).
    readers: AtomicU32,
    /// A closure writes this region's bytes (changed under the context
    /// lock).
    writer: AtomicBool,
}

/// An application borrow of region bytes, ended on drop (also when the
/// closure panics).
struct Borrow<'a> {
    mr: &'a Mr,
    exclusive: bool,
}

impl Drop for Borrow<'_> {
    fn drop(&mut self) {
        let inner = &self.mr.sh.inner;
        let mut st = inner.lock();
        if self.exclusive {
            self.mr.writer.store(false, Ordering::Relaxed);
            st.writers -= 1;
        } else {
            self.mr.readers.fetch_sub(1, Ordering::Relaxed);
            st.readers -= 1;
        }
        let ctx = Arc::as_ptr(inner) as usize;
        let (stag, exclusive) = (self.mr.stag, self.exclusive);
        BORROWS.with(|b| {
            let mut b = b.borrow_mut();
            if let Some(i) = b.iter().rposition(|&e| e == (ctx, stag, exclusive)) {
                b.remove(i);
            }
        });
        if st.readers + st.writers == 0 {
            inner.borrows_ended(&mut st);
        }
        inner.notify();
    }
}

impl Mr {
    pub(crate) fn new(sh: Arc<Shared>, stag: Stag, addr: u64, base: u64, len: usize) -> Self {
        Self {
            sh,
            stag,
            addr,
            base: AtomicU64::new(base),
            len,
            locked: AtomicBool::new(false),
            readers: AtomicU32::new(0),
            writer: AtomicBool::new(false),
        }
    }

    /// The local key (for [`Sge::lkey`]).
    pub fn lkey(&self) -> Stag {
        self.stag
    }

    /// The remote key, to give the peer for RDMA Write/Read.
    pub fn rkey(&self) -> Stag {
        self.stag
    }

    /// The region's first address (the tagged offset of byte 0).
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// The prefix of the region the peer's RDMA Writes have placed, in
    /// order from its start: what a peer that says it wrote `n` bytes
    /// from the region's start must have written (`warpsock_proto`'s
    /// `Registry::note_remote_write`). A Write's bytes count once its
    /// whole FPDU is in (payload placed, CRC checked): a claim looked at
    /// after a later message was delivered sees every Write before it.
    pub fn remote_written(&self) -> u64 {
        self.sh
            .inner
            .lock()
            .reg
            .remote_written(self.stag)
            .unwrap_or(0)
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A scatter/gather element for `len` bytes at `offset` into the region.
    pub fn sge(&self, offset: usize, len: u32) -> Sge {
        Sge {
            addr: self.addr + offset as u64,
            length: len,
            lkey: self.stag,
        }
    }

    /// Registers a borrow of this region's bytes (see the module docs).
    fn borrow(&self, exclusive: bool) -> Borrow<'_> {
        let inner = &self.sh.inner;
        let ctx = Arc::as_ptr(inner) as usize;
        let mine = |excl_only: bool| {
            BORROWS.with(|b| {
                b.borrow()
                    .iter()
                    .any(|&(c, s, e)| c == ctx && s == self.stag && (e || !excl_only))
            })
        };
        let mut st = inner.lock();
        loop {
            let busy = if exclusive {
                self.writer.load(Ordering::Relaxed) || self.readers.load(Ordering::Relaxed) > 0
            } else {
                self.writer.load(Ordering::Relaxed)
            };
            if !busy {
                break;
            }
            assert!(
                !mine(!exclusive),
                "region {:#x} is already borrowed {} by this thread",
                self.stag,
                if exclusive { "" } else { "mutably " },
            );
            st = inner.wait_cv(st, Duration::from_millis(50));
        }
        if exclusive {
            self.writer.store(true, Ordering::Relaxed);
            st.writers += 1;
        } else {
            self.readers.fetch_add(1, Ordering::Relaxed);
            st.readers += 1;
        }
        BORROWS.with(|b| b.borrow_mut().push((ctx, self.stag, exclusive)));
        Borrow {
            mr: self,
            exclusive,
        }
    }

    /// Runs `f` on the region's bytes. The closure runs outside the
    /// context lock and may call into the engine (see the module docs);
    /// while it runs, nothing is placed into the context's regions.
    #[allow(unsafe_code)]
    pub fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        let _b = self.borrow(false);
        // SAFETY: the region's memory is valid for `len` bytes while the
        // `Mr` lives (owned: freed only when it is dropped; raw: the
        // caller's promise). The borrow keeps the engine from writing
        // region bytes and other closures from writing this region until
        // it ends, after `f` returns.
        let bytes = unsafe { std::slice::from_raw_parts(self.base() as *const u8, self.len) };
        f(bytes)
    }

    /// Runs `f` on the region's bytes, writable. The closure runs outside
    /// the context lock and may call into the engine (see the module
    /// docs); while it runs, nothing is placed into or gathered from the
    /// context's regions (posts made meanwhile go out when it returns).
    #[allow(unsafe_code)]
    pub fn with_bytes_mut<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        let _b = self.borrow(true);
        // SAFETY: as in `with_bytes`; the exclusive borrow also keeps the
        // engine from reading region bytes and every other closure from
        // this region, so the slice is unique until `f` returns.
        let bytes = unsafe { std::slice::from_raw_parts_mut(self.base() as *mut u8, self.len) };
        f(bytes)
    }

    /// Copies `dst.len()` bytes from `offset` into `dst`.
    ///
    /// # Panics
    /// If the range is outside the region.
    pub fn read(&self, offset: usize, dst: &mut [u8]) {
        self.with_bytes(|b| dst.copy_from_slice(&b[offset..offset + dst.len()]));
    }

    /// Copies `src` into the region at `offset`.
    ///
    /// # Panics
    /// If the range is outside the region.
    pub fn write(&self, offset: usize, src: &[u8]) {
        self.with_bytes_mut(|b| b[offset..offset + src.len()].copy_from_slice(src));
    }

    /// Where byte 0 is now.
    fn base(&self) -> u64 {
        self.base.load(Ordering::Relaxed)
    }

    /// The region goes on from a private copy of its bytes, and the memory
    /// it was registered on is the caller's again once this returns: every
    /// request that names the region (its STag, address and length stay)
    /// reads and writes the copy from now on, freed with the `Mr`. For a
    /// zero-copy send whose call must return before the engine has read
    /// all of it (its timeout passed): what is still queued goes out from
    /// the copy, as a copied send's would. Waits for closures on the
    /// region (`with_bytes`) to end; a region made here ([`crate::Pd::alloc`])
    /// or copied already is left as it is. Pages `mlock`ed are unlocked
    /// (the copy is not locked). `false`: the copy could not be allocated,
    /// and nothing changed.
    pub fn keep_private_copy(&self) -> bool {
        self.keep_private_copy_of(0..self.len, Access::LOCAL_READ)
    }

    /// [`Self::keep_private_copy`] of the bytes `keep` alone, taking
    /// `revoke` from the region's rights under the same lock: the rest of
    /// the copy is zeros, pages the kernel gives on first touch (a region
    /// whose requests name few of its bytes, or only write it, costs only
    /// those). For a caller that knows no request reads the bytes outside
    /// `keep`.
    pub fn keep_private_copy_of(&self, keep: std::ops::Range<usize>, revoke: Access) -> bool {
        // No closure reads the old memory past this point.
        let _only = self.borrow(true);
        let mut st = self.sh.inner.lock();
        let stag = self.stag;
        let Some(backing) = st.reg.backing_mut(stag) else {
            return true;
        };
        if backing.is_owned() {
            st.reg.revoke(stag, revoke);
            return true;
        }
        let Some(mut bytes) = zeroed(self.len) else {
            return false;
        };
        let keep = keep.start.min(self.len)..keep.end.min(self.len);
        if !keep.is_empty() {
            bytes[keep.clone()].copy_from_slice(&backing.bytes()[keep]);
        }
        let copy = Mem::owned(bytes);
        let base = copy.addr();
        // The caller memory's handle (not owned: dropping it frees nothing).
        drop(std::mem::replace(backing, copy));
        st.reg.revoke(stag, revoke);
        if self.locked.swap(false, Ordering::Relaxed) {
            sys::munlock(self.base() as *const u8, self.len);
        }
        self.base.store(base, Ordering::Relaxed);
        true
    }

    /// A copy of the region's bytes.
    pub fn to_vec(&self) -> Vec<u8> {
        self.with_bytes(<[u8]>::to_vec)
    }

    /// Locks the region's pages in RAM (`mlock`); they are unlocked when the
    /// `Mr` is dropped. Fails like `mlock` (e.g. `RLIMIT_MEMLOCK`).
    pub fn mlock(&self) -> Result<()> {
        if self.len == 0 || self.locked.load(Ordering::Relaxed) {
            return Ok(());
        }
        sys::mlock(self.base() as *const u8, self.len).map_err(Error::sys("mlock"))?;
        self.locked.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Whether [`Self::mlock`] succeeded.
    pub fn is_locked(&self) -> bool {
        self.locked.load(Ordering::Relaxed)
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        if *self.locked.get_mut() {
            sys::munlock(self.base() as *const u8, self.len);
        }
        self.sh.inner.lock().reg.deregister(self.stag);
    }
}

/// `len` zero bytes, allocated zeroed (pages the kernel gives on first
/// touch), or `None` if the allocator refuses (a copy that fails, not an
/// abort of the process).
fn zeroed(len: usize) -> Option<Box<[u8]>> {
    if len == 0 {
        return Some(Box::default());
    }
    let layout = std::alloc::Layout::array::<u8>(len).ok()?;
    // SAFETY: a layout of `len > 0` bytes; the pointer, if not null, is a
    // fresh zeroed allocation of that layout, owned by the box made here
    // (freed with `u8`'s layout of `len` bytes, the same).
    #[allow(unsafe_code)]
    unsafe {
        let p = std::alloc::alloc_zeroed(layout);
        (!p.is_null()).then(|| Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, len)))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use crate::{Access, Context, Progress};

    /// The end of a borrow wakes only counted waiters (`Inner::notify`):
    /// a thread blocked on a region another thread writes is counted while
    /// it waits, and gets the region when the writer's borrow ends; with
    /// nobody waiting, the count is 0 and ending a borrow wakes nobody.
    #[test]
    fn a_thread_waiting_for_a_region_is_counted_and_woken() {
        let ctx = Context::new(Progress::Caller).unwrap();
        let pd = ctx.alloc_pd();
        let m = pd.alloc(8, Access::LOCAL_WRITE);
        let inner = &m.sh.inner;
        assert_eq!(inner.cv_waiters(), 0);
        m.with_bytes(|_| {});
        assert_eq!(inner.cv_waiters(), 0, "a borrow alone counts no waiter");
        std::thread::scope(|s| {
            let reader = m.with_bytes_mut(|b| {
                b[0] = 7;
                let reader = s.spawn(|| m.with_bytes(|b| b[0]));
                // The reader must block on this exclusive borrow.
                let deadline = Instant::now() + std::time::Duration::from_secs(10);
                while inner.cv_waiters() == 0 {
                    assert!(Instant::now() < deadline, "the reader never waited");
                    std::thread::yield_now();
                }
                reader
            });
            assert_eq!(reader.join().unwrap(), 7);
        });
        assert_eq!(inner.cv_waiters(), 0);
    }

    /// A region on caller memory goes on from a private copy: its bytes
    /// as they were, the caller's memory changed and freed after it
    /// without the region seeing it; its key stays, and a second call (or
    /// one on a region made here) changes nothing.
    #[test]
    fn a_private_copy_leaves_the_callers_memory() {
        let ctx = Context::new(Progress::Caller).unwrap();
        let pd = ctx.alloc_pd();
        let mut buf = vec![7u8; 16];
        #[allow(unsafe_code)]
        // SAFETY: `buf` stays valid until the private copy is made.
        let m = unsafe { pd.register_raw(buf.as_mut_ptr(), buf.len(), Access::LOCAL_READ) };
        let key = m.lkey();
        assert!(m.keep_private_copy());
        buf.fill(0);
        drop(buf);
        assert_eq!(m.to_vec(), vec![7u8; 16]);
        assert_eq!(m.lkey(), key);
        assert!(m.keep_private_copy());
        assert_eq!(m.to_vec(), vec![7u8; 16]);
        let own = pd.alloc(4, Access::LOCAL_WRITE);
        own.write(0, &[1, 2, 3, 4]);
        assert!(own.keep_private_copy());
        assert_eq!(own.to_vec(), vec![1, 2, 3, 4]);
        // Of a prefix: the rest reads as zeros.
        let mut buf = vec![5u8; 8];
        #[allow(unsafe_code)]
        // SAFETY: `buf` stays valid until the private copy is made.
        let m = unsafe { pd.register_raw(buf.as_mut_ptr(), buf.len(), Access::LOCAL_READ) };
        assert!(m.keep_private_copy_of(2..5, Access::REMOTE_WRITE));
        drop(buf);
        assert_eq!(m.to_vec(), vec![0, 0, 5, 5, 5, 0, 0, 0]);
    }
}
