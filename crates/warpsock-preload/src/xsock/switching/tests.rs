//! A connection switching in the background, on loopback: the program's
//! side through the descriptor table (as the interposer reaches it), the
//! peer's through the xsock crate (no preload).

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsFd, IntoRawFd};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use warpsock_xsock::io::{switch_fd_as, Options, XSocket};
use warpsock_xsock::switch::Limits;
use warpsock_xsock::Role;

use super::super::{prepare, SOL_WARPSOCK, WARPSOCK_CRC, WARPSOCK_DDP_MODE};
use super::slot::Slot;
use super::*;
use crate::shim::sys::errno;

/// The tests share the count of switches under way (`slot`): one at a time.
pub(super) static SERIAL: Mutex<()> = Mutex::new(());

/// Far past any wait of these tests' switches.
const HUNG: Duration = Duration::from_secs(20);

/// Options whose waits for the peer are `t` (mark) and `2 t` (Request).
fn options(t: Duration) -> &'static Options {
    Box::leak(Box::new(Options {
        limits: Limits::with_timeout(t),
        ..Options::default()
    }))
}

/// A loopback connection: the program's accepted descriptor and the
/// peer's stream.
fn accepted() -> (c_int, TcpStream) {
    accepted_from([127, 0, 0, 1])
}

/// [`accepted`], the peer's end bound to `src` (a loopback address).
pub(super) fn accepted_from(src: [u8; 4]) -> (c_int, TcpStream) {
    use std::os::fd::FromRawFd;
    let l = TcpListener::bind("127.0.0.1:0").expect("a listener");
    let (to, to_len) = sys::addr_to_raw(&l.local_addr().expect("its address"));
    let (from, from_len) = sys::addr_to_raw(&(std::net::Ipv4Addr::from(src), 0).into());
    let raw = |a: &libc::sockaddr_storage| (a as *const libc::sockaddr_storage).cast();
    // SAFETY: a new socket of ours, bound and connected with addresses
    // from the stack, then owned by the stream.
    let c = unsafe {
        let c = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(c >= 0 && libc::bind(c, raw(&from), from_len) == 0);
        assert_eq!(libc::connect(c, raw(&to), to_len), 0, "a connection");
        TcpStream::from_raw_fd(c)
    };
    let (p, _) = l.accept().expect("its peer");
    (p.into_raw_fd(), c)
}

/// Starts the background switch of `fd` as the responder.
fn start_responder(fd: c_int, opts: &'static Options) {
    start(fd, opts, false, (Some(Role::Responder), false), prepare)
        .unwrap_or_else(|e| panic!("start: errno {e}"));
}

fn table(fd: c_int) -> Arc<dyn Socket> {
    fdtable::get(fd).expect("the descriptor is managed")
}

fn recv(s: &dyn Socket, buf: &mut [u8], flags: c_int) -> isize {
    // SAFETY: `buf` is ours and writable.
    unsafe { s.recv_one(buf.as_mut_ptr().cast(), buf.len(), flags) }
}

fn set_rcvtimeo(s: &dyn Socket, t: Duration) -> c_int {
    let tv = libc::timeval {
        tv_sec: t.as_secs() as libc::time_t,
        tv_usec: t.subsec_micros() as libc::suseconds_t,
    };
    s.setsockopt(
        libc::SOL_SOCKET,
        libc::SO_RCVTIMEO,
        (&tv as *const libc::timeval).cast(),
        size_of::<libc::timeval>() as socklen_t,
    )
}

fn rcvtimeo_on_kernel(fd: c_int) -> Duration {
    sys::get_timeo(fd, libc::SO_RCVTIMEO).unwrap_or_default()
}

fn int_opt(s: &dyn Socket, level: c_int, name: c_int) -> c_int {
    let mut v: c_int = -1;
    let mut n = size_of::<c_int>() as socklen_t;
    let r = s.getsockopt(level, name, (&mut v as *mut c_int).cast(), &mut n);
    assert_eq!(r, 0, "getsockopt({level}, {name}): {}", errno());
    v
}

/// Waits (at most [`HUNG`]) until `fd` is no managed number any more:
/// the switch ended plain.
fn wait_plain(fd: c_int) {
    let deadline = Instant::now() + HUNG;
    while fdtable::get(fd).is_some() {
        assert!(
            Instant::now() < deadline,
            "the switch did not end: still managed"
        );
        std::thread::yield_now();
    }
}

