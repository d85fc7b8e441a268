//! The active side's clock: when a test stops ([`Meter`]: time or
//! iteration budget, warm-up, progress ticks) and how fast it may send
//! ([`Pacer`]).

use std::time::{Duration, Instant};

use crate::spec::Budget;

/// Longest warm-up of a timed latency test.
const MAX_WARMUP: Duration = Duration::from_millis(500);
/// A timed latency test starts at least this many round trips after its
/// warm-up, even past its time: on a loaded machine a 50 ms test could
/// otherwise end with none measured.
const MIN_MEASURED: u64 = 16;

/// Decides when a test stops and reports progress.
pub(crate) struct Meter<'a> {
    budget: Budget,
    warmup: bool,
    start: Instant,
    warm_until: Instant,
    end: Option<Instant>,
    warm_iters: u64,
    total_iters: Option<u64>,
    /// Iterations started when the warm-up ended (timed latency tests).
    first_measured: Option<u64>,
    tick: &'a dyn Fn(f64),
    next_tick: Instant,
}

impl<'a> Meter<'a> {
    /// Starts the clock. `warmup`: latency tests discard a first 5 % (at
    /// most 0.5 s when timed).
    pub(crate) fn new(budget: Budget, warmup: bool, tick: &'a dyn Fn(f64)) -> Self {
        let mut m = Self {
            budget,
            warmup,
            start: Instant::now(),
            warm_until: Instant::now(),
            end: None,
            warm_iters: 0,
            total_iters: None,
            first_measured: None,
            tick,
            next_tick: Instant::now(),
        };
        m.restart();
        m
    }

    /// Restarts the clock (call it when setup is over, right before the
    /// first message).
    pub(crate) fn restart(&mut self) {
        let (budget, warmup) = (self.budget, self.warmup);
        let start = Instant::now();
        let (warm, end, warm_iters, total_iters) = match budget {
            Budget::Time(d) => {
                let w = if warmup {
                    (d / 20).min(MAX_WARMUP)
                } else {
                    Duration::ZERO
                };
                (w, Some(start + w + d), 0, None)
            }
            Budget::Iters(n) => {
                let w = if warmup { n / 20 } else { 0 };
                (Duration::ZERO, None, w, Some(w + n))
            }
        };
        self.start = start;
        self.warm_until = start + warm;
        self.end = end;
        self.warm_iters = warm_iters;
        self.total_iters = total_iters;
        self.first_measured = None;
        self.next_tick = start;
    }

    /// Whether to start iteration `done` (the count started so far).
    pub(crate) fn more(&mut self, done: u64) -> bool {
        let now = Instant::now();
        let frac = match (self.end, self.total_iters) {
            (Some(end), _) => {
                (now - self.start).as_secs_f64() / (end - self.start).as_secs_f64().max(1e-9)
            }
            (None, Some(n)) => done as f64 / n.max(1) as f64,
            (None, None) => 0.0,
        };
        if now >= self.next_tick {
            (self.tick)(frac.min(1.0));
            self.next_tick = now + Duration::from_millis(50);
        }
        if self.warmup && self.first_measured.is_none() && now >= self.warm_until {
            self.first_measured = Some(done);
        }
        let too_few = self.warmup && self.first_measured.is_none_or(|f| done < f + MIN_MEASURED);
        match (self.end, self.total_iters) {
            (Some(end), _) => now < end || too_few,
            (None, Some(n)) => done < n,
            (None, None) => false,
        }
    }

    /// Whether iteration `done` is part of the warm-up.
    pub(crate) fn warming(&self, done: u64) -> bool {
        done < self.warm_iters || Instant::now() < self.warm_until
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iteration_budget_with_warmup() {
        let tick = |_: f64| {};
        let mut m = Meter::new(Budget::Iters(100), true, &tick);
        let mut n = 0;
        while m.more(n) {
            n += 1;
        }
        assert_eq!(n, 105);
        assert!(m.warming(4) && !m.warming(5));
    }

    #[test]
    fn time_budget() {
        let tick = |_: f64| {};
        let t = Instant::now();
        let mut m = Meter::new(Budget::Time(Duration::from_millis(30)), false, &tick);
        let mut n = 0;
        while m.more(n) {
            n += 1;
        }
        assert!(t.elapsed() >= Duration::from_millis(30));
        assert!(n > 0);
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
    fn a_timed_latency_test_measures_some_round_trips() {
        let tick = |_: f64| {};
        let mut m = Meter::new(Budget::Time(Duration::from_millis(1)), true, &tick);
        // A descheduled side: the whole budget passes before the first.
        std::thread::sleep(Duration::from_millis(5));
        let mut n = 0;
        while m.more(n) {
            n += 1;
        }
        assert_eq!(n, MIN_MEASURED);
        assert!(!m.warming(0));
    }
}
