//! MPA connection setup (RFC 5044 §7.1, RFC 6581), as siw does it
//! (`siw_cm.c`: `siw_send_mpareqrep`, `siw_proc_mpareq`, `siw_proc_mpareply`,
//! `siw_accept`).

use warpsock_wire::ddp::{self, Opcode, Placement, SegmentHeader};
use warpsock_wire::mpa::{self, EnhancedParams, Flags, FrameKind, RequestReply};
use warpsock_wire::terminate::{TermCode, Terminate, TerminateControl};
use warpsock_wire::WireError;

use super::{
    CmState, ConnectError, ConnectRequest, Connection, Event, Negotiated, OrqEntry, QpState,
    RtrType,
};

/// Why [`Connection::accept`] or [`Connection::reject`] refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AcceptError {
    /// No MPA Request is waiting for a decision.
    NoRequest,
    /// Private data plus the enhanced word exceeds 512 bytes.
    PrivateDataTooLong,
}

impl std::fmt::Display for AcceptError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::NoRequest => "no MPA request is waiting for accept/reject",
            Self::PrivateDataTooLong => "private data exceeds the MPA limit of 512 bytes",
        })
    }
}

impl std::error::Error for AcceptError {}

/// Headers attached to a Terminate we send.
pub(super) enum Attach<'a> {
    /// Nothing (LLP errors, version/opcode errors, catastrophic errors).
    Nothing,
    /// The offending segment's length and DDP header (M and D set).
    Ddp { segment_len: u16, header: &'a [u8] },
    /// Also the Read Request body (M, D and R set).
    DdpRdmap {
        segment_len: u16,
        header: &'a [u8],
        rdmap: &'a [u8],
    },
}

impl Connection {
    /// Initiator: queue the MPA Request.
    pub(super) fn queue_mpa_request(&mut self) {
        let mut flags = Flags::default()
            .with(Flags::MARKERS, self.cfg.markers)
            .with(Flags::CRC, self.cfg.crc);
        let mut pd = Vec::with_capacity(4 + self.cfg.private_data.len());
        if self.cfg.mpa_revision >= 2 {
            flags = flags.with(Flags::ENHANCED, true);
            let offer = self.cfg.p2p.filter(|o| o.write || o.read);
            let word = EnhancedParams {
                ird: self.cfg.ird,
                ord: self.cfg.ord,
                peer_to_peer: offer.is_some(),
                send_rtr: false,
                write_rtr: offer.is_some_and(|o| o.write),
                read_rtr: offer.is_some_and(|o| o.read),
            };
            pd.extend_from_slice(&word.to_bytes());
        }
        let room = mpa::MAX_PRIVATE_DATA_LEN - pd.len();
        let ulp = &self.cfg.private_data[..self.cfg.private_data.len().min(room)];
        pd.extend_from_slice(ulp);
        RequestReply {
            kind: FrameKind::Request,
            flags,
            revision: self.cfg.mpa_revision.min(mpa::MAX_REVISION),
            private_data: &pd,
        }
        .emit(&mut self.tx.control);
        self.inline_changed();
    }

    /// A complete MPA frame arrived (`frame` holds exactly it).
    pub(super) fn on_mpa_frame(&mut self, frame: &[u8]) {
        match self.cm {
            CmState::AwaitRequest => self.on_request(frame),
            CmState::AwaitReply => self.on_reply(frame),
            _ => {}
        }
    }

    fn on_request(&mut self, frame: &[u8]) {
        // siw (`siw_proc_mpareq`) closes without a reply on any bad Request.
        let req = match RequestReply::parse(frame, FrameKind::Request) {
            Ok(r) => r,
            Err(e) => return self.fail_setup(ConnectError::Malformed(e)),
        };
        let request = ConnectRequest {
            revision: req.revision,
            crc: req.flags.crc(),
            markers: req.flags.markers(),
            params: req.enhanced_params(),
            private_data: req.ulp_private_data().to_vec(),
        };
        self.peer_request = Some(request.clone());
        self.cm = CmState::AwaitAccept;
        self.events.push_back(Event::ConnectRequest(request));
    }

