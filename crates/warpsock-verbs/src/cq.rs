//! Completion channels and completion queues.
//!
//! * A channel's `fd` is an eventfd counting queued CQ events: `poll` on
//!   it, or block in `ibv_get_cq_event`.
//! * `ibv_req_notify_cq` arms a CQ for one event: the next completion
//!   (or one already waiting, as mlx5 reports it) queues the CQ on its
//!   channel. Solicited-only arming is treated as "any completion"
//!   (a superset: a program polls after every event anyway).
//! * `ibv_poll_cq` drives progress (caller-driven engine) and translates
//!   the engine's completions into `ibv_wc`: the QP number the program
//!   knows, opcode, status, byte count, `IBV_WC_WITH_INV` with the
//!   invalidated rkey. Completions of destroyed QPs are dropped (as
//!   mlx5/rxe clean them from the CQ).
//! * Overrun: a CQ holding more completions than its size has overrun,
//!   as on hardware: the completions that fitted stay pollable, the rest
//!   are lost, the program gets `IBV_EVENT_CQ_ERR` and every QP on the CQ
//!   `IBV_EVENT_QP_FATAL` and goes to the error state; the CQ reports no
//!   more completions.
//! * `ibv_destroy_cq` fails with EBUSY while a QP uses the CQ and waits
//!   until every event it delivered has been acknowledged, as libibverbs.

use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use warpsock_engine::{Cq, Wc, WcOpcode, WcStatus};

use crate::abi::*;
use crate::ctx::{CqWake, Ctx, CtxShared};
use crate::device::{ctx_is_ours, MAX_CQE};
use crate::real::forward;
use crate::util::{lock, null, set_errno, EventQueue};

/// A queued CQ event: the CQ it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CqRef(pub *mut ibv_cq);
// SAFETY: only handed back to the program, which owns the CQ; the CQ
// cannot be destroyed while its events are unacknowledged.
unsafe impl Send for CqRef {}

/// A completion channel's shared part.
#[derive(Debug)]
pub struct ChannelShared {
    /// Queued CQ events.
    pub q: EventQueue<CqRef>,
    /// CQs using the channel (destroy fails with EBUSY while any do).
    pub users: AtomicUsize,
}

/// `struct ibv_comp_channel` plus its queue.
#[repr(C)]
pub struct ChannelObj {
    /// The ABI part.
    pub ibv: ibv_comp_channel,
    /// The rest.
    pub sh: Arc<ChannelShared>,
}

/// A CQ's shared part.
#[derive(Debug)]
pub struct CqShared {
    /// Unique id (the notifier's epoll token).
    pub id: u64,
    /// The context.
    pub ctx: Arc<CtxShared>,
    /// The engine's queue.
    pub eng: Cq,
    /// Entries (`ibv_cq.cqe`).
    pub cap: usize,
    /// The program's `ibv_cq`.
    pub ibv: AtomicPtr<ibv_cq>,
    /// Its channel.
    pub channel: Option<Arc<ChannelShared>>,
    /// Armed for one event.
    pub armed: AtomicBool,
    /// The engine notification fd, once watched.
    notify_fd: Mutex<Option<c_int>>,
    /// Overrun: only `stash` is reported from now on.
    pub overrun: AtomicBool,
    /// Completions made here rather than by the engine (flushes of queue
    /// pairs that never connected, the part of an overrun that fitted).
    pub stash: Mutex<VecDeque<ibv_wc>>,
    /// Whether `stash` may be non-empty.
    pub has_stash: AtomicBool,
    /// Queue pairs using the CQ.
    pub users: AtomicUsize,
    /// Events delivered on the channel.
    pub events: Mutex<u64>,
    acked: Condvar,
}

static NEXT_CQ: AtomicU64 = AtomicU64::new(1);

impl CqShared {
    /// Queues an event on the channel if armed (the notifier calls this
    /// when the engine's fd turns readable).
    pub fn notify_ready(&self) {
        if self.armed.swap(false, Ordering::AcqRel) {
            self.ctx.armed.fetch_sub(1, Ordering::AcqRel);
            if let Some(ch) = &self.channel {
                *lock(&self.events) += 1;
                // A completion channel's queue is never closed.
                let _ = ch.q.push(CqRef(self.ibv.load(Ordering::Acquire)));
            }
        }
    }

