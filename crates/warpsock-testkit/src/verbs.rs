//! Completion waits and work-request builders for tests over the engine.

use std::time::{Duration, Instant};

use warpsock_engine::{Cq, Wc};
use warpsock_proto::{SendOp, SendWr, Sgl};

/// Upper bound for any single wait in the tests.
pub const LIMIT: Duration = Duration::from_secs(20);

/// Waits until `n` completions arrived on `cq`; panics after [`LIMIT`],
/// naming what had arrived.
pub fn wait_n(cq: &Cq, n: usize) -> Vec<Wc> {
    let deadline = Instant::now() + LIMIT;
    let mut got = Vec::with_capacity(n);
    let mut buf = [Wc::default(); 64];
    while got.len() < n {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "timed out with {}/{n} completions: {got:?}",
            got.len()
        );
        let k = cq
            .wait(&mut buf[..(n - got.len()).min(64)], left)
            .expect("cq wait");
        got.extend_from_slice(&buf[..k]);
    }
    got
}

/// A plain Send operation (not solicited, no invalidate).
pub fn send() -> SendOp {
    SendOp::Send {
        solicited: false,
        invalidate: None,
    }
}

/// A signaled plain Send of `sgl`.
pub fn send_wr(wr_id: u64, sgl: impl Into<Sgl>) -> SendWr {
    SendWr {
        wr_id,
        op: send(),
        sgl: sgl.into(),
        signaled: true,
    }
}
