//! The passive side against hostile or vanishing peers, through the C
//! calls: raw TCP clients that speak just enough MPA.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::ptr::null_mut;
use std::time::{Duration, Instant};

use super::listen::{backlog_for, descriptor_share};
use super::*;
use crate::cm::rdma_create_event_channel;

/// Bound on every wait here (a pass never waits it out).
const LIMIT: Duration = Duration::from_secs(20);

/// An MPA v1 Request with two bytes of private data.
const REQUEST: &[u8] = b"MPA ID Req Frame\x00\x01\x00\x02hi";

/// A listener on 127.0.0.1, port 0, with a channel of its own.
unsafe fn listener(backlog: c_int) -> (*mut rdma_event_channel, *mut rdma_cm_id, SocketAddr) {
    // SAFETY: the C calls on objects made here.
    unsafe {
        let ch = rdma_create_event_channel();
        assert!(!ch.is_null());
        let mut id = null_mut();
        assert_eq!(rdma_create_id(ch, &mut id, null_mut(), RDMA_PS_TCP), 0);
        let mut ss: libc::sockaddr_storage = std::mem::zeroed();
        to_c((std::net::Ipv4Addr::LOCALHOST, 0).into(), &mut ss);
        assert_eq!(
            rdma_bind_addr(id, (&mut ss as *mut libc::sockaddr_storage).cast()),
            0
        );
        assert_eq!(rdma_listen(id, backlog), 0);
        let addr = from_c((&(*id).route.addr.src as *const libc::sockaddr_storage).cast()).unwrap();
        (ch, id, addr)
    }
}

/// A raw client of the listener at `addr` whose Request has reached the
/// program's channel `ch` as an event (not yet taken).
fn requested(ch: *mut rdma_event_channel, addr: SocketAddr) -> TcpStream {
    let mut peer = TcpStream::connect(addr).unwrap();
    peer.write_all(REQUEST).unwrap();
    assert!(event_or_closed(ch, &peer), "closed before its request");
    peer
}

