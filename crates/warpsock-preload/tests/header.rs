//! `include/warpsock_sockets.h` says what the library does: every constant
//! it defines has the value the library's source gives it. (Parsed from
//! the source rather than linked: linking the library into a test binary
//! would interpose that binary's own libc calls. The completion struct's
//! layout is checked on both sides: a unit test in `xsock::api` and a
//! static assertion in `tests/c/xsock.c`.)

use std::collections::HashMap;

fn read(rel: &str) -> String {
    std::fs::read_to_string(format!("{}/{rel}", env!("CARGO_MANIFEST_DIR"))).expect(rel)
}

fn number(s: &str) -> Option<i64> {
    let s = s.trim().trim_end_matches(';').replace('_', "");
    match s.strip_prefix("0x") {
        Some(hex) => i64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

fn header() -> HashMap<String, i64> {
    read("include/warpsock_sockets.h")
        .lines()
        .filter_map(|l| l.strip_prefix("#define "))
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            Some((it.next()?.to_string(), number(it.next()?)?))
        })
        .collect()
}

/// `pub const NAME: T = VALUE;` in a source file, by the header's name.
fn source(rel: &str, names: &[(&str, &str)]) -> HashMap<String, i64> {
    let src = read(rel);
    names
        .iter()
        .map(|(c_name, rust_name)| {
            let line = src
                .lines()
                .find(|l| {
                    l.trim_start()
                        .starts_with(&format!("pub const {rust_name}:"))
                })
                .unwrap_or_else(|| panic!("{rust_name} in {rel}"));
            let v = number(line.split('=').nth(1).expect("a value")).expect("a number");
            (c_name.to_string(), v)
        })
        .collect()
}

#[test]
fn every_header_constant_matches_the_library() {
    let h = header();
    let mut lib = source(
        "src/xsock/mod.rs",
        &[
            ("SOL_WARPSOCK", "SOL_WARPSOCK"),
            ("WARPSOCK_DDP_MODE", "WARPSOCK_DDP_MODE"),
            ("WARPSOCK_MSG_MODE", "WARPSOCK_MSG_MODE"),
            ("WARPSOCK_CRC", "WARPSOCK_CRC"),
        ],
    );
    lib.extend(source(
        "src/xsock/api.rs",
        &[
            ("WARPSOCK_AIO_SEND", "AIO_SEND"),
            ("WARPSOCK_AIO_RECV", "AIO_RECV"),
            ("WARPSOCK_AIO_WRITE", "AIO_WRITE"),
            ("WARPSOCK_AIO_READ", "AIO_READ"),
            ("WARPSOCK_IOV_MAX", "IOV_MAX"),
            ("WARPSOCK_SOCKETS_ABI", "SOCKETS_ABI"),
        ],
    ));
    let defined: Vec<&String> = h
        .keys()
        .filter(|k| k.as_str() != "WARPSOCK_SOCKETS_H")
        .collect();
    assert_eq!(defined.len(), lib.len(), "header defines {defined:?}");
    for (name, v) in &lib {
        assert_eq!(h.get(name), Some(v), "{name}");
    }
    // Far above every kernel option level (protocol numbers, SOL_* < 300).
    assert!(h["SOL_WARPSOCK"] > 0xffff);
}