    /// Responder: accepts the pending MPA Request, sending a Reply with
    /// `private_data` (≤ 508 bytes; ≤ 251 for siw peers).
    ///
    /// Negotiation (siw `siw_accept` with relaxed IRD/ORD): CRC if either
    /// side asked; markers per direction; our ORD = min(ours, peer IRD), our
    /// IRD = max(ours, peer ORD) capped at `max_ird` (and `max_ird_ord`); for a
    /// peer-to-peer request, the Write RTR if offered, else the Read RTR.
    pub fn accept(&mut self, private_data: &[u8]) -> Result<(), AcceptError> {
        let req = match (&self.cm, self.peer_request.take()) {
            (CmState::AwaitAccept, Some(r)) => r,
            (_, r) => {
                self.peer_request = r;
                return Err(AcceptError::NoRequest);
            }
        };
        let enhanced = req.params.is_some();
        if private_data.len() + if enhanced { 4 } else { 0 } > mpa::MAX_PRIVATE_DATA_LEN {
            self.peer_request = Some(req);
            return Err(AcceptError::PrivateDataTooLong);
        }
        let crc = req.crc || self.cfg.crc;
        let mut flags = Flags::default()
            .with(Flags::CRC, crc)
            .with(Flags::MARKERS, self.cfg.markers);
        let (mut ird, mut ord) = (self.cfg.ird, self.cfg.ord);
        let mut rtr = None;
        let mut pd = Vec::with_capacity(4 + private_data.len());
        if let Some(p) = req.params {
            flags = flags.with(Flags::ENHANCED, true);
            let max = self.cfg.max_ird.min(self.cfg.max_ird_ord);
            ord = ord.min(p.ird);
            ird = ird.max(p.ord).min(max);
            let mut word = EnhancedParams {
                ird,
                ord,
                ..Default::default()
            };
            if p.peer_to_peer {
                word.peer_to_peer = true;
                let read_first = self.cfg.prefer_read_rtr && p.read_rtr;
                rtr = Some(if p.write_rtr && !read_first {
                    word.write_rtr = true;
                    RtrType::Write
                } else if p.read_rtr {
                    word.read_rtr = true;
                    RtrType::Read
                } else {
                    word.send_rtr = true;
                    RtrType::Send
                });
            }
            pd.extend_from_slice(&word.to_bytes());
        }
        pd.extend_from_slice(private_data);
        RequestReply {
            kind: FrameKind::Reply,
            flags,
            revision: req.revision,
            private_data: &pd,
        }
        .emit(&mut self.tx.control);
        self.inline_changed();
        let neg = Negotiated {
            revision: req.revision,
            crc,
            markers_tx: req.markers,
            markers_rx: self.cfg.markers,
            ird,
            ord,
            rtr,
            peer_private_data: req.private_data,
        };
        self.enter_fpdu(neg);
        self.deadline = None;
        // Without P2P the application may post at once (the responder's own
        // sends still wait for the initiator's first FPDU); with P2P siw
        // reports ESTABLISHED only after the RTR arrives, and so do we.
        if rtr.is_none() {
            self.announce_established();
        }
        Ok(())
    }

    /// Responder: like [`Self::accept`], but first replaces the
    /// configuration the connection was created with (CRC, markers,
    /// IRD/ORD, FPDU size, queue depths, protection domain), so the
    /// application can choose its options after seeing the Request.
    pub fn accept_with(
        &mut self,
        cfg: super::Config,
        private_data: &[u8],
    ) -> Result<(), AcceptError> {
        if self.cm != CmState::AwaitAccept {
            return Err(AcceptError::NoRequest);
        }
        self.cfg = super::Config {
            role: super::Role::Responder,
            ..cfg
        };
        // The posted queue grows to the new depth, whole (its full case
        // is the steady state's cheap rotation).
        self.rq.set_limit(self.cfg.rq_depth);
        self.accept(private_data)
    }

