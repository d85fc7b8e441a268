//! The bytes of one send call as the caller gave them (`writev`,
//! `sendmsg`: several buffers, one stream), and where one request's share
//! of them comes from. Gathering in place — into a transmit slot, or as a
//! gather list of the caller's registered buffers — is what keeps a
//! vectored send from staging its bytes in a buffer of its own.

use smallvec::SmallVec;
use warpsock_engine::{Mr, Sgl};

/// The non-empty buffers of a send call, in order ([`non_empty`]).
pub(crate) struct Gather<'a> {
    pub(crate) parts: &'a [&'a [u8]],
    len: usize,
}

/// The non-empty buffers of `bufs`, in order: a few inline, so a small
/// send allocates nothing (a `Vec` here was one allocation per call).
pub(crate) fn non_empty<'a>(bufs: &[&'a [u8]]) -> SmallVec<[&'a [u8]; 4]> {
    bufs.iter().copied().filter(|b| !b.is_empty()).collect()
}

impl<'a> Gather<'a> {
    /// The call's buffers `parts`, none empty ([`non_empty`]).
    pub(crate) fn new(parts: &'a [&'a [u8]]) -> Self {
        debug_assert!(parts.iter().all(|b| !b.is_empty()), "an empty part");
        let len = parts.iter().map(|b| b.len()).sum();
        Self { parts, len }
    }

    /// Bytes in all.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The pieces of bytes `off..off + len` of the call: (part, offset in
    /// it, length).
    fn pieces(
        &self,
        mut off: usize,
        mut len: usize,
    ) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        self.parts.iter().enumerate().filter_map(move |(i, p)| {
            if len == 0 {
                return None;
            }
            if off >= p.len() {
                off -= p.len();
                return None;
            }
            let k = (p.len() - off).min(len);
            let piece = (i, off, k);
            off = 0;
            len -= k;
            Some(piece)
        })
    }

    /// Copies bytes `off..off + dst.len()` of the call into `dst`.
    pub(crate) fn copy_to(&self, off: usize, dst: &mut [u8]) {
        let mut at = 0;
        for (i, from, k) in self.pieces(off, dst.len()) {
            dst[at..at + k].copy_from_slice(&self.parts[i][from..from + k]);
            at += k;
        }
        debug_assert_eq!(at, dst.len(), "copy past the call's bytes");
    }

    /// Passes the slices holding bytes `off..off + len` of the call to `f`,
    /// in order.
    pub(crate) fn slices(&self, off: usize, len: usize, mut f: impl FnMut(&'a [u8])) {
        // One buffer (`send`, `write`): the slice itself, without the walk.
        if let [p] = self.parts {
            return f(&p[off..off + len]);
        }
        for (i, from, k) in self.pieces(off, len) {
            f(&self.parts[i][from..from + k]);
        }
    }

    /// Appends to `sgl` the entries naming bytes `off..off + len` of the
    /// call in place; `mrs[i]` registers part `i`, exactly (its byte 0 the
    /// part's: the entries name offsets into the registration, which may
    /// have moved to a private copy since, `Mr::keep_private_copy`, where
    /// the part's address no longer tells where it is).
    pub(crate) fn sges(&self, off: usize, len: usize, mrs: &[Mr], sgl: &mut Sgl) {
        for (i, from, k) in self.pieces(off, len) {
            debug_assert_eq!(mrs[i].len(), self.parts[i].len(), "a part's registration");
            sgl.push(mrs[i].sge(from, k as u32));
        }
    }
}

/// Bytes `off..off + len` of a send call: sent in place from `mrs` (one
/// registration per part of `g`), or copied if `None`.
#[derive(Clone, Copy)]
pub(crate) struct Src<'a> {
    pub(crate) g: &'a Gather<'a>,
    pub(crate) mrs: Option<&'a [Mr]>,
    pub(crate) off: usize,
    pub(crate) len: usize,
}

impl Src<'static> {
    /// No bytes.
    pub(crate) const NONE: Self = Self {
        g: &Gather { parts: &[], len: 0 },
        mrs: None,
        off: 0,
        len: 0,
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_name_exactly_the_bytes_asked_for() {
        let (a, b) = ([1u8, 2, 3], [4u8, 5, 6, 7]);
        let one = [&a[..]];
        let two = [&a[..], &b[..]];
        for parts in [&one[..], &two[..]] {
            let g = Gather::new(parts);
            let all: Vec<u8> = parts.concat();
            for off in 0..=all.len() {
                for len in 0..=all.len() - off {
                    let mut got = Vec::new();
                    let mut n = 0;
                    g.slices(off, len, |s| {
                        got.extend_from_slice(s);
                        n += 1;
                    });
                    assert_eq!(got, all[off..off + len], "off {off} len {len}");
                    if parts.len() == 1 {
                        assert_eq!(n, 1, "one buffer is one slice");
                    }
                }
            }
        }
    }

    #[test]
    fn copies_across_parts_and_skips_empty_ones() {
        let (a, b, c) = ([1u8, 2, 3], [], [4u8, 5, 6, 7]);
        let parts = non_empty(&[&a, &b, &c]);
        let g = Gather::new(&parts);
        assert_eq!(g.len(), 7);
        assert_eq!(g.parts.len(), 2);
        for off in 0..7 {
            for len in 0..=7 - off {
                let mut out = vec![0u8; len];
                g.copy_to(off, &mut out);
                let want: Vec<u8> = (1..=7).skip(off).take(len).collect();
                assert_eq!(out, want, "off {off} len {len}");
            }
        }
        assert_eq!(
            g.pieces(2, 3).collect::<Vec<_>>(),
            vec![(0, 2, 1), (1, 0, 2)]
        );
    }
}
