//! Route lookup for the connection manager, and
//! `rdma_getaddrinfo`/`rdma_freeaddrinfo`. (`sockaddr` conversions live in
//! [`crate::sock`], which this module builds on.)

use std::ffi::{c_char, c_int, CStr};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};

use libc::sockaddr_storage;

use crate::abi::IBV_QPT_RC;
use crate::abi_cm::*;
use crate::sock::{from_c, to_c};
use crate::util::set_errno;

/// The local address the kernel would send from to reach `dst`, or the
/// errno (see [`crate::sock::route_source`]).
pub fn route_source(dst: SocketAddr) -> Result<IpAddr, c_int> {
    crate::sock::route_source(dst).map_err(|e| e.raw_os_error().unwrap_or(libc::ENETUNREACH))
}

/// One `rdma_addrinfo` with its addresses, allocated with `malloc` so
/// that `rdma_freeaddrinfo` (ours) frees it.
unsafe fn alloc_info(
    flags: c_int,
    src: Option<SocketAddr>,
    dst: Option<SocketAddr>,
) -> *mut rdma_addrinfo {
    // SAFETY: calloc'd memory of the right sizes, filled before use.
    unsafe {
        let ai = libc::calloc(1, size_of::<rdma_addrinfo>()).cast::<rdma_addrinfo>();
        if ai.is_null() {
            return ai;
        }
        let family = src.or(dst).map_or(libc::AF_INET, |a| match a {
            SocketAddr::V4(_) => libc::AF_INET,
            SocketAddr::V6(_) => libc::AF_INET6,
        });
        (*ai).ai_flags = flags;
        (*ai).ai_family = family;
        (*ai).ai_qp_type = IBV_QPT_RC as c_int;
        (*ai).ai_port_space = RDMA_PS_TCP as c_int;
        for (a, slot, len) in [
            (src, &mut (*ai).ai_src_addr, &mut (*ai).ai_src_len),
            (dst, &mut (*ai).ai_dst_addr, &mut (*ai).ai_dst_len),
        ] {
            if let Some(a) = a {
                let st = libc::calloc(1, size_of::<sockaddr_storage>()).cast::<sockaddr_storage>();
                if st.is_null() {
                    continue;
                }
                *len = to_c(a, &mut *st);
                *slot = st.cast();
            }
        }
        ai
    }
}

fn resolve(
    node: Option<&str>,
    service: Option<&str>,
    passive: bool,
    family: c_int,
) -> Result<Vec<SocketAddr>, c_int> {
    let port: u16 = match service {
        None => 0,
        Some(s) => match s.parse() {
            Ok(p) => p,
            Err(_) => {
                // A service name: ask the system's services database.
                let c = std::ffi::CString::new(s).map_err(|_| libc::EINVAL)?;
                // SAFETY: NUL-terminated strings; getservbyname returns a
                // static entry or NULL.
                let e = unsafe { libc::getservbyname(c.as_ptr(), c"tcp".as_ptr()) };
                if e.is_null() {
                    return Err(libc::EINVAL);
                }
                // SAFETY: a live servent.
                u16::from_be(unsafe { (*e).s_port } as u16)
            }
        },
    };
    let addrs: Vec<SocketAddr> = match node {
        Some(n) => (n, port)
            .to_socket_addrs()
            .map_err(|_| libc::ENOENT)?
            .collect(),
        None if passive => vec![(Ipv4Addr::UNSPECIFIED, port).into()],
        None => vec![(Ipv4Addr::LOCALHOST, port).into()],
    };
    let addrs: Vec<SocketAddr> = addrs
        .into_iter()
        .filter(|a| match family {
            libc::AF_INET => a.is_ipv4(),
            libc::AF_INET6 => a.is_ipv6(),
            _ => true,
        })
        .collect();
    if addrs.is_empty() {
        return Err(libc::ENOENT);
    }
    Ok(addrs)
}

