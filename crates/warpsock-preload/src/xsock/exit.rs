//! Exit and `_exit` in DDP mode: the closes of the sockets a program left
//! open (`exit`), and the bounded wait for the bytes still in send buffers
//! and engines' backlogs and for the closes the background still holds
//! (`_exit`, also from a signal handler over a call of the library's),
//! after which what could not leave is reset, never ended cleanly short.

use std::sync::atomic::Ordering;

use super::{census, config, linger, reaper, report, sock, BROKEN, REFUSED, SWITCHED};
use crate::shim::sys;

/// [`Kind::at_exit`] of DDP mode: the sockets left open closed as
/// `close` would, their bytes and the peers' FINs waited for, a bound.
pub(super) fn at_exit(over: crate::shim::guard::ExitOver) {
    use crate::shim::guard::ExitOver;
    let bound = config::get().linger;
    // Entered inside a call of this thread (a signal handler's
    // `exit`): over a stretch that may hold a lock, the bytes alone;
    // over a sleep that holds none (a blocking receive's, a send's
    // wait for credits, `poll`, `raise(SIGPIPE)`: review r26-a item
    // 1), the closes as from outside — the sleep's wait, which never
    // comes back, first lets its socket be read and driven again
    // (`interpose::exit_over`, before the stdio flush).
    if over == ExitOver::Locks {
        return exit_interrupted(bound);
    }
    // The sockets the program left open are closed as its `close`
    // would (`census::ExitCloses`): their bytes and end of stream
    // leave while the wait lasts.
    let mut closes = census::ExitCloses::begin(bound);
    let _ = linger::linger_stepping(bound, census::engine_backlogs, || closes.step());
    // What is still buffered, or held in an engine's backlog, will
    // never be sent: those peers get a reset, not a clean end after a
    // short stream (the kernel would send FIN for the closed
    // descriptors; review r21-b #4).
    warpsock_xsock::io::reset_buffered();
    census::reset_backlogged();
    // Then the peers' FINs, one bound at most.
    closes.linger(bound);
    // Background switches started or refused a place count too (or
    // refused one in the budget of DDP sockets): one that panicked, or
    // every one over a bound, ends in none of the others.
    let tried = [
        &SWITCHED,
        &REFUSED,
        &BROKEN,
        &super::switching::STARTED,
        &super::switching::OVER,
        &super::budget::OVER,
    ]
    .iter()
    .any(|c| c.load(Ordering::Relaxed) > 0);
    if tried && std::env::var("WARPSOCK_STATS").is_ok_and(|v| v == "1") {
        eprint!("{}", report());
        #[cfg(feature = "test-hooks")]
        eprint!("{}", crate::shim::hooks::audit::report());
    }
}

