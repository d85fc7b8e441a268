//! Message contents and their verification.
//!
//! Every message body is a fixed byte pattern (byte `i` is
//! `i * 31 + 7` mod 256) with the message's sequence number stamped
//! little-endian into its first 8 bytes and, for messages of 16 bytes or
//! more, into its last 8 bytes. Receivers check both stamps of every
//! message (a message that was not placed, placed twice, cut short or
//! reordered fails); with `--verify` they also check every pattern byte.
//! Messages shorter than 8 bytes carry the low bytes of the number.
//!
//! Messages of [`GATHER_MIN`] bytes or more are not stored whole: each one
//! is its own 16-byte stamp slot (head and tail stamp) around one body
//! shared by every message of a connection, sent with a gather list and
//! received with a scatter list. So a window of 1 MiB messages touches
//! 1 MiB of memory plus a few stamps, as a TCP program that reuses one
//! buffer does, instead of a megabyte per message in flight.

/// Pattern byte at offset `i` of a message.
fn pat(i: usize) -> u8 {
    (i as u8).wrapping_mul(31).wrapping_add(7)
}

/// Fills `buf` with the pattern (stamps are written separately). The
/// pattern repeats every 256 bytes, so the rest is copied in doubling
/// blocks.
pub(crate) fn fill(buf: &mut [u8]) {
    let head = buf.len().min(256);
    for (i, b) in buf[..head].iter_mut().enumerate() {
        *b = pat(i);
    }
    let mut done = head;
    while done < buf.len() {
        let n = done.min(buf.len() - done);
        buf.copy_within(..n, done);
        done += n;
    }
}

/// Messages this long or longer are gathered from stamps + a shared body.
pub(crate) const GATHER_MIN: usize = 4096;

/// Whether `size`-byte messages are built from stamps + a shared body.
pub(crate) fn gathered(size: usize) -> bool {
    size >= GATHER_MIN
}

/// Whether `b` holds the pattern as it sits at offset `from` of a message.
pub(crate) fn check_pattern(b: &[u8], from: usize) -> bool {
    b.iter().enumerate().all(|(i, &v)| v == pat(i + from))
}

/// Where the stamps of a `len`-byte message sit: (offset, length) of the
/// head stamp and, if any, the tail stamp.
pub(crate) fn stamp_spots(len: usize) -> [(usize, usize); 2] {
    let head = (0, len.min(8));
    let tail = if len >= 16 { (len - 8, 8) } else { (0, 0) };
    [head, tail]
}

/// Writes `seq` into the stamp positions of `msg` (the whole message).
pub(crate) fn stamp(msg: &mut [u8], seq: u64) {
    let b = seq.to_le_bytes();
    for (off, n) in stamp_spots(msg.len()) {
        msg[off..off + n].copy_from_slice(&b[..n]);
    }
}

/// Whether `msg` carries `seq` in its stamps and (if `full`) the pattern
/// everywhere else.
pub(crate) fn check(msg: &[u8], seq: u64, full: bool) -> bool {
    let b = seq.to_le_bytes();
    let spots = stamp_spots(msg.len());
    if !spots.iter().all(|&(off, n)| msg[off..off + n] == b[..n]) {
        return false;
    }
    if !full {
        return true;
    }
    let body_end = if spots[1].1 > 0 {
        spots[1].0
    } else {
        msg.len()
    };
    check_pattern(&msg[spots[0].1..body_end], spots[0].1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_and_pattern() {
        let mut big = vec![0; 100_000];
        fill(&mut big);
        assert!(check_pattern(&big, 0));
        for len in [1, 7, 8, 9, 15, 16, 17, 4096] {
            let mut m = vec![0; len];
            fill(&mut m);
            stamp(&mut m, 0x0102_0304_0506_0708);
            assert!(check(&m, 0x0102_0304_0506_0708, true), "len {len}");
            assert!(!check(&m, 0x0102_0304_0506_0709, false), "len {len}");
            if len > 16 {
                m[len / 2] ^= 1;
                assert!(check(&m, 0x0102_0304_0506_0708, false));
                assert!(!check(&m, 0x0102_0304_0506_0708, true));
            }
        }
        let mut m = vec![0; 32];
        fill(&mut m);
        stamp(&mut m, 5);
        m[24] = 0;
        assert!(!check(&m, 5, false), "tail stamp is checked");
    }
}
