//! The front of an FPDU: its MPA length field and DDP/RDMAP header (and a
//! Read Request's body), encoded in one place for every message an FPDU
//! carries (RFC 5044 §6.1, RFC 5041 §4, RFC 5040 §4).

use warpsock_wire::ddp::{self, Opcode, Placement, ReadRequest, SegmentHeader};
use warpsock_wire::fpdu;

use super::MsgKind;

/// The front of an FPDU: its MPA length field and DDP/RDMAP header (and
/// a Read Request's body), encoded in one place for every message an
/// FPDU carries (RFC 5044 §6.1, RFC 5041 §4, RFC 5040 §4).
pub(super) struct Head {
    hdr: SegmentHeader,
    /// A Read Request's body.
    body: Option<ReadRequest>,
    /// The ULPDU length the length field gives (header, body, payload).
    pub(super) ulpdu_len: usize,
}

/// Room for the longest [`Head`]: the length field, an untagged header
/// and a Read Request's body.
pub(super) const HEAD_MAX: usize = 2 + ddp::MAX_HDR_LEN + ddp::READ_REQUEST_LEN;

impl Head {
    /// The head of the FPDU of `kind` carrying `take` payload bytes from
    /// message offset `sent` (`last`: it ends the message).
    pub(super) fn new(kind: MsgKind, sent: u64, take: usize, last: bool) -> Self {
        let (opcode, placement) = match kind {
            MsgKind::Send {
                opcode,
                msn,
                inv_stag,
            } => (
                opcode,
                Placement::Untagged {
                    inv_stag,
                    qn: ddp::queue::SEND,
                    msn,
                    mo: sent as u32,
                },
            ),
            MsgKind::Write { stag, to } => (
                Opcode::RdmaWrite,
                Placement::Tagged {
                    stag,
                    to: to.wrapping_add(sent),
                },
            ),
            MsgKind::ReadResponse { stag, to } => (
                Opcode::RdmaReadResponse,
                Placement::Tagged {
                    stag,
                    to: to.wrapping_add(sent),
                },
            ),
            MsgKind::ReadRequest { msn, .. } => (
                Opcode::RdmaReadRequest,
                Placement::Untagged {
                    inv_stag: 0,
                    qn: ddp::queue::READ_REQUEST,
                    msn,
                    mo: 0,
                },
            ),
        };
        let hdr = SegmentHeader {
            opcode,
            last,
            placement,
        };
        let body = match kind {
            MsgKind::ReadRequest { body, .. } => Some(body),
            _ => None,
        };
        Self {
            hdr,
            body,
            ulpdu_len: hdr.len() + body.map_or(0, |_| ddp::READ_REQUEST_LEN) + take,
        }
    }

    pub(super) fn opcode(&self) -> Opcode {
        self.hdr.opcode
    }

    /// Its length in bytes: the length field, the header, the body.
    pub(super) fn len(&self) -> usize {
        2 + self.hdr.len() + self.body.map_or(0, |_| ddp::READ_REQUEST_LEN)
    }

    /// The payload bytes the FPDU carries after it.
    pub(super) fn payload_len(&self) -> usize {
        self.ulpdu_len + 2 - self.len()
    }

    /// Encodes it into the first [`Self::len`] bytes of `out`: the one
    /// encoder of every FPDU's front, whether built in place
    /// ([`TxState::small_fpdu`]) or piece by piece ([`Self::bytes`]).
    /// Always inlined: its callers build the head in the same frame, so
    /// the kind is known there (an inline Send's: untagged, no body) and
    /// the tests of the other kinds fold away; as a call it was ~34
    /// instructions a send (its frame, the header built through memory;
    /// issue 12).
    #[inline(always)]
    pub(super) fn write(&self, out: &mut [u8]) {
        out[..2].copy_from_slice(&fpdu::len_field(self.ulpdu_len));
        let h = self.hdr.to_bytes();
        // Copies of a constant length, one per header kind (no `memcpy`
        // call for a few bytes).
        if self.hdr.is_tagged() {
            out[2..2 + ddp::TAGGED_HDR_LEN].copy_from_slice(&h[..ddp::TAGGED_HDR_LEN]);
            return;
        }
        out[2..2 + ddp::UNTAGGED_HDR_LEN].copy_from_slice(&h);
        if let Some(b) = self.body {
            const AT: usize = 2 + ddp::UNTAGGED_HDR_LEN;
            out[AT..AT + ddp::READ_REQUEST_LEN].copy_from_slice(&b.to_bytes());
        }
    }

    /// Its bytes, in the first [`Self::len`] of the array.
    pub(super) fn bytes(&self) -> [u8; HEAD_MAX] {
        let mut b = [0u8; HEAD_MAX];
        self.write(&mut b);
        b
    }
}

/// `dst.copy_from_slice(src)` (equal lengths), with two loads and stores
/// of a constant width instead of a `memcpy` call for 4 to 16 bytes (an
/// inline Send's 8-byte message header and payload: ~12 instructions and a
/// call each, issue 12): the two copies overlap when the length is not
/// the width's double.
#[inline(always)]
pub(super) fn copy_short(dst: &mut [u8], src: &[u8]) {
    let n = src.len();
    debug_assert_eq!(dst.len(), n);
    if (8..=16).contains(&n) {
        dst[..8].copy_from_slice(&src[..8]);
        dst[n - 8..n].copy_from_slice(&src[n - 8..]);
    } else if (4..8).contains(&n) {
        dst[..4].copy_from_slice(&src[..4]);
        dst[n - 4..n].copy_from_slice(&src[n - 4..]);
    } else {
        dst.copy_from_slice(src);
    }
}
