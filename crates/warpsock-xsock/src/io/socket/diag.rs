//! The socket's diagnostics and test hooks: counts of the work per call,
//! what the peer offered, a raw message for protocol tests.

use std::sync::PoisonError;

use warpsock_engine::{SendOp, SendWr};

use super::{XSocket, WR_SLOT};

impl XSocket {
    /// The largest ULPDU this socket's queue pair sends
    /// ([`warpsock_engine::Qp::mulpdu`]): set by the engine's rule for the
    /// path when the switch built the queue pair.
    pub fn mulpdu(&self) -> usize {
        self.qp.mulpdu()
    }

    /// Runs `f` with the socket's lock held (tests: another thread's
    /// round or look holding it a moment).
    #[doc(hidden)]
    pub fn with_lock_held<R>(&self, f: impl FnOnce() -> R) -> R {
        let _st = self.lock();
        f()
    }

    /// Bytes of the caller's buffers that timed zero-copy sends left to
    /// private copies at their timeout, still held for requests in flight
    /// (bounded by the socket's send buffer, at least 4 MiB: see
    /// `XSocket::timed_room`).
    pub fn send_copies_held(&self) -> usize {
        Self::copies_held(&self.lock())
    }

    /// Whether the peer has offered a sink this socket's sends would
    /// write into now (after a round of progress): the next bytes of a
    /// send call are placed straight into the reader's buffer.
    pub fn peer_sink_ready(&self) -> bool {
        let mut st = self.lock();
        self.drive_now(&mut st);
        st.s.sink_ready()
    }

    /// Whether the peer has offered a sink not yet finished, in use or
    /// ahead of the stream (after a round of progress).
    pub fn peer_sink_offered(&self) -> bool {
        let mut st = self.lock();
        self.drive_now(&mut st);
        st.s.sink_offered()
    }

    /// The tagged offsets of the sinks and mappings the peer announced
    /// (after a round of progress): what the peer's Writes and Reads name.
    #[doc(hidden)]
    pub fn peer_tagged_offsets(&self) -> Vec<u64> {
        let mut st = self.lock();
        self.drive_now(&mut st);
        st.s.peer_tagged_offsets()
    }

    /// Sends `bytes` as one message, bypassing the books: for tests of a
    /// peer that breaks the protocol (and what it is told).
    #[doc(hidden)]
    pub fn inject_raw_message(&self, bytes: &[u8]) {
        let mut st = self.lock();
        let slot = st.tx_free.pop().expect("a free transmit slot");
        let at = slot as usize * self.opts.slot_size as usize;
        #[allow(unsafe_code)]
        // SAFETY: a free transmit slot, ours until posted.
        unsafe { self.tx.bytes_mut(at, bytes.len()) }.copy_from_slice(bytes);
        self.post(
            &mut st,
            SendWr {
                wr_id: WR_SLOT | u64::from(slot),
                op: SendOp::Send {
                    solicited: false,
                    invalidate: None,
                },
                sgl: self.tx.sge(at, bytes.len() as u32).into(),
                signaled: true,
            },
        );
    }

    /// Whether MPA CRC is on.
    pub fn crc(&self) -> bool {
        self.qp.negotiated().is_some_and(|n| n.crc)
    }

    /// Reads of the engine's TCP socket so far
    /// ([`warpsock_engine::Qp::socket_reads`]): a diagnostic of the system
    /// calls per message.
    pub fn socket_reads(&self) -> u64 {
        self.qp.socket_reads()
    }

    /// Times the socket's lock was taken so far (the re-takes after a
    /// wait for another thread not counted): a diagnostic
    /// of the work per call — a data call and the readiness its caller
    /// reflects after it take it once between them, plus once per wait
    /// in the engine.
    ///
    /// Takes the socket's lock: never call it with the lock held (from
    /// the `set_on_progress` or `set_watch` callbacks, which run under
    /// it), where it would wait for itself.
    pub fn state_locks(&self) -> u64 {
        // Not through `lock`: this look is not counted.
        self.st.lock().unwrap_or_else(PoisonError::into_inner).locks
    }

    /// Arrivals a quiet socket's spin took in and received under its own
    /// lock, with its own read ([`XSocket::recv_quiet`]): a diagnostic of
    /// the busy-polling path (as [`Self::state_locks`], takes the lock).
    pub fn quiet_answers(&self) -> u64 {
        self.st
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .quiet_answers
    }

    /// Of [`Self::quiet_answers`], those taken by the predicted receive:
    /// one whole FPDU read, its DATA copied from the engine's read
    /// straight into the program's buffer (`io/quiet.rs`; takes the lock).
    pub fn predicted_answers(&self) -> u64 {
        self.st
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .predicted_answers
    }

    /// Blocking receives that took their message where the parked read
    /// put it, with no completion (the predicted take of a blocking wait,
    /// `io/wait/predicted.rs`): a diagnostic of the blocking path (takes
    /// the lock).
    pub fn parked_predictions(&self) -> u64 {
        self.st
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .parked_predicted
    }

    /// The engine's transmit passes on this socket's queue pair
    /// ([`warpsock_engine::IoStats::tx_passes`]): a diagnostic of the
    /// work per call.
    pub fn tx_passes(&self) -> u64 {
        self.qp.io_stats().tx_passes
    }

    /// The socket's messages the engine built and wrote at once, with no
    /// send request ([`warpsock_engine::IoStats::inline_sends`]): a
    /// diagnostic of the small-send path.
    pub fn inline_sends(&self) -> u64 {
        self.qp.io_stats().inline_sends
    }

    /// The socket's messages the engine framed and wrote at once from the
    /// caller's buffers ([`warpsock_engine::IoStats::gathered_sends`]),
    /// and the bytes of them the socket did not take at once, which the
    /// engine copied ([`warpsock_engine::IoStats::gathered_copied`]): a
    /// diagnostic of the bulk-send path.
    pub fn gathered_sends(&self) -> (u64, u64) {
        let s = self.qp.io_stats();
        (s.gathered_sends, s.gathered_copied)
    }

    /// Times this socket's engine context took its lock
    /// ([`warpsock_engine::Context::lock_count`]): a diagnostic of the engine calls per
    /// data call.
    ///
    /// Takes the engine's lock: never call it from under the socket's lock
    /// or the engine's (as [`Self::state_locks`]).
    pub fn engine_locks(&self) -> u64 {
        self._ctx.lock_count()
    }
}
