//! Room for the library's descriptors: whether a switch will find the
//! numbers it needs under the process's `RLIMIT_NOFILE` (declined before
//! its handshake, or before its answer or Request, rather than run out
//! after it committed and reset the connection).

use std::mem::zeroed;

use libc::c_int;

use super::close;

/// Whether at least `n` descriptor numbers are free now (below the
/// process's `RLIMIT_NOFILE`), exact at that instant (numbers the program
/// frees or takes meanwhile change it). `n` at most 16.
///
/// Where the library's own descriptors go (`warpsock_engine::fds`: from
/// the floor up, else the lowest free numbers), the lowest free number is
/// taken and given back, then the numbers from it on are looked at in one
/// `poll` (`POLLNVAL`: not open; 4 system calls with the limit's look). A
/// table too full there for `n` is counted the slow way
/// ([`descriptors_free_counted`]). Before, every switch took its `n`
/// duplicates and closed them: 2 `n` system calls (~28 a connection on a
/// client, ~48 on a server) on the connection's way to its first byte.
pub(crate) fn descriptors_free(fd: c_int, n: usize) -> bool {
    let n = n.min(PROBE_WINDOW / 2);
    if n == 0 {
        return true;
    }
    let first = warpsock_engine::fds::dup_lifted(fd);
    if first < 0 {
        // `EMFILE`: none free at all.
        return false;
    }
    close(first);
    // SAFETY: rlimit is plain data, written by the call.
    let limit = unsafe {
        let mut l: libc::rlimit = zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) != 0 {
            return descriptors_free_counted(fd, n);
        }
        c_int::try_from(l.rlim_cur).unwrap_or(c_int::MAX)
    };
    let mut look = [libc::pollfd {
        fd: -1,
        events: 0,
        revents: 0,
    }; PROBE_WINDOW];
    let end = first.saturating_add(PROBE_WINDOW as c_int).min(limit);
    let count = usize::try_from(end - first).unwrap_or(0);
    for (p, number) in look.iter_mut().zip(first..end) {
        p.fd = number;
    }
    // SAFETY: `count` entries of the array; a zero timeout (the kernel
    // only looks). The system call itself: the interposed `poll` is the
    // program's.
    let r = unsafe {
        libc::syscall(
            libc::SYS_poll,
            look.as_mut_ptr(),
            count as libc::c_ulong,
            0 as libc::c_long,
        )
    };
    if r >= 0 {
        let free = look[..count]
            .iter()
            .filter(|p| p.revents & libc::POLLNVAL != 0)
            .count();
        if free >= n {
            return true;
        }
    }
    descriptors_free_counted(fd, n)
}

/// The numbers [`descriptors_free`]'s `poll` looks at.
const PROBE_WINDOW: usize = 32;

/// [`descriptors_free`] counted: takes `n` duplicates of `fd` where the
/// library's own descriptors go and closes them again (2 `n` system
/// calls).
fn descriptors_free_counted(fd: c_int, n: usize) -> bool {
    let mut taken = [-1; PROBE_WINDOW / 2];
    let n = n.min(taken.len());
    let mut ok = true;
    for t in &mut taken[..n] {
        // Where the library's descriptors go (`warpsock_engine::fds`):
        // from the floor up, else low — the probe then takes none of the
        // program's next numbers while there is room up there (an
        // `accept` of the program's meanwhile would get a higher one).
        *t = warpsock_engine::fds::dup_lifted(fd);
        if *t < 0 {
            ok = false;
            break;
        }
    }
    for &t in &taken[..n] {
        close(t);
    }
    ok
}

#[cfg(test)]
mod tests {
    use super::super::real;
    use super::*;

    /// In a forked child (the limit is the process's): its lowest free
    /// number `low`, its soft `RLIMIT_NOFILE` set to `low + span`, then
    /// `f(low)`. The child's status (10, 11: the set-up failed).
    fn with_limit_above_lowest_free(span: c_int, f: impl FnOnce(c_int) -> i32) -> Option<i32> {
        // Resolved here, not in the child (`real`'s look-up).
        assert!(descriptors_free(2, 1));
        crate::shim::forktest::child_within(|| {
            // SAFETY: a duplicate of stderr, closed; a query and a change
            // of the child's own limit.
            unsafe {
                let low = real::fcntl(2, libc::F_DUPFD_CLOEXEC, 0);
                close(low);
                let mut l: libc::rlimit = zeroed();
                if low < 0 || libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) != 0 {
                    return 10;
                }
                l.rlim_cur = (low + span) as libc::rlim_t;
                if libc::setrlimit(libc::RLIMIT_NOFILE, &l) != 0 {
                    return 11;
                }
            }
            let low = real_lowest_free();
            f(low)
        })
    }

    /// The lowest free descriptor number (taken and given back).
    fn real_lowest_free() -> c_int {
        // SAFETY: a duplicate of stderr, closed at once.
        let low = unsafe { real::fcntl(2, libc::F_DUPFD_CLOEXEC, 0) };
        close(low);
        low
    }

    /// `descriptors_free` says whether `n` numbers are free below the
    /// soft `RLIMIT_NOFILE`, exactly, and leaves none of its probes open:
    /// in a child whose limit leaves one number free — its lowest free
    /// one, all below it being open.
    #[test]
    fn descriptors_free_counts_the_numbers_left_below_the_limit() {
        let status = with_limit_above_lowest_free(1, |low| {
            let mut bad = 0;
            if !descriptors_free(2, 1) {
                bad |= 1;
            }
            if descriptors_free(2, 2) {
                bad |= 2;
            }
            // Nothing left open: the one free number is still free.
            if real_lowest_free() != low {
                bad |= 4;
            }
            bad
        });
        assert_eq!(
            status,
            Some(0),
            "1: one free number not seen, 2: two seen, 4: a probe left open; \
             10, 11: the set-up; None: hung"
        );
    }

    /// `descriptors_free` against a table with holes, in a child whose
    /// limit leaves 40 numbers above its lowest free one, 3 of them free:
    /// the `poll` window sees them all, and the counted probe answers
    /// past it (more asked than the window holds free: none left open
    /// either way).
    #[test]
    fn descriptors_free_sees_the_holes_of_a_full_table() {
        let status = with_limit_above_lowest_free(40, |low| {
            // Every other one of the first 6 free (3), the rest taken —
            // also over numbers the test harness's other threads held at
            // the fork (their copies here are the child's alone).
            for k in 0..40 {
                if k < 6 && k % 2 == 0 {
                    close(low + k);
                // SAFETY: duplicates of stderr at chosen numbers.
                } else if unsafe { libc::dup2(2, low + k) } != low + k {
                    return 12;
                }
            }
            let mut bad = 0;
            if !descriptors_free(2, 3) {
                bad |= 1;
            }
            if descriptors_free(2, 4) {
                bad |= 2;
            }
            // Nothing left open: the three are still free.
            for k in [0, 2, 4] {
                // SAFETY: F_GETFD of a number, no pointers.
                if unsafe { real::fcntl(low + k, libc::F_GETFD, 0) } != -1 {
                    bad |= 4;
                }
            }
            bad
        });
        assert_eq!(
            status,
            Some(0),
            "1: three free numbers not seen, 2: four seen, 4: a probe left open; \
             10-12: the set-up; None: hung"
        );
    }
}
