//! The budget the residues of switches under way share
//! (`Options::residue_budget`; part of `loopback.rs`; helper 73's review,
//! item 8).

use std::os::fd::AsRawFd;

use super::*;
use warpsock_xsock::io::ResidueBudget;

/// Two switches against peers that write without marking, under a budget
/// of 1 MiB: the first reads its peer's 700,000 bytes and waits on for
/// the mark; the second gets the budget's rest and then fails as at its
/// own bound (`ResidueFull`, `ECONNREFUSED`), the connection plain TCP —
/// its residue, then the socket, deliver every byte its peer wrote, in
/// order. The first's charge comes back when it ends. Fails without the
/// budget's charge (the second reads all its peer's bytes and waits out
/// its mark timeout: `NoPeer`).
#[test]
fn switches_past_the_shared_residue_budget_fail_with_every_byte_delivered() {
    static BUDGET: ResidueBudget = ResidueBudget::new(1 << 20);
    const EACH: usize = 700_000;
    let (a1, b1) = tcp_pair();
    let (a2, b2) = tcp_pair();
    let mut o = opts();
    o.residue_budget = Some(&BUDGET);
    // The first waits for its mark until its peer ends; the second's wait
    // is short (before the budget, it waited it out).
    o.limits = Limits::with_timeout(LIMIT);
    let mut short = o.clone();
    short.limits = Limits::with_timeout(Duration::from_secs(2));
    let (p1, p2) = (pattern(EACH, 81), pattern(EACH, 82));
    std::thread::scope(|sc| {
        let writer = sc.spawn(|| (&a1).write_all(&p1).unwrap());
        let first = sc.spawn(|| switch_fd_as(b1.as_fd(), &o, Some(Role::Responder)).unwrap_err());
        // The first has read them all: written, acknowledged (so in its
        // socket) and none left queued there.
        writer.join().unwrap();
        let start = Instant::now();
        while unacked(&a1) > 0 || warpsock_xsock::io::readable(b1.as_raw_fd()).unwrap() > 0 {
            assert!(start.elapsed() < LIMIT, "the first reads nothing");
            std::thread::yield_now();
        }
        sc.spawn(|| (&a2).write_all(&p2).unwrap());
        let err = switch_fd_as(b2.as_fd(), &short, Some(Role::Responder)).unwrap_err();
        let Failure::Refused {
            error, residue: r2, ..
        } = err
        else {
            panic!("{err}")
        };
        assert!(matches!(error, SwitchError::ResidueFull { .. }), "{error}");
        assert_eq!(error.errno(), libc::ECONNREFUSED);
        assert!(r2.len() <= (1 << 20) - EACH, "{} held", r2.len());
        assert_eq!(
            BUDGET.held(),
            EACH,
            "the first's residue charged, the second's given back"
        );
        // Every byte, in order: the residue, then the socket.
        let mut got = r2;
        let mut rest = vec![0u8; EACH - got.len()];
        b2.set_read_timeout(Some(LIMIT)).unwrap();
        (&b2).read_exact(&mut rest).unwrap();
        got.extend_from_slice(&rest);
        assert!(got == p2, "the second peer's bytes in order");
        // The first ends with its peer's end, its residue whole.
        a1.shutdown(std::net::Shutdown::Write).unwrap();
        let Failure::Refused { residue: r1, .. } = first.join().unwrap() else {
            panic!("the first broke")
        };
        assert!(r1 == p1, "the first peer's bytes");
        assert_eq!(BUDGET.held(), 0, "the first's charge came back");
    });
}

/// The bytes `s` sent that its peer's kernel has not acknowledged
/// (`SIOCOUTQ`).
fn unacked(s: &std::net::TcpStream) -> usize {
    let mut v: libc::c_int = 0;
    // SAFETY: SIOCOUTQ (TIOCOUTQ) writes one int.
    let r = unsafe { libc::ioctl(s.as_raw_fd(), libc::TIOCOUTQ, &mut v) };
    assert_eq!(r, 0);
    v.max(0) as usize
}
