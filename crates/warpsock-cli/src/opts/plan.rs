//! Plan expansion: the options of a run become the list of test runs
//! ([`Spec`]s), per test, size (or connection count), transport and CRC
//! setting, with the CPU placement of each.

use super::BenchOpts;
use crate::spec::{PinArg, Spec, SuiteKind, Test};

/// Sizes swept per test: (quick suite, full suite, --quick).
fn default_sizes(test: Test, suite: SuiteKind, quick: bool) -> Vec<usize> {
    const K: usize = 1 << 10;
    const M: usize = 1 << 20;
    match (test, suite, quick) {
        (Test::Lat, SuiteKind::Quick, false) => vec![8],
        (Test::Lat, _, true) => vec![8, 4 * K],
        (Test::Lat, SuiteKind::Full | SuiteKind::Apps, false) => {
            vec![1, 8, 64, 256, K, 4 * K, 16 * K, 64 * K]
        }
        (Test::Bw, SuiteKind::Quick, false) => vec![M],
        (Test::Bw, _, true) => vec![64, M],
        (Test::Bw, SuiteKind::Full | SuiteKind::Apps, false) => {
            vec![1, 16, 256, 4 * K, 16 * K, 64 * K, 256 * K, M, 4 * M]
        }
        (Test::Bibw, _, true) => vec![32 * K],
        (Test::Bibw, _, false) => vec![4 * K, 64 * K, M],
        (Test::Hotspot | Test::Conn, _, _) => vec![8],
        // 32 KiB: a size every transport can carry (UDP up to 65507 B).
        (Test::Multi | Test::FanIn | Test::FanOut, _, _) => vec![32 * K],
        (Test::Cpu, _, _) => vec![M],
    }
}

impl BenchOpts {
    fn conn_counts(&self, test: Test) -> Vec<usize> {
        if !test.is_scaling() {
            return vec![1];
        }
        if !self.conns.is_empty() {
            return self.conns.clone();
        }
        if self.quick {
            vec![1, 4]
        } else {
            vec![1, 2, 4, 8, 16, 32, 64]
        }
    }

    /// Every test run, in order: per test, size (or connection count) and
    /// transport, TCP first, each warpsock transport with each CRC
    /// setting. `cpus`: CPUs of the client and of the server machine;
    /// `same_host`: both sides share the machine (auto pinning then keeps
    /// spinning sides apart); `offload`: the preload library is there.
    /// The rate of `cpu` runs is filled in when they run.
    pub(crate) fn plan(&self, cpus: (usize, usize), same_host: bool, offload: bool) -> Vec<Spec> {
        let transports = self.transports(offload);
        let mut out = Vec::new();
        let busy_modes: Vec<u64> = match (self.suite, self.busy_poll) {
            (SuiteKind::Full, b) => vec![0, b.unwrap_or(1000)],
            (SuiteKind::Quick | SuiteKind::Apps, b) => vec![b.unwrap_or(0)],
        };
        let mut tests = self.tests();
        if tests.contains(&Test::Cpu) && !tests.contains(&Test::Bw) {
            // Normalized CPU paces every transport to the slowest one's
            // bandwidth at the same size: measure it first.
            tests.insert(0, Test::Bw);
        }
        for test in tests {
            let sizes =
                if self.sizes.is_empty() && test == Test::Bw && !self.tests().contains(&Test::Bw) {
                    default_sizes(Test::Cpu, self.suite, self.quick)
                } else if self.sizes.is_empty() {
                    default_sizes(test, self.suite, self.quick)
                } else {
                    self.sizes.clone()
                };
            let modes: &[u64] = match test {
                Test::Lat => &busy_modes,
                _ => &busy_modes[..1],
            };
            for &busy in modes {
                let (cpin, spin) = self.pins(test, cpus, same_host, busy > 0);
                for &size in &sizes {
                    for conns in self.conn_counts(test) {
                        for &t in &transports {
                            if !t.runs(test, size) {
                                continue;
                            }
                            let crcs: &[bool] = if t.crc { self.crcs() } else { &[false] };
                            for &crc in crcs {
                                out.push(Spec {
                                    test,
                                    transport: t,
                                    crc,
                                    size,
                                    window: if test.is_latency() { 1 } else { self.window },
                                    conns,
                                    progress: self.progress,
                                    busy_poll_us: busy,
                                    client_pin: cpin,
                                    pin: spin,
                                    verify: self.verify,
                                    budget: self.budget(),
                                    rate: 0,
                                });
                            }
                        }
                    }
                }
            }
        }
        out
    }

    /// (client CPU, server CPU) for a test.
    fn pins(
        &self,
        test: Test,
        (ccpus, scpus): (usize, usize),
        same_host: bool,
        busy: bool,
    ) -> (Option<usize>, Option<usize>) {
        match self.pin {
            PinArg::None => (None, None),
            PinArg::Cpus(a, b) => (Some(a), Some(b)),
            PinArg::Auto if !matches!(test, Test::Lat | Test::Hotspot | Test::Conn) => (None, None),
            PinArg::Auto => {
                let (c, s) = (ccpus.saturating_sub(1), scpus.saturating_sub(1));
                if same_host && busy && c > 0 {
                    (Some(c - 1), Some(s))
                } else {
                    (Some(c), Some(s))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use crate::spec::{Budget, CrcMode, ProgressMode, MAX_UDP};
    use crate::transports;

    fn opts(suite: SuiteKind, quick: bool) -> BenchOpts {
        BenchOpts {
            suite,
            quick,
            tests: vec![],
            transports: vec![],
            sizes: vec![],
            conns: vec![],
            duration: None,
            iters: None,
            crc: CrcMode::Both,
            progress: ProgressMode::Caller,
            busy_poll: None,
            window: 8,
            pin: PinArg::Auto,
            verify: false,
            json: None,
            csv: None,
            max_samples: None,
            repeat: 1,
            external: false,
            workloads: vec![],
            token: None,
        }
    }

    #[test]
    fn default_plan() {
        let p = opts(SuiteKind::Quick, false).plan((2, 2), true, true);
        assert_eq!(p.len(), 14);
        assert_eq!(p[0].transport.name(), "tcp");
        assert_eq!(
            (p[0].size, p[0].pin, p[0].client_pin),
            (8, Some(1), Some(1))
        );
        assert_eq!((p[7].size, p[7].test, p[7].pin), (1 << 20, Test::Bw, None));
        assert_eq!(p[0].budget, Budget::Time(Duration::from_secs(3)));
    }

    #[test]
    fn full_plan_covers_every_test_and_transport() {
        for quick in [false, true] {
            let p = opts(SuiteKind::Full, quick).plan((2, 2), true, true);
            for t in Test::ALL {
                assert!(p.iter().any(|s| s.test == t), "{t:?}");
            }
            for t in transports::all() {
                assert!(p.iter().any(|s| s.transport == t), "{t:?}");
            }
            // No datagram larger than UDP allows; busy and event latency.
            assert!(p.iter().all(|s| !s.transport.is_udp() || s.size <= MAX_UDP));
            assert!(p.iter().any(|s| s.test == Test::Lat && s.busy_poll_us > 0));
            assert!(p.iter().any(|s| s.test == Test::Lat && s.busy_poll_us == 0));
            let ns: Vec<usize> = p
                .iter()
                .filter(|s| s.test == Test::FanIn && s.transport.name() == "tcp")
                .map(|s| s.conns)
                .collect();
            assert_eq!(
                ns,
                if quick {
                    vec![1, 4]
                } else {
                    vec![1, 2, 4, 8, 16, 32, 64]
                }
            );
        }
    }
}
