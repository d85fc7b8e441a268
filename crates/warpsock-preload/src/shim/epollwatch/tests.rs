//! The watched registrations' books against a fake kernel, and the tags.

use std::cell::RefCell;
use std::sync::atomic::{AtomicI32, Ordering};

use super::table::Idle;
use super::*;

/// One `epoll_ctl`: (set, op, descriptor, events, data).
type Call = (c_int, c_int, c_int, u32, u64);

/// A kernel that records its calls and fails those it is told to.
#[derive(Default)]
struct Fake {
    calls: RefCell<Vec<Call>>,
    /// `(epfd, op)` that fail, with the errno.
    fail: RefCell<Vec<(c_int, c_int, c_int)>>,
}

impl Kernel for Fake {
    fn ctl(&self, epfd: c_int, op: c_int, fd: c_int, events: u32, data: u64) -> Result<(), c_int> {
        self.calls.borrow_mut().push((epfd, op, fd, events, data));
        match self.fail.borrow().iter().find(|f| (f.0, f.1) == (epfd, op)) {
            Some(f) => Err(f.2),
            None => Ok(()),
        }
    }
}

/// A socket that counts its coverage.
#[derive(Default)]
struct Counted {
    covers: AtomicI32,
}

impl Socket for Counted {
    fn kernel_fd(&self) -> c_int {
        -1
    }
    fn add_ref(&self) {}
    fn release(&self) {}
    fn nonblocking(&self) -> bool {
        false
    }
    fn set_nonblocking(&self, _on: bool) {}
    unsafe fn recvmsg(&self, _msg: &mut libc::msghdr, _flags: c_int) -> isize {
        -1
    }
    unsafe fn sendmsg(&self, _msg: &libc::msghdr, _flags: c_int) -> isize {
        -1
    }
    fn direct_watch(&self) -> Option<c_int> {
        Some(77)
    }
    fn direct_cover(&self, on: bool) {
        self.covers
            .fetch_add(if on { 1 } else { -1 }, Ordering::SeqCst);
    }
}

const BASE_T: u64 = 0xabcd_ef01_0000_0000;

fn sock() -> Arc<dyn Socket> {
    Arc::new(Counted::default())
}

fn reg(fd: c_int, events: i32, data: u64) -> Reg {
    Reg {
        fd,
        events: events as u32,
        data,
    }
}

/// The last call's tag.
fn last_tag(k: &Fake) -> u64 {
    k.calls.borrow().last().expect("a call").4
}

/// A registration watches the socket's descriptor in the program's set
/// (edge-triggered input, a tag as data); the tag names the socket and
/// the program's registration, reported by the call itself when it is a
/// plain one for input.
#[test]
fn a_registration_watches_the_socket_in_the_programs_set() {
    let k = Fake::default();
    let mut t = Table::default();
    let s = sock();
    let ch = t
        .cover(&k, BASE_T, 5, &s, 77, reg(4, libc::EPOLLIN, 42))
        .expect("covered");
    assert_eq!(ch.len(), 1);
    assert!(ch[0].1);
    let c = k.calls.borrow()[0];
    assert_eq!((c.0, c.1, c.2), (5, libc::EPOLL_CTL_ADD, 77));
    assert_eq!(c.3, WATCH_EVENTS);
    assert_eq!(c.4 & BASE_MASK, BASE_T);
    let (found, r) = t.arrival(c.4).expect("the socket");
    assert!(Arc::ptr_eq(&found, &s));
    assert_eq!(r, Some(reg(4, libc::EPOLLIN, 42)));
    assert!(t.arrival(c.4 ^ 1).is_none(), "another generation");
}

/// One-shot, exclusive and output-only registrations are not reported
/// by the call (the bell rings, the kernel reports); MOD changes that.
#[test]
fn only_plain_input_registrations_are_reported_by_the_call() {
    let k = Fake::default();
    let mut t = Table::default();
    let s = sock();
    t.cover(
        &k,
        BASE_T,
        5,
        &s,
        77,
        reg(4, libc::EPOLLIN | libc::EPOLLONESHOT, 1),
    )
    .unwrap();
    let tag = last_tag(&k);
    assert_eq!(t.arrival(tag).unwrap().1, None, "one-shot");
    t.modify(5, address(&s), reg(4, libc::EPOLLIN | libc::EPOLLET, 2));
    assert_eq!(
        t.arrival(tag).unwrap().1,
        Some(reg(4, libc::EPOLLIN | libc::EPOLLET, 2)),
        "edge-triggered input is reported"
    );
    t.modify(5, address(&s), reg(4, libc::EPOLLOUT, 3));
    assert_eq!(t.arrival(tag).unwrap().1, None, "output only");
    t.modify(
        5,
        address(&s),
        reg(4, libc::EPOLLIN | libc::EPOLLEXCLUSIVE, 3),
    );
    assert_eq!(t.arrival(tag).unwrap().1, None, "exclusive");
}

