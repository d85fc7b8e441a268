//! DDP-mode readiness under the preload: what `poll`, `select` and
//! `epoll` report agrees with what the following read does (issue 12).

mod common;

use common::{c_program, command, finish};

/// Message mode's held part (review r19-xdead item 6, `tests/c/heldpart.c`):
/// part of a message a read would return only once its end comes is not
/// readable to `poll`, `select` or level-triggered `epoll_wait` (an event
/// loop woken for it spun on `EAGAIN`); an edge-triggered `epoll_wait`
/// fires when the rest comes, and every read after a poll that said
/// readable returns bytes.
#[test]
fn a_held_part_no_read_would_return_is_not_readable() {
    let child = command(&c_program("heldpart"), &[], true)
        .env("WARPSOCK_DDP_SLOTS", "16")
        .env("WARPSOCK_DDP_SLOT_KB", "1")
        // Unbuffered: the sender's non-blocking send stops at its last
        // credit (a buffered one answers EAGAIN or takes it all).
        .env("WARPSOCK_DDP_SNDBUF", "0")
        .spawn()
        .expect("spawn heldpart");
    let r = finish(child, std::time::Duration::from_secs(60));
    r.assert_ok("heldpart");
    assert_eq!(r.stat("ddp_switched"), 2, "{}", r.stderr);
}

/// A forked child's first `select` leaves the parent's DDP sockets alone
/// (issue 12, `tests/c/forkselect.c`): the parent, which never waited in
/// `select` or `epoll_wait`, holds a byte processed and unread when it
/// forks; once the child's first `select` ended and the parent read the
/// byte, the parent's `select` finds nothing readable. Fails without the
/// child's own table of DDP sockets (`xsock::sock::forget_after_fork`):
/// the child's first doorbell wait rang the parent's bell, which stayed.
/// Through the doorbells (`WARPSOCK_DDP_SELECT_DIRECT=0`, where that walk
/// is made) and as polls (the default: a `select` naming no DDP socket is
/// the real one).
#[test]
fn a_forked_childs_first_select_leaves_the_parents_readiness() {
    for direct in ["0", "1"] {
        let child = command(&c_program("forkselect"), &[], true)
            .env("WARPSOCK_DDP_SELECT_DIRECT", direct)
            .spawn()
            .expect("spawn forkselect");
        let r = finish(child, std::time::Duration::from_secs(60));
        r.assert_ok(&format!("forkselect, WARPSOCK_DDP_SELECT_DIRECT={direct}"));
        assert_eq!(r.stat("ddp_switched"), 2, "{}", r.stderr);
    }
}

/// A vforked child's close of an inherited DDP-mode descriptor, and its
/// `dup2` over another, close its own descriptor numbers alone (review
/// r29-a item 1, `tests/c/vforkclose.c`): the child shares the parent's
/// memory, and its close removed the parent's table entry, deregistered
/// the socket from the parent's engine and dropped it (an end of stream
/// on the parent's connection). The parent's pair must then carry a byte
/// each way and close cleanly; the child `_exit`s, or execs `/bin/true`.
/// "reuse" (review r29-c item 2): the child opens `/dev/null` under the
/// number it closed and writes to it; the parent's peer must not read it.
#[test]
fn a_vforked_childs_close_leaves_the_parents_connection() {
    for mode in ["exit", "exec", "reuse"] {
        let child = command(&c_program("vforkclose"), &[mode.to_owned()], true)
            .spawn()
            .expect("spawn vforkclose");
        let r = finish(child, std::time::Duration::from_secs(60));
        r.assert_ok(&format!("vforkclose {mode}"));
        assert_eq!(r.stat("ddp_switched"), 2, "{mode}: {}", r.stderr);
    }
}

/// A child made by `syscall(SYS_fork)` (no fork handler: it keeps its
/// parent's descriptor table owner) that switches a pair of its own and
/// closes one end ends its own stream (review r29-c item 1,
/// `tests/c/sysforkclose.c`): the close of the child's own DDP socket was
/// the raw system call of a borrowed entry (the socket stayed in the
/// table, the engine kept the connection open, the peer's poll timed
/// out). The parent's own pair is left alone.
#[test]
fn a_sys_fork_childs_close_of_its_own_socket_ends_its_stream() {
    let child = command(&c_program("sysforkclose"), &[], true)
        .spawn()
        .expect("spawn sysforkclose");
    let r = finish(child, std::time::Duration::from_secs(60));
    r.assert_ok("sysforkclose");
}

/// A vforked child's switch of a plain connected socket of its own is
/// refused with `EOPNOTSUPP` (review r29-c item 3, `tests/c/vforkswitch.c`):
/// it wrote the census's owner in the memory it shares with its parent,
/// whose own DDP closes were then leaked with no end of stream. The
/// parent's close must then read as 0 at its peer.
#[test]
fn a_vforked_childs_switch_is_refused_and_the_parents_close_ends_its_stream() {
    let child = command(&c_program("vforkswitch"), &[], true)
        .spawn()
        .expect("spawn vforkswitch");
    let r = finish(child, std::time::Duration::from_secs(60));
    r.assert_ok("vforkswitch");
}

/// `select` and `pselect` over a DDP-mode pair answer as Linux's over TCP
/// (`tests/c/selectddp.c`): a timeout clears the set and writes the time
/// left back, readable and writable sockets and a plain pipe in one call,
/// `EBADF` with the sets untouched for a number not open, `EINTR` for a
/// signal the wait's mask lets in, the peer's close readable. Made as a
/// poll (the default) and through the doorbells
/// (`WARPSOCK_DDP_SELECT_DIRECT=0`).
#[test]
fn select_over_a_ddp_socket_answers_as_over_tcp() {
    for direct in ["1", "0"] {
        let child = command(&c_program("selectddp"), &[], true)
            .env("WARPSOCK_DDP_SELECT_DIRECT", direct)
            .spawn()
            .expect("spawn selectddp");
        let r = finish(child, std::time::Duration::from_secs(60));
        r.assert_ok(&format!("selectddp, WARPSOCK_DDP_SELECT_DIRECT={direct}"));
        assert!(r.stdout.contains("selectddp: ok"), "{}", r.stdout);
        assert_eq!(r.stat("ddp_switched"), 2, "{}", r.stderr);
        if direct == "1" {
            assert!(r.stat("ddp_poll_rounds") > 0, "{}", r.stderr);
        }
    }
}

/// glibc's second names of the interposed calls (`__poll`, `__select`,
/// `__read`, `__write`, `__send`, `__connect`, `__close`, `__fcntl`,
/// `__dup2`; `tests/c/aliasddp.c`) over DDP sockets act as the first
/// names: `O_NONBLOCK` set, bytes carried over the DDP stream, their
/// arrival seen by `__poll` and `__select`, a copy reading them, `__close`
/// read as the end of stream, `__connect` switched in policy mode.
/// Without the aliases the first `__read` of nothing blocks (the library
/// never heard of `O_NONBLOCK`); without those of the waits `__poll`
/// waits out its 10 s.
#[test]
fn glibc_second_names_of_the_calls_act_as_the_first() {
    let child = command(&c_program("aliasddp"), &[], true)
        .env("WARPSOCK_DDP_PORTS", "1-65535")
        .env("WARPSOCK_DDP_ADDRS", "127.0.0.2/32")
        .spawn()
        .expect("spawn aliasddp");
    let r = finish(child, std::time::Duration::from_secs(60));
    r.assert_ok("aliasddp");
    assert!(r.stdout.contains("aliasddp: ok"), "{}", r.stdout);
    assert_eq!(r.stat("ddp_switched"), 4, "{}", r.stderr);
}
