//! Every operation between two threads over 127.0.0.1, for each progress
//! mode on each side and CRC on and off.

mod common;

use common::{run_every_op, serve_every_op, VERDICT_LEN};
use warpsock_engine::{Listener, Progress};

fn every_op(server: Progress, client: Progress, crc: bool) {
    let listener = Listener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let s = std::thread::spawn(move || serve_every_op(&listener, server, crc));
    run_every_op(addr, client, crc);
    assert_eq!(s.join().unwrap(), vec![1; VERDICT_LEN]);
}

#[test]
fn every_op_caller_caller_crc_off() {
    every_op(Progress::Caller, Progress::Caller, false);
}

#[test]
fn every_op_caller_caller_crc_on() {
    every_op(Progress::Caller, Progress::Caller, true);
}

#[test]
fn every_op_thread_thread_crc_off() {
    every_op(Progress::Thread, Progress::Thread, false);
}

#[test]
fn every_op_thread_caller_crc_on() {
    every_op(Progress::Thread, Progress::Caller, true);
}

#[test]
fn every_op_caller_thread_crc_on() {
    every_op(Progress::Caller, Progress::Thread, true);
}