/// [`Kind::exit_flush`] of DDP mode (`_exit`).
pub(super) fn flush(over: crate::shim::guard::ExitOver) {
    // `_exit`: the bytes in send buffers, as at `exit` — not the
    // closes of `at_exit` (the sockets left open): `_exit` may run in
    // a signal handler (their locks, allocation) or a child made by
    // `vfork`, and skips exit handlers as the program asked; its
    // connections end with the process. The closes the program made
    // before (the reaper's) are waited for too, their sending and then
    // the acknowledgement of their bytes (below): the reaper's thread
    // steps them — over a locked stretch as well, within the limits
    // the `Locks` arm states.
    // Over a sleep of this thread's call (a handler's `_exit`), the
    // sleep's wait is given back first, as at `exit`: its socket stays
    // driving and parked otherwise, nothing reads the peer's credits,
    // and the flush waits its whole bound before a reset (review
    // r26-d item 5); only in the process that switched the sockets (a
    // vforked child's memory is its parent's, whose handler may go
    // back to that sleep; a forked child's sockets are not its own).
    //
    // Over a stretch that may hold a lock (a handler's `_exit` there,
    // among them the first 10 ms slice of every blocking receive), the
    // bytes-only wait of `exit_interrupted`, every lock tried and
    // nothing allocated, but without its `exit_begins` (`_exit` closes
    // nothing): before, nothing, and a response's tail a send had
    // returned for was lost if the signal came within those 10 ms
    // (review r27-b item 2). Only in the process that switched the
    // sockets, as below. The reaper's closes are waited for there too
    // (review r28-c item 9).
    use crate::shim::guard::ExitOver;
    if over != ExitOver::Nothing && !census::owns_sockets() {
        return;
    }
    match over {
        ExitOver::Locks => {
            // Inside this thread's own lingering close (a handler's
            // `_exit` in its wait): its bytes are stepped out here, as
            // at `exit` (`exit_interrupted`), not waited for a whole
            // bound with nothing stepping them, then reset; `_exit`
            // does not wait for its peer's FIN, but for the peer's
            // kernel's acknowledgement of its bytes and end of stream
            // (`OwnClose::waits`): ended before it, the process's end
            // left the kernel's queue to a socket the reader's credit
            // returns then reset (issue 12). One wait, one bound
            // without progress (review r28-b item 5: the sending's
            // bound then the acknowledgement's, twice the bound for a
            // close still sending to a peer that stopped reading).
            //
            // And the closes the program made before, which the
            // reaper holds, as from outside (below): while they send
            // (`linger::CLOSING`, the own close's count aside: it is
            // stepped here), then until their peers' kernels
            // acknowledged them (`exit_look`), in the same wait.
            // Before (review r28-c item 9), none was waited for here,
            // and a close's bytes still in its engine were lost, the
            // peer reading a clean end after a short stream. Safe over
            // held locks: the look takes no lock and allocates nothing
            // (atomics, an eventfd write, raw sleeps), and the reaper
            // is another thread, whose closes have no call left (their
            // last reference went), each with an engine of its own —
            // never the interrupted call's socket's. Its round does
            // take process-wide locks the interrupted stretch may
            // hold: the list of the send buffers holding bytes
            // (`sndbuf`'s holders: a close's buffer emptying; held by
            // a send whose buffer fills or empties) and malloc's
            // arenas (its allocations, its frees of memory other
            // threads allocated). Then the round waits
            // for good, its looks go unanswered (`exit_look` None
            // after 1 s each), its closes make no progress, the wait
            // ends after one bound without progress (plus those
            // looks), and the closes still sending are reset from
            // here (`reaper::reset_sending_unanswered`, lock-free):
            // their bytes lost, their peers reading `ECONNRESET`,
            // never a clean end. A close whose last reference is the
            // interrupted call's own is made only when that call
            // returns, never (review r29-a item 2). Its `release` took
            // the socket out of `SOCKS`, which `census`'s backlog sums
            // and resets go through: the bytes its engine still holds
            // are neither waited for nor reset (its send buffer's are,
            // `try_reset_buffered`), and the process's end closes the
            // kernel socket with a FIN — the peer may read a clean end
            // after a short stream. Its count in `linger::CLOSING`
            // never drops, and progress (`linger::moved`) is the whole
            // process's: the wait ends after a bound without any, but
            // other threads still sending keep it going, up to the 15
            // bounds. (The same for a close whose last reference
            // another thread's call holds, at an exit from outside,
            // if that call does not return meanwhile.) Not fixed: the
            // interrupted call's socket is not known here, and a
            // released socket kept in `SOCKS` until its drop would be
            // closed again by `exit`'s census (`ExitCloses`).
            let own = std::cell::RefCell::new(sock::close::own_close());
            let own_count = || {
                own.borrow()
                    .as_ref()
                    .map_or(0, sock::close::OwnClose::closing)
            };
            let idle = linger::linger_stepping_but(
                config::get().linger,
                census::engine_backlogs_trying,
                own_count,
                || {
                    let mine = own
                        .borrow_mut()
                        .as_mut()
                        .is_some_and(sock::close::OwnClose::waits);
                    // The reaper's look, as from outside: made while
                    // closes still send too, so the bytes their peers'
                    // kernels acknowledge count as progress
                    // (`linger::moved`; review r28-e item 3).
                    mine | exit_unacknowledged()
                },
            );
            #[cfg(feature = "test-hooks")]
            crate::shim::hooks::exit_flushed(idle);
            // Still sending past the bound: reset, as the reaper's.
            let _ = own
                .borrow()
                .as_ref()
                .is_some_and(sock::close::OwnClose::reset_if_sending);
            if !idle && reaper::exit_look(true).is_none() {
                // The reaper did not answer: its closes still sending
                // reset from here, as from outside.
                let _ = reaper::reset_sending_unanswered();
            }
            let _ = census::retry(warpsock_xsock::io::try_reset_buffered);
            census::reset_backlogged_trying();
            return;
        }
        ExitOver::Sleep(slept) => census::abandon_wait(slept),
        ExitOver::Nothing => {}
    }
    let bound = config::get().linger;
    if !census::owns_sockets() {
        // A vforked child (its memory, the reaper's counts, are its
        // parent's), or a forked child that switched no socket of its
        // own (its `REAPER` nulled and its counts reset at the fork:
        // `after_fork_child`; review r28-b item 12): the send buffers
        // alone, as before.
        let _idle = linger::linger_buffered(bound, census::engine_backlogs);
        #[cfg(feature = "test-hooks")]
        crate::shim::hooks::exit_flushed(_idle);
        warpsock_xsock::io::reset_buffered();
        census::reset_backlogged();
        return;
    }
    // The closes the program made before, which the reaper holds, are
    // waited for too (issue 12: `write; close; _exit(0)` lost the
    // bytes they still held, the reader got 2 MiB of 4 then
    // `ECONNRESET`; over TCP the kernel sends them after the
    // process): their sending (`linger::CLOSING`), as `exit` and
    // `exec` do, the bound started again while bytes leave; then,
    // one bound at most, the peer's kernel's acknowledgement of their
    // bytes and end of stream (`reaper::exit_look`), after which the
    // peer sends no credit that a closed socket would answer with a
    // reset dropping what its kernel had not sent. Not the peer's FIN
    // (`_exit` closes nothing). Closes still sending past the bound
    // are reset, as the send buffers' connections: the peer reads
    // `ECONNRESET`, never a clean end after a short stream.
    // One wait, one bound without progress, for both (review r28-b
    // item 5, r28-c item 6: a bound for the sending, then another
    // for the acknowledgement). Closes whose sending gave up are not
    // waited for (`Held::acknowledged`).
    // The reaper's look made while closes still send too: its looks
    // count the bytes their peers' kernels acknowledge, progress for
    // the wait (`linger::moved`; review r28-e item 3), the tail of a
    // close's sending included.
    let idle = linger::wait_for(
        bound,
        || exit_unacknowledged() | linger::closing(),
        census::engine_backlogs,
    );
    #[cfg(feature = "test-hooks")]
    crate::shim::hooks::exit_flushed(idle);
    if !idle && reaper::exit_look(true).is_none() {
        // The reaper did not answer (review r28-c item 7): its closes
        // still sending reset from here.
        let _ = reaper::reset_sending_unanswered();
    }
    warpsock_xsock::io::reset_buffered();
    census::reset_backlogged();
}

