//! The one benchmark loop, over every transport.
//!
//! A transport (one file under `src/transports/`) implements [`Link`]:
//! how the client opens its connection and how the server accepts them
//! ([`Link::connect`], [`Link::accept`]), each side ending up with an
//! [`Endpoint`]: one thread's connections, with the few operations that
//! differ between a byte stream, datagrams and RDMA (start a message,
//! echo one, send the FIN, wait for [`Event`]s). Everything else lives
//! here once, in [`run`]:
//!
//! - the roles: a pinger sends one message and waits for its answer; a
//!   ponger echoes every message; a source keeps `window` messages in
//!   flight; a sink counts what arrives; over a pull transport (RDMA
//!   Read) the sink originates (it reads) and the source only serves;
//! - the budget ([`Meter`]: time or iterations, latency warm-up, progress
//!   ticks) and the pacing of rate-limited runs ([`Pacer`]);
//! - what is measured ([`Stats`]: round trips, bytes counted and
//!   verified, the active span, interval samples, datagram pings lost);
//! - the end of every connection, the same whatever the transport: a side
//!   sends its FIN once its own part is over — the active side when its
//!   budget is spent and its messages are out, a passive side when it has
//!   seen the peer's FIN — and is done when both FINs are through. The
//!   active side's clock stops at the peer's FIN, so every byte counted
//!   was received. The FIN carries the count of data messages the side
//!   originated (datagram receivers drain until that many arrived; an
//!   RDMA Write target learns from it how many Writes were placed);
//! - the idle rule: a side that sees nothing happen for [`IDLE`] fails
//!   with an error naming the wait.
//!
//! Connection setup (`conn`) is a loop of its own, [`setups`]: the
//! transport gives one connect-exchange-close, the loop does the rest.
//!
//! A client runs one thread per connection ([`run_threads`], started
//! together through a [`Gate`]); the server one thread for all the
//! connections of a test, or one per connection for multi-stream.

mod meter;

use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use warpsock_engine::Listener;

pub(crate) use meter::{Meter, Pacer};

use crate::spec::{Role, Spec, TransportInfo};
use crate::stats::Stats;
use crate::Error;

/// A side that waits longer than this for its peer gives up.
pub(crate) const IDLE: Duration = Duration::from_secs(30);
/// Most connections one connection-setup test opens (ephemeral ports and
/// the server's accept queue stay far from their limits).
pub(crate) const MAX_SETUPS: u64 = 20_000;
/// Most messages one connection originates per round before the loop
/// looks at what arrived.
const BURST: usize = 16;

/// One thread's part of a test.
#[derive(Clone, Copy)]
pub(crate) struct Job<'a> {
    pub(crate) spec: &'a Spec,
    pub(crate) role: Role,
    /// Start of the test in this process (interval samples count from it).
    pub(crate) epoch: Instant,
    /// Progress callback (fraction of the budget), or a no-op.
    pub(crate) tick: &'a (dyn Fn(f64) + Sync),
}

/// What happened on one of an endpoint's connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    /// A data message of `len` bytes arrived on `conn` (over a pull
    /// transport: a Read's data). `ok`: its contents checked out.
    /// `answer`: it answers this side's outstanding ping.
    Arrived {
        conn: usize,
        len: usize,
        ok: bool,
        answer: bool,
    },
    /// `n` messages of `len` bytes are known to have arrived (an RDMA
    /// Write target learns it from the FIN).
    ArrivedMany {
        conn: usize,
        n: u64,
        len: usize,
        ok: bool,
    },
    /// A message [`Endpoint::start`] left in flight is done (its buffer
    /// and window slot are free).
    Sent { conn: usize },
    /// The peer's FIN arrived (and, for datagrams, the stragglers it
    /// counted, or the grace time passed).
    PeerFin { conn: usize },
    /// This side's FIN is through.
    FinDone { conn: usize },
}

/// One thread's connections of one test, as the transport sees them.
///
/// Connections are numbered `0..conns()`. The driver calls [`start`] only
/// when [`ready`] says so, [`echo`] right after an arrival (pong role),
/// [`fin`] once per connection, and [`poll`] in between.
///
/// [`start`]: Endpoint::start
/// [`ready`]: Endpoint::ready
/// [`echo`]: Endpoint::echo
/// [`fin`]: Endpoint::fin
/// [`poll`]: Endpoint::poll
pub(crate) trait Endpoint: Send {
    /// How many connections this endpoint carries.
    fn conns(&self) -> usize;

