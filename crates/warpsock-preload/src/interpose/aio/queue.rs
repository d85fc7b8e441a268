//! The POSIX AIO requests on managed sockets, as a queue with no threads
//! and no system calls (the workers and the calls are `super::worker`'s and
//! `super`'s): which request a worker takes next, what a cancel may take
//! back, and the bound on what a program can queue.
//!
//! As glibc's AIO does for any descriptor (`sysdeps/pthread/aio_misc.c`),
//! one descriptor's requests run one at a time, in the order they were
//! queued: two reads queued on a stream socket take its bytes in that
//! order. Different descriptors' run at once, up to the workers there are.

use std::collections::{HashMap, VecDeque};

use libc::c_int;

/// The most requests queued or running in the process at once: one more is
/// refused with `EAGAIN` ("not queued due to system resource
/// limitations", aio_read(3p)). Each is a few dozen bytes here.
pub(crate) const QUEUED_MAX: usize = 4096;

/// What a request does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Read,
    Write,
}

/// One request: the program's control block (its address) and what to do.
/// `T` is what the caller keeps with it (the notification to make).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Req<T> {
    pub(crate) cb: usize,
    pub(crate) op: Op,
    pub(crate) note: T,
}

/// What `aio_cancel` answers (aio.h: `AIO_CANCELED`, `AIO_NOTCANCELED`,
/// `AIO_ALLDONE`), with the requests taken back, each to be completed as
/// canceled (`ECANCELED`) and notified.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Canceled<T> {
    pub(crate) answer: c_int,
    pub(crate) taken: Vec<Req<T>>,
}

/// One descriptor's requests.
struct Lane<T> {
    waiting: VecDeque<Req<T>>,
    /// The control block a worker runs now.
    running: Option<usize>,
}

/// Every descriptor's requests.
pub(crate) struct Queue<T> {
    lanes: HashMap<c_int, Lane<T>>,
    /// Requests queued or running.
    outstanding: usize,
    max: usize,
}

impl<T> Default for Queue<T> {
    fn default() -> Self {
        Self::with_max(QUEUED_MAX)
    }
}

impl<T> Queue<T> {
    pub(crate) fn with_max(max: usize) -> Self {
        Self {
            lanes: HashMap::new(),
            outstanding: 0,
            max,
        }
    }

    /// Queues `req` on `fd` after its others; `false` (nothing queued) if
    /// the bound is reached.
    pub(crate) fn submit(&mut self, fd: c_int, req: Req<T>) -> bool {
        if self.outstanding >= self.max {
            return false;
        }
        self.outstanding += 1;
        self.lanes
            .entry(fd)
            .or_insert_with(|| Lane {
                waiting: VecDeque::new(),
                running: None,
            })
            .waiting
            .push_back(req);
        true
    }

    /// The next request for a worker: the first of a descriptor none runs
    /// now, marked running until [`Self::finish`].
    pub(crate) fn take(&mut self) -> Option<(c_int, Req<T>)> {
        let (&fd, lane) = self
            .lanes
            .iter_mut()
            .find(|(_, l)| l.running.is_none() && !l.waiting.is_empty())?;
        let req = lane.waiting.pop_front()?;
        lane.running = Some(req.cb);
        Some((fd, req))
    }

    /// How many requests workers could take now, one per descriptor
    /// ([`Self::take`]): as many workers as this, and none waits behind
    /// another descriptor's request (a read that waits for bytes).
    pub(crate) fn ready(&self) -> usize {
        self.lanes
            .values()
            .filter(|l| l.running.is_none() && !l.waiting.is_empty())
            .count()
    }

    /// The request running on `fd` ended.
    pub(crate) fn finish(&mut self, fd: c_int) {
        if let Some(lane) = self.lanes.get_mut(&fd) {
            if lane.running.take().is_some() {
                self.outstanding -= 1;
            }
            if lane.waiting.is_empty() {
                self.lanes.remove(&fd);
            }
        }
    }

    /// Whether control block `cb` is queued or running here.
    pub(crate) fn holds(&self, cb: usize) -> bool {
        self.lanes
            .values()
            .any(|l| l.running == Some(cb) || l.waiting.iter().any(|r| r.cb == cb))
    }

