//! The initiator's "poke" past Linux siw's listen race: a second, idle TCP
//! connection to the same address when the MPA Reply is late.
//!
//! # The siw behaviour it works around
//!
//! Linux siw's `siw_create_listen()` (drivers/infiniband/sw/siw/siw_cm.c,
//! 6.1) calls `listen()` on its socket and only *then* sets the listening
//! endpoint's state to `SIW_EPSTATE_LISTENING`. A connection that completes
//! its TCP handshake in between queues siw's accept work, which runs while
//! the state is still IDLE: `siw_accept_newconn()` gives up ("error 0")
//! without accepting. The connection then sits in the socket's accept queue
//! with our MPA Request unread ("unexpected data, state 1" from
//! `siw_cm_llp_data_ready()`), and siw accepts again only when another
//! connection arrives: no Reply, no reset, until our MPA timeout (10 s).
//! perftest `-R` servers listen again for the test's connection right after
//! the handshake connection, and our client's connect (retried every 100 ms
//! or so while nothing listens, see [`super::outcome`]) can land in that
//! window: about 2 CI runs in 20 (`siw-ib_read_bw`, under load), every time
//! with the window widened by a `msleep()` in siw (the seen signature:
//! three kicks on the handshake connection, then the MPA timeout).
//!
//! Closing the stalled connection and trying again does not help, and does
//! harm: its FIN reaches a child socket that still carries the *listening*
//! endpoint, whose `SIW_CM_WORK_PEER_CLOSE` then releases the listener's
//! own socket — every later connect is refused.
//!
//! # What is done
//!
//! When the MPA Reply has not come [`POKE_AFTER`] after the TCP connect, a
//! second TCP connection is made to the same address and nothing is sent on
//! it. Its arrival queues siw's accept work again, which accepts the oldest
//! connection in the queue — ours — and reads its MPA Request. The poke is
//! then held open until the peer closes or resets it (siw's own 5 s timer for
//! an MPA Request, once it accepts the poke; the listener's destruction;
//! any other responder's MPA timeout), at most [`POKE_HOLD`]: closing it
//! while it sits in siw's accept queue would release the listener as above.
//! At most one poke per connection attempt, and [`POKES_MAX`] held at once
//! in the process; a Reply in time sends none.

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use warpsock_engine::{CmError, Qp, QpInit};

use crate::config::debug;

/// How long an initiator waits for the MPA Reply before it pokes.
pub const POKE_AFTER: Duration = Duration::from_secs(2);
/// How long a poke is held at most when the peer never closes it.
pub const POKE_HOLD: Duration = Duration::from_secs(600);
/// Pokes held at once, at most, in the process: a peer that answers every
/// connect late (or a program that connects to such peers in a loop) gets
/// no more threads and descriptors than this held for it; a connect that
/// finds them all in use goes without a poke.
pub const POKES_MAX: usize = 8;

/// Pokes connected and not yet ended.
static POKES: AtomicUsize = AtomicUsize::new(0);

/// The initiator's MPA exchange on `sock`, a TCP connection to `dst`, with
/// a poke of `dst` if the Reply has not come after `after`.
pub fn exchange(
    sock: TcpStream,
    dst: SocketAddr,
    init: &QpInit<'_>,
    after: Duration,
) -> Result<Qp, CmError> {
    let poke = Poke::arm(dst, after);
    let res = warpsock_engine::connect_stream(sock, init);
    poke.disarm();
    res
}

/// An armed poke for one connection attempt; [`Poke::disarm`] (or a drop)
/// once the MPA exchange has finished, either way.
pub struct Poke {
    done: Option<Sender<()>>,
}

impl Poke {
    /// Arms a poke of `dst` after `after`, unless disarmed first.
    pub fn arm(dst: SocketAddr, after: Duration) -> Self {
        Self::arm_reporting(dst, after, None, &POKES)
    }

