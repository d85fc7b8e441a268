//! The watched registrations' books ([`Table`]), sans-IO: every system
//! call goes through a [`Kernel`] (the module above has the real one, the
//! tests a fake).

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use libc::c_int;
use smallvec::SmallVec;

use super::{Kernel, Reg, BASE_MASK, ENTRIES_MAX, GEN_BITS, WATCH_EVENTS};
use crate::shim::socket::Socket;

/// A socket's registrations in one of the program's sets, watched there.
pub(super) struct Entry {
    /// The program's set.
    pub(super) outer: c_int,
    /// The socket's address (its key).
    key: usize,
    sock: Weak<dyn Socket>,
    /// The descriptor watched ([`Socket::direct_watch`]).
    pub(super) watch: c_int,
    /// The program's registrations of the socket in the set (one per
    /// number: a `dup`'s is another): empty, the entry is idle
    /// ([`Table::uncover`]).
    regs: SmallVec<[Reg; 1]>,
    /// Reported by a wait for a level-triggered registration, with no
    /// bell: the set's next wait reports it again while it is readable
    /// ([`Table::levels`]).
    level: bool,
}

/// The watched registrations. Sans-IO: every system call goes through a
/// [`Kernel`].
#[derive(Default)]
pub(crate) struct Table {
    /// The tag base (given by the caller of [`Table::cover`]).
    base: u64,
    /// By place; `None`: free.
    pub(super) entries: Vec<Option<Entry>>,
    /// The generation of each place (moved on each reuse, modulo
    /// 2^[`GEN_BITS`]: an event read before its place changed hands names
    /// nothing).
    gens: Vec<u32>,
    /// Free places.
    pub(super) free: Vec<usize>,
    /// Socket key → its places (one per set).
    pub(super) by_key: HashMap<usize, SmallVec<[usize; 2]>>,
    /// Places whose entry is marked [`Entry::level`].
    pub(super) levels: Vec<usize>,
    /// Entries the program's last registration left
    /// ([`Table::uncover`]): still watched, until [`Table::release_idle`]
    /// or a registration again.
    pub(super) idle: Vec<Idle>,
    /// How many epoll sets the program had made through the interposer,
    /// as the caller last said ([`super::SETS_MADE`]).
    pub(crate) sets_made: u64,
}

/// An idle entry ([`Table::uncover`]).
#[derive(Clone, Copy)]
pub(super) struct Idle {
    /// Its place and the place's generation then.
    pub(super) at: usize,
    pub(super) gen: u32,
    /// [`Table::sets_made`] then: while no set was made since, the set's
    /// number still names the set the watch is in (a close through the
    /// interposer took the entry out: [`Table::set_closed`]).
    pub(super) sets_made: u64,
}

/// What a change of the table did to sockets' coverage: for each, whether
/// it became covered by one more set (`true`) or one fewer.
pub(crate) type Changes = SmallVec<[(Arc<dyn Socket>, bool); 2]>;

/// Sockets a set's wait looks at again ([`Table::levels`]): each with its
/// registration and tag.
pub(crate) type Levels = SmallVec<[(Arc<dyn Socket>, Reg, u64); 2]>;

/// What a tag names: the socket, and the registration the call may
/// report itself ([`Reg::reported`]; `None`: ring the bell instead).
pub(crate) type Arrival = (Arc<dyn Socket>, Option<Reg>);

impl Table {
    /// The tag of place `at`.
    fn tag(&self, at: usize) -> u64 {
        self.base | (at as u64) << GEN_BITS | u64::from(self.gens[at])
    }

    /// The place of socket `key`'s entry for set `outer`.
    fn place(&self, outer: c_int, key: usize) -> Option<usize> {
        self.by_key
            .get(&key)?
            .iter()
            .copied()
            .find(|&at| self.entry(at).is_some_and(|e| e.outer == outer))
    }

    /// The entry at place `at`.
    fn entry(&self, at: usize) -> Option<&Entry> {
        self.entries.get(at).and_then(Option::as_ref)
    }

