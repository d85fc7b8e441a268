//! The stream core at the end of stream: reads and credits after the
//! peer's EOF, half-closed peers and readers (part of `stream.rs`).

use super::*;

/// After the peer's EOF our reads return no credit to it (issue 12): the
/// peer sends no DATA after its EOF, so a CREDIT is of no use to it, and
/// it may have exited since — its kernel's orphaned socket answers any
/// segment with a reset, which drops what that kernel had not sent yet
/// (a writer's `write; close; _exit(0)` left the reader 2 MiB of 4, then
/// `ECONNRESET`). The same reads before the EOF return them.
#[test]
fn reads_after_the_peers_eof_return_no_credit() {
    let data = |eom| {
        let mut d = encode(Msg {
            credits: 0,
            body: Body::Data { eom },
        });
        d.extend_from_slice(&[7; 10]);
        d
    };
    let eof = encode(Msg {
        credits: 0,
        body: Body::Eof,
    });
    for with_eof in [false, true] {
        let mut s = Stream::new(hello(16, 256), hello(16, 256));
        // The peer's window filled but for its last credit (the EOF needs
        // two, and leaves it one).
        for slot in 0..14 {
            s.on_message(slot, &data(slot == 13)).unwrap();
        }
        if with_eof {
            s.on_message(14, &eof).unwrap();
            assert!(s.eof());
        }
        // Read everything, message by message, counting the CREDITs.
        let mut credits = 0;
        for _ in 0..14 {
            s.consume(10);
            repost_all(&mut s);
            let owes = s.owes_msg();
            while let Some(m) = s.poll_msg() {
                assert!(owes, "owes_msg said none");
                assert!(m.body == Body::Credit && m.credits > 0, "{m:?}");
                credits += 1;
            }
        }
        if with_eof {
            assert_eq!(credits, 0, "CREDITs sent after the peer's EOF");
        } else {
            assert!(credits > 0, "the reads before an EOF returned no credit");
        }
    }
}

/// A one-way stream read slowly after the writer's EOF has arrived: the
/// reader sends nothing from then on (no CREDIT: see
/// `reads_after_the_peers_eof_return_no_credit`), through tiny slots and
/// large ones, and reads every byte then the end.
#[test]
fn a_reader_sends_nothing_after_the_writers_eof() {
    for seed in seeds(20) {
        for (slots, size) in [(3u16, 256u32), (16, 256), (64, 1024)] {
            let mut rng = Rng::new(900 + seed);
            let mut a = Plan::idle();
            a.sends = sizes(&mut rng, 40, 1, 3000);
            let mut b = Plan::idle();
            b.shutdown = false;
            b.read_max = 300;
            b.stall_percent = 50;
            let mut p = Pair::new(seed, (hello(4, 256), a), (hello(slots, size), b), 3);
            let mut at_eof = None;
            while !p.b.saw_eof {
                assert!(
                    p.now < 500_000,
                    "no progress: b received {}",
                    p.b.received.len()
                );
                p.step();
                if at_eof.is_none() && p.b.s.eof() {
                    at_eof = Some(p.b.msgs_sent);
                }
            }
            assert_eq!(p.b.received.len() as u64, p.a.sent(), "b received all of a");
            assert!(p.b.received == p.a.expected(p.a.sent()), "in order");
            assert_eq!(
                Some(p.b.msgs_sent),
                at_eof,
                "messages b sent after a's EOF (seed {seed}, {slots} slots)"
            );
        }
    }
}

