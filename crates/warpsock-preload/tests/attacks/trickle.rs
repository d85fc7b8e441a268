//! A peer that reads a trickle (issue 13): it asks for more echoes than
//! its path holds and then reads them at about 60 KB/s, a few KiB every
//! 100 ms. Each of the victim's replies to it finds the connection full;
//! the peer's reads free room in the victim's kernel send buffer, but
//! never the third of it that brings `EPOLLOUT`, so the waiting send ends
//! only at the connection's bound (`STALL`, 5 s since the kernel last took
//! bytes) and its reply is dropped. The victim's next reply to it then
//! finds room the trickle made: the kernel takes bytes, which resets the
//! connection's clock, and the reply after that waits `STALL` again.
//! Before the socket's stall budget the single-threaded victim so sat in
//! its `sendto` 5 s of every few replies for as long as the attacker went
//! on, and a legitimate peer got a handful of round trips per `STALL`.
//! The budget's rule has a unit test (`core::stall`,
//! `a_trickling_reader_is_charged_too`); this is the attack itself.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use super::*;

/// The attacker's trickle: at most this many bytes per read, one read
/// every `EVERY` (about 60 KB/s).
const SIP: usize = 6 << 10;
const EVERY: Duration = Duration::from_millis(100);

/// Requests the attacker sends (60 KB each, 24 MB: more than the path
/// holds and than the legitimate round trips interleave with).
const REQUESTS: usize = 400;

/// The legitimate peer's round trips, and their bound from the attack's
/// start: one `STALL` (the budget), the refills' waits of a second or two
/// and room for a loaded CI. Before the budget, 200 round trips took a
/// `STALL` per few of them: the bound fails them.
const ROUND_TRIPS: u32 = 200;
const BOUND: Duration = Duration::from_secs(20);

#[test]
fn a_trickling_reader_cannot_hold_the_victim() {
    let mut v = Victim::start(0, 0, None, &[("WARPSOCK_SNDBUF", "131072")]);
    let (t, _u) = proven_peer(v.port);
    let mut sipper = t.try_clone().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let sipped = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let writer = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let big = wire::frame(&vec![b'e'; 60_000]);
            let mut t = t;
            t.set_write_timeout(Some(Duration::from_secs(30))).unwrap();
            let sent = (0..REQUESTS)
                .take_while(|_| !stop.load(Ordering::Relaxed) && t.write_all(&big).is_ok())
                .count();
            (t, sent)
        })
    };
    let reader = {
        let (stop, sipped) = (stop.clone(), sipped.clone());
        std::thread::spawn(move || {
            sipper
                .set_read_timeout(Some(Duration::from_millis(50)))
                .unwrap();
            let mut buf = vec![0u8; SIP];
            // Bounded: at most two minutes, whatever the test does.
            while !stop.load(Ordering::Relaxed) && started.elapsed() < Duration::from_secs(120) {
                std::thread::sleep(EVERY);
                match sipper.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        sipped.fetch_add(n, Ordering::Relaxed);
                    }
                    Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                    Err(_) => break,
                }
            }
        })
    };
    let legit = command(
        &c_program("echo_client"),
        &[
            v.port.to_string(),
            ROUND_TRIPS.to_string(),
            LEGIT_TRIES.to_string(),
        ],
        true,
    )
    .spawn()
    .expect("spawn echo_client");
    let lr = finish(legit, BOUND);
    let took = started.elapsed();
    eprintln!(
        "{ROUND_TRIPS} legitimate round trips took {took:?}; the attacker sipped {} bytes",
        sipped.load(Ordering::Relaxed)
    );
    stop.store(true, Ordering::Relaxed);
    if lr.code != Some(0) {
        let threads = v.threads();
        let vr = v.take().quit();
        panic!(
            "{ROUND_TRIPS} legitimate round trips not done in {BOUND:?} (exit {:?}) while \
             a peer read a trickle:\n{}\nvictim threads:\n{threads}victim stats:\n{}",
            lr.code, lr.stderr, vr.stderr
        );
    }
    let r = v.quit();
    reader.join().unwrap();
    let (_t, sent) = writer.join().unwrap();
    r.assert_ok("victim");
    eprintln!(
        "requests sent {sent}; stall drops {}, budget drops {}, replies taken {}",
        r.stat("tx_stall_drops"),
        r.stat("tx_stall_budget_drops"),
        r.stat("tx_tcp_dgrams")
    );
    assert!(
        r.stat("tx_stall_budget_drops") >= 1,
        "the budget never ran out\n{}",
        r.stderr
    );
    each_echo_counted_once(&r);
}
