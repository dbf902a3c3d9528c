//! The swarm Redis mirror (docs/operations.md): one heartbeat key per guarded account and a shared event
//! stream, written by a background task so that Redis is never on the tick's path. The guard
//! never depends on it.
//!
//! # Layout
//! - [`endpoint`]: which Redis (the docs/operations.md environment precedence, decided once for the daemon,
//!   `status --fleet` and `check`) and how to print it without its password.
//! - [`wire`]: the format: heartbeat key and JSON, stream fields, the write commands.
//! - [`worker`]: [`Mirror`], the daemon's fire-and-forget handle, and the bounded background task
//!   behind it (queue, backoff, one warning per outage).
//! - [`query`]: the read side: one heartbeat for `check`, every heartbeat for `status --fleet`.
//! - [`call`]: one bounded Redis call and its [`MirrorError`], shared by the worker and the queries.
//! - [`conn`], [`resp`]: one connection (the URL, the socket, AUTH and SELECT) and the protocol
//!   itself (commands out, replies in within one budget each).
//! - [`listener`]: who owns a local endpoint's listening socket (an account's is untrusted).
//!
//! Presentation (the fleet table) lives with its command, in `cmd/fleet.rs`.
//!
//! Secrets: an [`Endpoint`]'s password never leaves this module. Its `Display` and `Debug`, every
//! warn line and every [`MirrorError`] carry [`Endpoint::redacted`], and error texts are scrubbed
//! of the password before they are stored.
pub mod call;
pub mod conn;
pub mod endpoint;
pub mod listener;
pub mod query;
pub mod resp;
pub mod stream;
pub mod wire;
pub mod worker;

pub use endpoint::Endpoint;
pub use query::{check_lines, fleet, read_heartbeat};
pub use wire::{Heartbeat, SessionCounts, SlotCounts, StreamEvent};
pub use worker::Mirror;
#[cfg(any(test, feature = "testing"))]
pub use {call::MirrorError, wire::heartbeat_key, wire::STREAM_KEY, worker::EVENT_QUEUE_CAPACITY};