/// What the peer may still need a return for after its EOF goes on
/// getting one: with no credit left (it spent its last on CREDITs, as a
/// half-closed peer reading our stream does), or owing us the SINK_DONE
/// of a sink we offered (its EOF declined it; the answer needs two
/// credits and ends the peer's own close).
#[test]
fn after_the_peers_eof_a_peer_with_no_credit_or_a_sink_answer_owed_gets_its_return() {
    let msg = |body| encode(Msg { credits: 0, body });
    // No credit left: DATA, the EOF, then two CREDITs (4 slots).
    let mut s = Stream::new(hello(4, 256), hello(4, 256));
    let mut d = msg(Body::Data { eom: true });
    d.push(7);
    s.on_message(0, &d).unwrap();
    s.on_message(1, &msg(Body::Eof)).unwrap();
    s.on_message(2, &msg(Body::Credit)).unwrap();
    s.on_message(3, &msg(Body::Credit)).unwrap();
    s.consume(1);
    repost_all(&mut s);
    assert!(
        matches!(s.poll_msg(), Some(m) if m.body == Body::Credit && m.credits == 4),
        "a peer with no credit after its EOF got no return"
    );
    // A sink's answer owed: our sink offered, declined by the peer's DATA
    // and EOF (15 of 16 slots: the peer holds one credit), then read.
    let mut s = Stream::new(hello(16, 256), hello(16, 256));
    let id = s.post_sink(1, 0, 4096, false);
    assert!(matches!(s.poll_msg(), Some(m) if matches!(m.body, Body::Sink(_))));
    let mut d = msg(Body::Data { eom: true });
    d.extend_from_slice(&[7; 10]);
    for slot in 0..14 {
        s.on_message(slot, &d).unwrap();
    }
    s.on_message(14, &msg(Body::Eof)).unwrap();
    assert_eq!(s.sink_state(id), SinkState::Declined);
    s.consume(140);
    repost_all(&mut s);
    assert!(
        matches!(s.poll_msg(), Some(m) if m.body == Body::Credit && m.credits == 15),
        "a peer owing a SINK_DONE after its EOF got no return"
    );
}

/// A half-closed peer that still reads and acts on our stream gets its
/// returns after its EOF as before it (review r28-c, item 1): DATA and the
/// EOF leave it two credits (4 slots), none returned (a writer that only
/// wrote needs none); its SINK, SINK_CANCEL, IOMAP or IOUNMAP then leaves
/// it one, and the next such message needs two, so the return is due now.
/// (Held, its read's SINK_CANCEL never left, and the read failed the
/// connection with `ETIMEDOUT` after `sink_cancel_timeout`.)
#[test]
fn a_half_closed_peer_that_still_sends_gets_its_return() {
    use warpsock_xsock::wire::{IoMapAd, SinkAd, ACCESS_WRITE};
    let msg = |body| encode(Msg { credits: 0, body });
    let sink = SinkAd {
        id: 1,
        len: 4096,
        rx_seq: 0,
        stag: 9,
        to: 0,
        waitall: false,
    };
    let map = IoMapAd {
        offset: 0,
        len: 4096,
        to: 0,
        stag: 9,
        access: ACCESS_WRITE,
    };
    let bodies = [
        Body::Sink(sink),
        Body::SinkCancel { id: 1 },
        Body::IoMap(map),
        Body::IoUnmap { offset: 0 },
    ];
    for body in bodies {
        let mut s = Stream::new(hello(4, 256), hello(4, 256));
        let mut d = msg(Body::Data { eom: true });
        d.push(7);
        s.on_message(0, &d).unwrap();
        s.on_message(1, &msg(Body::Eof)).unwrap();
        s.consume(1);
        repost_all(&mut s);
        assert!(
            s.poll_msg().is_none(),
            "a return to a peer with two credits"
        );
        s.on_message(2, &msg(body)).unwrap();
        repost_all(&mut s);
        assert!(
            matches!(s.poll_msg(), Some(m) if m.body == Body::Credit && m.credits == 3),
            "a half-closed peer left at one credit after its {body:?} got no return"
        );
    }
}

