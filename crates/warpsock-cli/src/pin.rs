//! This machine's CPUs: their count and model, the kernel's boot id (one
//! machine or two?), and the placement of the calling thread
//! (`sched_setaffinity`), so that both
//! sides of a latency test run alike: on this kind of small machine,
//! ping-pong latency swings several-fold with where the two sides run.
//!
//! Threads started afterwards (the engine's progress thread) inherit the
//! placement.

use std::io;
use std::sync::OnceLock;

/// The affinity mask the process started with, restored by `pin(None)`.
fn original() -> &'static Option<libc::cpu_set_t> {
    static ORIG: OnceLock<Option<libc::cpu_set_t>> = OnceLock::new();
    ORIG.get_or_init(|| {
        // SAFETY: cpu_set_t is plain data; all-zero is a valid empty set,
        // and sched_getaffinity writes at most size_of::<cpu_set_t>() bytes.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            (libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) == 0).then_some(set)
        }
    })
}

/// Number of CPUs online (at least 1).
pub(crate) fn cpu_count() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Pins the calling thread to `cpu`, or (`None`) restores the placement the
/// process started with.
pub(crate) fn pin(cpu: Option<usize>) -> io::Result<()> {
    let set = match cpu {
        Some(c) => {
            if c >= libc::CPU_SETSIZE as usize {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("CPU {c} is out of range"),
                ));
            }
            // SAFETY: as above; CPU_SET writes one bit inside the set (c is
            // below CPU_SETSIZE).
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(c, &mut set);
                set
            }
        }
        None => match original() {
            Some(s) => *s,
            None => return Ok(()),
        },
    };
    // Remember the original before the first change.
    let _ = original();
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    let r = unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) };
    if r != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("cannot pin to CPU {}: {e}", cpu.unwrap_or(0)),
        ));
    }
    Ok(())
}

/// The CPU the calling thread runs on now.
/// This kernel's boot id (`/proc/sys/kernel/random/boot_id`): the same in
/// every network namespace of one machine, different across machines.
pub(crate) fn boot_id() -> Option<String> {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let id = id.trim();
    (!id.is_empty() && id.chars().all(|c| c.is_ascii_hexdigit() || c == '-'))
        .then(|| id.to_string())
}

/// The CPU model name (`/proc/cpuinfo`).
pub(crate) fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

#[cfg(test)]
pub(crate) fn current_cpu() -> Option<usize> {
    // SAFETY: sched_getcpu has no arguments and no memory effects.
    let c = unsafe { libc::sched_getcpu() };
    usize::try_from(c).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pin_and_restore() {
        let last = cpu_count() - 1;
        pin(Some(last)).unwrap();
        assert_eq!(current_cpu(), Some(last));
        pin(None).unwrap();
        assert!(pin(Some(libc::CPU_SETSIZE as usize)).is_err());
    }
}
