//! stdio streams on DDP-mode sockets (`tests/c/stdio.c`; issue 12): the
//! interposed `fdopen` makes a stream that reads, writes and closes
//! through the library, and `dprintf`/`vdprintf` send through it. The
//! program is built with AddressSanitizer and UBSan (and a few cases once
//! without: [`unsanitized`]); each case runs without the preload (plain
//! TCP: the behaviour asked for), then preloaded with CRC on and off, both
//! ends switched.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

/// tests/c/stdio.c built once per run with `-fsanitize=address,undefined`.
fn program() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| build("wsp-stdio-asan", &[SANITIZED[0], SANITIZED[1]]))
}

/// The same built with `-O2 -D_FORTIFY_SOURCE=2` (as Debian's and Ubuntu's
/// package flags build): its `dprintf`/`vdprintf` are glibc's
/// `__dprintf_chk`/`__vdprintf_chk`.
fn fortified() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        build(
            "wsp-stdio-asan-fortify",
            &[SANITIZED[0], SANITIZED[1], "-O2", "-D_FORTIFY_SOURCE=2"],
        )
    })
}

/// The same built without the sanitizers. Under ASan the preload's
/// `fopencookie` binds to libasan's interceptor, which wraps the
/// stream's callbacks in its own (review r26-c item 6); here glibc's
/// `_IO_cookie_*` call them directly, as in the programs the library
/// runs under, a cancel's unwind out of the read callback included.
fn unsanitized() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| build("wsp-stdio", &[]))
}

/// The sanitizers' flags of [`program`] and [`fortified`].
const SANITIZED: [&str; 2] = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"];

/// tests/c/stdio.c built into `name`, `extra` after the common flags.
fn build(name: &str, extra: &[&str]) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    // Built under a name of this process's own, then renamed into
    // place (`common::c_program`).
    let tmp = out.with_extension(format!("tmp{}", std::process::id()));
    let st = Command::new("cc")
        .args([
            "-std=gnu11",
            "-O1",
            "-g",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-pthread",
        ])
        .args(extra)
        .arg("-I")
        .arg(dir.join("include"))
        .arg("-o")
        .arg(&tmp)
        .arg(dir.join("tests/c/stdio.c"))
        .status()
        .expect("run cc");
    assert!(st.success(), "compiling tests/c/stdio.c ({name}) failed");
    std::fs::rename(&tmp, &out).expect("move the program into place");
    out
}

/// Runs case `name`: plain, then preloaded with `WARPSOCK_CRC` 1 and 0
/// (both ends switched, counted). Each run must succeed with no
/// sanitizer report.
fn case(name: &str) {
    case_with(name, &[]);
}

/// [`case`] with `env` added.
fn case_with(name: &str, env: &[(&str, &str)]) {
    case_of(program(), name, env, 2);
}

/// [`case_with`] of the program `prog`, `switched` the sum of the
/// processes' `ddp_switched` reports (a forked child's repeats the
/// parent's count at the fork).
fn case_of(prog: &Path, name: &str, env: &[(&str, &str)], switched: u64) {
    for crc in [None, Some("1"), Some("0")] {
        let mut args = vec![name.to_owned()];
        if crc.is_none() {
            args.push("plain".to_owned());
        }
        let child = common::command(prog, &args, crc.is_some())
            .env("WARPSOCK_SWITCH_TIMEOUT_MS", "2000")
            .env("WARPSOCK_CRC", crc.unwrap_or("1"))
            .env(
                "ASAN_OPTIONS",
                "verify_asan_link_order=0:detect_leaks=0:halt_on_error=1:exitcode=86",
            )
            .env("UBSAN_OPTIONS", "halt_on_error=1:print_stacktrace=1")
            .envs(env.iter().copied())
            .spawn()
            .expect("spawn stdio");
        let r = common::finish(child, Duration::from_secs(60));
        let what = format!("stdio {name} (CRC {crc:?})");
        r.assert_ok(&what);
        assert!(
            !r.stderr.contains("Sanitizer") && !r.stderr.contains("runtime error:"),
            "{what}: a sanitizer's report\n{}",
            r.stderr
        );
        if crc.is_some() {
            assert_eq!(r.stat("ddp_switched"), switched, "{what}\n{}", r.stderr);
        }
    }
}

