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
//! or so while nothing listens, see [`crate::cm::outcome`]) can land in that
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
//! At most one poke per connection attempt; a Reply in time sends none.

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use warpsock_engine::{CmError, Qp, QpInit};

use crate::config::debug;

/// How long an initiator waits for the MPA Reply before it pokes.
pub const POKE_AFTER: Duration = Duration::from_secs(2);
/// How long a poke is held at most when the peer never closes it.
pub const POKE_HOLD: Duration = Duration::from_secs(600);

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
        let (tx, rx) = mpsc::channel::<()>();
        let spawned = std::thread::Builder::new()
            .name("warpsock-cm-poke".into())
            .spawn(move || {
                // A message or a hang-up: the exchange finished in time.
                if rx.recv_timeout(after) != Err(RecvTimeoutError::Timeout) {
                    return;
                }
                let Ok(mut s) = crate::sock::tcp_connect(dst, after) else {
                    return;
                };
                debug!(
                    "connect to {dst}: no MPA Reply after {after:?}; a second, idle connection (siw listen race)"
                );
                hold(&mut s, POKE_HOLD);
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
    use warpsock_engine::{ConnectRequest, Context, Progress};

    fn accept_within(l: &TcpListener, t: Duration) -> Option<TcpStream> {
        l.set_nonblocking(true).unwrap();
        let end = Instant::now() + t;
        while Instant::now() < end {
            if let Ok((s, _)) = l.accept() {
                s.set_nonblocking(false).unwrap();
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        None
    }

    #[test]
    fn a_reply_in_time_sends_no_poke() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let p = Poke::arm(l.local_addr().unwrap(), Duration::from_millis(200));
        std::thread::sleep(Duration::from_millis(50));
        p.disarm();
        assert!(accept_within(&l, Duration::from_millis(600)).is_none());
        // Dropped instead of disarmed: the same.
        let p = Poke::arm(l.local_addr().unwrap(), Duration::from_millis(200));
        drop(p);
        assert!(accept_within(&l, Duration::from_millis(600)).is_none());
    }

    #[test]
    fn a_late_reply_pokes_once_and_the_poke_stays_open_until_the_peer_closes_it() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let t0 = Instant::now();
        let p = Poke::arm(l.local_addr().unwrap(), Duration::from_millis(200));
        let mut poke = accept_within(&l, Duration::from_secs(5)).expect("a poke");
        assert!(t0.elapsed() >= Duration::from_millis(200));
        // The exchange finishing does not close the poke: closing it could
        // release siw's listener (module doc).
        p.disarm();
        poke.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let mut b = [0u8; 8];
        let e = poke.read(&mut b).unwrap_err();
        assert!(
            matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            "still open, nothing sent: {e}"
        );
        assert!(
            accept_within(&l, Duration::from_millis(400)).is_none(),
            "once"
        );
        // Our side closes it: the poke ends (its thread reads EOF).
        drop(poke);
    }

    #[test]
    fn a_held_poke_ends_at_its_limit_or_the_peers_close() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        let t0 = Instant::now();
        hold(&mut c, Duration::from_millis(150));
        assert!(t0.elapsed() >= Duration::from_millis(150));
        let t0 = Instant::now();
        let closer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            drop(s);
        });
        hold(&mut c, Duration::from_secs(10));
        assert!(t0.elapsed() < Duration::from_secs(5), "ended by the close");
        closer.join().unwrap();
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
            let (first, _) = l.accept().unwrap();
            let (poke, _) = l.accept().unwrap();
            let ctx = Context::new(Progress::Thread).unwrap();
            let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(16).unwrap());
            let req = ConnectRequest::read(first, Duration::from_secs(5)).unwrap();
            let _qp = req.accept(&QpInit::new(&pd, &cq), b"").unwrap();
            rx.recv().unwrap();
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
        let took = t0.elapsed();
        assert!(took >= Duration::from_millis(300), "{took:?}");
        assert!(took < Duration::from_secs(5), "{took:?}");
        drop(qp);
        tx.send(()).unwrap();
        responder.join().unwrap();
    }
}