    /// Responder: rejects the pending MPA Request (Reply with R set) and
    /// closes.
    pub fn reject(&mut self, private_data: &[u8]) -> Result<(), AcceptError> {
        let req = match (&self.cm, self.peer_request.take()) {
            (CmState::AwaitAccept, Some(r)) => r,
            (_, r) => {
                self.peer_request = r;
                return Err(AcceptError::NoRequest);
            }
        };
        let mut pd = Vec::new();
        let mut flags = Flags(Flags::REJECT);
        if req.params.is_some() {
            flags = flags.with(Flags::ENHANCED, true);
            pd.extend_from_slice(&[0; 4]);
        }
        if pd.len() + private_data.len() > mpa::MAX_PRIVATE_DATA_LEN {
            self.peer_request = Some(req);
            return Err(AcceptError::PrivateDataTooLong);
        }
        pd.extend_from_slice(private_data);
        RequestReply {
            kind: FrameKind::Reply,
            flags,
            revision: req.revision,
            private_data: &pd,
        }
        .emit(&mut self.tx.control);
        self.inline_changed();
        self.cm = CmState::Done;
        self.deadline = None;
        self.close();
        Ok(())
    }

    fn on_reply(&mut self, frame: &[u8]) {
        let rep = match RequestReply::parse(frame, FrameKind::Reply) {
            Ok(r) => r,
            Err(e) => {
                // siw answers a bad Reply with Terminate LLP/MPA/0x04.
                self.enter_fpdu(self.provisional_negotiation(false));
                self.send_terminate(TermCode::MPA_INVALID_REQ_REP, Attach::Nothing);
                self.cm = CmState::Done;
                self.events
                    .push_back(Event::ConnectFailed(ConnectError::Malformed(e)));
                return;
            }
        };
        if rep.flags.reject() {
            self.cm = CmState::Done;
            self.events
                .push_back(Event::Rejected(rep.ulp_private_data().to_vec()));
            self.deadline = None;
            self.enter_error();
            self.close_after_flush = true;
            return;
        }
        let mut neg = self.provisional_negotiation(rep.flags.crc());
        neg.markers_tx = rep.flags.markers();
        neg.peer_private_data = rep.ulp_private_data().to_vec();
        neg.revision = rep.revision;
        let mut failure = None;
        if let Some(p) = rep.enhanced_params() {
            neg.ord = self.cfg.ord.min(p.ird);
            let max_ird = self.cfg.max_ird.min(self.cfg.max_ird_ord);
            if p.ord > max_ird {
                failure = Some(TermCode::MPA_INSUFFICIENT_IRD);
            }
            neg.ird = self.cfg.ird.max(p.ord).min(max_ird);
            let offer = self.cfg.p2p.filter(|o| o.write || o.read);
            if let Some(o) = offer {
                if p.peer_to_peer {
                    neg.rtr = if p.write_rtr && o.write {
                        Some(RtrType::Write)
                    } else if p.read_rtr && o.read {
                        Some(RtrType::Read)
                    } else {
                        failure = failure.or(Some(TermCode::MPA_NO_MATCHING_RTR));
                        None
                    };
                }
            }
        }
        self.deadline = None;
        self.enter_fpdu(neg);
        if let Some(code) = failure {
            self.send_terminate(code, Attach::Nothing);
            self.cm = CmState::Done;
            self.events
                .push_back(Event::ConnectFailed(ConnectError::Incompatible(code)));
            return;
        }
        if let Some(rtr) = self.neg.as_ref().and_then(|n| n.rtr) {
            self.tx.rtr = Some(rtr);
            self.inline_changed();
            if rtr == RtrType::Read {
                // siw's RTR Read: sink STag 0 / TO 0, source STag 1 / TO 0.
                self.orq.push_back(OrqEntry {
                    seq: None,
                    sink_stag: 0,
                    sink_to: 0,
                    size: 0,
                    received: 0,
                    sink: None,
                });
            }
        }
        self.announce_established();
    }

