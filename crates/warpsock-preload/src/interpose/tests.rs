//! Unit tests of the entry points over a kind's socket, made here so
//! that no kind names `interpose` (its tests neither: the kinds sit
//! below the interposer).

use warpsock_xsock::io::RecvFlags;

mod epoll_close;
mod exit_kinds;

use crate::shim::forktest::HUNG;
use crate::shim::{fdtable, sys};

/// review r29-a item 3: the close of a DDP socket in the process that
/// switched it makes one `getpid` in all (the interposed `close`'s
/// `fdtable::borrowed`, for a vforked child): its release and drop
/// compare with the pid the fork handlers leave (`SOCKS_OWNER`), and a
/// lingering close's wait asks the system only after a signal's handler
/// ran in its `ppoll`. Before: the release's `forked_child` and its two
/// engine-owner checks, the drop's two `forked_copy`, and one per `ppoll`.
/// An ordinary close and a lingering one (`SO_LINGER` {1, 5}); the peer
/// then reads the end of stream.
#[test]
fn a_close_in_the_switching_process_makes_one_getpid() {
    let _serial = fdtable::tests::support::serial();
    for linger in [0, 5] {
        let (fd, peer) = crate::xsock::sock::as_a_close_finds_it(linger);
        let before = sys::getpids();
        // SAFETY: the interposed close of the test's descriptor.
        let r = unsafe { super::close(fd) };
        let made = sys::getpids() - before;
        assert_eq!(r, 0, "the close (SO_LINGER {linger} s)");
        assert!(
            made <= 1,
            "the close of a DDP socket (SO_LINGER {linger} s) in the process that switched it \
             made {made} getpid calls, 1 at most wanted"
        );
        let mut buf = [0u8; 1];
        let end = peer.recv(&mut buf, RecvFlags::default(), Some(HUNG));
        assert!(
            matches!(end, Ok((0, _))),
            "the peer after the close (SO_LINGER {linger} s): {end:?}"
        );
    }
}
