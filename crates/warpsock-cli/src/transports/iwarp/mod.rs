//! `send`, `write`, `read`: warpsock iWARP, `k` queue pairs per thread on
//! one context and one completion queue, CRC32c off or on per row.
//!
//! Messages on a queue pair besides the data (all are RDMAP Sends):
//!
//! * **FIN**: Send with Solicited Event, 8 bytes: the count of data
//!   messages the side originated. Every side keeps one receive of its
//!   peer for it.
//! * **NOTIFY** (RDMA Write latency, both ways): zero-byte Send right after
//!   each Write, so the target learns that the Write was placed (iWARP has
//!   no Write with Immediate). The Write latency is thus "Write + notify".
//! * **CREDIT** (Send bandwidth, sink → source): zero-byte Send, one per
//!   [`credit_batch`] data receives the sink has reposted. iWARP has no
//!   receiver-not-ready retry: a Send that finds no receive kills the
//!   connection, so the sender keeps count.
//!
//! Tests (roles and the FIN exchange: [`crate::driver`]):
//!
//! * Send latency: the pinger Sends `size` bytes, the ponger Sends the
//!   same receive buffer back; the pinger measures from post to its receive
//!   completion.
//! * Write latency: Write + NOTIFY to the peer's region, the ponger checks
//!   it and Writes its region back into the pinger's + NOTIFY.
//! * Read latency: one RDMA Read of `size` bytes from the peer's region.
//! * Bandwidth: `window` Sends / Writes / Reads in flight per queue pair
//!   until the budget is spent, then the FINs. Memory is touched as a TCP
//!   program that reuses one buffer touches it: each Send or Write is
//!   gathered from its own 16-byte stamp slot plus one body shared by all
//!   messages of the thread (see [`crate::data`]), Send receives scatter
//!   the same way, every Write of a connection goes to its one target
//!   region (which must hold the last Write, in full, when the FIN
//!   arrives), and every Read lands in one region, checked against the
//!   source's constant stamp.
//!
//! Connections go to the server's data port; the MPA Request's private
//! data is token(8) addr(8, BE) rkey(4, BE) of the client's region, the
//! Reply's is addr(8) rkey(4) of the server's region and the server's
//! receive credits(4).

mod group;
mod setup;

use std::time::{Duration, Instant};

use warpsock_engine::{SendOp, SendWr, Sgl, Wc, WcOpcode};

use crate::driver::{self, Addrs, Endpoint, Event, Job, Link, Listeners, Ready, IDLE};
use crate::spec::{Family, Role, TransportInfo};
use crate::stats::Stats;
use crate::Error;
use group::{
    accept_into, connect_one, credit_batch, describe, send_wr, split_id, wr_id, Group, Peer,
    K_DATA, K_ECHO, K_FIN, K_QUIET,
};

/// The RDMA operation that carries the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Send,
    Write,
    Read,
}

/// An iWARP transport: its description and its operation.
pub(crate) struct Iwarp {
    info: &'static TransportInfo,
    op: Op,
}

const fn info(
    name: &'static str,
    label: &'static str,
    help: &'static str,
    pull: bool,
    quick: bool,
    setup: bool,
) -> TransportInfo {
    TransportInfo {
        name,
        label,
        help,
        family: Family::Rdma,
        crc: true,
        pull,
        baseline: "tcp",
        quick,
        setup,
        preload: None,
    }
}

static SEND_INFO: TransportInfo = info(
    "send",
    "warpsock Send",
    "warpsock RDMAP Send into posted receives",
    false,
    true,
    true,
);
static WRITE_INFO: TransportInfo = info(
    "write",
    "warpsock RDMA Write",
    "warpsock RDMA Write into the peer's registered region",
    false,
    true,
    false,
);
static READ_INFO: TransportInfo = info(
    "read",
    "warpsock RDMA Read",
    "warpsock RDMA Read from the peer's registered region",
    true,
    true,
    false,
);

