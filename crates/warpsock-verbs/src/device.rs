//! The device `warpsock0` next to the real ones: the device list,
//! opening and closing contexts, device/port/GID queries and
//! asynchronous events.
//!
//! The answers describe the engine's limits (see the constants): one
//! port, active, Ethernet link layer, no atomics, no SRQ, RDMA Read with
//! one scatter element, IRD/ORD up to 128 as Linux siw.

use std::ffi::{c_char, c_int};
use std::sync::OnceLock;

use crate::abi::*;
use crate::real::forward;
use crate::util::{copy_cstr, null, set_errno};

/// The device's name.
pub const NAME: &str = "warpsock0";
/// Deepest send or receive queue.
pub const MAX_QP_WR: u32 = 32_768;
/// Scatter/gather entries per send or receive.
pub const MAX_SGE: u32 = 6;
/// Scatter entries of an RDMA Read (the engine places a Read Response
/// into one region).
pub const MAX_SGE_RD: u32 = 1;
/// Largest inline send.
pub const MAX_INLINE: u32 = 256;
/// Largest CQ.
pub const MAX_CQE: u32 = 1 << 22;
/// Inbound / outbound RDMA Read depth (IRD/ORD), as Linux siw.
pub const MAX_RD_ATOM: u8 = 128;
/// Objects per context.
pub const MAX_QP: u32 = 16_384;
/// CQs per context.
pub const MAX_CQ: u32 = 16_384;
/// Memory regions per context.
pub const MAX_MR: u32 = 1 << 20;
/// Protection domains per context.
pub const MAX_PD: u32 = 65_536;
/// Vendor id ("WSK").
pub const VENDOR_ID: u32 = 0x0057_534b;
/// Node GUID (host order; reported big-endian).
pub const NODE_GUID: u64 = 0x0277_7370_636b_0000;

struct Device(ibv_device);
// SAFETY: written once at initialisation, read-only afterwards.
unsafe impl Send for Device {}
// SAFETY: as above.
unsafe impl Sync for Device {}

/// The `ibv_device` of `warpsock0` (lives for the whole process).
pub fn ptr() -> *mut ibv_device {
    static D: OnceLock<Box<Device>> = OnceLock::new();
    let d = D.get_or_init(|| {
        // SAFETY: all-zero is a valid ibv_device (NULL pointers, zero
        // integers, empty strings).
        let mut dev: ibv_device = unsafe { std::mem::zeroed() };
        dev.node_type = IBV_NODE_RNIC;
        dev.transport_type = IBV_TRANSPORT_IWARP;
        copy_cstr(&mut dev.name, NAME);
        copy_cstr(&mut dev.dev_name, "uverbs-warpsock0");
        copy_cstr(
            &mut dev.dev_path,
            "/sys/class/infiniband_verbs/uverbs-warpsock0",
        );
        copy_cstr(&mut dev.ibdev_path, "/sys/class/infiniband/warpsock0");
        Box::new(Device(dev))
    });
    std::ptr::addr_of!(d.0).cast_mut()
}

/// Whether `dev` is `warpsock0`.
pub fn is_ours(dev: *const ibv_device) -> bool {
    std::ptr::eq(dev, ptr())
}

/// Whether a context belongs to `warpsock0`.
///
/// # Safety
/// `ctx` is NULL or a live context.
pub unsafe fn ctx_is_ours(ctx: *const ibv_context) -> bool {
    // SAFETY: per the contract.
    !ctx.is_null() && is_ours(unsafe { (*ctx).device })
}

/// The GID: a locally administered MAC in the first six bytes, as siw
/// derives its GID from its netdev's MAC.
pub fn gid() -> ibv_gid {
    let mut raw = [0u8; 16];
    raw[..6].copy_from_slice(&[0x02, 0x77, 0x73, 0x6f, 0x63, 0x6b]);
    ibv_gid { raw }
}

/// `ibv_get_device_list`: the real devices, then `warpsock0`.
///
/// The returned array has two hidden slots after its NULL terminator:
/// the real library's list (freed with it in `ibv_free_device_list`).
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_list(num: *mut c_int) -> *mut *mut ibv_device {
    let mut n_real: c_int = 0;
    let real: *mut *mut ibv_device = forward!(
        ibv_get_device_list(&mut n_real) : fn(*mut c_int) -> *mut *mut ibv_device,
        std::ptr::null_mut()
    );
    let n_real = if real.is_null() {
        0
    } else {
        n_real.max(0) as usize
    };
    let total = n_real + 1;
    // SAFETY: calloc of total + 2 pointers (NULL terminator, real list).
    let list =
        unsafe { libc::calloc(total + 2, size_of::<*mut ibv_device>()) }.cast::<*mut ibv_device>();
    if list.is_null() {
        return null(libc::ENOMEM);
    }
    // SAFETY: `list` has total + 2 slots; `real` has n_real entries.
    unsafe {
        for i in 0..n_real {
            *list.add(i) = *real.add(i);
        }
        *list.add(n_real) = ptr();
        *list.add(total) = std::ptr::null_mut();
        *list.add(total + 1) = real.cast();
        if !num.is_null() {
            *num = total as c_int;
        }
    }
    list
}

