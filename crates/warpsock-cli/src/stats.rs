//! What a side measured ([`Stats`]), what it received ([`Tally`]), the CPU
//! time of the process ([`Cpu`]), the percentiles of a set of times
//! ([`Pcts`], from an HDR histogram) and the interarrival jitter of a
//! datagram stream ([`Jitter`]).
//!
//! Leaf module: plain data and arithmetic, no I/O but `getrusage`.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Bandwidth samples: bytes completed per interval of this length.
pub(crate) const INTERVAL: Duration = Duration::from_millis(100);

/// Significant decimal digits the histogram keeps: every percentile is
/// within 0.1 % of the exact nearest-rank value.
const SIGFIG: u8 = 3;

/// What one side received and checked in a test.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Tally {
    /// Messages received (for RDMA Write: inferred from the final state).
    pub(crate) msgs: u64,
    /// Payload bytes received.
    pub(crate) bytes: u64,
    /// Payload bytes whose contents checked out.
    pub(crate) verified: u64,
}

impl Tally {
    /// Counts one received message of `len` bytes, verified or not.
    pub(crate) fn add(&mut self, len: usize, ok: bool) {
        self.msgs += 1;
        self.bytes += len as u64;
        if ok {
            self.verified += len as u64;
        }
    }
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
    /// RFC 3550 interarrival jitter of what arrived here, ns (datagrams).
    pub(crate) jitter_ns: Option<f64>,
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
        // Threads' flows weigh alike: the larger keeps the worst case.
        self.jitter_ns = match (self.jitter_ns, o.jitter_ns) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
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

/// User and system CPU time of this process so far (all threads).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Cpu {
    pub(crate) user_us: u64,
    pub(crate) sys_us: u64,
}

impl Cpu {
    /// `getrusage(RUSAGE_SELF)`.
    pub(crate) fn now() -> Self {
        Self::of(libc::RUSAGE_SELF)
    }

    /// `getrusage(RUSAGE_CHILDREN)`: every child process reaped so far.
    pub(crate) fn children() -> Self {
        Self::of(libc::RUSAGE_CHILDREN)
    }

    /// User + system, seconds.
    pub(crate) fn total_s(self) -> f64 {
        (self.user_us + self.sys_us) as f64 / 1e6
    }

    fn of(who: libc::c_int) -> Self {
        // SAFETY: rusage is plain data; getrusage fills it.
        let mut r: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: valid pointer to a rusage.
        unsafe { libc::getrusage(who, &mut r) };
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

/// Percentiles of a set of times, in microseconds.
///
/// The suite's own rows have every field (computed from every sample). An
/// external peer's row has what that tool printed and nothing else: a
/// field the tool does not report is `None` (`null` in the JSON), never
/// filled in (fi_pingpong reports only the mean; ucx_perftest one
/// percentile and the mean).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Pcts {
    #[serde(default)]
    pub(crate) p50: Option<f64>,
    #[serde(default)]
    pub(crate) p99: Option<f64>,
    #[serde(default)]
    pub(crate) p999: Option<f64>,
    pub(crate) mean: f64,
    #[serde(default)]
    pub(crate) min: Option<f64>,
    #[serde(default)]
    pub(crate) max: Option<f64>,
}

impl Pcts {
    /// Of `ns` values, each divided by `div` (2 for one-way time): p50,
    /// p99 and p99.9 from an HDR histogram (3 significant digits), the
    /// mean, minimum and maximum exact.
    pub(crate) fn of(ns: &[u64], div: f64) -> Option<Self> {
        let (&min, &max) = (ns.iter().min()?, ns.iter().max()?);
        let mut h = Histogram::<u64>::new_with_bounds(1, max.max(2), SIGFIG)
            .expect("bounds 1..=max with 3 significant digits are valid");
        for &v in ns {
            // Zero counts as the lowest trackable value (1 ns).
            h.saturating_record(v);
        }
        let us = |x: u64| x as f64 / 1000.0 / div;
        // The histogram answers with the highest value of a bucket; never
        // beyond the largest sample.
        let q = |q: f64| us(h.value_at_quantile(q).min(max));
        Some(Self {
            p50: Some(q(0.5)),
            p99: Some(q(0.99)),
            p999: Some(q(0.999)),
            mean: ns.iter().map(|&v| v as f64).sum::<f64>() / ns.len() as f64 / 1000.0 / div,
            min: Some(us(min)),
            max: Some(us(max)),
        })
    }