/// `rdma_getaddrinfo`, as librdmacm: the first address `node`/`service`
/// resolve to (the destination, or with `RAI_PASSIVE` the source, a
/// wildcard without a node), or the hints' addresses when both are NULL;
/// port space and QP type from the hints (default TCP/RC, iWARP's only
/// ones); a source address only from the hints. `RAI_NUMERICHOST`
/// refuses names. Returns 0, or -1 with errno.
#[no_mangle]
pub unsafe extern "C" fn rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    if res.is_null() || (node.is_null() && service.is_null() && hints.is_null()) {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: NUL-terminated strings from the program (or NULL).
    let (node, service) = unsafe {
        (
            (!node.is_null()).then(|| CStr::from_ptr(node).to_string_lossy().into_owned()),
            (!service.is_null()).then(|| CStr::from_ptr(service).to_string_lossy().into_owned()),
        )
    };
    let h: rdma_addrinfo = if hints.is_null() {
        // SAFETY: all-zero hints are valid.
        unsafe { std::mem::zeroed() }
    } else {
        // SAFETY: the program's hints (not NULL).
        unsafe { std::ptr::read(hints) }
    };
    if h.ai_family != 0 && h.ai_family != libc::AF_INET && h.ai_family != libc::AF_INET6 {
        set_errno(libc::EAFNOSUPPORT);
        return -1;
    }
    if h.ai_flags & RAI_NUMERICHOST != 0 {
        if let Some(n) = &node {
            if n.parse::<IpAddr>().is_err() {
                set_errno(libc::ENOENT);
                return -1;
            }
        }
    }
    let passive = h.ai_flags & RAI_PASSIVE != 0;
    let (mut src, mut dst) = (None, None);
    if node.is_some() || service.is_some() {
        match resolve(node.as_deref(), service.as_deref(), passive, h.ai_family) {
            Ok(a) if passive => src = a.first().copied(),
            Ok(a) => dst = a.first().copied(),
            Err(e) => {
                set_errno(e);
                return -1;
            }
        }
    } else if h.ai_dst_len > 0 {
        // SAFETY: the hints' address.
        dst = unsafe { from_c(h.ai_dst_addr) };
    }
    if src.is_none() && h.ai_src_len > 0 {
        // SAFETY: the hints' address.
        src = unsafe { from_c(h.ai_src_addr) };
    }
    // SAFETY: allocation helper above.
    let ai = unsafe {
        alloc_info(
            h.ai_flags & (RAI_PASSIVE | RAI_NUMERICHOST | RAI_FAMILY),
            src,
            dst,
        )
    };
    if ai.is_null() {
        set_errno(libc::ENOMEM);
        return -1;
    }
    // SAFETY: our allocation; the program's out-pointer.
    unsafe {
        if h.ai_port_space != 0 {
            (*ai).ai_port_space = h.ai_port_space;
        }
        if h.ai_qp_type != 0 {
            (*ai).ai_qp_type = h.ai_qp_type;
        }
        *res = ai;
    }
    0
}

/// `rdma_freeaddrinfo`.
#[no_mangle]
pub unsafe extern "C" fn rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    let mut p = res;
    while !p.is_null() {
        // SAFETY: a list made by rdma_getaddrinfo above (calloc'd parts).
        unsafe {
            let next = (*p).ai_next;
            libc::free((*p).ai_src_addr.cast());
            libc::free((*p).ai_dst_addr.cast());
            libc::free((*p).ai_src_canonname.cast());
            libc::free((*p).ai_dst_canonname.cast());
            libc::free((*p).ai_route);
            libc::free((*p).ai_connect);
            libc::free(p.cast());
            p = next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockaddr_round_trip() {
        for a in ["127.0.0.1:7174", "[::1]:18515", "10.1.2.3:0"] {
            let a: SocketAddr = a.parse().unwrap();
            // SAFETY: all-zero storage.
            let mut st: sockaddr_storage = unsafe { std::mem::zeroed() };
            to_c(a, &mut st);
            // SAFETY: a filled storage.
            let back = unsafe { from_c((&st as *const sockaddr_storage).cast()) };
            assert_eq!(back, Some(a));
        }
    }

    #[test]
    fn getaddrinfo_active_and_passive() {
        let mut res: *mut rdma_addrinfo = std::ptr::null_mut();
        // SAFETY: C strings and an out-pointer.
        let r = unsafe {
            rdma_getaddrinfo(
                c"127.0.0.1".as_ptr(),
                c"7174".as_ptr(),
                std::ptr::null(),
                &mut res,
            )
        };
        assert_eq!(r, 0);
        // SAFETY: a list we made.
        unsafe {
            assert_eq!(
                from_c((*res).ai_dst_addr),
                Some("127.0.0.1:7174".parse().unwrap())
            );
            assert!((*res).ai_src_addr.is_null());
            assert_eq!((*res).ai_port_space as u32, RDMA_PS_TCP);
            rdma_freeaddrinfo(res);
        }
        // SAFETY: all-zero hints are valid.
        let mut hints: rdma_addrinfo = unsafe { std::mem::zeroed() };
        hints.ai_flags = RAI_PASSIVE;
        // SAFETY: as above.
        let r = unsafe { rdma_getaddrinfo(std::ptr::null(), c"18515".as_ptr(), &hints, &mut res) };
        assert_eq!(r, 0);
        // SAFETY: a list we made.
        unsafe {
            assert!((*res).ai_dst_addr.is_null());
            assert_eq!(
                from_c((*res).ai_src_addr),
                Some("0.0.0.0:18515".parse().unwrap())
            );
            rdma_freeaddrinfo(res);
        }
    }
}