/// A second number of the same socket (a `dup`) in the same set: the
/// bell rings for it (two registrations, two datas); the last removal
/// leaves the watch idle (no system call, the socket still covered), and
/// the release before a wait takes it out of the set.
#[test]
fn the_watch_goes_with_the_last_registration() {
    let k = Fake::default();
    let mut t = Table::default();
    let s = sock();
    t.cover(&k, BASE_T, 5, &s, 77, reg(4, libc::EPOLLIN, 1))
        .unwrap();
    let tag = last_tag(&k);
    let ch = t
        .cover(&k, BASE_T, 5, &s, 77, reg(9, libc::EPOLLIN, 2))
        .unwrap();
    assert!(ch.is_empty(), "a second registration is no new coverage");
    assert_eq!(t.arrival(tag).unwrap().1, None, "two registrations");
    t.uncover(5, address(&s), 4);
    assert!(!t.has_idle());
    assert_eq!(t.arrival(tag).unwrap().1, Some(reg(9, libc::EPOLLIN, 2)));
    let calls = k.calls.borrow().len();
    t.uncover(5, address(&s), 9);
    assert_eq!(k.calls.borrow().len(), calls, "idle: no system call");
    assert!(t.has_idle());
    assert_eq!(t.arrival(tag).unwrap().1, None, "idle: nothing to report");
    let ch = t.release_idle(&k);
    assert_eq!(ch.len(), 1);
    assert!(!ch[0].1);
    let c = *k.calls.borrow().last().unwrap();
    assert_eq!((c.0, c.1, c.2), (5, libc::EPOLL_CTL_DEL, 77));
    assert!(t.arrival(tag).is_none());
    assert!(!t.has_idle());
    t.uncover(5, address(&s), 9);
    assert!(!t.has_idle(), "nothing left");
    assert!(t.release_idle(&k).is_empty());
}

/// An event loop's `DEL` and `ADD` per message (redis's `ae`: the mask
/// moves from input to output and back) keep the set's watch: the `ADD`
/// after a `DEL` makes no system call of ours and changes no coverage;
/// the tag stays the same, and the release before the wait finds nothing
/// idle. Once the process made a set meanwhile, the set's number may name
/// another set (closed behind the interposer and made again): the kernel
/// is asked (`EPOLL_CTL_MOD`), and a refusal watches afresh.
#[test]
fn a_del_and_add_per_message_keep_the_watch() {
    let k = Fake::default();
    let mut t = Table::default();
    let s = sock();
    t.cover(&k, BASE_T, 5, &s, 77, reg(4, libc::EPOLLIN, 1))
        .unwrap();
    let tag = last_tag(&k);
    let calls = k.calls.borrow().len();
    for round in 0..3 {
        t.uncover(5, address(&s), 4);
        let ch = t
            .cover(&k, BASE_T, 5, &s, 77, reg(4, libc::EPOLLOUT, 1))
            .unwrap();
        assert!(ch.is_empty(), "round {round}: still covered");
        assert!(!t.has_idle(), "round {round}");
        assert!(t.release_idle(&k).is_empty());
        t.uncover(5, address(&s), 4);
        t.cover(&k, BASE_T, 5, &s, 77, reg(4, libc::EPOLLIN, 1))
            .unwrap();
        assert_eq!(
            t.arrival(tag).unwrap().1,
            Some(reg(4, libc::EPOLLIN, 1)),
            "round {round}"
        );
    }
    assert_eq!(k.calls.borrow().len(), calls, "no system call of ours");
    // A set made between the DEL and the ADD.
    t.uncover(5, address(&s), 4);
    t.sets_made += 1;
    t.cover(&k, BASE_T, 5, &s, 77, reg(4, libc::EPOLLIN, 1))
        .unwrap();
    assert_eq!(
        k.calls.borrow()[calls..].to_vec(),
        vec![(5, libc::EPOLL_CTL_MOD, 77, WATCH_EVENTS, tag)]
    );
    t.uncover(5, address(&s), 4);
    t.sets_made += 1;
    covered_afresh(&k, &mut t, &s, reg(4, libc::EPOLLIN, 1));
    assert!(!t.has_idle());
}

