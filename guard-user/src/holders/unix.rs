//! The unix sockets bound to a path, from the kernel's socket diagnostics (`NETLINK_SOCK_DIAG`,
//! `UDIAG_SHOW_VFS`): a process whose fd is a socket bound at a path below PATH holds PATH as
//! `lsof +D` sees it, but the fd's own inode is the socket's (sockfs), not the file's. The dump
//! gives, per socket inode, the device and inode of the file it is bound to (exact, not its
//! name) and the name it was bound by, in this process's network namespace (where `lsof` reads
//! `/proc/net/unix` too).
use std::{collections::HashMap, io, os::fd::AsRawFd};

/// One bound socket's file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bound {
    /// The file's superblock device (as `maps` and `mountinfo` show devices).
    pub dev: u64,
    /// The file's inode number, its low 32 bits (all the diagnostics carry).
    pub ino32: u32,
    /// The path it was bound by (relative when the binder gave a relative one).
    pub path: Vec<u8>,
    /// Known by its name only (`/proc/net/unix` with a relative name, which this process cannot
    /// look up): `dev` and `ino32` are 0 and any socket file at that name from the holder's
    /// working directory is taken for it.
    pub by_name: bool,
}

/// Why the bound sockets are not all known: a socket fd's place is then unknown (the holder is
/// reported read in part), never taken for "outside".
#[derive(Debug, thiserror::Error)]
pub enum Unlisted {
    #[error("neither the socket diagnostics nor /proc/net/unix could be read: {0}")]
    Io(#[from] io::Error),
    #[error("more than {MAX_SOCKETS} bound unix sockets")]
    Cap,
}

impl Unlisted {
    /// The reason a holder read with an unplaceable socket fd carries.
    pub fn why(&self) -> &'static str {
        match self {
            Unlisted::Io(_) => "the machine's bound unix sockets could not be listed",
            Unlisted::Cap => "more bound unix sockets than one run lists (1,048,576)",
        }
    }
}

const NETLINK_SOCK_DIAG: libc::c_int = 4;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const UDIAG_SHOW_NAME: u32 = 1;
const UDIAG_SHOW_VFS: u32 = 2;
const UNIX_DIAG_NAME: u16 = 0;
const UNIX_DIAG_VFS: u16 = 1;
/// Sockets kept at most (a few dozen bytes each): a machine has thousands.
const MAX_SOCKETS: usize = 1 << 20;

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// The kernel's own `dev_t` (12-bit major above a 20-bit minor) as user space encodes it.
fn from_kernel_dev(dev: u32) -> u64 {
    libc::makedev(dev >> 20, dev & 0xfffff)
}

/// Every unix socket of this network namespace that is bound to a file: socket inode → file.
/// From the socket diagnostics; where the kernel has none for unix sockets (`unix_diag` is a
/// module on Debian's kernels, and a system without module loading answers ENOENT), from
/// `/proc/net/unix` (see [`from_proc_net_unix`]), so a socket holder is never missed in silence.
pub fn bound_sockets() -> Result<HashMap<u64, Bound>, Unlisted> {
    match diag_dump() {
        Err(Unlisted::Io(e)) if e.raw_os_error() == Some(libc::ENOENT) => from_proc_net_unix(),
        other => other,
    }
}

/// Whether the kernel gives unix socket diagnostics (else [`bound_sockets`] reads
/// `/proc/net/unix`); the tests say which source they checked.
#[cfg(test)]
pub fn has_diagnostics() -> bool {
    diag_dump().is_ok()
}

