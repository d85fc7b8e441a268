//! What a socket tells of itself: its addresses, the peer's hello, its
//! counters, message mode, the bytes a read would return, its failure.

use std::net::SocketAddr;

use super::XSocket;
use crate::io::settings::Counters;
use crate::wire::Hello;

impl XSocket {
    /// Local address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Peer address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// What the peer announced.
    pub fn peer_hello(&self) -> Hello {
        self.lock().s.peer()
    }

    /// This socket's byte counters (the process's, [`counters`](crate::io::counters), add up
    /// every socket's).
    pub fn stats(&self) -> &Counters {
        &self.stats
    }

    /// Message mode: every read returns at most one of the peer's sends
    /// (`recv_msg` says whether it ended it).
    pub fn set_msg_mode(&self, on: bool) {
        self.lock().msg_mode = on;
    }

    /// Whether message mode is on.
    pub fn msg_mode(&self) -> bool {
        self.lock().msg_mode
    }

    /// Bytes a read would return now (`FIONREAD`).
    pub fn readable_bytes(&self) -> usize {
        let st = self.lock_look();
        st.residue.len() - st.residue_off + st.s.readable()
    }

    /// Why the connection failed, if it did (`SO_ERROR`).
    pub fn error(&self) -> Option<(i32, String)> {
        self.lock().error.clone()
    }
}