/// A half-closed reader (review r28-c, items 1 and 3): `a` sends a
/// request, shuts its end, then reads `b`'s answer, every read on an empty
/// queue offering a sink that it cancels after a while, in stream and
/// message mode, through 3, 4 and 16 slots. `b` first works on the answer
/// (sends nothing for 200 steps): no control message of `a`'s waits more
/// than 20 steps for credits meanwhile (before the fix its SINK_CANCEL
/// waited for `b`'s next DATA, for ever here, which the socket ends with
/// `ETIMEDOUT`). Then `b` answers, and each side reads all of the other.
#[test]
fn a_half_closed_reader_with_sinks_is_not_starved_while_the_other_side_is_idle() {
    let mut exercised = 0;
    for seed in seeds(10) {
        for msg_mode in [false, true] {
            for slots in [3u16, 4, 16] {
                let mut rng = Rng::new(950 + seed);
                let mut a = Plan::idle();
                a.sends = sizes(&mut rng, 6, 1, 600);
                a.zcopy_min = 1;
                a.read_max = 2000;
                a.cancel_percent = 100;
                a.msg_mode = msg_mode;
                let mut b = Plan::idle();
                b.shutdown = false;
                b.msg_mode = msg_mode;
                let mut p = Pair::new(seed, (hello(slots, 256), a), (hello(slots, 256), b), 3);
                while !p.b.saw_eof {
                    assert!(p.now < 100_000, "b never read a's request");
                    p.step();
                }
                let mut held = 0;
                let mut waited = 0;
                for _ in 0..200 {
                    p.step();
                    if p.a.s.has_output() {
                        waited += 1;
                        held += 1;
                        assert!(
                            waited <= 20,
                            "a's control message waited {waited} steps for credits \
                             (seed {seed}, {slots} slots, message mode {msg_mode}, a holds {})",
                            p.a.s.credits()
                        );
                    } else {
                        waited = 0;
                    }
                }
                if held > 0 {
                    exercised += 1;
                }
                p.b.plan.sends = sizes(&mut rng, 30, 1, 3000);
                p.b.plan.shutdown = true;
                p.run_to_end(500_000);
                check(&p);
            }
        }
    }
    assert!(exercised > 0, "no message of a's ever waited for credits");
    eprintln!("{exercised} cases where a's messages waited for credits");
}

/// Our own EOF sent and one credit left, a SINK queued (a half-closed
/// reader's read; it needs two): the last credit goes on a CREDIT, empty
/// here, so the peer, which returns nothing after our EOF to a peer at one
/// credit that has sent it only CREDITs, sees us at none and returns
/// (review r28-c, item 1). Nothing else is sent on that credit.
#[test]
fn a_half_closed_reader_at_one_credit_spends_it_on_a_credit() {
    let mut s = Stream::new(hello(4, 256), hello(4, 256));
    for _ in 0..2 {
        assert!(matches!(s.tx_data(10, true), TxStep::Data { .. }));
        s.tx_end_call();
    }
    s.shutdown_write();
    assert!(matches!(s.poll_msg(), Some(m) if m.body == Body::Eof));
    assert_eq!(s.credits(), 1);
    assert!(s.poll_msg().is_none(), "a CREDIT with nothing queued");
    s.post_sink(1, 0, 4096, false);
    assert!(s.owes_msg());
    assert!(
        matches!(s.poll_msg(), Some(m) if m.body == Body::Credit && m.credits == 0),
        "the last credit was kept with a SINK queued behind our EOF"
    );
    assert_eq!(s.credits(), 0);
    assert!(s.poll_msg().is_none());
}

/// No CREDIT once the carrier has the peer's FIN (`Stream::set_peer_fin`,
/// told by the I/O layer: issue 12, task xlate): a peer whose TCP sent
/// its FIN can never send again, and may have exited — a CREDIT reaching
/// its closed socket draws a reset. Before its EOF message is read (here
/// never: a writer gone without its library's close), three of four slots
/// read make a CREDIT of 3 due; with the FIN seen, none goes, and
/// `credit_next` says none is next.
#[test]
fn no_credit_goes_after_the_carriers_fin() {
    for fin in [false, true] {
        let mut s = Stream::new(hello(4, 256), hello(4, 256));
        for slot in 0..3 {
            let mut d = encode(Msg {
                credits: 0,
                body: Body::Data { eom: true },
            });
            d.push(7);
            s.on_message(slot, &d).unwrap();
        }
        s.consume(3);
        repost_all(&mut s);
        assert!(s.credit_next(), "three of four slots read: a CREDIT next");
        if fin {
            s.set_peer_fin();
            assert!(!s.credit_next(), "a CREDIT next after the FIN");
            assert!(s.poll_msg().is_none(), "a CREDIT after the carrier's FIN");
            assert!(!s.owes_msg(), "a message owed after the carrier's FIN");
        } else {
            assert!(
                matches!(s.poll_msg(), Some(m) if m.body == Body::Credit && m.credits == 3),
                "no CREDIT of 3 before the FIN"
            );
        }
    }
}

