//! [`Ring`]: a first-in first-out queue whose head moves to its back in
//! a few inlined instructions ([`Ring::rotate_one`]) — the posted-receive
//! queues' steady state, where a receive's buffer is reposted as soon as
//! its message is taken (the proto core's `rq`, the xsock socket's
//! `posted` slots). `VecDeque::rotate_left(1)` did that as a call of
//! std's (its general `wrap_copy`, ~44 instructions; `pop_front` and
//! `push_back` cost more still), twice per busy round trip (issue 12).
//! Safe code: the slots are `Option`s, exactly the queue's `len` of them
//! `Some`, from `head` on (wrapping).

use std::fmt;

/// A queue of `T`, oldest first (see the module docs).
#[derive(Clone)]
pub struct Ring<T> {
    /// The slots: `buf[(head + i) % buf.len()]` is `Some` for `i < len`,
    /// the rest `None`.
    buf: Vec<Option<T>>,
    /// The oldest element's slot (0 when `buf` is empty).
    head: usize,
    /// Elements queued.
    len: usize,
    /// The most slots growth makes (more only for more elements).
    limit: usize,
}

impl<T> Ring<T> {
    /// An empty queue (allocates nothing).
    pub const fn new() -> Self {
        Self::with_limit(usize::MAX)
    }

    /// An empty queue that never grows past `limit` slots unless more
    /// elements are pushed (a queue its owner keeps to `limit` elements
    /// fills its slots at its fullest: [`Ring::rotate_one`]'s cheap case).
    pub const fn with_limit(limit: usize) -> Self {
        Self {
            buf: Vec::new(),
            head: 0,
            len: 0,
            limit,
        }
    }

    /// Changes the limit ([`Ring::with_limit`]) for the growths to come (a
    /// connection whose configuration its accept replaced: its receive
    /// depth). Slots grown past a lowered limit that holds every element
    /// queued are given back: a queue kept to its limit then fills its
    /// slots at its fullest, and [`Ring::rotate_one`] moves only the head
    /// (review r26-d item 7: receives posted before an `accept_with` with
    /// a smaller depth left every rotation a slot's move).
    pub fn set_limit(&mut self, limit: usize) {
        self.limit = limit;
        if self.len <= limit && limit < self.buf.len() {
            self.relayout(limit);
        }
    }

    /// Elements queued.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether none is queued.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The slot `i` places after `at` (`i <= buf.len()`).
    #[inline(always)]
    fn wrap(&self, at: usize, i: usize) -> usize {
        let p = at + i;
        if p >= self.buf.len() {
            p - self.buf.len()
        } else {
            p
        }
    }

    /// The oldest element.
    #[inline]
    pub fn front(&self) -> Option<&T> {
        if self.len == 0 {
            return None;
        }
        self.buf[self.head].as_ref()
    }

    /// Element `i` (0: the oldest).
    #[inline]
    pub fn get(&self, i: usize) -> Option<&T> {
        if i >= self.len {
            return None;
        }
        self.buf[self.wrap(self.head, i)].as_ref()
    }

    /// Takes the oldest element.
    #[inline]
    pub fn pop_front(&mut self) -> Option<T> {
        if self.len == 0 {
            return None;
        }
        let x = self.buf[self.head].take();
        self.head = self.wrap(self.head, 1);
        self.len -= 1;
        x
    }

    /// Queues `x` as the newest (grows when full).
    #[inline]
    pub fn push_back(&mut self, x: T) {
        if self.len == self.buf.len() {
            self.grow();
        }
        let at = self.wrap(self.head, self.len);
        // The slot is `None` (past the tail): nothing to drop, and no
        // drop's test of it.
        std::mem::forget(self.buf[at].replace(x));
        self.len += 1;
    }

