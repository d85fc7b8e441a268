//! `Qp::send_inline_news`: Sends built and written at once, with no
//! send-queue entry, arrive whole and in order with posted Sends around
//! them (one MSN sequence, CRC on and off), make no completion, and when
//! the socket does not take one at once the rest is queued and written by
//! later progress, with later Sends (inline ones refused meanwhile) behind
//! it. `Qp::send_gathered_news`: Sends of several FPDUs framed at once and
//! written from the caller's buffers arrive the same way, and what the
//! socket does not take is the engine's own copy — the caller's buffer is
//! free once the call returns; `Qp::send_gathered_list_news`, several
//! such Sends in one write, the same.

mod common;

use std::sync::mpsc::channel;

use common::{send_wr, wait_n, LIMIT};
use warpsock_engine::{
    connect, Access, Context, Cq, Listener, Pd, Progress, Qp, QpInit, QpOptions, RecvWr, WcOpcode,
};

/// The payload of message `n`: its number, then its low byte repeated.
fn payload(n: u32, len: usize) -> Vec<u8> {
    let mut b = vec![n as u8; len];
    b[..4].copy_from_slice(&n.to_be_bytes());
    b
}

/// A server that takes `slots` receives of `len` bytes each, reads
/// nothing until told how many messages to expect, then checks each one
/// (length and bytes, in order) and returns how many it got.
fn server(
    l: Listener,
    crc: bool,
    slots: usize,
    len: usize,
) -> (std::sync::mpsc::Sender<u32>, std::thread::JoinHandle<u32>) {
    let (go_tx, go_rx) = channel::<u32>();
    let h = std::thread::spawn(move || {
        let c = Context::new(Progress::Caller).unwrap();
        let pd = c.alloc_pd();
        let cq = c.create_cq(64).unwrap();
        let buf = pd.alloc(slots * len, Access::LOCAL_WRITE);
        let mut init = QpInit::new(&pd, &cq);
        init.options = QpOptions {
            crc,
            rq_depth: slots,
            ..QpOptions::default()
        };
        init.recvs = (0..slots)
            .map(|i| RecvWr {
                wr_id: i as u64,
                sgl: buf.sge(i * len, len as u32).into(),
            })
            .collect();
        let _qp = l.accept_qp(&init, &[], Some(LIMIT)).unwrap();
        let total = go_rx.recv_timeout(LIMIT).unwrap();
        for n in 0..total {
            let w = wait_n(&cq, 1)[0];
            assert!(
                w.is_ok() && w.opcode == WcOpcode::Recv,
                "message {n}: {w:?}"
            );
            let at = w.wr_id as usize * len;
            assert_eq!(w.byte_len as usize, len, "message {n}");
            let mut got = vec![0; len];
            buf.read(at, &mut got);
            assert!(got == payload(n, len), "message {n} differs");
        }
        total
    });
    (go_tx, h)
}

#[test]
fn inline_sends_arrive_in_order_between_posted_ones() {
    const LEN: usize = 100;
    const MSGS: u32 = 60;
    for crc in [false, true] {
        let l = Listener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let (go, srv) = server(l, crc, MSGS as usize, LEN);
        let c = Context::new(Progress::Caller).unwrap();
        let pd = c.alloc_pd();
        let cq = c.create_cq(64).unwrap();
        let src = pd.alloc(MSGS as usize * LEN, Access::LOCAL_READ);
        let mut init = QpInit::new(&pd, &cq);
        init.options.crc = crc;
        let qp = connect(addr, &init).unwrap();
        let before = qp.io_stats();
        let mut posted = 0;
        for n in 0..MSGS {
            let p = payload(n, LEN);
            if n % 4 == 3 {
                let at = n as usize * LEN;
                src.write(at, &p);
                qp.post_send(send_wr(u64::from(n), src.sge(at, LEN as u32)))
                    .unwrap();
                posted += 1;
                continue;
            }
            let news = qp.send_inline_news(&[&p[..3], &p[3..]]);
            assert_eq!(news.map(|n| n.backlog), Some(0), "message {n}");
            // The news is the queue pair's, events included (the
            // connection's `Established`, not polled here, waits).
            assert_eq!(news, Some(qp.news()), "message {n}");
            assert!(news.is_some_and(|n| n.events), "message {n}");
        }
        let after = qp.io_stats();
        let inline = u64::from(MSGS) - posted;
        assert_eq!(after.inline_sends - before.inline_sends, inline);
        // Each inline Send was written whole, by a write of its own that
        // the counters saw (with its FPDU's bytes, more than the payload).
        assert!(after.writes - before.writes >= inline, "{after:?}");
        assert!(
            after.write_bytes - before.write_bytes > inline * LEN as u64,
            "{after:?}"
        );
        go.send(MSGS).unwrap();
        assert_eq!(srv.join().unwrap(), MSGS);
        // Only the posted (signalled) Sends complete.
        let wcs = wait_n(&cq, posted as usize);
        assert!(wcs.iter().all(|w| w.is_ok() && w.opcode == WcOpcode::Send));
        let mut more = [warpsock_engine::Wc::default(); 4];
        assert_eq!(cq.poll(&mut more), 0, "{:?}", &more[..1]);
    }
}