/// A close's EOF says the socket closed (`Body::Closed`, kind EOF with
/// `FLAG_CLOSED`): the one the close queues, or one a `shutdown(SHUT_WR)`
/// queued that has not left; an EOF that left says nothing more (a second
/// message would wait for a credit the peer need not return: a word of
/// its own says it, `Body::ClosedLate`, on one credit). The peer's
/// books take it as the end of stream and say the socket closed
/// (`peer_socket_closed`: a send now draws TCP's reset); a plain EOF does
/// not, and a `Closed` after an EOF is a breach.
#[test]
fn a_close_says_so_in_its_eof() {
    let fresh = || Stream::new(hello(16, 256), hello(16, 256));
    let mut s = fresh();
    // It says what the closer had received (none here).
    let closed = Body::Closed { received: Some(0) };
    s.mark_closing();
    s.shutdown_write();
    assert_eq!(s.poll_msg().map(|m| m.body), Some(closed));
    let mut s = fresh();
    s.shutdown_write();
    s.mark_closing();
    assert_eq!(s.poll_msg().map(|m| m.body), Some(closed));
    assert!(s.poll_msg().is_none());
    let mut s = fresh();
    s.shutdown_write();
    assert_eq!(s.poll_msg().map(|m| m.body), Some(Body::Eof));
    s.mark_closing();
    assert!(s.has_output() && s.owes_msg(), "the late close is owed");
    assert_eq!(
        s.poll_msg().map(|m| m.body),
        Some(Body::ClosedLate { received: 0 }),
        "a CREDIT-sized word, not a second end of stream"
    );
    assert!(s.poll_msg().is_none() && !s.has_output());

    let msg = |body| encode(Msg { credits: 0, body });
    let mut r = fresh();
    r.on_message(0, &msg(closed)).unwrap();
    assert!(r.eof() && r.peer_socket_closed());
    assert!(r.on_message(1, &msg(closed)).is_err());
    let mut r = fresh();
    r.on_message(0, &msg(Body::Eof)).unwrap();
    assert!(r.eof() && !r.peer_socket_closed());
    // The late word after a plain EOF says the close; before the EOF it
    // is a breach.
    r.on_message(1, &msg(Body::ClosedLate { received: 0 }))
        .unwrap();
    assert!(r.peer_socket_closed());
    let mut r = fresh();
    assert!(r
        .on_message(0, &msg(Body::ClosedLate { received: 0 }))
        .is_err());
}

/// A close after our EOF left says so only while the peer's stream is
/// open (with it ended, TCP's peer could send nothing either) and with
/// two credits held, one left after it: at our last, the peer would
/// return credits after our EOF to a writer that closed (helper 74).
#[test]
fn a_late_close_is_said_only_to_an_open_stream_with_two_credits() {
    let msg = |body| encode(Msg { credits: 0, body });
    let mut s = Stream::new(hello(16, 256), hello(16, 256));
    s.shutdown_write();
    assert_eq!(s.poll_msg().map(|m| m.body), Some(Body::Eof));
    s.on_message(0, &msg(Body::Eof)).unwrap();
    s.mark_closing();
    assert!(s.poll_msg().is_none(), "the peer's stream had ended");

    // Three slots at the peer: the EOF takes one, a CREDIT of ours (a
    // return of its DATA) another.
    let mut s = Stream::new(hello(16, 256), hello(3, 256));
    s.shutdown_write();
    assert_eq!(s.poll_msg().map(|m| m.body), Some(Body::Eof));
    for slot in 0..16 {
        if s.credits() == 1 {
            break;
        }
        let mut d = msg(Body::Data { eom: true });
        d.push(7);
        s.on_message(slot, &d).unwrap();
        s.consume(1);
        s.post_reposts(|_| Ok(()));
        while let Some(m) = s.poll_msg() {
            assert_eq!(m.body, Body::Credit);
        }
    }
    assert_eq!(s.credits(), 1, "one credit left");
    s.mark_closing();
    assert!(s.poll_msg().is_none() && !s.has_output(), "not at our last");
}