/// `ibv_free_device_list`.
#[no_mangle]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    if list.is_null() {
        return;
    }
    // SAFETY: `list` came from our ibv_get_device_list: NULL-terminated,
    // with the real list in the slot after the terminator.
    unsafe {
        let mut i = 0;
        while !(*list.add(i)).is_null() {
            i += 1;
        }
        let real = *list.add(i + 1);
        if !real.is_null() {
            let real = real.cast::<*mut ibv_device>();
            forward!(ibv_free_device_list(real) : fn(*mut *mut ibv_device) -> (), ());
        }
        libc::free(list.cast());
    }
}

/// `ibv_get_device_name`.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_name(dev: *mut ibv_device) -> *const c_char {
    if is_ours(dev) {
        return c"warpsock0".as_ptr();
    }
    forward!(ibv_get_device_name(dev) : fn(*mut ibv_device) -> *const c_char, std::ptr::null())
}

/// `ibv_get_device_guid` (big-endian).
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_guid(dev: *mut ibv_device) -> u64 {
    if is_ours(dev) {
        return NODE_GUID.to_be();
    }
    forward!(ibv_get_device_guid(dev) : fn(*mut ibv_device) -> u64, 0)
}

/// `ibv_get_device_index`: `warpsock0` has no kernel index (-1).
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_index(dev: *mut ibv_device) -> c_int {
    if is_ours(dev) {
        return -1;
    }
    forward!(ibv_get_device_index(dev) : fn(*mut ibv_device) -> c_int, -1)
}

/// Fills `attr` with `warpsock0`'s attributes.
pub fn fill_device_attr(attr: &mut ibv_device_attr) {
    // SAFETY: all-zero is valid for this plain C struct.
    *attr = unsafe { std::mem::zeroed() };
    copy_cstr(&mut attr.fw_ver, env!("CARGO_PKG_VERSION"));
    attr.node_guid = NODE_GUID.to_be();
    attr.sys_image_guid = NODE_GUID.to_be();
    attr.max_mr_size = 1 << 40;
    attr.page_size_cap = !0xfff;
    attr.vendor_id = VENDOR_ID;
    attr.vendor_part_id = 1;
    attr.hw_ver = 0;
    attr.max_qp = MAX_QP as c_int;
    attr.max_qp_wr = MAX_QP_WR as c_int;
    attr.device_cap_flags = 0;
    attr.max_sge = MAX_SGE as c_int;
    attr.max_sge_rd = MAX_SGE_RD as c_int;
    attr.max_cq = MAX_CQ as c_int;
    attr.max_cqe = MAX_CQE as c_int;
    attr.max_mr = MAX_MR as c_int;
    attr.max_pd = MAX_PD as c_int;
    attr.max_qp_rd_atom = c_int::from(MAX_RD_ATOM);
    attr.max_res_rd_atom = c_int::from(MAX_RD_ATOM) * MAX_QP as c_int;
    attr.max_qp_init_rd_atom = c_int::from(MAX_RD_ATOM);
    attr.atomic_cap = IBV_ATOMIC_NONE;
    attr.max_srq = 0;
    attr.max_pkeys = 1;
    attr.phys_port_cnt = 1;
}

/// `ibv_query_device`.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_device(
    ctx: *mut ibv_context,
    attr: *mut ibv_device_attr,
) -> c_int {
    // SAFETY: the program passes a live context.
    if unsafe { ctx_is_ours(ctx) } {
        if attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: non-NULL out-pointer from the program.
        fill_device_attr(unsafe { &mut *attr });
        return 0;
    }
    forward!(
        ibv_query_device(ctx, attr) : fn(*mut ibv_context, *mut ibv_device_attr) -> c_int,
        libc::EINVAL
    )
}

fn fill_port_attr(attr: &mut ibv_port_attr) {
    // SAFETY: all-zero is valid for this plain C struct.
    *attr = unsafe { std::mem::zeroed() };
    attr.state = IBV_PORT_ACTIVE;
    attr.max_mtu = IBV_MTU_4096;
    attr.active_mtu = IBV_MTU_4096;
    attr.gid_tbl_len = 1;
    attr.max_msg_sz = u32::MAX;
    attr.pkey_tbl_len = 1;
    attr.active_width = 2; // 4X
    attr.active_speed = 32; // EDR: 25 Gb/s per lane
    attr.phys_state = 5; // LinkUp
    attr.link_layer = IBV_LINK_LAYER_ETHERNET;
}

/// `verbs_context.query_port` (what the inline `ibv_query_port` calls):
/// fills at most `len` bytes of the caller's `ibv_port_attr`.
pub unsafe extern "C" fn query_port_ex(
    ctx: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
    len: usize,
) -> c_int {
    let _ = ctx;
    if port != 1 || attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: all-zero is valid for this plain C struct.
    let mut a: ibv_port_attr = unsafe { std::mem::zeroed() };
    fill_port_attr(&mut a);
    let n = len.min(size_of::<ibv_port_attr>());
    // SAFETY: the caller's struct has at least `len` bytes.
    unsafe {
        std::ptr::copy_nonoverlapping((&a as *const ibv_port_attr).cast::<u8>(), attr.cast(), n);
    };
    0
}

