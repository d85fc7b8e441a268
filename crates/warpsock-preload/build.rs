//! Links the shared library `-z nodelete`: a thread-specific key's
//! destructor in it runs at every thread's exit, so it must never be
//! unmapped by a `dlclose` (tests/nodelete.rs).

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    println!("cargo:rerun-if-changed=build.rs");
}