    /// Adds a completion made here.
    pub fn push_stash(&self, wc: ibv_wc) {
        lock(&self.stash).push_back(wc);
        self.has_stash.store(true, Ordering::Release);
        // An armed CQ gets its event for it too.
        if self.armed.load(Ordering::Acquire) {
            self.notify_ready();
        }
    }

    /// Whether completions are waiting (engine or stash).
    pub fn pending(&self) -> bool {
        (self.has_stash.load(Ordering::Acquire) && !lock(&self.stash).is_empty())
            || (!self.overrun.load(Ordering::Acquire) && !self.eng.is_empty())
    }

    fn overrun_now(&self) {
        if self.overrun.swap(true, Ordering::AcqRel) {
            return;
        }
        // What fitted stays; the rest is lost.
        let mut kept = Vec::new();
        let mut buf = [Wc::default(); 64];
        loop {
            let n = self.eng.poll(&mut buf);
            if n == 0 {
                break;
            }
            for w in &buf[..n] {
                if let Some(wc) = translate(&self.ctx, w) {
                    kept.push(wc);
                }
            }
        }
        {
            let mut st = lock(&self.stash);
            st.extend(kept);
            st.truncate(self.cap);
            self.has_stash.store(true, Ordering::Release);
        }
        self.ctx
            .async_event(IBV_EVENT_CQ_ERR, self.ibv.load(Ordering::Acquire).cast());
        for qp in self.ctx.connected() {
            if qp.uses_cq(self.id) {
                qp.fatal();
            }
        }
    }
}

impl CqWake for CqShared {
    fn notify_ready(&self) {
        Self::notify_ready(self);
    }
}

/// Translates an engine completion; `None` for a QP that no longer exists.
pub fn translate(ctx: &CtxShared, w: &Wc) -> Option<ibv_wc> {
    let qp = ctx.qp(w.qp_num)?;
    if crate::kick::is_kick(w.wr_id, w.opcode == WcOpcode::RdmaWrite, w.byte_len) {
        // A flushed or failed kick: the program never posted it.
        return None;
    }
    qp.completed(w);
    let opcode = match w.opcode {
        WcOpcode::Send => IBV_WC_SEND,
        WcOpcode::RdmaWrite => IBV_WC_RDMA_WRITE,
        WcOpcode::RdmaRead => IBV_WC_RDMA_READ,
        WcOpcode::Recv => IBV_WC_RECV,
    };
    let status = match w.status {
        WcStatus::Success => IBV_WC_SUCCESS,
        WcStatus::LocalLengthError => IBV_WC_LOC_LEN_ERR,
        WcStatus::LocalProtectionError => IBV_WC_LOC_PROT_ERR,
        WcStatus::WrFlushError => IBV_WC_WR_FLUSH_ERR,
        WcStatus::RemoteAccessError => IBV_WC_REM_ACCESS_ERR,
        WcStatus::RemoteOperationError => IBV_WC_REM_OP_ERR,
        WcStatus::LocalQpOperationError => IBV_WC_LOC_QP_OP_ERR,
        WcStatus::FatalError => IBV_WC_FATAL_ERR,
        _ => IBV_WC_GENERAL_ERR,
    };
    let mut wc = ibv_wc {
        wr_id: w.wr_id,
        status,
        opcode,
        byte_len: w.byte_len,
        qp_num: qp.qp_num(),
        ..ibv_wc::default()
    };
    if let Some(stag) = w.invalidated {
        wc.wc_flags |= IBV_WC_WITH_INV;
        wc.invalidated_rkey = stag;
    }
    Some(wc)
}

/// The CQ behind the program's pointer.
///
/// # Safety
/// `cq` is a live CQ of a `warpsock0` context.
pub unsafe fn shared<'a>(cq: *mut ibv_cq) -> &'a Arc<CqShared> {
    // SAFETY: `ibv` is the first field of the repr(C) CqObj.
    unsafe { &(*cq.cast::<CqObj>()).sh }
}

