//! A DDP-mode socket's close, made as its last reference goes.

use std::cell::Cell;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use libc::{c_int, socklen_t};
use warpsock_xsock::io::{Begun, Closing, Phase, XSocket};

use super::super::reaper::{self, Counted};
use super::DdpSock;
use crate::shim::guard::{busy, enter, locked_below};
use crate::shim::{fdtable, reactor, real, sys};
use crate::xsock::config;

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
        // Whether this thread is the closer or had a call on the socket
        // (not a third thread's drop of another's reference: review r26-b
        // item 1), read before anything here changes it.
        let may_wait = fdtable::close_may_wait();
        let how = self.closing.load(Ordering::Acquire);
        let linger_s = self.linger_s.load(Ordering::Acquire);
        // The close's count since the program's close (`release`).
        let counted = self
            .counted
            .swap(false, Ordering::AcqRel)
            .then(Counted::adopt);
        // A close that may wait (`SO_LINGER` {1, N > 0}, [`linger_close`])
        // blocks the program's signals first, before any of its work: one
        // that comes from here on stays pending and ends the wait at its
        // first `ppoll`, as a signal anywhere in Linux's `close(2)` makes
        // `sk_stream_wait_close` return at once. Blocked only from the
        // wait's start, one during the work before it (the closes below,
        // the look at unread bytes, the close's begin) ran its handler
        // then, and the close waited its whole N s (review r26-b item 4).
        // (One earlier in the interposed `close`, as the descriptor leaves
        // the table, before this drop, still runs its handler there: the
        // README says so.)
        let mask = (how == CLOSED && linger_s > 0 && may_wait).then(SignalsHeld::new);
        // SAFETY: `x` is not used again: this is the socket's drop.
        let x = unsafe { ManuallyDrop::take(&mut self.x) };
        if how == 0 {
            if forked_away(self.pid) {
                // A forked child's last reference to its parent's socket,
                // never closed in the child: its release made nothing
                // (`Socket::release`: a handler's fork inside the
                // program's close, before the release). Dropped, the
                // socket's `Qp::drop` shut the connection the parent
                // still uses: the peer read a clean end after the bytes
                // so far, and the parent's next send failed with
                // `ECONNRESET`. Forgotten, as every copy of the parent's
                // sockets the fork handlers find.
                forget_forked_copy(x, None, None);
            }
            return;
        }
        let pid = self.pid;
        // Library calls (the reset's, the hand-over's), from wherever the
        // last reference went: under the guard.
        let close = move || {
            if forked_away(pid) {
                // A child made by a handler's `fork` over the program's
                // close, before this drop's work, and returned from the
                // handler into it: the connection is the parent's
                // ([`forget_forked_copy`]). Its count, if any, was made
                // in the child (`release` after the fork) or is a
                // parent's the fork reset to 0: given back, saturating.
                forget_forked_copy(x, None, None);
                drop(counted);
                return;
            }
            // The program's memory is its own again before its close
            // returns (the rest of the close is the reaper's, later, when
            // the program may have freed it): `XSocket::detach_program_memory_within`,
            // waiting for a round of the progress thread that holds the
            // socket's lock; one try over a stretch of this thread's that
            // may hold it (a signal handler's close over a call).
            let patience = if locked_below() {
                Duration::ZERO
            } else {
                DETACH_PATIENCE
            };
            let detached = x.detach_program_memory_within(patience);
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
            // closer's drop looks and begins the close ([`begin_now`], a
            // round first), so that the look is the close's instant's; the
            // reaper does, later, for a drop that may hold the socket's
            // lock (a signal handler's `close` over a call) or that is
            // another thread's. (f0ec31d's look here, taken back, was
            // blamed for the benchmark's bidirectional DDP-socket failure
            // in CI; its reset never fired there — the engine's socket
            // closed at once was the cause, fixed by the linger, task
            // xclose.)
            //
            // Unless the program set `SO_LINGER` {1, N > 0}: then the
            // close waits here first, as Linux's ([`linger_close`]) — if
            // this drop is the closer's (the program's `close`, `dup2`
            // over the descriptor) or a call's of this thread's on the
            // socket as it returns (a call in flight held the last
            // reference, as Linux's `fdget`). A drop made for another
            // thread — a scan that frees entries other threads' calls
            // kept (`fdtable::without_close_waits`), a walk of every
            // socket — hands the close over unbegun, at once: Linux's
            // last `fput` is never a third thread's.
            // (`reset`: the close's own look found bytes unread and reset
            // the connection, handed over as an abortive close.)
            let (x, begun, counted, forked, reset) = match (mask.as_ref(), counted) {
                (Some(m), Some(k)) => {
                    let bound = Duration::from_secs(linger_s as u64);
                    let (x, begun, k, forked) = linger_close(x, bound, m, k, pid);
                    (x, begun, Some(k), forked, false)
                }
                // Not after a detach that missed the lock (it waited its
                // patience already: the begin would wait as long again).
                (_, k) if how == CLOSED && may_wait && detached && !locked_below() => {
                    match begin_now(&x) {
                        Some(Begun::Orderly(c)) => (x, Some(c), k, false, false),
                        Some(Begun::Reset) => (x, None, k, false, true),
                        None => (x, None, k, false, false),
                    }
                }
                (_, k) => (x, None, k, false, false),
            };
            if forked || forked_away(pid) {
                // A child made by a handler's `fork` inside the wait,
                // returned from the handler (review r28-e item 4): the
                // close, its count and its socket are the parent's, which
                // steps them on; the child neither steps nor hands them
                // over ([`forget_forked_copy`]). Its `close` returns 0.
                forget_forked_copy(x, begun, counted);
                return;
            }
            #[cfg(feature = "test-hooks")]
            if begun.is_some() && mask.is_some() {
                signal_after_the_wait();
            }
            // Handed over before the program's mask is back: a signal that
            // came meanwhile and did not end a wait is delivered at the
            // mask's restore, and its handler may `exit` (or leave with
            // `siglongjmp`). The close is the reaper's by then, stepped on
            // while that exit waits for it; held by this frame, nothing
            // stepped it, the exit waited its whole bound for this
            // thread's own count, then reset the peer (and a `siglongjmp`
            // left the count raised for good; review r27-c item 1).
            reaper::hand_over(x, how == CLOSED_ABORTIVE || reset, begun, counted, pid);
            drop(mask);
        };
        if busy() {
            close();
        } else {
            enter((), close);
        }
    }
}

