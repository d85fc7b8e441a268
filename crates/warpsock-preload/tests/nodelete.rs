//! The library is never unloaded: each thread that made a managed data
//! call has its hazard slot given back by a thread-specific key's
//! destructor in the library (`shim::fdtable::hazard`), which glibc calls
//! at the thread's exit whether or not the library is still mapped, and a
//! key pins nothing (review r20-xhaz2a item 7). Linked `-z nodelete`
//! (build.rs): a `dlclose` leaves it loaded.

mod common;

#[test]
fn dlclose_leaves_the_library_loaded() {
    let prog = common::c_program("nodelete");
    let out = std::process::Command::new(&prog)
        .arg(common::preload_so())
        .output()
        .expect("run nodelete");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout.trim(), "kept");
}
