//! The server's control port: one acceptor thread takes every TCP
//! connection and sorts it, so no peer can hold up another.
//!
//! - A connection whose first 8 bytes are the running session's token (or
//!   its complement, which ends a setup test) is a data connection: it
//!   goes to the session through a bounded queue ([`Accept`]).
//! - Anything else must send a `hello` line within [`HELLO_WAIT`] (in
//!   all: a peer that dribbles bytes gets no more time than a silent one)
//!   or it is closed. A `hello` claims the server if no session holds it;
//!   waits as the next client while the session is idle between tests (the
//!   session then yields within a second); and is told `error busy …` at
//!   once while a test runs.
//! - At most [`MAX_PENDING`] connections are being sorted at once; more
//!   are closed unread. Each sorting thread reads at most one line.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::ctl::{shorten, Ctl, Line, RecvError, VERSION};
use crate::driver::Accept;
use crate::spec::MAX_CONNS;
use crate::Error;

/// How long a new connection has to send its first line (or token).
pub(crate) const HELLO_WAIT: Duration = Duration::from_secs(5);
/// Most connections being sorted at once.
pub(crate) const MAX_PENDING: usize = 64;
/// An idle session yields to a waiting client after this long.
pub(crate) const YIELD_AFTER: Duration = Duration::from_secs(1);

/// What holds the server.
#[derive(Debug, Clone, Copy)]
enum State {
    Free,
    /// A session waits for its client's next line.
    Idle {
        peer: SocketAddr,
        since: Instant,
    },
    /// A session runs a test.
    Testing {
        peer: SocketAddr,
        since: Instant,
    },
}

struct Shared {
    state: Mutex<State>,
    /// The running session's data token.
    token: Mutex<Option<u64>>,
    /// A client that said hello while the session was idle.
    waiting: Mutex<Option<(Ctl, Line)>>,
    pending: AtomicUsize,
    data_tx: SyncSender<(TcpStream, u64)>,
    sessions_tx: SyncSender<(Ctl, Line)>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The control port, as the session loop sees it.
pub(crate) struct ControlPort {
    shared: Arc<Shared>,
    data_rx: Mutex<Receiver<(TcpStream, u64)>>,
    sessions_rx: Mutex<Receiver<(Ctl, Line)>>,
}

impl ControlPort {
    /// Starts sorting the connections of `l` on a thread of its own.
    pub(crate) fn start(l: TcpListener) -> Result<Self, Error> {
        let (data_tx, data_rx) = mpsc::sync_channel(2 * MAX_CONNS);
        let (sessions_tx, sessions_rx) = mpsc::sync_channel(1);
        let shared = Arc::new(Shared {
            state: Mutex::new(State::Free),
            token: Mutex::new(None),
            waiting: Mutex::new(None),
            pending: AtomicUsize::new(0),
            data_tx,
            sessions_tx,
        });
        let sh = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("control-port".into())
            .spawn(move || acceptor(&l, &sh))
            .map_err(|e| Error::msg(format!("cannot start the control port's thread: {e}")))?;
        Ok(Self {
            shared,
            data_rx: Mutex::new(data_rx),
            sessions_rx: Mutex::new(sessions_rx),
        })
    }

    /// The next client (its connection and its hello line): one that waited
    /// while the last session was idle, else the next to arrive.
    pub(crate) fn next_client(&self) -> Result<(Ctl, Line), Error> {
        if let Some(w) = lock(&self.shared.waiting).take() {
            return Ok(w);
        }
        lock(&self.sessions_rx)
            .recv()
            .map_err(|_| Error::msg("the control port's thread stopped"))
    }

    /// A session for `peer` starts, its data connections carrying `token`.
    pub(crate) fn begin(&self, peer: SocketAddr, token: u64) {
        self.drain();
        *lock(&self.shared.token) = Some(token);
        self.idle(peer);
    }

    /// The session waits for its client's next line.
    pub(crate) fn idle(&self, peer: SocketAddr) {
        *lock(&self.shared.state) = State::Idle {
            peer,
            since: Instant::now(),
        };
    }

    /// The session runs a test.
    pub(crate) fn testing(&self, peer: SocketAddr) {
        *lock(&self.shared.state) = State::Testing {
            peer,
            since: Instant::now(),
        };
    }

