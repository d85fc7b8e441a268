//! Protection domains and memory regions.
//!
//! A region is the program's own memory registered with the engine
//! (`Pd::register_raw_iova`): lkey = rkey = the STag. Access flags follow
//! the kernel's rules for every device (`ib_check_mr_access`): remote
//! write needs local write (else EINVAL); on-demand paging is not
//! supported (EOPNOTSUPP); flags in `IBV_ACCESS_OPTIONAL_RANGE` are
//! ignored. Regions with remote access may be invalidated by the peer's
//! Send with Invalidate, as on siw.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use warpsock_engine::{Access, Mr, Pd};

use crate::abi::*;
use crate::ctx::Ctx;
use crate::device::{ctx_is_ours, MAX_MR};
use crate::real::forward;
use crate::util::null;

/// A protection domain's shared part.
#[derive(Debug)]
pub struct PdShared {
    /// The engine's domain.
    pub eng: Pd,
    /// Regions and queue pairs in the domain (dealloc fails with EBUSY
    /// while any exist).
    pub users: AtomicUsize,
}

/// `struct ibv_pd` plus its state.
#[repr(C)]
pub struct PdObj {
    /// The ABI part.
    pub ibv: ibv_pd,
    /// The rest.
    pub sh: Arc<PdShared>,
}

impl PdObj {
    /// Ours, from the program's pointer.
    ///
    /// # Safety
    /// `pd` is a live PD of a `warpsock0` context.
    pub unsafe fn from_ibv<'a>(pd: *mut ibv_pd) -> &'a Self {
        // SAFETY: `ibv` is the first field of the repr(C) PdObj.
        unsafe { &*pd.cast::<Self>() }
    }
}

/// Whether a PD is ours.
///
/// # Safety
/// `pd` is NULL or live.
pub unsafe fn pd_is_ours(pd: *const ibv_pd) -> bool {
    // SAFETY: per the contract.
    !pd.is_null() && unsafe { ctx_is_ours((*pd).context) }
}

/// `struct ibv_mr` plus the engine registration.
#[repr(C)]
pub struct MrObj {
    /// The ABI part.
    pub ibv: ibv_mr,
    /// The engine's region (deregistered when dropped).
    pub eng: Mr,
    /// Its domain.
    pub pd: Arc<PdShared>,
}

static MR_COUNT: AtomicUsize = AtomicUsize::new(0);

/// `ibv_alloc_pd`.
#[no_mangle]
pub unsafe extern "C" fn ibv_alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd {
    // SAFETY: the program passes a live context.
    if unsafe { ctx_is_ours(ctx) } {
        // SAFETY: ours.
        let c = unsafe { Ctx::from_ibv(ctx) };
        let sh = Arc::new(PdShared {
            eng: c.sh.eng.alloc_pd(),
            users: AtomicUsize::new(0),
        });
        let obj = Box::new(PdObj {
            ibv: ibv_pd {
                context: ctx,
                handle: 0,
            },
            sh,
        });
        return Box::into_raw(obj).cast();
    }
    forward!(ibv_alloc_pd(ctx) : fn(*mut ibv_context) -> *mut ibv_pd, null(libc::ENODEV))
}

/// `ibv_dealloc_pd`: EBUSY while regions or queue pairs use it.
#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    // SAFETY: the program passes a live PD.
    if unsafe { pd_is_ours(pd) } {
        // SAFETY: ours.
        let o = unsafe { PdObj::from_ibv(pd) };
        if o.sh.users.load(Ordering::Acquire) != 0 {
            return libc::EBUSY;
        }
        // SAFETY: reclaims the Box made in ibv_alloc_pd.
        drop(unsafe { Box::from_raw(pd.cast::<PdObj>()) });
        return 0;
    }
    forward!(ibv_dealloc_pd(pd) : fn(*mut ibv_pd) -> c_int, libc::EINVAL)
}

/// Maps `ibv_access_flags` to the engine's rights, or the errno a device
/// gives for the combination.
pub fn access_of(flags: c_int) -> Result<Access, c_int> {
    let flags = flags & !IBV_ACCESS_OPTIONAL_RANGE;
    let known = IBV_ACCESS_LOCAL_WRITE
        | IBV_ACCESS_REMOTE_WRITE
        | IBV_ACCESS_REMOTE_READ
        | IBV_ACCESS_REMOTE_ATOMIC
        | IBV_ACCESS_MW_BIND
        | IBV_ACCESS_ZERO_BASED
        | IBV_ACCESS_ON_DEMAND
        | IBV_ACCESS_HUGETLB;
    if flags & !known != 0 {
        return Err(libc::EINVAL);
    }
    if flags & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC) != 0
        && flags & IBV_ACCESS_LOCAL_WRITE == 0
    {
        return Err(libc::EINVAL);
    }
    if flags & (IBV_ACCESS_ON_DEMAND | IBV_ACCESS_ZERO_BASED) != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    let mut a = Access::LOCAL_READ;
    if flags & IBV_ACCESS_LOCAL_WRITE != 0 {
        a = a | Access::LOCAL_WRITE;
    }
    if flags & IBV_ACCESS_REMOTE_WRITE != 0 {
        a = a | Access::REMOTE_WRITE;
    }
    if flags & IBV_ACCESS_REMOTE_READ != 0 {
        a = a | Access::REMOTE_READ;
    }
    if flags & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ) != 0 {
        a = a | Access::REMOTE_INVALIDATE;
    }
    Ok(a)
}