    /// Twice the slots (at least 4; at most the limit, but one more than
    /// now), the elements from slot 0 in order.
    #[cold]
    #[inline(never)]
    fn grow(&mut self) {
        // Doubling, stopped at `limit` once; past it, doubling again: a
        // queue pushed past its limit (a responder's receive depth came
        // with `accept_with`, after the queue was made) grew
        // by one slot a push — a copy of the whole queue each, 16 K
        // receives posted took seconds (engine `tests/inline.rs` timed out
        // in its MPA exchange).
        let n = self.buf.len();
        let cap = if n < self.limit {
            (n * 2).max(4).min(self.limit)
        } else {
            (n * 2).max(4)
        };
        self.relayout(cap);
    }

    /// `cap` slots (at least `len`), the elements from slot 0 in order.
    fn relayout(&mut self, cap: usize) {
        debug_assert!(cap >= self.len);
        let mut buf: Vec<Option<T>> = Vec::with_capacity(cap);
        let head = self.head;
        let old = std::mem::take(&mut self.buf);
        let n = old.len();
        let mut old: Vec<Option<T>> = old;
        // Oldest first: from `head` to the end, then from 0.
        let back: Vec<Option<T>> = old.drain(head.min(n)..).collect();
        buf.extend(back);
        buf.extend(old);
        // The `None`s past the tail go (a shrink), or more are added.
        buf.retain(Option::is_some);
        buf.resize_with(cap, || None);
        self.buf = buf;
        self.head = 0;
    }

    /// Moves the oldest element to the back (`pop_front` then `push_back`
    /// of it: the same queue after), in place. With every slot in use
    /// (the posted queues' steady state: grown to their limit,
    /// [`Ring::with_limit`]) the back's slot is the head's: only the head
    /// moves. No-op when empty.
    #[inline(always)]
    pub fn rotate_one(&mut self) {
        if self.len == 0 {
            return;
        }
        if self.len != self.buf.len() {
            let tail = self.wrap(self.head, self.len);
            let x = self.buf[self.head].take();
            // `None` (past the tail), as in `push_back`.
            std::mem::forget(std::mem::replace(&mut self.buf[tail], x));
        }
        self.head = self.wrap(self.head, 1);
    }

    /// Keeps the elements `keep` says yes to, in order. If `keep` panics,
    /// the element it was given is dropped and the queue is left rotated
    /// (those not yet asked ahead of those kept); every caller's `keep` is
    /// a comparison (review r26-d item 8).
    pub fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) {
        let n = self.len;
        for _ in 0..n {
            let x = self.pop_front().expect("counted");
            if keep(&x) {
                self.push_back(x);
            }
        }
    }

    /// Drops the newest elements past the first `n`.
    pub fn truncate(&mut self, n: usize) {
        while self.len > n {
            let at = self.wrap(self.head, self.len - 1);
            self.buf[at] = None;
            self.len -= 1;
        }
    }

    /// The elements, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        let (b, a) = self.buf.split_at(self.head);
        a.iter().chain(b).filter_map(Option::as_ref).take(self.len)
    }

    /// The elements, oldest first, to change.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut T> {
        let len = self.len;
        let (b, a) = self.buf.split_at_mut(self.head);
        a.iter_mut().chain(b).filter_map(Option::as_mut).take(len)
    }
}

impl<T> Default for Ring<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Extend<T> for Ring<T> {
    fn extend<I: IntoIterator<Item = T>>(&mut self, it: I) {
        for x in it {
            self.push_back(x);
        }
    }
}

impl<T> FromIterator<T> for Ring<T> {
    fn from_iter<I: IntoIterator<Item = T>>(it: I) -> Self {
        let mut r = Self::new();
        r.extend(it);
        r
    }
}

impl<T> std::ops::Index<usize> for Ring<T> {
    type Output = T;

    fn index(&self, i: usize) -> &T {
        self.get(i).expect("index within the queue")
    }
}

