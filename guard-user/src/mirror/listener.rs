//! Who answers on a local endpoint (docs/operations.md, "Moving the swarm Redis").
//!
//! The default endpoint, `redis://127.0.0.1:6379/0`, is a port any local account can listen on
//! where no Redis runs, and a unix socket path can be one an account created. So after connecting
//! to a loopback address or a unix socket, the mirror asks the kernel who owns the listening
//! socket: for TCP, the `LISTEN` entry of `/proc/net/tcp` or `tcp6` with that port (the address
//! connected to, else the wildcard one: the kernel hands a connection to the most specific
//! listener), whose `uid` column is the uid that created the socket; for a unix socket, the
//! server's credentials (`SO_PEERCRED`). A socket that belongs to a login account (see
//! [`is_account`]) is not the swarm Redis an administrator runs: the daemon says so once
//! (`WARN redis_listener_owned_by_account`), never sends it a password, and `status --fleet` and
//! `check` mark what they read there as written by that account.
use std::{
    fs::File,
    io::{BufRead, BufReader, Read},
    net::{IpAddr, SocketAddr},
};

/// The first uid of login accounts (Debian's `UID_MIN`): below it are root and the system users
/// a distribution's Redis runs as.
pub const FIRST_ACCOUNT_UID: u32 = 1000;
/// `nobody`, which no one logs in as.
const NOBODY: u32 = 65534;
/// `/proc/net/tcp` grows with the machine's sockets (about 150 bytes each); read at most this
/// much of it, line by line.
const NET_TCP_BYTES: u64 = 64 << 20;

/// Whether a socket owned by `uid` belongs to an account rather than to the system: a login
/// account's uid, or the guarded account's (`guarded`; which may be below
/// [`FIRST_ACCOUNT_UID`]), never root's.
pub fn is_account(uid: u32, guarded: Option<u32>) -> bool {
    uid != 0 && (Some(uid) == guarded || (uid >= FIRST_ACCOUNT_UID && uid != NOBODY))
}

/// Whether the mirror should ask who listens there: a loopback address (any account of this
/// machine can listen on one).
pub fn is_local(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback()),
    }
}

/// The uid that owns the TCP socket listening on `peer` (the address a connection reached), from
/// `/proc/net/tcp` or `/proc/net/tcp6`; `None` when it cannot be told.
pub fn tcp_listener_uid(peer: SocketAddr) -> Option<u32> {
    let file = match peer {
        SocketAddr::V4(_) => "/proc/net/tcp",
        SocketAddr::V6(_) => "/proc/net/tcp6",
    };
    let f = File::open(file).ok()?;
    listener_uid(BufReader::new(f.take(NET_TCP_BYTES)), peer)
}

/// [`tcp_listener_uid`] on the text of a `/proc/net/tcp[6]` file.
fn listener_uid(text: impl BufRead, peer: SocketAddr) -> Option<u32> {
    let mut wildcard = None;
    for line in text.lines().skip(1) {
        let line = line.ok()?;
        let f: Vec<&str> = line.split_whitespace().collect();
        // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
        let (Some(local), Some("0A"), Some(uid)) = (f.get(1), f.get(3).copied(), f.get(7)) else { continue };
        let Some((ip, port)) = parse_addr(local) else { continue };
        if port != peer.port() {
            continue;
        }
        let Ok(uid) = uid.parse::<u32>() else { continue };
        if ip == peer.ip() {
            return Some(uid);
        }
        if ip.is_unspecified() {
            wildcard = Some(uid);
        }
    }
    wildcard
}

/// `0100007F:18EB` (IPv4: the address as the kernel's 32-bit word, printed in host order) or its
/// 32-digit IPv6 form (four such words).
fn parse_addr(s: &str) -> Option<(IpAddr, u16)> {
    let (addr, port) = s.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |h: &str| u32::from_str_radix(h, 16).ok().map(|w| w.to_ne_bytes());
    let ip = match addr.len() {
        8 => IpAddr::from(word(addr)?),
        32 => {
            let mut b = [0u8; 16];
            for i in 0..4 {
                b[i * 4..i * 4 + 4].copy_from_slice(&word(&addr[i * 8..i * 8 + 8])?);
            }
            IpAddr::from(b)
        }
        _ => return None,
    };
    Some((ip, port))
}

/// An account's name for the output (`uid N` when it has none).
pub fn account_name(uid: u32) -> String {
    crate::account::Account::by_uid(uid).map(|a| a.name).unwrap_or_else(|_| format!("uid {uid}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:18EB 00000000:0000 0A 00000000:00000000 00:00000000 00000000  4201        0 35211 1 0000000000000000 100 0 0 10 0
   1: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1923 1 0000000000000000 100 0 0 10 0
   2: 0100007F:18EB 0100007F:D2C4 01 00000000:00000000 00:00000000 00000000  4201        0 35999 1 0000000000000000 20 4 30 10 -1
";

    #[test]
    fn the_listening_socket_of_a_loopback_port_names_its_owner() {
        let at = |a: &str| a.parse::<SocketAddr>().unwrap();
        assert_eq!(listener_uid(TCP.as_bytes(), at("127.0.0.1:6379")), Some(4201));
        assert_eq!(listener_uid(TCP.as_bytes(), at("127.0.0.1:22")), Some(0), "the wildcard listener");
        assert_eq!(listener_uid(TCP.as_bytes(), at("127.0.0.1:7000")), None);
        let v6 = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:18EB 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  4202        0 1 1 0 100 0 0 10 0
";
        assert_eq!(listener_uid(v6.as_bytes(), at("[::1]:6379")), Some(4202));
    }

    #[test]
    fn accounts_are_login_uids_or_the_guarded_one_never_root_or_the_system() {
        assert!(is_account(4201, None) && is_account(1000, Some(4201)));
        assert!(is_account(999, Some(999)), "a guarded service account below 1000");
        assert!(!is_account(0, Some(0)) && !is_account(110, None) && !is_account(65534, None));
        assert!(is_local("127.0.0.2".parse().unwrap()) && is_local("::1".parse().unwrap()));
        assert!(!is_local("10.0.0.1".parse().unwrap()));
    }

    /// This machine's own table: a listener this test opens is found with this process's uid.
    #[test]
    fn a_listener_of_this_process_is_found_with_its_uid() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let uid = unsafe { libc::geteuid() };
        assert_eq!(tcp_listener_uid(l.local_addr().unwrap()), Some(uid));
    }
}
