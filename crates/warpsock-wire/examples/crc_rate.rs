//! CRC32c throughput of the `crc32c` crate's SSE4.2 loop and of the wire
//! crate's CRC (folding where the CPU can) over a 64 KiB buffer, in GB/s of
//! this thread's CPU time (not wall time: on a shared machine the thread's
//! own CPU time is the steadier measure).
//!
//! `cargo run --release -p warpsock-wire --example crc_rate`

use std::hint::black_box;
use std::time::Duration;

use warpsock_wire::crc;

fn cpu_time() -> Duration {
    let mut ts = [0i64; 2];
    // SAFETY: clock_gettime writes a `struct timespec` (two 64-bit fields
    // on x86_64 Linux) into `ts`, which is that size.
    unsafe { clock_gettime(3, ts.as_mut_ptr()) }; // CLOCK_THREAD_CPUTIME_ID
    Duration::new(ts[0] as u64, ts[1] as u32)
}

extern "C" {
    fn clock_gettime(clk: i32, ts: *mut i64) -> i32;
}

/// CPU seconds per GB of `f` over `buf` (20,000 calls).
fn once(buf: &[u8], f: &dyn Fn(&[u8]) -> u32) -> f64 {
    let rounds = 20_000;
    let t = cpu_time();
    for _ in 0..rounds {
        black_box(f(black_box(buf)));
    }
    (cpu_time() - t).as_secs_f64() / (buf.len() * rounds) as f64 * 1e9
}

fn main() {
    let buf: Vec<u8> = (0..64 * 1024)
        .map(|i: usize| ((i * 31) ^ (i >> 8)) as u8)
        .collect();
    let running = |b: &[u8]| {
        let mut c = crc::Crc32c::new();
        for p in b.chunks(1448) {
            c.update(p);
        }
        c.value()
    };
    type Entry<'a> = (&'a str, &'a dyn Fn(&[u8]) -> u32);
    let entries: [Entry<'_>; 3] = [
        ("crc32c crate (SSE4.2 crc32)", &crc32c::crc32c),
        ("wire crc::crc32c", &crc::crc32c),
        ("wire running, 1448 B pieces", &running),
    ];
    // Rounds interleave the entry points, so a burst of load on a shared
    // machine hits them alike; each figure is the median over 7 rounds.
    let mut runs = vec![Vec::new(); entries.len()];
    for _ in 0..7 {
        for (i, (_, f)) in entries.iter().enumerate() {
            runs[i].push(once(&buf, *f));
        }
    }
    for ((name, _), mut r) in entries.iter().zip(runs) {
        r.sort_by(f64::total_cmp);
        let s = r[r.len() / 2];
        println!("{name:<28} {:6.1} GB/s  ({s:.3} CPU s/GB)", 1.0 / s);
    }
}