/// Waits for the channel to have an event (true), or for `watch` to
/// become readable first (false: the peer saw its connection closed).
fn event_or_closed(ch: *mut rdma_event_channel, watch: &TcpStream) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: a live channel.
    let chfd = unsafe { (*ch).fd };
    let mut p = [
        libc::pollfd {
            fd: chfd,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: watch.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    // SAFETY: two live pollfds.
    let n = unsafe { libc::poll(p.as_mut_ptr(), 2, LIMIT.as_millis() as c_int) };
    assert!(n > 0, "neither an event nor a close within {LIMIT:?}");
    p[0].revents != 0
}

/// Whether the peer closed or reset `s` within [`LIMIT`] (reading and
/// discarding whatever came first).
fn closed_by_peer(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(LIMIT)).unwrap();
    let mut buf = [0u8; 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

/// More silent connections than the listener reads Requests from at once
/// (each would hold its place for the whole MPA timeout, 10 s) do not lock
/// a good peer out: it gets its CONNECT_REQUEST and our Reject. Before,
/// connections beyond [`MAX_HANDSHAKES`] were closed at once while the
/// silent ones held every place, so a flood renewed every 10 s kept every
/// client out.
#[test]
fn silent_connections_beyond_the_handshake_cap_do_not_lock_a_good_peer_out() {
    // SAFETY: the C calls on objects made here.
    unsafe {
        let (ch, lid, addr) = listener(16);
        let silent: Vec<TcpStream> = (0..MAX_HANDSHAKES + 8)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        let mut good = TcpStream::connect(addr).unwrap();
        good.write_all(REQUEST).unwrap();
        assert!(
            event_or_closed(ch, &good),
            "the good peer's connection was closed behind {} silent ones",
            silent.len()
        );
        let mut ev = null_mut();
        assert_eq!(rdma_get_cm_event(ch, &mut ev), 0);
        assert_eq!((*ev).event, RDMA_CM_EVENT_CONNECT_REQUEST);
        let child = (*ev).id;
        let dst = from_c((&(*child).route.addr.dst as *const libc::sockaddr_storage).cast());
        assert_eq!(dst, Some(good.local_addr().unwrap()));
        let pd = &(*ev).param.conn;
        assert_eq!(
            std::slice::from_raw_parts(pd.private_data.cast::<u8>(), pd.private_data_len.into()),
            b"hi"
        );
        assert_eq!(rdma_reject(child, null_mut(), 0), 0);
        let mut reply = [0u8; 20];
        good.set_read_timeout(Some(LIMIT)).unwrap();
        good.read_exact(&mut reply).unwrap();
        assert_eq!(&reply[..16], b"MPA ID Rep Frame");
        assert_ne!(reply[16] & 0x20, 0, "the Reject bit");
        assert_eq!(rdma_ack_cm_event(ev), 0);
        assert_eq!(rdma_destroy_id(child), 0);
        let t0 = Instant::now();
        assert_eq!(rdma_destroy_id(lid), 0);
        assert!(
            t0.elapsed() < LIMIT,
            "destroying the listener took {:?}",
            t0.elapsed()
        );
        rdma_destroy_event_channel(ch);
        drop(silent);
    }
}

/// A CONNECT_REQUEST the program never received goes with the listener:
/// the new id it carried is destroyed and its connection closed, as
/// librdmacm's kernel side destroys the request's id with the listener
/// (`ucma_cleanup_ctx_events`). Before, the id and its socket were leaked
/// and the peer waited for a Reply forever.
#[test]
fn an_undelivered_request_is_closed_with_its_listener() {
    // SAFETY: the C calls on objects made here.
    unsafe {
        let (ch, lid, addr) = listener(16);
        let mut peer = requested(ch, addr);
        assert_eq!(rdma_destroy_id(lid), 0);
        assert!(
            closed_by_peer(&mut peer),
            "the request's connection outlived its listener"
        );
        rdma_destroy_event_channel(ch);
    }
}

/// The same when the program destroys the listener's channel first: the
/// undelivered request's id goes with the channel. (A request arriving
/// after that is closed too — `offer`'s push finds no queue — but a test
/// of it would race with the other tests here: a destroyed channel's
/// allocation is reused by the next channel made, and the listener's
/// stale pointer is that channel.)
#[test]
fn an_undelivered_request_is_closed_with_its_channel() {
    // SAFETY: the C calls on objects made here.
    unsafe {
        let (ch, lid, addr) = listener(16);
        let mut first = requested(ch, addr);
        rdma_destroy_event_channel(ch);
        assert!(
            closed_by_peer(&mut first),
            "the undelivered request outlived its channel"
        );
        assert_eq!(rdma_destroy_id(lid), 0);
    }
}

/// A peer that closes after its Request, before the program answers: the
/// program still gets the CONNECT_REQUEST, and its accept or reject fails
/// or succeeds without hanging; the request's place in the backlog is
/// given back either way.
#[test]
fn a_peer_gone_before_the_answer_frees_its_backlog_place() {
    // SAFETY: the C calls on objects made here.
    unsafe {
        let (ch, lid, addr) = listener(1);
        for round in 0..3 {
            let peer = TcpStream::connect(addr).unwrap();
            (&peer).write_all(REQUEST).unwrap();
            assert!(event_or_closed(ch, &peer), "round {round}: closed");
            peer.shutdown(Shutdown::Both).unwrap();
            drop(peer);
            let mut ev = null_mut();
            assert_eq!(rdma_get_cm_event(ch, &mut ev), 0);
            assert_eq!((*ev).event, RDMA_CM_EVENT_CONNECT_REQUEST);
            let child = (*ev).id;
            let _ = rdma_reject(child, null_mut(), 0);
            assert_eq!(rdma_ack_cm_event(ev), 0);
            assert_eq!(rdma_destroy_id(child), 0);
        }
        assert_eq!(rdma_destroy_id(lid), 0);
        rdma_destroy_event_channel(ch);
    }
}

/// `rdma_listen`'s backlog — the requests left waiting for the program's
/// answer, each holding a connection — is capped as the kernel's ucma
/// caps it (`net.rdma_ucm.max_backlog`, 1024), whatever the program asks.
#[test]
fn the_backlog_is_capped() {
    // SAFETY: the C calls on objects made here.
    unsafe {
        let most = MAX_BACKLOG.min(descriptor_share());
        for (asked, got) in [(c_int::MAX, most), (0, most), (-1, most), (5, 5)] {
            let (ch, lid, _) = listener(asked);
            assert_eq!(lock(&shared(lid).st).backlog, got, "asked {asked}");
            assert_eq!(rdma_destroy_id(lid), 0);
            rdma_destroy_event_channel(ch);
        }
    }
    // Never more than a quarter of the descriptors the process may open
    // (helper 82: each waiting request is a socket of the process).
    assert_eq!(backlog_for(0, 256), 256);
    assert_eq!(backlog_for(c_int::MAX, 256), 256);
    assert_eq!(backlog_for(100, 256), 100);
    assert_eq!(backlog_for(5, 1), 1);
    assert_eq!(backlog_for(0, 4096), MAX_BACKLOG);
}

/// A Request whose private data a CONNECT_REQUEST cannot carry whole (its
/// length is a `u8`; MPA allows 512 bytes) is closed, as siw refuses
/// more than 256, and the next peer is served. Before, the program got
/// the first 255 bytes as if they were all.
#[test]
fn private_data_too_long_for_the_event_is_refused() {
    // SAFETY: the C calls on objects made here.
    unsafe {
        let (ch, lid, addr) = listener(16);
        let mut long = TcpStream::connect(addr).unwrap();
        let mut req = b"MPA ID Req Frame\x00\x01".to_vec();
        req.extend_from_slice(&300u16.to_be_bytes());
        req.extend_from_slice(&[0x41; 300]);
        long.write_all(&req).unwrap();
        assert!(
            closed_by_peer(&mut long),
            "a request with 300 bytes of private data was kept"
        );
        let good = TcpStream::connect(addr).unwrap();
        (&good).write_all(REQUEST).unwrap();
        assert!(event_or_closed(ch, &good), "the good peer was closed");
        let mut ev = null_mut();
        assert_eq!(rdma_get_cm_event(ch, &mut ev), 0);
        assert_eq!((*ev).event, RDMA_CM_EVENT_CONNECT_REQUEST);
        let child = (*ev).id;
        let dst = from_c((&(*child).route.addr.dst as *const libc::sockaddr_storage).cast());
        assert_eq!(dst, Some(good.local_addr().unwrap()), "the first event");
        assert_eq!(rdma_reject(child, null_mut(), 0), 0);
        assert_eq!(rdma_ack_cm_event(ev), 0);
        assert_eq!(rdma_destroy_id(child), 0);
        assert_eq!(rdma_destroy_id(lid), 0);
        rdma_destroy_event_channel(ch);
    }
}

/// An `rdma_accept` or `rdma_reject` that fails on its own parameters
/// (private data longer than the limit) leaves the request to answer
/// again: the peer gets the Reject that follows. Before, the failed call
/// had already taken the request, closed the peer's connection, and the
/// next answer failed with EINVAL.
#[test]
fn an_answer_with_bad_parameters_leaves_the_request() {
    // SAFETY: the C calls on objects made here.
    unsafe {
        let (ch, lid, addr) = listener(16);
        let mut peer = requested(ch, addr);
        let mut ev = null_mut();
        assert_eq!(rdma_get_cm_event(ch, &mut ev), 0);
        let child = (*ev).id;
        let long = [0u8; 255];
        let mut param: rdma_conn_param = std::mem::zeroed();
        param.private_data = long.as_ptr().cast();
        param.private_data_len = 255;
        assert_eq!(rdma_accept(child, &mut param), -1);
        assert_eq!(rdma_reject(child, long.as_ptr().cast(), 255), -1);
        assert_eq!(rdma_reject(child, b"no".as_ptr().cast(), 2), 0);
        let mut reply = [0u8; 22];
        peer.set_read_timeout(Some(LIMIT)).unwrap();
        peer.read_exact(&mut reply).unwrap();
        assert_eq!(&reply[..16], b"MPA ID Rep Frame");
        assert_ne!(reply[16] & 0x20, 0, "the Reject bit");
        assert_eq!(&reply[20..], b"no");
        assert_eq!(rdma_ack_cm_event(ev), 0);
        assert_eq!(rdma_destroy_id(child), 0);
        assert_eq!(rdma_destroy_id(lid), 0);
        rdma_destroy_event_channel(ch);
    }
}