    /// Whether connection `conn` can take one more message now (a window
    /// slot, a receive credit, no partial write pending).
    fn ready(&self, conn: usize) -> bool;

    /// Originates data message `seq` on `conn`: sends it (stamped with
    /// `seq`), or over a pull transport asks the peer for it. Returns
    /// whether it is still in flight, in which case an [`Event::Sent`]
    /// follows.
    fn start(&mut self, conn: usize, seq: u64) -> Result<bool, Error>;

    /// Sends the message that just arrived on `conn` back to the peer.
    fn echo(&mut self, conn: usize) -> Result<(), Error>;

    /// Sends this side's FIN on `conn`, carrying `count` (data messages
    /// this side originated), after anything still being written.
    /// Returns whether it is through already (else an
    /// [`Event::FinDone`] follows).
    fn fin(&mut self, conn: usize, count: u64) -> Result<bool, Error>;

    /// Moves data and collects what happened into `out`. Returns as soon
    /// as something happened; otherwise waits, spinning first for the
    /// test's busy-poll time, until `until` at the latest.
    fn poll(&mut self, until: Instant, out: &mut Vec<Event>) -> Result<(), Error>;

    /// A ping unanswered for this long is lost and counted (datagrams);
    /// `None`: the transport loses nothing.
    fn loss_timeout(&self) -> Option<Duration> {
        None
    }

    /// Ends every connection cleanly once both FINs are through.
    fn close(&mut self) {}

    /// RFC 3550 interarrival jitter of what arrived here, ns (datagram
    /// transports that timestamp their messages); `None` otherwise.
    fn jitter_ns(&self) -> Option<f64> {
        None
    }
}

/// Where the client finds the server.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Addrs {
    /// The control port (TCP and datagram data connections go there).
    pub(crate) ctl: SocketAddr,
    /// The iWARP data port.
    pub(crate) data: SocketAddr,
    /// The session's token: every data connection presents it.
    pub(crate) token: u64,
}

/// Where a server's TCP data connections come from (they go to the
/// control port): each arrives with the first 8 bytes it sent, the
/// session's token (or, ending a connection-setup test, its complement).
pub(crate) trait Accept: Sync {
    /// The next data connection, within `timeout`.
    fn accept(&self, timeout: Duration) -> std::io::Result<(TcpStream, u64)>;
}

/// What the server listens on.
pub(crate) struct Listeners<'a> {
    pub(crate) ctl: &'a dyn Accept,
    pub(crate) data: &'a Listener,
    pub(crate) token: u64,
}

/// Called by the server side once it is ready for the client's
/// connections (it answers `ready` on the control connection).
pub(crate) type Ready<'a> = &'a mut dyn FnMut() -> Result<(), Error>;

/// A transport: how the two sides connect. Implemented once per file in
/// `src/transports/`.
pub(crate) trait Link: Sync {
    /// What the transport is.
    fn info(&self) -> &'static TransportInfo;