/// Whether this process is not `pid`, the one that switched the socket
/// being closed: a child made by `fork` in a signal handler that ran
/// over the close (in the interposed `close` before the socket's drop,
/// or in the lingering close's wait, [`linger_wait`]'s `ppoll`), whose
/// handler returned into the close's code: the child's copy of a close
/// of its parent's. (The fork handlers forget the parent's sockets the
/// descriptor table holds, `interpose::demote_all`; this one had left it
/// already.)
///
/// A system call (`getpid`): asked where a fork may just have been made
/// (after a signal's handler ran in the lingering close's wait, a switch
/// after its handshake), never on every close: there [`forked_away`].
fn forked_copy(pid: i32) -> bool {
    sys::getpid() != pid
}

/// [`forked_copy`] without the system call (review r29-a item 3: every
/// close made up to six `getpid`s): this process is not `pid` as the fork
/// handlers leave it — `SOCKS_OWNER`, the process that switched the
/// sockets, which a child made by `fork` starts at none
/// (`sock::forget_after_fork`) and sets to itself when it switches one
/// of its own. A child made without the handlers (`vfork`, `_Fork`,
/// `clone`) sees its parent's: it is not told here (its `close` and `dup`s
/// of managed descriptors never get here: `fdtable::borrowed`, whose
/// `getpid` is the close's one), nor is a child of a handler's `_Fork`
/// (no handler runs) returning into a close outside the lingering wait's
/// `ppoll`, which asks the system ([`linger_wait`]).
pub(in crate::xsock) fn forked_away(pid: i32) -> bool {
    super::SOCKS_OWNER.load(Ordering::Acquire) != pid
}

/// Whether this process is a child made by `fork`, its fork handlers run
/// (the parent's engine forgotten: `reactor::current()` none, or the
/// child's own), of process `pid`, which switched the socket: the child's
/// copy of that socket is the parent's, and nothing the child does to it
/// may touch the connection ([`forget_forked_copy`]). Not a vforked child
/// (nor one made without the handlers: `_Fork`, `clone`), which still
/// sees the parent's engine, not its own: its close of the parent's
/// socket never gets here (`interpose::close` and the `dup`s make the
/// system calls alone there: `fdtable::borrowed`, review r29-a item
/// 1). Asked by `xsock::switch` (`pid` the process that began the
/// switch: a child of a handler's `fork` inside it), a `getpid` there;
/// a socket's release and drop ask [`forked_away`], none.
pub(in crate::xsock) fn forked_child(pid: i32) -> bool {
    forked_copy(pid) && reactor::current().is_none_or(reactor::Reactor::is_owner)
}