/// `send`: Sends into posted receives (its connection-setup row stands
/// for warpsock's setup).
pub(crate) static SEND: Iwarp = Iwarp {
    info: &SEND_INFO,
    op: Op::Send,
};
/// `write`: RDMA Writes into the peer's region.
pub(crate) static WRITE: Iwarp = Iwarp {
    info: &WRITE_INFO,
    op: Op::Write,
};
/// `read`: RDMA Reads of the peer's region.
pub(crate) static READ: Iwarp = Iwarp {
    info: &READ_INFO,
    op: Op::Read,
};

impl Link for Iwarp {
    fn info(&self) -> &'static TransportInfo {
        self.info
    }

    fn connect(&self, job: &Job<'_>, to: &Addrs) -> Result<Box<dyn Endpoint>, Error> {
        let (g, p) = connect_one(to.data, to.token, job.spec, self.op, job.role)?;
        Ok(Box::new(IwarpEndpoint::new(job, g, vec![p])?))
    }

    fn accept(
        &self,
        job: &Job<'_>,
        at: &Listeners<'_>,
        threads: usize,
        ready: Ready<'_>,
    ) -> Result<Vec<Box<dyn Endpoint>>, Error> {
        // Memory registered and receives ready before the client connects.
        let groups = driver::spread(job.spec.conns, threads)
            .into_iter()
            .map(|k| Group::new(job.spec, self.op, job.role, k))
            .collect::<Result<Vec<_>, _>>()?;
        ready()?;
        let peers = accept_into(at.data, at.token, &groups, job.spec.conns)?;
        groups
            .into_iter()
            .zip(peers)
            .map(|(g, p)| Ok(Box::new(IwarpEndpoint::new(job, g, p)?) as Box<dyn Endpoint>))
            .collect()
    }

    fn setup_client(&self, job: &Job<'_>, to: &Addrs) -> Result<Stats, Error> {
        setup::client(job, to.data, to.token)
    }

    fn setup_serve(
        &self,
        job: &Job<'_>,
        at: &Listeners<'_>,
        ready: Ready<'_>,
    ) -> Result<Stats, Error> {
        setup::serve(job, at.data, at.token, ready)
    }
}

/// One connection's transport state (the driver keeps the rest).
struct ConnState {
    /// Free tx slots (local indices).
    free: Vec<usize>,
    /// Send credits left (Send sources).
    avail: usize,
    /// RDMA Reads in flight (pull bandwidth).
    reads: usize,
    /// The last message started (what an answer must carry).
    tx_seq: u64,
    /// Data messages received (what the next one must carry).
    rx_seq: u64,
    since_credit: usize,
    /// Send pong: the receive slot that waits to be echoed.
    echo_slot: Option<usize>,
    fin_done: bool,
    peer_fin: bool,
}

/// One thread's queue pairs.
struct IwarpEndpoint {
    g: Group,
    peers: Vec<Peer>,
    cs: Vec<ConnState>,
    role: Role,
    batch: usize,
}

impl IwarpEndpoint {
    fn new(job: &Job<'_>, g: Group, peers: Vec<Peer>) -> Result<Self, Error> {
        let w = job.spec.window;
        let cs: Vec<ConnState> = peers
            .iter()
            .map(|p| ConnState {
                free: (0..w).rev().collect(),
                // The peer keeps one more receive for our FIN.
                avail: p.remote.credits,
                reads: 0,
                tx_seq: 0,
                rx_seq: 0,
                since_credit: 0,
                echo_slot: None,
                fin_done: false,
                peer_fin: false,
            })
            .collect();
        if g.op == Op::Send
            && matches!(job.role, Role::Source | Role::Both)
            && cs.iter().any(|c| c.avail == 0)
        {
            return Err(Error::msg("the peer offers no receive credits"));
        }
        Ok(Self {
            g,
            peers,
            cs,
            role: job.role,
            batch: credit_batch(w),
        })
    }