/// Forgets `fd` as the program's `close` does (the table first, then the
/// number, then the reference).
fn close_as_the_program(fd: c_int) {
    if let Ok(Some(s)) = fdtable::remove(fd) {
        sys::close(fd);
        s.release();
    }
}

/// Closes `fd`, managed or not, as the interposed `close` does with the
/// number's epoll registrations (`epollcarry::before_close`, whose call
/// from the interposer `shim::epollcarry::closing`'s tests see).
fn close_with_its_registrations(fd: c_int) {
    match fdtable::remove(fd) {
        Ok(Some(s)) => {
            epollcarry::before_close(fd, true);
            sys::close(fd);
            s.release();
        }
        _ => {
            epollcarry::before_close(fd, false);
            sys::close(fd);
        }
    }
}

/// `start` returns at once; meanwhile a non-blocking receive fails with
/// `EAGAIN` and an option the switch moves is kept off the TCP socket. A
/// blocking receive made during the switch waits for it and takes the
/// peer's first bytes from the DDP socket that then names the descriptor,
/// which has the option.
#[test]
fn a_switch_in_the_background_ends_in_a_ddp_socket_with_the_options_set_meanwhile() {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let (fd, c) = accepted();
    let opts = options(Duration::from_secs(5));
    let t0 = Instant::now();
    start_responder(fd, opts);
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "start waited on the peer"
    );
    let sw = table(fd);
    let mut b = [0u8; 8];
    assert_eq!(recv(&*sw, &mut b, libc::MSG_DONTWAIT), -1);
    assert_eq!(errno(), libc::EAGAIN);
    assert_eq!(set_rcvtimeo(&*sw, Duration::from_millis(1500)), 0);
    assert_eq!(
        rcvtimeo_on_kernel(sw.kernel_fd()),
        Duration::ZERO,
        "a moved option reached the TCP socket during the switch"
    );
    // Message mode and a shutdown of the sending side, asked meanwhile:
    // at once, made on the outcome.
    let one: c_int = 1;
    let t1 = Instant::now();
    assert_eq!(
        sw.setsockopt(
            SOL_WARPSOCK,
            WARPSOCK_MSG_MODE,
            (&one as *const c_int).cast(),
            size_of::<c_int>() as socklen_t
        ),
        0
    );
    assert_eq!(int_opt(&*sw, SOL_WARPSOCK, WARPSOCK_MSG_MODE), 1);
    assert_eq!(sw.shutdown(libc::SHUT_WR), 0);
    assert!(t1.elapsed() < Duration::from_secs(1), "waited for the peer");
    let peer = std::thread::spawn(move || {
        let x: XSocket = switch_fd_as(c.as_fd(), opts, Some(Role::Initiator))
            .unwrap_or_else(|e| panic!("the peer's switch: {e}"));
        assert!(matches!(x.send(b"hi", false, Some(HUNG)), Ok(2)));
        (x, c)
    });
    // The extended calls' look-up waits for the outcome.
    assert!(
        super::super::sock::lookup(fd).is_ok(),
        "no DDP socket by its number"
    );
    // Blocking: waits for the switch, then reads in its outcome.
    assert_eq!(recv(&*sw, &mut b, 0), 2);
    assert_eq!(&b[..2], b"hi");
    // The outcome is known to calls before the numbers name it.
    let deadline = Instant::now() + HUNG;
    let now = loop {
        let now = table(fd);
        if !Arc::ptr_eq(&now, &sw) {
            break now;
        }
        assert!(
            Instant::now() < deadline,
            "the descriptor still names the switching socket"
        );
        std::thread::yield_now();
    };
    assert_eq!(int_opt(&*now, SOL_WARPSOCK, WARPSOCK_DDP_MODE), 1);
    assert_eq!(int_opt(&*now, SOL_WARPSOCK, WARPSOCK_MSG_MODE), 1);
    let (x, _c) = peer.join().expect("the peer");
    // The shutdown: the peer reads the end of the stream.
    let mut e = [0u8; 4];
    let end = x.recv(&mut e, warpsock_xsock::io::RecvFlags::default(), Some(HUNG));
    assert!(matches!(end, Ok((0, _))), "the peer read {end:?}");
    // The option set during the switch: the DDP socket's receive times
    // out after it (on a thread: without it, the receive never returns).
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = Arc::clone(&now);
    std::thread::spawn(move || {
        let mut b = [0u8; 8];
        let t1 = Instant::now();
        let r = recv(&*reader, &mut b, 0);
        let _ = tx.send((r, errno(), t1.elapsed()));
    });
    let (r, e, waited) = rx
        .recv_timeout(HUNG)
        .expect("the receive has no timeout: the option was lost");
    assert_eq!((r, e), (-1, libc::EAGAIN), "a timed-out receive");
    assert!(waited >= Duration::from_millis(1400), "{waited:?}");
    drop((sw, now));
    close_as_the_program(fd);
}