    /// Client side: opens one connection (one client thread's).
    fn connect(&self, job: &Job<'_>, to: &Addrs) -> Result<Box<dyn Endpoint>, Error>;

    /// Server side: prepares, calls `ready`, accepts the test's
    /// connections and deals them to `threads` endpoints (connection `i`
    /// to endpoint `i % threads`).
    fn accept(
        &self,
        job: &Job<'_>,
        at: &Listeners<'_>,
        threads: usize,
        ready: Ready<'_>,
    ) -> Result<Vec<Box<dyn Endpoint>>, Error>;

    /// Connection setup, client side (with [`setups`]).
    fn setup_client(&self, _job: &Job<'_>, _to: &Addrs) -> Result<Stats, Error> {
        Err(self.no_setup())
    }

    /// Connection setup, server side: until the client's stop.
    fn setup_serve(
        &self,
        _job: &Job<'_>,
        _at: &Listeners<'_>,
        _ready: Ready<'_>,
    ) -> Result<Stats, Error> {
        Err(self.no_setup())
    }

    /// The error of a transport without a connection-setup row.
    fn no_setup(&self) -> Error {
        Error::msg(format!(
            "{} has no connection-setup test",
            self.info().label
        ))
    }
}

/// One connection's progress in [`run`].
#[derive(Debug, Clone, Copy, Default)]
struct ConnState {
    /// Messages originated.
    tx: u64,
    /// Of those, still in flight.
    inflight: usize,
    /// The ping in flight: its sequence number and when it left.
    ping: Option<(u64, Instant)>,
    budget_done: bool,
    fin_sent: bool,
    fin_done: bool,
    peer_fin: bool,
}

impl ConnState {
    fn done(&self) -> bool {
        self.fin_done && self.peer_fin
    }
}

/// Runs `job` on one thread's endpoint until every connection has ended;
/// what this side measured.
pub(crate) fn run(job: &Job<'_>, ep: &mut dyn Endpoint) -> Result<Stats, Error> {
    let spec = job.spec;
    let role = job.role;
    let active = role.active(spec.transport);
    let mut meter = Meter::new(spec.budget, spec.test.is_latency(), job.tick);
    let mut pacer = Pacer::new(spec.rate);
    let mut st = Stats::default();
    let mut cs = vec![ConnState::default(); ep.conns()];
    if !active {
        for c in &mut cs {
            c.budget_done = true;
        }
    }
    let loss = ep.loss_timeout();
    let mut events = Vec::with_capacity(64);
    let mut last_event = Instant::now();
    loop {
        let mut all_done = true;
        // More could be started at once (a burst hit its cap, or a FIN or
        // a lost ping changed the state): do not sleep in `poll`.
        let mut busy = false;
        let mut until = last_event + IDLE;
        for (i, c) in cs.iter_mut().enumerate() {
            if c.done() {
                continue;
            }
            all_done = false;
            if !c.budget_done && role == Role::Ping {
                if let (Some((_, at)), Some(lt)) = (c.ping, loss) {
                    if Instant::now() >= at + lt {
                        st.lost += 1;
                        c.ping = None;
                    } else {
                        until = until.min(at + lt);
                    }
                }
                if c.ping.is_none() && ep.ready(i) {
                    if meter.more(c.tx) {
                        let now = Instant::now();
                        st.active_now(now);
                        c.ping = Some((c.tx, now));
                        ep.start(i, c.tx)?;
                        c.tx += 1;
                        st.sent += 1;
                        if let Some(lt) = loss {
                            until = until.min(now + lt);
                        }
                    } else {
                        c.budget_done = true;
                    }
                }
            } else if !c.budget_done {
                let mut n = 0;
                while c.inflight < spec.window && ep.ready(i) {
                    if n == BURST.max(spec.window) {
                        busy = true;
                        break;
                    }
                    if !meter.more(c.tx) {
                        c.budget_done = true;
                        break;
                    }
                    pacer.pace(spec.size);
                    st.active_now(Instant::now());
                    if ep.start(i, c.tx)? {
                        c.inflight += 1;
                    }
                    c.tx += 1;
                    st.sent += 1;
                    n += 1;
                }
            }
            if !c.fin_sent {
                let mine_over = if active {
                    c.budget_done && c.inflight == 0 && c.ping.is_none()
                } else {
                    c.peer_fin
                };
                if mine_over {
                    c.fin_sent = true;
                    c.fin_done = ep.fin(i, c.tx)?;
                    busy = true;
                }
            }
        }
        if all_done {
            break;
        }
        let until = if busy { Instant::now() } else { until };
        ep.poll(until, &mut events)?;
        let now = Instant::now();
        if events.is_empty() {
            if !busy && now >= last_event + IDLE {
                return Err(Error::msg(format!(
                    "the peer sent nothing for {} s",
                    IDLE.as_secs()
                )));
            }
            continue;
        }
        last_event = now;
        for ev in events.drain(..) {
            match ev {
                Event::Arrived {
                    conn,
                    len,
                    ok,
                    answer,
                } => {
                    st.received(job.epoch, len, ok);
                    if role == Role::Pong {
                        ep.echo(conn)?;
                    }
                    if answer {
                        if let Some((seq, at)) = cs[conn].ping.take() {
                            if !meter.warming(seq) {
                                st.rtts_ns.push(at.elapsed().as_nanos() as u64);
                            }
                        }
                    }
                }
                Event::ArrivedMany { n, len, ok, .. } => st.received_many(job.epoch, n, len, ok),
                Event::Sent { conn } => {
                    let c = &mut cs[conn];
                    c.inflight = c.inflight.saturating_sub(1);
                }
                Event::PeerFin { conn } => {
                    cs[conn].peer_fin = true;
                    if active {
                        st.active_now(now);
                    }
                }
                Event::FinDone { conn } => cs[conn].fin_done = true,
            }
        }
    }
    st.jitter_ns = ep.jitter_ns();
    ep.close();
    Ok(st)
}

/// Connection setup, client side: until the budget is spent, `once`
/// opens a connection, exchanges 8 bytes and closes it (returning whether
/// the answer checked out); each one's time goes into `rtts_ns`.
pub(crate) fn setups(
    job: &Job<'_>,
    mut once: impl FnMut() -> Result<bool, Error>,
) -> Result<Stats, Error> {
    let mut meter = Meter::new(job.spec.budget, false, job.tick);
    let mut st = Stats::default();
    let mut n = 0u64;
    while meter.more(n) && n < MAX_SETUPS {
        let t = Instant::now();
        let ok = once()?;
        let ns = t.elapsed().as_nanos() as u64;
        st.active_now(t);
        st.active_now(Instant::now());
        st.received(job.epoch, 8, ok);
        st.rtts_ns.push(ns);
        st.sent += 1;
        n += 1;
    }
    Ok(st)
}

/// Runs `f` on every item, each in its own thread, and merges what they
/// measured; the first error wins.
pub(crate) fn run_threads<T: Send>(
    items: Vec<T>,
    f: impl Fn(usize, T) -> Result<Stats, Error> + Sync,
) -> Result<Stats, Error> {
    let f = &f;
    std::thread::scope(|sc| {
        let hs: Vec<_> = items
            .into_iter()
            .enumerate()
            .map(|(i, x)| sc.spawn(move || f(i, x)))
            .collect();
        let mut all = Stats::default();
        let mut err = None;
        for h in hs {
            match h.join() {
                Ok(Ok(s)) => all.merge(s),
                Ok(Err(e)) => {
                    err.get_or_insert(e);
                }
                Err(_) => {
                    err.get_or_insert(Error::msg("a test thread panicked"));
                }
            }
        }
        err.map_or(Ok(all), Err)
    })
}

/// Lets `n` threads start together once all are connected; a thread that
/// failed to connect opens the gate for the others, which then stop.
#[derive(Debug, Default)]
pub(crate) struct Gate {
    n: usize,
    arrived: AtomicUsize,
    failed: AtomicBool,
}

impl Gate {
    pub(crate) fn new(n: usize) -> Self {
        Self {
            n,
            ..Self::default()
        }
    }