/// `/proc/net/unix` (`Num RefCount Protocol Flags Type St Inode Path`): the socket inode and
/// the name it was bound by, not the file. A socket bound by an absolute name is taken to be
/// bound to the socket file at that name now (its device and inode, read with `lstat`); one
/// bound by a relative name is known by that name only ([`Bound::by_name`]: looked up from the
/// holder's working directory). A renamed socket file is then missed, and another socket file
/// put at the old name is taken for it: the text is the binder's, so this is the fallback,
/// never the first source.
pub fn from_proc_net_unix() -> Result<HashMap<u64, Bound>, Unlisted> {
    use std::{io::BufRead, os::unix::fs::MetadataExt};
    let file = std::fs::File::open("/proc/net/unix")?;
    let mut out = HashMap::new();
    for line in io::BufReader::new(file).split(b'\n').skip(1) {
        let line = line?;
        let Some((ino, path)) = net_unix_line(&line) else { continue };
        if out.len() >= MAX_SOCKETS {
            return Err(Unlisted::Cap);
        }
        let bound = match path.first() {
            Some(b'@') => continue, // abstract: no file
            Some(b'/') => {
                let path_os = <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(path);
                let Ok(st) = std::fs::symlink_metadata(path_os) else { continue };
                if st.mode() & libc::S_IFMT != libc::S_IFSOCK {
                    continue;
                }
                Bound { dev: st.dev(), ino32: st.ino() as u32, path: path.to_vec(), by_name: false }
            }
            _ => Bound { dev: 0, ino32: 0, path: path.to_vec(), by_name: true },
        };
        out.insert(ino, bound);
    }
    Ok(out)
}

/// The socket inode (the 7th field) and the name (the rest of the line after one space) of a
/// `/proc/net/unix` line; the inode is padded with spaces, the name may hold spaces itself.
fn net_unix_line(line: &[u8]) -> Option<(u64, &[u8])> {
    let mut at = 0;
    let field = |at: &mut usize| -> Option<&[u8]> {
        while line.get(*at) == Some(&b' ') {
            *at += 1;
        }
        let start = *at;
        while line.get(*at).is_some_and(|&b| b != b' ') {
            *at += 1;
        }
        (*at > start).then(|| &line[start..*at])
    };
    for _ in 0..6 {
        field(&mut at)?;
    }
    let ino = std::str::from_utf8(field(&mut at)?).ok()?.parse().ok()?;
    let path = line.get(at + 1..).filter(|p| !p.is_empty())?;
    Some((ino, path))
}

fn diag_dump() -> Result<HashMap<u64, Bound>, Unlisted> {
    // SAFETY: a new socket whose fd is owned below.
    let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, NETLINK_SOCK_DIAG) };
    if fd < 0 {
        return Err(io::Error::last_os_error().into());
    }
    let sock = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    // nlmsghdr (16 bytes) + unix_diag_req (24 bytes).
    let mut req = Vec::with_capacity(40);
    req.extend_from_slice(&40u32.to_ne_bytes());
    req.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    req.extend_from_slice(&((libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16).to_ne_bytes());
    req.extend_from_slice(&1u32.to_ne_bytes()); // seq
    req.extend_from_slice(&0u32.to_ne_bytes()); // pid
    req.extend_from_slice(&[libc::AF_UNIX as u8, 0, 0, 0]);
    req.extend_from_slice(&u32::MAX.to_ne_bytes()); // every state
    req.extend_from_slice(&0u32.to_ne_bytes()); // any inode
    req.extend_from_slice(&(UDIAG_SHOW_NAME | UDIAG_SHOW_VFS).to_ne_bytes());
    req.extend_from_slice(&[0u8; 8]); // cookie
                                      // SAFETY: the buffer is valid for its length; the kernel is the default destination.
    if unsafe { libc::send(sock.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) } < 0 {
        return Err(io::Error::last_os_error().into());
    }
    let mut out = HashMap::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // SAFETY: the buffer is valid for its length.
        let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error().into());
        }
        if n == 0 || parse(&buf[..n as usize], &mut out)? {
            return Ok(out);
        }
    }
}