/// A forked child's copy of its parent's close ([`forked_copy`]) ends as
/// a plain close of the child's descriptor, which the interposed `close`
/// made already: the connection is not touched. Its socket, close and
/// count are forgotten, never stepped, handed over nor dropped (review
/// r28-e item 4): the engine's socket is shared with the parent, whose
/// own close goes on there — a step of the child's read the parent's
/// credit returns and wrote frames into its stream, a hand-over started
/// a reaper of the child's that went on doing so, and a drop
/// (`Qp::drop`) would send an end of stream. Their memory is leaked and
/// the child's copies of the engine's descriptors stay open, as for every
/// socket of the parent's a child inherits (`interpose::demote_all`).
/// The child's `close` returns 0, as the parent's, and as Linux's close
/// of a descriptor whose file another process still holds.
/// (The close, `_begun`, is books alone: its drop touches nothing.)
fn forget_forked_copy(x: XSocket, _begun: Option<Closing>, counted: Option<Counted>) {
    std::mem::forget(x);
    // The count is the parent's (a child's counts start at 0).
    std::mem::forget(counted);
}

/// The first wait between two looks at the engine's socket once its FIN
/// is out: the peer's acknowledgement of it wakes no poll (a socket whose
/// write side is shut polls writable for good), so it is looked at after
/// each slice. The slice doubles after each look that saw nothing change
/// (the step's phase, `tcpi_state`, `tcpi_unacked`), up to
/// [`ACK_SLICE_MAX`], and is back to this after a change: a peer that
/// stopped acknowledging (its host gone, black-holed) with a linger of
/// N s costs about N × 5 looks, not N × 200, each a `ppoll`, an engine
/// round and a `TCP_INFO` (review r26-b item 2); Linux sleeps until the
/// state changes (`sk_stream_wait_close`), which no poll here can show.
const ACK_SLICE: Duration = Duration::from_millis(5);

/// The longest slice the backing off reaches.
const ACK_SLICE_MAX: Duration = Duration::from_millis(200);

/// How long a close waits for the socket's lock to give the program its
/// memory back ([`XSocket::detach_program_memory_within`]): another
/// thread holds it for a round or a look, far shorter; a holder stopped
/// longer (descheduled under load) leaves the detach to the close's start.
const DETACH_PATIENCE: Duration = Duration::from_secs(1);

/// The longest wait while sending: input and output space wake it, the
/// slice is a safety net (as the reaper's sweep) for a step's books that
/// changed with no event on the engine's socket.
const SEND_SLICE: Duration = Duration::from_millis(50);

/// The program's orderly close begun in its own call, before the
/// reaper steps it ([`XSocket::close_begin_or_reset_within`]): the look
/// at unread bytes and the point past which the peer's bytes reset the
/// connection are the close's instant's, as Linux's `tcp_close` makes
/// them. Begun later by the reaper, bytes the peer sent after the close
/// (before it read our end of stream) were taken for bytes left unread:
/// a reset with no end of stream, where TCP's peer read its end first
/// (diffuzz seed 3650). [`Begun::Reset`]: received bytes were unread,
/// the connection is reset (handed over as an abortive close). `None`:
/// left to the reaper, as before — the process's exit began, the last
/// reference went on the library's progress thread (as [`linger_close`]),
/// or the lock was not had within [`DETACH_PATIENCE`].
fn begin_now(x: &XSocket) -> Option<Begun> {
    if exit_begun() || reactor::on_progress_thread() {
        return None;
    }
    x.close_begin_or_reset_within(config::get().linger, DETACH_PATIENCE)
}

