//! Scripted single-peer tests: exact bytes in, exact Terminate out, for
//! each class of malformed input (RFC 5040 §7, RFC 5041 §7, RFC 5044 §8,
//! with siw's codes where siw differs). Each test also checks that the QP
//! ends in Error, that outstanding work is flushed, and that no byte was
//! written outside (or inside) a region the peer had no right to.

use std::time::Instant;

use warpsock_proto::wire::ddp::{Opcode, Placement, ReadRequest, SegmentHeader};
use warpsock_proto::wire::fpdu;
use warpsock_proto::wire::mpa::{EnhancedParams, Flags, FrameKind, RequestReply};
use warpsock_proto::wire::WireError;
use warpsock_proto::{
    Access, Config, ConnectError, Connection, Event, PdId, QpState, RecvWr, Registry, Role, Sge,
    Stag, WcStatus,
};

struct Peer {
    conn: Connection,
    reg: Registry<Vec<u8>>,
    pd: PdId,
    crc: bool,
    out: Vec<u8>,
}

fn request(crc: bool, ird: u16, ord: u16) -> Vec<u8> {
    let word = EnhancedParams {
        ird,
        ord,
        ..Default::default()
    }
    .to_bytes();
    let mut v = Vec::new();
    RequestReply {
        kind: FrameKind::Request,
        flags: Flags(Flags::ENHANCED).with(Flags::CRC, crc),
        revision: 2,
        private_data: &word,
    }
    .emit(&mut v);
    v
}

/// A responder that has accepted a scripted MPA Request.
fn responder(crc: bool, ird: u16) -> Peer {
    let mut reg = Registry::new();
    let pd = reg.alloc_pd();
    let mut cfg = Config::new(Role::Responder, pd);
    cfg.ird = ird;
    let mut conn = Connection::new(cfg, Instant::now());
    assert_eq!(conn.handle_input(&request(crc, 4, 1), &mut reg), 24);
    // `has_reports` says when an event waits (the engine's driver asks it
    // before collecting), and that nothing does once it is taken.
    assert!(conn.has_reports(), "the request's event");
    assert!(matches!(conn.poll_event(), Some(Event::ConnectRequest(_))));
    assert!(!conn.has_reports());
    conn.accept(&[]).unwrap();
    let mut out = Vec::new();
    conn.poll_transmit(&reg, &mut out, 1 << 16);
    assert_eq!(out.len(), 24, "MPA reply");
    assert!(conn.has_reports(), "the Established event");
    assert!(matches!(conn.poll_event(), Some(Event::Established(_))));
    assert!(!conn.has_reports());
    Peer {
        conn,
        reg,
        pd,
        crc,
        out: Vec::new(),
    }
}

impl Peer {
    fn feed(&mut self, bytes: &[u8]) {
        self.conn.handle_input(bytes, &mut self.reg);
        self.out.clear();
        self.conn.poll_transmit(&self.reg, &mut self.out, 1 << 16);
    }

    fn fpdu(&self, hdr: SegmentHeader, body: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        fpdu::emit(&[&hdr.to_bytes()[..hdr.len()], body], self.crc, &mut v);
        v
    }

    fn recv(&mut self, wr_id: u64, stag: Stag, len: u32) {
        self.conn
            .post_recv(RecvWr {
                wr_id,
                sgl: Sge {
                    addr: 0,
                    length: len,
                    lkey: stag,
                }
                .into(),
            })
            .unwrap();
    }

    /// Asserts the single FPDU sent is a Terminate with exactly `body`
    /// after its header, and that the QP is dead.
    fn expect_terminate(&mut self, body: &[u8]) {
        let mut ulpdu = vec![0x41, 0x47, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0];
        ulpdu.extend_from_slice(body);
        let mut want = Vec::new();
        fpdu::emit(&[&ulpdu], self.crc, &mut want);
        assert_eq!(hex(&self.out), hex(&want));
        assert_eq!(self.conn.state(), QpState::Error);
        assert!(self.conn.wants_close());
        let mut saw = false;
        while let Some(e) = self.conn.poll_event() {
            if let Event::Terminated { by_peer: false, .. } = e {
                saw = true;
            }
        }
        assert!(saw, "Terminated event");
        // Anything after the error is discarded, nothing more is sent.
        self.feed(&[0u8; 64]);
        assert!(self.out.is_empty());
    }