    /// Handles one completion.
    fn complete(&mut self, wc: Wc, out: &mut Vec<Event>) -> Result<(), Error> {
        let (role, op, batch) = (self.role, self.g.op, self.batch);
        let (size, verify) = (self.g.spec.size, self.g.spec.verify);
        let (i, kind, slot) = split_id(wc.wr_id);
        let g = &self.g;
        let c = &mut self.cs[i];
        let p = &self.peers[i];
        if !wc.is_ok() {
            if c.fin_done && c.peer_fin {
                // The peer closed after both FINs: receives flush.
                return Ok(());
            }
            return Err(describe(&wc, &p.qp));
        }
        let arrived = |len, ok, answer| Event::Arrived {
            conn: i,
            len,
            ok,
            answer,
        };
        match (wc.opcode, kind) {
            (WcOpcode::Recv, _) => {
                let gs = i * g.rx_n + slot;
                let len = wc.byte_len as usize;
                if wc.solicited {
                    let v = g.rx.head_u64(gs);
                    c.peer_fin = true;
                    if op == Op::Write && matches!(role, Role::Sink | Role::Both) {
                        // Writes raise nothing here, and all went to the
                        // one region: it must hold the last one, in full.
                        let ok = v > 0 && g.region_ok(i, v - 1);
                        out.push(Event::ArrivedMany {
                            conn: i,
                            n: v,
                            len: size,
                            ok,
                        });
                    }
                    out.push(Event::PeerFin { conn: i });
                    return Ok(());
                }
                match (role, op, len) {
                    (Role::Source | Role::Both, Op::Send, 0) => c.avail += batch,
                    (Role::Ping, Op::Write, 0) => {
                        out.push(arrived(size, g.region_ok(i, c.tx_seq), true));
                    }
                    (Role::Pong, Op::Write, 0) => {
                        out.push(arrived(size, g.region_ok(i, c.rx_seq), false));
                        c.rx_seq += 1;
                    }
                    (Role::Sink | Role::Both, Op::Send, _) => {
                        out.push(arrived(len, g.rx.check(gs, len, c.rx_seq, verify), false));
                        c.rx_seq += 1;
                        c.since_credit += 1;
                        if c.since_credit == batch {
                            c.since_credit = 0;
                            p.qp.post_send(send_wr(
                                wr_id(i, K_QUIET, 0),
                                Sgl::new(),
                                false,
                                false,
                            ))?;
                        }
                    }
                    (Role::Pong, Op::Send, _) => {
                        out.push(arrived(len, g.rx.check(gs, len, c.rx_seq, verify), false));
                        c.rx_seq += 1;
                        // Echoed from the receive buffer, reposted once sent.
                        c.echo_slot = Some(slot);
                        return Ok(());
                    }
                    (Role::Ping, Op::Send, _) => {
                        out.push(arrived(len, g.rx.check(gs, len, c.tx_seq, verify), true));
                    }
                    _ => return Err(Error::msg("unexpected Send from the peer")),
                }
                p.qp.post_recv(g.recv_wr(i, slot))?;
            }
            (WcOpcode::RdmaRead, K_DATA) => {
                let ping = role == Role::Ping;
                out.push(arrived(wc.byte_len as usize, g.sink_ok(i), ping));
                if !ping {
                    c.reads -= 1;
                    out.push(Event::Sent { conn: i });
                }
            }
            (_, K_DATA) => {
                c.free.push(slot);
                out.push(Event::Sent { conn: i });
            }
            (_, K_FIN) => {
                c.fin_done = true;
                out.push(Event::FinDone { conn: i });
            }
            (_, K_ECHO) => p.qp.post_recv(g.recv_wr(i, slot))?,
            _ => {}
        }
        Ok(())
    }
}

impl Endpoint for IwarpEndpoint {
    fn conns(&self) -> usize {
        self.peers.len()
    }

    fn ready(&self, conn: usize) -> bool {
        let c = &self.cs[conn];
        match (self.role, self.g.op) {
            (Role::Ping, _) => true,
            (_, Op::Read) => c.reads < self.g.spec.window,
            (_, Op::Send) => !c.free.is_empty() && c.avail > 0,
            (_, Op::Write) => !c.free.is_empty(),
        }
    }