/// `close` with `SO_LINGER` {1, N > 0}, as Linux's: `inet_release` gives
/// `tcp_close` the linger time as its timeout (unless the process is
/// exiting: `PF_EXITING`, here [`exit_begun`]), and `tcp_close` waits in
/// `sk_stream_wait_close` until the socket is no longer closing —
/// `FIN_WAIT1`, `CLOSING`, `LAST_ACK`: until every byte queued and the
/// FIN are acknowledged — or the time passes, whatever `O_NONBLOCK` says;
/// the close then returns 0 and the rest goes on in the background.
///
/// Here the close begins and steps the orderly close itself (the
/// reaper's [`Closing`] steps: [`XSocket::try_close_begin_or_reset`],
/// [`XSocket::try_close_step`]) until it is acknowledged
/// ([`acknowledged`]) or `bound` passed, and returns it for the reaper to
/// step on from there (the linger for the peer's FIN stays the reaper's):
/// `None` if it could not begin — the process's exit began, the last
/// reference went on the library's progress thread (no program call
/// there to block, and every socket's progress would wait with it; as
/// Linux's last `fput` outside a process's call, which a kernel worker
/// makes), bytes received are unread (a reset, the reaper's:
/// `XSocket::unread`), or the socket's lock is taken (a signal handler's
/// close over a call of this thread's on it: no wait for it) — and the
/// reaper makes the whole close as before.
///
/// While it sends the close is counted in `linger::CLOSING`, as the
/// reaper's sending closes are: an exit that another thread makes
/// meanwhile waits for its bytes too. Once its sending ended the count
/// moves to the reaper's `HELD` ([`Counted::sent`]), as the reaper's
/// closes' do: an exit then waits for the acknowledgement no longer than
/// for the peer's FIN (review r27-c item 3). The count (`counted`, made
/// at the program's close) goes to the reaper with the close
/// ([`reaper::hand_over`]): dropped here, the close was in no count
/// until the hand-over's — which may first start the reaper (an eventfd,
/// an epoll set, a thread) — and an exit sampled then ended its wait
/// early and left a close still sending to die with the process (review
/// r26-b item 3).
///
/// A signal ends the wait, and the close returns 0 all the same: Linux's
/// `sk_stream_wait_close` stops at a pending signal (`signal_pending`)
/// and returns nothing, and the descriptor is gone by then (the close
/// cannot fail, nor be restarted). So does a `pthread_cancel` acted on
/// (`warpsock_xsock::cancel::after_signal`): the descriptor is closed, so
/// the close is not undone; the cancel stays pending, acted on at the
/// thread's next cancellation point (glibc's `close` acts on one pending
/// at its start, before the descriptor closes: the interposed `close`
/// does too). The preload's own signal sent with a cancel this thread
/// does not act on now does not end it. Each wait is a raw `ppoll`, never
/// a cancellation point.
///
/// `mask`: the program's signals, blocked by the caller before the
/// close's work began; each wait is made with the program's own mask.
///
/// The socket, its close and its count live on the heap ([`Lingering`])
/// while the close waits, and the wait's `ppoll` names them to the
/// thread's exit ([`OWN`]): a program's signal is delivered there, and
/// its handler's `exit` steps this close itself and does not wait for its
/// count, its own ([`own_close`]; review r27-c item 1(b): it waited its
/// whole bound for that count, nothing stepping the close, then reset the
/// peer). Returns the socket and count with the close begun, for the
/// hand-over.
fn linger_close(
    x: XSocket,
    bound: Duration,
    mask: &SignalsHeld,
    counted: Counted,
    pid: i32,
) -> (XSocket, Option<Closing>, Counted, bool) {
    // No wait of this thread's is under way: one named still was left by
    // a `siglongjmp` out of its handler. The reaper takes it on.
    let left = OWN.with(|o| o.replace(std::ptr::null_mut()));
    if !left.is_null() {
        // SAFETY: `OWN` names a live `Lingering` boxed below, whose frame
        // a jump abandoned (never given back: no drop ran).
        let l = unsafe { Box::from_raw(left) };
        reaper::hand_over(l.x, false, Some(l.c), Some(l.counted), pid);
    }
    if exit_begun() || reactor::on_progress_thread() {
        return (x, None, counted, false);
    }
    let start = Instant::now();
    // Each phase's bound (without progress) is the program's linger if
    // longer than the library's: the close waits that long for a peer
    // that stopped reading, as Linux's, rather than give up (and reset)
    // at `WARPSOCK_LINGER_MS`; the reaper keeps it. A reset (bytes
    // unread) is the reaper's to finish: it looks again, and finds them.
    let Some(Begun::Orderly(c)) =
        x.try_close_begin_or_reset(config::get().linger.max(bound), start)
    else {
        return (x, None, counted, false);
    };
    let own = Boxed(Box::into_raw(Box::new(Lingering {
        x,
        c,
        counted,
        acked: None,
    })));
    let forked = linger_wait(own.0, start + bound, mask, pid);
    let Lingering { x, c, counted, .. } = own.take();
    (x, Some(c), counted, forked)
}