    /// The program registered `sock` (watching `watch`) in its set
    /// `outer` as `reg`: the set watches `watch` (registered there first
    /// if need be). `base` is the process's tag base. Returns the
    /// coverage changes, or the errno of a failure (the socket is then not
    /// watched by this set).
    pub(crate) fn cover(
        &mut self,
        k: &impl Kernel,
        base: u64,
        outer: c_int,
        sock: &Arc<dyn Socket>,
        watch: c_int,
        reg: Reg,
    ) -> Result<Changes, c_int> {
        self.base = base & BASE_MASK;
        let mut changes = Changes::new();
        let key = address(sock);
        if let Some(at) = self.place(outer, key) {
            // An idle entry is the program's again (no coverage change: it
            // never stopped watching).
            let gen = self.gens[at];
            let idle = self
                .idle
                .iter()
                .position(|i| (i.at, i.gen) == (at, gen))
                .map(|i| self.idle.swap_remove(i));
            // Still watched there? The set's number may name another set
            // by now (closed behind the interposer, `close_range`, and
            // made again): asked of the kernel — unless the entry went
            // idle since the process last made a set (an event loop's
            // `DEL` and `ADD` per message: no system call of ours).
            let tag = self.tag(at);
            let same_set = idle.is_some_and(|i| i.sets_made == self.sets_made);
            if same_set
                || k.ctl(outer, libc::EPOLL_CTL_MOD, watch, WATCH_EVENTS, tag)
                    .is_ok()
            {
                if let Some(Some(e)) = self.entries.get_mut(at) {
                    e.regs.retain(|r| r.fd != reg.fd);
                    e.regs.push(reg);
                }
                return Ok(changes);
            }
            if let Some(e) = self.remove(k, at, false) {
                if let Some(s) = e.sock.upgrade() {
                    changes.push((s, false));
                }
            }
        }
        let at = match self.free.pop() {
            Some(at) => at,
            None if self.entries.len() < ENTRIES_MAX => {
                self.entries.push(None);
                self.gens.push(0);
                self.entries.len() - 1
            }
            None => return Err(libc::ENOSPC),
        };
        self.gens[at] = (self.gens[at] + 1) & ((1 << GEN_BITS) - 1);
        let tag = self.tag(at);
        let added = match k.ctl(outer, libc::EPOLL_CTL_ADD, watch, WATCH_EVENTS, tag) {
            // A registration of ours left behind (its entry gone with a
            // set closed behind the interposer, the number reused).
            Err(libc::EEXIST) => k.ctl(outer, libc::EPOLL_CTL_MOD, watch, WATCH_EVENTS, tag),
            r => r,
        };
        if let Err(e) = added {
            self.free.push(at);
            return Err(e);
        }
        self.entries[at] = Some(Entry {
            outer,
            key,
            sock: Arc::downgrade(sock),
            watch,
            regs: SmallVec::from_elem(reg, 1),
            level: false,
        });
        self.by_key.entry(key).or_default().push(at);
        changes.push((Arc::clone(sock), true));
        Ok(changes)
    }

    /// The program changed its registration `reg` (by number) of socket
    /// `key` in set `outer` (`EPOLL_CTL_MOD`).
    pub(crate) fn modify(&mut self, outer: c_int, key: usize, reg: Reg) {
        if let Some(at) = self.place(outer, key) {
            if let Some(Some(e)) = self.entries.get_mut(at) {
                if let Some(r) = e.regs.iter_mut().find(|r| r.fd == reg.fd) {
                    *r = reg;
                }
            }
        }
    }

