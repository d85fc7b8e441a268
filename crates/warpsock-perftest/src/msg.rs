//! perftest's control messages, byte for byte as perftest 6.06 (Debian's
//! `perftest 4.5-0.17`) sends them over its rdma_cm control connection.
//!
//! Every message is one RDMAP Send; both sides send their copy and then
//! wait for the peer's (the client sends first, the server answers after it
//! has re-posted its receive), so the exchange is a strict lock-step.

/// perftest's version string as it is exchanged (`char[16]`, NUL padded).
pub const VERSION: &str = "6.06";
/// Length of the version message.
pub const VERSION_LEN: usize = 16;
/// `struct pingpong_dest` on the wire (perftest built with `HAVE_ENDIAN`:
/// every integer big-endian, C padding bytes included).
pub const DEST_LEN: usize = 56;
/// One bandwidth report field (`u64` or `double`, big-endian).
pub const REPORT_FIELD_LEN: usize = 8;
/// `IBV_MTU_1024`, what siw reports, exchanged as the text `"3"` + NUL.
pub const MTU_MSG: [u8; 2] = *b"3\0";

/// The version message: [`VERSION`] NUL-padded to [`VERSION_LEN`] bytes.
pub fn version_msg() -> [u8; VERSION_LEN] {
    let mut m = [0u8; VERSION_LEN];
    m[..VERSION.len()].copy_from_slice(VERSION.as_bytes());
    m
}

/// The text of a version message (up to its first NUL).
pub fn version_text(m: &[u8]) -> String {
    let end = m.iter().position(|&b| b == 0).unwrap_or(m.len());
    String::from_utf8_lossy(&m[..end]).into_owned()
}

/// perftest's `struct pingpong_dest`: what each side tells the other
/// about its queue pair and its remotely accessible buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Dest {
    /// LID (0 on iWARP).
    pub lid: u32,
    /// Outstanding RDMA Reads the side allows (`-o`, 128 for read tests on siw).
    pub out_reads: u32,
    /// Queue pair number.
    pub qpn: u32,
    /// Packet sequence number (random, meaningless on iWARP).
    pub psn: u32,
    /// STag of the buffer the peer may access.
    pub rkey: u32,
    /// Address of that buffer.
    pub vaddr: u64,
    /// GID (siw: the MAC address in the first bytes).
    pub gid: [u8; 16],
    /// SRQ number.
    pub srqn: u32,
    /// GID index.
    pub gid_index: u32,
}

impl Dest {
    /// Encodes as perftest does (offsets: lid 0, out_reads 4, qpn 8, psn 12,
    /// rkey 16, padding 20, vaddr 24, gid 32, srqn 48, gid_index 52).
    pub fn encode(&self) -> [u8; DEST_LEN] {
        let mut b = [0u8; DEST_LEN];
        b[0..4].copy_from_slice(&self.lid.to_be_bytes());
        b[4..8].copy_from_slice(&self.out_reads.to_be_bytes());
        b[8..12].copy_from_slice(&self.qpn.to_be_bytes());
        b[12..16].copy_from_slice(&self.psn.to_be_bytes());
        b[16..20].copy_from_slice(&self.rkey.to_be_bytes());
        b[24..32].copy_from_slice(&self.vaddr.to_be_bytes());
        b[32..48].copy_from_slice(&self.gid);
        b[48..52].copy_from_slice(&self.srqn.to_be_bytes());
        b[52..56].copy_from_slice(&self.gid_index.to_be_bytes());
        b
    }

    /// Decodes a [`DEST_LEN`]-byte message; `None` for any other length.
    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != DEST_LEN {
            return None;
        }
        let u32_at = |o: usize| u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[32..48]);
        let mut va = [0u8; 8];
        va.copy_from_slice(&b[24..32]);
        Some(Self {
            lid: u32_at(0),
            out_reads: u32_at(4),
            qpn: u32_at(8),
            psn: u32_at(12),
            rkey: u32_at(16),
            vaddr: u64::from_be_bytes(va),
            gid,
            srqn: u32_at(48),
            gid_index: u32_at(52),
        })
    }
}

/// The client's bandwidth report (`xchg_bw_reports`), five big-endian
/// 8-byte fields sent one message each: size, iterations, peak MB/s,
/// average MB/s, message rate (Mpps). The server prints these for Write and
/// Read tests.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BwReport {
    /// Message size in bytes.
    pub size: u64,
    /// Iterations.
    pub iters: u64,
    /// Peak bandwidth, MB/s (MB = 2^20 bytes, as perftest).
    pub bw_peak: f64,
    /// Average bandwidth, MB/s.
    pub bw_avg: f64,
    /// Message rate, millions of messages per second.
    pub msg_rate: f64,
}

impl BwReport {
    /// The five messages, in order.
    pub fn messages(&self) -> [[u8; REPORT_FIELD_LEN]; 5] {
        [
            self.size.to_be_bytes(),
            self.iters.to_be_bytes(),
            self.bw_peak.to_bits().to_be_bytes(),
            self.bw_avg.to_bits().to_be_bytes(),
            self.msg_rate.to_bits().to_be_bytes(),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The server's `pingpong_dest` of an ib_read_bw run, as captured.
    #[test]
    fn dest_matches_capture() {
        let hex = "00000000000000800000000400afd8373b580700000000000000\
                   7fee440c5000525400123456000000000000000000000000000000000000";
        let hex: String = hex.chars().filter(|c| !c.is_whitespace()).collect();
        let b: Vec<u8> = (0..hex.len() / 2)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
            .collect();
        let d = Dest::decode(&b).unwrap();
        assert_eq!(d.out_reads, 128);
        assert_eq!(d.qpn, 4);
        assert_eq!(d.psn, 0xafd837);
        assert_eq!(d.rkey, 0x3b58_0700);
        assert_eq!(d.vaddr, 0x7fee_440c_5000);
        assert_eq!(&d.gid[..6], &[0x52, 0x54, 0, 0x12, 0x34, 0x56]);
        let mut again = d.encode();
        again[20..24].copy_from_slice(&b[20..24]);
        assert_eq!(&again[..], &b[..]);
    }

    #[test]
    fn report_fields_are_big_endian() {
        let r = BwReport {
            size: 65536,
            iters: 20,
            bw_peak: 3.08,
            bw_avg: 1.43,
            msg_rate: 0.0,
        };
        let m = r.messages();
        assert_eq!(m[0], [0, 0, 0, 0, 0, 1, 0, 0]);
        assert_eq!(m[1], [0, 0, 0, 0, 0, 0, 0, 0x14]);
        assert_eq!(m[2][..2], [0x40, 0x08]);
        assert_eq!(version_text(&version_msg()), "6.06");
    }
}
