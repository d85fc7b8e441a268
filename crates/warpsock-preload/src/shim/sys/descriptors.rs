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
/// taken and given back, then the numbers above it are asked one by one
/// (`F_GETFD`: `EBADF` for a number nothing names; `poll`'s `POLLNVAL`
/// would take an `O_PATH` descriptor for a free number) until `n` are
/// found: `n` + 2 system calls where the numbers up there are free (the
/// usual case), with the limit's look. A table too full there is counted
/// the slow way ([`descriptors_free_counted`]). Before, every switch took
/// its `n` duplicates and closed them: 2 `n` system calls (28 on a
/// client's connection, 48 on a server's).
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
    let Some(limit) = soft_limit() else {
        return descriptors_free_counted(fd, n);
    };
    let end = first.saturating_add(PROBE_WINDOW as c_int).min(limit);
    let mut free = 1;
    for number in first.saturating_add(1)..end {
        if free >= n {
            break;
        }
        if names_nothing(number) {
            free += 1;
        }
    }
    free >= n || descriptors_free_counted(fd, n)
}

/// The numbers above the lowest free one [`descriptors_free`] asks.
const PROBE_WINDOW: usize = 32;

/// The process's soft `RLIMIT_NOFILE` (the system call itself, as the
/// engine's floor reads it).
fn soft_limit() -> Option<c_int> {
    // SAFETY: rlimit is plain data, written by the call.
    let mut l: libc::rlimit = unsafe { zeroed() };
    // SAFETY: getrlimit writes one rlimit into `l`.
    let r = unsafe {
        libc::syscall(
            libc::SYS_getrlimit,
            libc::c_long::from(libc::RLIMIT_NOFILE),
            &mut l as *mut libc::rlimit,
        )
    };
    (r == 0).then(|| c_int::try_from(l.rlim_cur).unwrap_or(c_int::MAX))
}

/// Whether no descriptor has the number `fd` (`F_GETFD` fails with
/// `EBADF`).
fn names_nothing(fd: c_int) -> bool {
    // SAFETY: F_GETFD takes integers alone.
    let r = unsafe {
        libc::syscall(
            libc::SYS_fcntl,
            libc::c_long::from(fd),
            libc::c_long::from(libc::F_GETFD),
        )
    };
    r < 0 && super::errno() == libc::EBADF
}

/// Times [`descriptors_free_counted`] answered (the tests tell the two
/// ways apart).
#[cfg(test)]
static COUNTED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// [`descriptors_free`] counted: takes `n` duplicates of `fd` where the
/// library's own descriptors go and closes them again (2 `n` system
/// calls).
fn descriptors_free_counted(fd: c_int, n: usize) -> bool {
    #[cfg(test)]
    COUNTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
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
    /// limit leaves 6 numbers from its lowest free one (the rest of the
    /// window above the limit): 2 free, 3 open, one an `O_PATH`
    /// descriptor (which `poll` would take for a free number). The quick
    /// look answers for 2 (the counted probe not asked); 3 are not there
    /// (the counted probe says so too), and none is left open.
    #[test]
    fn descriptors_free_sees_the_holes_of_a_full_table() {
        use std::sync::atomic::Ordering;
        let status = with_limit_above_lowest_free(6, |low| {
            // SAFETY: an O_PATH descriptor of "/", moved to a chosen
            // number; duplicates of stderr at chosen numbers.
            unsafe {
                let path = libc::open(c"/".as_ptr(), libc::O_PATH | libc::O_CLOEXEC);
                if path < 0 || libc::dup2(path, low + 4) != low + 4 {
                    return 12;
                }
                close(path);
                for k in [1, 3, 5] {
                    if libc::dup2(2, low + k) != low + k {
                        return 13;
                    }
                }
            }
            // Also numbers the harness's other threads held at the fork
            // (their copies here are the child's alone).
            close(low + 2);
            let mut bad = 0;
            let counted = COUNTED.load(Ordering::Relaxed);
            if !descriptors_free(2, 2) {
                bad |= 1;
            }
            if COUNTED.load(Ordering::Relaxed) != counted {
                bad |= 8;
            }
            if descriptors_free(2, 3) {
                bad |= 2;
            }
            // Nothing left open: the two are still free.
            for k in [0, 2] {
                if !names_nothing(low + k) {
                    bad |= 4;
                }
            }
            bad
        });
        assert_eq!(
            status,
            Some(0),
            "1: two free numbers not seen, 2: three seen (the O_PATH one, or one past \
             the limit), 4: a probe left open, 8: the counted probe asked; 10-13: the \
             set-up; None: hung"
        );
    }
}
