//! The byte and message counters see every count: each socket's own
//! ([`XSocket::stats`], plain adds under the socket's lock) and the
//! process's ([`counters`], every socket's summed when read, a dropped
//! socket's included). The only
//! test of its binary, so the process's counters move by exactly what its
//! two sockets count.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::SeqCst;

use warpsock_xsock::io::{counters, Counters, Options, XSocket};
use warpsock_xsock::wire::HDR_LEN;

mod net;

use net::{opts, pattern, recv_exact, switch_both, tcp_pair, LIMIT};

/// The send counters of `c`: DATA messages, bytes sent, bytes copied.
fn tx(c: &Counters) -> [u64; 3] {
    let l = |a: &AtomicU64| a.load(SeqCst);
    [l(&c.tx_msgs), l(&c.tx_bytes), l(&c.tx_copied)]
}

/// The receive counters of `c`: bytes received, bytes copied, messages a
/// waiting reader took, waits in the engine.
fn rx(c: &Counters) -> [u64; 4] {
    let l = |a: &AtomicU64| a.load(SeqCst);
    [l(&c.rx_bytes), l(&c.rx_copied), l(&c.rx_taken), l(&c.waits)]
}

fn minus<const N: usize>(a: [u64; N], b: [u64; N]) -> [u64; N] {
    std::array::from_fn(|i| a[i] - b[i])
}

fn plus<const N: usize>(a: [u64; N], b: [u64; N]) -> [u64; N] {
    std::array::from_fn(|i| a[i] + b[i])
}

const ROUNDS: u64 = 200;

/// One end of [`ROUNDS`] 8-byte round trips (blocking calls: each send
/// the straight path's one inline message), then the ping end writes
/// `big` (the general path: several copied messages) and the pong end
/// reads it.
fn side(x: &XSocket, ping: bool, big: &[u8]) {
    for i in 0..ROUNDS {
        if ping {
            x.send(&i.to_le_bytes(), false, Some(LIMIT)).unwrap();
            assert_eq!(recv_exact(x, 8), i.to_le_bytes());
        } else {
            let m = recv_exact(x, 8);
            x.send(&m, false, Some(LIMIT)).unwrap();
        }
    }
    if ping {
        assert_eq!(x.send(big, false, Some(LIMIT)).unwrap(), big.len());
    } else {
        assert!(recv_exact(x, big.len()) == big);
    }
}

/// Each end counts into its own counters under its lock and into the
/// process's: every message and byte of a ping-pong (the straight path's
/// inline sends, waiting readers' takes) and of a write of several
/// messages (the general path) is in both.
#[test]
fn every_message_and_byte_is_counted_by_the_socket_and_the_process() {
    let o = Options {
        slot_size: Options::slot_size_for(1024),
        zcopy_min: 1 << 20,
        ..opts()
    };
    let payload = o.slot_size as usize - HDR_LEN;
    // Four messages: three full, one of 100 bytes.
    let big = pattern(3 * payload + 100, 9);
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &o);
    let (p_tx, p_rx) = (tx(counters()), rx(counters()));
    let (a_tx, b_tx) = (tx(xa.stats()), tx(xb.stats()));
    let (a_rx, b_rx) = (rx(xa.stats()), rx(xb.stats()));
    std::thread::scope(|sc| {
        let pong = sc.spawn(|| side(&xb, false, &big));
        side(&xa, true, &big);
        pong.join().unwrap();
    });
    let n = big.len() as u64;
    let (da, db) = (minus(tx(xa.stats()), a_tx), minus(tx(xb.stats()), b_tx));
    assert_eq!(
        da,
        [ROUNDS + 4, 8 * ROUNDS + n, 8 * ROUNDS + n],
        "ping's sends"
    );
    assert_eq!(db, [ROUNDS, 8 * ROUNDS, 8 * ROUNDS], "pong's sends");
    assert_eq!(
        minus(tx(counters()), p_tx),
        plus(da, db),
        "the process's sends"
    );
    let (ra, rb) = (minus(rx(xa.stats()), a_rx), minus(rx(xb.stats()), b_rx));
    assert_eq!(ra[..2], [8 * ROUNDS; 2], "ping's received bytes");
    assert_eq!(rb[..2], [8 * ROUNDS + n; 2], "pong's received bytes");
    assert!(
        ra[2] > 0 && ra[3] > 0,
        "ping took messages and waited: {ra:?}"
    );
    assert_eq!(
        minus(rx(counters()), p_rx),
        plus(ra, rb),
        "the process's receives"
    );
    // The process's counters are summed from its sockets' when read: a
    // dropped socket's counts stay in them.
    let (p_tx, p_rx) = (tx(counters()), rx(counters()));
    drop((xa, xb));
    assert_eq!(tx(counters()), p_tx, "the process's sends, sockets dropped");
    assert_eq!(
        rx(counters()),
        p_rx,
        "the process's receives, sockets dropped"
    );
}