/// `fprintf` + `fflush` one way and `fgets` the other, both ends' streams
/// "r+", `fileno` the socket, `fseek` `ESPIPE`, `fclose` an end of
/// stream for the peer's stream. Fails without the interposed `fdopen`
/// (the lines go to the doorbell: the peer's `fgets` times out).
#[test]
fn fprintf_and_fgets_cross_a_ddp_connection() {
    case("lines");
}

/// 1 MiB by one `fwrite` read back by `fread`, checksummed.
#[test]
fn a_mebibyte_by_fwrite_is_read_back_by_fread() {
    case("bulk");
}

/// `send` and `fprintf` + `fflush` mixed arrive in the order made.
#[test]
fn send_and_a_stream_keep_their_order() {
    case("order");
}

/// `fclose` of a stream with a tail in its buffer: the peer reads every
/// byte, then the end of the stream.
#[test]
fn fclose_sends_every_byte_then_the_end() {
    case("close");
}

/// A bad mode fails with `EINVAL`; "r" and "w" streams refuse the other
/// direction; an "a" stream writes.
#[test]
fn fdopen_modes_are_glibcs() {
    case("modes");
}

/// `dprintf` (the naked entry) and `vdprintf` reach the peer.
#[test]
fn dprintf_and_vdprintf_reach_the_peer() {
    case("dprintf");
}

/// The same in a program built with `_FORTIFY_SOURCE` (review r26-c item
/// 1): it calls `__dprintf_chk` and `__vdprintf_chk` (checked with `nm`),
/// interposed as `dprintf` and `vdprintf`. Fails without them (the bytes
/// go to the doorbell: the peer's read times out).
#[test]
fn a_fortified_programs_dprintf_reaches_the_peer() {
    let out = Command::new("nm")
        .arg("-D")
        .arg(fortified())
        .output()
        .expect("run nm");
    let syms = String::from_utf8_lossy(&out.stdout);
    assert!(syms.contains("__dprintf_chk"), "{syms}");
    assert!(syms.contains("__vdprintf_chk"), "{syms}");
    case_of(fortified(), "dprintf", &[], 2);
}

/// The fortified build's streams: its `fgets`/`fread` are glibc's
/// `__fgets_chk`/`__fread_chk`, which read through the stream (the
/// cookie's read: nothing more to interpose), its `fprintf`
/// `__fprintf_chk` likewise. Fails (times out) without the interposed
/// `fdopen`, as the unfortified cases.
#[test]
fn a_fortified_programs_streams_cross_a_ddp_connection() {
    let out = Command::new("nm")
        .arg("-D")
        .arg(fortified())
        .output()
        .expect("run nm");
    let syms = String::from_utf8_lossy(&out.stdout);
    for f in ["__fgets_chk", "__fread_chk", "__fprintf_chk"] {
        assert!(syms.contains(f), "{f}: {syms}");
    }
    for name in ["lines", "bulk", "close"] {
        case_of(fortified(), name, &[], 2);
    }
}

/// The `lines`, `close`, `exit` and `cancel` cases once more, built
/// without the sanitizers ([`unsanitized`]: no libasan in the program,
/// checked with `nm`), so glibc's own `fopencookie` makes the streams.
/// Fails (times out) without the interposed `fdopen`.
#[test]
fn streams_without_the_sanitizers_interceptors() {
    let out = Command::new("nm")
        .arg("-D")
        .arg(unsanitized())
        .output()
        .expect("run nm");
    let syms = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && syms.contains("fdopen"), "{syms}");
    assert!(!syms.contains("__asan_"), "{syms}");
    for name in ["lines", "close", "exit", "cancel"] {
        case_of(unsanitized(), name, &[], 2);
    }
}

/// `pthread_cancel` of a thread blocked in `fgets` on a stream: the
/// cancel unwinds from the interposed `read` through the stream's read
/// callback and glibc's `fgets` (PTHREAD_CANCELED), which gives the
/// stream's lock back: the main thread's `fprintf` on it goes on. Fails
/// (times out) without the interposed `fdopen`.
#[test]
fn a_thread_blocked_in_fgets_is_cancelled() {
    case("cancel");
}