/// A close's EOF says what the closer had received (the low 32 bits): the
/// peer's books tell whether stream bytes of theirs went past it — they
/// reached a closed socket, which over TCP answers them with a reset
/// (`sent_into_peer_close`). Not when every byte sent was received, nor
/// when the EOF does not say (a peer of an older build), nor for a count
/// past anything sent (a lying peer: no window holds it).
#[test]
fn a_close_tells_the_peer_its_bytes_that_came_after() {
    let sent = |n: usize| {
        let mut s = Stream::new(hello(16, 256), hello(16, 256));
        assert!(matches!(s.tx_data(n, true), TxStep::Data { .. }));
        s
    };
    let closed = |received| {
        encode(Msg {
            credits: 0,
            body: Body::Closed { received },
        })
    };
    for (received, past) in [
        (Some(10), false),
        (Some(4), true),
        (Some(0), true),
        (None, false),
        (Some(11), false),
        (Some(u32::MAX), false),
    ] {
        let mut s = sent(10);
        s.on_message(0, &closed(received)).unwrap();
        assert!(s.peer_socket_closed());
        assert_eq!(s.sent_into_peer_close(), past, "received {received:?}");
        // The same said late, after a plain EOF.
        if let Some(received) = received {
            let mut s = sent(10);
            let eof = encode(Msg {
                credits: 0,
                body: Body::Eof,
            });
            let late = encode(Msg {
                credits: 0,
                body: Body::ClosedLate { received },
            });
            s.on_message(0, &eof).unwrap();
            assert!(!s.peer_socket_closed());
            s.on_message(1, &late).unwrap();
            assert!(s.peer_socket_closed());
            assert_eq!(s.sent_into_peer_close(), past, "late, received {received}");
        }
    }
}

/// `drop_received_after`: the unread bytes received past a point go, the
/// newest first (a slot emptied is freed: posted again), what came before
/// stays readable in order; bytes already read are not counted.
#[test]
fn bytes_received_past_a_point_are_dropped_newest_first() {
    let data = |fill: u8| {
        let mut d = encode(Msg {
            credits: 0,
            body: Body::Data { eom: true },
        });
        d.extend_from_slice(&[fill; 10]);
        d
    };
    let mut s = Stream::new(hello(16, 256), hello(16, 256));
    for slot in 0..3 {
        s.on_message(slot, &data(slot as u8)).unwrap();
    }
    s.consume(5);
    let mut freed = Vec::new();
    s.post_reposts(|slots| {
        freed.extend_from_slice(slots);
        Ok(())
    });
    assert!(freed.is_empty());
    // The 15 newest bytes: slot 2 whole, the second half of slot 1.
    assert_eq!(s.drop_received_after(s.rx_seq() - 15), 15);
    assert_eq!((s.readable(), s.unread_slots()), (10, 2));
    s.post_reposts(|slots| {
        freed.extend_from_slice(slots);
        Ok(())
    });
    assert_eq!(freed, [2]);
    let segs: Vec<_> = s.segments().map(|g| (g.slot, g.len)).collect();
    assert_eq!(segs, [(0, 5), (1, 5)]);
    // Past the start: only the unread ones (10), not the 5 read.
    assert_eq!(s.drop_received_after(0), 10);
    assert_eq!((s.readable(), s.unread_slots()), (0, 0));
    assert_eq!(s.drop_received_after(0), 0);
}