    /// [`Self::arm`], counting the poke in `held` (the process's
    /// [`POKES`]; a test's own); the poke's thread sends on `ended`, as it
    /// ends, whether it poked (the tests' view of a thread nothing joins).
    fn arm_reporting(
        dst: SocketAddr,
        after: Duration,
        ended: Option<Sender<bool>>,
        held: &'static AtomicUsize,
    ) -> Self {
        let (tx, rx) = mpsc::channel::<()>();
        let spawned = std::thread::Builder::new()
            .name("warpsock-cm-poke".into())
            .spawn(move || {
                let poked = poke_unless_done(&rx, dst, after, held);
                if let Some(e) = ended {
                    let _ = e.send(poked);
                }
            });
        Self {
            done: spawned.ok().map(|_| tx),
        }
    }

    /// The exchange has finished: no poke from now on.
    pub fn disarm(mut self) {
        self.done.take();
    }
}

impl Drop for Poke {
    fn drop(&mut self) {
        if let Some(tx) = self.done.take() {
            let _ = tx.send(());
        }
    }
}

/// The poke's thread: unless `done` hears from the exchange (a message or
/// a hang-up: it finished) within `after`, connects to `dst` and holds the
/// connection ([`hold`]), counted in `held` (at most [`POKES_MAX`]).
/// Whether it connected.
fn poke_unless_done(
    done: &mpsc::Receiver<()>,
    dst: SocketAddr,
    after: Duration,
    held: &AtomicUsize,
) -> bool {
    if done.recv_timeout(after) != Err(RecvTimeoutError::Timeout) {
        return false;
    }
    if held
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < POKES_MAX).then_some(n + 1)
        })
        .is_err()
    {
        debug!("connect to {dst}: no MPA Reply after {after:?}; {POKES_MAX} pokes held already, none more");
        return false;
    }
    let poked = match crate::sock::tcp_connect(dst, after) {
        Ok(mut s) => {
            debug!("connect to {dst}: no MPA Reply after {after:?}; a second, idle connection (siw listen race)");
            hold(&mut s, POKE_HOLD);
            true
        }
        Err(_) => false,
    };
    held.fetch_sub(1, Ordering::AcqRel);
    poked
}

