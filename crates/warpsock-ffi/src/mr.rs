//! Memory regions: caller memory or a buffer warpsock owns.

use std::ffi::c_void;

use warpsock_engine::{Access, Mr};

use crate::context::warpsock_pd;
use crate::error::{fail, warpsock_result};
use crate::ffi::{
    to_boxed_mut_ptr, try_out, try_out_buf, try_ref_from_ptr, try_slice, try_take, Castable,
};
use crate::panic::ffi_panic_boundary;
use crate::wr::warpsock_sge;

/// Access flag: local read (always granted; the value is 0).
pub const WARPSOCK_ACCESS_LOCAL_READ: u32 = 0;
/// Access flag: the local side may write (receives, RDMA Read sinks).
pub const WARPSOCK_ACCESS_LOCAL_WRITE: u32 = 1;
/// Access flag: the peer may RDMA Write into the region.
pub const WARPSOCK_ACCESS_REMOTE_WRITE: u32 = 2;
/// Access flag: the peer may RDMA Read from the region.
pub const WARPSOCK_ACCESS_REMOTE_READ: u32 = 4;
/// Access flag: the peer may invalidate the region's STag (Send with
/// Invalidate).
pub const WARPSOCK_ACCESS_REMOTE_INVALIDATE: u32 = 8;

/// A registered memory region. Its STag serves as both lkey and rkey.
/// Freeing it deregisters the region.
pub struct warpsock_mr {
    _private: [u8; 0],
}

impl Castable for warpsock_mr {
    type RustType = Mr;
}

fn access(flags: u32) -> Result<Access, warpsock_result> {
    let all = WARPSOCK_ACCESS_LOCAL_WRITE
        | WARPSOCK_ACCESS_REMOTE_WRITE
        | WARPSOCK_ACCESS_REMOTE_READ
        | WARPSOCK_ACCESS_REMOTE_INVALIDATE;
    if flags & !all != 0 {
        return Err(fail(
            warpsock_result::InvalidParameter,
            format_args!("access flags {flags:#x} have bits outside {all:#x}"),
        ));
    }
    Ok(Access(flags as u8))
}

/// Registers caller memory: `len` bytes at `addr`, with `access` a bitwise
/// OR of `WARPSOCK_ACCESS_*` flags. The region's address
/// (`warpsock_mr_addr`) is `addr`. On success stores the region in `*out`;
/// free it with `warpsock_mr_free` before freeing the memory.
///
/// As with `ibv_reg_mr`, the memory must stay valid for reads and writes
/// until the region is freed, and the application must not read or write
/// the parts an operation is using (posted and not yet completed, or
/// exposed to the peer by the rkey): the engine may access them from
/// another thread at any time.
///
/// Errors: `WARPSOCK_RESULT_NULL_PARAMETER` (`pd`, `out`, or `addr` with a
/// non-zero `len`), `WARPSOCK_RESULT_INVALID_PARAMETER` (unknown flags).
#[no_mangle]
pub extern "C" fn warpsock_mr_register(
    pd: *const warpsock_pd,
    addr: *mut c_void,
    len: usize,
    access_flags: u32,
    out: *mut *mut warpsock_mr,
) -> warpsock_result {
    ffi_panic_boundary! {
        let pd = try_ref_from_ptr!(pd);
        let out = try_out!(out);
        if addr.is_null() && len != 0 {
            return warpsock_result::NullParameter;
        }
        let access = match access(access_flags) {
            Ok(a) => a,
            Err(e) => return e,
        };
        // SAFETY: this function's documented contract is `Pd::register_raw`'s:
        // `len` bytes at `addr` stay valid and unaccessed by the application
        // where operations use them, until `warpsock_mr_free`.
        let mr = unsafe { pd.register_raw(addr.cast(), len, access) };
        out.write(to_boxed_mut_ptr(mr));
        warpsock_result::Ok
    }
}

/// Allocates a zeroed buffer of `len` bytes owned by warpsock and registers
/// it with `access` (`WARPSOCK_ACCESS_*` flags). Its bytes are reached with
/// `warpsock_mr_read` and `warpsock_mr_write`; freeing the region frees
/// the buffer. On success stores the region in `*out`.
#[no_mangle]
pub extern "C" fn warpsock_mr_alloc(
    pd: *const warpsock_pd,
    len: usize,
    access_flags: u32,
    out: *mut *mut warpsock_mr,
) -> warpsock_result {
    ffi_panic_boundary! {
        let pd = try_ref_from_ptr!(pd);
        let out = try_out!(out);
        let access = match access(access_flags) {
            Ok(a) => a,
            Err(e) => return e,
        };
        out.write(to_boxed_mut_ptr(pd.alloc(len, access)));
        warpsock_result::Ok
    }
}