    /// The typical value: the median, or the mean when the source gave
    /// no median; `true` when it is the median.
    pub(crate) fn typical(&self) -> (f64, bool) {
        self.p50.map_or((self.mean, false), |p| (p, true))
    }
}

/// RFC 3550 §6.4.1 interarrival jitter of one datagram stream: the mean
/// deviation of the change in relative transit time between consecutive
/// datagrams, smoothed with gain 1/16 (`J += (|D| - J) / 16`), as RTP
/// receivers and iperf report it. Transit times are relative: sender and
/// receiver clocks need not agree, only tick at the same rate.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Jitter {
    j: f64,
    last: Option<i64>,
}

impl Jitter {
    /// One datagram arrived `transit_ns` after its send time stamp.
    pub(crate) fn arrived(&mut self, transit_ns: i64) {
        if let Some(p) = self.last {
            let d = (transit_ns - p).unsigned_abs() as f64;
            self.j += (d - self.j) / 16.0;
        }
        self.last = Some(transit_ns);
    }

    /// The jitter so far, ns (`None` before any datagram).
    pub(crate) fn ns(&self) -> Option<f64> {
        self.last.map(|_| self.j)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_follows_rfc3550() {
        let mut j = Jitter::default();
        assert_eq!(j.ns(), None);
        // A constant offset (unsynchronised clocks) is no jitter.
        for _ in 0..100 {
            j.arrived(1_000_000);
        }
        assert_eq!(j.ns(), Some(0.0));
        // One late datagram: D = 16 us, then 16 us back: J = 1 us, then
        // 1 + (16 - 1) / 16 = 1.9375 us.
        j.arrived(1_016_000);
        assert_eq!(j.ns(), Some(1_000.0));
        j.arrived(1_000_000);
        assert_eq!(j.ns(), Some(1_937.5));
        // Transit alternating by 500 ns: J converges to |D| = 500 ns.
        let mut k = Jitter::default();
        for i in 0..2_000 {
            k.arrived(if i % 2 == 0 { 0 } else { 500 });
        }
        assert!((k.ns().unwrap() - 500.0).abs() < 1e-6, "{:?}", k.ns());
    }

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

    #[test]
    fn percentiles_within_a_tenth_of_a_percent() {
        let v: Vec<u64> = (1..=100).collect();
        let p = Pcts::of(&v, 1.0).unwrap();
        // Small values are exact (nearest rank).
        assert_eq!((p.p50, p.p99, p.p999), (Some(0.05), Some(0.099), Some(0.1)));
        let p = Pcts::of(&[4000, 2000, 6000], 2.0).unwrap();
        assert_eq!((p.min, p.max, p.mean), (Some(1.0), Some(3.0), 2.0));
        assert_eq!(p.typical(), (p.p50.unwrap(), true));
        assert!((p.p50.unwrap() - 2.0).abs() <= 0.002, "{p:?}");
        let big: Vec<u64> = (1..=100_000).map(|i| i * 1000).collect();
        let p = Pcts::of(&big, 1.0).unwrap();
        for (got, want) in [(p.p50, 50_000.0), (p.p99, 99_000.0), (p.p999, 99_900.0)] {
            let got = got.unwrap();
            assert!((got - want).abs() / want <= 0.001, "{got} vs {want}");
        }
        assert_eq!(p.max, Some(100_000.0));
        assert_eq!(Pcts::of(&[], 1.0), None);
    }
}