    /// Takes the entry at place `at` out; its watch leaves the set if
    /// `del` (not for a set that is closing).
    fn remove(&mut self, k: &impl Kernel, at: usize, del: bool) -> Option<Entry> {
        let e = self.entries.get_mut(at)?.take()?;
        if e.level {
            self.levels.retain(|&l| l != at);
        }
        if e.regs.is_empty() {
            self.idle.retain(|i| i.at != at);
        }
        if del {
            // ENOENT/EBADF: the watched descriptor or the set closed.
            let _ = k.ctl(e.outer, libc::EPOLL_CTL_DEL, e.watch, 0, 0);
        }
        if let Some(ats) = self.by_key.get_mut(&e.key) {
            ats.retain(|&mut a| a != at);
            if ats.is_empty() {
                self.by_key.remove(&e.key);
            }
        }
        self.free.push(at);
        Some(e)
    }

    /// The program removed its registration by number `fd` of socket
    /// `key` from its set `outer`. With its last there the entry turns
    /// idle: the set still watches the socket (no system call, no
    /// coverage change) until [`Self::release_idle`], so that the
    /// `EPOLL_CTL_DEL` and `EPOLL_CTL_ADD` an event loop makes per message
    /// to move a connection between reading and writing (redis's `ae`:
    /// a mask that falls to nothing is a `DEL`) cost the program's two
    /// system calls, not six: the watch's `DEL` and `ADD` in the set, and
    /// the progress thread's watch armed and disarmed in between.
    pub(crate) fn uncover(&mut self, outer: c_int, key: usize, fd: c_int) {
        let Some(at) = self.place(outer, key) else {
            return;
        };
        let Some(Some(e)) = self.entries.get_mut(at) else {
            return;
        };
        e.regs.retain(|r| r.fd != fd);
        if !e.regs.is_empty() {
            return;
        }
        if std::mem::take(&mut e.level) {
            self.levels.retain(|&l| l != at);
        }
        self.idle.push(Idle {
            at,
            gen: self.gens[at],
            sets_made: self.sets_made,
        });
    }

    /// Whether an entry is idle ([`Self::uncover`]).
    pub(crate) fn has_idle(&self) -> bool {
        !self.idle.is_empty()
    }

    /// The idle entries leave their sets: each set stops watching the
    /// socket (a wait is about to begin: from then on an arrival for a
    /// socket the program no longer waits for is the progress thread's,
    /// as before its registration).
    pub(crate) fn release_idle(&mut self, k: &impl Kernel) -> Changes {
        let mut changes = Changes::new();
        for Idle { at, gen, .. } in std::mem::take(&mut self.idle) {
            let idle = self.gens.get(at) == Some(&gen)
                && self.entry(at).is_some_and(|e| e.regs.is_empty());
            if !idle {
                continue;
            }
            if let Some(e) = self.remove(k, at, true) {
                if let Some(s) = e.sock.upgrade() {
                    changes.push((s, false));
                }
            }
        }
        changes
    }

    /// The program closed its number `fd` of socket `key` (another number
    /// of it may live on, a `dup`'s): its registrations leave the sets
    /// (`epollcarry::before_close` takes them out of the kernel's), and
    /// a set left with none of the socket's stops watching it.
    pub(crate) fn number_closed(&mut self, k: &impl Kernel, key: usize, fd: c_int) -> Changes {
        let mut changes = Changes::new();
        let ats = self.by_key.get(&key).cloned().unwrap_or_default();
        for at in ats {
            let empty = match self.entries.get_mut(at).and_then(Option::as_mut) {
                Some(e) => {
                    e.regs.retain(|r| r.fd != fd);
                    e.regs.is_empty()
                }
                None => false,
            };
            if empty {
                if let Some(e) = self.remove(k, at, true) {
                    if let Some(s) = e.sock.upgrade() {
                        changes.push((s, false));
                    }
                }
            }
        }
        changes
    }

    /// The socket `key` ended: no set watches it any more. (Its object is
    /// going: no coverage change is reported.)
    pub(crate) fn forget(&mut self, k: &impl Kernel, key: usize) {
        let ats = self.by_key.get(&key).cloned().unwrap_or_default();
        for at in ats {
            self.remove(k, at, true);
        }
    }

