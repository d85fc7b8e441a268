//! `riowrite`: one-sided RDMA Writes through the extended sockets
//! interface — both processes under `LD_PRELOAD=libwarpsock_preload.so`,
//! each data connection switched into DDP mode as in [`super::ddp_socket`],
//! then the data moved with `warpsock_aio_write` into a buffer the peer
//! mapped with `warpsock_riomap` (`warpsock_sockets.h`). It is compared
//! with the engine's own RDMA Write (`write`), the same operation without
//! the sockets layer; CRC off like it.
//!
//! Setup: each side maps one `size`-byte region for the peer's Writes and
//! sends its offset (8 bytes, little endian) on the stream; the peer may
//! write once it has read it (the header's rule). Every Write of a
//! connection goes to the peer's one region, as the engine's `write` does.
//!
//! Besides the Writes, the stream carries 16-byte records (kind, value;
//! little endian), each sent with `warpsock_aio_send` after the Write it
//! follows, so it arrives after that Write is placed:
//!
//! * **NOTIFY** (latency, both ways): after each Write, so the target
//!   learns that it was placed (the `write` transport's "Write + notify").
//! * **FIN**: the count of data messages the side originated. A sink
//!   checks then that its region holds the last of them, in full.
//!
//! Memory is touched as the `write` baseline touches it (see
//! [`crate::data`]): a message of [`data::gathered`] size is one Write
//! with a three-entry gather list, as the engine's (`warpsock_aio_writev`)
//! — its 8-byte head stamp, the body from one buffer shared by every
//! message of the connection, its 8-byte tail stamp — so a window of
//! 1 MiB messages reads 1 MiB plus 16 bytes a message, not a megabyte per
//! message in flight, and each message is one post, one transmit round and
//! one completion (three `warpsock_aio_write`s transmitted one by one: 5.5
//! `sendmsg` per MiB against the engine's 1.7).
//!
//! Operations in flight (Writes, plus records) each own their buffer
//! until their completion is collected with `warpsock_aio_poll`; the
//! socket is readable while completions wait, so one `poll` on the
//! connections' descriptors waits for both completions and records.

use std::ffi::{c_int, c_void, CStr};
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::ddp_socket::{accept_switched, connect_switched};
use super::sock::{poll_sockets, Pass};
use crate::data;
use crate::driver::{self, Addrs, Endpoint, Event, Job, Link, Listeners, Ready, IDLE};
use crate::spec::{Family, Role, TransportInfo};
use crate::Error;

/// What it is.
pub(crate) static INFO: TransportInfo = TransportInfo {
    name: "riowrite",
    label: "DDP riowrite",
    help: "one-sided RDMA Writes through the extended sockets interface \
           (warpsock_riomap + warpsock_aio_writev on sockets switched into DDP \
           mode, both sides under the preload), CRC off",
    family: Family::Stream,
    crc: false,
    pull: false,
    baseline: "write",
    quick: false,
    setup: false,
    preload: Some(&[("WARPSOCK_CRC", "0")]),
};

/// The transport.
pub(crate) struct RioWrite;

/// `warpsock_sockets.h`.
const PROT_WRITE: c_int = libc::PROT_WRITE;
const AIO_SEND: i32 = 1;
const AIO_WRITE: i32 = 3;

/// `struct warpsock_aio_completion`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct AioCompletion {
    cookie: u64,
    op: i32,
    error: i32,
    result: i64,
    flags: i32,
    reserved: i32,
}

type RiomapFn = unsafe extern "C" fn(c_int, *mut c_void, usize, c_int, c_int, i64) -> i64;
type RiounmapFn = unsafe extern "C" fn(c_int, *mut c_void, usize) -> c_int;
type AioWriteFn = unsafe extern "C" fn(c_int, *const c_void, usize, i64, u64) -> c_int;
type AioWritevFn = unsafe extern "C" fn(c_int, *const libc::iovec, c_int, i64, u64) -> c_int;
type AioSendFn = unsafe extern "C" fn(c_int, *const c_void, usize, u64) -> c_int;
type AioPollFn = unsafe extern "C" fn(c_int, *mut AioCompletion, c_int) -> c_int;

