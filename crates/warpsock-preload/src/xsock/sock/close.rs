//! A DDP-mode socket's close, made as its last reference goes.

use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicI32, Ordering};

use super::super::reaper;
use super::DdpSock;
use crate::shim::guard::{busy, enter};
use crate::shim::sys;

/// The thread that makes the exit's closes of the sockets the program
/// left open (`census::ExitCloses`); 0 before.
pub(crate) static EXITING: AtomicI32 = AtomicI32::new(0);

/// A send failed with `EPIPE`, or a receive met the end of stream or the
/// connection's failure: if the process is exiting and this is another
/// thread than the exiting one, the failure may be the exit's close of
/// its socket (its write side shut), or the peer's answer to it (its FIN
/// or reset, which the exit's wait takes in; review r25-c item 4), which
/// over TCP never come while the program runs — its kernel sends on after
/// the process, and the peer's answer finds no process. Such a thread
/// waits for the process's end (it is near: the exit waits one linger at
/// most), rather than fail, or die of `SIGPIPE` and make the exit's
/// status a signal's, or run its "peer closed" path during the exit
/// (print, close, `_exit` with a status of its own). Its bytes are not
/// sent: the peer reads a clean end after what was sent before, as over
/// TCP if the process had ended before the call. Every DDP socket of the
/// process is the exit's to close (those whose lock it cannot have it
/// leaves to the kernel, their threads stopped): a receive of any of them
/// waits so.
#[cold]
pub(super) fn park_if_exiting() {
    let t = EXITING.load(Ordering::Acquire);
    // SAFETY: gettid has no preconditions.
    if t != 0 && t != unsafe { libc::gettid() } {
        loop {
            std::thread::park();
        }
    }
}

/// Whether the process's exit began its closes (`census::ExitCloses`):
/// from then on the doorbells wake no waiter (`Bell for DdpSock`): the
/// peers' answers to those closes (FIN, reset) come while the program's
/// threads still run, where TCP's come after the process (review r25-c
/// item 4).
pub(crate) fn exit_begun() -> bool {
    EXITING.load(Ordering::Acquire) != 0
}

/// [`DdpSock::closing`]: an orderly close, an abortive one.
pub(super) const CLOSED: u8 = 1;
pub(super) const CLOSED_ABORTIVE: u8 = 2;

/// The last reference: a socket the program closed is closed now. Linux's
/// close acts at the file's last reference, and a call in flight holds one
/// (`fdget`): a call blocked in another thread goes on (bytes that come
/// are its), and the peer sees nothing until it returns (review r23-a item
/// 4: the close reset the connection under it, or ended the stream).
/// Here that reference is the socket's last `Arc`: the release's, or the
/// call's as it returns.
impl Drop for DdpSock {
    fn drop(&mut self) {
        sys::close(self.kfd);
        sys::close(self.dead);
        // SAFETY: `x` is not used again: this is the socket's drop.
        let x = unsafe { ManuallyDrop::take(&mut self.x) };
        let how = self.closing.load(Ordering::Acquire);
        if how == 0 {
            return;
        }
        // Library calls (the reset's, the hand-over's), from wherever the
        // last reference went: under the guard.
        let close = move || {
            if how == CLOSED_ABORTIVE {
                x.reset_now();
            }
            // In the background, by the process's reaper thread: the end
            // of stream goes after every byte sent, then the engine's
            // socket stays open, the peer's input discarded, until the
            // peer's FIN (or the linger): closed at once, it answered the
            // credits of a peer still reading our last messages with a
            // reset, which lost them (the benchmark's bidirectional
            // DDP-socket test's `ECONNRESET`; `XSocket::linger_after_close`).
            // close(2) (or the call) returns at once, as for TCP.
            //
            // Bytes received and never read make it a reset, as TCP's
            // (`tcp_close`'s `data_was_unread`, review r23-a item 9): the
            // reaper looks (`XSocket::unread`, a round first), not this
            // drop, which may run in a signal handler's `close`. (f0ec31d's
            // look, taken back, was blamed for the benchmark's
            // bidirectional DDP-socket failure in CI; its reset never fired
            // there — the engine's socket closed at once was the cause,
            // fixed by the linger, task xclose.)
            reaper::hand_over(x, how == CLOSED_ABORTIVE);
        };
        if busy() {
            close();
        } else {
            enter((), close);
        }
    }
}