    /// Negotiation result before (or without) a valid Reply.
    fn provisional_negotiation(&self, peer_crc: bool) -> Negotiated {
        Negotiated {
            revision: self.cfg.mpa_revision,
            crc: self.cfg.crc || peer_crc,
            markers_tx: false,
            markers_rx: self.cfg.markers,
            ird: self.cfg.ird,
            ord: self.cfg.ord,
            rtr: None,
            peer_private_data: Vec::new(),
        }
    }

    fn enter_fpdu(&mut self, neg: Negotiated) {
        self.cm = CmState::Fpdu;
        self.qp = QpState::Rts;
        let await_rtr = self.cfg.role == super::Role::Responder && neg.rtr.is_some();
        self.rx.begin_fpdu_phase(neg.crc, neg.markers_rx, await_rtr);
        self.tx.begin_fpdu_phase(neg.crc, neg.markers_tx);
        self.neg = Some(neg);
        self.inline_changed();
    }

    pub(super) fn announce_established(&mut self) {
        if let Some(n) = &self.neg {
            self.events.push_back(Event::Established(n.clone()));
        }
    }

    /// Queues a Terminate (untagged, QN 2, MSN 1, MO 0, RFC layout), moves
    /// the QP to Terminate→Error flushing everything, and asks the engine
    /// to close once it is sent.
    pub(super) fn send_terminate(&mut self, code: TermCode, attach: Attach<'_>) {
        if self.tx.terminate.is_some() || self.close_after_flush {
            return;
        }
        let hdr = SegmentHeader {
            opcode: Opcode::Terminate,
            last: true,
            placement: Placement::Untagged {
                inv_stag: 0,
                qn: ddp::queue::TERMINATE,
                msn: 1,
                mo: 0,
            },
        };
        let mut ulpdu = Vec::with_capacity(ddp::UNTAGGED_HDR_LEN + 4 + 2 + 18 + 28);
        hdr.emit(&mut ulpdu);
        let control = TerminateControl {
            code,
            m: false,
            d: false,
            r: false,
        };
        let body = match attach {
            Attach::Nothing => Terminate {
                control,
                segment_len: None,
                ddp_header: &[],
                rdmap_header: &[],
            },
            Attach::Ddp {
                segment_len,
                header,
            } => Terminate {
                control,
                segment_len: Some(segment_len),
                ddp_header: header,
                rdmap_header: &[],
            },
            Attach::DdpRdmap {
                segment_len,
                header,
                rdmap,
            } => Terminate {
                control,
                segment_len: Some(segment_len),
                ddp_header: header,
                rdmap_header: rdmap,
            },
        };
        body.emit(&mut ulpdu);
        self.tx.terminate = Some(ulpdu);
        self.note_close(super::CloseReason::Terminated {
            code,
            by_peer: false,
        });
        self.events.push_back(Event::Terminated {
            code,
            by_peer: false,
        });
        self.enter_error();
        self.qp = QpState::Terminate;
        self.close_after_flush = true;
        self.inline_changed();
    }

    /// Maps a header parse error to the Terminate RFC 5040/5041 and siw
    /// (`siw_get_hdr`) prescribe. Version and opcode errors attach nothing.
    pub(super) fn terminate_for_wire_error(&mut self, e: WireError) {
        let code = match e {
            WireError::BadDdpVersion { tagged: true, .. } => TermCode::DDP_TAGGED_INVALID_VERSION,
            WireError::BadDdpVersion { tagged: false, .. } => {
                TermCode::DDP_UNTAGGED_INVALID_VERSION
            }
            WireError::BadRdmapVersion(_) => TermCode::RDMAP_INVALID_VERSION,
            WireError::UnknownOpcode(_) | WireError::OpcodeModelMismatch { .. } => {
                TermCode::RDMAP_UNEXPECTED_OPCODE
            }
            // A ULPDU too short for its own header: the stream is no
            // longer DDP.
            _ => TermCode::DDP_LOCAL_CATASTROPHIC,
        };
        self.send_terminate(code, Attach::Nothing);
    }
}
