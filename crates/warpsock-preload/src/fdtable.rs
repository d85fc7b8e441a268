//! Which descriptors the layer manages.
//!
//! Two bitmaps answer the hot question "is this descriptor ours?" with one
//! relaxed atomic load, so calls on every other descriptor (files, pipes, the
//! program's TCP sockets) pass straight through:
//! - `managed`: the application's descriptor number refers to an offloaded
//!   UDP socket; the map holds its state.
//! - `candidate`: a kernel UDP socket (from `socket()`) that may become
//!   offloaded when it binds, connects or sends to an eligible address.
//!
//! Descriptors at or above [`BITS`] are looked up in the map (and never
//! become candidates).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockWriteGuard};

use libc::c_int;

use crate::sock::Sock;

/// Descriptors below this are tracked in the bitmaps.
pub(crate) const BITS: usize = 1 << 16;
const WORDS: usize = BITS / 64;

struct Bitmap([AtomicU64; WORDS]);

impl Bitmap {
    const fn new() -> Self {
        Self([const { AtomicU64::new(0) }; WORDS])
    }
    fn get(&self, fd: c_int) -> bool {
        let i = fd as usize;
        i < BITS && self.0[i / 64].load(Ordering::Relaxed) & (1 << (i % 64)) != 0
    }
    fn set(&self, fd: c_int, on: bool) {
        let i = fd as usize;
        if fd < 0 || i >= BITS {
            return;
        }
        if on {
            self.0[i / 64].fetch_or(1 << (i % 64), Ordering::Relaxed);
        } else {
            self.0[i / 64].fetch_and(!(1 << (i % 64)), Ordering::Relaxed);
        }
    }
}

static MANAGED: Bitmap = Bitmap::new();
static CANDIDATE: Bitmap = Bitmap::new();
static HIGH: AtomicU64 = AtomicU64::new(0);
static MAP: RwLock<Map> = RwLock::new(None);

/// Whether `fd` may be managed (cheap; may say yes for high descriptors).
#[inline]
pub(crate) fn maybe_managed(fd: c_int) -> bool {
    if fd < 0 {
        return false;
    }
    if (fd as usize) < BITS {
        MANAGED.get(fd)
    } else {
        HIGH.load(Ordering::Relaxed) != 0
    }
}

/// Whether `fd` is an unmanaged UDP socket that may become managed.
#[inline]
pub(crate) fn is_candidate(fd: c_int) -> bool {
    CANDIDATE.get(fd)
}

/// Marks or unmarks `fd` as a candidate.
pub(crate) fn set_candidate(fd: c_int, on: bool) {
    CANDIDATE.set(fd, on);
}

/// The state of managed descriptor `fd`.
pub(crate) fn get(fd: c_int) -> Option<Arc<Sock>> {
    if !maybe_managed(fd) {
        return None;
    }
    let m = MAP.read().unwrap_or_else(|e| e.into_inner());
    m.as_ref()?.get(&fd).cloned()
}

/// Records that `fd` refers to `sock`; returns the state `fd` referred to
/// before (which the caller must release).
pub(crate) fn insert(fd: c_int, sock: Arc<Sock>) -> Option<Arc<Sock>> {
    sock.add_ref();
    let mut m = MAP.write().unwrap_or_else(|e| e.into_inner());
    let old = m.get_or_insert_with(HashMap::new).insert(fd, sock);
    MANAGED.set(fd, true);
    CANDIDATE.set(fd, false);
    if fd as usize >= BITS {
        HIGH.fetch_add(1, Ordering::Relaxed);
    }
    old
}

/// Forgets `fd`; returns its state (whose reference the caller releases).
pub(crate) fn remove(fd: c_int) -> Option<Arc<Sock>> {
    if !maybe_managed(fd) {
        return None;
    }
    let mut m = MAP.write().unwrap_or_else(|e| e.into_inner());
    let old = m.as_mut()?.remove(&fd);
    if old.is_some() {
        MANAGED.set(fd, false);
        if fd as usize >= BITS {
            HIGH.fetch_sub(1, Ordering::Relaxed);
        }
    }
    old
}

/// Every managed descriptor and its state.
pub(crate) fn all() -> Vec<(c_int, Arc<Sock>)> {
    let m = MAP.read().unwrap_or_else(|e| e.into_inner());
    m.as_ref()
        .map(|m| m.iter().map(|(k, v)| (*k, v.clone())).collect())
        .unwrap_or_default()
}

type Map = Option<HashMap<c_int, Arc<Sock>>>;

thread_local! {
    static FORK_GUARD: std::cell::RefCell<Option<RwLockWriteGuard<'static, Map>>> =
        const { std::cell::RefCell::new(None) };
}

/// pthread_atfork "prepare": hold the map lock across fork so the child gets
/// a consistent copy.
pub(crate) fn fork_prepare() {
    let g = MAP.write().unwrap_or_else(|e| e.into_inner());
    FORK_GUARD.with(|f| *f.borrow_mut() = Some(g));
}

/// pthread_atfork "parent"/"child": release the lock taken in prepare.
pub(crate) fn fork_release() {
    FORK_GUARD.with(|f| drop(f.borrow_mut().take()));
}
