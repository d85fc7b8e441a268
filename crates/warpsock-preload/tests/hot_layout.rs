//! The hot-functions layout (`hot.ld`, passed to the linker by `build.rs`):
//! the script's functions come first in the library's `.text`, and each of
//! its function names still names one of them. A function renamed or moved
//! to another module would silently leave the small-message path (its
//! pattern matching nothing, which the linker does not report), so this
//! fails instead: run `scripts/hot-functions.sh` to regenerate the script.
//!
//! The names are v0-mangled (`.cargo/config.toml`), so an instance of a
//! generic function is named by its type arguments, not by a hash of the
//! crate metadata (which changes with the packages a build selects); the
//! script leaves the crate hashes open. Nothing is checked when the
//! compiler is not the one the script was generated with (std's names may
//! differ): the test says so and regenerating fixes it.
//!
//! Needs binutils' `objdump`.

mod common;

use std::collections::BTreeMap;
use std::process::Command;

/// The most functions one pattern may name: its function, its merged
/// copies and its instances of other crates (scripts/lib/hot_functions.py's
/// `MAX_MATCHES`).
const MAX_MATCHES: usize = 8;

/// `hot.ld`'s text.
fn script() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/hot.ld")).expect("read hot.ld")
}

/// The script's input section patterns (`*(.text.NAME)` lines): the names.
fn patterns(ld: &str) -> Vec<String> {
    ld.lines()
        .filter_map(|l| l.trim().strip_prefix("*(.text.")?.strip_suffix(')'))
        .map(str::to_owned)
        .collect()
}

/// The compiler the script's names come from (its header's line).
fn generated_with(ld: &str) -> Option<&str> {
    ld.lines()
        .find_map(|l| l.split_once("generated with: "))
        .map(|(_, v)| v.trim_end_matches("*/").trim())
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

/// The library's functions in `.text`, by address: each address's names
/// (LTO may keep several names for one body).
fn text_functions() -> BTreeMap<u64, Vec<String>> {
    let so = common::preload_so();
    let out = Command::new("objdump")
        .arg("-t")
        .arg(so)
        .output()
        .expect("run objdump (binutils)");
    assert!(out.status.success(), "objdump -t {} failed", so.display());
    let mut fns: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for l in String::from_utf8_lossy(&out.stdout).lines() {
        // ADDR FLAGS… SECTION\tSIZE [.hidden] NAME (the flags are
        // columns of their own, some blank; `F`: a function).
        let Some((head, tail)) = l.split_once('\t') else {
            continue;
        };
        let mut cols = head.split_whitespace();
        let (Some(addr), Some(section)) = (cols.next(), head.split_whitespace().last()) else {
            continue;
        };
        if section != ".text" || !head.split_whitespace().any(|c| c == "F") {
            continue;
        }
        let (Ok(addr), Some(name)) = (
            u64::from_str_radix(addr, 16),
            tail.split_whitespace().last(),
        ) else {
            continue;
        };
        fns.entry(addr).or_default().push(name.to_owned());
    }
    fns
}

/// Whether `pat` holds a legacy name's hash: `17h`, 16 hex digits, `E`.
fn legacy_hash(pat: &str) -> bool {
    pat.match_indices("17h").any(|(i, _)| {
        let h = pat.as_bytes().get(i + 3..i + 20);
        h.is_some_and(|h| h[..16].iter().all(u8::is_ascii_hexdigit) && h[16] == b'E')
    })
}

#[test]
fn globs_match_as_the_linker_matches() {
    assert!(legacy_hash("_ZN4core3ptr4read17h0123456789abcdefE*"));
    assert!(!legacy_hash("_RNvNtCs*_5crate2io17handle_the_events*"));
    assert!(glob("readv", "readv"));
    assert!(!glob("read", "readv"));
    assert!(glob("x*y*z", "x1y2z"));
    assert!(glob(
        "_RNvNtCs*_5crate2io4read*",
        "_RNvNtCs1Jr7yJJVXQ8_5crate2io4read.llvm.7"
    ));
    assert!(!glob("x*y*z", "x1z2y"));
}

#[test]
fn the_hot_functions_named_come_first_in_the_code() {
    let ld = script();
    let pats = patterns(&ld);
    assert!(
        pats.len() >= 20,
        "hot.ld names {} functions: regenerate it (scripts/hot-functions.sh)",
        pats.len()
    );
    // A legacy name's hash (`17h…E`) would pin one build's metadata.
    let hashed: Vec<&String> = pats.iter().filter(|p| legacy_hash(p)).collect();
    assert!(
        hashed.is_empty(),
        "hot.ld holds legacy-mangled names, which move with the crate metadata \
         (is RUSTFLAGS overriding .cargo/config.toml?): {hashed:?}"
    );
    let built = env!("WARPSOCK_RUSTC_VERSION");
    match generated_with(&ld) {
        Some(v) if v == built => {}
        v => {
            eprintln!(
                "hot_layout: hot.ld was generated with {v:?}, this build's compiler is \
                 {built:?}: its names are not checked (run scripts/hot-functions.sh)"
            );
            return;
        }
    }
    // The functions before the first one the script does not name: the
    // script's, placed first (a build without the script has none there).
    let fns = text_functions();
    assert!(
        fns.values().flatten().any(|n| n.starts_with("_R")),
        "the library's names are not v0-mangled: RUSTFLAGS overrides .cargo/config.toml \
         (symbol-mangling-version=v0), and hot.ld's names match nothing"
    );
    let named = |names: &[String]| names.iter().any(|n| pats.iter().any(|p| glob(p, n)));
    let first: Vec<&String> = fns
        .values()
        .take_while(|names| named(names))
        .flatten()
        .collect();
    assert!(
        first.len() >= 20,
        "only {} functions come first in .text before one hot.ld does not name: \
         build.rs no longer passes hot.ld? (first: {:?})",
        first.len(),
        fns.values().next()
    );
    // A pattern so open that it names other functions too pulls them into
    // the hot pages (hot_functions.py's MAX_MATCHES).
    let all: Vec<&String> = fns.values().flatten().collect();
    let loose: Vec<(usize, &String)> = pats
        .iter()
        .map(|p| (all.iter().filter(|n| glob(p, n)).count(), p))
        .filter(|(hits, _)| *hits > MAX_MATCHES)
        .collect();
    assert!(
        loose.is_empty(),
        "hot.ld patterns naming more than {MAX_MATCHES} functions each (regenerate it: \
         scripts/hot-functions.sh): {loose:?}"
    );
    let stale: Vec<&String> = pats
        .iter()
        .filter(|p| !first.iter().any(|name| glob(p, name)))
        .collect();
    assert!(
        stale.is_empty(),
        "hot.ld names functions that do not come first in the library's code (renamed or \
         moved?): run scripts/hot-functions.sh to regenerate it:\n{}",
        stale
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
}
