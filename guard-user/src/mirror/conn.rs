//! One connection to the swarm Redis: the endpoint's URL understood, a TCP or Unix socket,
//! `AUTH` and `SELECT` at connect, then commands one at a time or pipelined. Every call is
//! bounded by the caller ([`super::call`]); a connection that failed once is dropped, never
//! reused.
//!
//! URLs, as other Redis clients read them: `redis://[[user]:password@]host[:port][/db]`
//! (port 6379, db 0 by default; an IPv6 host in brackets; user and password percent-decoded),
//! and `unix:///path/to/socket` or `redis+unix:///path` with `?db=N&user=U&pass=P`. `rediss://`
//! (TLS) is refused: the guard has no TLS stack.
use std::path::PathBuf;

use tokio::{
    io::{AsyncRead, AsyncWrite, AsyncWriteExt as _, BufReader},
    net::{TcpStream, UnixStream},
};

use super::resp::{read_reply, Cmd, Reply, RespError};

/// Where and as whom to connect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub addr: Addr,
    pub user: Option<String>,
    pub password: Option<String>,
    pub db: i64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Addr {
    Tcp { host: String, port: u16 },
    Unix(PathBuf),
}

/// Why a URL is not usable. Never holds the password: the caller adds the redacted endpoint.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct UrlError(String);

fn bad(why: impl Into<String>) -> UrlError {
    UrlError(why.into())
}

impl Target {
    pub fn parse(url: &str) -> Result<Target, UrlError> {
        let (scheme, rest) = url.split_once("://").ok_or_else(|| bad("not a URL (no scheme://)"))?;
        match scheme.to_ascii_lowercase().as_str() {
            "redis" => Target::parse_tcp(rest),
            "unix" | "redis+unix" => Target::parse_unix(rest),
            "rediss" => {
                Err(bad("TLS (rediss://) is not supported; use redis:// on a trusted network or a unix socket"))
            }
            other => Err(bad(format!("unknown scheme {other:?} (redis://, unix:// or redis+unix://)"))),
        }
    }

    fn parse_tcp(rest: &str) -> Result<Target, UrlError> {
        // The last '@' ends the credentials (a hand-written password may hold '/', '?' or '#').
        let (userinfo, rest) = match rest.rfind('@') {
            Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
            None => (None, rest),
        };
        let rest = rest.split(['?', '#']).next().unwrap_or_default();
        let (hostport, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, ""),
        };
        let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
            let (host, after) = v6.split_once(']').ok_or_else(|| bad("an IPv6 host without its ']'"))?;
            (host, after.strip_prefix(':'))
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (hostport, None),
            }
        };
        if host.is_empty() {
            return Err(bad("no host"));
        }
        let port = match port {
            None | Some("") => 6379,
            Some(p) => p.parse::<u16>().map_err(|_| bad(format!("port {p:?} is not a port number")))?,
        };
        let db = match path.trim_end_matches('/') {
            "" => 0,
            d => d.parse::<i64>().map_err(|_| bad(format!("database {d:?} is not a number")))?,
        };
        let (user, password) = match userinfo {
            None => (None, None),
            Some(info) => match info.split_once(':') {
                Some((u, p)) => (Some(percent_decode(u, false)), Some(percent_decode(p, false))),
                None => (Some(percent_decode(info, false)), None),
            },
        };
        Ok(Target {
            addr: Addr::Tcp { host: host.to_string(), port },
            user: user.filter(|u| !u.is_empty()),
            password: password.filter(|p| !p.is_empty()),
            db,
        })
    }

    fn parse_unix(rest: &str) -> Result<Target, UrlError> {
        let (path, query) = match rest.split_once('?') {
            Some((p, q)) => (p, q.split('#').next().unwrap_or_default()),
            None => (rest.split('#').next().unwrap_or_default(), ""),
        };
        // `unix:///run/redis.sock`: an empty authority, then the absolute path.
        if !path.starts_with('/') {
            return Err(bad("a unix socket URL needs an absolute path (unix:///path/to/socket)"));
        }
        let mut target =
            Target { addr: Addr::Unix(PathBuf::from(percent_decode(path, false))), user: None, password: None, db: 0 };
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            match k.to_ascii_lowercase().as_str() {
                "db" => target.db = v.parse().map_err(|_| bad(format!("database {v:?} is not a number")))?,
                "user" | "username" => target.user = Some(percent_decode(v, false)).filter(|u| !u.is_empty()),
                "pass" | "password" => target.password = Some(percent_decode(v, false)).filter(|p| !p.is_empty()),
                _ => {}
            }
        }
        Ok(target)
    }
}

