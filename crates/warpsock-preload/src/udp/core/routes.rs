//! Which connection carries a socket's datagrams to each destination:
//! stripe groups, route adoption from accepted connections, and the
//! fallback to kernel UDP with its expiry (time passed in).
//!
//! Generic over the connection handle `C` (the driver's `Arc<Conn>`; tests
//! use a plain struct), which reports its state through [`Carrier`].

use std::collections::hash_map::{Entry, RandomState};
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The route maps' hasher: each word the address hashes into is mixed in
/// with a rotate, a xor and a multiplication, from a key drawn once per
/// process, and finished with a xor-shift (the map reads the top bits).
/// SipHash cost about 230 of the 1,260 instructions of a send (one look-up
/// per datagram). Addresses a peer chooses (routes adopted from accepted
/// connections) are at most `WARPSOCK_MAX_ACCEPTED` per socket, and the
/// key is secret: colliding addresses cost at most that many probes.
#[derive(Clone, Copy, Default, Debug)]
pub(crate) struct AddrHash;

impl BuildHasher for AddrHash {
    type Hasher = AddrHasher;

    fn build_hasher(&self) -> AddrHasher {
        static KEY: OnceLock<u64> = OnceLock::new();
        AddrHasher(*KEY.get_or_init(|| RandomState::new().hash_one(0x7761_7270_736f_636bu64)))
    }
}

/// See [`AddrHash`].
pub(crate) struct AddrHasher(u64);

impl AddrHasher {
    fn add(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(23) ^ w).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        let x = self.0 ^ (self.0 >> 31);
        x.wrapping_mul(0xD6E8_FEB8_6659_FD93) ^ (x >> 29)
    }

    fn write(&mut self, bytes: &[u8]) {
        for c in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
    }

    fn write_u8(&mut self, v: u8) {
        self.add(u64::from(v));
    }

    fn write_u16(&mut self, v: u16) {
        self.add(u64::from(v));
    }

    fn write_u32(&mut self, v: u32) {
        self.add(u64::from(v));
    }

    fn write_u64(&mut self, v: u64) {
        self.add(v);
    }

    fn write_usize(&mut self, v: usize) {
        self.add(v as u64);
    }
}

/// What the route table needs to know of a connection.
pub(crate) trait Carrier: Clone {
    /// Established (0), being set up (1), retrying after a failure (2),
    /// closed (3).
    fn rank(&self) -> u8;
    /// Bytes queued in user space (its TCP send buffer is full).
    fn queued(&self) -> usize;
    /// Whether `self` and `other` are the same connection.
    fn same(&self, other: &Self) -> bool;
    /// Whether it delivered a datagram from its (proved) sender, so that a
    /// reply may go back over it.
    fn delivered(&self) -> bool;
}

/// Rank of an established connection.
pub(crate) const UP: u8 = 0;

/// The connections that carry one destination's datagrams: one, or the K
/// stripes of `WARPSOCK_STRIPES` (sender), or the connections a striped
/// sender opened to us (receiver, grouped by the preamble's group number;
/// replies are striped over them too).
#[derive(Debug)]
pub(crate) struct Group<C> {
    conns: Vec<C>,
    /// The stripe group number (0: not striped).
    id: u32,
    /// Round-robin position.
    next: usize,
    /// Adopted from accepted connections: carries replies only.
    inbound: bool,
}

impl<C: Carrier> Group<C> {
    /// A group of the given connections (non-empty) and group number.
    pub(crate) fn new(conns: Vec<C>, id: u32) -> Self {
        debug_assert!(!conns.is_empty());
        Self {
            conns,
            id,
            next: 0,
            inbound: false,
        }
    }

    /// The connection for the next datagram: round-robin over the stripes,
    /// skipping those with datagrams still queued in user space (their TCP
    /// send buffer is full: slow, or recovering a lost segment) when another
    /// has none; else the least queued. Established stripes before those
    /// still being set up; stripes retrying after a failure last.
    pub(crate) fn pick(&mut self) -> C {
        let k = self.conns.len();
        if k == 1 {
            return self.conns[0].clone();
        }
        let start = self.next % k;
        self.next = start + 1;
        let mut best: Option<(u8, usize, usize)> = None;
        for j in 0..k {
            let i = (start + j) % k;
            let c = &self.conns[i];
            let rank = c.rank().min(2);
            let q = c.queued();
            if rank == UP && q == 0 {
                return c.clone();
            }
            if best.is_none_or(|(r, bq, _)| (rank, q) < (r, bq)) {
                best = Some((rank, q, i));
            }
        }
        self.conns[best.map_or(start, |b| b.2)].clone()
    }

