//! `XSocket::aio_writev`: a gather list of separate buffers is one RDMA
//! Write — placed as their concatenation, one completion for the lot (a
//! `warpsock_aio_write` per buffer is a post, a transmit round and a
//! completion each) — and wrong arguments are refused before anything is
//! posted.

use std::time::Instant;

use warpsock_xsock::io::{AioOp, Completion, RecvFlags, XSocket};

mod net;

/// A segment of a vectored write: (start, length).
type Seg = (*const u8, usize);

use net::{opts, pattern, switch_both, tcp_pair, LIMIT};

/// Maps `target` on `target_side` for the peer's Writes at offset 0 and
/// lets `writer` know (the mapping travels with the stream).
fn map_for_writes(writer: &XSocket, target_side: &XSocket, target: &mut [u8]) -> u64 {
    #[allow(unsafe_code)]
    // SAFETY: every test unmaps `target` before dropping it.
    let off =
        unsafe { target_side.riomap(target.as_mut_ptr(), target.len(), true, false, Some(0)) }
            .unwrap();
    target_side.send(b"m", false, None).unwrap();
    let mut m = [0u8; 1];
    writer
        .recv(&mut m, RecvFlags::default(), Some(LIMIT))
        .unwrap();
    off
}

/// Collects `x`'s completions until `n` arrived, driving `peer` (which
/// takes the Writes in).
fn completions(x: &XSocket, peer: &XSocket, n: usize) -> Vec<Completion> {
    let mut done = Vec::new();
    let t = Instant::now();
    while done.len() < n {
        assert!(t.elapsed() < LIMIT, "{done:?}");
        x.aio_poll(&mut done, 8);
        peer.progress();
        std::thread::yield_now();
    }
    done
}

#[test]
fn a_vectored_write_is_one_write_with_one_completion() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    let size = 1 << 20;
    let mut target = vec![0u8; size];
    let off = map_for_writes(&xa, &xb, &mut target);

    // The riowrite benchmark's message: head stamp, shared body, tail
    // stamp, three buffers.
    let want = pattern(size, 11);
    let (head, body, tail) = (
        want[..8].to_vec(),
        want[8..size - 8].to_vec(),
        want[size - 8..].to_vec(),
    );
    let segs = [
        (head.as_ptr(), head.len()),
        (body.as_ptr(), body.len()),
        (tail.as_ptr(), tail.len()),
    ];
    let messages = 4u64;
    for k in 0..messages {
        #[allow(unsafe_code)]
        // SAFETY: the buffers live until every completion is collected.
        unsafe { xa.aio_writev(&segs, off, 100 + k) }.unwrap();
    }
    // One completion per message, none per segment.
    let done = completions(&xa, &xb, messages as usize);
    assert_eq!(done.len(), messages as usize, "{done:?}");
    for (k, c) in done.iter().enumerate() {
        assert_eq!(
            (c.cookie, c.op, c.result),
            (100 + k as u64, AioOp::Write, Ok(size))
        );
    }
    assert_eq!(xa.aio_pending(), 0);
    let mut more = Vec::new();
    assert_eq!(xa.aio_poll(&mut more, 8), 0, "{more:?}");
    // A Send after the Writes arrives after they are placed.
    xa.send(b"done", false, None).unwrap();
    let mut d = [0u8; 4];
    xb.recv(&mut d, RecvFlags::default(), Some(LIMIT)).unwrap();
    assert!(target == want, "the segments placed in order");
    xb.riounmap(target.as_mut_ptr()).unwrap();
}

#[test]
fn wrong_vectored_writes_are_refused_before_posting() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    let mut target = vec![0u8; 4096];
    let off = map_for_writes(&xa, &xb, &mut target);
    let buf = [7u8; 64];
    let one = (buf.as_ptr(), buf.len());
    let too_many = vec![(buf.as_ptr(), 1); XSocket::RIO_IOV_MAX + 1];
    // All EINVAL: none, too many, an empty one, a NULL one, past the end
    // of the mapping.
    let cases: [(&[Seg], u64); 5] = [
        (&[], off),
        (&too_many, off),
        (&[one, (buf.as_ptr(), 0)], off),
        (&[one, (std::ptr::null(), 8)], off),
        (&[one, one], off + 4096 - 100),
    ];
    for (segs, at) in cases {
        #[allow(unsafe_code)]
        // SAFETY: refused: nothing is posted.
        let e = unsafe { xa.aio_writev(segs, at, 1) }.unwrap_err();
        let n = segs.len();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{n} segments at {at}");
    }
    // Exactly the limit is fine (and one completion).
    let at_limit = vec![(buf.as_ptr(), 1); XSocket::RIO_IOV_MAX];
    #[allow(unsafe_code)]
    // SAFETY: `buf` lives until the completion is collected.
    unsafe { xa.aio_writev(&at_limit, off, 2) }.unwrap();
    let done = completions(&xa, &xb, 1);
    assert_eq!(done[0].result, Ok(XSocket::RIO_IOV_MAX));
    assert_eq!(xa.aio_pending(), 0);
    xb.riounmap(target.as_mut_ptr()).unwrap();
}
