//! guard: a host process guard for workstations that run swarms of agent sessions.
//!
//! The daemon counts one account's live processes per name from kernel events and, when one
//! name stays at or over a threshold for a timeout, ends that name's processes, except the ones
//! the operator excluded. docs/ (configuration, log, operations, architecture) says what it promises.
//!
//! # Layout
//! - [`domain`]: the guard's own vocabulary (what survives a restart, what came of a signal, the
//!   rows a tick reports), apart from the files and outputs that carry it.
//! - [`policy`]: the pure rules, on [`domain`]'s types and no output or IO module: `decide` turns (table view, config, flag clocks, now, command-line
//!   verdicts) into a tick plan (lines, signals, clocks, status rows). Start reading here.
//! - [`config`], [`duration`], [`pattern`]: the operator's configuration, validated into types;
//!   `excludeCommands` patterns with bash's `[[ =~ ]]` meaning (libc `regcomp`).
//! - [`event`], [`comm`], [`table`]: typed process events and the live table of the account's
//!   processes with per-name counts, maintained incrementally (`pod`: kernel records read as
//!   their guard-common types). [`machine`]: the machine's
//!   process count (what `ps -e` lists) without a table of every process.
//! - [`lineage`]: which session each process of the account was forked into (`sessions`).
//! - [`budget`]: what every reader of account data may read and hold (bytes, deadline).
//! - [`procfs`]: reading /proc (bootstrap, resync, audit, the `procfs` backend, identity checks).
//! - [`btf`], [`ebpf`]: structure offsets from the running kernel's BTF; loading and attaching the
//!   BPF programs, draining the ring buffer, the kernel's lost-event counter.
//! - [`enforcer`]: ending processes through pidfds after re-verifying their identity.
//! - [`holders`]: every process that holds a path, and ending one account's (`guard-user holders`).
//! - [`safefs`], [`log`], [`state`], [`status`]: files in the account's home, read and written
//!   with the account's rights, never following a planted link; the log grammar of docs/log.md; flag
//!   clocks; the status file. [`escape`]: the one text form of account-controlled bytes.
//!   [`bounded_json`]: parsing the account's JSON without building more than a bound.
//! - [`trace`]: recorded process traces (`guard-user record`) and their replay through the daemon
//!   (the replay: `testing` only).
//! - [`account`]: the guarded account (passwd lookup).
//! - [`daemon`]: the pump that owns the table, the supervised tick loop, the tick's effects.
//! - [`diag`]: the daemon's own diagnostics (`tracing` to stderr, `GUARD_LOG`).
//! - [`mirror`]: the optional swarm Redis heartbeat and event stream, off the tick's path.
//! - [`metrics`]: the Prometheus text file (`--metrics-file`), rendered from one tick's figures.
//! - [`install`]: the systemd unit and the install/check/uninstall logic.
//! - [`cmd`]: one file per subcommand, each parsing its arguments and calling the library;
//!   [`cmd::main`] is the binary's whole program.
//!
//! # The `testing` feature
//! The library is the binary's, not a product of its own: without the `testing` feature its one
//! public item is [`main`], every module is `pub(crate)`, and rustc's dead-code lint sees whatever
//! the binary never calls (`cargo xtask lint` denies it). With `testing`, the modules are `pub`
//! and test support compiles in: the replay (`trace::TraceSource`, `daemon::recording`) and the
//! few items only tests call (each marked `#[cfg(any(test, feature = "testing"))]`). The
//! integration tests and examples get it through guard-user's dev-dependency on itself, the
//! `integration-tests` package through its dependency; a build of the binary never has it
//! (`cargo build -p guard-user`, `cargo xtask build`, `cargo xtask dist`).
/// Declares the crate's modules: `pub` with the `testing` feature (the integration tests, the
/// examples and the `integration-tests` package reach inside), `pub(crate)` without it, so the
/// shipped build's public API is [`main`] alone and rustc's dead-code lint sees every item
/// nothing in the product calls.
macro_rules! modules {
    ($($name:ident),* $(,)?) => {$(
        #[cfg(feature = "testing")]
        pub mod $name;
        #[cfg(not(feature = "testing"))]
        pub(crate) mod $name;
    )*};
}

modules!(
    account,
    bounded_json,
    btf,
    budget,
    cgroup,
    cmd,
    comm,
    config,
    daemon,
    diag,
    domain,
    duration,
    ebpf,
    enforcer,
    escape,
    event,
    holders,
    install,
    lineage,
    log,
    machine,
    metrics,
    mirror,
    pattern,
    policy,
    procfs,
    safefs,
    state,
    status,
    table,
    trace,
);
mod pod;

/// The binary's whole program (src/main.rs): parse the command line, run the subcommand.
pub use cmd::main;

/// The version in `STARTED version=…` and the heartbeat (public for the tests that build one).
#[cfg(feature = "testing")]
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
#[cfg(not(feature = "testing"))]
pub(crate) const VERSION: &str = env!("CARGO_PKG_VERSION");

/// `GUARD_TRACE_STARTUP=1`: the daemon reports how long each start-up phase took, through
/// `tracing` to stderr (`guard-user: info: startup <phase> +<ms> ms (at <ms> ms, process CPU <ms> ms)`),
/// for the bootstrap breakdown in docs/BENCH.md and for operators asking why a start is slow.
pub(crate) fn startup_phase(phase: &str) {
    use std::{sync::Mutex, time::Instant};
    static LAST: Mutex<Option<(Instant, Instant)>> = Mutex::new(None);
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if !*ON.get_or_init(|| std::env::var_os("GUARD_TRACE_STARTUP").is_some_and(|v| v != "0")) {
        return;
    }
    let now = Instant::now();
    let mut last = LAST.lock().unwrap_or_else(|p| p.into_inner());
    let (start, prev) = last.get_or_insert((now, now));
    let mut cpu = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut cpu) };
    tracing::info!(
        "startup {phase} +{:.1} ms (at {:.1} ms, process CPU {:.1} ms)",
        (now - *prev).as_secs_f64() * 1e3,
        (now - *start).as_secs_f64() * 1e3,
        cpu.tv_sec as f64 * 1e3 + cpu.tv_nsec as f64 / 1e6
    );
    *prev = now;
}
