//! Links the shared library `-z nodelete`: a thread-specific key's
//! destructor in it runs at every thread's exit, so it must never be
//! unmapped by a `dlclose` (tests/nodelete.rs).
//!
//! And with `hot.ld`, a linker script fragment (a `.text` whose first
//! input sections are the small-message data path's functions, `INSERT
//! AFTER .init`; LLD, the toolchain's linker, and GNU ld both take it): an
//! event-mode DDP round trip then runs through ~8 pages of the library's
//! code, not ~35 (`scripts/hot-functions.sh` regenerates it;
//! `tests/hot_layout.rs` checks that it still names the functions, given
//! the compiler's version this script passes on; BENCHMARKS.md section 6,
//! sessions 31 and 32). Given to the compiler driver as `-T` (not
//! `-Wl,-T,…`, which a comma in the path would split). Its names are v0
//! (`.cargo/config.toml`); a build whose flags drop that (`RUSTFLAGS` in
//! the environment overrides the file) names nothing in it, so the data
//! path stays scattered: this script warns.

use std::process::Command;

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    println!("cargo:rustc-cdylib-link-arg=-T{dir}/hot.ld");
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = Command::new(rustc)
        .arg("-V")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    println!("cargo:rustc-env=WARPSOCK_RUSTC_VERSION={version}");
    let flags = std::env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    if !flags
        .split('\x1f')
        .any(|f| f.ends_with("symbol-mangling-version=v0"))
    {
        println!(
            "cargo:warning=warpsock-preload: built without symbol-mangling-version=v0 \
             (RUSTFLAGS overrides .cargo/config.toml?): hot.ld names none of the data \
             path's functions, which stay scattered over the library's code"
        );
    }
    println!("cargo:rerun-if-changed=hot.ld");
    println!("cargo:rerun-if-env-changed=CARGO_ENCODED_RUSTFLAGS");
    println!("cargo:rerun-if-changed=build.rs");
}
