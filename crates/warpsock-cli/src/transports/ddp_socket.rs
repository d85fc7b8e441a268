//! `ddp-socket`: the host-TCP code of [`super::tcp`] over sockets in DDP
//! mode — both processes under `LD_PRELOAD=libwarpsock_preload.so`, and
//! each data connection switched with `setsockopt(SOL_WARPSOCK,
//! WARPSOCK_DDP_MODE)` by both ends right after it is set up (the client
//! after sending its token, the server after reading it), so the same
//! `writev`/`readv`/`poll` calls run as RDMAP Sends over MPA/TCP
//! (extended sockets, issue 12). CRC off, like the host TCP it is
//! compared with (`WARPSOCK_CRC=0`).
//!
//! Each client thread connects and switches its own connection; the
//! server accepts them all, then switches each in turn (a client's switch
//! waits for its turn, within the switch timeout).

use std::net::TcpStream;
use std::os::fd::AsRawFd;

use super::sock;
use super::tcp::TcpEndpoint;
use crate::driver::{self, Addrs, Endpoint, Job, Link, Listeners, Ready};
use crate::spec::{Family, TransportInfo};
use crate::Error;

/// `warpsock_sockets.h`: the option level and the option.
const SOL_WARPSOCK: libc::c_int = 0x5753_0000;
const WARPSOCK_DDP_MODE: libc::c_int = 1;

/// What it is.
pub(crate) static INFO: TransportInfo = TransportInfo {
    name: "ddp-socket",
    label: "DDP socket",
    help: "the host-TCP code with both sides under the preload and each data \
           connection switched into DDP mode (setsockopt SOL_WARPSOCK \
           WARPSOCK_DDP_MODE): stream sockets over iWARP, CRC off",
    family: Family::Stream,
    crc: false,
    pull: false,
    baseline: "tcp",
    quick: false,
    setup: false,
    preload: Some(&[("WARPSOCK_CRC", "0")]),
};

/// The transport.
pub(crate) struct DdpSocket;

/// Switches `s` into DDP mode (the peer does the same).
fn ddp_mode(s: &TcpStream) -> Result<(), Error> {
    let one: libc::c_int = 1;
    // SAFETY: setsockopt reads one int from the stack.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            SOL_WARPSOCK,
            WARPSOCK_DDP_MODE,
            (&one as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    Err(Error::msg(format!(
        "DDP mode on the data connection: {e} (both sides must run under \
         LD_PRELOAD=libwarpsock_preload.so)"
    )))
}

/// The client's data connection, switched into DDP mode.
pub(super) fn connect_switched(to: &Addrs) -> Result<TcpStream, Error> {
    let s = sock::connect(to.ctl, to.token)?;
    ddp_mode(&s)?;
    Ok(s)
}

/// The server's `n` data connections, each switched into DDP mode in turn
/// (a client's switch waits for its turn, within the switch timeout).
pub(super) fn accept_switched(at: &Listeners<'_>, n: usize) -> Result<Vec<TcpStream>, Error> {
    let streams = sock::accept_n(at.ctl, at.token, n)?;
    for s in &streams {
        ddp_mode(s)?;
    }
    Ok(streams)
}

impl Link for DdpSocket {
    fn info(&self) -> &'static TransportInfo {
        &INFO
    }

    fn connect(&self, job: &Job<'_>, to: &Addrs) -> Result<Box<dyn Endpoint>, Error> {
        Ok(Box::new(TcpEndpoint::new(
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
        driver::endpoints(streams, threads, |ss| TcpEndpoint::new(job, ss))
    }
}
