//! Pacing of one test on its active side (time or iteration budget,
//! warm-up, progress ticks).

use std::time::{Duration, Instant};

use crate::opts::Budget;

/// Bandwidth samples: bytes completed per interval of this length.
pub(crate) const INTERVAL: Duration = Duration::from_millis(100);
/// Longest warm-up of a timed latency test.
const MAX_WARMUP: Duration = Duration::from_millis(500);

/// Decides when a test stops and reports progress.
pub(crate) struct Meter<'a> {
    budget: Budget,
    warmup: bool,
    start: Instant,
    warm_until: Instant,
    end: Option<Instant>,
    warm_iters: u64,
    total_iters: Option<u64>,
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
        match (self.end, self.total_iters) {
            (Some(end), _) => now < end,
            (None, Some(n)) => done < n,
            (None, None) => false,
        }
    }

    /// Whether iteration `done` is part of the warm-up.
    pub(crate) fn warming(&self, done: u64) -> bool {
        done < self.warm_iters || Instant::now() < self.warm_until
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
}
