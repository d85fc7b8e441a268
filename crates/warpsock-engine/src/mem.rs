//! Memory behind registered regions: owned buffers, or caller memory given
//! as a raw pointer and a length.
//!
//! This is one of the two modules of the crate allowed to use `unsafe`
//! (the other is the private `sys` module of system calls): turning caller
//! memory into a slice.
//!
//! # Aliasing contract for caller memory
//!
//! As with verbs (`ibv_reg_mr`), registering caller memory hands the
//! engine the right to read and write it at any time until the region is
//! deregistered (its [`crate::Mr`] dropped): incoming RDMA Writes, Read
//! Responses and Sends are placed into it by the progress engine, and
//! outgoing Sends, Writes and Read Responses are gathered from it. The
//! caller must keep the memory allocated for that whole time and must not
//! read or write the parts that operations are in flight on (posted and not
//! yet completed, or exposed to the peer by its rkey). The engine only
//! touches the memory while it holds the context lock, through the slices
//! made here.
#![allow(unsafe_code)]

use std::ptr::NonNull;

use warpsock_proto::{Access, Backing};

use crate::verbs::{Mr, Pd};

impl Pd {
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
    /// any time (see the [module contract](self)).
    pub unsafe fn register_raw(&self, ptr: *mut u8, len: usize, access: Access) -> Mr {
        // SAFETY: forwarded from this function's contract.
        self.insert(Mem::Raw(unsafe { RawMem::new(ptr, len) }), access)
    }

    /// Like [`Self::register_raw`], but the region's address space starts
    /// at `iova` instead of `ptr` (`ibv_reg_mr_iova2`): byte `k` of the
    /// memory is tagged offset `iova + k`, in local SGEs and for the peer.
    ///
    /// # Safety
    ///
    /// As for [`Self::register_raw`].
    pub unsafe fn register_raw_iova(
        &self,
        ptr: *mut u8,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Mr {
        // SAFETY: forwarded from this function's contract.
        self.insert_at(Mem::Raw(unsafe { RawMem::new(ptr, len) }), iova, access)
    }
}

/// Caller memory: a pointer and a length.
#[derive(Debug)]
pub(crate) struct RawMem {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a RawMem is only dereferenced under the context lock (it lives in
// the Registry inside `Mutex<State>`); the caller promised in
// `Pd::register_raw` that the memory stays valid and is not accessed
// concurrently while registered, so moving the handle between threads is
// sound.
unsafe impl Send for RawMem {}

impl RawMem {
    /// # Safety
    /// `ptr..ptr+len` must be valid for reads and writes, and stay so and
    /// otherwise unaccessed (see the module doc) while registered.
    pub(crate) unsafe fn new(ptr: *mut u8, len: usize) -> Self {
        Self {
            ptr: NonNull::new(ptr).unwrap_or(NonNull::dangling()),
            len,
        }
    }
}

/// The backing of one region.
#[derive(Debug)]
pub(crate) enum Mem {
    /// A buffer the registry owns (heap memory never moves).
    Owned(Box<[u8]>),
    /// Caller memory.
    Raw(RawMem),
}

impl Mem {
    /// First byte's address.
    pub(crate) fn addr(&self) -> u64 {
        match self {
            Self::Owned(b) => b.as_ptr() as u64,
            Self::Raw(r) => r.ptr.as_ptr() as u64,
        }
    }
}

impl Backing for Mem {
    fn bytes(&self) -> &[u8] {
        match self {
            Self::Owned(b) => b,
            // SAFETY: `RawMem::new`'s contract: valid for `len` bytes and not
            // accessed by anyone else while registered; the returned borrow
            // is tied to `&self`, i.e. to the context lock.
            Self::Raw(r) => unsafe { std::slice::from_raw_parts(r.ptr.as_ptr(), r.len) },
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            Self::Owned(b) => b,
            // SAFETY: as for `bytes`; `&mut self` makes the borrow unique.
            Self::Raw(r) => unsafe { std::slice::from_raw_parts_mut(r.ptr.as_ptr(), r.len) },
        }
    }
}