/// Policy mode (`WARPSOCK_DDP_PORTS`): an unmodified program's connect and
/// accept switch, and its streams on both ends talk both ways (the case
/// issue 12 names: such programs silently lost their stdio bytes). Fails
/// (times out) without the interposed `fdopen`.
#[test]
fn streams_of_an_unmodified_program_in_policy_mode() {
    let port = common::lease_port().to_string();
    case_with(
        "policy",
        &[("WARPSOCK_DDP_PORTS", &port), ("STDIO_PORT", &port)],
    );
}

/// A child's stream left unflushed at `exit`: the parent reads every
/// byte, then the end (the library flushes its streams before its exit
/// handler closes the sockets; glibc's flush came after: fails without it,
/// 8192 of 10000 bytes and a clean end).
#[test]
fn a_stream_left_unflushed_at_exit_sends_its_tail() {
    case("exit");
}

/// A forked child's `exit(0)` with its copy of the parent's unflushed
/// stream: the child exits 0 (over TCP its copy's flush reaches the peer;
/// a DDP socket's copy in a child is refused by design, and the flush
/// fails quietly), and the parent's stream then sends its tail and more
/// (review r26-c item 3). Fails (the child dies of `SIGPIPE`) without
/// both the owner check in the stream's write and the quiet late write
/// (item 2: the child's exit handler ran before glibc's flush).
#[test]
fn a_forked_childs_exit_leaves_the_parents_stream() {
    // The child's report repeats the parent's 2.
    case_of(program(), "forked", &[], 4);
}

/// The same with the child's `fflush` of its copy before the exit: over
/// DDP it fails with `EPIPE` and no `SIGPIPE` (the socket's copy in a
/// child is refused by design), over TCP it succeeds. Fails (the child
/// dies of `SIGPIPE`) without the owner check in the stream's write.
#[test]
fn a_forked_childs_flush_of_the_parents_stream_fails_quietly() {
    case_of(program(), "forkedflush", &[], 4);
}

/// A child's stream another thread holds locked at `exit` (the library's
/// exit flush leaves it; glibc's comes after the socket's exit close):
/// the child exits 0, as over TCP; its tail is lost (the parent reads a
/// clean end). Before, the late write's `EPIPE` raised `SIGPIPE` (status
/// 141; review r26-c item 2): fails so with the write's `MSG_NOSIGNAL`
/// taken out.
#[test]
fn a_stream_locked_at_exit_keeps_the_exit_status() {
    case("locked");
}

/// `freopen` of a socket's stream with bytes buffered: the peer reads
/// them, then the end, as over TCP; with a path over DDP it fails
/// (`EINVAL`) and leaves the stream closed, as a failed `freopen` does
/// (over TCP it reopens the stream on the file); `freopen(NULL)` fails
/// with `ENXIO` in both (review r26-c item 4). Fails (glibc's `freopen`
/// of a `fopencookie` stream dies of `SIGSEGV`) without the interposed
/// `freopen`. The `fclose` of a refused stream frees the library's
/// cookie and unlists it: the case scribbles on the freed `FILE` (taken
/// back by `malloc`, the same chunk without ASan) and exits 0; run once
/// more [`unsanitized`], where it failed (`SIGSEGV` in the exit flush's
/// `ftrylockfile` of the stale entry) with the refused stream's
/// `_fileno` -1, which made glibc's `fclose` skip the close callback
/// (review r27-a item 1).
#[test]
fn freopen_of_a_sockets_stream_fails_cleanly() {
    // Two pairs switched.
    case_of(program(), "reopen", &[], 4);
    case_of(unsanitized(), "reopen", &[], 4);
}

/// A forked child's `freopen(NULL)` of its copy of the parent's stream
/// fails with `ENXIO` and closes the copy, as over TCP; the child exits 0
/// and the parent's stream goes on. Fails (the child dies of `SIGSEGV` in
/// glibc's `freopen`) with the child's list of streams emptied at the
/// fork, as it was.
#[test]
fn a_forked_childs_freopen_of_the_parents_stream_fails_cleanly() {
    // The child's report repeats the parent's 2.
    case_of(program(), "reopenforked", &[], 4);
}

/// A socket left out of DDP mode gets the real `fdopen` under the preload.
#[test]
fn an_unswitched_sockets_stream_is_the_real_one() {
    case("unswitched");
}
