//! Readiness of a DDP-mode socket that waits saw wrongly, each case
//! passing against the kernel's TCP first (the program is the
//! specification), then with its pairs switched:
//! * the peer's `shutdown(SHUT_WR)` shows as `POLLRDHUP`/`EPOLLRDHUP`
//!   (`tests/c/rdhupddp.c`; `xsock/sock/calls.rs` `readable_bits`,
//!   `Doorbell::shut_reading`): it showed `POLLIN` alone until the
//!   connection was finished both ways; the peer's close alone is one
//!   edge and no `POLLHUP` (TCP's CLOSE_WAIT): the queue pair's close made
//!   a second edge, with `EPOLLHUP`;
//! * a `poll` that sees new bytes, then an epoll wait (`tests/c/
//!   pollepoll.c`; `XSocket::covered`): the poll's round took the edge the
//!   set's watch of the connection waited for, and the wait found
//!   nothing for bytes still readable.

mod common;

use common::over_tcp_then_ddp;

#[test]
fn the_peers_half_close_shows_as_rdhup() {
    over_tcp_then_ddp("rdhupddp", 9);
}

#[test]
fn an_epoll_wait_after_a_poll_reports_the_bytes_the_poll_saw() {
    over_tcp_then_ddp("pollepoll", 3);
}
