//! The client's side of a session with a `warpsock server`: the control
//! connection, the hello exchange and what the server said of itself.

use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

use crate::ctl::{Ctl, VERSION};
use crate::driver::Addrs;
use crate::Error;

/// How long the control connection may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Opens the control connection: each resolved address in turn, with a
/// one-line error naming the address and the reason.
fn connect_ctl(host: &str, port: u16) -> Result<TcpStream, Error> {
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| Error::msg(format!("cannot resolve '{host}': {e}")))?
        .collect();
    let mut last = Error::msg(format!("'{host}' resolves to no address"));
    for a in addrs {
        match TcpStream::connect_timeout(&a, CONNECT_TIMEOUT) {
            Ok(s) => return Ok(s),
            Err(e) => {
                let why = match e.raw_os_error() {
                    Some(libc::ECONNREFUSED) => {
                        "connection refused (is `warpsock server` running there?)".to_string()
                    }
                    Some(libc::EHOSTUNREACH | libc::ENETUNREACH) => format!("unreachable ({e})"),
                    _ if e.kind() == std::io::ErrorKind::TimedOut => {
                        format!("no answer within {} s", CONNECT_TIMEOUT.as_secs())
                    }
                    _ => e.to_string(),
                };
                last = Error::msg(format!("cannot connect to {a}: {why}"));
            }
        }
    }
    Err(last)
}

/// What the server said in its hello.
pub(crate) struct Session {
    pub(crate) ctl: Ctl,
    pub(crate) ctl_addr: SocketAddr,
    pub(crate) data_addr: SocketAddr,
    pub(crate) token: u64,
    pub(crate) server_cpus: usize,
    /// The server kernel's boot id, if it said.
    pub(crate) server_boot: Option<String>,
}

impl Session {
    /// Where the data connections go.
    pub(crate) fn addrs(&self) -> Addrs {
        Addrs {
            ctl: self.ctl_addr,
            data: self.data_addr,
            token: self.token,
        }
    }
}

/// Opens a session: the control connection and the hello exchange (with
/// the server's shared `token`, if it needs one).
pub(crate) fn open_session(host: &str, port: u16, token: Option<&str>) -> Result<Session, Error> {
    let s = connect_ctl(host, port)?;
    let ctl_addr = s.peer_addr()?;
    let mut ctl = Ctl::new(s)?;
    let auth = token.map_or(String::new(), |t| format!(" auth={t}"));
    ctl.send(&format!("hello warpsock-bench={VERSION}{auth}"))?;
    let h = ctl
        .recv(Some(Duration::from_secs(10)))
        .map_err(|e| e.context(format!("{ctl_addr} is not answering as a warpsock server")))?
        .expect("hello")?;
    let token = u64::from_str_radix(h.get("token")?, 16)
        .map_err(|_| Error::msg("protocol error: bad token"))?;
    let data_port: u16 = h.num("data-port")?;
    Ok(Session {
        ctl,
        ctl_addr,
        data_addr: SocketAddr::new(ctl_addr.ip(), data_port),
        token,
        server_cpus: h.num("cpus")?,
        server_boot: h.get("boot").ok().map(str::to_string),
    })
}