/// A peer without warpsock that sends first: the switch ends at once, the
/// descriptor delivers its bytes. A plain one that sends nothing: after
/// the wait for its mark the descriptor is the TCP socket again, with the
/// option set during the switch on it.
#[test]
fn a_peer_that_does_not_switch_leaves_its_bytes_and_then_the_tcp_socket() {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let opts = options(Duration::from_millis(300));
    // Sends first.
    let (fd, mut c) = accepted();
    start_responder(fd, opts);
    std::io::Write::write_all(&mut c, b"GET /").unwrap();
    let sw = table(fd);
    let mut b = [0u8; 8];
    assert_eq!(recv(&*sw, &mut b, 0), 5);
    assert_eq!(&b[..5], b"GET /");
    drop(sw);
    close_as_the_program(fd);
    // Silent.
    let (fd, _c) = accepted();
    start_responder(fd, opts);
    let sw = table(fd);
    assert_eq!(set_rcvtimeo(&*sw, Duration::from_millis(700)), 0);
    // Waits for the end: plain.
    assert_eq!(int_opt(&*sw, SOL_WARPSOCK, WARPSOCK_DDP_MODE), 0);
    wait_plain(fd);
    // A change of O_NONBLOCK that reached the switching socket after its
    // end is the outcome's.
    sw.set_nonblocking(true);
    // SAFETY: a query of our descriptor.
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    assert_ne!(fl & libc::O_NONBLOCK, 0, "the late O_NONBLOCK was lost");
    drop(sw);
    assert_eq!(
        sys::get_int(fd, libc::SOL_SOCKET, libc::SO_DOMAIN),
        Some(libc::AF_INET),
        "the number is not the TCP socket"
    );
    assert_eq!(rcvtimeo_on_kernel(fd), Duration::from_millis(700));
    sys::close(fd);
}

/// Every descriptor closed while the switch waits: the thread ends it, and
/// the peer reads the end of the stream (no connection left behind).
#[test]
fn a_connection_closed_while_switching_is_closed_when_the_switch_ends() {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let (fd, mut c) = accepted();
    start_responder(fd, options(Duration::from_millis(300)));
    close_as_the_program(fd);
    c.set_read_timeout(Some(HUNG)).unwrap();
    let mut b = [0u8; 8];
    assert_eq!(c.read(&mut b).expect("the end of stream"), 0);
}

/// [`SWITCHING_MAX`] switches under way: the next connection stays plain
/// TCP (counted), nothing swapped; once they end, there is room again.
/// (From two peers: one holds at most its share, `slot::PEER_SHARE`.)
#[test]
fn switches_beyond_the_bound_leave_the_connection_plain() {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    // Long enough for 64 starts on a loaded machine.
    let opts = options(Duration::from_secs(3));
    let mut held = Vec::new();
    for i in 0..SWITCHING_MAX {
        let (fd, c) = accepted_from([127, 0, 0, 1 + u8::from(i >= slot::PEER_SHARE)]);
        start_responder(fd, opts);
        held.push((fd, c));
    }
    assert!(!room());
    let (fd, _c) = accepted();
    let over = OVER.load(Ordering::Relaxed);
    let mut tried = false;
    assert_eq!(
        start(fd, opts, false, (Some(Role::Responder), false), |_| {
            tried = true;
            Ok(None)
        })
        .err(),
        Some(libc::EAGAIN)
    );
    assert!(!tried, "the switch was tried over the bound");
    assert_eq!(OVER.load(Ordering::Relaxed), over + 1);
    assert!(
        fdtable::get(fd).is_none(),
        "the connection over the bound is managed"
    );
    let deadline = Instant::now() + HUNG;
    while under_way() {
        assert!(Instant::now() < deadline, "the switches did not end");
        std::thread::yield_now();
    }
    for (n, _) in held {
        close_as_the_program(n);
        sys::close(n);
    }
    sys::close(fd);
}

