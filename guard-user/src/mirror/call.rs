//! One Redis call, bounded (docs/operations.md: ≤ 1 s), and what its failure means. Shared by the worker
//! (writes) and the queries (reads), so both time out, classify errors and keep the password out
//! of their messages the same way.
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use tokio::time::Instant;

use super::Endpoint;

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
    fn from_redis(endpoint: &Endpoint, what: &'static str, err: &redis::RedisError) -> MirrorError {
        use redis::ErrorKind;
        let reason = endpoint.scrub(&err.to_string());
        let endpoint = endpoint.redacted();
        if err.kind() == ErrorKind::InvalidClientConfig {
            MirrorError::InvalidEndpoint { endpoint, reason }
        } else if err.is_timeout() {
            // The library's own timeout (set to the same bound) can fire just before ours.
            MirrorError::Timeout { endpoint, what }
        } else if err.is_io_error()
            || err.is_connection_refusal()
            || err.is_connection_dropped()
            || err.kind() == ErrorKind::AuthenticationFailed
        {
            MirrorError::Unreachable { endpoint, reason }
        } else {
            MirrorError::Rejected { endpoint, what, reason }
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
    call: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> Result<T, MirrorError> {
    match tokio::time::timeout_at(deadline, call).await {
        Ok(result) => result.map_err(|e| MirrorError::from_redis(endpoint, what, &e)),
        Err(_) => Err(MirrorError::Timeout { endpoint: endpoint.redacted(), what }),
    }
}

/// A new connection to `endpoint`, bounded by `deadline`.
pub(super) async fn connect(endpoint: &Endpoint, deadline: Instant) -> Result<MultiplexedConnection, MirrorError> {
    let client =
        redis::Client::open(endpoint.url.as_str()).map_err(|e| MirrorError::from_redis(endpoint, "connect", &e))?;
    // The library's own timeouts back up ours, so a call it abandons does not linger inside.
    let config =
        redis::AsyncConnectionConfig::new().set_connection_timeout(CALL_TIMEOUT).set_response_timeout(CALL_TIMEOUT);
    bounded(endpoint, "connect", deadline, client.get_multiplexed_async_connection_with_config(&config)).await
}
