//! The two ends over the engine: [`client`] and [`server`] with their
//! [`Params`] and [`Report`] (the protocol itself, sans-IO, is the parent
//! module).

use super::*;

/// Client or server parameters.
#[derive(Debug, Clone)]
pub struct Params {
    /// Server address (client) or listen address (server).
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// Messages.
    pub n: u64,
    /// Bytes per message.
    pub s: u32,
    /// Server: receives kept posted.
    pub window: u32,
    /// Client: outstanding Sends (and send buffers).
    pub depth: usize,
    /// Ask for MPA CRC.
    pub crc: bool,
    /// Client: peer-to-peer RTR offer (`None`: classic setup).
    pub p2p: Option<RtrOffer>,
    /// Server: choose the Read RTR; the initiator must offer both.
    pub prefer_read_rtr: bool,
    /// Bound on the accept / connect and every wait.
    pub timeout: Duration,
}

/// The outcome at one end.
#[derive(Debug, Clone)]
pub struct Report {
    /// What this end sent (client) or received (server).
    pub local: Summary,
    /// The server's verdict as the client received it.
    pub remote: Option<Summary>,
    /// First bad message and byte offset (`None` offset: wrong length).
    pub first_bad: Option<(u64, Option<usize>)>,
    /// Time from the first message to the last.
    pub elapsed: Duration,
    /// CRC in use.
    pub crc: bool,
    /// The RTR message of peer-to-peer setup, if any.
    pub rtr: Option<RtrType>,
    /// Zero-length Writes sent to unstick siw's accept race.
    pub kicks: u32,
}

impl Report {
    /// Whether everything checked out.
    pub fn ok(&self) -> bool {
        match self.remote {
            None => self.local.bad == 0,
            Some(r) => {
                r == Summary {
                    bad: 0,
                    ..self.local
                }
            }
        }
    }

    fn mb_per_sec(&self) -> f64 {
        self.local.bytes as f64 / self.elapsed.as_secs_f64().max(1e-9) / 1e6
    }

    fn tail(&self) -> String {
        format!(
            "CRC {}; RTR {}; kicks {}; result {}",
            if self.crc { "on" } else { "off" },
            match self.rtr {
                None => "none",
                Some(RtrType::Write) => "write",
                Some(RtrType::Read) => "read",
                Some(RtrType::Send) => "send",
            },
            self.kicks,
            if self.ok() { "ok" } else { "FAIL" }
        )
    }

    /// The server's one-line result (same fields as `send_check.c`).
    pub fn server_line(&self) -> String {
        let l = &self.local;
        format!(
            "send-check server: messages {} bytes {} bad_messages {} first_bad {} checksum {:#018x} seconds {:.3} MBps {:.1}; {}",
            l.messages,
            l.bytes,
            l.bad,
            match self.first_bad {
                None => "-1".into(),
                Some((i, Some(off))) => format!("{i}@{off}"),
                Some((i, None)) => format!("{i}@length"),
            },
            l.checksum,
            self.elapsed.as_secs_f64(),
            self.mb_per_sec(),
            self.tail()
        )
    }

    /// The client's one-line result (same fields as `send_check.c`).
    pub fn client_line(&self) -> String {
        let l = &self.local;
        let r = self.remote.unwrap_or_default();
        format!(
            "send-check client: sent {} messages = {} bytes checksum {:#018x} seconds {:.3} MBps {:.1}; server: messages {} bytes {} bad_messages {} checksum {:#018x}; {}",
            l.messages,
            l.bytes,
            l.checksum,
            self.elapsed.as_secs_f64(),
            self.mb_per_sec(),
            r.messages,
            r.bytes,
            r.bad,
            r.checksum,
            self.tail()
        )
    }
}

fn resolve(host: &str, port: u16) -> Result<SocketAddr, Error> {
    (host, port)
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| Error::Io(std::io::Error::other("address did not resolve")))
}

fn post(ch: &Chan, wr: SendWr, step: &'static str) -> Result<(), Error> {
    ch.qp
        .post_send(wr)
        .map_err(|e| Error::Post { step, source: e })
}

fn post_recv(ch: &Chan, wr: RecvWr, step: &'static str) -> Result<(), Error> {
    ch.qp
        .post_recv(wr)
        .map_err(|e| Error::Post { step, source: e })
}

fn send_wr(wr_id: u64, mr: &Mr, off: usize, len: u32) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::Send {
            solicited: false,
            invalidate: None,
        },
        sgl: mr.sge(off, len).into(),
        signaled: true,
    }
}