/// Covers `s` (watching 77) again in set 5 with the kernel refusing the
/// look (`EPOLL_CTL_MOD`: the number names another set by now): watched
/// afresh — the old entry's coverage ends and a new one's begins, its
/// watch added (`EPOLL_CTL_ADD`). Returns the new tag.
fn covered_afresh(k: &Fake, t: &mut Table, s: &Arc<dyn Socket>, r: Reg) -> u64 {
    k.fail
        .borrow_mut()
        .push((5, libc::EPOLL_CTL_MOD, libc::ENOENT));
    let ch = t.cover(k, BASE_T, 5, s, 77, r).unwrap();
    assert_eq!(
        ch.iter().map(|c| c.1).collect::<Vec<_>>(),
        vec![false, true],
        "watched afresh"
    );
    let c = *k.calls.borrow().last().unwrap();
    assert_eq!((c.0, c.1, c.2), (5, libc::EPOLL_CTL_ADD, 77));
    c.4
}

/// An idle entry is no registration of the program's: a socket idle in
/// one set and registered in another is reported by the other's wait
/// itself (alone). An idle record whose place changed hands is no longer
/// the place's: the place's new entry, idle in turn and registered
/// again, is active, and the release leaves it (the generation).
#[test]
fn an_idle_entry_starves_no_one() {
    let k = Fake::default();
    let mut t = Table::default();
    let a = sock();
    t.cover(&k, BASE_T, 5, &a, 77, reg(4, libc::EPOLLIN, 1))
        .unwrap();
    t.uncover(5, address(&a), 4);
    let ch = t
        .cover(&k, BASE_T, 6, &a, 77, reg(4, libc::EPOLLIN, 2))
        .unwrap();
    assert_eq!(ch.len(), 1, "another set covers it once more");
    let tag6 = last_tag(&k);
    assert_eq!(t.arrival(tag6).unwrap().1, Some(reg(4, libc::EPOLLIN, 2)));
    let ch = t.release_idle(&k);
    assert_eq!(ch.len(), 1);
    assert!(!ch[0].1);
    assert!(t.arrival(tag6).is_some(), "set 6's stays");
    // Idle, its set closed, the place taken by another socket's entry,
    // idle in turn and registered again.
    let b = sock();
    t.cover(&k, BASE_T, 7, &b, 78, reg(3, libc::EPOLLIN, 3))
        .unwrap();
    let tag_b = last_tag(&k);
    t.uncover(7, address(&b), 3);
    assert_eq!(t.set_closed(&k, 7).len(), 1);
    assert!(!t.has_idle(), "the closed set's record went with it");
    let c = sock();
    t.cover(&k, BASE_T, 8, &c, 79, reg(2, libc::EPOLLIN, 4))
        .unwrap();
    let tag_c = last_tag(&k);
    assert_eq!(tag_b >> GEN_BITS, tag_c >> GEN_BITS, "the place is reused");
    t.idle.push(Idle {
        at: ((tag_b & !BASE_MASK) >> GEN_BITS) as usize,
        gen: (tag_b & ((1 << GEN_BITS) - 1)) as u32,
        sets_made: 0,
    });
    // A set made before the new entry went idle: its own record says
    // no set was made since (the stale one would have the kernel asked).
    t.sets_made = 1;
    t.uncover(8, address(&c), 2);
    let calls = k.calls.borrow().len();
    t.cover(&k, BASE_T, 8, &c, 79, reg(2, libc::EPOLLIN, 5))
        .unwrap();
    assert_eq!(k.calls.borrow().len(), calls, "the place's own record");
    assert!(t.release_idle(&k).is_empty(), "the new entry is not idle");
    assert_eq!(t.arrival(tag_c).unwrap().1, Some(reg(2, libc::EPOLLIN, 5)));
}

/// An idle entry ends with its socket's number (redis's `DEL` then
/// `close`) or its socket: the watch leaves the set and the socket its
/// coverage, once; no record is left for the release.
#[test]
fn an_idle_entry_goes_with_its_number_or_its_socket() {
    let k = Fake::default();
    let mut t = Table::default();
    let a = sock();
    t.cover(&k, BASE_T, 5, &a, 77, reg(4, libc::EPOLLIN, 1))
        .unwrap();
    let tag = last_tag(&k);
    t.uncover(5, address(&a), 4);
    let ch = t.number_closed(&k, address(&a), 4);
    assert_eq!(ch.len(), 1);
    assert!(!ch[0].1);
    let c = *k.calls.borrow().last().unwrap();
    assert_eq!((c.0, c.1, c.2), (5, libc::EPOLL_CTL_DEL, 77));
    assert!(t.arrival(tag).is_none());
    assert!(!t.has_idle());
    assert!(t.release_idle(&k).is_empty(), "once");
    let b = sock();
    t.cover(&k, BASE_T, 6, &b, 78, reg(3, libc::EPOLLIN, 2))
        .unwrap();
    t.uncover(6, address(&b), 3);
    t.forget(&k, address(&b));
    assert!(!t.has_idle());
    let c = *k.calls.borrow().last().unwrap();
    assert_eq!((c.0, c.1, c.2), (6, libc::EPOLL_CTL_DEL, 78));
}

