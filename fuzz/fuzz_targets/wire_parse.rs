//! Every wire parser on arbitrary bytes: none may panic, and what parses
//! must re-encode to the bytes it came from.
#![no_main]

use libfuzzer_sys::fuzz_target;
use warpsock_proto::wire::{ddp, fpdu, mpa, terminate};

fuzz_target!(|data: &[u8]| {
    for kind in [mpa::FrameKind::Request, mpa::FrameKind::Reply] {
        if let Ok(rr) = mpa::RequestReply::parse(data, kind) {
            assert_eq!(mpa::frame_len(data), Some(rr.buffer_len()));
            let _ = (rr.enhanced_params(), rr.ulp_private_data());
            let mut out = Vec::new();
            rr.emit(&mut out);
            assert_eq!(&out[..], &data[..rr.buffer_len()]);
        }
    }

    if let Some((ulpdu, total)) = fpdu::peek_len(data) {
        assert!(total >= ulpdu + fpdu::OVERHEAD && total % 4 == 0);
        if let Some(frame) = data.get(..total) {
            let _ = fpdu::check_crc(frame);
        }
    }

    for at in [0, fpdu::LEN_FIELD] {
        let Some(ulpdu) = data.get(at..) else {
            continue;
        };
        if let Ok(h) = ddp::SegmentHeader::parse(ulpdu) {
            assert!(h.len() <= ulpdu.len());
            let bytes = h.to_bytes();
            assert_eq!(ddp::SegmentHeader::parse(&bytes[..h.len()]), Ok(h));
            if let Some(body) = ulpdu.get(h.len()..) {
                let _ = ddp::ReadRequest::parse(body);
                let _ = terminate::Terminate::parse(body);
            }
        }
    }

    if let Ok(rr) = ddp::ReadRequest::parse(data) {
        assert_eq!(&rr.to_bytes()[..], &data[..ddp::READ_REQUEST_LEN]);
    }

    if let Ok((t, _layout)) = terminate::Terminate::parse(data) {
        let _ = (t.control.code.description(), t.control.code.layer());
        let mut out = Vec::new();
        t.emit(&mut out);
        assert!(out.len() <= data.len());
    }
});