/// Runs the sending side: connects, Sends N patterned messages under the
/// server's credits, and returns once the server's verdict arrived.
pub fn client(p: &Params) -> Result<Report, Error> {
    let addr = resolve(&p.host, p.port)?;
    let t = p.timeout;
    let s = p.s as usize;
    let depth = p.depth.max(1);
    let ctx = Context::new(Progress::Caller)?;
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(2 * depth + 512)?;
    let mut init = QpInit::new(&pd, &cq);
    let o = &mut init.options;
    o.crc = p.crc;
    o.peer_to_peer = p.p2p.is_some();
    o.rtr = p.p2p.unwrap_or_default();
    o.private_data = encode_request(p.n, p.s).to_vec();
    o.sq_depth = depth + 8;
    o.rq_depth = 512;
    o.connect_timeout = t;
    o.mpa_timeout = t;
    let data = pd.alloc(s * depth, Access::LOCAL_READ);
    let ctl = pd.alloc(CTL_BUF * 512, Access::LOCAL_WRITE);
    let qp = crate::chan::connect_retrying(addr, &init, t, "connecting")?;
    let neg = qp.negotiated().ok_or_else(not_negotiated)?;
    let mut ch = Chan::new(qp, cq);
    let (w, k) = decode_reply(&neg.peer_private_data).ok_or_else(|| Error::Protocol {
        step: "MPA Reply",
        what: format!(
            "the server's private data is not SCK1 window/credit interval: {:02x?}",
            neg.peer_private_data
        ),
    })?;
    let nrecv = client_recvs(w, k);
    if nrecv > 512 {
        return Err(Error::Protocol {
            step: "MPA Reply",
            what: format!("window {w} / credit interval {k} need {nrecv} receives (max 512)"),
        });
    }
    // The server sends nothing before our first message: posting now is
    // in time.
    for i in 0..u64::from(nrecv) {
        post_recv(
            &ch,
            RecvWr {
                wr_id: WR_CTL | i,
                sgl: ctl.sge(i as usize * CTL_BUF, CTL_BUF as u32).into(),
            },
            "posting credit receives",
        )?;
    }

    let (mut sent, mut completed, mut posted) = (0u64, 0u64, u64::from(w));
    let mut h = Fnv::default();
    let mut verdict = None;
    let start = Instant::now();
    let mut last_progress = Instant::now();
    while verdict.is_none() || completed < p.n {
        while sent < p.n && sent < posted && sent - completed < depth as u64 {
            let slot = (sent % depth as u64) as usize * s;
            data.with_bytes_mut(|b| {
                let m = &mut b[slot..slot + s];
                fill(m, sent);
                check(m, sent, &mut h);
            });
            post(&ch, send_wr(sent, &data, slot, p.s), "sending")?;
            sent += 1;
        }
        let step = if sent < p.n {
            "sending (waiting for credits or completions)"
        } else {
            "waiting for the server's result"
        };
        let kick = ch.kicks < MAX_KICKS && sent == posted.min(p.n) && completed == sent;
        let limit = if kick { KICK_AFTER } else { t };
        let Some(wc) = ch.wait_for(|_| true, step, limit)? else {
            if kick && last_progress.elapsed() >= KICK_AFTER {
                ch.kick()?;
                continue;
            }
            if last_progress.elapsed() < t {
                continue;
            }
            return Err(Error::Timeout { step, after: t });
        };
        last_progress = Instant::now();
        match wc.opcode {
            WcOpcode::Send => completed += 1,
            WcOpcode::Recv => {
                let off = (wc.wr_id & !WR_CTL) as usize * CTL_BUF;
                let mut b = vec![0u8; wc.byte_len as usize];
                ctl.read(off, &mut b);
                match Msg::decode(&b) {
                    Some(Msg::Credit(c)) => {
                        posted = posted.max(c);
                        post_recv(
                            &ch,
                            RecvWr {
                                wr_id: wc.wr_id,
                                sgl: ctl.sge(off, CTL_BUF as u32).into(),
                            },
                            "re-posting a credit receive",
                        )?;
                    }
                    Some(Msg::Done(sm)) => verdict = Some(sm),
                    None => {
                        return Err(Error::Protocol {
                            step,
                            what: format!("unexpected {}-byte message {b:02x?}", b.len()),
                        })
                    }
                }
            }
            _ => {}
        }
    }
    let elapsed = start.elapsed();
    let rep = Report {
        local: Summary {
            bad: 0,
            messages: sent,
            bytes: sent * u64::from(p.s),
            checksum: h.0,
        },
        remote: verdict,
        first_bad: None,
        elapsed,
        crc: neg.crc,
        rtr: neg.rtr,
        kicks: ch.kicks,
    };
    ch.close();
    Ok(rep)
}

fn not_negotiated() -> Error {
    Error::Protocol {
        step: "connection setup",
        what: "an established queue pair without negotiated parameters".into(),
    }
}

/// Runs the receiving side: accepts one client on `host:port`, verifies
/// its N messages, and returns the verdict it sent back.
pub fn server(p: &Params) -> Result<Report, Error> {
    server_on(Listener::bind(resolve(&p.host, p.port)?)?, p)
}

