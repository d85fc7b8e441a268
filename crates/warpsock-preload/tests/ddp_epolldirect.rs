//! epoll's rules on a DDP-mode socket whose input the program's own sets
//! watch (`shim::epollwatch`; issue 12): level- and edge-triggered,
//! one-shot, a `dup` in the same set, `EPOLL_CTL_DEL` and `MOD`, a set
//! closed and its number reused (`tests/c/epolldirect.c`). Each case
//! runs over plain TCP first; the lines printed must be the same.

mod common;

use common::same_over_tcp_and_ddp;

/// Runs case `name` over TCP and in DDP mode: the same lines.
fn same(name: &str) {
    same_over_tcp_and_ddp("epolldirect", name);
}

/// Level-triggered: reported while bytes are left; edge-triggered: once
/// per arrival, not again after a partial read.
#[test]
fn level_and_edge_triggered_sets_report_as_for_tcp() {
    same("lt");
    same("et");
}

/// The same with the set alone, whose waits report the input themselves
/// (`ddp_epoll_direct`), with no bell: level-triggered, again at each
/// wait while the input is left unread (reported once, memcached's worker
/// waited for good).
#[test]
fn a_lone_set_reports_input_itself_as_tcps_would() {
    for case in ["lt1", "et1"] {
        let ddp = same_over_tcp_and_ddp("epolldirect", case);
        assert!(ddp.stat("ddp_epoll_direct") >= 2, "{case}: {}", ddp.stderr);
    }
}

/// A one-shot registration reports once and nothing more until `MOD`
/// re-arms it: the wait leaves its report to the kernel (a second report
/// of the same arrival would hand one connection to two threads).
#[test]
fn a_one_shot_registration_is_reported_once() {
    same("oneshot");
}

/// A descriptor and its `dup` in one set: one event for each number; the
/// `dup`'s registration removed, the other's alone.
#[test]
fn a_dup_in_the_same_set_gets_its_own_event() {
    same("dup");
}

/// `EPOLL_CTL_DEL` stops the reports and a new `ADD` brings them back
/// (also with input sent between the two and no wait: the set's idle
/// watch, `del1`); `MOD` to output alone reports no input, and back to
/// input does.
#[test]
fn removed_and_changed_registrations_are_followed() {
    same("del");
    same("del1");
    same("mod");
}

/// Input the wait reported itself (no bell) is seen again by every
/// later look the kernel makes: a `MOD` back to input, an edge-triggered
/// re-arm, a second set (review 43 item 1: lost until the peer sent
/// again).
#[test]
fn a_mod_or_a_new_set_sees_input_reported_before() {
    same("mod1");
}

/// A set closed and a new one made (its number reused): the new set
/// watches the connection.
#[test]
fn a_new_set_on_a_closed_sets_number_watches() {
    same("reopen");
}