/// A tag read before its place changed hands names nothing.
#[test]
fn a_stale_tag_names_no_socket() {
    let k = Fake::default();
    let mut t = Table::default();
    let a = sock();
    t.cover(&k, BASE_T, 5, &a, 77, reg(4, libc::EPOLLIN, 1))
        .unwrap();
    let tag_a = last_tag(&k);
    t.uncover(5, address(&a), 4);
    t.release_idle(&k);
    let b = sock();
    t.cover(&k, BASE_T, 5, &b, 78, reg(6, libc::EPOLLIN, 2))
        .unwrap();
    let tag_b = last_tag(&k);
    assert_eq!(tag_a >> GEN_BITS, tag_b >> GEN_BITS, "the place is reused");
    assert!(t.arrival(tag_a).is_none(), "the old tag");
    assert!(Arc::ptr_eq(&t.arrival(tag_b).unwrap().0, &b));
}

/// A socket registered again in a set whose number was closed behind the
/// interposer (the set's registration of the watch is gone: MOD fails)
/// is watched afresh; and an ADD that finds a registration of ours left
/// behind takes it over.
#[test]
fn a_set_number_reused_is_watched_afresh() {
    let k = Fake::default();
    let mut t = Table::default();
    let a = sock();
    t.cover(&k, BASE_T, 5, &a, 77, reg(4, libc::EPOLLIN, 1))
        .unwrap();
    let tag = covered_afresh(&k, &mut t, &a, reg(4, libc::EPOLLIN, 2));
    assert_eq!(t.arrival(tag).unwrap().1, Some(reg(4, libc::EPOLLIN, 2)));
    let k2 = Fake::default();
    k2.fail
        .borrow_mut()
        .push((6, libc::EPOLL_CTL_ADD, libc::EEXIST));
    let b = sock();
    t.cover(&k2, BASE_T, 6, &b, 78, reg(3, libc::EPOLLIN, 7))
        .expect("taken over");
    let c = *k2.calls.borrow().last().unwrap();
    assert_eq!((c.0, c.1, c.2), (6, libc::EPOLL_CTL_MOD, 78));
}

/// A set the program closes: its sockets lose it, others keep theirs.
#[test]
fn a_closed_set_loses_its_sockets() {
    let k = Fake::default();
    let mut t = Table::default();
    let (a, b) = (sock(), sock());
    t.cover(&k, BASE_T, 5, &a, 77, reg(4, libc::EPOLLIN, 1))
        .unwrap();
    let tag_a = last_tag(&k);
    t.cover(&k, BASE_T, 6, &b, 78, reg(3, libc::EPOLLIN, 2))
        .unwrap();
    let tag_b = last_tag(&k);
    let ch = t.set_closed(&k, 5);
    assert_eq!(ch.len(), 1);
    assert!(Arc::ptr_eq(&ch[0].0, &a));
    assert!(t.arrival(tag_a).is_none());
    assert!(t.arrival(tag_b).is_some());
    assert!(t.set_closed(&k, 5).is_empty(), "once");
}

/// A socket that ends leaves every set.
#[test]
fn a_socket_that_ends_leaves_every_set() {
    let k = Fake::default();
    let mut t = Table::default();
    let a = sock();
    t.cover(&k, BASE_T, 5, &a, 77, reg(4, libc::EPOLLIN, 1))
        .unwrap();
    t.cover(&k, BASE_T, 6, &a, 77, reg(4, libc::EPOLLIN, 1))
        .unwrap();
    t.forget(&k, address(&a));
    let dels: Vec<c_int> = k
        .calls
        .borrow()
        .iter()
        .filter(|c| c.1 == libc::EPOLL_CTL_DEL)
        .map(|c| c.0)
        .collect();
    assert_eq!(dels, vec![5, 6]);
    assert!(t.by_key.is_empty());
    assert_eq!(t.entries.iter().filter(|e| e.is_some()).count(), 0);
}