/// Deregisters a region and frees the handle (and an owned buffer); NULL
/// is ignored. Caller memory may be freed after this returns.
#[no_mangle]
pub extern "C" fn warpsock_mr_free(mr: *mut warpsock_mr) {
    ffi_panic_boundary! {
        drop(try_take!(mr));
    }
}

/// The local key, for `warpsock_sge.lkey` (0 for NULL).
#[no_mangle]
pub extern "C" fn warpsock_mr_lkey(mr: *const warpsock_mr) -> u32 {
    ffi_panic_boundary! {
        try_ref_from_ptr!(mr).lkey()
    }
}

/// The remote key, to give the peer for RDMA Write and Read (0 for NULL).
#[no_mangle]
pub extern "C" fn warpsock_mr_rkey(mr: *const warpsock_mr) -> u32 {
    ffi_panic_boundary! {
        try_ref_from_ptr!(mr).rkey()
    }
}

/// The region's first address: the tagged offset of byte 0, used in
/// scatter/gather elements and by the peer as `remote_addr` (0 for NULL).
#[no_mangle]
pub extern "C" fn warpsock_mr_addr(mr: *const warpsock_mr) -> u64 {
    ffi_panic_boundary! {
        try_ref_from_ptr!(mr).addr()
    }
}

/// The region's length in bytes (0 for NULL).
#[no_mangle]
pub extern "C" fn warpsock_mr_len(mr: *const warpsock_mr) -> usize {
    ffi_panic_boundary! {
        try_ref_from_ptr!(mr).len()
    }
}

/// Builds a scatter/gather element for `len` bytes at `offset` into the
/// region and stores it in `*out`.
///
/// Errors: `WARPSOCK_RESULT_OUT_OF_BOUNDS` if the range leaves the region.
#[no_mangle]
pub extern "C" fn warpsock_mr_sge(
    mr: *const warpsock_mr,
    offset: usize,
    len: u32,
    out: *mut warpsock_sge,
) -> warpsock_result {
    ffi_panic_boundary! {
        let mr = try_ref_from_ptr!(mr);
        let out = try_out!(out);
        if let Err(e) = check_range(mr, offset, len as usize) {
            return e;
        }
        out.write(warpsock_sge::from(mr.sge(offset, len)));
        warpsock_result::Ok
    }
}

fn check_range(mr: &Mr, offset: usize, len: usize) -> Result<(), warpsock_result> {
    match offset.checked_add(len) {
        Some(end) if end <= mr.len() => Ok(()),
        _ => Err(fail(
            warpsock_result::OutOfBounds,
            format_args!(
                "{len} bytes at offset {offset} reach outside the region of {} bytes",
                mr.len()
            ),
        )),
    }
}

/// Copies `len` bytes at `offset` of the region into `dst`. Meant for
/// owned regions (`warpsock_mr_alloc`); do not read parts that operations
/// are in flight on.
///
/// Errors: `WARPSOCK_RESULT_OUT_OF_BOUNDS` if the range leaves the region
/// (nothing is copied).
#[no_mangle]
pub extern "C" fn warpsock_mr_read(
    mr: *const warpsock_mr,
    offset: usize,
    dst: *mut u8,
    len: usize,
) -> warpsock_result {
    ffi_panic_boundary! {
        let mr = try_ref_from_ptr!(mr);
        let mut dst = try_out_buf!(dst, len);
        if let Err(e) = check_range(mr, offset, len) {
            return e;
        }
        mr.with_bytes(|b| dst.copy_from(&b[offset..offset + len]));
        warpsock_result::Ok
    }
}

/// Copies `len` bytes from `src` into the region at `offset`. Meant for
/// owned regions (`warpsock_mr_alloc`); do not write parts that operations
/// are in flight on.
///
/// Errors: `WARPSOCK_RESULT_OUT_OF_BOUNDS` if the range leaves the region
/// (nothing is copied).
#[no_mangle]
pub extern "C" fn warpsock_mr_write(
    mr: *const warpsock_mr,
    offset: usize,
    src: *const u8,
    len: usize,
) -> warpsock_result {
    ffi_panic_boundary! {
        let mr = try_ref_from_ptr!(mr);
        let src = try_slice!(src, len);
        if let Err(e) = check_range(mr, offset, len) {
            return e;
        }
        mr.write(offset, src);
        warpsock_result::Ok
    }
}

/// Locks the region's pages in RAM (`mlock`); they are unlocked when the
/// region is freed.
///
/// Errors: `WARPSOCK_RESULT_MEMORY_LOCK` if `mlock` fails (e.g.
/// `RLIMIT_MEMLOCK`; the detail names the OS error).
#[no_mangle]
pub extern "C" fn warpsock_mr_mlock(mr: *const warpsock_mr) -> warpsock_result {
    ffi_panic_boundary! {
        match try_ref_from_ptr!(mr).mlock() {
            Ok(()) => warpsock_result::Ok,
            Err(e) => fail(warpsock_result::MemoryLock, format_args!("mlock failed: {e}")),
        }
    }
}