/// Receives of the filled-socket tests: more than the socket buffers
/// hold at 1 KiB each, so inline sends block before they run out.
const SLOTS: usize = 16 << 10;

/// The set-up of the blocked-send tests: a client queue pair (CRC off) on
/// a context driven as `progress`, connected to a [`server`] of [`SLOTS`]
/// 1 KiB receives that reads nothing until told: the context, its PD and
/// CQ, the queue pair, the server's go channel and thread, and the bytes
/// per message (1 KiB, or less if the FPDU has less room). Bind every part
/// by name: each must live to the test's end.
type Filled = (
    Context,
    Pd,
    Cq,
    Qp,
    std::sync::mpsc::Sender<u32>,
    std::thread::JoinHandle<u32>,
    usize,
);

/// [`Filled`] without the bytes per message ([`pair_to_server`]).
type ToServer = (
    Context,
    Pd,
    Cq,
    Qp,
    std::sync::mpsc::Sender<u32>,
    std::thread::JoinHandle<u32>,
);

fn filled(progress: Progress) -> Filled {
    filled_with(progress, SLOTS, 1024)
}

/// [`filled`] with `slots` receives of `len` bytes (the bytes per message
/// returned as they are).
fn filled_with(progress: Progress, slots: usize, len: usize) -> Filled {
    let (c, pd, cq, qp, go, srv) = pair_to_server(progress, false, slots, len);
    let len = if len == 1024 {
        len.min(qp.mulpdu() - 18)
    } else {
        len
    };
    (c, pd, cq, qp, go, srv, len)
}

/// The socket's buffers fill (the server reads nothing yet): the inline
/// Send the kernel did not take whole is queued (backlog), the next inline
/// Send is refused while it is, and a Send posted then goes out behind it;
/// the server then gets every message whole and in order. Each inline send
/// makes one write, the blocked one too (no second `sendmsg` at once into
/// the socket that just refused it: review item 3 of session 14).
#[test]
fn a_blocked_inline_send_is_queued_and_later_sends_wait_behind_it() {
    let (_context, pd, cq, qp, go, srv, len) = filled(Progress::Caller);
    assert_eq!(len, 1024, "FPDU room {}", qp.mulpdu());
    let mut n = 0u32;
    let mut blocked = false;
    while (n as usize) < SLOTS - 1 {
        let writes = qp.io_stats().writes;
        let news = qp
            .send_inline_news(&[&payload(n, len)])
            .unwrap_or_else(|| panic!("message {n} refused with nothing queued"));
        // One `sendmsg` per inline send, the one that blocked too: a socket
        // that just refused bytes is not asked again in the same call (the
        // rest waits for writability or the next pass).
        assert_eq!(qp.io_stats().writes - writes, 1, "message {n}: {news:?}");
        n += 1;
        if news.backlog > 0 {
            blocked = true;
            break;
        }
    }
    assert!(blocked, "{n} messages of {len} B all written at once");
    assert!(qp.io_stats().writes_blocked > 0 || qp.send_backlog() > 0);
    // Refused while the rest of the last one waits.
    assert!(qp.send_inline_news(&[&payload(n, len)]).is_none());
    n = post_last_behind(&pd, &cq, &qp, &go, n, len);
    assert_eq!(srv.join().unwrap(), n);
}

/// Message `n` posted (registered, signalled) behind what is queued, the
/// server told to expect `n + 1`, and the Send's completion waited for
/// (the caller's wait drives the engine: the queued rest goes out first).
/// Returns `n + 1`.
fn post_last_behind(
    pd: &Pd,
    cq: &Cq,
    qp: &Qp,
    go: &std::sync::mpsc::Sender<u32>,
    n: u32,
    len: usize,
) -> u32 {
    let last = pd.register(payload(n, len), Access::LOCAL_READ);
    qp.post_send(send_wr(7, last.sge(0, len as u32))).unwrap();
    go.send(n + 1).unwrap();
    let w = wait_n(cq, 1)[0];
    assert!(w.is_ok() && w.wr_id == 7, "{w:?}");
    n + 1
}

