//! Counters of what the driver asks of the kernel: system calls and the
//! bytes each moved per queue pair ([`IoStats`]), and the times a context's
//! callers or progress thread went to sleep ([`WaitStats`]). They are
//! diagnostics for benchmarks and tests: unlike a wall-clock figure they
//! mean the same on a loaded machine (bytes per read call, wake-ups per
//! MiB), so a change to the transmit schedule can be judged by them.

use std::sync::atomic::{AtomicU64, Ordering};

/// Per-queue-pair counts of socket system calls and what they moved, since
/// the queue pair was established ([`crate::Qp::io_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct IoStats {
    /// Receive system calls (`recvmsg`/`readv`, non-blocking or parked).
    pub reads: u64,
    /// Of [`Self::reads`], those laid out over several FPDUs of one
    /// message (payload straight into place, framing into staging) that
    /// returned bytes.
    pub planned_reads: u64,
    /// Of [`Self::planned_reads`], those where the stream differed from
    /// the layout (the message ended early, an FPDU of another length)
    /// and the bytes from there on were copied out and taken the ordinary
    /// way, or ended in it (a Terminate, a CRC error).
    pub plan_misses: u64,
    /// Transmit passes: rounds that asked the core for segments to write
    /// (one per post, and after a receive only when it left something to
    /// send).
    pub tx_passes: u64,
    /// Bytes those calls returned.
    pub read_bytes: u64,
    /// Of [`Self::reads`], the blocking reads a waiting caller slept in
    /// ([`crate::Cq::wait`] with a single connection).
    pub parked_reads: u64,
    /// Of [`Self::reads`], the non-blocking ones of an empty round's fast
    /// path that found nothing (`EAGAIN`; nothing staged, held, reported
    /// or owed to the socket): the round ended there.
    pub idle_reads: u64,
    /// Busy-polling rounds of [`crate::Cq::poll_news`] that were this
    /// queue pair's empty round alone (its context's only queue pair,
    /// nothing queued or owed): no progress over the context, no drain.
    pub short_rounds: u64,
    /// Transmit system calls (`sendmsg`), including those that found the
    /// send buffer full.
    pub writes: u64,
    /// Bytes the kernel accepted.
    pub write_bytes: u64,
    /// Of [`Self::writes`], those that accepted nothing (`EAGAIN`).
    pub writes_blocked: u64,
    /// Read Request messages handed to the transport.
    pub read_requests: u64,
    /// Stream bytes queued in the driver and not yet written when those
    /// Read Requests were queued, summed over them: what each waited
    /// behind on our side of the socket.
    pub read_request_wait_bytes: u64,
    /// Read Responses the core sent first while our next request was a
    /// Read that could start ([`warpsock_proto::TxCounts`]): each made a
    /// Read Request of ours wait behind the peer's Reads.
    pub responses_ahead_of_read: u64,
    /// Their payload bytes.
    pub response_bytes_ahead_of_read: u64,
    /// Small control messages (at most [`CONTROL_MAX`] bytes on the wire,
    /// e.g. zero-byte Sends used as credits), besides Read Requests.
    pub control_msgs: u64,
    /// Bytes queued and unwritten ahead of those control messages, summed.
    pub control_wait_bytes: u64,
    /// Transmit passes' asks of the core that gave no segment
    /// ([`warpsock_proto::TxCounts::empty_asks`]): a pass stops asking once
    /// the core says it holds nothing more, so a post of a one-FPDU
    /// message makes none.
    pub empty_asks: u64,
    /// Sends built and written at once by [`crate::Qp::send_inline_news`]
    /// ([`warpsock_proto::TxCounts::inline_sends`]).
    pub inline_sends: u64,
    /// Sends framed and written at once from the caller's buffers by
    /// [`crate::Qp::send_gathered_news`]
    /// ([`warpsock_proto::TxCounts::gathered_sends`]).
    pub gathered_sends: u64,
    /// Bytes of those Sends' FPDUs the socket did not take at once, copied
    /// for a later pass: the only copy a gathered Send makes.
    pub gathered_copied: u64,
    /// Bytes copied out of the staging buffer into place by the reads'
    /// own steps: large FPDUs read whole into it (framing counted too) and
    /// payload pieces that came with framing — not small FPDUs taken
    /// whole, nor a planned read's tail. What direct placement of large
    /// payloads missed: a stream of large messages should see little here.
    pub staged_copied: u64,
}

impl super::QpSlot {
    /// Counts a round of [`crate::Cq::poll_news`] made short
    /// ([`IoStats::short_rounds`]).
    pub(crate) fn count_short_round(&mut self) {
        self.io.short_rounds += 1;
    }
}

/// A segment at most this long on the wire counts as a control message in
/// [`IoStats::control_msgs`] (header, CRC and at most a 64-byte payload).
pub const CONTROL_MAX: usize = 96;

impl IoStats {
    /// Average bytes per receive call (0 before any).
    pub fn bytes_per_read(&self) -> f64 {
        ratio(self.read_bytes, self.reads)
    }

    /// Average bytes per transmit call (0 before any).
    pub fn bytes_per_write(&self) -> f64 {
        ratio(self.write_bytes, self.writes)
    }
}

