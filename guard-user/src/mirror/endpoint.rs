//! Where the swarm Redis is (docs/operations.md), decided in one place for the daemon, `status --fleet` and
//! `check`, and how to print it without its password.
use std::fmt;

/// Endpoint when neither environment variable is set.
pub const DEFAULT_URL: &str = "redis://127.0.0.1:6379/0";

/// Where the swarm Redis is. `url` carries the password, so print [`Endpoint::redacted`] (which
/// `Display` and `Debug` do) and never the field itself.
#[derive(Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub url: String,
}

impl Endpoint {
    #[cfg(any(test, feature = "testing"))]
    pub fn new(url: impl Into<String>) -> Endpoint {
        Endpoint { url: url.into() }
    }

    /// The endpoint this process's environment names: what the daemon mirrors to, what
    /// `status --fleet` lists and what `check` reads the heartbeat from. Every caller goes through
    /// here so the three can never disagree.
    pub fn from_env() -> Endpoint {
        Endpoint::resolve(|name| std::env::var(name).ok())
    }

    /// docs/operations.md: `AGENTIHOOKS_HIVE_REDIS_URL` unless `AGENTIHOOKS_LEDGER_MODE=local`, then
    /// `AGENTIHOOKS_SWARM_REDIS_URL`, then [`DEFAULT_URL`]. Values are trimmed; an empty value
    /// counts as unset. `local` is compared ignoring case.
    pub fn resolve(env: impl Fn(&str) -> Option<String>) -> Endpoint {
        let get = |name: &str| env(name).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
        let local = get("AGENTIHOOKS_LEDGER_MODE").is_some_and(|m| m.eq_ignore_ascii_case("local"));
        let hive = if local { None } else { get("AGENTIHOOKS_HIVE_REDIS_URL") };
        let url = hive.or_else(|| get("AGENTIHOOKS_SWARM_REDIS_URL")).unwrap_or_else(|| DEFAULT_URL.to_owned());
        Endpoint { url }
    }

    /// The URL without credentials: `redis://:secret@h:1/0` → `redis://h:1/0`, and likewise
    /// `user:password@` for `redis://` and `rediss://`, and the `user=`/`pass=` query
    /// parameters of `unix://` and `redis+unix://` socket URLs.
    pub fn redacted(&self) -> String {
        let (scheme, rest) = split_scheme(&self.url);
        let rest = &rest[userinfo_len(scheme, rest)..];
        let rest = strip_secret_params(rest);
        match scheme {
            Some(scheme) => format!("{scheme}://{rest}"),
            None => rest,
        }
    }

    /// The passwords in the URL, raw and percent-decoded, to scrub from library error texts.
    fn secrets(&self) -> Vec<String> {
        let (scheme, rest) = split_scheme(&self.url);
        let mut found = Vec::new();
        let userinfo = rest[..userinfo_len(scheme, rest)].trim_end_matches('@');
        if let Some((_, password)) = userinfo.split_once(':') {
            found.push(password.to_owned());
        }
        if let Some((_, query)) = rest.split_once('?') {
            for pair in query.split(['&', '#']) {
                if let Some((key, value)) = pair.split_once('=') {
                    if is_secret_param(key) {
                        found.push(value.to_owned());
                    }
                }
            }
        }
        let decoded: Vec<String> = found.iter().map(|s| super::conn::percent_decode(s, true)).collect();
        found.extend(decoded);
        found.retain(|s| !s.is_empty());
        // Longest first, so a secret that contains another is replaced whole.
        found.sort_by_key(|s| std::cmp::Reverse(s.len()));
        found
    }

    /// `text` with every password of this endpoint replaced by `***`.
    pub(super) fn scrub(&self, text: &str) -> String {
        self.secrets().iter().fold(text.to_owned(), |t, s| t.replace(s.as_str(), "***"))
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Endpoint").field(&self.redacted()).finish()
    }
}

fn split_scheme(url: &str) -> (Option<&str>, &str) {
    match url.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, url),
    }
}

fn is_unix_scheme(scheme: Option<&str>) -> bool {
    scheme.is_some_and(|s| s.eq_ignore_ascii_case("unix") || s.eq_ignore_ascii_case("redis+unix"))
}

/// Length of `user:password@` at the start of `rest` (0 when there is none).
fn userinfo_len(scheme: Option<&str>, rest: &str) -> usize {
    let searched = if is_unix_scheme(scheme) {
        // A socket path may contain '@'; credentials can only sit before the path's first '/'.
        &rest[..rest.find('/').unwrap_or(rest.len())]
    } else {
        // Host, port, db number and query never contain '@', so the last one ends the
        // credentials even when a hand-written password holds a raw '/', '?' or '#'.
        rest
    };
    searched.rfind('@').map_or(0, |at| at + 1)
}

fn is_secret_param(key: &str) -> bool {
    ["pass", "password", "user", "username"].iter().any(|k| key.eq_ignore_ascii_case(k))
}

/// `rest` without `user=`/`pass=` query parameters (redis-rs reads them for socket URLs).
fn strip_secret_params(rest: &str) -> String {
    let Some((before, query)) = rest.split_once('?') else {
        return rest.to_owned();
    };
    let (query, fragment) = match query.split_once('#') {
        Some((q, f)) => (q, Some(f)),
        None => (query, None),
    };
    let kept: Vec<&str> =
        query.split('&').filter(|pair| !is_secret_param(pair.split_once('=').map_or(*pair, |(k, _)| k))).collect();
    let mut out = before.to_owned();
    if !kept.is_empty() && kept != [""] {
        out.push('?');
        out.push_str(&kept.join("&"));
    }
    if let Some(fragment) = fragment {
        out.push('#');
        out.push_str(fragment);
    }
    out
}