    /// Forgets `c`; returns whether the group is now empty.
    fn remove(&mut self, c: &C) -> bool {
        self.conns.retain(|x| !x.same(c));
        self.conns.is_empty()
    }
}

/// Where the next datagram to a destination goes.
#[derive(Debug)]
pub(crate) enum Lookup<C> {
    /// By kernel UDP: the destination has fallen back.
    Kernel,
    /// Over this connection.
    Conn(C),
    /// No route yet: open one ([`Routes::insert`]).
    Open,
}

/// What [`Routes::adopt`] did.
#[derive(Debug)]
pub(crate) enum Adopted<C> {
    /// The connection is now the route to its sender.
    New,
    /// The connection is now the route to its sender, in place of these
    /// connections of ours, none of them established (the caller closes
    /// them).
    Replaced(Vec<C>),
    /// It joined the stripe group that already routes to its sender.
    Joined,
    /// Another route exists; the connection only delivers.
    Ignored,
}

/// A socket's routes and fallbacks.
#[derive(Debug)]
pub(crate) struct Routes<C> {
    groups: HashMap<SocketAddr, Group<C>, AddrHash>,
    /// Destinations on kernel UDP, until the given time.
    fallback: HashMap<SocketAddr, Instant, AddrHash>,
    /// The destination [`Routes::lookup`] last routed over a group of one
    /// connection, and that connection: the answer of the next look-up of
    /// the same destination (a ping-pong's every send), with no hashing.
    /// Only such an answer is kept, since nothing but a change of the
    /// routes alters it (a group of one has no round robin, and a reply
    /// route's `delivered` never goes back), and every change forgets it.
    last: Option<(SocketAddr, C)>,
}

impl<C> Default for Routes<C> {
    fn default() -> Self {
        Self {
            groups: HashMap::default(),
            fallback: HashMap::default(),
            last: None,
        }
    }
}

impl<C: Carrier> Routes<C> {
    /// Where a datagram to `dest` goes at the time `now` gives (read only
    /// while `dest` has fallen back: a send to a routed destination reads
    /// no clock and looks up one map). A route adopted from
    /// accepted connections carries replies only: until one of them has
    /// delivered a datagram from `dest`, a send to `dest` is a fresh
    /// outbound destination and opens its own route (which then replaces
    /// the adopted one), so that no inbound connection can capture it.
    pub(crate) fn lookup(&mut self, dest: &SocketAddr, now: impl FnOnce() -> Instant) -> Lookup<C> {
        if let Some((d, c)) = &self.last {
            if d == dest {
                return Lookup::Conn(c.clone());
            }
        }
        if !self.fallback.is_empty() {
            if self.fallback.get(dest).is_some_and(|t| *t > now()) {
                return Lookup::Kernel;
            }
            self.fallback.remove(dest);
        }
        match self.groups.get_mut(dest) {
            Some(g) if g.inbound && !g.conns.iter().any(Carrier::delivered) => Lookup::Open,
            Some(g) => {
                let c = g.pick();
                if g.conns.len() == 1 {
                    self.last = Some((*dest, c.clone()));
                }
                Lookup::Conn(c)
            }
            None => Lookup::Open,
        }
    }

    /// Routes `dest` over a new group; returns the connection for the
    /// first datagram.
    pub(crate) fn insert(&mut self, dest: SocketAddr, mut group: Group<C>) -> C {
        self.last = None;
        let first = group.pick();
        self.groups.insert(dest, group);
        first
    }

