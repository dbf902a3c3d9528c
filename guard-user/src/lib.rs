//! guard: a host process guard for workstations that run swarms of agent sessions.
//!
//! The daemon counts one account's live processes per name from kernel events and, when one
//! name stays at or over a threshold for a timeout, ends that name's processes, except the ones
//! the operator excluded. `../shared/SPEC.md` (docs/SPEC.md in the repo) is the contract.
//!
//! # Layout
//! - [`policy`]: the pure decision function (table snapshot, config, state, now) → decisions.
//!   Start reading here.
//! - [`config`], [`duration`], [`pattern`]: the operator's configuration, validated into types;
//!   `excludeCommands` patterns with bash's `[[ =~ ]]` meaning (libc `regcomp`).
//! - [`event`], [`comm`], [`table`]: typed process events and the live process table with
//!   per-(uid, name) counts, maintained incrementally.
//! - [`procfs`]: reading /proc (bootstrap, resync, audit, the `procfs` backend, identity checks).
//! - [`btf`], [`ebpf`]: structure offsets from the running kernel's BTF; loading and attaching the
//!   BPF programs, draining the ring buffer, the kernel's lost-event counter.
//! - [`enforcer`]: ending processes through pidfds after re-verifying their identity.
//! - [`safefs`], [`log`], [`state`], [`status`]: files in the account's home, never following a
//!   planted link; the log grammar of SPEC §5; flag clocks; the status file.
//! - [`account`]: the guarded account (passwd lookup).
//! - [`daemon`]: the event loop and the tick, wiring everything above together.
//! - [`redis_mirror`]: the optional swarm Redis heartbeat and event stream, off the tick's path.
//! - [`install`]: the systemd unit and the install/check/uninstall logic.
//! - [`cmd`]: one file per subcommand, each parsing its arguments and calling the library.
pub mod account;
pub mod btf;
pub mod cmd;
pub mod comm;
pub mod config;
pub mod daemon;
pub mod duration;
pub mod ebpf;
pub mod enforcer;
pub mod event;
pub mod install;
pub mod log;
pub mod pattern;
pub mod policy;
pub mod procfs;
pub mod redis_mirror;
pub mod safefs;
pub mod state;
pub mod status;
pub mod table;

/// The version in `STARTED version=…` and the heartbeat.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
