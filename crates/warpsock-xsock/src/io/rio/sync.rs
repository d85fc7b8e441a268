//! The synchronous one-sided calls (`riowrite`, `rioread`): one request
//! each, posted as the asynchronous ones are — behind the bytes of send
//! calls made before it that are not yet posted (`sndbuf::post_rio_wr`) —
//! and waited for.

use std::io;
use std::time::Instant;

use super::super::socket::XSocket;
use super::sends_ahead;

impl XSocket {
    fn wait_rio(&self, id: u64) -> io::Result<usize> {
        let mut st = self.lock();
        loop {
            if let Some(r) = st.aio.sync_done.remove(&id) {
                return r.map_err(io::Error::from_raw_os_error);
            }
            if let Some((errno, _)) = st.error {
                if !st.aio.rio.contains_key(&id) {
                    return Err(io::Error::from_raw_os_error(errno));
                }
            }
            // The request reads or writes the caller's buffer until it
            // completes: a signal does not end this wait (issue 12).
            st = self.wait(st, None::<Instant>);
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
        self.wait_rio(id)
    }

    /// One-sided write of `buf` into the peer's mapping at `offset`
    /// (`riowrite`); returns when the engine has sent it — after the bytes
    /// of earlier send calls (see the module's docs), so possibly once the
    /// peer has read enough of them.
    pub fn riowrite(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        self.riowrite_as(buf, offset, false)
    }

    /// [`Self::riowrite`] of a non-blocking socket (`nonblocking`):
    /// `EAGAIN` at once while bytes of earlier send calls wait to be
    /// posted (the engine only reads `buf`).
    pub fn riowrite_as(&self, buf: &[u8], offset: u64, nonblocking: bool) -> io::Result<usize> {
        let seg = (buf.as_ptr().cast_mut(), buf.len());
        self.rio_sync(seg, offset, true, nonblocking)
    }

    /// One-sided read of `buf.len()` bytes from the peer's mapping at
    /// `offset` (`rioread`); returns when they are in `buf`.
    pub fn rioread(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.rioread_as(buf, offset, false)
    }

    /// [`Self::rioread`] of a non-blocking socket, as
    /// [`Self::riowrite_as`].
    pub fn rioread_as(&self, buf: &mut [u8], offset: u64, nonblocking: bool) -> io::Result<usize> {
        self.rio_sync((buf.as_mut_ptr(), buf.len()), offset, false, nonblocking)
    }
}
