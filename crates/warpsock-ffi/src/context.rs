//! Contexts (the unit of progress) and protection domains.

use std::time::Duration;

use warpsock_engine::{Context, ContextOptions, Pd, Progress};

use crate::error::{engine_error, fail, warpsock_result};
use crate::ffi::{to_boxed_mut_ptr, try_out, try_ref_from_ptr, try_take, Castable};
use crate::panic::ffi_panic_boundary;

/// How a context makes progress (the `progress` argument of
/// `warpsock_context_new`).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum warpsock_progress {
    /// Progress happens inside the application's calls: posts transmit at
    /// once, `warpsock_cq_poll` and `warpsock_cq_wait` receive. Lowest
    /// latency; nothing moves while the application is away computing.
    Caller = 0,
    /// A background thread per context receives and finishes transmits,
    /// so operations complete while the application computes; block in
    /// `warpsock_cq_wait` or on `warpsock_cq_notify_fd`.
    Thread = 1,
}

impl warpsock_progress {
    fn from_u32(n: u32) -> Option<Progress> {
        match n {
            0 => Some(Progress::Caller),
            1 => Some(Progress::Thread),
            _ => None,
        }
    }
}

/// A device context: owns the sockets, memory registrations and completion
/// queues of everything created from it. Objects made from a context keep
/// it alive, so handles may be freed in any order; a progress thread stops
/// when the context and everything made from it are freed. All functions
/// on a context may be called from any thread.
pub struct warpsock_context {
    _private: [u8; 0],
}

impl Castable for warpsock_context {
    type RustType = Context;
}

/// A protection domain: memory regions and queue pairs of one domain may
/// be used together; the peer's STags are checked against it.
pub struct warpsock_pd {
    _private: [u8; 0],
}

impl Castable for warpsock_pd {
    type RustType = Pd;
}

/// Creates a context. `progress` is a `warpsock_progress` value;
/// `busy_poll_us` (caller-driven mode only) is how long `warpsock_cq_wait`
/// spins polling the sockets before it sleeps in the kernel (0: sleep at
/// once), trading a CPU for latency. On success stores a new context in
/// `*out`; free it with `warpsock_context_free`.
///
/// Errors: `WARPSOCK_RESULT_INVALID_PARAMETER` for an unknown `progress`,
/// `WARPSOCK_RESULT_IO` if the epoll set, eventfd or thread cannot be made.
#[no_mangle]
pub extern "C" fn warpsock_context_new(
    progress: u32,
    busy_poll_us: u64,
    out: *mut *mut warpsock_context,
) -> warpsock_result {
    ffi_panic_boundary! {
        let out = try_out!(out);
        let Some(progress) = warpsock_progress::from_u32(progress) else {
            return fail(
                warpsock_result::InvalidParameter,
                format_args!("progress mode {progress} is not 0 (caller) or 1 (thread)"),
            );
        };
        let opts = ContextOptions {
            progress,
            busy_poll: Duration::from_micros(busy_poll_us),
            ..ContextOptions::default()
        };
        match Context::with_options(opts) {
            Ok(ctx) => {
                out.write(to_boxed_mut_ptr(ctx));
                warpsock_result::Ok
            }
            Err(e) => engine_error(&e),
        }
    }
}

/// Frees a context handle (NULL is ignored). Objects created from it stay
/// usable until they are freed themselves.
#[no_mangle]
pub extern "C" fn warpsock_context_free(ctx: *mut warpsock_context) {
    ffi_panic_boundary! {
        drop(try_take!(ctx));
    }
}

/// The context's progress mode (a `warpsock_progress` value); 0 (caller)
/// for NULL.
#[no_mangle]
pub extern "C" fn warpsock_context_progress_mode(ctx: *const warpsock_context) -> u32 {
    ffi_panic_boundary! {
        let ctx = try_ref_from_ptr!(ctx);
        match ctx.progress_mode() {
            Progress::Thread => warpsock_progress::Thread as u32,
            _ => warpsock_progress::Caller as u32,
        }
    }
}

/// Caller-driven mode: one non-blocking round of progress on every queue
/// pair of the context (receive and transmit). Returns whether anything
/// completed; `false` for NULL and in progress-thread mode.
#[no_mangle]
pub extern "C" fn warpsock_context_progress(ctx: *const warpsock_context) -> bool {
    ffi_panic_boundary! {
        try_ref_from_ptr!(ctx).progress()
    }
}

/// Allocates a protection domain in `ctx`. On success stores it in `*out`;
/// free it with `warpsock_pd_free`.
#[no_mangle]
pub extern "C" fn warpsock_pd_new(
    ctx: *const warpsock_context,
    out: *mut *mut warpsock_pd,
) -> warpsock_result {
    ffi_panic_boundary! {
        let ctx = try_ref_from_ptr!(ctx);
        let out = try_out!(out);
        out.write(to_boxed_mut_ptr(ctx.alloc_pd()));
        warpsock_result::Ok
    }
}

/// Frees a protection domain handle (NULL is ignored). Regions and queue
/// pairs created in it stay usable until they are freed themselves.
#[no_mangle]
pub extern "C" fn warpsock_pd_free(pd: *mut warpsock_pd) {
    ffi_panic_boundary! {
        drop(try_take!(pd));
    }
}