/// The extended calls, found in the preloaded library.
struct Api {
    riomap: RiomapFn,
    riounmap: RiounmapFn,
    aio_write: AioWriteFn,
    aio_writev: AioWritevFn,
    aio_send: AioSendFn,
    aio_poll: AioPollFn,
}

/// `WARPSOCK_SOCKETS_ABI` of the header this transport follows (the
/// layout of [`AioCompletion`]; a test checks it against the header).
const SOCKETS_ABI: i32 = 2;

type AbiFn = unsafe extern "C" fn() -> c_int;

/// Whether a library that reports ABI `lib` (`None`: it exports no
/// `warpsock_sockets_abi`, being older than that call) lays out
/// completions as this transport reads them; if not, why, naming both
/// versions. A library of another ABI is refused at load: its completions
/// would be misread silently (the session-19 library under the session-20
/// CLI: "a completion with a foreign cookie", BENCHMARKS.md section 6).
fn check_abi(lib: Option<i32>) -> Result<(), String> {
    let fix = "run it with the libwarpsock_preload.so built with this warpsock";
    match lib {
        Some(v) if v == SOCKETS_ABI => Ok(()),
        Some(v) => Err(format!(
            "riowrite: the preloaded library has extended sockets ABI {v} \
             (warpsock_sockets_abi), this warpsock was built for ABI {SOCKETS_ABI} \
             (WARPSOCK_SOCKETS_ABI): struct warpsock_aio_completion differs \
             between them; {fix}"
        )),
        None => Err(format!(
            "riowrite: the preloaded library reports no extended sockets ABI \
             (no warpsock_sockets_abi: older than that call, ABI 1 or an early \
             ABI 2), this warpsock was built for ABI {SOCKETS_ABI} \
             (WARPSOCK_SOCKETS_ABI); {fix}"
        )),
    }
}

/// The calls, or why they are missing or cannot be used.
fn api() -> Result<&'static Api, Error> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    let found = API.get_or_init(|| {
        let sym = |name: &CStr| {
            // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name.
            let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
            (!p.is_null()).then_some(p)
        };
        // SAFETY: each symbol is the function of warpsock_sockets.h with
        // the signature declared above.
        let api = unsafe {
            (|| {
                Some(Api {
                    riomap: std::mem::transmute::<*mut c_void, RiomapFn>(sym(c"warpsock_riomap")?),
                    riounmap: std::mem::transmute::<*mut c_void, RiounmapFn>(sym(
                        c"warpsock_riounmap",
                    )?),
                    aio_write: std::mem::transmute::<*mut c_void, AioWriteFn>(sym(
                        c"warpsock_aio_write",
                    )?),
                    aio_writev: std::mem::transmute::<*mut c_void, AioWritevFn>(sym(
                        c"warpsock_aio_writev",
                    )?),
                    aio_send: std::mem::transmute::<*mut c_void, AioSendFn>(sym(
                        c"warpsock_aio_send",
                    )?),
                    aio_poll: std::mem::transmute::<*mut c_void, AioPollFn>(sym(
                        c"warpsock_aio_poll",
                    )?),
                })
            })()
        };
        let api = api.ok_or_else(|| {
            "riowrite needs the extended sockets calls (warpsock_riomap, \
             warpsock_aio_write, ...): run under LD_PRELOAD=libwarpsock_preload.so"
                .to_string()
        })?;
        let abi = sym(c"warpsock_sockets_abi").map(|p| {
            // SAFETY: `int warpsock_sockets_abi(void)` of warpsock_sockets.h;
            // it touches nothing.
            unsafe { std::mem::transmute::<*mut c_void, AbiFn>(p)() }
        });
        check_abi(abi)?;
        Ok(api)
    });
    found.as_ref().map_err(Error::msg)
}

/// The errno of a failed extended call, named.
fn failed(what: &str) -> Error {
    Error::msg(format!("{what}: {}", io::Error::last_os_error()))
}

