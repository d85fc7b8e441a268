//! Links the shared library `-z nodelete`: a thread-specific key's
//! destructor in it runs at every thread's exit, so it must never be
//! unmapped by a `dlclose` (tests/nodelete.rs).
//!
//! And with `hot.ld`, a linker script fragment (`INSERT BEFORE .text`, which
//! GNU ld and LLD both take) that places the small-message data path's
//! functions together at the front of the code: a DDP-mode round trip then
//! runs through ~15 pages of code instead of ~42 (`scripts/hot-functions.sh`
//! regenerates it; `tests/hot_layout.rs` checks that it still names the
//! functions).

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-T,{dir}/hot.ld");
    println!("cargo:rerun-if-changed=hot.ld");
    println!("cargo:rerun-if-changed=build.rs");
}