    /// An accepted connection proved its sender `remote`: route replies
    /// over it (see [`Routes::lookup`]). A stripe whose group already
    /// routes to `remote` joins it; otherwise the first route stays,
    /// unless the connection already delivered a datagram from `remote`
    /// and that route is not working: a group of our own whose connections
    /// all failed (retrying or closed), or kernel UDP after such a group
    /// gave up. (A group still connecting for the first time stays: if it
    /// fails, the socket adopts the proved connection then.) That happens when the program answers the first datagram in
    /// the moment between the proof's check and this adoption (its answer
    /// found no route and opened one toward a sender that may not listen):
    /// without this, the answers went by kernel UDP for the whole run.
    pub(crate) fn adopt(&mut self, remote: SocketAddr, conn: &C, group: u32) -> Adopted<C> {
        self.last = None;
        let inbound = || {
            let mut g = Group::new(vec![conn.clone()], group);
            g.inbound = true;
            g
        };
        if conn.delivered() && self.fallback.remove(&remote).is_some() {
            self.groups.insert(remote, inbound());
            return Adopted::New;
        }
        match self.groups.entry(remote) {
            Entry::Vacant(v) => {
                v.insert(inbound());
                Adopted::New
            }
            Entry::Occupied(mut o) => {
                let g = o.get_mut();
                if group != 0 && g.id == group && !g.conns.iter().any(|c| c.same(conn)) {
                    g.conns.push(conn.clone());
                    Adopted::Joined
                } else if conn.delivered() && !g.inbound && g.conns.iter().all(|c| c.rank() >= 2) {
                    let old = std::mem::replace(g, inbound());
                    Adopted::Replaced(old.conns)
                } else {
                    Adopted::Ignored
                }
            }
        }
    }

    /// `conn` no longer carries `dest` (it died while routed). Returns
    /// whether another established connection still carries it.
    pub(crate) fn remove(&mut self, dest: &SocketAddr, conn: &C) -> bool {
        self.last = None;
        let Some(g) = self.groups.get_mut(dest) else {
            return false;
        };
        if g.remove(conn) {
            self.groups.remove(dest);
            return false;
        }
        g.conns.iter().any(|c| c.rank() == UP)
    }

