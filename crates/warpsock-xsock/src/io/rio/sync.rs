//! The synchronous one-sided calls (`riowrite`, `rioread`): one request
//! each, posted as the asynchronous ones are — behind the bytes of send
//! calls made before it that are not yet posted (`sndbuf::post_rio_wr`) —
//! and waited for.

use std::io;
use std::time::{Duration, Instant};

use super::super::socket::XSocket;
use super::sends_ahead;

impl XSocket {
    /// Waits for the request `id`, up to `timeout` (`None`: for good, as a
    /// blocking socket call without a timeout). An iWARP request cannot
    /// be withdrawn — a Read's Response, a Write's bytes still to go, may
    /// reach the caller's buffer later — so at the timeout the connection
    /// fails (`ETIMEDOUT`, disconnected: the engine flushes the request,
    /// and no late Response is placed) and the call returns once the
    /// request is flushed (a peer that never answers a Read, or holds a
    /// Write behind a zero window, held the call for good; helper 33's
    /// review, session 35).
    fn wait_rio(&self, id: u64, timeout: Option<Duration>, write: bool) -> io::Result<usize> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut timed_out = false;
        let mut st = self.lock();
        loop {
            if let Some(r) = st.aio.sync_done.remove(&id) {
                if timed_out {
                    return Err(io::Error::from_raw_os_error(libc::ETIMEDOUT));
                }
                return r.map_err(io::Error::from_raw_os_error);
            }
            if let Some((errno, _)) = st.error {
                if !st.aio.rio.contains_key(&id) {
                    return Err(io::Error::from_raw_os_error(errno));
                }
            }
            if !timed_out && deadline.is_some_and(|d| Instant::now() >= d) {
                timed_out = true;
                let what = if write { "write" } else { "read" };
                self.fail(
                    &mut st,
                    libc::ETIMEDOUT,
                    format!("a one-sided {what} was not done within {timeout:?}"),
                );
                // A reset, not the graceful disconnect alone: that one
                // lets a Write already partly in the kernel finish before
                // it flushes, and behind a peer's closed window it never
                // does — the call waited for good (helper 68's review).
                // The reset purges both queues; the engine then flushes
                // every request, this one's included.
                super::super::sndbuf::reset(self.tcp_fd);
                self.qp.disconnect();
            }
            // The request reads or writes the caller's buffer until it
            // completes: a signal does not end this wait (issue 12).
            let until = if timed_out { None } else { deadline };
            st = self.wait(st, until);
        }
    }

    /// One request of `len` bytes at `ptr`, waited for. `nonblocking`:
    /// fails with `EAGAIN`, having done nothing, while bytes of earlier
    /// send calls wait to be posted — it would go behind them, so wait for
    /// the peer to read (review r21-send #6: an event loop blocked in
    /// `riowrite` with no bound).
    fn rio_sync(
        &self,
        (ptr, len): (*mut u8, usize),
        offset: u64,
        write: bool,
        nonblocking: bool,
        timeout: Option<Duration>,
    ) -> io::Result<usize> {
        if len == 0 {
            return Ok(0);
        }
        let id = {
            let mut st = self.lock();
            if nonblocking && sends_ahead(self, &mut st) {
                return Err(io::Error::from_raw_os_error(libc::EAGAIN));
            }
            #[allow(unsafe_code)]
            // SAFETY: the callers' buffers outlive the call, which waits
            // for the request.
            unsafe {
                self.post_rio(&mut st, &[(ptr, len)], offset, write, None)?
            }
        };
        self.wait_rio(id, timeout, write)
    }

    /// One-sided write of `buf` into the peer's mapping at `offset`
    /// (`riowrite`); returns when the engine has sent it — after the bytes
    /// of earlier send calls (see the module's docs), so possibly once the
    /// peer has read enough of them.
    pub fn riowrite(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        self.riowrite_as(buf, offset, false, None)
    }

    /// [`Self::riowrite`] of a non-blocking socket (`nonblocking`):
    /// `EAGAIN` at once while bytes of earlier send calls wait to be
    /// posted (the engine only reads `buf`); and bounded by `timeout`
    /// (the socket's `SO_SNDTIMEO`): past it the connection fails with
    /// `ETIMEDOUT` (see `wait_rio`).
    pub fn riowrite_as(
        &self,
        buf: &[u8],
        offset: u64,
        nonblocking: bool,
        timeout: Option<Duration>,
    ) -> io::Result<usize> {
        let seg = (buf.as_ptr().cast_mut(), buf.len());
        self.rio_sync(seg, offset, true, nonblocking, timeout)
    }

    /// One-sided read of `buf.len()` bytes from the peer's mapping at
    /// `offset` (`rioread`); returns when they are in `buf`.
    pub fn rioread(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.rioread_as(buf, offset, false, None)
    }

    /// [`Self::rioread`] of a non-blocking socket, bounded by `timeout`
    /// (the socket's `SO_RCVTIMEO`), as [`Self::riowrite_as`].
    pub fn rioread_as(
        &self,
        buf: &mut [u8],
        offset: u64,
        nonblocking: bool,
        timeout: Option<Duration>,
    ) -> io::Result<usize> {
        let seg = (buf.as_mut_ptr(), buf.len());
        self.rio_sync(seg, offset, false, nonblocking, timeout)
    }
}
