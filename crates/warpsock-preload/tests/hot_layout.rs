//! The hot-functions layout (`hot.ld`, passed to the linker by `build.rs`):
//! the library has the section, and each of the script's function names
//! still names a function placed in it. A function renamed or moved to
//! another module would silently leave the small-message path (its
//! pattern matching nothing, which the linker does not report), so this
//! fails instead: run `scripts/hot-functions.sh` to regenerate the script.
//!
//! Names pinned to one instance of a generic function (with its hash) are
//! not checked: another build's crate metadata names the instance
//! otherwise (`hot.ld`'s header). Needs binutils' `objdump`.

mod common;

use std::process::Command;

/// The output section `hot.ld` makes.
const SECTION: &str = ".text.warpsock_hot";

/// `hot.ld`'s input section patterns (`*(.text.NAME)` lines): the names.
fn patterns() -> Vec<String> {
    let ld = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/hot.ld"))
        .expect("read hot.ld");
    ld.lines()
        .filter_map(|l| l.trim().strip_prefix("*(.text.")?.strip_suffix(')'))
        .map(str::to_owned)
        .collect()
}

/// Whether `name` matches `pat`, whose only wildcard is `*` (any run of
/// characters), as the linker matches it.
fn glob(pat: &str, name: &str) -> bool {
    let mut parts = pat.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for p in middle {
        match rest.find(p) {
            Some(i) => rest = &rest[i + p.len()..],
            None => return false,
        }
    }
    rest.ends_with(last)
}

/// The library's function symbols: (name, section).
fn functions() -> Vec<(String, String)> {
    let so = common::preload_so();
    let out = Command::new("objdump")
        .arg("-t")
        .arg(so)
        .output()
        .expect("run objdump (binutils)");
    assert!(out.status.success(), "objdump -t {} failed", so.display());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            // ADDR FLAGS… SECTION\tSIZE [.hidden] NAME (the flags are
            // columns of their own, some blank).
            let (head, tail) = l.split_once('\t')?;
            let section = head.split_whitespace().last()?;
            let name = tail.split_whitespace().last()?;
            Some((name.to_owned(), section.to_owned()))
        })
        .collect()
}

#[test]
fn globs_match_as_the_linker_matches() {
    assert!(glob("a17h*", "a17h0123E"));
    assert!(glob("a17h*", "a17h0123E.llvm.42"));
    assert!(!glob("a17h*", "ab17h0123E"));
    assert!(glob("readv", "readv"));
    assert!(!glob("read", "readv"));
    assert!(glob("x*y*z", "x1y2z"));
    assert!(!glob("x*y*z", "x1z2y"));
}

#[test]
fn every_hot_function_named_is_in_the_hot_section() {
    let pats = patterns();
    assert!(
        pats.len() >= 20,
        "hot.ld names {} functions: regenerate it (scripts/hot-functions.sh)",
        pats.len()
    );
    let fns = functions();
    assert!(
        fns.iter().any(|(_, s)| s == SECTION),
        "the library has no {SECTION} section: build.rs no longer passes hot.ld?"
    );
    // A pattern with a hash of its own pins a generic instance: not checked.
    let pinned = |p: &str| p.contains("17h") && !p.ends_with("17h*");
    let stale: Vec<&String> = pats
        .iter()
        .filter(|p| !pinned(p))
        .filter(|p| {
            !fns.iter()
                .any(|(name, section)| section == SECTION && glob(p, name))
        })
        .collect();
    assert!(
        stale.is_empty(),
        "hot.ld names functions the library's {SECTION} does not hold (renamed or moved?): \
         run scripts/hot-functions.sh to regenerate it:\n{}",
        stale
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
}
