//! Where each held process came from: `<lock dir>/<instance>.slots` in root's runtime directory
//! (`/run/guard-user/`, 0700), one line `<pid> <start ticks> <cgroup path>` per held process,
//! replaced whole (temporary file, rename) before each move into the frozen cgroup and after
//! each release. Whoever releases what a daemon left (its releaser, the unit's `ExecStopPost=`,
//! the next start) reads it to put each process back where it was; only an entry whose start
//! time still matches its pid is believed.
use std::{
    fs,
    io::{self, Read, Write},
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
};

/// One held process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub pid: u32,
    pub start: u64,
    /// Its cgroup before it was held (`/user.slice/…`).
    pub origin: String,
}

/// The journal of `instance` beside its lock in `lock_dir`.
pub fn path(lock_dir: &Path, instance: &str) -> PathBuf {
    lock_dir.join(format!("{instance}.slots"))
}

/// The most a journal is read: the daemon holds at most 1024 processes of ~100 bytes (a
/// cgroup's path the account cannot name: it is never the account's own cgroup).
const MAX_BYTES: u64 = 1 << 20;

/// Replaces the journal with `entries`.
pub fn write(path: &Path, entries: &[Entry]) -> io::Result<()> {
    let mut text = String::with_capacity(entries.len() * 64);
    for e in entries {
        // A cgroup's name cannot hold a newline (the kernel refuses it at mkdir).
        if !e.origin.contains('\n') {
            text.push_str(&format!("{} {} {}\n", e.pid, e.start, e.origin));
        }
    }
    let tmp = path.with_extension("slots.tmp");
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)?;
    f.write_all(text.as_bytes())?;
    fs::rename(&tmp, path)
}

/// The journal's entries (none when it is missing or unreadable).
pub fn read(path: &Path) -> Vec<Entry> {
    let Ok(f) = fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(path) else {
        return Vec::new();
    };
    let mut text = String::new();
    if f.take(MAX_BYTES).read_to_string(&mut text).is_err() {
        return Vec::new();
    }
    text.lines()
        .filter_map(|l| {
            let mut it = l.splitn(3, ' ');
            Some(Entry {
                pid: it.next()?.parse().ok()?,
                start: it.next()?.parse().ok()?,
                origin: it.next()?.to_string(),
            })
        })
        .collect()
}

/// Removes the journal (nothing held).
pub fn remove(path: &Path) {
    let _ = fs::remove_file(path);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_journal_reads_back_what_was_written_spaces_and_all() {
        let dir = tempfile::tempdir().unwrap();
        let p = path(dir.path(), "4201-00ff");
        let entries = vec![
            Entry { pid: 7, start: 99, origin: "/user.slice/user-4201.slice/session 3.scope".into() },
            Entry { pid: 8, start: 100, origin: "/".into() },
        ];
        write(&p, &entries).unwrap();
        assert_eq!(read(&p), entries);
        fs::write(&p, "junk\n9 x /a\n10 11 /b\n").unwrap();
        assert_eq!(read(&p), [Entry { pid: 10, start: 11, origin: "/b".into() }]);
        remove(&p);
        assert!(read(&p).is_empty());
    }
}
