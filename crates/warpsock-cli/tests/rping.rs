//! `warpsock rping`: server and client as two processes on 127.0.0.1, data
//! verified on both sides (`-V`), with CRC off and on.

use std::process::{Command, Stdio};
use std::time::Duration;

use warpsock_testkit::{finish, listening_port, Guard};

fn rping(crc: bool) {
    let exe = env!("CARGO_BIN_EXE_warpsock");
    // The server binds port 0 and says which port it got: no other program
    // can take it first (a leased number could be bound by one that does
    // not lease: the client then met that listener, the server no port).
    let server_args = [
        "rping",
        "-s",
        "-a",
        "127.0.0.1",
        "-p",
        "0",
        "-V",
        // The server buffer must hold the client's pings (rping semantics).
        "-S",
        "65535",
        "--conns",
        "1",
        "--accept-timeout",
        "20",
    ];
    let mut server = Guard(
        Command::new(exe)
            .args(server_args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let port = listening_port(&mut server.0).to_string();
    let mut client_args = vec!["rping", "-c", "-a", "127.0.0.1", "-p", &port];
    client_args.extend(["-C", "20", "-S", "1000", "-V", "--timeout", "20"]);
    if crc {
        client_args.push("--crc");
    }
    let client = Command::new(exe)
        .args(&client_args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let client = finish(client, Duration::from_secs(30));
    let server = finish(server.into_inner(), Duration::from_secs(30));
    // The server's own account first: a client that found nobody listening
    // is explained by it.
    server.assert_ok("server");
    client.assert_ok("client");
    let out = &client.stdout;
    assert!(
        out.contains("20"),
        "client report names its 20 iterations: {out}"
    );
}

#[test]
fn rping_between_processes_crc_off() {
    rping(false);
}

#[test]
fn rping_between_processes_crc_on() {
    rping(true);
}