/// A listener set to DDP mode switches its accepted connections with the
/// residue bounded ([`super::super::config::ACCEPTED_RESIDUE_MAX`]): a
/// client that writes past it without marking ends the switch there,
/// long before the wait for its mark would (here 30 s), and every byte is
/// delivered in order, the residue's first.
#[test]
fn a_client_writing_without_marking_ends_the_switch_at_the_residue_bound() {
    use super::super::config::{self, ACCEPTED_RESIDUE_MAX};
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    assert!(config::get().accepted.limits.residue_max <= ACCEPTED_RESIDUE_MAX);
    let mut o = options(Duration::from_secs(30)).clone();
    o.limits.residue_max = ACCEPTED_RESIDUE_MAX;
    let opts: &'static Options = Box::leak(Box::new(o));
    let (fd, mut c) = accepted();
    start(fd, opts, false, (None, false), prepare).unwrap_or_else(|e| panic!("start: errno {e}"));
    let total = 3 * ACCEPTED_RESIDUE_MAX;
    let writer = std::thread::spawn(move || {
        let data: Vec<u8> = (0..total).map(|i| (i % 251) as u8).collect();
        std::io::Write::write_all(&mut c, &data).expect("the client's bytes");
        c
    });
    let sw = table(fd);
    let deadline = Instant::now() + Duration::from_secs(10);
    while Arc::ptr_eq(&table(fd), &sw) {
        assert!(
            Instant::now() < deadline,
            "the switch waits for the mark past the residue bound"
        );
        std::thread::yield_now();
    }
    let now = table(fd);
    let mut got = vec![0u8; total];
    let mut at = 0;
    while at < total {
        let n = recv(&*now, &mut got[at..], 0);
        assert!(n > 0, "receive: {n}, errno {}", errno());
        at += n as usize;
    }
    assert!(
        got.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8),
        "the bytes out of order"
    );
    let _c = writer.join().expect("the writer");
    drop((sw, now));
    close_as_the_program(fd);
}

/// A number the program closed behind the table (`close_range`, a raw
/// `close`) and opened again while its connection switched is the
/// program's new file: the switch's end does not take it. The table still
/// names the switching socket there: a wait on the number waits on the
/// number's own file, not on the switch's `done` — readable for good
/// once the switch is over, it made every `poll` of that number wake at
/// once until its timeout (a spin; review 40 item 2).
#[test]
fn a_number_closed_behind_the_table_and_opened_again_is_left_alone() {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let (fd, _c) = accepted();
    start_responder(fd, options(Duration::from_millis(300)));
    let sw = table(fd);
    let mut p = [-1; 2];
    // SAFETY: a pipe of the test's, put on the number by `dup2` in one
    // step (a `close` first freed the number for another test: signal 35).
    unsafe {
        assert_eq!(libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC), 0);
        assert_eq!(libc::dup2(p[0], fd), fd);
    }
    sw.settle_wait().expect("a blocking socket waits");
    let mut st: libc::stat = unsafe_zeroed_stat();
    // SAFETY: fstat into a local.
    assert_eq!(unsafe { libc::fstat(fd, &mut st) }, 0);
    assert_eq!(
        st.st_mode & libc::S_IFMT,
        libc::S_IFIFO,
        "the program's pipe was replaced"
    );
    assert!(
        sw.wait_begin().is_none() && sw.file_change().is_none(),
        "a wait on the number the switch left would watch its end, readable for good"
    );
    if let Ok(Some(s)) = fdtable::remove(fd) {
        s.release();
    }
    for f in [fd, p[0], p[1]] {
        sys::close(f);
    }
}

fn unsafe_zeroed_stat() -> libc::stat {
    // SAFETY: plain data.
    unsafe { std::mem::zeroed() }
}