/// The same filled socket with a progress thread: the caller never drives
/// the engine after the inline send that blocked (it only waits for the
/// server), so the rest of that FPDU goes out only because the socket is
/// watched for writability (`send_inline_news` adds `EPOLLOUT` instead of
/// a second write); unwatched, the server would wait for its last message
/// until it gives up.
#[test]
fn a_blocked_inline_send_is_finished_by_the_progress_thread() {
    let (_context, _pd, _cq, qp, go, srv, len) = filled(Progress::Thread);
    let mut n = 0u32;
    let mut blocked = false;
    while (n as usize) < SLOTS - 1 {
        let news = qp
            .send_inline_news(&[&payload(n, len)])
            .unwrap_or_else(|| panic!("message {n} refused with nothing queued"));
        n += 1;
        if news.backlog > 0 {
            blocked = true;
            break;
        }
    }
    assert!(blocked, "{n} messages of {len} B all written at once");
    go.send(n).unwrap();
    assert_eq!(srv.join().unwrap(), n);
    drop(qp);
}

/// A connection on a context driven as `progress` to a [`server`] of
/// `slots` receives of `len` bytes, CRC `crc`: the context (kept alive),
/// its protection domain, completion queue and queue pair, the server's go
/// and its thread.
fn pair_to_server(progress: Progress, crc: bool, slots: usize, len: usize) -> ToServer {
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let c = Context::new(progress).unwrap();
    let pd = c.alloc_pd();
    let cq = c.create_cq(64).unwrap();
    let mut init = QpInit::new(&pd, &cq);
    init.options.crc = crc;
    let (go, srv) = server(l, crc, slots, len);
    let qp = connect(addr, &init).unwrap();
    (c, pd, cq, qp, go, srv)
}

/// Sends of several FPDUs each, gathered from the caller's buffer, with
/// posted ones between them, while the server reads: whole and in order
/// (CRC on and off), no completion of their own. The caller reuses one
/// buffer for every message, overwriting it as soon as each call returns.
/// A gathered Send refused (the rest of the one before still queued: the
/// socket took it in part) is posted instead and goes out behind it.
#[test]
fn gathered_sends_arrive_in_order_between_posted_ones() {
    const MSGS: u32 = 24;
    let len = connect_probe_len();
    for crc in [false, true] {
        let (_c, pd, cq, qp, go, srv) = pair_to_server(Progress::Thread, crc, MSGS as usize, len);
        assert!(
            len > 3 * (qp.mulpdu() - 18),
            "{len} B in {} B FPDUs",
            qp.mulpdu()
        );
        go.send(MSGS).unwrap();
        let before = qp.io_stats();
        let mut buf = vec![0u8; len];
        let (mut posted, mut refused) = (0, 0);
        for n in 0..MSGS {
            buf.copy_from_slice(&payload(n, len));
            if n % 4 == 3 || qp.send_gathered_news(&[&buf[..7], &buf[7..]]).is_none() {
                assert!(n > 0, "the first, with nothing queued, was refused");
                refused += u32::from(n % 4 != 3);
                let mr = pd.register(buf.clone(), Access::LOCAL_READ);
                qp.post_send(send_wr(u64::from(n), mr.sge(0, len as u32)))
                    .unwrap();
                posted += 1;
                // Posted Sends complete once written: wait, so that the
                // next gathered one may find nothing queued.
                let w = wait_n(&cq, 1)[0];
                assert!(w.is_ok() && w.wr_id == u64::from(n), "{w:?}");
            }
            buf.fill(0xEE);
        }
        let after = qp.io_stats();
        let gathered = u64::from(MSGS - posted);
        assert!(gathered > u64::from(MSGS / 4), "{refused} refused");
        assert_eq!(after.gathered_sends - before.gathered_sends, gathered);
        assert_eq!(srv.join().unwrap(), MSGS);
        let mut more = [warpsock_engine::Wc::default(); 4];
        assert_eq!(cq.poll(&mut more), 0, "{:?}", &more[..1]);
    }
}