/// A lingering close under way ([`linger_close`]): its socket, its close
/// and its exit count.
struct Lingering {
    x: XSocket,
    c: Closing,
    counted: Counted,
    /// Its engine's socket's bytes acknowledged at an exit's last look
    /// ([`exit_acknowledged`]).
    acked: Option<u64>,
}

thread_local! {
    /// The calling thread's [`Lingering`] while its wait sleeps in its
    /// `ppoll` (null else): what an exit made by a signal handler there
    /// finds ([`own_close`]). Cleared in a child made by `fork`
    /// ([`forget_own_after_fork`]); a child whose handler returns into the
    /// wait forgets the close there too ([`forget_forked_copy`]).
    ///
    /// A `siglongjmp` out of that handler leaves it set, the close whole
    /// on the heap (its frame gone), and skips [`enter`]'s restore of the
    /// guard, which stays set on this thread for good: the thread's later
    /// calls go straight to libc (`busy`), so its later `close` never
    /// reaches [`linger_close`] (whose hand-over of a close left here is
    /// for a guard put back otherwise) and the close is stepped by no one
    /// — its socket, engine memory and `linger::CLOSING` count kept until
    /// the thread's exit (or the process's, the thread ended first: no
    /// destructor), every other thread's `exit` waiting a whole
    /// `WARPSOCK_LINGER_MS` for that count, the peer getting no end of
    /// stream until the process ends (review r28-b item 4). Any later
    /// exit of this thread is told `Locks` and steps the close
    /// ([`own_close`]), which allocates (an engine round): from a handler
    /// over the program's `malloc` (SIGTERM there) it may then block on
    /// the arena's lock for good (review r28-b item 3; not fixed: telling
    /// the ppoll's frame from a jump's needs the stack address).
    /// A `const` thread-local of a `Copy` type: a handler's first access
    /// allocates nothing.
    static OWN: Cell<*mut Lingering> = const { Cell::new(std::ptr::null_mut()) };
}

/// The boxed [`Lingering`] of [`linger_close`], freed (its count given
/// back) if a panic ends the wait; [`Self::take`] on the way out.
struct Boxed(*mut Lingering);

impl Boxed {
    fn take(self) -> Lingering {
        let p = self.0;
        std::mem::forget(self);
        // SAFETY: `p` came from `Box::into_raw` and is taken back once.
        *unsafe { Box::from_raw(p) }
    }
}

impl Drop for Boxed {
    fn drop(&mut self) {
        OWN.with(|o| {
            if o.get() == self.0 {
                o.set(std::ptr::null_mut());
            }
        });
        // SAFETY: as in `take` (a panic's unwinding: not taken).
        drop(unsafe { Box::from_raw(self.0) });
    }
}

/// The lingering close the calling thread's exit runs over — a signal
/// handler's `exit` inside that close's wait, or any after a `siglongjmp`
/// out of such a handler — taken (a nested signal's exit finds none), or
/// `None`. Not a close of another thread's, nor one this thread's frame
/// is stepping (outside the wait's `ppoll` the program's signals are
/// blocked).
pub(crate) fn own_close() -> Option<OwnClose> {
    // A vforked child runs on its parent's thread (its `OWN`): the close
    // is the parent's, which its handler's exit may still want; left
    // named (review r28-b item 1).
    if !crate::xsock::census::owns_sockets() {
        return None;
    }
    let p = OWN.with(|o| o.replace(std::ptr::null_mut()));
    // SAFETY: `OWN` names a live `Lingering` (`linger_wait` names it only
    // across its `ppoll`, where its frame does not touch it, and a jump
    // leaves it allocated); the exit never returns to that frame.
    (!p.is_null()).then(|| OwnClose(unsafe { &mut *p }))
}