/// `ibv_query_port` (the exported compat entry).
#[no_mangle]
pub unsafe extern "C" fn ibv_query_port(
    ctx: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    // SAFETY: the program passes a live context.
    if unsafe { ctx_is_ours(ctx) } {
        // The compat struct is a prefix of ibv_port_attr (up to link_layer).
        // SAFETY: forwarded arguments.
        return unsafe {
            query_port_ex(ctx, port, attr, std::mem::offset_of!(ibv_port_attr, flags))
        };
    }
    forward!(
        ibv_query_port(ctx, port, attr) : fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int,
        libc::EINVAL
    )
}

/// `ibv_query_gid`.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid(
    ctx: *mut ibv_context,
    port: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    // SAFETY: the program passes a live context.
    if unsafe { ctx_is_ours(ctx) } {
        if port != 1 || index != 0 || gid.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: non-NULL out-pointer.
        unsafe { *gid = self::gid() };
        return 0;
    }
    forward!(
        ibv_query_gid(ctx, port, index, gid) : fn(*mut ibv_context, u8, c_int, *mut ibv_gid) -> c_int,
        -1
    )
}

/// `_ibv_query_gid_ex` (behind the inline `ibv_query_gid_ex`).
#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_ex(
    ctx: *mut ibv_context,
    port: u32,
    index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    // SAFETY: the program passes a live context.
    if unsafe { ctx_is_ours(ctx) } {
        if port != 1 || entry.is_null() || flags != 0 {
            return libc::EINVAL;
        }
        if index != 0 {
            return libc::ENODATA;
        }
        if entry_size < size_of::<ibv_gid_entry>() {
            return libc::EINVAL;
        }
        // SAFETY: non-NULL, at least one entry's size.
        unsafe {
            *entry = ibv_gid_entry {
                gid: gid(),
                gid_index: 0,
                port_num: 1,
                gid_type: IBV_GID_TYPE_IB,
                ndev_ifindex: 0,
            };
        }
        return 0;
    }
    forward!(
        _ibv_query_gid_ex(ctx, port, index, entry, flags, entry_size)
            : fn(*mut ibv_context, u32, u32, *mut ibv_gid_entry, u32, usize) -> c_int,
        libc::EINVAL
    )
}

/// `_ibv_query_gid_table` (behind the inline `ibv_query_gid_table`):
/// one entry.
#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_table(
    ctx: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    // SAFETY: the program passes a live context.
    if unsafe { ctx_is_ours(ctx) } {
        if flags != 0 || entry_size < size_of::<ibv_gid_entry>() {
            return -(libc::EINVAL as isize);
        }
        if max == 0 || entries.is_null() {
            return -(libc::EINVAL as isize);
        }
        // SAFETY: room for at least one entry.
        return match unsafe { _ibv_query_gid_ex(ctx, 1, 0, entries, 0, entry_size) } {
            0 => 1,
            e => -(e as isize),
        };
    }
    forward!(
        _ibv_query_gid_table(ctx, entries, max, flags, entry_size)
            : fn(*mut ibv_context, *mut ibv_gid_entry, usize, u32, usize) -> isize,
        -(libc::EINVAL as isize)
    )
}

/// `ibv_query_gid_type` (rdma-core private, used by its own tools such as
/// `ibv_devinfo -v`).
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid_type(
    ctx: *mut ibv_context,
    port: u8,
    index: u32,
    kind: *mut u32,
) -> c_int {
    // SAFETY: the program passes a live context.
    if unsafe { ctx_is_ours(ctx) } {
        if port != 1 || index != 0 || kind.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: non-NULL out-pointer.
        unsafe { *kind = IBV_GID_TYPE_IB };
        return 0;
    }
    forward!(
        ibv_query_gid_type(ctx, port, index, kind) : fn(*mut ibv_context, u8, u32, *mut u32) -> c_int,
        libc::EINVAL
    )
}

/// `ibv_query_pkey`: one default P_Key (iWARP has none; rdma-core reports
/// 0xffff for iWARP devices).
#[no_mangle]
pub unsafe extern "C" fn ibv_query_pkey(
    ctx: *mut ibv_context,
    port: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    // SAFETY: the program passes a live context.
    if unsafe { ctx_is_ours(ctx) } {
        if port != 1 || index != 0 || pkey.is_null() {
            return -1;
        }
        // SAFETY: non-NULL out-pointer.
        unsafe { *pkey = 0xffffu16.to_be() };
        return 0;
    }
    forward!(
        ibv_query_pkey(ctx, port, index, pkey) : fn(*mut ibv_context, u8, c_int, *mut u16) -> c_int,
        -1
    )
}