/// `struct ibv_cq` plus its state.
#[repr(C)]
pub struct CqObj {
    /// The ABI part.
    pub ibv: ibv_cq,
    /// The rest.
    pub sh: Arc<CqShared>,
}

/// `ops.poll_cq`.
pub unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, n: c_int, out: *mut ibv_wc) -> c_int {
    if n <= 0 || out.is_null() {
        return if n == 0 { 0 } else { -1 };
    }
    // SAFETY: the program polls a live CQ of ours (ops come from our ctx).
    let sh = unsafe { shared(cq) };
    sh.ctx.touch();
    // SAFETY: the program's array holds `n` entries.
    let out = unsafe { std::slice::from_raw_parts_mut(out, n as usize) };
    let mut got = 0;
    if sh.has_stash.load(Ordering::Acquire) {
        let mut st = lock(&sh.stash);
        while got < out.len() {
            match st.pop_front() {
                Some(wc) => {
                    out[got] = wc;
                    got += 1;
                }
                None => break,
            }
        }
        if st.is_empty() {
            sh.has_stash.store(false, Ordering::Release);
        }
    }
    if sh.overrun.load(Ordering::Acquire) {
        return got as c_int;
    }
    let mut buf = [Wc::default(); 16];
    while got < out.len() {
        let want = (out.len() - got).min(buf.len());
        let k = sh.eng.poll(&mut buf[..want]);
        if k == 0 {
            break;
        }
        // More queued than the CQ holds: an overrun (checked only when
        // completions came, never on an empty spin).
        if got == 0 && sh.eng.len() + k > sh.cap {
            // Give back what we took: it counts towards what fitted.
            let mut pre = Vec::with_capacity(k);
            for w in &buf[..k] {
                if let Some(wc) = translate(&sh.ctx, w) {
                    pre.push(wc);
                }
            }
            {
                let mut st = lock(&sh.stash);
                for wc in pre.into_iter().rev() {
                    st.push_front(wc);
                }
                sh.has_stash.store(true, Ordering::Release);
            }
            sh.overrun_now();
            // SAFETY: same arguments, now served from the stash.
            return unsafe { poll_cq(cq, n, out.as_mut_ptr()) };
        }
        for w in &buf[..k] {
            if let Some(wc) = translate(&sh.ctx, w) {
                out[got] = wc;
                got += 1;
            }
        }
        if k < want {
            break;
        }
    }
    got as c_int
}

/// `ops.req_notify_cq`.
pub unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    let _ = solicited_only;
    // SAFETY: a live CQ of ours.
    let sh = unsafe { shared(cq) };
    let Some(_) = &sh.channel else {
        return libc::EINVAL;
    };
    // The engine queue's eventfd is made by its first `notify_fd`: an
    // `eventfd(2)` failure (EMFILE) is this call's, nothing armed yet.
    let (f, first) = {
        let mut fd = lock(&sh.notify_fd);
        match *fd {
            Some(f) => (f, false),
            None => match sh.eng.notify_fd() {
                Ok(b) => {
                    let f = std::os::fd::AsRawFd::as_raw_fd(&b);
                    *fd = Some(f);
                    (f, true)
                }
                Err(e) => return e.raw_os_error().unwrap_or(libc::ENOMEM),
            },
        }
    };
    if !sh.armed.swap(true, Ordering::AcqRel) {
        sh.ctx.cq_armed();
    }
    let weak: std::sync::Weak<dyn CqWake> = Arc::downgrade(sh) as _;
    sh.ctx.watch_cq(sh.id, weak, f, first);
    if sh.pending() {
        sh.notify_ready();
    }
    0
}

/// `ibv_create_comp_channel`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_comp_channel(ctx: *mut ibv_context) -> *mut ibv_comp_channel {
    // SAFETY: the program passes a live context.
    if unsafe { ctx_is_ours(ctx) } {
        let q = match EventQueue::new() {
            Ok(q) => q,
            Err(e) => return null(e.raw_os_error().unwrap_or(libc::EMFILE)),
        };
        let fd = q.fd();
        let obj = Box::new(ChannelObj {
            ibv: ibv_comp_channel {
                context: ctx,
                fd,
                refcnt: 0,
            },
            sh: Arc::new(ChannelShared {
                q,
                users: AtomicUsize::new(0),
            }),
        });
        return Box::into_raw(obj).cast();
    }
    forward!(
        ibv_create_comp_channel(ctx) : fn(*mut ibv_context) -> *mut ibv_comp_channel,
        null(libc::ENODEV)
    )
}