/// Record kinds on the stream.
const NOTIFY: u64 = 1;
const FIN: u64 = 2;
/// Cookie kinds (high 32 bits; the low 32 bits are a slot).
const C_DATA: u64 = 1;
const C_ECHO: u64 = 2;
const C_REC: u64 = 3;

fn cookie(kind: u64, slot: usize) -> u64 {
    kind << 32 | slot as u64
}

/// One connection's state.
struct Conn {
    s: TcpStream,
    /// The region the peer writes into, and the peer's offset for ours.
    rx: Box<[u8]>,
    peer_off: i64,
    /// The message buffers and which slots are free.
    tx: TxMem,
    free: Vec<usize>,
    /// Record buffers, one per record in flight, and which are free.
    recs: Vec<[u8; 16]>,
    free_recs: Vec<usize>,
    /// Operations posted and not yet completed (buffers lent out).
    in_flight: usize,
    /// A record being read from the stream.
    rec_in: [u8; 16],
    rec_off: usize,
    /// The last message started (what an answer must carry).
    tx_seq: u64,
    /// Messages whose NOTIFY arrived (pong).
    rx_seq: u64,
    /// Pong: a message waits to be echoed.
    echo_due: bool,
    /// The FIN is posted; its completion gives `FinDone`.
    fin_sent: bool,
    peer_fin: bool,
}

/// What a connection sends its messages from.
enum TxMem {
    /// Small messages: one whole buffer per message in flight.
    Whole(Vec<Box<[u8]>>),
    /// [`data::gathered`] sizes: one body shared by every message, and a
    /// 16-byte stamp slot (head, tail) per message in flight.
    Gathered {
        body: Box<[u8]>,
        stamps: Vec<[u8; 16]>,
    },
}

impl TxMem {
    fn new(size: usize, window: usize) -> Self {
        let mut proto = vec![0u8; size].into_boxed_slice();
        data::fill(&mut proto);
        if data::gathered(size) {
            Self::Gathered {
                body: proto,
                stamps: vec![[0u8; 16]; window],
            }
        } else {
            Self::Whole((0..window).map(|_| proto.clone()).collect())
        }
    }

    /// Stamps message `seq` into `slot` and returns its pieces in order:
    /// (source, length, offset in the peer's region), contiguous from
    /// offset 0 — one Write's gather list. The sources stay valid and
    /// unchanged while the slot is in flight (`stamps` and `body` never
    /// move or grow).
    fn message(&mut self, slot: usize, seq: u64) -> Vec<(*const u8, usize, usize)> {
        match self {
            Self::Whole(bufs) => {
                data::stamp(&mut bufs[slot], seq);
                vec![(bufs[slot].as_ptr(), bufs[slot].len(), 0)]
            }
            Self::Gathered { body, stamps } => {
                let st = &mut stamps[slot];
                st[..8].copy_from_slice(&seq.to_le_bytes());
                st[8..].copy_from_slice(&seq.to_le_bytes());
                let size = body.len();
                vec![
                    (st.as_ptr(), 8, 0),
                    (body[8..].as_ptr(), size - 16, 8),
                    (st[8..].as_ptr(), 8, size - 8),
                ]
            }
        }
    }
}

/// One thread's connections.
struct RioEndpoint {
    api: &'static Api,
    conns: Vec<Conn>,
    role: Role,
    size: usize,
    verify: bool,
    busy: Duration,
}

/// Maps a fresh region for the peer's Writes on `s`, sends its offset and
/// reads the peer's.
fn exchange(api: &Api, s: &mut TcpStream, size: usize) -> Result<(Box<[u8]>, i64), Error> {
    let mut rx = vec![0u8; size].into_boxed_slice();
    // SAFETY: the region stays allocated (and is unmapped) for the
    // connection's life: `Conn` owns it and unmaps it before dropping it.
    let off = unsafe {
        (api.riomap)(
            s.as_raw_fd(),
            rx.as_mut_ptr().cast(),
            size,
            PROT_WRITE,
            0,
            -1,
        )
    };
    if off < 0 {
        return Err(failed("warpsock_riomap of the receive region"));
    }
    s.write_all(&off.to_le_bytes())?;
    let mut peer = [0u8; 8];
    s.set_read_timeout(Some(IDLE))?;
    s.read_exact(&mut peer)
        .map_err(|e| Error::msg(format!("reading the peer's mapping: {e}")))?;
    s.set_read_timeout(None)?;
    Ok((rx, i64::from_le_bytes(peer)))
}

