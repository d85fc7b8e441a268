//! Our mappings are bounded as the peer bounds them (issue 12; session
//! 35's review): a peer holds at most `PEER_MAPS_MAX` of ours and fails
//! the connection past it, so `riomap` refuses the next one itself
//! (`ENOBUFS`) and the connection goes on.

use warpsock_xsock::io::RecvFlags;
use warpsock_xsock::stream::PEER_MAPS_MAX;

mod net;

use net::{opts, switch_both, tcp_pair, LIMIT};

/// `PEER_MAPS_MAX` mappings, then one more: `ENOBUFS`, and the stream
/// still carries bytes both ways (the peer took every announcement).
/// Fails with the mapping past the bound made (the peer's `TooMany`: its
/// read fails with `EPROTO`).
#[test]
fn a_mapping_past_the_peers_bound_is_refused_here() {
    const EACH: usize = 64;
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    let mut mem = vec![0u8; EACH * (PEER_MAPS_MAX + 1)];
    let base = mem.as_mut_ptr();
    for i in 0..PEER_MAPS_MAX {
        #[allow(unsafe_code)]
        // SAFETY: disjoint pieces of `mem`, which outlives the sockets.
        let r = unsafe { xb.riomap(base.add(i * EACH), EACH, true, false, None) };
        r.unwrap_or_else(|e| panic!("mapping {i}: {e}"));
    }
    #[allow(unsafe_code)]
    // SAFETY: as above.
    let r = unsafe { xb.riomap(base.add(PEER_MAPS_MAX * EACH), EACH, true, false, None) };
    let e = r.expect_err("a mapping past the peer's bound");
    assert_eq!(e.raw_os_error(), Some(libc::ENOBUFS), "{e}");
    // Both ends driven: the announcements wait for credits the reader
    // returns as it reads.
    std::thread::scope(|sc| {
        sc.spawn(|| {
            xb.send(b"after", false, Some(LIMIT)).unwrap();
            let mut back = [0u8; 4];
            xb.recv(&mut back, RecvFlags::default(), Some(LIMIT))
                .unwrap();
            assert_eq!(&back, b"back");
        });
        let mut got = [0u8; 5];
        let (n, _) = xa
            .recv(&mut got, RecvFlags::default(), Some(LIMIT))
            .unwrap();
        assert_eq!(&got[..n], &b"after"[..n]);
        xa.send(b"back", false, Some(LIMIT)).unwrap();
    });
    drop((xa, xb));
    drop(mem);
}
