//! What every transport's worker shares: the job of one thread (its role
//! on each of its connections), what it measured ([`Stats`]), pacing for
//! rate-limited runs, and CPU time of the process.
//!
//! A worker runs `k` connections of one test in one thread: the client
//! runs one thread per connection; the server one thread for all of them
//! (hot-spot, fan-in, fan-out) or one per connection (multi-stream).
//!
//! Every connection ends the same way, whatever the transport: a side
//! sends its FIN (TCP: shuts down its sending half; warpsock: an 8-byte
//! Send with Solicited Event carrying its count; UDP: the count over the
//! flow's companion TCP connection) once its own part is over — the active
//! side when its budget is spent and its messages are out, a passive side
//! when it has seen the peer's FIN — and is done when both FINs are
//! through. The active side's clock stops there, so every byte counted was
//! received.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::ctl::Tally;
use crate::meter::INTERVAL;
use crate::opts::{Role, Spec};
use crate::Error;

/// Most connections one connection-setup test opens (ephemeral ports and
/// the server's accept queue stay far from their limits).
pub(crate) const MAX_SETUPS: u64 = 20_000;

/// One thread's part of a test.
#[derive(Clone, Copy)]
pub(crate) struct Job<'a> {
    pub(crate) spec: &'a Spec,
    pub(crate) role: Role,
    /// Start of the test in this process (interval samples count from it).
    pub(crate) epoch: Instant,
    /// Progress callback (fraction of the budget), or a no-op.
    pub(crate) tick: &'a (dyn Fn(f64) + Sync),
}

/// What one side (one thread, or merged: one process) measured.
#[derive(Debug, Clone, Default)]
pub(crate) struct Stats {
    /// Round-trip times in ns (warm-up excluded) or, for connection setup,
    /// the time of each setup.
    pub(crate) rtts_ns: Vec<u64>,
    /// Data messages sent, or RDMA Reads issued, by this side.
    pub(crate) sent: u64,
    /// Data that arrived here (Read responses included) and checked out.
    pub(crate) rx: Tally,
    /// Datagram pings that got no answer in time.
    pub(crate) lost: u64,
    /// The active side's span: first message to last FIN.
    pub(crate) span: Option<(Instant, Instant)>,
    /// First to last data arrival here.
    pub(crate) rx_span: Option<(Instant, Instant)>,
    /// Bytes that arrived per [`INTERVAL`] since the epoch.
    pub(crate) intervals: Vec<u64>,
}

fn widen(a: &mut Option<(Instant, Instant)>, b: Option<(Instant, Instant)>) {
    *a = match (*a, b) {
        (None, x) | (x, None) => x,
        (Some((s1, e1)), Some((s2, e2))) => Some((s1.min(s2), e1.max(e2))),
    };
}

impl Stats {
    /// Adds another thread's numbers.
    pub(crate) fn merge(&mut self, o: Self) {
        self.rtts_ns.extend(o.rtts_ns);
        self.sent += o.sent;
        self.rx.msgs += o.rx.msgs;
        self.rx.bytes += o.rx.bytes;
        self.rx.verified += o.rx.verified;
        self.lost += o.lost;
        widen(&mut self.span, o.span);
        widen(&mut self.rx_span, o.rx_span);
        if self.intervals.len() < o.intervals.len() {
            self.intervals.resize(o.intervals.len(), 0);
        }
        for (a, b) in self.intervals.iter_mut().zip(o.intervals) {
            *a += b;
        }
    }

    /// Marks activity of the active side now.
    pub(crate) fn active_now(&mut self, now: Instant) {
        widen(&mut self.span, Some((now, now)));
    }

    /// Counts one arrived message of `len` bytes now.
    pub(crate) fn received(&mut self, epoch: Instant, len: usize, ok: bool) {
        let now = Instant::now();
        self.rx.add(len, ok);
        widen(&mut self.rx_span, Some((now, now)));
        self.bucket(epoch, now, len as u64);
    }

    /// Counts `n` messages of `len` bytes that are known to have arrived by
    /// now (RDMA Writes, learnt from the FIN), all checked as `ok`.
    pub(crate) fn received_many(&mut self, epoch: Instant, n: u64, len: usize, ok: bool) {
        let now = Instant::now();
        let bytes = n * len as u64;
        self.rx.msgs += n;
        self.rx.bytes += bytes;
        if ok {
            self.rx.verified += bytes;
        }
        if n > 0 {
            widen(&mut self.rx_span, Some((now, now)));
        }
        self.bucket(epoch, now, bytes);
    }

    /// Adds `bytes` to the interval sample of `now`.
    pub(crate) fn bucket(&mut self, epoch: Instant, now: Instant, bytes: u64) {
        let i = (now.saturating_duration_since(epoch).as_nanos() / INTERVAL.as_nanos()) as usize;
        if self.intervals.len() <= i {
            self.intervals.resize(i + 1, 0);
        }
        self.intervals[i] += bytes;
    }

    /// Length of the active span.
    pub(crate) fn elapsed(&self) -> Duration {
        self.span.map_or(Duration::ZERO, |(a, b)| b - a)
    }

    /// Length of the arrival span.
    pub(crate) fn rx_elapsed(&self) -> Duration {
        self.rx_span.map_or(Duration::ZERO, |(a, b)| b - a)
    }
}