unsafe fn reg(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: ours (checked by the callers).
    let o = unsafe { PdObj::from_ibv(pd) };
    let acc = match access_of(access) {
        Ok(a) => a,
        Err(e) => return null(e),
    };
    if len == 0 || addr.is_null() {
        return null(libc::EINVAL);
    }
    if MR_COUNT.load(Ordering::Relaxed) >= MAX_MR as usize {
        return null(libc::ENOMEM);
    }
    // The memory must exist: a real device pins it (EFAULT otherwise).
    // SAFETY: a zero-length mincore-like probe: msync on the page range
    // fails with ENOMEM for unmapped memory and touches nothing.
    let page = 4096usize;
    let start = (addr as usize) & !(page - 1);
    let end = (addr as usize).saturating_add(len);
    let span = end.saturating_sub(start).div_ceil(page) * page;
    // SAFETY: msync only inspects the mappings of the range; an unmapped
    // range fails with ENOMEM and touches nothing.
    if unsafe { libc::msync(start as *mut c_void, span, libc::MS_ASYNC) } != 0 {
        return null(libc::EFAULT);
    }
    // SAFETY: the verbs contract (ibv_reg_mr): the memory stays valid and
    // the program leaves in-flight parts alone until deregistration.
    let mr = unsafe { o.sh.eng.register_raw_iova(addr.cast(), len, iova, acc) };
    o.sh.users.fetch_add(1, Ordering::AcqRel);
    MR_COUNT.fetch_add(1, Ordering::Relaxed);
    let key = mr.lkey();
    let obj = Box::new(MrObj {
        ibv: ibv_mr {
            // SAFETY: a live PD's context.
            context: unsafe { (*pd).context },
            pd,
            addr,
            length: len,
            handle: key,
            lkey: key,
            rkey: key,
        },
        eng: mr,
        pd: Arc::clone(&o.sh),
    });
    Box::into_raw(obj).cast()
}

/// `ibv_reg_mr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: the program passes a live PD.
    if unsafe { pd_is_ours(pd) } {
        // SAFETY: ours.
        return unsafe { reg(pd, addr, len, addr as u64, access) };
    }
    forward!(
        ibv_reg_mr(pd, addr, len, access) : fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr,
        null(libc::EINVAL)
    )
}

/// `ibv_reg_mr_iova2`: the region is addressed by `iova`.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    // SAFETY: the program passes a live PD.
    if unsafe { pd_is_ours(pd) } {
        // SAFETY: ours.
        return unsafe { reg(pd, addr, len, iova, access as c_int) };
    }
    forward!(
        ibv_reg_mr_iova2(pd, addr, len, iova, access)
            : fn(*mut ibv_pd, *mut c_void, usize, u64, c_uint) -> *mut ibv_mr,
        null(libc::EINVAL)
    )
}

/// `ibv_reg_mr_iova` (IBVERBS_1.7).
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: the program passes a live PD.
    if unsafe { pd_is_ours(pd) } {
        // SAFETY: ours.
        return unsafe { reg(pd, addr, len, iova, access) };
    }
    forward!(
        ibv_reg_mr_iova(pd, addr, len, iova, access)
            : fn(*mut ibv_pd, *mut c_void, usize, u64, c_int) -> *mut ibv_mr,
        null(libc::EINVAL)
    )
}

/// `ibv_dereg_mr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    // SAFETY: the program passes a live MR.
    if !mr.is_null() && unsafe { ctx_is_ours((*mr).context) } {
        // SAFETY: reclaims the Box made in `reg`.
        let o = unsafe { Box::from_raw(mr.cast::<MrObj>()) };
        o.pd.users.fetch_sub(1, Ordering::AcqRel);
        MR_COUNT.fetch_sub(1, Ordering::Relaxed);
        drop(o);
        return 0;
    }
    forward!(ibv_dereg_mr(mr) : fn(*mut ibv_mr) -> c_int, libc::EINVAL)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_rules_match_the_kernel() {
        assert_eq!(access_of(IBV_ACCESS_REMOTE_WRITE), Err(libc::EINVAL));
        assert_eq!(access_of(IBV_ACCESS_REMOTE_ATOMIC), Err(libc::EINVAL));
        assert_eq!(
            access_of(IBV_ACCESS_ON_DEMAND | IBV_ACCESS_LOCAL_WRITE),
            Err(libc::EOPNOTSUPP)
        );
        assert_eq!(access_of(1 << 12), Err(libc::EINVAL));
        let a = access_of(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | (1 << 20)).unwrap();
        assert!(a.contains(Access::LOCAL_WRITE | Access::REMOTE_READ));
        assert!(!a.contains(Access::REMOTE_WRITE));
        assert_eq!(access_of(0), Ok(Access::LOCAL_READ));
    }
}