/// Whether closes the reaper holds are not yet acknowledged
/// ([`reaper::exit_look`]; `false` if no reaper answers: nothing known to
/// wait for).
fn exit_unacknowledged() -> bool {
    reaper::exit_look(false).is_some_and(|n| n > 0)
}

/// The exit entered inside the library (the guard set: a signal handler's
/// `exit` over a call of this thread, which may hold a socket's lock, its
/// engine's, [`sock::SOCKS`] or `malloc`'s, and never lets go): the
/// exit's closes (`census::ExitCloses`, which take the socket's lock and
/// allocate) would wait for ever, where TCP's process simply ends (review
/// r25-c item 3). The wait for the bytes alone then, as before those
/// closes, each lock tried a bounded while (`census::retry`): what sits
/// behind one not had is left to the kernel. No report (`WARPSOCK_STATS`:
/// it allocates).
fn exit_interrupted(bound: std::time::Duration) {
    // The other threads' calls that meet the resets below wait for the
    // process's end, as during the closes (review r26-a item 6).
    census::exit_begins();
    // Inside this thread's own lingering close (a handler's exit in its
    // wait, or after a `siglongjmp` out of one): no other thread steps
    // that close, nor will its frame, and its count is this exit's own;
    // the exit steps it while it waits, and waits for its count no more
    // (review r27-c item 1(b): it waited its whole bound for it, then
    // reset the peer, where Linux's close, ended by the signal, leaves
    // the rest to the kernel after the exit). The steps may allocate
    // (the engine's round): the frame under this exit is the close's
    // `ppoll`, which holds no lock, `malloc`'s neither.
    let own = std::cell::RefCell::new(sock::close::own_close());
    let _ = linger::linger_stepping_but(
        bound,
        census::engine_backlogs_trying,
        || {
            own.borrow()
                .as_ref()
                .map_or(0, sock::close::OwnClose::closing)
        },
        || {
            own.borrow_mut()
                .as_mut()
                .is_some_and(sock::close::OwnClose::step)
        },
    );
    let _ = census::retry(warpsock_xsock::io::try_reset_buffered);
    census::reset_backlogged_trying();
    // Then the reaper's closes still held, for the peers' FINs, one bound
    // at most, as at an exit from outside (`ExitCloses::linger`): its
    // thread needs no lock this one may hold. Ended under them, the
    // engines' sockets closed with the peers' credits unread in their
    // kernel's queue, which sends a reset (`tcp_close`'s
    // `data_was_unread`): the peer lost the stream's tail (a handler's
    // exit as a lingering close ends; review r27-c item 1).
    // Its own close among them, stepped here until acknowledged.
    let mut own = own.into_inner();
    let deadline = std::time::Instant::now() + bound;
    loop {
        let mine = own.as_ref().map_or(0, sock::close::OwnClose::held);
        // Its acknowledgement only once its sending ended: still sending
        // past the wait above, it made no progress for a bound, and a
        // second bound brings nothing (review r28-b item 5).
        let waits = mine == 1 && own.as_mut().is_some_and(sock::close::OwnClose::waits);
        if !waits && reaper::HELD.load(Ordering::Acquire) <= mine
            || std::time::Instant::now() >= deadline
        {
            return;
        }
        sys::sleep(std::time::Duration::from_millis(2));
    }
}