/// The elements, oldest first (as a `VecDeque` shows them).
impl<T: fmt::Debug> fmt::Debug for Ring<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::Ring;

    /// A queue pushed past its limit still grows geometrically: 1 << 14
    /// pushes into a queue limited to 4 make a few dozen growths at most
    /// (each a copy of the queue), not one a push.
    #[test]
    fn a_queue_past_its_limit_doubles() {
        let mut r = Ring::with_limit(4);
        let mut grown = 0;
        let mut slots = 0;
        for i in 0..1usize << 14 {
            r.push_back(i);
            if r.buf.len() != slots {
                slots = r.buf.len();
                grown += 1;
            }
        }
        assert!(grown <= 16, "{grown} growths");
        assert_eq!(r.len(), 1 << 14);
        assert!((0..1usize << 14).all(|i| r.get(i) == Some(&i)));
    }

    /// Every operation against `VecDeque`'s, from every head position and
    /// fill (a full ring's rotation swaps a slot with itself; a growth
    /// from a wrapped head keeps the order).
    #[test]
    fn behaves_as_a_vecdeque() {
        let mut seed = 7u64;
        let mut rnd = move |n: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        let mut r: Ring<u32> = Ring::new();
        let mut q: VecDeque<u32> = VecDeque::new();
        for i in 0..20_000u32 {
            match rnd(7) {
                0 | 1 => {
                    r.push_back(i);
                    q.push_back(i);
                }
                2 => assert_eq!(r.pop_front(), q.pop_front()),
                3 | 4 => {
                    r.rotate_one();
                    if !q.is_empty() {
                        q.rotate_left(1);
                    }
                }
                5 => {
                    let m = rnd(5) as u32;
                    r.retain(|&x| x % 5 != m);
                    q.retain(|&x| x % 5 != m);
                }
                _ => {
                    let n = q.len().saturating_sub(rnd(3) as usize);
                    r.truncate(n);
                    q.truncate(n);
                }
            }
            assert_eq!(r.len(), q.len());
            assert_eq!(r.front(), q.front());
            assert!(r.iter().eq(q.iter()), "{r:?} {q:?}");
            if !q.is_empty() {
                let k = rnd(q.len() as u64) as usize;
                assert_eq!(r[k], q[k]);
            }
        }
        r.iter_mut().for_each(|x| *x += 1);
        q.iter_mut().for_each(|x| *x += 1);
        assert!(r.iter().eq(q.iter()));
        assert_eq!(format!("{r:?}"), format!("{q:?}"));
    }

    /// A full ring's rotation (every slot in use: the tail is the head),
    /// and a limited ring's growth: to its limit, then past it doubling
    /// (`a_queue_past_its_limit_doubles`).
    #[test]
    fn a_full_ring_rotates() {
        let mut r: Ring<u32> = Ring::with_limit(6);
        r.extend(0..6);
        assert_eq!(r.buf.len(), 6, "grown to the limit");
        r.rotate_one();
        assert!(r.iter().copied().eq([1, 2, 3, 4, 5, 0]));
        r.push_back(6);
        assert_eq!(r.buf.len(), 12);
        r.rotate_one();
        assert!(r.iter().copied().eq([2, 3, 4, 5, 0, 6, 1]));
        r.pop_front();
        r.rotate_one();
        assert!(r.iter().copied().eq([4, 5, 0, 6, 1, 3]));
    }

    /// A limit lowered below the slots grown, but not below the elements
    /// queued, gives the slots back, the order kept (from a wrapped head):
    /// the ring is full again and a rotation moves the head alone. A limit
    /// below the elements queued changes no slot (review r26-d item 7).
    #[test]
    fn a_lowered_limit_gives_slots_back() {
        let mut r: Ring<u32> = Ring::new();
        r.extend(0..7);
        assert_eq!(r.buf.len(), 8);
        r.rotate_one();
        r.rotate_one();
        r.set_limit(3);
        assert_eq!(r.buf.len(), 8, "shrunk below its elements");
        r.pop_front();
        r.set_limit(6);
        assert_eq!(r.buf.len(), 6);
        assert!(r.iter().copied().eq([3, 4, 5, 6, 0, 1]));
        let head = r.head;
        r.rotate_one();
        assert_eq!(r.head, (head + 1) % 6);
        assert!(r.iter().copied().eq([4, 5, 6, 0, 1, 3]));
        r.push_back(9);
        assert_eq!(r.buf.len(), 12, "past the limit: doubling");
        assert!(r.iter().copied().eq([4, 5, 6, 0, 1, 3, 9]));
    }
}
