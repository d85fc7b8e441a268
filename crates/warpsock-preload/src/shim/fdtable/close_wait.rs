//! Where a socket's last reference may make its close wait (`SO_LINGER`
//! {1, N > 0}): only in the thread whose own call or close dropped it, not
//! in drops made for other threads (review r26-b item 1; moved out of
//! `fdtable.rs`, past 900 lines).

thread_local! {
    /// How deep the calling thread is in drops of references that are no
    /// call of its own on their socket ([`without_close_waits`]).
    static NO_CLOSE_WAIT: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Whether a socket whose last reference the calling thread drops now may
/// make its close wait (`SO_LINGER` {1, N > 0}, `xsock/sock/close.rs`):
/// not inside [`without_close_waits`].
pub(crate) fn close_may_wait() -> bool {
    NO_CLOSE_WAIT.with(|n| n.get() == 0)
}

/// Runs `f`, which drops references the calling thread holds for no call
/// of its own on their sockets — entries a scan freed that another
/// thread's call kept (`hazard::Freed`), a walk of every socket: a close
/// made by such a drop (the socket's last reference) waits for nothing
/// there ([`close_may_wait`] false) and goes to the background at once.
/// Linux's last `fput` runs in the thread that dropped the file's last
/// reference — the closer, or the thread whose call held one (`fdget`) —
/// never in a third thread's unrelated `accept`, `close` or `epoll_wait`,
/// which here blocked for up to the linger (review r26-b item 1).
pub(crate) fn without_close_waits<R>(f: impl FnOnce() -> R) -> R {
    struct Out;
    impl Drop for Out {
        fn drop(&mut self) {
            NO_CLOSE_WAIT.with(|n| n.set(n.get() - 1));
        }
    }
    NO_CLOSE_WAIT.with(|n| n.set(n.get() + 1));
    let _out = Out;
    f()
}