/// Reads (and drops) whatever comes on `s` until the peer closes or resets
/// it, or `limit` has passed.
fn hold(s: &mut TcpStream, limit: Duration) {
    let end = Instant::now() + limit;
    let mut buf = [0u8; 256];
    loop {
        let now = Instant::now();
        if now >= end {
            return;
        }
        if s.set_read_timeout(Some(end - now)).is_err() {
            return;
        }
        match s.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::os::fd::AsRawFd;
    use warpsock_engine::{ConnectRequest, Context, Progress};

    /// Bound on any event these tests wait for.
    const LIMIT: Duration = Duration::from_secs(10);

    /// The next connection on `l` if one arrives within `t` (`poll(2)` on
    /// the listener: no sleeps).
    fn accept_within(l: &TcpListener, t: Duration) -> Option<TcpStream> {
        let mut p = libc::pollfd {
            fd: l.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = t.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut p, 1, ms) };
        (r > 0).then(|| l.accept().expect("accept a ready listener").0)
    }

    #[test]
    fn a_reply_in_time_sends_no_poke() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let dst = l.local_addr().unwrap();
        // An hour's wait: only the disarm (or the drop) can end the thread
        // within the bound, and it must end without connecting.
        for by_drop in [false, true] {
            let (tx, ended) = mpsc::channel();
            let p = Poke::arm_reporting(dst, Duration::from_secs(3600), Some(tx), &POKES);
            if by_drop {
                drop(p);
            } else {
                p.disarm();
            }
            assert_eq!(ended.recv_timeout(LIMIT), Ok(false), "by_drop {by_drop}");
        }
        assert!(accept_within(&l, Duration::ZERO).is_none(), "no poke");
    }

    #[test]
    fn a_late_reply_pokes_once_and_the_poke_stays_open_until_the_peer_closes_it() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let (tx, ended) = mpsc::channel();
        let t0 = Instant::now();
        let p = Poke::arm_reporting(
            l.local_addr().unwrap(),
            Duration::from_millis(200),
            Some(tx),
            &POKES,
        );
        let mut poke = accept_within(&l, LIMIT).expect("a poke");
        assert!(t0.elapsed() >= Duration::from_millis(200));
        // The exchange finishing does not close the poke: closing it could
        // release siw's listener (module doc). The thread still holds it.
        p.disarm();
        assert_eq!(
            ended.try_recv(),
            Err(mpsc::TryRecvError::Empty),
            "the poke's thread ended while the peer kept it open"
        );
        poke.set_nonblocking(true).unwrap();
        let mut b = [0u8; 8];
        let e = poke.read(&mut b).unwrap_err();
        assert_eq!(
            e.kind(),
            std::io::ErrorKind::WouldBlock,
            "open, nothing sent: {e}"
        );
        // Our side (the peer's, to the poke) closes it: the thread reads
        // the end and stops, having poked once.
        drop(poke);
        assert_eq!(ended.recv_timeout(LIMIT), Ok(true));
        assert!(accept_within(&l, Duration::ZERO).is_none(), "once");
    }

    #[test]
    fn a_held_poke_ends_at_its_limit_or_the_peers_close() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        let t0 = Instant::now();
        hold(&mut c, Duration::from_millis(150));
        assert!(t0.elapsed() >= Duration::from_millis(150));
        // The peer's close ends a hold whose limit is far away.
        drop(s);
        let t0 = Instant::now();
        hold(&mut c, Duration::from_secs(3600));
        assert!(t0.elapsed() < LIMIT, "ended by the close");
    }

    #[test]
    fn pokes_held_at_once_are_bounded() {
        // A count of this test's own: the other tests' pokes do not share it.
        static HELD: AtomicUsize = AtomicUsize::new(0);
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let dst = l.local_addr().unwrap();
        let mut armed = Vec::new();
        let mut held = Vec::new();
        for _ in 0..POKES_MAX {
            // Kept armed: the thread's wait ends in its timeout, at once.
            armed.push(Poke::arm_reporting(dst, Duration::ZERO, None, &HELD));
            held.push(accept_within(&l, LIMIT).expect("a poke"));
        }
        // The table is full: one more ends without connecting.
        let (tx, ended) = mpsc::channel();
        armed.push(Poke::arm_reporting(dst, Duration::ZERO, Some(tx), &HELD));
        assert_eq!(ended.recv_timeout(LIMIT), Ok(false));
        assert!(accept_within(&l, Duration::ZERO).is_none());
        // A poke that ends (its peer closed it) frees its place.
        drop(held.pop());
        let t0 = Instant::now();
        while HELD.load(Ordering::Acquire) == POKES_MAX {
            assert!(
                t0.elapsed() < LIMIT,
                "the closed poke's place was never freed"
            );
            std::thread::yield_now();
        }
        let (tx, ended) = mpsc::channel();
        armed.push(Poke::arm_reporting(dst, Duration::ZERO, Some(tx), &HELD));
        drop(accept_within(&l, LIMIT).expect("a poke in the freed place"));
        assert_eq!(ended.recv_timeout(LIMIT), Ok(true));
    }

    /// siw's lost accept, modelled: the responder takes the first
    /// connection from its queue, and reads its MPA Request, only once the
    /// next connection has arrived. Without the poke the exchange would
    /// wait out the MPA timeout.
    #[test]
    fn a_connection_left_in_the_accept_queue_is_served_once_the_poke_arrives() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let dst = l.local_addr().unwrap();
        let (tx, rx) = mpsc::channel::<()>();
        let responder = std::thread::spawn(move || {
            let first = accept_within(&l, LIMIT).expect("the connection");
            let poke = accept_within(&l, LIMIT).expect("the poke");
            let ctx = Context::new(Progress::Thread).unwrap();
            let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(16).unwrap());
            let req = ConnectRequest::read(first, Duration::from_secs(5)).unwrap();
            let _qp = req.accept(&QpInit::new(&pd, &cq), b"").unwrap();
            // Held until the initiator has its queue pair.
            rx.recv_timeout(LIMIT).unwrap();
            drop(poke);
        });
        let ctx = Context::new(Progress::Thread).unwrap();
        let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(16).unwrap());
        let t0 = Instant::now();
        let sock = TcpStream::connect(dst).unwrap();
        let qp = exchange(
            sock,
            dst,
            &QpInit::new(&pd, &cq),
            Duration::from_millis(300),
        )
        .expect("established after the poke");
        assert!(t0.elapsed() >= Duration::from_millis(300));
        drop(qp);
        tx.send(()).unwrap();
        responder.join().unwrap();
    }
}
