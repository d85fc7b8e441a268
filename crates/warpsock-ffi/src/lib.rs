//! The warpsock C ABI: `libwarpsock.so` / `libwarpsock.a` with the header
//! `include/warpsock.h` (generated from this crate by cbindgen, committed,
//! and checked for drift by `scripts/test-ffi.sh`).
//!
//! The functions mirror the Rust API of [`warpsock_engine`] on opaque
//! handles:
//!
//! | handle | made by | freed by |
//! |---|---|---|
//! | `warpsock_context` | `warpsock_context_new` (caller-driven or thread progress, busy poll) | `warpsock_context_free` |
//! | `warpsock_pd` | `warpsock_pd_new` | `warpsock_pd_free` |
//! | `warpsock_mr` | `warpsock_mr_register` (caller memory), `warpsock_mr_alloc` (owned) | `warpsock_mr_free` |
//! | `warpsock_cq` | `warpsock_cq_new`; `warpsock_cq_poll`, `warpsock_cq_wait`, `warpsock_cq_notify_fd` | `warpsock_cq_free` |
//! | `warpsock_qp_config` | `warpsock_qp_config_new` + `warpsock_qp_config_set_*` | `warpsock_qp_config_free` |
//! | `warpsock_listener` | `warpsock_listener_bind` | `warpsock_listener_free` |
//! | `warpsock_conn_request` | `warpsock_listener_accept` | `warpsock_conn_request_accept` / `_reject` / `_free` |
//! | `warpsock_qp` | `warpsock_qp_connect`, `warpsock_conn_request_accept` | `warpsock_qp_free` (graceful) / `warpsock_qp_abort` |
//!
//! # Conventions (those of rustls-ffi)
//!
//! * Fallible functions return a `warpsock_result`: 0 (`WARPSOCK_RESULT_OK`)
//!   on success, otherwise a code with a stable number whose text
//!   `warpsock_result_str` / `warpsock_result_message` give;
//!   `warpsock_last_error_detail` adds the specifics of the last failure on
//!   the calling thread.
//! * Out-parameters (`out`, `out_n`, ...) are written only on success.
//! * Every pointer argument is checked for NULL: fallible functions return
//!   `WARPSOCK_RESULT_NULL_PARAMETER`, getters a neutral value (0, false),
//!   `_free` functions do nothing.
//! * A `const` handle argument means the call does not change the object
//!   from the caller's point of view; such calls are thread-safe.
//! * Every handle is independent: objects keep what they need alive, so
//!   they may be freed in any order (free queue pairs before the completion
//!   queues they report to, or their last completions are lost).
//! * No Rust panic crosses into C: each function body runs inside
//!   `panic::ffi_panic_boundary!` and a panic becomes
//!   `WARPSOCK_RESULT_PANIC`.
//! * Enumerations are passed as `uint32_t` (their C `enum` gives the
//!   values), so an out-of-range number from C is an error, never undefined
//!   behaviour.
//!
//! # Safety
//!
//! `unsafe` lives only here, at the boundary: the `ffi` module's helpers and
//! macros that turn C pointers into references, each with its `SAFETY:`
//! argument; the pointer contracts are those documented on each function.
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]
// The extern functions take raw pointers from C by design; their pointer
// contracts are documented per function, and only `ffi` dereferences them.
#![allow(clippy::not_unsafe_ptr_arg_deref)]
// C names: `warpsock_context`, `warpsock_result`, ...
#![allow(non_camel_case_types)]

mod context;
mod cq;
mod error;
mod error_text;
mod ffi;
mod listener;
mod mr;
mod panic;
mod qp;
mod qp_config;
mod wr;

pub use context::*;
pub use cq::*;
pub use error::*;
pub use error_text::*;
pub use listener::*;
pub use mr::*;
pub use qp::*;
pub use qp_config::*;
pub use wr::*;

use panic::ffi_panic_boundary;

/// The library version as a static NUL-terminated string (e.g. "0.1.0").
#[no_mangle]
pub extern "C" fn warpsock_version() -> *const std::ffi::c_char {
    ffi_panic_boundary! {
        const V: &str = concat!(env!("CARGO_PKG_VERSION"), "\0");
        V.as_ptr().cast()
    }
}

#[cfg(test)]
mod end_to_end;
#[cfg(test)]
mod tests;