/// A `dup` under way when the switch ends (its system call before the
/// outcome's installation, its table entry after: the interposer's
/// `dup_held`): the installation waits for it, and the copy names the
/// outcome too — not the old doorbell, unmanaged (review 36 item 2).
#[test]
fn a_dup_under_way_at_the_end_names_the_outcome_too() {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let (fd, c) = accepted();
    let opts = options(Duration::from_secs(5));
    start_responder(fd, opts);
    let sw = table(fd);
    assert!(sw.dup_begin(), "a dup before the end is not held");
    // SAFETY: a dup of our own descriptor.
    let n = unsafe { libc::dup(fd) };
    assert!(n >= 0);
    let peer = std::thread::spawn(move || {
        let x: XSocket = switch_fd_as(c.as_fd(), opts, Some(Role::Initiator))
            .unwrap_or_else(|e| panic!("the peer's switch: {e}"));
        (x, c)
    });
    let deadline = Instant::now() + HUNG;
    let concrete = STARTED_LAST
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .upgrade()
        .expect("the switching socket");
    while !concrete.installing.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "the switch did not end");
        std::thread::yield_now();
    }
    // The entry, as the interposer's `propagate` makes it.
    assert!(matches!(
        fdtable::copy(fd, n),
        Ok(fdtable::Copied::Managed(None))
    ));
    sw.dup_end();
    sw.settle_wait().expect("a blocking socket waits");
    let (a, b) = (table(fd), table(n));
    assert!(Arc::ptr_eq(&a, &b), "the copy names another socket");
    assert!(
        !Arc::ptr_eq(&b, &(sw.clone() as Arc<dyn Socket>)),
        "the copy names the switching socket"
    );
    let ino = |f: c_int| {
        let mut st = unsafe_zeroed_stat();
        // SAFETY: fstat into a local.
        assert_eq!(unsafe { libc::fstat(f, &mut st) }, 0);
        (st.st_dev, st.st_ino)
    };
    assert_eq!(ino(fd), ino(n), "the copy's file is not the outcome's");
    let _peer = peer.join().expect("the peer");
    drop((a, b));
    close_as_the_program(n);
    close_as_the_program(fd);
}

/// Every number closed after the outcome is known and before it names
/// them (calls may have gone on in it meanwhile): the outcome is closed in
/// order — the peer reads the end of the stream, not a reset. Staged with
/// a held `dup`, which the installation waits for.
#[test]
fn a_number_closed_before_the_outcome_names_it_closes_the_outcome_in_order() {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let (fd, c) = accepted();
    let opts = options(Duration::from_secs(5));
    start_responder(fd, opts);
    let sw = table(fd);
    assert!(sw.dup_begin());
    let peer = std::thread::spawn(move || {
        let x: XSocket = switch_fd_as(c.as_fd(), opts, Some(Role::Initiator))
            .unwrap_or_else(|e| panic!("the peer's switch: {e}"));
        (x, c)
    });
    let concrete = STARTED_LAST
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .upgrade()
        .expect("the switching socket");
    let deadline = Instant::now() + HUNG;
    while !concrete.installing.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "the switch did not end");
        std::thread::yield_now();
    }
    close_as_the_program(fd);
    sw.dup_end();
    sw.settle_wait().expect("a blocking socket waits");
    // The outcome's last holders go (as the switch thread's and the
    // program's do): its close is finished then.
    drop((sw, concrete));
    let (x, _c) = peer.join().expect("the peer");
    let mut b = [0u8; 4];
    let end = x.recv(&mut b, warpsock_xsock::io::RecvFlags::default(), Some(HUNG));
    assert!(
        matches!(end, Ok((0, _))),
        "the peer read {end:?}, not the end"
    );
}

/// A new epoll set known to the library (as the interposed
/// `epoll_create1` records it) watching `fd` for input, its data `fd`.
fn epoll_watching(fd: c_int) -> c_int {
    // SAFETY: a new epoll set; ADD with a valid event.
    unsafe {
        let ep = libc::epoll_create1(libc::EPOLL_CLOEXEC);
        assert!(ep >= 0, "epoll_create1: {}", errno());
        epollcarry::created(ep);
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: fd as u64,
        };
        assert_eq!(libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev), 0);
        ep
    }
}

/// `ep` reports nothing (the closed number), and is closed.
fn assert_nothing_reported(ep: c_int) {
    assert_eq!(
        events_now(ep),
        Vec::<u64>::new(),
        "the closed number is still reported"
    );
    sys::close(ep);
}

/// The events `ep` reports now.
fn events_now(ep: c_int) -> Vec<u64> {
    let mut ev = [libc::epoll_event { events: 0, u64: 0 }; 4];
    // SAFETY: `ev` is ours, 4 entries.
    let n = unsafe { libc::epoll_wait(ep, ev.as_mut_ptr(), 4, 0) };
    assert!(n >= 0, "epoll_wait: {}", errno());
    ev[..n as usize].iter().map(|e| e.u64).collect()
}

