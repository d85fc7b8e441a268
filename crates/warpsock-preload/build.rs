//! Links the shared library `-z nodelete`: a thread-specific key's
//! destructor in it runs at every thread's exit, so it must never be
//! unmapped by a `dlclose` (tests/nodelete.rs).
//!
//! And with `hot.ld`, a linker script fragment (`INSERT BEFORE .text`, which
//! GNU ld and LLD both take) that places the small-message data path's
//! functions together at the front of the code: an event-mode DDP round
//! trip then runs through ~9 pages of the library's code, not ~35
//! (`scripts/hot-functions.sh` regenerates it; `tests/hot_layout.rs` checks
//! that it still names the functions; BENCHMARKS.md section 6, session 31).

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-T,{dir}/hot.ld");
    println!("cargo:rerun-if-changed=hot.ld");
    println!("cargo:rerun-if-changed=build.rs");
}