/// Lists of one to four gathered Sends, each list one `sendmsg` from the
/// caller's buffers (overwritten as soon as the call returns), with the
/// server reading: every message whole and in order, CRC on and off.
/// What a list did not take (refused behind a queued rest) is posted and
/// goes out behind it.
#[test]
fn gathered_lists_arrive_in_order() {
    const MSGS: u32 = 40;
    let len = connect_probe_len();
    for crc in [false, true] {
        let (_c, pd, cq, qp, go, srv) = pair_to_server(Progress::Thread, crc, MSGS as usize, len);
        go.send(MSGS).unwrap();
        let before = qp.io_stats();
        let mut bufs = vec![vec![0u8; len]; 4];
        let (mut n, mut lists, mut multi, mut posted) = (0u32, 0, 0, 0);
        while n < MSGS {
            let k = (lists % 4 + 1).min((MSGS - n) as usize);
            for (i, b) in bufs[..k].iter_mut().enumerate() {
                b.copy_from_slice(&payload(n + i as u32, len));
            }
            let parts: Vec<[&[u8]; 2]> = bufs[..k].iter().map(|b| [&b[..7], &b[7..]]).collect();
            let msgs: Vec<&[&[u8]]> = parts.iter().map(|p| &p[..]).collect();
            let writes = qp.io_stats().writes;
            let taken = match qp.send_gathered_list_news(&msgs) {
                Some((taken, _)) => {
                    assert!((1..=k).contains(&taken), "{taken} of {k}");
                    // One `sendmsg` for the list (the progress thread may
                    // write a rest meanwhile).
                    assert!(qp.io_stats().writes - writes >= 1);
                    multi += usize::from(taken > 1);
                    taken
                }
                None => 0,
            };
            for b in &mut bufs[..taken] {
                b.fill(0xEE);
            }
            // The rest of the list, posted behind it.
            for (i, b) in bufs[taken..k].iter().enumerate() {
                let m = n + (taken + i) as u32;
                let mr = pd.register(b.clone(), Access::LOCAL_READ);
                qp.post_send(send_wr(u64::from(m), mr.sge(0, len as u32)))
                    .unwrap();
                let w = wait_n(&cq, 1)[0];
                assert!(w.is_ok() && w.wr_id == u64::from(m), "{w:?}");
                posted += 1;
            }
            n += k as u32;
            lists += 1;
        }
        let after = qp.io_stats();
        assert!(multi >= 3, "{multi} lists took more than one message");
        assert_eq!(
            after.gathered_sends - before.gathered_sends,
            u64::from(MSGS - posted)
        );
        assert_eq!(srv.join().unwrap(), MSGS);
        let mut more = [warpsock_engine::Wc::default(); 4];
        assert_eq!(cq.poll(&mut more), 0, "{:?}", &more[..1]);
    }
}

/// A length of three FPDUs and a bit for a loopback connection (its
/// `mulpdu` is the MSS's; the server must size its receives before
/// connecting).
fn connect_probe_len() -> usize {
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        let c = Context::new(Progress::Caller).unwrap();
        let pd = c.alloc_pd();
        let cq = c.create_cq(4).unwrap();
        let init = QpInit::new(&pd, &cq);
        l.accept_qp(&init, &[], Some(LIMIT)).map(|q| q.mulpdu())
    });
    let c = Context::new(Progress::Caller).unwrap();
    let pd = c.alloc_pd();
    let cq = c.create_cq(4).unwrap();
    let qp = connect(addr, &QpInit::new(&pd, &cq)).unwrap();
    let m = qp.mulpdu();
    assert_eq!(t.join().unwrap().unwrap(), m);
    3 * (m - 18) + 5
}

/// The socket's buffers fill (the server reads nothing yet): a gathered
/// Send the kernel did not take whole leaves its rest queued — the
/// engine's copy, counted, at most the message's FPDUs — and the caller
/// overwrites its buffer at once. Driven by the caller, each gathered send
/// is one `sendmsg` and the next one is refused while the rest waits; a
/// Send posted then goes out behind it. With a progress thread, the rest
/// goes out because the socket is watched for writability. The server
/// gets every message whole either way.
#[test]
fn a_blocked_gathered_send_keeps_its_rest_and_frees_the_callers_buffer() {
    const SLOTS_G: usize = 96;
    let len = connect_probe_len();
    for progress in [Progress::Caller, Progress::Thread] {
        let caller = matches!(progress, Progress::Caller);
        let (_context, pd, cq, qp, go, srv, len) = filled_with(progress, SLOTS_G, len);
        // The message's bytes on the wire: a 20-byte head, pad and CRC an FPDU.
        let wire = len + 26 * len.div_ceil(qp.mulpdu() - 18);
        let mut buf = vec![0u8; len];
        let mut n = 0u32;
        let mut blocked = false;
        while (n as usize) < SLOTS_G - 1 {
            buf.copy_from_slice(&payload(n, len));
            let writes = qp.io_stats().writes;
            let news = qp
                .send_gathered_news(&[&buf])
                .unwrap_or_else(|| panic!("message {n} refused with nothing queued"));
            if caller {
                assert_eq!(qp.io_stats().writes - writes, 1, "message {n}: {news:?}");
            }
            buf.fill(0xEE);
            n += 1;
            if news.backlog > 0 {
                blocked = true;
                break;
            }
        }
        assert!(blocked, "{n} messages of {len} B all written at once");
        let st = qp.io_stats();
        assert!(st.gathered_copied > 0, "{st:?}");
        assert!(st.gathered_copied <= wire as u64, "{st:?}");
        if caller {
            // Nobody drives the engine: the rest is still queued.
            assert!(
                qp.send_gathered_news(&[&buf]).is_none(),
                "taken behind a backlog"
            );
            n = post_last_behind(&pd, &cq, &qp, &go, n, len);
        } else {
            go.send(n).unwrap();
        }
        assert_eq!(srv.join().unwrap(), n);
        drop(qp);
    }
}