/// The program's number, plain again after the switch (the peer sent
/// first and then ended), read to its end and closed by the program,
/// while a reference to the switching socket is still held (as a switch
/// thread that has not let go yet, descheduled after the installation,
/// holds one): the number's epoll registration goes with the close, as
/// the kernel's would with the file's last descriptor. It stayed while
/// the switching socket's own descriptor of the file lived, and reported
/// the closed number over and over (an epoll loop under load read
/// `EBADF`, and closed the connection that took the number next).
#[test]
fn a_number_closed_after_the_outcome_leaves_the_epoll_sets_while_the_socket_is_held() {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let (fd, mut c) = accepted();
    start_responder(fd, options(Duration::from_secs(5)));
    let ep = epoll_watching(fd);
    let sw = table(fd);
    std::io::Write::write_all(&mut c, b"GET /").unwrap();
    c.shutdown(std::net::Shutdown::Write).unwrap();
    // Read to the end: through the table while the number is managed
    // (the switching socket, then the residue's), then the TCP socket.
    let deadline = Instant::now() + HUNG;
    let mut got = Vec::new();
    loop {
        assert!(Instant::now() < deadline, "no end of stream");
        let mut b = [0u8; 16];
        let n = match fdtable::get(fd) {
            Some(s) => recv(&*s, &mut b, 0),
            // SAFETY: a read into `b` of our descriptor.
            None => unsafe { libc::read(fd, b.as_mut_ptr().cast(), b.len()) },
        };
        assert!(n >= 0, "read: {}", errno());
        if n == 0 && fdtable::get(fd).is_none() {
            break;
        }
        got.extend_from_slice(&b[..n as usize]);
    }
    assert_eq!(got, b"GET /");
    assert_eq!(
        events_now(ep),
        [fd as u64],
        "the end of stream is not reported"
    );
    close_with_its_registrations(fd);
    assert_nothing_reported(ep);
    drop(sw);
}

/// The program's number closed while the connection still switches, a
/// reference to the switching socket held: when the switch ends, its
/// doorbell (the file the closed number named) becomes readable, and the
/// closed number must not be reported.
#[test]
fn a_number_closed_while_switching_leaves_the_epoll_sets() {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let (fd, mut c) = accepted();
    start_responder(fd, options(Duration::from_secs(5)));
    let ep = epoll_watching(fd);
    let sw = table(fd);
    close_with_its_registrations(fd);
    std::io::Write::write_all(&mut c, b"GET /").unwrap();
    let deadline = Instant::now() + HUNG;
    while under_way() {
        assert!(Instant::now() < deadline, "the switch did not end");
        std::thread::yield_now();
    }
    assert_nothing_reported(ep);
    drop(sw);
}

/// On a non-blocking connection still switching (its peer silent),
/// `WARPSOCK_DDP_MODE` and `WARPSOCK_CRC` (get and set) and the extended
/// calls' look-up fail with `EAGAIN` at once, as its receives do: an
/// event loop that asks right after `accept` never waits for a slow or
/// silent peer (they waited up to the switch's deadlines, 3 s at the
/// defaults). Once the switch is over they answer (here: plain).
#[test]
fn a_non_blocking_switching_socket_answers_its_mode_with_eagain() {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let (fd, c) = accepted();
    sys::set_nonblocking(fd, true);
    start_responder(fd, options(Duration::from_secs(10)));
    let sw = table(fd);
    assert!(sw.nonblocking());
    let mut v: c_int = -1;
    let mut n = size_of::<c_int>() as socklen_t;
    for name in [WARPSOCK_DDP_MODE, WARPSOCK_CRC] {
        let r = sw.getsockopt(SOL_WARPSOCK, name, (&mut v as *mut c_int).cast(), &mut n);
        assert_eq!((r, errno()), (-1, libc::EAGAIN), "getsockopt {name}");
    }
    let one: c_int = 1;
    let r = sw.setsockopt(
        SOL_WARPSOCK,
        WARPSOCK_DDP_MODE,
        (&one as *const c_int).cast(),
        size_of::<c_int>() as socklen_t,
    );
    assert_eq!((r, errno()), (-1, libc::EAGAIN), "setsockopt");
    assert_eq!(
        super::super::sock::lookup(fd).err(),
        Some(libc::EAGAIN),
        "the extended calls' look-up"
    );
    // Answered while the switch still waits for the peer's mark (it
    // would have waited 10 s).
    assert!(
        lock(&STARTED_LAST)
            .upgrade()
            .is_some_and(|s| s.outcome().is_none()),
        "the calls waited for the switch"
    );
    // The peer leaves: the switch ends (plain), and the mode reads 0.
    drop(c);
    wait_plain(fd);
    assert_eq!(int_opt(&*sw, SOL_WARPSOCK, WARPSOCK_DDP_MODE), 0);
    drop(sw);
    sys::close(fd);
}

