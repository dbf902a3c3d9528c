//! One Redis call, bounded (docs/operations.md: ≤ 1 s), and what its failure means. Shared by the worker
//! (writes) and the queries (reads), so both time out, classify errors and keep the password out
//! of their messages the same way.
use std::time::Duration;

use tokio::time::Instant;

use super::{
    conn::{Conn, ConnError, Target},
    resp::RespError,
    Endpoint,
};

/// Bound on every single Redis call, connecting included (docs/operations.md: ≤ 1 s).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(1);

/// Why a Redis operation failed. Every message names the redacted endpoint and never a password.
#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    #[error("the swarm Redis URL {endpoint} is not usable: {reason}")]
    InvalidEndpoint { endpoint: String, reason: String },
    #[error("the swarm Redis at {endpoint} did not answer {what} within 1s")]
    Timeout { endpoint: String, what: &'static str },
    #[error("the swarm Redis at {endpoint} is unreachable: {reason}")]
    Unreachable { endpoint: String, reason: String },
    #[error("the swarm Redis at {endpoint} rejected {what}: {reason}")]
    Rejected { endpoint: String, what: &'static str, reason: String },
    #[error("the heartbeat {key} on {endpoint} is not valid JSON: {reason}")]
    MalformedHeartbeat { endpoint: String, key: String, reason: String },
    /// A reply over its budget (`resp::REPLY_BYTES`): the connection is closed, and retried as
    /// an outage is.
    #[error("the swarm Redis at {endpoint} answered {what} with a reply of at least {bytes} bytes, over the {max} a reply may take; the connection was closed", max = super::resp::REPLY_BYTES)]
    ReplyRejected { endpoint: String, what: &'static str, bytes: usize },
    /// The listening socket belongs to an account and the URL has a password, which was not
    /// sent (`mirror::listener`).
    #[error("the swarm Redis at {endpoint} listens as {}, an account, so its password was not sent there", super::listener::account_name(*uid))]
    AccountListener { endpoint: String, uid: u32 },
}

impl MirrorError {
    fn from_conn(endpoint: &Endpoint, what: &'static str, err: &ConnError) -> MirrorError {
        let reason = endpoint.scrub(&err.to_string());
        let endpoint = endpoint.redacted();
        match err {
            ConnError::Transport(RespError::TooLarge { bytes }) => {
                MirrorError::ReplyRejected { endpoint, what, bytes: *bytes }
            }
            // A socket that failed or a server that broke the protocol, and refused
            // credentials: an outage, retried with backoff.
            ConnError::Transport(_) | ConnError::Auth(_) => MirrorError::Unreachable { endpoint, reason },
            ConnError::Refused(_) => MirrorError::Rejected { endpoint, what, reason },
            ConnError::Withheld { uid } => MirrorError::AccountListener { endpoint, uid: *uid },
        }
    }

    /// Whether the work of the failed call is worth sending again once Redis answers.
    pub(super) fn is_transient(&self) -> bool {
        matches!(
            self,
            MirrorError::Timeout { .. }
                | MirrorError::Unreachable { .. }
                | MirrorError::ReplyRejected { .. }
                | MirrorError::AccountListener { .. }
        )
    }
}

/// Runs one Redis call, bounded by `deadline`.
pub(super) async fn bounded<T>(
    endpoint: &Endpoint,
    what: &'static str,
    deadline: Instant,
    call: impl std::future::Future<Output = Result<T, ConnError>>,
) -> Result<T, MirrorError> {
    match tokio::time::timeout_at(deadline, call).await {
        Ok(result) => result.map_err(|e| MirrorError::from_conn(endpoint, what, &e)),
        Err(_) => Err(MirrorError::Timeout { endpoint: endpoint.redacted(), what }),
    }
}

/// A new connection to `endpoint` (authenticated, its database selected), bounded by `deadline`.
/// `guarded`: the daemon's account (see `Conn::open`).
pub(super) async fn connect(endpoint: &Endpoint, deadline: Instant, guarded: Option<u32>) -> Result<Conn, MirrorError> {
    let target = Target::parse(&endpoint.url).map_err(|e| MirrorError::InvalidEndpoint {
        endpoint: endpoint.redacted(),
        reason: endpoint.scrub(&e.to_string()),
    })?;
    bounded(endpoint, "connect", deadline, Conn::open(&target, guarded)).await
}