    /// The program's set `outer` closes: its sockets lose it (their
    /// registrations there go with it).
    pub(crate) fn set_closed(&mut self, k: &impl Kernel, outer: c_int) -> Changes {
        let mut changes = Changes::new();
        let ats: Vec<usize> = (0..self.entries.len())
            .filter(|&at| self.entry(at).is_some_and(|e| e.outer == outer))
            .collect();
        for at in ats {
            if let Some(e) = self.remove(k, at, false) {
                if let Some(s) = e.sock.upgrade() {
                    changes.push((s, false));
                }
            }
        }
        changes
    }

    /// A wait reported the entry of tag `tag` itself for a
    /// level-triggered registration: the set's next wait looks at it again
    /// ([`Self::levels`]); a level-triggered set reports a readable socket
    /// at every wait, and no bell was rung for it (a program that leaves
    /// the input unread after a report — memcached's worker, between two
    /// states of a connection — waited for good).
    pub(crate) fn mark_level(&mut self, tag: u64) {
        let at = ((tag & !BASE_MASK) >> GEN_BITS) as usize;
        if self.placed(tag).is_none() {
            return;
        }
        if let Some(Some(e)) = self.entries.get_mut(at) {
            if !e.level {
                e.level = true;
                self.levels.push(at);
            }
        }
    }

    /// The marked entries of set `outer` ([`Self::mark_level`]), taken
    /// off the list (the caller marks again those it reports): each
    /// socket with its registration.
    pub(crate) fn levels(&mut self, outer: c_int) -> Levels {
        let mut out = SmallVec::new();
        if self.levels.is_empty() {
            return out;
        }
        let mut i = 0;
        while i < self.levels.len() {
            let at = self.levels[i];
            let tag = self.entry(at).map(|_| self.tag(at));
            match self.entries.get_mut(at).and_then(Option::as_mut) {
                Some(e) if e.outer != outer && e.level => {
                    i += 1;
                    continue;
                }
                Some(e) => {
                    e.level = false;
                    // Still a level-triggered registration the wait
                    // reports itself (a MOD may have changed it: one-shot
                    // and edge-triggered ones are the kernel's to report).
                    if let ([r], Some(tag)) = (e.regs.as_slice(), tag) {
                        if r.reported() && r.events & libc::EPOLLET as u32 == 0 {
                            if let Some(s) = e.sock.upgrade() {
                                out.push((s, *r, tag));
                            }
                        }
                    }
                }
                None => {}
            }
            self.levels.swap_remove(i);
        }
        out
    }

    /// The entry tag `tag` was made for, if its place still holds it.
    pub(super) fn placed(&self, tag: u64) -> Option<&Entry> {
        let at = ((tag & !BASE_MASK) >> GEN_BITS) as usize;
        let gen = (tag & ((1 << GEN_BITS) - 1)) as u32;
        if self.gens.get(at) != Some(&gen) {
            return None;
        }
        self.entry(at)
    }

    /// What this process's tag `tag` names, if its place still holds the
    /// entry it was made for.
    pub(crate) fn arrival(&self, tag: u64) -> Option<Arrival> {
        let e = self.placed(tag)?;
        let s = e.sock.upgrade()?;
        // Reported here only where no other registration of the socket
        // can be waited on: a round that rings no bell took the input
        // from under another set's watch (its edge then found nothing).
        // An idle entry has no registration of the program's to starve.
        let alone = self.by_key.get(&e.key).is_some_and(|ats| {
            ats.iter()
                .filter(|&&a| self.entry(a).is_some_and(|x| !x.regs.is_empty()))
                .count()
                == 1
        });
        let reg = match e.regs.as_slice() {
            [r] if alone && r.reported() => Some(*r),
            _ => None,
        };
        Some((s, reg))
    }
}

/// The address of a socket's object (the key the kinds' tables use).
pub(super) fn address(s: &Arc<dyn Socket>) -> usize {
    Arc::as_ptr(s).cast::<()>() as usize
}