    /// `aio_cancel(fd, cb)`: a request still waiting is taken back; one
    /// running cannot be (`AIO_NOTCANCELED`, as glibc answers for one its
    /// thread runs); `None` for every request of `fd`.
    pub(crate) fn cancel(&mut self, fd: c_int, cb: Option<usize>) -> Canceled<T> {
        let done = |taken| Canceled {
            answer: libc::AIO_ALLDONE,
            taken,
        };
        let Some(lane) = self.lanes.get_mut(&fd) else {
            return done(Vec::new());
        };
        let taken: Vec<Req<T>> = match cb {
            Some(cb) => {
                if lane.running == Some(cb) {
                    return Canceled {
                        answer: libc::AIO_NOTCANCELED,
                        taken: Vec::new(),
                    };
                }
                let Some(at) = lane.waiting.iter().position(|r| r.cb == cb) else {
                    return done(Vec::new());
                };
                lane.waiting.remove(at).into_iter().collect()
            }
            None => lane.waiting.drain(..).collect(),
        };
        self.outstanding -= taken.len();
        let running = lane.running.is_some();
        if !running {
            self.lanes.remove(&fd);
        }
        let answer = if running && cb.is_none() {
            libc::AIO_NOTCANCELED
        } else if taken.is_empty() {
            libc::AIO_ALLDONE
        } else {
            libc::AIO_CANCELED
        };
        Canceled { answer, taken }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(cb: usize) -> Req<()> {
        Req {
            cb,
            op: Op::Read,
            note: (),
        }
    }

    #[test]
    fn one_descriptors_requests_run_one_at_a_time_in_order() {
        let mut q = Queue::default();
        assert!(q.submit(5, req(1)));
        assert!(q.submit(5, req(2)));
        assert!(q.submit(6, req(3)));
        // Two descriptors: two workers' worth.
        assert_eq!(q.ready(), 2);
        let mut first = vec![q.take().unwrap(), q.take().unwrap()];
        first.sort_by_key(|(fd, _)| *fd);
        assert_eq!(first, vec![(5, req(1)), (6, req(3))]);
        // 5's second waits for its first.
        assert_eq!(q.take(), None);
        assert_eq!(q.ready(), 0);
        q.finish(5);
        assert_eq!(q.ready(), 1);
        assert_eq!(q.take(), Some((5, req(2))));
        q.finish(5);
        q.finish(6);
        assert!(!q.holds(1) && !q.holds(2) && !q.holds(3));
        assert_eq!(q.outstanding, 0);
        assert!(q.lanes.is_empty());
    }

    #[test]
    fn the_bound_refuses_one_more_until_one_ends() {
        let mut q = Queue::with_max(2);
        assert!(q.submit(5, req(1)));
        assert!(q.submit(6, req(2)));
        assert!(!q.submit(7, req(3)));
        let (fd, _) = q.take().unwrap();
        q.finish(fd);
        assert!(q.submit(7, req(3)));
    }

    #[test]
    fn a_waiting_request_is_taken_back_and_a_running_one_is_not() {
        let mut q = Queue::default();
        q.submit(5, req(1));
        q.submit(5, req(2));
        q.submit(5, req(3));
        assert_eq!(q.take(), Some((5, req(1))));
        assert!(q.holds(1) && q.holds(2));
        let c = q.cancel(5, Some(1));
        assert_eq!((c.answer, c.taken), (libc::AIO_NOTCANCELED, vec![]));
        let c = q.cancel(5, Some(2));
        assert_eq!((c.answer, c.taken), (libc::AIO_CANCELED, vec![req(2)]));
        let c = q.cancel(5, Some(2));
        assert_eq!(c.answer, libc::AIO_ALLDONE);
        // All of 5's: 3 taken back, 1 still runs.
        let c = q.cancel(5, None);
        assert_eq!((c.answer, c.taken), (libc::AIO_NOTCANCELED, vec![req(3)]));
        q.finish(5);
        assert_eq!(q.cancel(5, None).answer, libc::AIO_ALLDONE);
        assert_eq!(q.outstanding, 0);
    }

    #[test]
    fn cancelling_every_waiting_request_of_an_idle_descriptor() {
        let mut q = Queue::default();
        q.submit(5, req(1));
        q.submit(5, req(2));
        let c = q.cancel(5, None);
        assert_eq!(c.answer, libc::AIO_CANCELED);
        assert_eq!(c.taken, vec![req(1), req(2)]);
        assert_eq!(q.take(), None);
        assert_eq!(q.outstanding, 0);
    }
}
