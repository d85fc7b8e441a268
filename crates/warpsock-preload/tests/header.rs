//! `include/warpsock_sockets.h` says what the library does: every constant
//! it defines has the value the library's source gives it. (Parsed from
//! the source rather than linked: linking the library into a test binary
//! would interpose that binary's own libc calls. The completion struct's
//! layout is checked on both sides: a unit test in `xsock::api` and a
//! static assertion in `tests/c/xsock.c`.) Every function it declares is
//! one the library exports, with as many parameters, and the reverse.

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

/// `warpsock_*` function name -> parameter count, of the declarations in
/// `text` (C: the name follows its return type; Rust: `extern "C" fn`).
/// Declarations may span lines.
fn functions(text: &str, rust: bool) -> HashMap<String, usize> {
    let mut out = HashMap::new();
    let mut rest = text;
    while let Some(i) = rest.find("warpsock_") {
        let at = &rest[i..];
        let before = rest[..i].trim_end();
        rest = &rest[i + "warpsock_".len()..];
        let name: String = at
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let Some(args) = at[name.len()..].strip_prefix('(') else {
            continue;
        };
        let declared = if rust {
            before.ends_with("extern \"C\" fn")
        } else {
            // A declaration: its return type ends the line's text before
            // the name (a call is preceded by `(`, `=`, `CHECK(` ...).
            let prev = before.rsplit('\n').next().unwrap_or("");
            ["int", "ssize_t", "off_t"]
                .iter()
                .any(|t| prev.trim() == *t)
        };
        if !declared {
            continue;
        }
        let args = &args[..args.find(')').expect("a parameter list")];
        let n = args
            .split(',')
            .filter(|a| !a.trim().is_empty() && a.trim() != "void")
            .count();
        out.insert(name, n);
    }
    out
}

#[test]
fn every_declared_function_is_exported_and_the_reverse() {
    let h = functions(&read("include/warpsock_sockets.h"), false);
    let lib = functions(&read("src/xsock/api.rs"), true);
    assert!(h.contains_key("warpsock_sockets_abi"), "{h:?}");
    assert!(h.len() >= 11, "the header's declarations parsed: {h:?}");
    assert_eq!(h, lib, "header (left) against src/xsock/api.rs (right)");
}
