//! The receive calls into more than one buffer (`readv`, `recvmsg`):
//! [`XSocket::recv_vectored`]'s general case.

use std::io;
use std::time::{Duration, Instant};

use super::super::settings::RecvFlags;
use super::super::socket::XSocket;

impl XSocket {
    /// [`Self::recv_vectored`] into any number of buffers but one.
    pub(super) fn recv_scattered(
        &self,
        bufs: &mut [&mut [u8]],
        flags: RecvFlags,
        timeout: Option<Duration>,
    ) -> io::Result<(usize, bool)> {
        match bufs {
            [] => return Ok((0, false)),
            [one] => return self.recv(one, flags, timeout),
            _ => {}
        }
        if flags.peek || self.msg_mode() {
            let total: usize = bufs.iter().map(|b| b.len()).sum();
            let mut tmp = vec![0u8; total];
            let (n, eor) = self.recv(&mut tmp, flags, timeout)?;
            let mut off = 0;
            for b in bufs.iter_mut() {
                let k = b.len().min(n - off);
                b[..k].copy_from_slice(&tmp[off..off + k]);
                off += k;
            }
            return Ok((n, eor));
        }
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        // A large read that finds nothing queued is placed into its
        // buffers (`io/placed.rs`), or — with sinks — its large buffer after
        // small ones (a header, then the body) is offered as a sink ahead
        // of the stream. `got` bytes of the buffers are filled in order.
        let (mut got, signalled) = if flags.nonblocking {
            (0, false)
        } else if self.sinks_for(deadline) {
            self.recv_into_later_sink(bufs, flags.waitall, deadline)?
        } else {
            self.recv_into_placed(bufs, flags.waitall, deadline)?
        };
        // A signal stopped it with bytes delivered: they are the call's
        // answer, also under `MSG_WAITALL` (a blocking read of the rest
        // would wait on as if no signal had come; review r22-b item 5).
        if signalled {
            return Ok((got, false));
        }
        // Buffer by buffer: the first read waits as the call asks; once
        // bytes were delivered, the rest only takes what is queued (as
        // `readv` on TCP returns what is there), unless `MSG_WAITALL`.
        let mut skip = got;
        for b in bufs.iter_mut().filter(|b| !b.is_empty()) {
            if skip >= b.len() {
                skip -= b.len();
                continue;
            }
            let b = &mut b[std::mem::take(&mut skip)..];
            let f = RecvFlags {
                nonblocking: flags.nonblocking || (got > 0 && !flags.waitall),
                ..flags
            };
            let timeout = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            match self.recv(b, f, timeout) {
                Ok((n, _)) => {
                    got += n;
                    if n < b.len() {
                        break;
                    }
                }
                Err(_) if got > 0 => break,
                Err(e) => return Err(e),
            }
        }
        Ok((got, false))
    }
}