/// As [`server`], on a listener the caller bound (`p.host` and `p.port`
/// are not used): bind port 0 and pass the listener, and no other program
/// can take the port between choosing it and listening on it.
pub fn server_on(mut listener: Listener, p: &Params) -> Result<Report, Error> {
    let t = p.timeout;
    let s = p.s as usize;
    let w = p.window.max(1);
    let k = credit_interval(w);
    let ring = client_recvs(w, k) as usize;
    // Scripts that bind port 0 learn the port from this line.
    eprintln!("send-check server: listening on {}", listener.local_addr()?);
    listener.set_mpa_timeout(t);
    let req = listener.accept(Some(t)).map_err(|e| Error::Cm {
        step: "accepting",
        source: e,
    })?;
    if decode_request(req.private_data()) != Some((p.n, p.s)) {
        let what = format!(
            "the client's private data {:02x?} is not SCK1 N={} S={}; rejected",
            req.private_data(),
            p.n,
            p.s
        );
        let _ = req.reject(b"");
        return Err(Error::Protocol {
            step: "MPA Request",
            what,
        });
    }
    let ctx = Context::new(Progress::Caller)?;
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(w as usize + ring + 16)?;
    let data = pd.alloc(s * w as usize, Access::LOCAL_WRITE);
    let ctl = pd.alloc(CTL_BUF * ring, Access::LOCAL_READ);
    let mut init = QpInit::new(&pd, &cq);
    init.options.crc = p.crc;
    init.options.sq_depth = ring + 4;
    init.options.rq_depth = w as usize + 4;
    init.options.mpa_timeout = t;
    init.options.prefer_read_rtr = p.prefer_read_rtr;
    // Posted before the MPA Reply leaves (QpInit::recvs).
    for i in 0..w as usize {
        init.recvs.push(RecvWr {
            wr_id: i as u64,
            sgl: data.sge(i * s, p.s).into(),
        });
    }
    let qp = req
        .accept(&init, &encode_reply(w, k))
        .map_err(|e| Error::Cm {
            step: "accepting",
            source: e,
        })?;
    let neg = qp.negotiated().ok_or_else(not_negotiated)?;
    if p.prefer_read_rtr && neg.rtr != Some(RtrType::Read) {
        return Err(Error::Protocol {
            step: "MPA Request",
            what: format!(
                "the initiator did not offer both Write and Read RTR (chosen: {:?})",
                neg.rtr
            ),
        });
    }
    let mut ch = Chan::new(qp, cq);

    let mut rx = Receiver::new(p.n, p.s, w);
    let (mut ctl_out, mut ctl_slot) = (0usize, 0usize);
    let mut start = None;
    let step = "receiving";
    while !rx.done() {
        let wc: Wc = ch.wait(|_| true, step, t)?;
        if wc.wr_id & WR_CTL != 0 {
            ctl_out -= 1;
            continue;
        }
        if wc.opcode != WcOpcode::Recv {
            continue;
        }
        start.get_or_insert_with(Instant::now);
        let off = wc.wr_id as usize * s;
        data.with_bytes(|b| rx.take(&b[off..off + s], wc.byte_len));
        if wc.byte_len != p.s {
            eprintln!(
                "send-check server: message {} has {} bytes, expected {}",
                rx.summary().messages - 1,
                wc.byte_len,
                p.s
            );
        }
        post_recv(
            &ch,
            RecvWr {
                wr_id: wc.wr_id,
                sgl: data.sge(off, p.s).into(),
            },
            "re-posting a receive",
        )?;
        if let Some(m) = rx.credit_due().filter(|_| ctl_out < ring) {
            let m = m.encode();
            let o = (ctl_slot % ring) * CTL_BUF;
            ctl.write(o, &m);
            post(
                &ch,
                send_wr(WR_CTL | ctl_slot as u64, &ctl, o, m.len() as u32),
                "sending a credit",
            )?;
            ctl_slot += 1;
            ctl_out += 1;
            rx.credit_sent();
        }
    }
    let elapsed = start.map_or(Duration::ZERO, |s| s.elapsed());
    while ctl_out > 0 {
        ch.wait(|w| w.wr_id & WR_CTL != 0, "sending credits", t)?;
        ctl_out -= 1;
    }
    let sum = rx.summary();
    let m = Msg::Done(sum).encode();
    let o = (ctl_slot % ring) * CTL_BUF;
    ctl.write(o, &m);
    post(
        &ch,
        send_wr(WR_DONE, &ctl, o, m.len() as u32),
        "sending the result",
    )?;
    ch.wait(|w| w.wr_id == WR_DONE, "sending the result", t)?;
    // The client disconnects once it has the result.
    let end = Instant::now() + t.min(Duration::from_secs(10));
    while !ch.qp.is_closed() && Instant::now() < end {
        let _ = ch.wait_for(
            |_| false,
            "waiting for the client to disconnect",
            Duration::from_millis(200),
        );
    }
    let rep = Report {
        local: sum,
        remote: None,
        first_bad: rx.first_bad(),
        elapsed,
        crc: neg.crc,
        rtr: neg.rtr,
        kicks: 0,
    };
    ch.close();
    Ok(rep)
}