/// Whether a channel is ours.
unsafe fn channel_is_ours(ch: *const ibv_comp_channel) -> bool {
    // SAFETY: the program passes a live channel.
    !ch.is_null() && unsafe { ctx_is_ours((*ch).context) }
}

/// `ibv_destroy_comp_channel`: EBUSY while CQs use it.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_comp_channel(ch: *mut ibv_comp_channel) -> c_int {
    // SAFETY: the program passes a live channel.
    if unsafe { channel_is_ours(ch) } {
        // SAFETY: ours: `ibv` is the first field of ChannelObj.
        let o = unsafe { &*ch.cast::<ChannelObj>() };
        if o.sh.users.load(Ordering::Acquire) != 0 {
            return libc::EBUSY;
        }
        // SAFETY: reclaims the Box made in ibv_create_comp_channel.
        drop(unsafe { Box::from_raw(ch.cast::<ChannelObj>()) });
        return 0;
    }
    forward!(ibv_destroy_comp_channel(ch) : fn(*mut ibv_comp_channel) -> c_int, libc::EINVAL)
}

/// `ibv_create_cq`: `cqe` is rounded up to a power of two, as siw does;
/// 1..=`MAX_CQE` entries, else EINVAL.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_cq(
    ctx: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    // SAFETY: the program passes a live context.
    if unsafe { ctx_is_ours(ctx) } {
        if cqe < 1 || cqe as u32 > MAX_CQE || comp_vector != 0 {
            return null(libc::EINVAL);
        }
        // SAFETY: ours.
        let c = unsafe { Ctx::from_ibv(ctx) };
        let ch = if channel.is_null() {
            None
        } else {
            // SAFETY: the program passes a live channel.
            if !unsafe { channel_is_ours(channel) } {
                return null(libc::EINVAL);
            }
            // SAFETY: ours.
            let o = unsafe { &*channel.cast::<ChannelObj>() };
            o.sh.users.fetch_add(1, Ordering::AcqRel);
            Some(Arc::clone(&o.sh))
        };
        let cap = (cqe as u32).next_power_of_two() as usize;
        let eng = match c.sh.eng.create_cq(cap.min(4096)) {
            Ok(q) => q,
            Err(e) => {
                return null(
                    std::io::Error::from(e)
                        .raw_os_error()
                        .unwrap_or(libc::ENOMEM),
                )
            }
        };
        let sh = Arc::new(CqShared {
            id: NEXT_CQ.fetch_add(1, Ordering::Relaxed),
            ctx: Arc::clone(&c.sh),
            eng,
            cap,
            ibv: AtomicPtr::new(std::ptr::null_mut()),
            channel: ch,
            armed: AtomicBool::new(false),
            notify_fd: Mutex::new(None),
            overrun: AtomicBool::new(false),
            stash: Mutex::new(VecDeque::new()),
            has_stash: AtomicBool::new(false),
            users: AtomicUsize::new(0),
            events: Mutex::new(0),
            acked: Condvar::new(),
        });
        // SAFETY: zeroed mutex/cond are their static initializers on glibc.
        let mut ibv: ibv_cq = unsafe { std::mem::zeroed() };
        ibv.context = ctx;
        ibv.channel = channel;
        ibv.cq_context = cq_context;
        ibv.cqe = cap as c_int;
        let raw = Box::into_raw(Box::new(CqObj { ibv, sh }));
        // SAFETY: just made.
        let sh: &Arc<CqShared> = unsafe { &(*raw).sh };
        sh.ibv.store(raw.cast(), Ordering::Release);
        return raw.cast();
    }
    forward!(
        ibv_create_cq(ctx, cqe, cq_context, channel, comp_vector)
            : fn(*mut ibv_context, c_int, *mut c_void, *mut ibv_comp_channel, c_int) -> *mut ibv_cq,
        null(libc::ENODEV)
    )
}

