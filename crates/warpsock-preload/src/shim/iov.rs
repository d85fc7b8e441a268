//! The program's scatter/gather buffers (`iovec` arrays from a msghdr).

use libc::iovec;
use smallvec::SmallVec;

/// The slices of one call's iovecs: inline for a few (a send allocates
/// nothing for the common one or two).
pub(crate) type Parts<'a> = SmallVec<[&'a [u8]; 4]>;

/// The iovecs as a slice (empty for a null pointer).
///
/// # Safety
/// `iov` must be null or point to `n` valid iovecs that outlive `'a`.
pub(crate) unsafe fn iovecs<'a>(iov: *const iovec, n: usize) -> &'a [iovec] {
    if iov.is_null() || n == 0 {
        return &[];
    }
    // SAFETY: per the contract.
    unsafe { std::slice::from_raw_parts(iov, n) }
}

/// Total length of an iovec array.
///
/// # Safety
/// As [`iovecs`].
pub(crate) unsafe fn len(iov: *const iovec, n: usize) -> usize {
    // SAFETY: per the contract.
    unsafe { iovecs(iov, n) }.iter().map(|v| v.iov_len).sum()
}

/// The bytes the iovecs describe, as slices (for gathering into a buffer).
///
/// # Safety
/// As [`iovecs`], and every iovec describes readable memory for `'a`.
pub(crate) unsafe fn parts<'a>(iov: *const iovec, n: usize) -> Parts<'a> {
    // SAFETY: per the contract.
    unsafe { iovecs(iov, n) }
        .iter()
        .filter(|v| v.iov_len > 0)
        // SAFETY: the iovec is readable for iov_len bytes (contract).
        .map(|v| unsafe { std::slice::from_raw_parts(v.iov_base.cast::<u8>(), v.iov_len) })
        .collect()
}

/// Copies `data` into the iovecs; returns the bytes copied.
///
/// # Safety
/// As [`iovecs`], and every iovec describes writable memory.
pub(crate) unsafe fn scatter(iov: *const iovec, n: usize, data: &[u8]) -> usize {
    let mut done = 0;
    // SAFETY: per the contract.
    for v in unsafe { iovecs(iov, n) } {
        if done == data.len() {
            break;
        }
        let k = v.iov_len.min(data.len() - done);
        // SAFETY: the iovec is writable for iov_len >= k bytes.
        unsafe { std::ptr::copy_nonoverlapping(data[done..].as_ptr(), v.iov_base.cast(), k) };
        done += k;
    }
    done
}
