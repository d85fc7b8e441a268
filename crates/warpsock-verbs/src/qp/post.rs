//! The data path: `ops.post_send` and `ops.post_recv` (the rules are in
//! the parent module's doc: opcodes, inline data, send-queue accounting,
//! posting before RTS and in ERR).

use super::*;

/// Gathers a request's SGEs (program pointer, count ≤ `max`).
///
/// # Safety
/// `list` holds `n` entries.
unsafe fn sgl(list: *const ibv_sge, n: c_int) -> Sgl {
    if n <= 0 || list.is_null() {
        return Sgl::new();
    }
    // SAFETY: per the contract.
    let s = unsafe { std::slice::from_raw_parts(list, n as usize) };
    s.iter()
        .map(|e| Sge {
            addr: e.addr,
            length: e.length,
            lkey: e.lkey,
        })
        .collect()
}

impl QpShared {
    /// Builds the engine request for one `ibv_send_wr`, copying inline
    /// data. Returns the errno a device gives for a bad request.
    ///
    /// # Safety
    /// `w`'s pointers are the program's, valid per the verbs contract.
    unsafe fn send_wr(&self, st: &mut QpState, w: &ibv_send_wr) -> Result<SendWr, c_int> {
        if w.num_sge < 0
            || w.num_sge as u32 > self.cap.max_send_sge && w.send_flags & IBV_SEND_INLINE == 0
        {
            return Err(libc::EINVAL);
        }
        let op = match w.opcode {
            IBV_WR_SEND => SendOp::Send {
                solicited: w.send_flags & IBV_SEND_SOLICITED != 0,
                invalidate: None,
            },
            IBV_WR_SEND_WITH_INV => SendOp::Send {
                solicited: w.send_flags & IBV_SEND_SOLICITED != 0,
                invalidate: Some(w.invalidate_rkey),
            },
            IBV_WR_RDMA_WRITE => SendOp::Write {
                remote_addr: w.rdma.remote_addr,
                rkey: w.rdma.rkey,
            },
            IBV_WR_RDMA_READ => {
                if w.num_sge as u32 > MAX_SGE_RD || w.send_flags & IBV_SEND_INLINE != 0 {
                    return Err(libc::EINVAL);
                }
                SendOp::Read {
                    remote_addr: w.rdma.remote_addr,
                    rkey: w.rdma.rkey,
                }
            }
            // WRITE_WITH_IMM, SEND_WITH_IMM, atomics, LOCAL_INV, BIND_MW,
            // TSO: iWARP (RFC 5040) has none of them; siw's provider
            // rejects them with EINVAL.
            _ => return Err(libc::EINVAL),
        };
        let signaled = self.sig_all || w.send_flags & IBV_SEND_SIGNALED != 0;
        // SAFETY: per the contract.
        let mut list = unsafe { sgl(w.sg_list, w.num_sge) };
        if w.send_flags & IBV_SEND_INLINE != 0 && !list.is_empty() {
            let total: u64 = list.iter().map(|s| u64::from(s.length)).sum();
            let max = u64::from(self.cap.max_inline_data);
            let Some(ring) = self.inline.as_ref().filter(|_| total <= max) else {
                return Err(libc::EINVAL);
            };
            let slot = (st.posted % u64::from(self.cap.max_send_wr)) as usize;
            let base = slot * self.cap.max_inline_data as usize;
            let mut off = base;
            for s in list.iter() {
                // SAFETY: inline data is read at post time from the
                // program's buffer (not registered), per the verbs contract.
                let src =
                    unsafe { std::slice::from_raw_parts(s.addr as *const u8, s.length as usize) };
                ring.write(off, src);
                off += src.len();
            }
            list = ring.sge(base, total as u32).into();
        }
        Ok(SendWr {
            wr_id: w.wr_id,
            op,
            sgl: list,
            signaled,
        })
    }
}

/// `ops.post_send`.
pub unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: ops of our context: a live QP of ours.
    let sh = unsafe { shared(qp) };
    sh.ctx.touch();
    let mut st = lock(&sh.st);
    let mut cur = wr;
    let fail = |cur: *mut ibv_send_wr, e: c_int| {
        if !bad.is_null() {
            // SAFETY: the program's out-pointer.
            unsafe { *bad = cur };
        }
        e
    };
    while !cur.is_null() {
        // SAFETY: a request of the program's list.
        let w = unsafe { &*cur };
        if st.state == IBV_QPS_ERR && st.eng.is_none() {
            sh.send_cq
                .push_stash(flush_wc(sh.qp_num, w.wr_id, IBV_WC_SEND));
            cur = w.next;
            continue;
        }
        if st.eng.is_none() || !matches!(st.state, IBV_QPS_RTS | IBV_QPS_SQD | IBV_QPS_ERR) {
            return fail(cur, libc::ENOTCONN);
        }
        if st.sq.len() >= sh.cap.max_send_wr as usize {
            return fail(cur, libc::ENOMEM);
        }
        // SAFETY: the program's request, valid per the verbs contract.
        let req = match unsafe { sh.send_wr(&mut st, w) } {
            Ok(r) => r,
            Err(e) => return fail(cur, e),
        };
        let eng = st.eng.as_ref().expect("checked above");
        if let Err(e) = eng.post_send(req) {
            return fail(cur, post_errno(e));
        }
        if st.kick.waiting_for_first_post() {
            st.kick.posted(Instant::now());
        }
        st.posted += 1;
        st.sq.push_back(SqEntry { wr_id: w.wr_id });
        cur = w.next;
    }
    0
}

/// `ops.post_recv`.
pub unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: ops of our context: a live QP of ours.
    let sh = unsafe { shared(qp) };
    sh.ctx.touch();
    let mut st = lock(&sh.st);
    let mut cur = wr;
    let fail = |cur: *mut ibv_recv_wr, e: c_int| {
        if !bad.is_null() {
            // SAFETY: the program's out-pointer.
            unsafe { *bad = cur };
        }
        e
    };
    while !cur.is_null() {
        // SAFETY: a request of the program's list.
        let w = unsafe { &*cur };
        if w.num_sge < 0 || w.num_sge as u32 > sh.cap.max_recv_sge {
            return fail(cur, libc::EINVAL);
        }
        let r = RecvWr {
            wr_id: w.wr_id,
            // SAFETY: the program's SGE list.
            sgl: unsafe { sgl(w.sg_list, w.num_sge) },
        };
        match (&st.eng, st.state) {
            (_, IBV_QPS_RESET) => return fail(cur, libc::EINVAL),
            (None, IBV_QPS_ERR) => {
                sh.recv_cq
                    .push_stash(flush_wc(sh.qp_num, w.wr_id, IBV_WC_RECV));
            }
            (None, _) => {
                if st.pre_recvs.len() >= sh.cap.max_recv_wr as usize {
                    return fail(cur, libc::ENOMEM);
                }
                st.pre_recvs.push(r);
            }
            (Some(eng), _) => {
                if let Err(e) = eng.post_recv(r) {
                    return fail(cur, post_errno(e));
                }
            }
        }
        cur = w.next;
    }
    0
}