/// A send after a `SHUT_WR` made while the connection switches fails with
/// `EPIPE` at once, as TCP's: on a non-blocking socket (it failed with
/// `EAGAIN` until the outcome) and on a blocking one (it waited for the
/// switch, then failed).
#[test]
fn a_send_after_a_shutdown_of_the_sending_side_while_switching_fails_with_epipe() {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let (fd, c) = accepted();
    start_responder(fd, options(Duration::from_secs(10)));
    let sw = table(fd);
    assert_eq!(sw.shutdown(libc::SHUT_WR), 0);
    for nonblocking in [true, false] {
        sw.set_nonblocking(nonblocking);
        // SAFETY: a send of a buffer of the test's.
        let r = unsafe { sw.send_one(b"x".as_ptr().cast(), 1, libc::MSG_NOSIGNAL) };
        assert_eq!(
            (r, errno()),
            (-1, libc::EPIPE),
            "non-blocking {nonblocking}"
        );
    }
    assert!(
        lock(&STARTED_LAST)
            .upgrade()
            .is_some_and(|s| s.outcome().is_none()),
        "the send waited for the switch"
    );
    drop(c);
    drop(sw);
    wait_plain(fd);
    sys::close(fd);
}

/// `O_NONBLOCK` set on the number while the connection switches (an
/// event loop's `fcntl` right after `accept`) is the outcome's: the
/// plain TCP socket the number names afterwards is non-blocking.
#[test]
fn o_nonblocking_set_while_switching_is_the_outcomes() {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let (fd, c) = accepted();
    start_responder(fd, options(Duration::from_secs(10)));
    let sw = table(fd);
    sw.set_nonblocking(true);
    // The peer leaves: the switch ends, plain.
    drop(c);
    wait_plain(fd);
    drop(sw);
    // SAFETY: a query of our descriptor.
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    assert_ne!(fl & libc::O_NONBLOCK, 0, "the outcome is blocking");
    assert_eq!(
        sys::get_int(fd, libc::SOL_SOCKET, libc::SO_DOMAIN),
        Some(libc::AF_INET),
        "the number is not the TCP socket"
    );
    sys::close(fd);
}

/// Runs [`slot::hold`] of a place of its own (bound `bound`) on a thread
/// that owns the place, as a switch's thread does: its id, and the
/// thread (its answer: declined).
fn held(bound: Duration) -> (u64, std::thread::JoinHandle<bool>) {
    let s = Slot::take(None).expect("a place");
    let id = s.id;
    let t = std::thread::spawn(move || {
        let declined = slot::hold(s.at, s.id, bound);
        drop(s);
        declined
    });
    (id, t)
}

/// The place of switch `id` under way.
fn place_of(id: u64) -> usize {
    let deadline = Instant::now() + HUNG;
    loop {
        if let Some(at) = slot::place(id) {
            return at;
        }
        assert!(Instant::now() < deadline, "switch {id} is not under way");
        std::thread::yield_now();
    }
}