/// In a child made by `fork` (its fork handler; its only thread, a copy
/// of the forking one): a lingering close the copied [`OWN`] names is the
/// parent's — its socket's engine and kernel socket shared with the
/// parent — and is forgotten, its box leaked (dropped, it would close
/// descriptors the parent still uses). Before, a handler's `fork` inside
/// the close's wait left the child's `exit` stepping the parent's close
/// on the shared engine socket: reading the parent's credit returns,
/// writing frames into its stream (review r28-b item 1). A child whose
/// handler returns, back in the wait's frame, forgets the close there
/// ([`linger_wait`], [`forget_forked_copy`]; review r28-e item 4).
pub(crate) fn forget_own_after_fork() {
    OWN.with(|o| o.set(std::ptr::null_mut()));
}

/// This thread's lingering close, for its exit ([`own_close`]).
pub(crate) struct OwnClose(&'static mut Lingering);

impl OwnClose {
    /// Its count in `linger::CLOSING`: 1 while it sends, else 0 (then in
    /// `reaper::HELD`).
    pub(crate) fn closing(&self) -> usize {
        usize::from(!self.0.counted.is_held())
    }

    /// Its count in `reaper::HELD`: 1 once its sending ended.
    pub(crate) fn held(&self) -> usize {
        usize::from(self.0.counted.is_held())
    }

    /// A step, as [`linger_close`]'s (the socket's lock tried: another
    /// thread's call may hold it); whether it still sends.
    pub(crate) fn step(&mut self) -> bool {
        let l = &mut *self.0;
        let _ = l.x.try_close_step(&mut l.c, Instant::now());
        if l.c.phase() != Phase::Sending {
            l.counted.sent();
        }
        l.c.phase() == Phase::Sending
    }

    /// Whether it still waits for the peer's acknowledgement (as
    /// [`linger_close`]), a step made first: not once its sending gave up
    /// (its end of stream sits behind bytes a peer not reading never
    /// takes, or it was reset: nothing an exit's wait can bring; review
    /// r28-c item 6).
    pub(crate) fn waits(&mut self) -> bool {
        self.step();
        let l = &mut *self.0;
        l.c.phase() != Phase::Done
            && l.c.all_left() != Some(false)
            && !exit_acknowledged(&l.c, l.x.tcp_fd(), &mut l.acked)
    }

    /// Whether it still sends; if so, its connection is reset (as the
    /// reaper's closes still sending at `_exit`'s end, `reaper::exit_look`):
    /// the process's end would close its engine's socket with bytes the
    /// library still holds unsent, and the peer read a clean end after a
    /// short stream.
    pub(crate) fn reset_if_sending(&self) -> bool {
        let sending = self.0.c.phase() == Phase::Sending;
        if sending {
            self.0.x.reset_now();
        }
        sending
    }
}

/// [`linger_close`]'s wait, until `end` at most, for the close `own` of
/// a socket process `pid` switched. Returns whether this is a child a
/// signal handler's fork made in the wait ([`forked_copy`]).
fn linger_wait(own: *mut Lingering, end: Instant, mask: &SignalsHeld, pid: i32) -> bool {
    // The program's signals blocked but in the waits (`ppoll` with the
    // program's mask, `mask`): one that comes before the first wait or
    // between two is pending at the next, which it ends (as
    // `signal_pending` in Linux's loop), never lost to a handler run
    // while no wait was there to see it.
    #[cfg(feature = "test-hooks")]
    signal_before_the_wait();
    let mut ack_slice = ACK_SLICE;
    let mut seen = None;
    loop {
        // SAFETY: `own` is `linger_close`'s box, alive across this call;
        // only this frame uses it here (`OWN` names it only across the
        // `ppoll` below, where this reference is not used).
        let Lingering { x, c, counted, .. } = unsafe { &mut *own };
        let now = Instant::now();
        // The lock taken (a call of another thread's on this socket has
        // none: its reference would hold the drop back): no step this
        // time, a slice's wait.
        let stepped = x.try_close_step(c, now);
        // The engine's socket looked at once the sending is over (before,
        // the step's books are what changes, and the send slice holds).
        let look = (
            c.phase(),
            (c.phase() != Phase::Sending)
                .then(|| tcp_look(x.tcp_fd()))
                .flatten(),
        );
        if c.phase() != Phase::Sending {
            counted.sent();
        }
        if c.phase() == Phase::Done || acknowledged(c, look.1) || now >= end {
            return false;
        }
        if seen != Some(look) {
            seen = Some(look);
            ack_slice = ACK_SLICE;
        }
        if warpsock_xsock::cancel::pending() {
            // A cancel noted while no wait was there (`SIGCANCEL` is not
            // blocked: glibc keeps it out of every mask).
            return false;
        }
        let slice = if stepped.is_none() || c.phase() != Phase::Sending {
            let s = ack_slice;
            ack_slice = (ack_slice * 2).min(ACK_SLICE_MAX);
            s
        } else {
            SEND_SLICE
        };
        let until = c.deadline().min(end).min(now + slice);
        let left = until.saturating_duration_since(Instant::now());
        let mut p = [libc::pollfd {
            fd: x.tcp_fd(),
            events: x.close_events(),
            revents: 0,
        }];
        let ts = libc::timespec {
            tv_sec: left.as_secs() as libc::time_t,
            tv_nsec: left.subsec_nanos() as libc::c_long,
        };
        // The program's signals are delivered in this `ppoll` alone:
        // their handlers' exits find the close there (`own_close`).
        OWN.with(|o| o.set(own));
        // SAFETY: one live pollfd; the program's mask, saved above.
        let n = unsafe { sys::ppoll_raw(p.as_mut_ptr(), 1, Some(ts), &mask.0) };
        OWN.with(|o| o.set(std::ptr::null_mut()));
        if n < 0 && sys::errno() == libc::EINTR {
            if forked_copy(pid) {
                // A handler's `fork` in the `ppoll` (a handler ran: the
                // `ppoll` fails with `EINTR`, never restarted), and this
                // is the child, returned from the handler: no step of the
                // parent's close here (the caller forgets it:
                // `forget_forked_copy`), whatever the signal was (review
                // r28-e item 4). Asked of the system only here: a child
                // of `_Fork`, which runs no fork handler, is told too.
                return true;
            }
            if warpsock_xsock::cancel::after_signal() != Some(false) {
                // The program's signal (its handler has run), or a cancel
                // to act on: the wait ends, the close returns 0.
                return false;
            }
        }
        // Ready, or the slice or a deadline passed: a step, a look.
    }
}

/// `WARPSOCK_TEST_LINGER_SIGNAL`: the number of a signal the closing
/// thread sends itself after its lingering close began, before its first
/// wait: one that comes during the close's work (`tests/ddp_linger.rs`'s
/// early case; it must end the wait, not run its handler there and leave
/// the close waiting).
#[cfg(feature = "test-hooks")]
fn signal_before_the_wait() {
    if let Some(sig) = config::get().hooks.linger_signal {
        // SAFETY: a signal to the calling thread.
        unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), libc::gettid(), sig) };
    }
}

