//! One Redis call, bounded (docs/operations.md: ≤ 1 s), and what its failure means. Shared by the worker
//! (writes) and the queries (reads), so both time out, classify errors and keep the password out
//! of their messages the same way.
use std::time::Duration;

use tokio::time::Instant;

use super::{
    conn::{Conn, ConnError, Target},
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
}

impl MirrorError {
    fn from_conn(endpoint: &Endpoint, what: &'static str, err: &ConnError) -> MirrorError {
        let reason = endpoint.scrub(&err.to_string());
        let endpoint = endpoint.redacted();
        match err {
            // A socket that failed or a server that broke the protocol, and refused
            // credentials: an outage, retried with backoff.
            ConnError::Transport(_) | ConnError::Auth(_) => MirrorError::Unreachable { endpoint, reason },
            ConnError::Refused(_) => MirrorError::Rejected { endpoint, what, reason },
        }
    }

    /// Whether the work of the failed call is worth sending again once Redis answers.
    pub(super) fn is_transient(&self) -> bool {
        matches!(self, MirrorError::Timeout { .. } | MirrorError::Unreachable { .. })
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
pub(super) async fn connect(endpoint: &Endpoint, deadline: Instant) -> Result<Conn, MirrorError> {
    let target = Target::parse(&endpoint.url).map_err(|e| MirrorError::InvalidEndpoint {
        endpoint: endpoint.redacted(),
        reason: endpoint.scrub(&e.to_string()),
    })?;
    bounded(endpoint, "connect", deadline, Conn::open(&target)).await
}
