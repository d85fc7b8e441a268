//! Small shared pieces: errno, and the pollable event queue behind
//! completion channels, CM event channels and async events.

use std::collections::VecDeque;
use std::ffi::c_int;
use std::io;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Sets the calling thread's `errno`.
pub(crate) fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// The calling thread's `errno`.
pub(crate) fn errno() -> c_int {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// Sets `errno` and returns NULL (the libibverbs convention for
/// constructors).
pub(crate) fn null<T>(e: c_int) -> *mut T {
    set_errno(e);
    std::ptr::null_mut()
}

/// Sets `errno` and returns -1 (the librdmacm convention).
pub(crate) fn fail(e: c_int) -> c_int {
    set_errno(e);
    -1
}

/// Locks, ignoring poisoning (a panic never crosses the C ABI: every
/// entry point is plain code; state stays consistent per operation).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A queue whose file descriptor is readable while it holds items: an
/// `eventfd` in semaphore mode counts them. Consumers read the fd (which
/// blocks, or fails with `EAGAIN` if the program made it non-blocking)
/// and then take one item, so `poll`/`epoll` on the fd and blocking
/// reads behave as on a kernel event channel.
#[derive(Debug)]
pub struct EventQueue<T> {
    fd: c_int,
    items: Mutex<VecDeque<T>>,
}

impl<T> EventQueue<T> {
    /// A new, empty queue with its own eventfd.
    pub fn new() -> io::Result<Self> {
        // SAFETY: plain system call.
        let fd = unsafe { libc::eventfd(0, libc::EFD_SEMAPHORE | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            fd,
            items: Mutex::new(VecDeque::new()),
        })
    }

    /// The descriptor programs poll.
    pub fn fd(&self) -> c_int {
        self.fd
    }

    /// Appends an item and makes the fd readable.
    pub fn push(&self, item: T) {
        lock(&self.items).push_back(item);
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd.
        unsafe { libc::write(self.fd, (&one as *const u64).cast(), 8) };
    }

    /// Waits for an item as the fd's blocking mode says (a non-blocking fd
    /// fails with `EAGAIN` when empty). Returns the errno on failure.
    pub fn pop(&self) -> Result<T, c_int> {
        loop {
            let mut v: u64 = 0;
            // SAFETY: reads 8 bytes into a live u64 from our eventfd.
            let n = unsafe { libc::read(self.fd, (&mut v as *mut u64).cast(), 8) };
            if n < 0 {
                let e = errno();
                if e == libc::EINTR {
                    continue;
                }
                return Err(e);
            }
            if let Some(item) = lock(&self.items).pop_front() {
                return Ok(item);
            }
        }
    }

    /// Removes queued items `drop_if` selects (their counts are read off
    /// the fd too, without blocking).
    pub fn remove_if(&self, mut drop_if: impl FnMut(&T) -> bool) -> usize {
        let mut items = lock(&self.items);
        let before = items.len();
        items.retain(|t| !drop_if(t));
        let gone = before - items.len();
        for _ in 0..gone {
            let mut v: u64 = 0;
            // SAFETY: a non-blocking read of 8 bytes into a live u64.
            unsafe {
                let fl = libc::fcntl(self.fd, libc::F_GETFL);
                libc::fcntl(self.fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
                libc::read(self.fd, (&mut v as *mut u64).cast(), 8);
                libc::fcntl(self.fd, libc::F_SETFL, fl);
            }
        }
        gone
    }

    /// Items queued.
    pub fn len(&self) -> usize {
        lock(&self.items).len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<T> Drop for EventQueue<T> {
    fn drop(&mut self) {
        // SAFETY: closes the eventfd this queue owns.
        unsafe { libc::close(self.fd) };
    }
}

/// Copies a Rust string into a fixed C char array, NUL-terminated.
pub(crate) fn copy_cstr(dst: &mut [std::ffi::c_char], s: &str) {
    let n = s.len().min(dst.len() - 1);
    for (d, b) in dst.iter_mut().zip(s.as_bytes()[..n].iter()) {
        *d = *b as std::ffi::c_char;
    }
    dst[n] = 0;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_fd_is_readable_exactly_while_items_wait() {
        let q = EventQueue::new().unwrap();
        let readable = |q: &EventQueue<u32>| {
            let mut p = libc::pollfd {
                fd: q.fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one live pollfd, zero timeout.
            unsafe { libc::poll(&mut p, 1, 0) == 1 }
        };
        assert!(!readable(&q));
        q.push(1);
        q.push(2);
        assert!(readable(&q));
        assert_eq!(q.pop(), Ok(1));
        assert!(readable(&q));
        assert_eq!(q.remove_if(|x| *x == 2), 1);
        assert!(!readable(&q));
        // SAFETY: sets O_NONBLOCK on our own fd.
        unsafe { libc::fcntl(q.fd(), libc::F_SETFL, libc::O_NONBLOCK) };
        assert_eq!(q.pop(), Err(libc::EAGAIN));
    }
}