/// `WARPSOCK_TEST_LINGER_SIGNAL_AFTER`: the number of a signal the
/// closing thread sends itself once its lingering close's wait ended,
/// before the close is handed over and the program's mask put back: its
/// handler runs at the mask's restore (`tests/ddp_linger.rs`'s sigexit
/// case, whose handler calls `exit`).
#[cfg(feature = "test-hooks")]
fn signal_after_the_wait() {
    if let Some(sig) = config::get().hooks.linger_signal_after {
        // SAFETY: a signal to the calling thread.
        unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), libc::gettid(), sig) };
    }
}

/// The calling thread's asynchronous signals blocked while this lives
/// (faults never), its mask before kept (`.0`) for the waits and put back
/// as it drops.
struct SignalsHeld(libc::sigset_t);

impl SignalsHeld {
    fn new() -> Self {
        Self(sys::block_async_signals())
    }
}

impl Drop for SignalsHeld {
    fn drop(&mut self) {
        // SAFETY: the saved set; the calling thread's mask only.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut()) };
    }
}

/// Whether close `c`'s bytes and end of stream are out and acknowledged
/// as far as the engine can tell: its sending phase is over (every byte
/// went through the send buffer and the transmit slots to the engine, or
/// the close gave up on them), and the engine's TCP socket is past
/// Linux's closing states — `FIN_WAIT2`, `TIME_WAIT` or `CLOSE`. The
/// engine shuts its socket's write side only once it has handed the
/// kernel every byte it held (its backlog behind a full send buffer
/// included), so `FIN_WAIT2` or `TIME_WAIT` means the peer's kernel
/// acknowledged all of them and the FIN — what Linux's `tcp_close` waits
/// for (`sk_stream_closing`). Not that the peer's engine or program read
/// them: TCP's close does not wait for that either (its credits come
/// back as the program reads, and a program may read only after the
/// end). `CLOSE` is a connection reset or failed meanwhile: nothing more
/// to wait for, as Linux's. (`SIOCOUTQ` 0 alone is not enough: it is 0
/// too before the engine's FIN went, while the engine still holds bytes
/// of its own.)
/// `look` is the engine's socket's [`tcp_look`].
pub(crate) fn acknowledged(c: &Closing, look: Option<(c_int, u32)>) -> bool {
    c.phase() != Phase::Sending
        && matches!(
            look.map(|l| l.0),
            Some(TCP_FIN_WAIT2 | TCP_TIME_WAIT | TCP_CLOSE)
        )
}