impl RioEndpoint {
    fn new(job: &Job<'_>, streams: Vec<TcpStream>) -> Result<Self, Error> {
        let api = api()?;
        let spec = job.spec;
        let window = spec.window.max(1);
        let mut conns = Vec::with_capacity(streams.len());
        for mut s in streams {
            let (rx, peer_off) = exchange(api, &mut s, spec.size)?;
            s.set_nonblocking(true)?;
            conns.push(Conn {
                s,
                rx,
                peer_off,
                tx: TxMem::new(spec.size, window),
                free: (0..window).rev().collect(),
                // A NOTIFY per Write in flight, an echo's, and the FIN.
                recs: vec![[0u8; 16]; window + 2],
                free_recs: (0..window + 2).rev().collect(),
                in_flight: 0,
                rec_in: [0; 16],
                rec_off: 0,
                tx_seq: 0,
                rx_seq: 0,
                echo_due: false,
                fin_sent: false,
                peer_fin: false,
            });
        }
        Ok(Self {
            api,
            conns,
            role: job.role,
            size: spec.size,
            verify: spec.verify,
            busy: spec.busy_poll(),
        })
    }

    /// Whether this role tells the peer of every Write (latency).
    fn notifies(&self) -> bool {
        matches!(self.role, Role::Ping | Role::Pong)
    }

    /// Posts a Write of `len` bytes at `buf` to offset `at` of the peer's
    /// region.
    fn post_write(
        &mut self,
        i: usize,
        (buf, len, at): (*const u8, usize, usize),
        c: u64,
    ) -> Result<(), Error> {
        let conn = &mut self.conns[i];
        // SAFETY: `buf` is `len` bytes the connection owns and keeps
        // unchanged until this operation's completion is collected.
        let r = unsafe {
            (self.api.aio_write)(
                conn.s.as_raw_fd(),
                buf.cast(),
                len,
                conn.peer_off + at as i64,
                c,
            )
        };
        if r != 0 {
            return Err(failed("warpsock_aio_write"));
        }
        conn.in_flight += 1;
        Ok(())
    }

    /// Posts message pieces `parts` (contiguous, see [`TxMem::message`]) as
    /// one Write: a gather list goes with `warpsock_aio_writev`.
    fn post_message(
        &mut self,
        i: usize,
        parts: &[(*const u8, usize, usize)],
        c: u64,
    ) -> Result<(), Error> {
        if let [one] = parts {
            return self.post_write(i, *one, c);
        }
        let iov: Vec<libc::iovec> = parts
            .iter()
            .map(|&(p, n, _)| libc::iovec {
                iov_base: p.cast_mut().cast(),
                iov_len: n,
            })
            .collect();
        let conn = &mut self.conns[i];
        // SAFETY: each piece is bytes the connection owns and keeps
        // unchanged until this operation's completion is collected; `iov`
        // is read during the call only.
        let r = unsafe {
            (self.api.aio_writev)(
                conn.s.as_raw_fd(),
                iov.as_ptr(),
                iov.len() as c_int,
                conn.peer_off + parts[0].2 as i64,
                c,
            )
        };
        if r != 0 {
            return Err(failed("warpsock_aio_writev"));
        }
        conn.in_flight += 1;
        Ok(())
    }

