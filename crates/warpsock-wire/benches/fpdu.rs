//! Micro-benchmarks of the FPDU hot path: framing, parsing and CRC32c,
//! against a plain `memcpy` of the same payload as the baseline.
//!
//! Run with `cargo bench -p warpsock-wire --bench fpdu` (or
//! `scripts/bench-micro.sh` for a GB/s summary table).

use std::hint::black_box;
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{
    criterion_group, criterion_main, BenchmarkGroup, BenchmarkId, Criterion, Throughput,
};
use warpsock_wire::{crc, ddp, fpdu};

/// An untagged RDMAP Send header (DDP v1, L bit, RDMAP v1, QN 0, MSN 1).
const SEND_HDR: [u8; ddp::UNTAGGED_HDR_LEN] =
    [0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0];

/// Payload sizes: 64 B, 4 KiB, and the largest payload a 16-bit ULPDU
/// length allows behind an 18-byte untagged header (65,517 B).
const SIZES: [(usize, &str); 3] = [
    (64, "64B"),
    (4096, "4KiB"),
    (fpdu::MAX_ULPDU_LEN - ddp::UNTAGGED_HDR_LEN, "64KiB"),
];

fn payload(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(31) ^ (i >> 8)) as u8)
        .collect()
}

fn frame(payload: &[u8], crc: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(fpdu::fpdu_len(SEND_HDR.len() + payload.len()));
    fpdu::emit(&[&SEND_HDR, payload], crc, &mut out);
    out
}

fn configure<'a>(c: &'a mut Criterion, name: &str) -> BenchmarkGroup<'a, WallTime> {
    let mut g = c.benchmark_group(name);
    g.measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(500))
        .sample_size(20);
    g
}

fn bench_memcpy(c: &mut Criterion) {
    let mut g = configure(c, "memcpy");
    for (len, label) in SIZES {
        let src = payload(len);
        let mut dst = vec![0u8; len];
        g.throughput(Throughput::Bytes(len as u64));
        g.bench_function(BenchmarkId::from_parameter(label), |b| {
            b.iter(|| {
                dst.copy_from_slice(black_box(&src));
                black_box(&mut dst);
            });
        });
    }
    g.finish();
}

fn bench_build(c: &mut Criterion, name: &str, with_crc: bool) {
    let mut g = configure(c, name);
    for (len, label) in SIZES {
        let src = payload(len);
        let mut out = Vec::with_capacity(fpdu::fpdu_len(SEND_HDR.len() + len));
        g.throughput(Throughput::Bytes(len as u64));
        g.bench_function(BenchmarkId::from_parameter(label), |b| {
            b.iter(|| {
                out.clear();
                fpdu::emit(&[black_box(&SEND_HDR), black_box(&src)], with_crc, &mut out);
                black_box(&out);
            });
        });
    }
    g.finish();
}

fn bench_fpdu_build(c: &mut Criterion) {
    bench_build(c, "fpdu_build_crc", true);
}

fn bench_fpdu_build_nocrc(c: &mut Criterion) {
    bench_build(c, "fpdu_build_nocrc", false);
}

/// What the engine's transmit path does per FPDU: build the length field
/// and DDP header inline and compute the CRC trailer over header and
/// payload where the payload lies (the payload itself is handed to
/// `sendmsg` as an iovec, never copied here).
fn bench_fpdu_gather(c: &mut Criterion) {
    let mut g = configure(c, "fpdu_gather_crc");
    for (len, label) in SIZES {
        let src = payload(len);
        g.throughput(Throughput::Bytes(len as u64));
        g.bench_function(BenchmarkId::from_parameter(label), |b| {
            b.iter(|| {
                let ulpdu_len = SEND_HDR.len() + len;
                let mut head = [0u8; 2 + 18];
                head[..2].copy_from_slice(&fpdu::len_field(ulpdu_len));
                head[2..].copy_from_slice(black_box(&SEND_HDR));
                let trailer = fpdu::trailer_for(&[&head[2..], black_box(&src)]);
                black_box((head, trailer))
            });
        });
    }
    g.finish();
}

fn bench_fpdu_parse(c: &mut Criterion) {
    let mut g = configure(c, "fpdu_parse_verify");
    for (len, label) in SIZES {
        let wire = frame(&payload(len), true);
        g.throughput(Throughput::Bytes(len as u64));
        g.bench_function(BenchmarkId::from_parameter(label), |b| {
            b.iter(|| {
                let buf = black_box(&wire[..]);
                let (ulpdu_len, total) = fpdu::peek_len(buf).expect("length field");
                let ulpdu = &buf[fpdu::LEN_FIELD..fpdu::LEN_FIELD + ulpdu_len];
                let hdr = ddp::SegmentHeader::parse(ulpdu).expect("valid header");
                let ok = fpdu::check_crc(&buf[..total]);
                assert!(ok);
                black_box((hdr, ok))
            });
        });
    }
    g.finish();
}

fn bench_crc32c(c: &mut Criterion) {
    let mut g = configure(c, "crc32c");
    for (len, label) in SIZES {
        let src = payload(len);
        g.throughput(Throughput::Bytes(len as u64));
        g.bench_function(BenchmarkId::from_parameter(label), |b| {
            b.iter(|| crc::crc32c(black_box(&src)));
        });
    }
    g.finish();
}

/// The `crc32c` crate's SSE4.2 loop and the wire crate's CRC32c (which
/// folds with VPCLMULQDQ where the CPU has it) over one 64 KiB buffer, and
/// the wire crate's
/// running CRC fed the way a receiver feeds it (one update per TCP
/// segment's worth of payload, 1,448 bytes).
fn bench_crc32c_entry(c: &mut Criterion) {
    let mut g = configure(c, "crc32c_entry");
    let src = payload(64 * 1024);
    g.throughput(Throughput::Bytes(src.len() as u64));
    g.bench_function("crc32c_crate", |b| {
        b.iter(|| crc32c::crc32c(black_box(&src)));
    });
    g.bench_function("wire_crc32c", |b| {
        b.iter(|| crc::crc32c(black_box(&src)));
    });
    g.bench_function("wire_running_1448", |b| {
        b.iter(|| {
            let mut c = crc::Crc32c::new();
            for piece in black_box(&src).chunks(1448) {
                c.update(piece);
            }
            c.value()
        });
    });
    g.finish();
}

criterion_group!(
    benches,
    bench_crc32c_entry,
    bench_memcpy,
    bench_fpdu_build,
    bench_fpdu_gather,
    bench_fpdu_parse,
    bench_fpdu_build_nocrc,
    bench_crc32c
);
criterion_main!(benches);