/// Bytes of the closes an exit waits for that their peers' kernels
/// acknowledged, counted as the exit's looks see them
/// ([`exit_acknowledged`]): only grows. Progress for the exit's wait
/// (`linger::moved`), as bytes leaving the library are: on a slow link a
/// close's tail is acknowledged at a steady pace after every byte left
/// the library, and a wait that counted only the latter ended after one
/// bound with the tail still being acknowledged, and reset it (review
/// r28-e item 3).
static ACKED: AtomicU64 = AtomicU64::new(0);

/// [`ACKED`]'s count.
pub(crate) fn acked() -> u64 {
    ACKED.load(Ordering::Acquire)
}

/// [`acknowledged`] for an exit's look at close `c` (its engine's socket
/// `fd`), the bytes the peer's kernel acknowledged since the close's last
/// look (`seen`, updated; none counted at the first) added to [`ACKED`].
pub(crate) fn exit_acknowledged(c: &Closing, fd: c_int, seen: &mut Option<u64>) -> bool {
    acknowledged(c, count_acked(fd, seen))
}

/// [`tcp_look`] of `fd`, counting the growth of its bytes acknowledged
/// since `seen` in [`ACKED`] ([`exit_acknowledged`]).
fn count_acked(fd: c_int, seen: &mut Option<u64>) -> Option<(c_int, u32)> {
    let (look, bytes) = tcp_info(fd)?;
    if let Some(before) = seen.replace(bytes) {
        ACKED.fetch_add(bytes.saturating_sub(before), Ordering::AcqRel);
    }
    Some(look)
}

/// Linux's TCP states (include/net/tcp_states.h; the libc crate lacks
/// them).
const TCP_FIN_WAIT2: c_int = 5;
const TCP_TIME_WAIT: c_int = 6;
const TCP_CLOSE: c_int = 7;

/// TCP socket `fd`'s state and count of segments sent and not yet
/// acknowledged (`TCP_INFO`'s `tcpi_state`, its first byte, and
/// `tcpi_unacked`, the `u32` at byte 24: eight bytes of `u8` fields, then
/// `tcpi_rto`, `tcpi_ato`, `tcpi_snd_mss`, `tcpi_rcv_mss`), or `None` if
/// the kernel did not say (the count 0 if it gave less).
pub(crate) fn tcp_look(fd: c_int) -> Option<(c_int, u32)> {
    tcp_info(fd).map(|(look, _)| look)
}

/// [`tcp_look`], and `tcpi_bytes_acked` (the `u64` at byte 120, Linux 4.1;
/// 0 if the kernel gave less): the bytes of the stream the peer's kernel
/// acknowledged, which only grows.
fn tcp_info(fd: c_int) -> Option<((c_int, u32), u64)> {
    let mut info = [0u8; 128];
    let mut len = info.len() as socklen_t;
    // SAFETY: getsockopt into a buffer on the stack, its size given (the
    // kernel copies at most that much of its `tcp_info`).
    let r = unsafe {
        real::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    let unacked = if len >= 28 {
        u32::from_ne_bytes([info[24], info[25], info[26], info[27]])
    } else {
        0
    };
    let acked = if len >= 128 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&info[120..128]);
        u64::from_ne_bytes(b)
    } else {
        0
    };
    (r == 0 && len >= 1).then(|| ((c_int::from(info[0]), unacked), acked))
}

#[cfg(test)]
pub(super) mod tests;