/// Parses one datagram of the dump into `out`; true at its end (`NLMSG_DONE`).
fn parse(mut b: &[u8], out: &mut HashMap<u64, Bound>) -> Result<bool, Unlisted> {
    while b.len() >= 16 {
        let len = u32_at(b, 0).unwrap_or(0) as usize;
        let kind = u16_at(b, 4).unwrap_or(0);
        if len < 16 || len > b.len() {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "a truncated netlink message").into());
        }
        match i32::from(kind) {
            libc::NLMSG_DONE => return Ok(true),
            libc::NLMSG_ERROR => {
                let errno = u32_at(b, 16).map_or(0, |e| -(e as i32));
                return Err(io::Error::from_raw_os_error(errno).into());
            }
            _ if kind == SOCK_DIAG_BY_FAMILY => {
                if let Some((ino, bound)) = parse_socket(&b[16..len]) {
                    if out.len() >= MAX_SOCKETS {
                        return Err(Unlisted::Cap);
                    }
                    out.insert(ino, bound);
                }
            }
            _ => {}
        }
        b = &b[len.next_multiple_of(4).min(b.len())..];
    }
    Ok(false)
}

/// One `unix_diag_msg` (16 bytes) and its attributes: the socket inode and its file, if bound.
fn parse_socket(m: &[u8]) -> Option<(u64, Bound)> {
    let ino = u64::from(u32_at(m, 4)?);
    let (mut name, mut vfs) = (None, None);
    let mut a = m.get(16..)?;
    while a.len() >= 4 {
        let len = usize::from(u16_at(a, 0)?);
        if len < 4 || len > a.len() {
            break;
        }
        let data = &a[4..len];
        match u16_at(a, 2)? {
            UNIX_DIAG_NAME => name = Some(data.to_vec()),
            UNIX_DIAG_VFS => vfs = Some((u32_at(data, 0)?, u32_at(data, 4)?)),
            _ => {}
        }
        a = &a[len.next_multiple_of(4).min(a.len())..];
    }
    let (vfs_ino, vfs_dev) = vfs?;
    // An abstract name starts with NUL and has no file: there is no VFS attribute then.
    let mut path = name?;
    if let Some(end) = path.iter().position(|&b| b == 0) {
        path.truncate(end);
    }
    Some((ino, Bound { dev: from_kernel_dev(vfs_dev), ino32: vfs_ino, path, by_name: false }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_socket_bound_to_a_file_is_listed_with_that_files_inode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s (deleted).sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let sock_ino = std::fs::metadata(format!("/proc/self/fd/{}", listener.as_raw_fd())).unwrap().ino();
        let file = std::fs::symlink_metadata(&path).unwrap();
        let all = bound_sockets().unwrap();
        let b = all.get(&sock_ino).expect("the bound socket is in the dump");
        assert_eq!(b.path, path.as_os_str().as_encoded_bytes());
        assert_eq!(u64::from(b.ino32), file.ino() & 0xffff_ffff);
        assert_eq!(b.dev, file.dev(), "the superblock's device, st_dev here (not a btrfs subvolume)");
        let unbound = std::os::unix::net::UnixStream::pair().unwrap().0;
        let ino = std::fs::metadata(format!("/proc/self/fd/{}", unbound.as_raw_fd())).unwrap().ino();
        assert!(!all.contains_key(&ino), "an unbound socket has no file");
        // The fallback for kernels without unix socket diagnostics gives the same file.
        let fallback = from_proc_net_unix().unwrap();
        assert_eq!(fallback.get(&sock_ino), Some(b), "/proc/net/unix: {fallback:?}");
        assert!(!fallback.contains_key(&ino));
    }

    #[test]
    fn proc_net_unix_lines_give_the_inode_and_the_whole_name() {
        let line = b"0000000000000000: 00000002 00000000 00010000 0001 01    12345 /tmp/a b (deleted).sock";
        assert_eq!(net_unix_line(line), Some((12345, &b"/tmp/a b (deleted).sock"[..])));
        let unbound = b"0000000000000000: 00000003 00000000 00000000 0001 03 987";
        assert_eq!(net_unix_line(unbound), None);
        assert_eq!(net_unix_line(b"Num       RefCount Protocol Flags    Type St Inode Path"), None);
    }

    #[test]
    fn a_dump_that_stops_short_is_an_error_not_a_list() {
        let mut out = HashMap::new();
        assert!(parse(&[40, 0, 0, 0, 20, 0], &mut out).is_ok_and(|done| !done));
        assert!(parse(&[64, 0, 0, 0, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1], &mut out).is_err());
    }
}