    fn completions(&mut self) -> Vec<(u64, WcStatus)> {
        let had = self.conn.has_reports();
        let got: Vec<_> = std::iter::from_fn(|| self.conn.poll_completion())
            .map(|w| (w.wr_id, w.status))
            .collect();
        assert!(had || got.is_empty(), "completions unreported: {got:?}");
        got
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn untagged(opcode: Opcode, qn: u32, msn: u32, mo: u32, inv_stag: u32) -> SegmentHeader {
    SegmentHeader {
        opcode,
        last: true,
        placement: Placement::Untagged {
            inv_stag,
            qn,
            msn,
            mo,
        },
    }
}

fn write_hdr(stag: u32, to: u64) -> SegmentHeader {
    SegmentHeader {
        opcode: Opcode::RdmaWrite,
        last: true,
        placement: Placement::Tagged { stag, to },
    }
}

/// Terminate body for DDP/RDMAP errors that attach the segment length and
/// the offending DDP header (M and D set).
fn with_ddp(control: [u8; 2], frame: &[u8], hdr_len: usize) -> Vec<u8> {
    let mut b = vec![control[0], control[1], 0xc0, 0x00];
    b.extend_from_slice(&frame[..2]);
    b.extend_from_slice(&frame[2..2 + hdr_len]);
    b
}

#[test]
fn bad_crc_is_llp_mpa_crc() {
    let mut p = responder(true, 4);
    let r = p.reg.register(p.pd, 0, vec![0; 16], Access::LOCAL_WRITE, 1);
    p.recv(1, r, 16);
    let mut f = p.fpdu(untagged(Opcode::Send, 0, 1, 0, 0), b"abcd");
    let n = f.len();
    f[n - 1] ^= 0xff;
    p.feed(&f);
    // Same bytes siw sends for a CRC error, in the RFC layout.
    p.expect_terminate(&[0x20, 0x02, 0x00, 0x00]);
    assert_eq!(p.completions(), vec![(1, WcStatus::WrFlushError)]);
}

#[test]
fn crc_off_ignores_the_crc_field() {
    let mut p = responder(false, 4);
    let r = p.reg.register(p.pd, 0, vec![0; 4], Access::LOCAL_WRITE, 1);
    p.recv(1, r, 4);
    let mut f = p.fpdu(untagged(Opcode::Send, 0, 1, 0, 0), b"abcd");
    let n = f.len();
    f[n - 1] = 0x5a;
    p.feed(&f);
    assert_eq!(p.completions(), vec![(1, WcStatus::Success)]);
    assert_eq!(p.reg.backing(r).unwrap(), b"abcd");
}

#[test]
fn unknown_opcode_and_versions() {
    for (ctrl, code) in [
        ([0x41u8, 0x48u8], [0x02u8, 0x06u8]), // opcode 8: RDMAP remote op / unexpected opcode
        ([0x42, 0x43], [0x12, 0x06]),         // DDP version 2, untagged
        ([0xc2, 0x40], [0x11, 0x04]),         // DDP version 2, tagged
        ([0x41, 0x83], [0x02, 0x05]),         // RDMAP version 2
        ([0x41, 0x40], [0x02, 0x06]),         // Write in an untagged segment
    ] {
        let mut p = responder(true, 4);
        let mut ulpdu = vec![ctrl[0], ctrl[1]];
        ulpdu.extend_from_slice(&[0; 16]);
        let mut f = Vec::new();
        fpdu::emit(&[&ulpdu], true, &mut f);
        p.feed(&f);
        p.expect_terminate(&[code[0], code[1], 0, 0]);
    }
}

#[test]
fn write_protection_errors() {
    // (what is wrong, expected control bytes): siw codes (`siw_tagged_error`).
    let cases: [(&str, [u8; 2]); 5] = [
        ("unknown stag", [0x11, 0x00]),
        ("wrong key", [0x11, 0x00]),
        ("out of bounds", [0x11, 0x01]),
        ("no access right", [0x11, 0x00]),
        ("other pd", [0x11, 0x02]),
    ];
    for (what, code) in cases {
        let mut p = responder(false, 4);
        let other_pd = p.reg.alloc_pd();
        let target = p
            .reg
            .register(p.pd, 0x1000, vec![0; 64], Access::REMOTE_WRITE, 7);
        let ro = p
            .reg
            .register(p.pd, 0x1000, vec![0; 64], Access::REMOTE_READ, 7);
        let foreign = p
            .reg
            .register(other_pd, 0x1000, vec![0; 64], Access::REMOTE_WRITE, 7);
        let (stag, to) = match what {
            "unknown stag" => (0x7700, 0x1000),
            "wrong key" => (target ^ 1, 0x1000),
            "out of bounds" => (target, 0x1000 + 60),
            "no access right" => (ro, 0x1000),
            _ => (foreign, 0x1000),
        };
        let f = p.fpdu(write_hdr(stag, to), &[0xee; 8]);
        p.feed(&f);
        p.expect_terminate(&with_ddp(code, &f, 14));
        for s in [target, ro, foreign] {
            assert!(p.reg.backing(s).unwrap().iter().all(|&b| b == 0), "{what}");
        }
    }
}

#[test]
fn zero_length_write_needs_no_stag() {
    let mut p = responder(false, 4);
    let f = p.fpdu(write_hdr(1, 0), &[]);
    p.feed(&f);
    assert!(p.out.is_empty());
    assert_eq!(p.conn.state(), QpState::Rts);
}

#[test]
fn untagged_errors() {
    // (label, header fields, posted receive length, expected control, recv status)
    type Case = (
        &'static str,
        u32,
        u32,
        u32,
        Option<u32>,
        [u8; 2],
        Option<WcStatus>,
    );
    let cases: [Case; 8] = [
        (
            "bad qn",
            3,
            1,
            0,
            Some(64),
            [0x12, 0x01],
            Some(WcStatus::WrFlushError),
        ),
        (
            "msn out of range",
            0,
            5,
            0,
            Some(64),
            [0x12, 0x03],
            Some(WcStatus::WrFlushError),
        ),
        (
            "mo wrong",
            0,
            1,
            100,
            Some(64),
            [0x12, 0x04],
            Some(WcStatus::WrFlushError),
        ),
        // siw reports "too long" as 0x02 (no buffer), not 0x05.
        (
            "too long",
            0,
            1,
            0,
            Some(4),
            [0x12, 0x02],
            Some(WcStatus::LocalLengthError),
        ),
        ("no receive", 0, 1, 0, None, [0x12, 0x02], None),
        // With no receive posted, a bad QN, MSN or MO is still reported
        // as itself: siw checks them first (`siw_send_check_ntoh`), "no
        // buffer" only after, at the receive's look-up (`siw_proc_send`).
        ("bad qn, no receive", 3, 1, 0, None, [0x12, 0x01], None),
        (
            "msn out of range, no receive",
            0,
            5,
            0,
            None,
            [0x12, 0x03],
            None,
        ),
        ("mo wrong, no receive", 0, 1, 100, None, [0x12, 0x04], None),
    ];
    for (what, qn, msn, mo, recv, code, status) in cases {
        let mut p = responder(true, 4);
        let r = p.reg.register(p.pd, 0, vec![0; 64], Access::LOCAL_WRITE, 1);
        if let Some(len) = recv {
            p.recv(9, r, len);
        }
        let f = p.fpdu(untagged(Opcode::Send, qn, msn, mo, 0), &[0xab; 8]);
        p.feed(&f);
        p.expect_terminate(&with_ddp(code, &f, 18));
        let wcs = p.completions();
        assert_eq!(
            wcs,
            status.map(|s| vec![(9, s)]).unwrap_or_default(),
            "{what}"
        );
        assert!(p.reg.backing(r).unwrap().iter().all(|&b| b == 0), "{what}");
    }
}

/// A Terminate on another queue than its own (QN 0, the Send queue; RFC
/// 5040 §5.1 puts it on QN 2) is a DDP "invalid QN", as any untagged
/// message on a wrong queue, not the peer's Terminate (helper 68's review:
/// it was taken as one).
#[test]
fn a_terminate_on_the_wrong_queue_is_an_invalid_qn() {
    let mut p = responder(true, 4);
    let f = p.fpdu(
        untagged(Opcode::Terminate, 0, 77, 0, 0),
        &[0x02, 0x02, 0, 0],
    );
    p.feed(&f);
    p.expect_terminate(&with_ddp([0x12, 0x01], &f, 18));
}

#[test]
fn unexpected_read_response() {
    let mut p = responder(false, 4);
    let hdr = SegmentHeader {
        opcode: Opcode::RdmaReadResponse,
        last: true,
        placement: Placement::Tagged { stag: 5, to: 0 },
    };
    let f = p.fpdu(hdr, &[1, 2, 3, 4]);
    p.feed(&f);
    // siw `siw_proc_rresp` without an outstanding Read: DDP catastrophic.
    p.expect_terminate(&with_ddp([0x10, 0x00], &f, 14));
}

fn read_req(p: &Peer, msn: u32, body: ReadRequest) -> Vec<u8> {
    p.fpdu(
        untagged(Opcode::RdmaReadRequest, 1, msn, 0, 0),
        &body.to_bytes(),
    )
}

#[test]
fn read_request_source_errors_attach_rdmap_header() {
    for (what, code) in [
        ("invalid stag", [0x01u8, 0x00u8]),
        ("no access", [0x01, 0x02]),
        ("bounds", [0x01, 0x01]),
    ] {
        let mut p = responder(true, 4);
        let src = p
            .reg
            .register(p.pd, 0x100, vec![5; 32], Access::REMOTE_READ, 3);
        let wo = p
            .reg
            .register(p.pd, 0x100, vec![5; 32], Access::REMOTE_WRITE, 3);
        let (stag, to, size) = match what {
            "invalid stag" => (0x4242, 0x100, 8),
            "no access" => (wo, 0x100, 8),
            _ => (src, 0x100, 33),
        };
        let f = read_req(
            &p,
            1,
            ReadRequest {
                sink_stag: 0x99,
                sink_to: 0,
                size,
                src_stag: stag,
                src_to: to,
            },
        );
        p.feed(&f);
        let mut body = vec![code[0], code[1], 0xe0, 0x00];
        body.extend_from_slice(&f[..2 + 18 + 28]);
        p.expect_terminate(&body);
    }
}

#[test]
fn ird_exceeded_and_read_msn() {
    let mut p = responder(false, 1);
    let src = p.reg.register(p.pd, 0, vec![5; 32], Access::REMOTE_READ, 3);
    let rr = ReadRequest {
        sink_stag: 0x99,
        sink_to: 0,
        size: 8,
        src_stag: src,
        src_to: 0,
    };
    // Two requests arrive before the first can be answered: IRD is 1.
    let mut both = read_req(&p, 1, rr);
    let second = read_req(&p, 2, rr);
    both.extend_from_slice(&second);
    p.conn.handle_input(&both, &mut p.reg);
    p.out.clear();
    p.conn.poll_transmit(&p.reg, &mut p.out, 1 << 16);
    assert_eq!(p.conn.negotiated().unwrap().ird, 1);
    // The error ends the stream: the pending response to the first is
    // dropped with the rest of the queue, only the Terminate goes out.
    p.expect_terminate(&with_ddp([0x02, 0x07], &second, 18));

    let mut p = responder(false, 4);
    let f = read_req(&p, 7, rr);
    p.feed(&f);
    p.expect_terminate(&with_ddp([0x12, 0x03], &f, 18));
}

#[test]
fn send_with_invalidate_failures() {
    for (what, code) in [("unknown", [0x02u8, 0x09u8]), ("other pd", [0x01, 0x09])] {
        let mut p = responder(false, 4);
        let other = p.reg.alloc_pd();
        let foreign = p.reg.register(other, 0, vec![0; 4], Access::ALL, 1);
        let r = p.reg.register(p.pd, 0, vec![0; 4], Access::LOCAL_WRITE, 1);
        p.recv(3, r, 4);
        let stag = if what == "unknown" { 0xabcd00 } else { foreign };
        let f = p.fpdu(untagged(Opcode::SendInvalidate, 0, 1, 0, stag), &[]);
        p.feed(&f);
        p.expect_terminate(&with_ddp(code, &f, 18));
        assert!(p.reg.info(foreign).unwrap().valid);
        assert_eq!(p.completions(), vec![(3, WcStatus::RemoteOperationError)]);
    }
}

#[test]
fn peer_terminate_is_decoded_and_flushes() {
    let mut p = responder(false, 4);
    let r = p.reg.register(p.pd, 0, vec![0; 4], Access::LOCAL_WRITE, 1);
    p.recv(1, r, 4);
    // siw's layout: LLP/MPA/CRC as 02 02 00 00.
    let f = p.fpdu(untagged(Opcode::Terminate, 2, 1, 0, 0), &[0x02, 0x02, 0, 0]);
    p.feed(&f);
    assert!(p.out.is_empty(), "no Terminate answers a Terminate");
    let events: Vec<_> = std::iter::from_fn(|| p.conn.poll_event()).collect();
    assert!(events.contains(&Event::Terminated {
        code: warpsock_proto::wire::terminate::TermCode::MPA_CRC,
        by_peer: true
    }));
    assert_eq!(p.completions(), vec![(1, WcStatus::WrFlushError)]);
    assert_eq!(p.conn.state(), QpState::Error);
}

#[test]
fn malformed_mpa_requests_get_no_reply() {
    let mut bad_key = request(false, 1, 1);
    bad_key[3] = b'_';
    let mut rev3 = request(false, 1, 1);
    rev3[17] = 3;
    let mut big = request(false, 1, 1);
    big[18] = 0x02;
    big[19] = 0x01;
    big.resize(20 + 0x201, 0);
    for (bytes, err) in [
        (bad_key, WireError::BadMpaKey),
        (rev3, WireError::BadMpaRevision(3)),
        (big, WireError::PrivateDataTooLong(513)),
    ] {
        let mut reg: Registry<Vec<u8>> = Registry::new();
        let pd = reg.alloc_pd();
        let mut c = Connection::new(Config::new(Role::Responder, pd), Instant::now());
        c.handle_input(&bytes, &mut reg);
        let mut out = Vec::new();
        c.poll_transmit(&reg, &mut out, 1 << 16);
        assert!(out.is_empty(), "siw closes without a reply");
        assert_eq!(
            c.poll_event(),
            Some(Event::ConnectFailed(ConnectError::Malformed(err)))
        );
        assert!(c.wants_close());
    }
}

#[test]
fn malformed_mpa_reply_gets_terminate() {
    let mut reg: Registry<Vec<u8>> = Registry::new();
    let pd = reg.alloc_pd();
    let mut cfg = Config::new(Role::Initiator, pd);
    cfg.crc = true;
    let mut c = Connection::new(cfg, Instant::now());
    let mut out = Vec::new();
    c.poll_transmit(&reg, &mut out, 1 << 16);
    assert_eq!(out.len(), 24);
    let mut reply = b"MPA ID Rep_Frame".to_vec();
    reply.extend_from_slice(&[0x50, 2, 0, 4, 0, 1, 0, 1]);
    c.handle_input(&reply, &mut reg);
    out.clear();
    c.poll_transmit(&reg, &mut out, 1 << 16);
    let mut ulpdu = vec![0x41, 0x47, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0];
    ulpdu.extend_from_slice(&[0x20, 0x04, 0, 0]);
    let mut want = Vec::new();
    fpdu::emit(&[&ulpdu], true, &mut want);
    assert_eq!(out, want);
    let events: Vec<_> = std::iter::from_fn(|| c.poll_event()).collect();
    assert!(
        events.contains(&Event::ConnectFailed(ConnectError::Malformed(
            WireError::BadMpaKey
        )))
    );
}

#[test]
fn initiator_rejects_unoffered_rtr_and_excess_ord() {
    for (word, code) in [
        // P2P with the Send RTR we never offer.
        ([0xc0u8, 0x01u8, 0x00u8, 0x01u8], [0x20u8, 0x07u8]),
        // Responder ORD 300 > our 128 maximum IRD.
        ([0x00, 0x01, 0x01, 0x2c], [0x20, 0x06]),
    ] {
        let mut reg: Registry<Vec<u8>> = Registry::new();
        let pd = reg.alloc_pd();
        let mut cfg = Config::new(Role::Initiator, pd);
        cfg.p2p = Some(warpsock_proto::RtrOffer {
            write: true,
            read: false,
        });
        let mut c = Connection::new(cfg, Instant::now());
        let mut out = Vec::new();
        c.poll_transmit(&reg, &mut out, 1 << 16);
        assert_eq!(
            &out[20..24],
            &[0x80, 16, 0x80, 16],
            "A bit and write RTR offered"
        );
        let mut reply = b"MPA ID Rep Frame".to_vec();
        reply.extend_from_slice(&[0x10, 2, 0, 4]);
        reply.extend_from_slice(&word);
        c.handle_input(&reply, &mut reg);
        out.clear();
        c.poll_transmit(&reg, &mut out, 1 << 16);
        assert_eq!(&out[20..24], &[code[0], code[1], 0, 0]);
        assert_eq!(c.state(), QpState::Error);
    }
}

#[test]
fn markers_with_a_bad_fpduptr() {
    let mut reg: Registry<Vec<u8>> = Registry::new();
    let pd = reg.alloc_pd();
    let mut cfg = Config::new(Role::Responder, pd);
    cfg.markers = true;
    let mut c = Connection::new(cfg, Instant::now());
    c.handle_input(&request(false, 1, 1), &mut reg);
    c.poll_event();
    c.accept(&[]).unwrap();
    let mut out = Vec::new();
    c.poll_transmit(&reg, &mut out, 1 << 16);
    assert_eq!(out[16], 0x10 | 0x80, "reply asks for markers");
    // First marker must carry FPDUPTR 0; send 4.
    c.handle_input(&[0, 0, 0, 4, 0, 14, 0xc1, 0x40], &mut reg);
    out.clear();
    c.poll_transmit(&reg, &mut out, 1 << 16);
    // Our own transmit has no markers (the peer did not ask for them).
    assert_eq!(&out[..2], &[0, 22]);
    assert_eq!(&out[20..24], &[0x20, 0x03, 0, 0]);
}

#[test]
fn ulpdu_shorter_than_its_header() {
    let mut p = responder(true, 4);
    let mut f = Vec::new();
    fpdu::emit(&[&[0x41, 0x43, 0, 0, 0]], true, &mut f);
    p.feed(&f);
    p.expect_terminate(&[0x10, 0x00, 0x00, 0x00]);
}

/// ULPDUs of 0 and 1 bytes hold not even the control bytes: the bytes
/// after the length field are pad (or the ULPDU's one byte and pad), never
/// parsed as a header (they used to be, giving "invalid DDP/RDMAP
/// version" from pad bytes). Every length short of the header gets the
/// same Terminate.
#[test]
fn ulpdus_of_0_to_17_bytes() {
    for len in 0..=17usize {
        let mut p = responder(true, 4);
        let mut ulpdu = vec![0x41u8, 0x43];
        ulpdu.resize(len.max(2), 0);
        ulpdu.truncate(len);
        let mut f = Vec::new();
        fpdu::emit(&[&ulpdu], true, &mut f);
        p.feed(&f);
        p.expect_terminate(&[0x10, 0x00, 0x00, 0x00]);
    }
}

#[test]
fn read_request_with_payload() {
    let mut p = responder(false, 4);
    let body = [0u8; 28 + 8];
    let f = p.fpdu(untagged(Opcode::RdmaReadRequest, 1, 1, 0, 0), &body);
    p.feed(&f);
    // siw drops such a stream; we say why first (catastrophic, stream).
    p.expect_terminate(&with_ddp([0x02, 0x07], &f, 18));
}

#[test]
fn local_failure_sends_rdmap_local_catastrophic() {
    let mut p = responder(false, 4);
    let r = p.reg.register(p.pd, 0, vec![0; 4], Access::LOCAL_WRITE, 1);
    p.recv(1, r, 4);
    p.conn.fail_local(None, false);
    p.out.clear();
    p.conn.poll_transmit(&p.reg, &mut p.out, 1 << 16);
    p.expect_terminate(&[0x00, 0x00, 0x00, 0x00]);
    assert_eq!(p.completions(), vec![(1, WcStatus::WrFlushError)]);
}

#[test]
fn input_after_close_is_discarded() {
    let mut p = responder(false, 4);
    let r = p.reg.register(p.pd, 0, vec![0; 4], Access::LOCAL_WRITE, 1);
    p.recv(1, r, 4);
    p.conn.close();
    let f = p.fpdu(untagged(Opcode::Send, 0, 1, 0, 0), b"late");
    assert_eq!(p.conn.handle_input(&f, &mut p.reg), f.len());
    assert!(p.reg.backing(r).unwrap().iter().all(|&b| b == 0));
    assert_eq!(p.completions(), vec![(1, WcStatus::WrFlushError)]);
}

#[test]
fn accept_with_replaces_the_responder_options() {
    let mut reg: Registry<Vec<u8>> = Registry::new();
    let pd = reg.alloc_pd();
    let mut c = Connection::new(Config::new(Role::Responder, pd), Instant::now());
    c.handle_input(&request(false, 4, 4), &mut reg);
    assert!(matches!(c.poll_event(), Some(Event::ConnectRequest(_))));
    let mut cfg = Config::new(Role::Initiator, pd);
    cfg.crc = true;
    cfg.ird = 2;
    c.accept_with(cfg, b"ok").unwrap();
    let n = c.negotiated().unwrap();
    assert!(n.crc);
    assert_eq!(n.ird, 4, "max(own 2, peer ORD 4)");
    assert_eq!(c.config().role, Role::Responder);
    let mut out = Vec::new();
    c.poll_transmit(&reg, &mut out, 1 << 16);
    assert_eq!(out[16], 0x50, "reply carries C");
    assert_eq!(&out[out.len() - 2..], b"ok");
}

/// siw's `20 06 00 00` is RDMAP/remote operation/unexpected opcode in its
/// little-endian layout, but MPA/insufficient IRD in the RFC layout: only an
/// initiator's first FPDU can be the latter.
#[test]
fn ambiguous_siw_terminate_decoded_by_context() {
    use warpsock_proto::wire::terminate::TermCode;
    for (after_traffic, want) in [
        (true, TermCode::RDMAP_UNEXPECTED_OPCODE),
        (false, TermCode::MPA_INSUFFICIENT_IRD),
    ] {
        let mut p = responder(false, 4);
        if after_traffic {
            let f = p.fpdu(write_hdr(1, 0), &[]);
            p.feed(&f);
        }
        let f = p.fpdu(untagged(Opcode::Terminate, 2, 1, 0, 0), &[0x20, 0x06, 0, 0]);
        p.feed(&f);
        let events: Vec<_> = std::iter::from_fn(|| p.conn.poll_event()).collect();
        assert!(
            events.contains(&Event::Terminated {
                code: want,
                by_peer: true
            }),
            "{events:?}"
        );
    }
    // An initiator whose very first received FPDU is siw's Terminate (siw
    // rejected the initiator's first message): RDMAP, not MPA.
    let mut reg: Registry<Vec<u8>> = Registry::new();
    let pd = reg.alloc_pd();
    let mut c = Connection::new(Config::new(Role::Initiator, pd), Instant::now());
    let mut reply = b"MPA ID Rep Frame".to_vec();
    reply.extend_from_slice(&[0x10, 2, 0, 4, 0, 1, 0, 1]);
    let mut term = Vec::new();
    let hdr = untagged(Opcode::Terminate, 2, 1, 0, 0);
    fpdu::emit(
        &[&hdr.to_bytes()[..18], &[0x20, 0x06, 0, 0]],
        false,
        &mut term,
    );
    reply.extend_from_slice(&term);
    c.handle_input(&reply, &mut reg);
    let events: Vec<_> = std::iter::from_fn(|| c.poll_event()).collect();
    assert!(events.contains(&Event::Terminated {
        code: TermCode::RDMAP_UNEXPECTED_OPCODE,
        by_peer: true
    }));
}