    /// Arrives with this thread's result and waits for the others (at most
    /// [`IDLE`]); fails if any thread failed.
    pub(crate) fn pass<T>(&self, r: Result<T, Error>) -> Result<T, Error> {
        if r.is_err() {
            self.failed.store(true, Ordering::SeqCst);
            return r;
        }
        self.arrived.fetch_add(1, Ordering::SeqCst);
        let end = Instant::now() + IDLE;
        while self.arrived.load(Ordering::SeqCst) < self.n {
            if self.failed.load(Ordering::SeqCst) {
                return Err(Error::msg("another connection of this test failed"));
            }
            if Instant::now() >= end {
                return Err(Error::msg(
                    "the other connections of this test did not come up",
                ));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        r
    }
}

/// Deals `v` to `hands` hands: item `i` to hand `i % hands`.
pub(crate) fn deal<T>(v: Vec<T>, hands: usize) -> Vec<Vec<T>> {
    let mut out: Vec<Vec<T>> = (0..hands.max(1)).map(|_| Vec::new()).collect();
    let n = out.len();
    for (i, x) in v.into_iter().enumerate() {
        out[i % n].push(x);
    }
    out
}

/// Deals a server's `conns` to `threads` endpoints, each built by `make`
/// from its connections (as by [`deal`]).
pub(crate) fn endpoints<T, E: Endpoint + 'static>(
    conns: Vec<T>,
    threads: usize,
    make: impl Fn(Vec<T>) -> Result<E, Error>,
) -> Result<Vec<Box<dyn Endpoint>>, Error> {
    deal(conns, threads)
        .into_iter()
        .map(|c| Ok(Box::new(make(c)?) as Box<dyn Endpoint>))
        .collect()
}

/// How many of `n` connections each of `threads` threads gets when they
/// are dealt as by [`deal`].
pub(crate) fn spread(n: usize, threads: usize) -> Vec<usize> {
    let threads = threads.max(1);
    (0..threads)
        .map(|g| n / threads + usize::from(g < n % threads))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{Budget, ProgressMode, Test, Transport};
    use crate::transports;

    /// An in-memory endpoint pair (one connection): a message started on
    /// one side arrives at the other on its next poll; FINs likewise.
    struct Mem {
        tx: std::sync::mpsc::Sender<Msg>,
        rx: std::sync::mpsc::Receiver<Msg>,
    }

    #[derive(Debug)]
    enum Msg {
        Data,
        Fin,
    }

    impl Endpoint for Mem {
        fn conns(&self) -> usize {
            1
        }
        fn ready(&self, _: usize) -> bool {
            true
        }
        fn start(&mut self, _: usize, _: u64) -> Result<bool, Error> {
            self.tx.send(Msg::Data).map_err(Error::msg)?;
            Ok(false)
        }
        fn echo(&mut self, _: usize) -> Result<(), Error> {
            self.tx.send(Msg::Data).map_err(Error::msg)
        }
        fn fin(&mut self, _: usize, _: u64) -> Result<bool, Error> {
            self.tx.send(Msg::Fin).map_err(Error::msg)?;
            Ok(true)
        }
        fn poll(&mut self, until: Instant, out: &mut Vec<Event>) -> Result<(), Error> {
            let wait = until.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(wait) {
                Ok(Msg::Data) => out.push(Event::Arrived {
                    conn: 0,
                    len: 8,
                    ok: true,
                    answer: true,
                }),
                Ok(Msg::Fin) => out.push(Event::PeerFin { conn: 0 }),
                Err(_) => {}
            }
            Ok(())
        }
    }

    fn pair() -> (Mem, Mem) {
        let (a_tx, b_rx) = std::sync::mpsc::channel();
        let (b_tx, a_rx) = std::sync::mpsc::channel();
        (Mem { tx: a_tx, rx: a_rx }, Mem { tx: b_tx, rx: b_rx })
    }

    fn spec(test: Test, t: Transport) -> Spec {
        Spec {
            test,
            transport: t,
            crc: false,
            size: 8,
            window: 4,
            conns: 1,
            progress: ProgressMode::Caller,
            busy_poll_us: 0,
            client_pin: None,
            pin: None,
            verify: false,
            budget: Budget::Iters(100),
            rate: 0,
        }
    }

    fn both_sides(test: Test) -> (Stats, Stats) {
        let s = spec(test, transports::find("tcp").expect("tcp is registered"));
        let (roles, epoch, noop) = (s.roles(), Instant::now(), |_: f64| {});
        let (mut a, mut b) = pair();
        std::thread::scope(|sc| {
            let srv = sc.spawn(|| {
                let job = Job {
                    spec: &s,
                    role: roles.1,
                    epoch,
                    tick: &noop,
                };
                run(&job, &mut b).unwrap()
            });
            let job = Job {
                spec: &s,
                role: roles.0,
                epoch,
                tick: &noop,
            };
            (run(&job, &mut a).unwrap(), srv.join().unwrap())
        })
    }

    #[test]
    fn ping_pong_counts_every_round_trip_once() {
        let (c, s) = both_sides(Test::Lat);
        // 100 measured plus 5 % warm-up.
        assert_eq!((c.sent, c.rtts_ns.len()), (105, 100));
        assert_eq!((c.rx.msgs, s.rx.msgs), (105, 105));
        assert!(c.elapsed() > Duration::ZERO);
    }

    #[test]
    fn a_source_sends_its_budget_and_both_fins_end_it() {
        let (c, s) = both_sides(Test::Bw);
        assert_eq!((c.sent, s.rx.msgs, s.rx.verified), (100, 100, 800));
        assert!(c.rtts_ns.is_empty() && s.sent == 0);
    }

    #[test]
    fn dealing_and_spreading_agree() {
        let hands = deal((0..10).collect::<Vec<_>>(), 3);
        assert_eq!(hands[0], vec![0, 3, 6, 9]);
        let lens: Vec<usize> = hands.iter().map(Vec::len).collect();
        assert_eq!(lens, spread(10, 3));
    }
}