/// A refused watch leaves nothing behind and reports the errno.
#[test]
fn a_refused_watch_is_an_error() {
    let k = Fake::default();
    let mut t = Table::default();
    k.fail
        .borrow_mut()
        .push((5, libc::EPOLL_CTL_ADD, libc::ENOSPC));
    let a = sock();
    assert_eq!(
        t.cover(&k, BASE_T, 5, &a, 77, reg(4, libc::EPOLLIN, 1))
            .err(),
        Some(libc::ENOSPC)
    );
    assert!(t.by_key.is_empty());
    assert_eq!(t.free.len(), 1);
}

/// Tags: this process's base, a parent's, and the program's data (no
/// user-space address or small number has the top bit).
#[test]
fn tags_are_told_from_the_programs_data() {
    let b = base();
    assert_ne!(b & 1 << 63, 0);
    assert_eq!(b & !BASE_MASK, 0);
    assert_eq!(tag_kind(b | 5), Some(true));
    FOREIGN[2].store(0x8000_1234_0000_0000, Ordering::SeqCst);
    assert_eq!(tag_kind(0x8000_1234_0000_0007), Some(false));
    FOREIGN[2].store(0, Ordering::SeqCst);
    assert_eq!(tag_kind(7), None);
    assert_eq!(tag_kind(0x7fff_ffff_f000), None, "an address");
    assert_eq!(tag_kind(u64::MAX), None, "-1");
}

/// A level-triggered report is looked at again by its set's next wait
/// only (taken off the list: marked again if reported again); a removed
/// entry leaves the list.
#[test]
fn level_reports_are_looked_at_again_by_their_set() {
    let k = Fake::default();
    let mut t = Table::default();
    let (a, b) = (sock(), sock());
    t.cover(&k, BASE_T, 5, &a, 77, reg(4, libc::EPOLLIN, 1))
        .unwrap();
    let tag_a = last_tag(&k);
    t.cover(&k, BASE_T, 6, &b, 78, reg(3, libc::EPOLLIN, 2))
        .unwrap();
    let tag_b = last_tag(&k);
    t.mark_level(tag_a);
    t.mark_level(tag_a);
    t.mark_level(tag_b);
    let got = t.levels(5);
    assert_eq!(got.len(), 1, "set 5's alone, once");
    assert!(Arc::ptr_eq(&got[0].0, &a));
    assert_eq!((got[0].1, got[0].2), (reg(4, libc::EPOLLIN, 1), tag_a));
    assert!(t.levels(5).is_empty(), "taken off");
    t.uncover(6, address(&b), 3);
    assert!(t.levels(6).is_empty(), "idle: no registration to report");
    assert!(t.levels.is_empty());
    t.release_idle(&k);
    assert!(t.levels.is_empty());
    t.mark_level(tag_b);
    assert!(t.levels.is_empty(), "a stale tag marks nothing");
}

/// A closed number's registrations leave the books (a `dup`'s live on);
/// its last one takes the watch.
#[test]
fn a_closed_number_leaves_the_books() {
    let k = Fake::default();
    let mut t = Table::default();
    let a = sock();
    t.cover(&k, BASE_T, 5, &a, 77, reg(4, libc::EPOLLIN, 1))
        .unwrap();
    let tag = last_tag(&k);
    t.cover(&k, BASE_T, 5, &a, 77, reg(9, libc::EPOLLIN, 2))
        .unwrap();
    assert!(t.number_closed(&k, address(&a), 4).is_empty(), "9 lives on");
    assert_eq!(t.arrival(tag).unwrap().1, Some(reg(9, libc::EPOLLIN, 2)));
    let ch = t.number_closed(&k, address(&a), 9);
    assert_eq!(ch.len(), 1);
    assert!(t.arrival(tag).is_none());
}

/// A marked report whose registration a MOD made edge-triggered or
/// one-shot is not looked at again (the kernel reports those).
#[test]
fn a_level_mark_goes_with_a_mod_to_edge_or_one_shot() {
    let k = Fake::default();
    let mut t = Table::default();
    let a = sock();
    t.cover(&k, BASE_T, 5, &a, 77, reg(4, libc::EPOLLIN, 1))
        .unwrap();
    let tag = last_tag(&k);
    for events in [
        libc::EPOLLIN | libc::EPOLLET,
        libc::EPOLLIN | libc::EPOLLONESHOT,
    ] {
        t.mark_level(tag);
        t.modify(5, address(&a), reg(4, events, 1));
        assert!(t.levels(5).is_empty(), "{events:x}");
        t.modify(5, address(&a), reg(4, libc::EPOLLIN, 1));
    }
    t.mark_level(tag);
    assert_eq!(t.levels(5).len(), 1);
}