    /// Posts a record after what was posted before it.
    fn post_record(&mut self, i: usize, kind: u64, value: u64) -> Result<(), Error> {
        let conn = &mut self.conns[i];
        let slot = conn
            .free_recs
            .pop()
            .ok_or_else(|| Error::msg("riowrite: more records in flight than slots"))?;
        let rec = &mut conn.recs[slot];
        rec[..8].copy_from_slice(&kind.to_le_bytes());
        rec[8..].copy_from_slice(&value.to_le_bytes());
        // SAFETY: the record buffer does not move (`recs` never grows) and
        // stays the connection's, unused, until the completion returns it.
        let r = unsafe {
            (self.api.aio_send)(
                conn.s.as_raw_fd(),
                rec.as_ptr().cast(),
                16,
                cookie(C_REC, slot),
            )
        };
        if r != 0 {
            conn.free_recs.push(slot);
            return Err(failed("warpsock_aio_send of a record"));
        }
        conn.in_flight += 1;
        Ok(())
    }

    /// Collects connection `i`'s completions.
    fn complete(&mut self, i: usize, out: &mut Vec<Event>) -> Result<bool, Error> {
        let mut done = [AioCompletion::default(); 32];
        let conn = &mut self.conns[i];
        // SAFETY: `done` holds 32 entries.
        let n = unsafe { (self.api.aio_poll)(conn.s.as_raw_fd(), done.as_mut_ptr(), 32) };
        if n < 0 {
            return Err(failed("warpsock_aio_poll"));
        }
        for d in &done[..n as usize] {
            conn.in_flight -= 1;
            if d.error != 0 {
                let what = if d.op == AIO_WRITE { "Write" } else { "Send" };
                return Err(Error::msg(format!(
                    "riowrite: an asynchronous {what} failed: {}",
                    io::Error::from_raw_os_error(d.error)
                )));
            }
            let slot = (d.cookie & 0xffff_ffff) as usize;
            match d.cookie >> 32 {
                C_DATA => {
                    conn.free.push(slot);
                    out.push(Event::Sent { conn: i });
                }
                C_ECHO => {}
                C_REC if d.op == AIO_SEND => {
                    let kind = u64::from_le_bytes(conn.recs[slot][..8].try_into().expect("8"));
                    conn.free_recs.push(slot);
                    if kind == FIN {
                        out.push(Event::FinDone { conn: i });
                    }
                }
                _ => return Err(Error::msg("riowrite: a completion with a foreign cookie")),
            }
        }
        Ok(n > 0)
    }

