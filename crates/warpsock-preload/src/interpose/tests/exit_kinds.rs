//! Every kind's exit handler, as the interposer calls them
//! (`exit_kinds`), is told what the exit runs over
//! (`shim::guard::ExitOver`). Made here so that the shim's tests never
//! name the interposer.

use crate::shim::guard::{enter, ExitOver};
use crate::shim::socket::{Adoption, Kind};

/// Every kind's exit handler is told the same thing the exit runs
/// over, in either order of the kinds: over a marked sleep, the sleep
/// (whose mark the first look takes), over a call's other stretch,
/// its locks, and outside the library, nothing (review r26-d item 6).
/// Fails (the second kind told `Locks` over the sleep) with the look
/// made by each kind in turn.
#[test]
fn every_kind_is_told_the_same_exit_whatever_their_order() {
    use std::sync::Mutex;
    static TOLD: Mutex<Vec<(u8, ExitOver)>> = Mutex::new(Vec::new());
    struct Rec(u8);
    impl Kind for Rec {
        fn enabled(&self) -> bool {
            false
        }
        fn wants(&self, _: libc::c_int, _: libc::c_int, _: libc::c_int) -> bool {
            false
        }
        fn bound(&self, _: libc::c_int, _: std::net::SocketAddr) {}
        fn adopt(&self, _: libc::c_int, _: std::net::SocketAddr) -> Adoption {
            Adoption::Never
        }
        fn at_exit(&self, over: ExitOver) {
            TOLD.lock().unwrap().push((self.0, over));
        }
    }
    let told = |kinds: &[&dyn Kind], run: &dyn Fn(&[&dyn Kind])| {
        TOLD.lock().unwrap().clear();
        run(kinds);
        std::mem::take(&mut *TOLD.lock().unwrap())
    };
    let (a, b) = (Rec(1), Rec(2));
    for kinds in [[&a as &dyn Kind, &b], [&b, &a]] {
        let over_sleep = told(&kinds, &|k| {
            enter((), || {
                warpsock_engine::asleep::unlocked(|| {
                    super::super::exit_kinds(k, ExitOver::now());
                });
            });
        });
        assert_eq!(over_sleep.len(), 2);
        for (_, over) in &over_sleep {
            assert!(matches!(over, ExitOver::Sleep(_)), "{over_sleep:?}");
        }
        let over_locks = told(&kinds, &|k| {
            enter((), || super::super::exit_kinds(k, ExitOver::now()));
        });
        assert!(
            over_locks.iter().all(|(_, o)| *o == ExitOver::Locks),
            "{over_locks:?}"
        );
        let outside = told(&kinds, &|k| {
            super::super::exit_kinds(k, ExitOver::now());
        });
        assert!(
            outside.iter().all(|(_, o)| *o == ExitOver::Nothing),
            "{outside:?}"
        );
    }
}