    /// Puts `dest` on kernel UDP until `now + span`. Returns whether it
    /// was not on it already (a new fallback, to count).
    pub(crate) fn fall_back(&mut self, dest: SocketAddr, now: Instant, span: Duration) -> bool {
        self.last = None;
        self.fallback
            .insert(dest, now + span)
            .is_none_or(|t| t <= now)
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::rc::Rc;

    use super::*;

    #[test]
    fn addresses_hash_apart_in_every_part() {
        let h = |a: &str| AddrHash.hash_one(a.parse::<SocketAddr>().unwrap());
        let base = h("127.0.0.1:5000");
        assert_eq!(base, h("127.0.0.1:5000"), "one key per process");
        for other in [
            "127.0.0.1:5001",
            "127.0.0.2:5000",
            "10.0.0.1:5000",
            "[::1]:5000",
            "[::ffff:127.0.0.1]:5000",
        ] {
            assert_ne!(base, h(other), "{other}");
        }
        // The top bits (the map's control bytes) differ across ports too.
        let tops: std::collections::HashSet<u64> = (5000..5064)
            .map(|p| h(&format!("127.0.0.1:{p}")) >> 57)
            .collect();
        assert!(tops.len() >= 32, "{} distinct top-7-bit values", tops.len());
    }

    /// Id, rank, bytes queued, delivered.
    type State = (u32, Cell<u8>, Cell<usize>, Cell<bool>);

    /// A connection stand-in whose state the test sets.
    #[derive(Clone, Debug)]
    struct C(Rc<State>);

    impl C {
        fn new(id: u32) -> Self {
            Self(Rc::new((id, Cell::new(UP), Cell::new(0), Cell::new(true))))
        }
        fn id(&self) -> u32 {
            self.0 .0
        }
    }

    impl Carrier for C {
        fn rank(&self) -> u8 {
            self.0 .1.get()
        }
        fn queued(&self) -> usize {
            self.0 .2.get()
        }
        fn same(&self, other: &Self) -> bool {
            Rc::ptr_eq(&self.0, &other.0)
        }
        fn delivered(&self) -> bool {
            self.0 .3.get()
        }
    }

    fn addr(p: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], p))
    }

    #[test]
    fn stripes_round_robin_and_skip_full_or_down_ones() {
        let cs: Vec<C> = (0..4).map(C::new).collect();
        let mut g = Group::new(cs.clone(), 7);
        let ids: Vec<u32> = (0..8).map(|_| g.pick().id()).collect();
        assert_eq!(ids, [0, 1, 2, 3, 0, 1, 2, 3]);
        cs[1].0 .2.set(5000); // stripe 1's TCP send buffer is full
        cs[2].0 .1.set(2); // stripe 2 retries
        let ids: Vec<u32> = (0..4).map(|_| g.pick().id()).collect();
        assert_eq!(ids, [0, 3, 3, 3]);
        // All queued: the least queued wins.
        for (c, q) in cs.iter().zip([30, 10, 0, 20]) {
            c.0 .2.set(q);
        }
        cs[2].0 .1.set(1);
        assert_eq!(g.pick().id(), 1);
    }

    #[test]
    fn fallback_expires() {
        let t0 = Instant::now();
        let mut r: Routes<C> = Routes::default();
        let d = addr(5001);
        assert!(matches!(r.lookup(&d, || t0), Lookup::Open));
        assert!(r.fall_back(d, t0, Duration::from_secs(10)));
        assert!(!r.fall_back(d, t0, Duration::from_secs(10)), "counted once");
        assert!(matches!(
            r.lookup(&d, || t0 + Duration::from_secs(9)),
            Lookup::Kernel
        ));
        assert!(matches!(
            r.lookup(&d, || t0 + Duration::from_secs(10)),
            Lookup::Open
        ));
        // With no destination fallen back, a look-up (one per datagram
        // sent) reads no clock.
        let no_clock = || -> Instant { panic!("the clock was read") };
        assert!(matches!(r.lookup(&d, no_clock), Lookup::Open));
        r.insert(d, Group::new(vec![C::new(1)], 7));
        assert!(matches!(r.lookup(&d, no_clock), Lookup::Conn(_)));
    }

    #[test]
    fn adoption_groups_stripes_and_keeps_the_first_route() {
        let mut r: Routes<C> = Routes::default();
        let d = addr(6000);
        let (a, b, c) = (C::new(1), C::new(2), C::new(3));
        assert!(matches!(r.adopt(d, &a, 42), Adopted::New));
        assert!(matches!(r.adopt(d, &b, 42), Adopted::Joined));
        assert!(matches!(r.adopt(d, &b, 42), Adopted::Ignored));
        assert!(
            matches!(r.adopt(d, &c, 43), Adopted::Ignored),
            "another group"
        );
        assert!(r.remove(&d, &a), "b still carries it");
        assert!(!r.remove(&d, &b));
        assert!(matches!(r.lookup(&d, Instant::now), Lookup::Open));
    }

    /// The answer kept for the last destination (`Routes::last`) is the
    /// look-up's own, and each change of the routes forgets it: a fallback,
    /// a removal, a new route, a stripe that joins.
    #[test]
    fn a_remembered_route_follows_every_change() {
        let t0 = Instant::now();
        let mut r: Routes<C> = Routes::default();
        let (d, e) = (addr(8000), addr(8001));
        let is = |l: Lookup<C>, id: u32| matches!(l, Lookup::Conn(c) if c.id() == id);
        let one = C::new(1);
        r.insert(d, Group::new(vec![one.clone()], 5));
        r.insert(e, Group::new(vec![C::new(9)], 0));
        assert!(is(r.lookup(&d, || t0), 1));
        assert!(is(r.lookup(&d, || t0), 1), "remembered");
        assert!(is(r.lookup(&e, || t0), 9), "another destination");
        assert!(is(r.lookup(&d, || t0), 1));
        assert!(r.fall_back(d, t0, Duration::from_secs(1)));
        assert!(matches!(r.lookup(&d, || t0), Lookup::Kernel));
        let later = t0 + Duration::from_secs(1);
        assert!(is(r.lookup(&d, || later), 1), "the fallback ran out");
        // A second stripe joins: round robin over both, not the first.
        let two = C::new(2);
        assert!(matches!(r.adopt(d, &two, 5), Adopted::Joined));
        let ids: Vec<u32> = (0..4)
            .map(|_| match r.lookup(&d, || later) {
                Lookup::Conn(c) => c.id(),
                _ => 0,
            })
            .collect();
        assert_eq!(ids, [1, 2, 1, 2]);
        assert!(r.remove(&d, &two), "the first still carries it");
        assert!(is(r.lookup(&d, || later), 1));
        assert!(!r.remove(&d, &one));
        assert!(matches!(r.lookup(&d, || later), Lookup::Open), "removed");
        // A new route, then an adopted reply route that replaces it when
        // it is not working.
        let up = C::new(3);
        r.insert(d, Group::new(vec![up.clone()], 0));
        assert!(is(r.lookup(&d, || later), 3), "a new route");
        up.0 .1.set(2);
        assert!(matches!(r.adopt(d, &C::new(6), 0), Adopted::Replaced(_)));
        assert!(is(r.lookup(&d, || later), 6), "the reply route");
        r.insert(d, Group::new(vec![C::new(7)], 0));
        assert!(is(r.lookup(&d, || later), 7), "a route put in its place");
    }

    /// Regression (reply-route hijack): a connection that claimed the
    /// address of a service the program later sends to must not receive
    /// that traffic; only replies to what it delivered go back over it.
    #[test]
    fn adopted_routes_carry_replies_only() {
        let now = Instant::now();
        let mut r: Routes<C> = Routes::default();
        let d = addr(7000);
        let inbound = C::new(1);
        inbound.0 .3.set(false);
        assert!(matches!(r.adopt(d, &inbound, 0), Adopted::New));
        assert!(
            matches!(r.lookup(&d, || now), Lookup::Open),
            "a fresh destination opens its own route"
        );
        let own = C::new(2);
        let first = r.insert(d, Group::new(vec![own.clone()], 0));
        assert!(first.same(&own));
        assert!(matches!(r.lookup(&d, || now), Lookup::Conn(c) if c.same(&own)));
        assert!(matches!(r.adopt(d, &inbound, 0), Adopted::Ignored));
        // A reply to a datagram the inbound connection delivered goes back
        // over it.
        let mut r: Routes<C> = Routes::default();
        r.adopt(d, &inbound, 0);
        inbound.0 .3.set(true);
        assert!(matches!(r.lookup(&d, || now), Lookup::Conn(c) if c.same(&inbound)));
    }

    /// Regression (issue 13, bug a): the program answered the first
    /// datagram of an accepted connection before that connection was
    /// adopted, so its answer opened a route of its own toward a sender
    /// that does not listen. Once the proof lands, replies move to the
    /// connection, whether that route is still being set up or already
    /// gave up (kernel UDP).
    #[test]
    fn a_proved_sender_replaces_a_route_that_is_not_working() {
        let now = Instant::now();
        let d = addr(8000);
        let inbound = C::new(1);
        // Our own route, still connecting (rank 1): kept (it may come up).
        let mut r: Routes<C> = Routes::default();
        let own = C::new(2);
        own.0 .1.set(1);
        r.insert(d, Group::new(vec![own.clone()], 0));
        assert!(matches!(r.adopt(d, &inbound, 0), Adopted::Ignored));
        // Retrying after a failure (rank 2): replaced, and handed back to
        // be closed.
        own.0 .1.set(2);
        let mut r: Routes<C> = Routes::default();
        r.insert(d, Group::new(vec![own.clone()], 0));
        match r.adopt(d, &inbound, 0) {
            Adopted::Replaced(old) => assert!(old.len() == 1 && old[0].same(&own)),
            other => panic!("not replaced: {other:?}"),
        }
        assert!(matches!(r.lookup(&d, || now), Lookup::Conn(c) if c.same(&inbound)));
        // Its failure later does not put the destination on kernel UDP.
        assert!(
            r.remove(&d, &own),
            "the adopted connection still carries it"
        );
        // Our own route gave up already: kernel UDP until the adoption.
        let mut r: Routes<C> = Routes::default();
        assert!(r.fall_back(d, now, Duration::from_secs(10)));
        assert!(matches!(r.lookup(&d, || now), Lookup::Kernel));
        assert!(matches!(r.adopt(d, &inbound, 0), Adopted::New));
        assert!(matches!(r.lookup(&d, || now), Lookup::Conn(c) if c.same(&inbound)));
        // A working route of our own stays, and so does a fallback or a
        // route being set up when the connection delivered nothing yet
        // (no reply is due: see `adopted_routes_carry_replies_only`).
        let mut r: Routes<C> = Routes::default();
        let up = C::new(3);
        r.insert(d, Group::new(vec![up.clone()], 0));
        assert!(matches!(r.adopt(d, &inbound, 0), Adopted::Ignored));
        assert!(matches!(r.lookup(&d, || now), Lookup::Conn(c) if c.same(&up)));
        let silent = C::new(4);
        silent.0 .3.set(false);
        let mut r: Routes<C> = Routes::default();
        r.insert(d, Group::new(vec![own.clone()], 0));
        assert!(matches!(r.adopt(d, &silent, 0), Adopted::Ignored));
        let mut r: Routes<C> = Routes::default();
        r.fall_back(d, now, Duration::from_secs(10));
        assert!(matches!(r.adopt(d, &silent, 0), Adopted::New));
        assert!(matches!(r.lookup(&d, || now), Lookup::Kernel));
    }
}