    /// Reads connection `i`'s records.
    fn read(&mut self, i: usize, out: &mut Vec<Event>) -> Result<bool, Error> {
        let (role, size, verify) = (self.role, self.size, self.verify);
        let conn = &mut self.conns[i];
        let mut moved = false;
        while !conn.peer_fin {
            let off = conn.rec_off;
            match conn.s.read(&mut conn.rec_in[off..]) {
                Ok(0) => return Err(Error::msg("the peer closed the connection before its FIN")),
                Ok(n) => {
                    moved = true;
                    conn.rec_off += n;
                    if conn.rec_off < 16 {
                        continue;
                    }
                    conn.rec_off = 0;
                    let kind = u64::from_le_bytes(conn.rec_in[..8].try_into().expect("8"));
                    let value = u64::from_le_bytes(conn.rec_in[8..].try_into().expect("8"));
                    let arrived = |ok, answer| Event::Arrived {
                        conn: i,
                        len: size,
                        ok,
                        answer,
                    };
                    match (kind, role) {
                        (FIN, _) => {
                            conn.peer_fin = true;
                            if matches!(role, Role::Sink | Role::Both) {
                                // Writes raise nothing here, and all went
                                // to the one region: it must hold the last
                                // one, in full.
                                let ok = value > 0 && data::check(&conn.rx, value - 1, verify);
                                out.push(Event::ArrivedMany {
                                    conn: i,
                                    n: value,
                                    len: size,
                                    ok,
                                });
                            }
                            out.push(Event::PeerFin { conn: i });
                        }
                        (NOTIFY, Role::Ping) => {
                            let ok = value == conn.tx_seq && data::check(&conn.rx, value, verify);
                            out.push(arrived(ok, true));
                        }
                        (NOTIFY, Role::Pong) => {
                            let ok = value == conn.rx_seq && data::check(&conn.rx, value, verify);
                            conn.rx_seq += 1;
                            conn.echo_due = true;
                            out.push(arrived(ok, false));
                        }
                        _ => {
                            return Err(Error::msg(format!(
                                "riowrite: unexpected record {kind} from the peer"
                            )))
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e.into()),
            }
        }
        Ok(moved)
    }
}

impl Pass for RioEndpoint {
    fn pass(&mut self, out: &mut Vec<Event>) -> Result<bool, Error> {
        let mut moved = false;
        for i in 0..self.conns.len() {
            moved |= self.complete(i, out)?;
            moved |= self.read(i, out)?;
        }
        Ok(moved)
    }

    fn fds(&self, into: &mut Vec<libc::pollfd>) {
        for c in &self.conns {
            // Readable: a record arrived, or completions wait.
            into.push(libc::pollfd {
                fd: c.s.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
        }
    }
}

impl Endpoint for RioEndpoint {
    fn conns(&self) -> usize {
        self.conns.len()
    }

    fn ready(&self, conn: usize) -> bool {
        let c = &self.conns[conn];
        !c.free.is_empty() && !c.fin_sent
    }

    fn start(&mut self, conn: usize, seq: u64) -> Result<bool, Error> {
        let notify = self.notifies();
        let c = &mut self.conns[conn];
        let slot = c
            .free
            .pop()
            .ok_or_else(|| Error::msg("riowrite: start without a free buffer"))?;
        c.tx_seq = seq;
        let parts = c.tx.message(slot, seq);
        self.post_message(conn, &parts, cookie(C_DATA, slot))?;
        if notify {
            self.post_record(conn, NOTIFY, seq)?;
        }
        Ok(true)
    }

    fn echo(&mut self, conn: usize) -> Result<(), Error> {
        let c = &mut self.conns[conn];
        if !std::mem::take(&mut c.echo_due) {
            return Ok(());
        }
        // The pinger writes nothing more until this echo's NOTIFY.
        let (buf, seq) = (c.rx.as_ptr(), c.rx_seq - 1);
        let size = self.size;
        self.post_write(conn, (buf, size, 0), cookie(C_ECHO, 0))?;
        self.post_record(conn, NOTIFY, seq)
    }

    fn fin(&mut self, conn: usize, count: u64) -> Result<bool, Error> {
        self.conns[conn].fin_sent = true;
        self.post_record(conn, FIN, count)?;
        Ok(false)
    }

    fn poll(&mut self, until: Instant, out: &mut Vec<Event>) -> Result<(), Error> {
        let busy = self.busy;
        poll_sockets(self, busy, until, false, out)
    }
}

impl Drop for RioEndpoint {
    fn drop(&mut self) {
        for c in std::mem::take(&mut self.conns) {
            // SAFETY: the region was mapped on this socket with this length.
            unsafe {
                (self.api.riounmap)(c.s.as_raw_fd(), c.rx.as_ptr().cast_mut().cast(), c.rx.len())
            };
            if c.in_flight > 0 {
                // An error ended the test with operations in flight: the
                // library may still touch the buffers it was lent, so they
                // (and the socket) are left as they are until the process
                // exits.
                std::mem::forget(c);
            }
        }
    }
}

impl Link for RioWrite {
    fn info(&self) -> &'static TransportInfo {
        &INFO
    }

    fn connect(&self, job: &Job<'_>, to: &Addrs) -> Result<Box<dyn Endpoint>, Error> {
        Ok(Box::new(RioEndpoint::new(
            job,
            vec![connect_switched(to)?],
        )?))
    }

    fn accept(
        &self,
        job: &Job<'_>,
        at: &Listeners<'_>,
        threads: usize,
        ready: Ready<'_>,
    ) -> Result<Vec<Box<dyn Endpoint>>, Error> {
        ready()?;
        let streams = accept_switched(at, job.spec.conns)?;
        driver::endpoints(streams, threads, |ss| RioEndpoint::new(job, ss))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_keep_kind_and_slot() {
        for (k, s) in [(C_DATA, 0), (C_ECHO, 7), (C_REC, 65)] {
            let c = cookie(k, s);
            assert_eq!((c >> 32, (c & 0xffff_ffff) as usize), (k, s));
        }
    }

    /// Places `writes` into a region as the peer's Writes would.
    fn place(region: &mut [u8], writes: &[(*const u8, usize, usize)]) {
        for &(src, len, at) in writes {
            // SAFETY: the sources are `len` bytes of the TxMem under test.
            let b = unsafe { std::slice::from_raw_parts(src, len) };
            region[at..at + len].copy_from_slice(b);
        }
    }

    #[test]
    fn a_window_of_1_mib_messages_reads_one_body_plus_16_bytes_each() {
        let (size, window) = (1 << 20, 8);
        let mut tx = TxMem::new(size, window);
        let mut region = vec![0u8; size];
        let mut sources = std::collections::BTreeMap::new();
        for seq in 0..window as u64 {
            let writes = tx.message(seq as usize, seq);
            assert_eq!(writes.len(), 3);
            // The pieces cover the message exactly once, in order.
            let mut next = 0;
            for &(src, len, at) in &writes {
                assert_eq!(at, next);
                next += len;
                sources.insert(src as usize, len);
            }
            assert_eq!(next, size);
            place(&mut region, &writes);
            assert!(data::check(&region, seq, true), "message {seq}");
        }
        // Distinct memory read for the window: one body + 16 B a message
        // (the whole-buffer layout read `window` MiB).
        let read: usize = sources.values().sum();
        assert_eq!(read, (size - 16) + 16 * window);
    }

    #[test]
    fn small_messages_are_one_write_from_their_own_buffer() {
        let mut tx = TxMem::new(64, 2);
        let mut region = vec![0u8; 64];
        for seq in [5u64, 6] {
            let writes = tx.message((seq % 2) as usize, seq);
            assert_eq!(writes.len(), 1);
            place(&mut region, &writes);
            assert!(data::check(&region, seq, true));
        }
    }

    /// The ABI this transport reads completions by is the header's, and
    /// [`AioCompletion`] has the layout that ABI gives it.
    #[test]
    fn the_abi_is_the_headers() {
        let h = include_str!("../../../warpsock-preload/include/warpsock_sockets.h");
        let v: i32 = h
            .lines()
            .find_map(|l| l.strip_prefix("#define WARPSOCK_SOCKETS_ABI "))
            .expect("the header's ABI")
            .trim()
            .parse()
            .expect("a number");
        assert_eq!(v, SOCKETS_ABI);
        assert_eq!((SOCKETS_ABI, size_of::<AioCompletion>()), (2, 32));
        assert_eq!(std::mem::offset_of!(AioCompletion, flags), 24);
    }

    #[test]
    fn a_library_of_another_abi_is_refused_naming_both() {
        assert_eq!(check_abi(Some(SOCKETS_ABI)), Ok(()));
        for lib in [SOCKETS_ABI - 1, SOCKETS_ABI + 1] {
            let e = check_abi(Some(lib)).expect_err("another ABI");
            assert!(e.contains(&format!("ABI {lib} ")), "{e}");
            assert!(e.contains(&format!("ABI {SOCKETS_ABI} ")), "{e}");
            assert!(e.contains("warpsock_aio_completion"), "{e}");
        }
        let e = check_abi(None).expect_err("no warpsock_sockets_abi");
        assert!(e.contains("ABI 1"), "{e}");
        assert!(e.contains(&format!("ABI {SOCKETS_ABI} ")), "{e}");
    }

    #[test]
    fn without_the_preload_the_error_names_it() {
        // The test binary does not run under the preload.
        if std::env::var_os("LD_PRELOAD").is_none() {
            let e = api().err().expect("no extended calls here").to_string();
            assert!(e.contains("LD_PRELOAD=libwarpsock_preload.so"), "{e}");
        }
    }
}