/// Whether a CQ is ours.
///
/// # Safety
/// `cq` is NULL or live.
pub unsafe fn cq_is_ours(cq: *const ibv_cq) -> bool {
    // SAFETY: per the contract.
    !cq.is_null() && unsafe { ctx_is_ours((*cq).context) }
}

/// `ibv_destroy_cq`.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    // SAFETY: the program passes a live CQ.
    if unsafe { cq_is_ours(cq) } {
        // SAFETY: ours.
        let sh = Arc::clone(unsafe { shared(cq) });
        if sh.users.load(Ordering::Acquire) != 0 {
            return libc::EBUSY;
        }
        // Events still queued on the channel for this CQ go (the kernel
        // drops them too); then wait for the delivered ones to be acked.
        if let Some(ch) = &sh.channel {
            let gone = ch.q.remove_if(|r| r.0 == cq) as u64;
            *lock(&sh.events) -= gone;
        }
        {
            let mut ev = lock(&sh.events);
            // SAFETY: the program's CQ: its ack counter is ours to read.
            while unsafe { u64::from(std::ptr::read_volatile(&(*cq).comp_events_completed)) } < *ev
            {
                ev = sh
                    .acked
                    .wait(ev)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
        }
        if sh.armed.swap(false, Ordering::AcqRel) {
            sh.ctx.armed.fetch_sub(1, Ordering::AcqRel);
        }
        sh.ctx.unwatch_cq(sh.id, *lock(&sh.notify_fd));
        if let Some(ch) = &sh.channel {
            ch.users.fetch_sub(1, Ordering::AcqRel);
        }
        // SAFETY: reclaims the Box made in ibv_create_cq.
        drop(unsafe { Box::from_raw(cq.cast::<CqObj>()) });
        return 0;
    }
    forward!(ibv_destroy_cq(cq) : fn(*mut ibv_cq) -> c_int, libc::EINVAL)
}

/// `ibv_get_cq_event`.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_cq_event(
    ch: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    // SAFETY: the program passes a live channel.
    if unsafe { channel_is_ours(ch) } {
        // SAFETY: ours.
        let o = unsafe { &*ch.cast::<ChannelObj>() };
        // A hold of our own for the wait: a thread may destroy the CQs and
        // then the channel while this call blocks (as a `read` of
        // libibverbs' descriptor blocks on after a close), which freed the
        // queue under it.
        let sh = Arc::clone(&o.sh);
        return match sh.q.pop() {
            Ok(CqRef(c)) => {
                // SAFETY: out-pointers from the program; `c` is live until
                // this event is acked.
                unsafe {
                    if !cq.is_null() {
                        *cq = c;
                    }
                    if !cq_context.is_null() {
                        *cq_context = (*c).cq_context;
                    }
                }
                0
            }
            Err(e) => {
                set_errno(e);
                -1
            }
        };
    }
    forward!(
        ibv_get_cq_event(ch, cq, cq_context)
            : fn(*mut ibv_comp_channel, *mut *mut ibv_cq, *mut *mut c_void) -> c_int,
        -1
    )
}

/// `ibv_ack_cq_events`.
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, n: u32) {
    // SAFETY: the program passes a live CQ.
    if unsafe { cq_is_ours(cq) } {
        // SAFETY: ours.
        let sh = unsafe { shared(cq) };
        let _g = lock(&sh.events);
        // SAFETY: the program's CQ; updated under our lock, as libibverbs
        // does under the CQ mutex.
        unsafe { (*cq).comp_events_completed = (*cq).comp_events_completed.wrapping_add(n) };
        sh.acked.notify_all();
        return;
    }
    forward!(ibv_ack_cq_events(cq, n) : fn(*mut ibv_cq, u32) -> (), ());
}

/// `ibv_resize_cq`: not supported (siw's answer).
#[no_mangle]
pub unsafe extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    // SAFETY: the program passes a live CQ.
    if unsafe { cq_is_ours(cq) } {
        return libc::EOPNOTSUPP;
    }
    forward!(ibv_resize_cq(cq, cqe) : fn(*mut ibv_cq, c_int) -> c_int, libc::EINVAL)
}