    fn start(&mut self, conn: usize, seq: u64) -> Result<bool, Error> {
        let (g, i) = (&self.g, conn);
        let p = &self.peers[i];
        let c = &mut self.cs[i];
        c.tx_seq = seq;
        if self.role == Role::Ping {
            post_ping(g, p, i, seq)?;
            return Ok(false);
        }
        if g.op == Op::Read {
            p.read_into(g, i)?;
            c.reads += 1;
            return Ok(true);
        }
        let slot = c.free.pop().expect("ready() checked a free slot");
        let gs = i * g.spec.window + slot;
        g.tx.stamp(gs, seq);
        let id = wr_id(i, K_DATA, slot);
        let wr = if g.op == Op::Send {
            c.avail -= 1;
            send_wr(id, g.tx.sgl(gs), false, true)
        } else {
            SendWr {
                wr_id: id,
                op: SendOp::Write {
                    remote_addr: p.remote.addr,
                    rkey: p.remote.rkey,
                },
                sgl: g.tx.sgl(gs),
                signaled: true,
            }
        };
        p.qp.post_send(wr)?;
        Ok(true)
    }

    fn echo(&mut self, conn: usize) -> Result<(), Error> {
        let (g, i) = (&self.g, conn);
        let p = &self.peers[i];
        match g.op {
            Op::Send => {
                if let Some(slot) = self.cs[i].echo_slot.take() {
                    p.qp.post_send(send_wr(
                        wr_id(i, K_ECHO, slot),
                        g.rx.sgl(i * g.rx_n + slot),
                        false,
                        true,
                    ))?;
                }
            }
            Op::Write => {
                p.write_notify(i, g.region.sge(i * g.region_len, g.spec.size as u32).into())?;
            }
            // The pinger reads; nothing arrives here to echo.
            Op::Read => {}
        }
        Ok(())
    }

    fn fin(&mut self, conn: usize, count: u64) -> Result<bool, Error> {
        let i = conn;
        self.g.ctl.write(8 * i, &count.to_le_bytes());
        self.peers[i].qp.post_send(send_wr(
            wr_id(i, K_FIN, 0),
            self.g.ctl.sge(8 * i, 8).into(),
            true,
            true,
        ))?;
        Ok(false)
    }

    fn poll(&mut self, until: Instant, out: &mut Vec<Event>) -> Result<(), Error> {
        let n = self.g.wait(until)?;
        for k in 0..n {
            let wc = self.g.wcs[k];
            self.complete(wc, out)?;
        }
        Ok(())
    }

    /// Disconnects and keeps receiving until each peer has closed too (or
    /// [`IDLE`] passes).
    ///
    /// Both FINs being through does not make dropping safe: our FIN may
    /// still sit in the socket's send buffer (a completion means handed to
    /// TCP, not delivered), while the peer's credits or data keep
    /// arriving. Closing a socket with input unread, or with input still to
    /// come, makes the kernel reset the connection, which discards that FIN
    /// before the peer has read it; the peer then fails with its receives
    /// flushed. A graceful disconnect sends FIN after everything queued and
    /// discards (but reads) input until the peer's FIN, so the final close
    /// is clean.
    fn close(&mut self) {
        if std::env::var_os("WARPSOCK_ENGINE_STATS").is_some() {
            eprintln!("{}", group::engine_stats(&self.g, &self.peers));
        }
        for p in &self.peers {
            p.qp.disconnect();
        }
        let deadline = Instant::now() + IDLE;
        while self.peers.iter().any(|p| !p.qp.is_closed()) && Instant::now() < deadline {
            // Completions now are flushes of what was still posted: ignored.
            if self.g.cq.wait(&mut self.g.wcs, CLOSE_POLL).is_err() {
                break;
            }
        }
    }
}

/// Wait slice while [`IwarpEndpoint::close`] drains.
const CLOSE_POLL: Duration = Duration::from_millis(10);

/// Posts ping `seq` on connection `i`.
fn post_ping(g: &Group, p: &Peer, i: usize, seq: u64) -> Result<(), Error> {
    match g.op {
        Op::Send => {
            g.tx.stamp(i, seq);
            p.qp.post_send(send_wr(wr_id(i, K_QUIET, 0), g.tx.sgl(i), false, false))?;
        }
        Op::Write => {
            g.tx.stamp(i, seq);
            p.write_notify(i, g.tx.sgl(i))?;
        }
        Op::Read => {
            g.spoil_sink(i);
            p.read_into(g, i)?;
        }
    }
    Ok(())
}