impl std::ops::AddAssign for IoStats {
    /// Sums two queue pairs' counts (a side's total over its connections).
    fn add_assign(&mut self, o: Self) {
        let Self {
            reads,
            planned_reads,
            plan_misses,
            tx_passes,
            read_bytes,
            parked_reads,
            idle_reads,
            short_rounds,
            writes,
            write_bytes,
            writes_blocked,
            read_requests,
            read_request_wait_bytes,
            responses_ahead_of_read,
            response_bytes_ahead_of_read,
            control_msgs,
            control_wait_bytes,
            empty_asks,
            inline_sends,
            gathered_sends,
            gathered_copied,
            staged_copied,
        } = o;
        self.reads += reads;
        self.planned_reads += planned_reads;
        self.plan_misses += plan_misses;
        self.tx_passes += tx_passes;
        self.read_bytes += read_bytes;
        self.parked_reads += parked_reads;
        self.idle_reads += idle_reads;
        self.short_rounds += short_rounds;
        self.writes += writes;
        self.write_bytes += write_bytes;
        self.writes_blocked += writes_blocked;
        self.read_requests += read_requests;
        self.read_request_wait_bytes += read_request_wait_bytes;
        self.responses_ahead_of_read += responses_ahead_of_read;
        self.response_bytes_ahead_of_read += response_bytes_ahead_of_read;
        self.control_msgs += control_msgs;
        self.control_wait_bytes += control_wait_bytes;
        self.empty_asks += empty_asks;
        self.inline_sends += inline_sends;
        self.gathered_sends += gathered_sends;
        self.gathered_copied += gathered_copied;
        self.staged_copied += staged_copied;
    }
}

/// Per-context counts of sleeps: how often progress stopped in the kernel
/// waiting for input, and how often it woke up to find nothing
/// ([`crate::Context::wait_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WaitStats {
    /// Blocking `epoll_wait` calls ([`crate::Cq::wait`] in caller-driven
    /// mode, or the progress thread).
    pub epoll_sleeps: u64,
    /// Blocking reads of a single connection's socket a waiting caller
    /// slept in (caller-driven mode; see [`IoStats::parked_reads`]).
    pub parked_sleeps: u64,
    /// Of the parked sleeps, those an interruptible wait slept in `poll`
    /// on the socket before reading it (past its first empty slice, where
    /// a signal must not be lost to the read's timeout: issue 12).
    pub polled_sleeps: u64,
    /// Condition-variable waits: progress-thread mode's [`crate::Cq::wait`],
    /// or waits for an application's region borrow to end.
    pub cv_sleeps: u64,
    /// Sleeps that ended with nothing to do (a timeout or a wake-up that
    /// found no input).
    pub empty_wakes: u64,
}

impl WaitStats {
    /// Every sleep, whatever it slept in.
    pub fn sleeps(&self) -> u64 {
        self.epoll_sleeps + self.parked_sleeps + self.cv_sleeps
    }
}

/// [`WaitStats`] kept with atomics, so counting needs no lock — but for
/// parked reads ([`ParkedSleeps`]): counted under the context lock their
/// waker takes anyway, a plain add where an atomic one was a `lock xadd`
/// per blocking ping-pong receive.
#[derive(Debug, Default)]
pub(crate) struct WaitCounters {
    epoll: AtomicU64,
    cv: AtomicU64,
    empty: AtomicU64,
}

/// What a [`WaitCounters`] entry counts.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Sleep {
    Epoll,
    Cv,
}

/// Sleeps in parked reads, counted under the context lock (in `State`).
#[derive(Debug, Default)]
pub(crate) struct ParkedSleeps {
    sleeps: u64,
    empty: u64,
    polled: u64,
}

impl ParkedSleeps {
    /// One parked sleep; `empty` if it brought nothing.
    pub(crate) fn count(&mut self, empty: bool) {
        self.sleeps += 1;
        self.empty += u64::from(empty);
    }

    /// Of the sleeps [`Self::count`] counts, one slept in `poll`.
    pub(crate) fn count_polled(&mut self) {
        self.polled += 1;
    }
}

impl WaitCounters {
    /// One sleep of kind `s`; `empty` if it ended with nothing to do.
    pub(crate) fn count(&self, s: Sleep, empty: bool) {
        let c = match s {
            Sleep::Epoll => &self.epoll,
            Sleep::Cv => &self.cv,
        };
        c.fetch_add(1, Ordering::Relaxed);
        if empty {
            self.empty.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The counts, with the parked sleeps `parked` (read under the lock).
    pub(crate) fn snapshot(&self, parked: &ParkedSleeps) -> WaitStats {
        WaitStats {
            epoll_sleeps: self.epoll.load(Ordering::Relaxed),
            parked_sleeps: parked.sleeps,
            polled_sleeps: parked.polled,
            cv_sleeps: self.cv.load(Ordering::Relaxed),
            empty_wakes: self.empty.load(Ordering::Relaxed) + parked.empty,
        }
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_counters_count_each_kind_and_empty_wakes() {
        let c = WaitCounters::default();
        let mut p = ParkedSleeps::default();
        c.count(Sleep::Epoll, false);
        p.count(true);
        p.count(false);
        c.count(Sleep::Cv, true);
        let s = c.snapshot(&p);
        assert_eq!(
            (s.epoll_sleeps, s.parked_sleeps, s.cv_sleeps, s.empty_wakes),
            (1, 2, 1, 2)
        );
        assert_eq!(s.sleeps(), 4);
    }

    #[test]
    fn io_stats_add_field_by_field() {
        let a = IoStats {
            reads: 1,
            control_wait_bytes: 5,
            ..IoStats::default()
        };
        let mut t = a;
        t += IoStats {
            reads: 2,
            writes: 3,
            ..a
        };
        assert_eq!((t.reads, t.writes, t.control_wait_bytes), (3, 3, 10));
    }

    #[test]
    fn bytes_per_call_of_no_calls_is_zero() {
        let s = IoStats::default();
        assert_eq!(s.bytes_per_read(), 0.0);
        let s = IoStats {
            writes: 4,
            write_bytes: 1 << 20,
            ..s
        };
        assert_eq!(s.bytes_per_write(), 262144.0);
    }
}
