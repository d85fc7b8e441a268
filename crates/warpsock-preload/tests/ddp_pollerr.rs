//! Readiness of a DDP-mode socket whose peer reset the connection
//! (`tests/c/pollerr.c`; issue 12): `poll`, `select` and `epoll` (level
//! and edge) report what Linux's TCP reports — `POLLERR` beside
//! `POLLHUP`, `POLLIN` and `POLLRDHUP` while the error is pending (epoll's
//! `EPOLLERR` unasked, one edge of it), none once `SO_ERROR` or a failed
//! `recv` took it. Each case runs over plain TCP first; the lines printed
//! must be the same.

mod common;

use common::same_over_tcp_and_ddp;

/// Runs case `name` over TCP and in DDP mode: the same lines.
fn same(name: &str) {
    same_over_tcp_and_ddp("pollerr", name);
}

/// `poll` after the peer's reset: `POLLERR` until `SO_ERROR` takes it
/// (or a `recv` that fails with `ECONNRESET`), `POLLHUP` after; also after
/// the peer's end of stream (`EPIPE`, TCP's `CLOSE_WAIT`).
#[test]
fn poll_shows_pollerr_until_the_error_is_taken() {
    same("poll");
    same("pollrecv");
    same("pollasleep");
    same("pollfin");
}

/// `epoll_wait`, level-triggered, `EPOLLERR` reported unasked (with
/// `EPOLLIN|EPOLLRDHUP` asked, and with `EPOLLOUT` alone).
#[test]
fn level_triggered_epoll_reports_epollerr_unasked_until_taken() {
    same("epoll");
    same("epollout");
}

/// `epoll_wait`, edge-triggered: one edge at the reset, with `EPOLLERR`.
/// (With the reset made while the waiter sleeps, TCP itself gives one
/// edge or two as the scheduler has it: that case does not compare the
/// second.)
#[test]
fn edge_triggered_epoll_gets_one_edge_with_epollerr() {
    same("epollet");
    same("epolletasleep");
}

/// `select`: readable and writable after the reset, not exceptional.
#[test]
fn select_after_a_reset_as_tcps() {
    same("select");
}

/// A reset after this end's own `SHUT_WR`: the send reports the pending
/// `ECONNRESET` (and takes it), not the shutdown's `EPIPE`, as Linux's
/// `tcp_sendmsg` (`sk_stream_error`); the next send `EPIPE`.
#[test]
fn a_send_after_the_shutdown_reports_the_pending_reset() {
    same("sendshut");
}

/// A `poll` asking for `POLLERR` alone sees the reset, as TCP's; one
/// asking for nothing after the peer's close waits its time out without
/// spinning (`pollnonefin` checks the CPU it took: it fails where the
/// engine's socket, readable for good after the FIN, is polled). That such
/// a poll is driven at all is `ddp_diffuzz`'s seeds 292 and 295: here a
/// progress round made for an earlier poll's lapsing stand-in may take the
/// reset in first.
#[test]
fn a_poll_for_the_end_alone_sees_the_reset_and_does_not_spin() {
    same("pollnone");
    same("pollnoneasleep");
    same("pollnonefin");
}