/// `%XX` escapes decoded; with `plus_is_space`, `+` is a space too (form encoding).
pub(super) fn percent_decode(s: &str, plus_is_space: bool) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b'+', _) if plus_is_space => {
                out.push(b' ');
                i += 1;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send + Sync {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + Sync> Io for T {}

/// What went wrong on a connection.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    /// The socket failed (refused, reset, closed) or the server broke the protocol.
    #[error("{0}")]
    Transport(#[from] RespError),
    /// The server answered a command with an error reply.
    #[error("{0}")]
    Refused(String),
    /// AUTH was refused: the credentials are wrong (an outage for the mirror, as a refused
    /// connection is: the operator fixes the URL or the server, and the guard goes on).
    #[error("{0}")]
    Auth(String),
    /// The endpoint's listening socket belongs to an account (`mirror::listener`), and the URL
    /// has a password: it is not sent there, and nothing else is either.
    #[error("the listening socket belongs to {}, so the password was not sent", super::listener::account_name(*uid))]
    Withheld { uid: u32 },
}

impl From<std::io::Error> for ConnError {
    fn from(e: std::io::Error) -> ConnError {
        ConnError::Transport(RespError::Io(e))
    }
}

pub struct Conn {
    io: BufReader<Box<dyn Io>>,
    /// Who owns the listening socket, for a loopback or unix-socket endpoint when the kernel says
    /// (`mirror::listener`); `None` for a remote host.
    pub listener_uid: Option<u32>,
}

impl Conn {
    /// Connects, authenticates and selects the database. `guarded`: the guarded account (the
    /// daemon's), whose listener is an account's whatever its uid. A password is never sent to a
    /// listener that belongs to an account ([`ConnError::Withheld`]).
    pub async fn open(target: &Target, guarded: Option<u32>) -> Result<Conn, ConnError> {
        let (io, listener_uid): (Box<dyn Io>, Option<u32>) = match &target.addr {
            Addr::Tcp { host, port } => {
                let stream = TcpStream::connect((host.as_str(), *port)).await?;
                stream.set_nodelay(true)?;
                let peer = stream.peer_addr()?;
                let owner = if super::listener::is_local(peer.ip()) {
                    // A few hundred bytes per socket of the machine, off the tick's path.
                    tokio::task::spawn_blocking(move || super::listener::tcp_listener_uid(peer)).await.ok().flatten()
                } else {
                    None
                };
                (Box::new(stream), owner)
            }
            Addr::Unix(path) => {
                let stream = UnixStream::connect(path).await?;
                let owner = stream.peer_cred().ok().map(|c| c.uid());
                (Box::new(stream), owner)
            }
        };
        let mut conn = Conn { io: BufReader::new(io), listener_uid };
        if let Some(uid) = listener_uid.filter(|&u| super::listener::is_account(u, guarded)) {
            if target.password.is_some() {
                return Err(ConnError::Withheld { uid });
            }
        }
        if let Some(password) = &target.password {
            let mut auth = Cmd::new("AUTH");
            if let Some(user) = &target.user {
                auth.arg(user);
            }
            auth.arg(password);
            match conn.call(&auth).await {
                Err(ConnError::Refused(why)) => return Err(ConnError::Auth(why)),
                other => other?,
            };
        }
        if target.db != 0 {
            let mut select = Cmd::new("SELECT");
            select.arg(target.db);
            conn.call(&select).await?;
        }
        Ok(conn)
    }

    /// One command; an error reply is [`ConnError::Refused`].
    pub async fn call(&mut self, cmd: &Cmd) -> Result<Reply, ConnError> {
        let mut replies = self.pipeline(std::slice::from_ref(cmd)).await?;
        Ok(replies.pop().expect("one reply"))
    }

    /// Every command in one write, then their replies in order; the first error reply is
    /// [`ConnError::Refused`] (after all replies were read, so the connection stays in step).
    pub async fn pipeline(&mut self, cmds: &[Cmd]) -> Result<Vec<Reply>, ConnError> {
        let replies = self.pipeline_replies(cmds).await?;
        let refused = cmds.iter().zip(&replies).find_map(|(cmd, reply)| match reply {
            Reply::Error(why) => Some(format!("{} answered {why}", cmd.name())),
            _ => None,
        });
        match refused {
            Some(why) => Err(ConnError::Refused(why)),
            None => Ok(replies),
        }
    }

    /// Every command in one write, then their replies in order, error replies included; each
    /// reply is read within its own budget (`resp::REPLY_BYTES`).
    pub async fn pipeline_replies(&mut self, cmds: &[Cmd]) -> Result<Vec<Reply>, ConnError> {
        let mut out = Vec::new();
        for cmd in cmds {
            cmd.encode(&mut out);
        }
        let io = self.io.get_mut();
        io.write_all(&out).await?;
        io.flush().await?;
        let mut replies = Vec::with_capacity(cmds.len());
        for _ in cmds {
            replies.push(read_reply(&mut self.io).await?);
        }
        Ok(replies)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(host: &str, port: u16) -> Addr {
        Addr::Tcp { host: host.into(), port }
    }

    #[test]
    fn redis_urls_are_read_as_other_clients_read_them() {
        let t = Target::parse("redis://127.0.0.1:6379/0").unwrap();
        assert_eq!(t, Target { addr: tcp("127.0.0.1", 6379), user: None, password: None, db: 0 });
        let t = Target::parse("redis://:s%40cret@h/3").unwrap();
        assert_eq!((t.addr, t.user, t.password, t.db), (tcp("h", 6379), None, Some("s@cret".into()), 3));
        let t = Target::parse("redis://default:p/w?x#@[::1]:7000").unwrap();
        assert_eq!(
            (t.addr, t.user.as_deref(), t.password.as_deref()),
            (tcp("::1", 7000), Some("default"), Some("p/w?x#"))
        );
        let t = Target::parse("unix:///run/redis/redis.sock?db=2&pass=pw").unwrap();
        assert_eq!((t.addr, t.password.as_deref(), t.db), (Addr::Unix("/run/redis/redis.sock".into()), Some("pw"), 2));
        assert!(Target::parse("redis+unix:///tmp/r.sock").is_ok());
    }

    #[test]
    fn unusable_urls_say_why_and_never_hold_the_password() {
        for url in [
            "redis://:secret@/0",
            "redis://:secret@h:99999/0",
            "redis://:secret@h:1/not-a-db",
            "http://:secret@h:1/0",
            "rediss://:secret@h:1/0",
            "unix://relative?pass=secret",
            "127.0.0.1:6379",
        ] {
            let e = Target::parse(url).unwrap_err().to_string();
            assert!(!e.contains("secret"), "{url}: {e}");
            assert!(!e.is_empty(), "{url}");
        }
    }
}
