//! `warpsock rping`: server and client as two processes on 127.0.0.1, data
//! verified on both sides (`-V`), with CRC off and on.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn rping(crc: bool) {
    let exe = env!("CARGO_BIN_EXE_warpsock");
    let port = free_port().to_string();
    // The server buffer must hold the client's pings (rping semantics).
    let mut server_args = vec![
        "rping",
        "-s",
        "-a",
        "127.0.0.1",
        "-p",
        &port,
        "-V",
        "-S",
        "65535",
    ];
    server_args.extend(["--conns", "1", "--accept-timeout", "20"]);
    let mut server = Command::new(exe)
        .args(&server_args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut client_args = vec!["rping", "-c", "-a", "127.0.0.1", "-p", &port];
    client_args.extend(["-C", "20", "-S", "1000", "-V", "--timeout", "20"]);
    if crc {
        client_args.push("--crc");
    }
    let client = Command::new(exe).args(&client_args).output().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    if server.try_wait().unwrap().is_none() {
        server.kill().unwrap(); // by pid
    }
    let server = server.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&client.stdout);
    assert!(
        client.status.success(),
        "client failed: {out}{}",
        String::from_utf8_lossy(&client.stderr)
    );
    assert!(
        server.status.success(),
        "server failed: {}{}",
        String::from_utf8_lossy(&server.stdout),
        String::from_utf8_lossy(&server.stderr)
    );
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