    /// Whether a client waits for the server.
    pub(crate) fn someone_waits(&self) -> bool {
        lock(&self.shared.waiting).is_some()
    }

    /// The session is over: the server is free (or goes to the client that
    /// waits, on the next [`ControlPort::next_client`]).
    pub(crate) fn end(&self) {
        *lock(&self.shared.token) = None;
        self.drain();
        let mut st = lock(&self.shared.state);
        *st = if self.someone_waits() {
            State::Idle {
                peer: SocketAddr::from(([0, 0, 0, 0], 0)),
                since: Instant::now(),
            }
        } else {
            State::Free
        };
    }

    /// Drops data connections nobody took (a failed test's stragglers).
    fn drain(&self) {
        while lock(&self.data_rx).try_recv().is_ok() {}
    }
}

impl Accept for ControlPort {
    fn accept(&self, timeout: Duration) -> std::io::Result<(TcpStream, u64)> {
        lock(&self.data_rx).recv_timeout(timeout).map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the client did not open its data connection in time",
            )
        })
    }
}

/// Accepts forever, handing each connection to a sorting thread.
fn acceptor(l: &TcpListener, sh: &Arc<Shared>) {
    loop {
        let Ok((s, _)) = l.accept() else {
            // EMFILE and the like: back off instead of spinning.
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        if sh.pending.fetch_add(1, Ordering::SeqCst) >= MAX_PENDING {
            sh.pending.fetch_sub(1, Ordering::SeqCst);
            continue; // dropped: closed unread
        }
        let sh2 = Arc::clone(sh);
        let spawned = std::thread::Builder::new()
            .name("control-sort".into())
            .spawn(move || {
                sort(s, &sh2);
                sh2.pending.fetch_sub(1, Ordering::SeqCst);
            });
        if spawned.is_err() {
            sh.pending.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Sorts one new connection (see the module docs).
fn sort(mut s: TcpStream, sh: &Shared) {
    let deadline = Instant::now() + HELLO_WAIT;
    let _ = s.set_read_timeout(Some(HELLO_WAIT));
    let mut first = [0u8; 8];
    let mut got = 0;
    while got < 8 {
        match std::io::Read::read(&mut s, &mut first[got..]) {
            Ok(0) | Err(_) => return,
            Ok(n) => got += n,
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || s.set_read_timeout(Some(left)).is_err() {
            return;
        }
    }
    let v = u64::from_le_bytes(first);
    if lock(&sh.token).is_some_and(|t| v == t || v == !t) {
        let _ = s.set_read_timeout(None);
        // A full queue means a misbehaving client: its connection is
        // closed, and its test fails on its own side.
        let _ = sh.data_tx.try_send((s, v));
        return;
    }
    let Ok(mut ctl) = Ctl::with_prefix(s, first.to_vec()) else {
        return;
    };
    let left = deadline.saturating_duration_since(Instant::now());
    let hello = match ctl.recv_within(Some(left)) {
        Ok(l) if l.verb == "hello" => l,
        Ok(l) => {
            let _ = ctl.send(&format!(
                "error this is a warpsock server: expected 'hello warpsock-bench={VERSION}', got '{}'",
                shorten(&l.verb)
            ));
            return;
        }
        Err(RecvError::Timeout) => return,
        Err(RecvError::Failed(e)) => {
            let _ = ctl.send(&format!("error {e}"));
            return;
        }
    };
    let mut st = lock(&sh.state);
    match *st {
        State::Free => {
            *st = State::Idle {
                peer: SocketAddr::from(([0, 0, 0, 0], 0)),
                since: Instant::now(),
            };
            drop(st);
            let _ = sh.sessions_tx.send((ctl, hello));
        }
        State::Idle { .. } if lock(&sh.waiting).is_none() => {
            *lock(&sh.waiting) = Some((ctl, hello));
        }
        State::Idle { peer, since } | State::Testing { peer, since } => {
            drop(st);
            let _ = ctl.send(&format!(
                "error busy: this server is serving {peer} (for {:.0} s); try again later",
                since.elapsed().as_secs_f64()
            ));
        }
    }
}