/// An accepted connection's switch holds its answer (`slot::hold`)
/// until the program uses the connection — a call on it, or any
/// `epoll_wait`/`select` of the process — and answers then; a fork of the
/// thread that accepted it, or its last close, declines it (the switch
/// then answers with a Reject); nothing at all, and it answers at its
/// bound.
#[test]
fn a_held_switch_answers_at_its_use_and_is_declined_by_a_fork_or_its_last_close() {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    // Each hold below ends by its event, none at its bound (a lapse would
    // count, and take `HUNG`).
    let lapsed = HOLDS_LAPSED.load(Ordering::Relaxed);
    let (id, t) = held(HUNG);
    slot::used(place_of(id), id, false);
    assert!(!t.join().unwrap(), "a use declined the switch");

    let (_, t) = held(HUNG);
    used_all();
    assert!(!t.join().unwrap(), "an epoll_wait declined the switch");

    // A late use (or last close) of an older switch at the same place
    // changes nothing of this one's (ids only grow): its use stands.
    let s = Slot::take(None).expect("a place");
    slot::used(s.at, s.id, false);
    slot::used(s.at, s.id - 1, false);
    slot::used(s.at, s.id - 1, true);
    assert!(
        !slot::hold(s.at, s.id, HUNG),
        "an older switch's close declined it"
    );
    drop(s);
    assert_eq!(
        HOLDS_LAPSED.load(Ordering::Relaxed),
        lapsed,
        "a hold waited out its bound although used"
    );

    let (id, t) = held(HUNG);
    slot::used(place_of(id), id, true);
    assert!(
        t.join().unwrap(),
        "the last close did not decline the switch"
    );

    // The fork's handler on the thread that accepted the connection: it
    // declines the switch and waits until it ended.
    let (id, t) = held(HUNG);
    place_of(id);
    slot::accepted_last(id);
    settle_before_fork(HUNG);
    slot::accepted_last(0);
    assert!(t.join().unwrap(), "the fork did not decline the switch");

    // No hold (`WARPSOCK_DDP_ACCEPT_HOLD_MS=0`): answered at once.
    let (_, t) = held(Duration::ZERO);
    assert!(!t.join().unwrap(), "no hold declined the switch");
    assert_eq!(
        HOLDS_LAPSED.load(Ordering::Relaxed),
        lapsed,
        "no hold lapsed"
    );

    let begun = Instant::now();
    let (_, t) = held(Duration::from_millis(50));
    assert!(!t.join().unwrap(), "a hold's bound declined the switch");
    assert!(
        begun.elapsed() >= Duration::from_millis(50),
        "the hold answered before its bound, unused"
    );
    assert!(HOLDS_LAPSED.load(Ordering::Relaxed) > lapsed);
}

/// A `poll` (or `select`) that looked the number up while it still named
/// the switching socket, and begins its wait after the switch ended,
/// watches `done`, readable: it wakes at once and looks the number up
/// again. Without it, the poll waited on the outcome's file without the
/// outcome's own wait: a DDP socket's input woke nothing (a 1 s stall,
/// the poll's timeout, in 1 of ~4,000 connections, session 39).
#[test]
fn a_wait_begun_on_a_switch_already_over_wakes_at_once() {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let (fd, _c) = accepted();
    start_responder(fd, options(Duration::from_millis(100)));
    let sw = table(fd);
    // The silent peer: the switch ends plain, its waits woken.
    wait_plain(fd);
    assert_eq!(sw.settle_wait(), Ok(()));
    let w = sw
        .wait_begin()
        .expect("a switching socket's wait watches nothing");
    let mut p = [libc::pollfd {
        fd: w.fds[0],
        events: libc::POLLIN,
        revents: 0,
    }];
    assert_eq!(
        sys::poll(&mut p, 0),
        1,
        "the wait's descriptor is not readable"
    );
    assert_eq!(sw.file_change(), Some(w.fds[0]));
    assert_eq!(sw.wait_end(w, &[libc::POLLIN]), 0);
    drop(sw);
    sys::close(fd);
}

/// Policy mode's hold ends at the program's wait for room on the
/// connection (a server that speaks first polls for `POLLOUT` before its
/// first write: the interposer's poll asks `write_wait`), not at its
/// bound (review 40 item 3: only a wait for input was a use).
#[test]
fn a_wait_for_room_is_a_use_that_ends_the_hold() {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let policy: &'static Options = Box::leak(Box::new(Options {
        limits: Limits {
            at_start: true,
            ..Limits::with_timeout(HUNG / 4)
        },
        ..Options::default()
    }));
    let lapsed = HOLDS_LAPSED.load(Ordering::Relaxed);
    let (fd, c) = accepted();
    start_responder(fd, policy);
    let sw = table(fd);
    let peer = std::thread::spawn(move || {
        let x: XSocket = switch_fd_as(c.as_fd(), options(HUNG / 4), Some(Role::Initiator))
            .unwrap_or_else(|e| panic!("the peer's switch: {e}"));
        (x, c)
    });
    assert_eq!(sw.write_wait(), None, "the doorbell is the wait's");
    let (_x, _c) = peer.join().expect("the peer's thread");
    assert_eq!(sw.settle_wait(), Ok(()));
    assert_eq!(
        HOLDS_LAPSED.load(Ordering::Relaxed),
        lapsed,
        "the wait for room did not end the hold"
    );
    drop(sw);
    close_as_the_program(fd);
}
