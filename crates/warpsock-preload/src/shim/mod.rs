//! Shared interposition infrastructure: everything a kind of managed socket
//! (today the UDP offload, the `udp` module) builds on, and nothing specific
//! to any of them. Nothing in here imports a socket kind.
//!
//! | module | what it owns |
//! |---|---|
//! | [`real`] | the real libc entry points (`dlsym(RTLD_NEXT)`, resolved lazily) |
//! | [`guard`] | the per-thread re-entrancy guard and the panic boundary |
//! | [`fdtable`] | which descriptors are managed (and by which socket object) or candidates of a kind |
//! | [`socket`] | the two traits a kind implements: [`socket::Socket`] (one managed descriptor) and [`socket::Kind`] (adoption and process life-cycle hooks) |
//! | [`reactor`] | the progress thread: one epoll set plus timers, driving [`reactor::Handler`]s |
//! | [`doorbell`] | the AF_UNIX pair whose one end the program holds, so its own poll/select/epoll report readiness |
//! | [`epollcarry`] | the program's epoll registrations follow its descriptor number when a swap makes it name another file |
//! | [`sigio`] | the program's signal-driven I/O settings (`O_ASYNC`, owner, signal) follow its number through a swap too |
//! | [`epollwatch`] | the program's epoll sets watch managed sockets' connections themselves (registered there with tags) |
//! | [`iov`] | the program's scatter/gather buffers |
//! | [`sys`] | small safe wrappers (errno, socket addresses, options, poll) |
//! | `hooks` | test-only delays, compiled with the `test-hooks` feature only |
//!
//! The exported symbols themselves live in the `interpose` module, which maps
//! each call onto a managed socket, a kind's adoption hook, or the real
//! function.

pub(crate) mod doorbell;
pub(crate) mod epollcarry;
pub(crate) mod epollwatch;
pub(crate) mod fdtable;
#[cfg(test)]
pub(crate) mod forktest;
pub(crate) mod guard;
#[cfg(feature = "test-hooks")]
pub(crate) mod hooks;
pub(crate) mod iov;
pub(crate) mod reactor;
pub(crate) mod real;
pub(crate) mod sigio;
pub(crate) mod socket;
pub(crate) mod sys;