/// Runs `f` on every item, each in its own thread, and merges what they
/// measured; the first error wins.
pub(crate) fn run_threads<T: Send>(
    items: Vec<T>,
    f: impl Fn(usize, T) -> Result<Stats, Error> + Sync,
) -> Result<Stats, Error> {
    let f = &f;
    std::thread::scope(|sc| {
        let hs: Vec<_> = items
            .into_iter()
            .enumerate()
            .map(|(i, x)| sc.spawn(move || f(i, x)))
            .collect();
        let mut all = Stats::default();
        let mut err = None;
        for h in hs {
            match h.join() {
                Ok(Ok(s)) => all.merge(s),
                Ok(Err(e)) => {
                    err.get_or_insert(e);
                }
                Err(_) => {
                    err.get_or_insert(Error::msg("a test thread panicked"));
                }
            }
        }
        err.map_or(Ok(all), Err)
    })
}

/// Lets `n` threads start together once all are connected; a thread that
/// failed to connect opens the gate for the others, which then stop.
#[derive(Debug, Default)]
pub(crate) struct Gate {
    n: usize,
    arrived: AtomicUsize,
    failed: AtomicBool,
}

impl Gate {
    pub(crate) fn new(n: usize) -> Self {
        Self {
            n,
            ..Self::default()
        }
    }

    /// Arrives with this thread's result and waits for the others (at most
    /// [`IDLE`](crate::tcp::IDLE)); fails if any thread failed.
    pub(crate) fn pass<T>(&self, r: Result<T, Error>) -> Result<T, Error> {
        if r.is_err() {
            self.failed.store(true, Ordering::SeqCst);
            return r;
        }
        self.arrived.fetch_add(1, Ordering::SeqCst);
        let end = Instant::now() + crate::tcp::IDLE;
        while self.arrived.load(Ordering::SeqCst) < self.n {
            if self.failed.load(Ordering::SeqCst) {
                return Err(Error::msg("another connection of this test failed"));
            }
            if Instant::now() >= end {
                return Err(Error::msg(
                    "the other connections of this test did not come up",
                ));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        r
    }
}

/// Splits `n` connections over `threads`: connection `i` goes to thread
/// `i % threads`; the count of each thread.
pub(crate) fn spread(n: usize, threads: usize) -> Vec<usize> {
    (0..threads)
        .map(|g| n / threads + usize::from(g < n % threads))
        .collect()
}

/// Paces a sender to `rate` bytes per second (0: no limit) by sleeping.
#[derive(Debug)]
pub(crate) struct Pacer {
    rate: u64,
    start: Option<Instant>,
    bytes: u64,
}

impl Pacer {
    pub(crate) fn new(rate: u64) -> Self {
        Self {
            rate,
            start: None,
            bytes: 0,
        }
    }

    /// Waits until `len` more bytes may go.
    pub(crate) fn pace(&mut self, len: usize) {
        if self.rate == 0 {
            return;
        }
        let start = *self.start.get_or_insert_with(Instant::now);
        let due = start + Duration::from_secs_f64(self.bytes as f64 / self.rate as f64);
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        self.bytes += len as u64;
    }
}

/// User and system CPU time of this process so far (all threads).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Cpu {
    pub(crate) user_us: u64,
    pub(crate) sys_us: u64,
}

impl Cpu {
    /// `getrusage(RUSAGE_SELF)`.
    pub(crate) fn now() -> Self {
        // SAFETY: rusage is plain data; getrusage fills it.
        let mut r: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: valid pointer to a rusage.
        unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut r) };
        let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
        Self {
            user_us: us(r.ru_utime),
            sys_us: us(r.ru_stime),
        }
    }

    /// CPU used since `earlier`.
    pub(crate) fn since(self, earlier: Self) -> Self {
        Self {
            user_us: self.user_us.saturating_sub(earlier.user_us),
            sys_us: self.sys_us.saturating_sub(earlier.sys_us),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_widens_and_sums() {
        let t0 = Instant::now();
        let mut a = Stats::default();
        a.received(t0, 10, true);
        a.active_now(t0);
        let mut b = Stats::default();
        b.received(t0, 5, false);
        b.bucket(t0, t0 + INTERVAL * 3, 7);
        b.active_now(t0 + Duration::from_millis(5));
        a.merge(b);
        assert_eq!((a.rx.msgs, a.rx.bytes, a.rx.verified), (2, 15, 10));
        assert_eq!(a.intervals, vec![15, 0, 0, 7]);
        assert_eq!(a.elapsed(), Duration::from_millis(5));
    }

    #[test]
    fn pacer_holds_the_rate() {
        let mut p = Pacer::new(1_000_000);
        let t = Instant::now();
        for _ in 0..11 {
            p.pace(2_000);
        }
        // 10 gaps of 2 ms each.
        assert!(t.elapsed() >= Duration::from_millis(20));
    }

    #[test]
    fn cpu_time_grows() {
        let a = Cpu::now();
        let mut x = 0u64;
        for i in 0..5_000_000u64 {
            x = x.wrapping_add(i * i);
        }
        std::hint::black_box(x);
        let d = Cpu::now().since(a);
        assert!(d.user_us + d.sys_us > 0);
    }
}
