//! A client that pipelines small requests before it reads any answer,
//! against a one-thread blocking server, both through the preload in DDP
//! mode (issue 12): `tests/c/ddppipeline.c`. It deadlocked once each
//! side's 8 B messages filled the other's receive slots; the send buffer
//! past the credits (`warpsock_xsock::io::Options::sndbuf`) lets it
//! finish as over TCP.

mod common;

use common::run;

#[test]
fn a_pipelining_client_gets_every_answer_through_the_preload() {
    let r = run("ddppipeline", &["2000".to_owned()], true);
    r.assert_ok("ddppipeline 2000");
    assert_eq!(r.stat("ddp_switched"), 2, "{}", r.stderr);
}
