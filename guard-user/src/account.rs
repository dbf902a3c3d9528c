//! The account a subcommand guards, reads or acts on, and the one rule that names it
//! (docs/operations.md, "Which account"): `--user NAME|UID`, else `$SUDO_USER` when running as
//! root through sudo, else the invoking user. Run as root with neither, the default would be
//! root itself: a subcommand that acts on the account ([`Purpose::Acts`]) or shows its command
//! lines ([`Purpose::ShowsCommandLines`]) refuses and asks for `--user`, and one that only reads
//! ([`Purpose::Reads`]) says whom it read ([`Resolved::notice`]). Every subcommand goes through
//! [`Account::resolve`] and [`Resolved::for_purpose`]; nothing else reads `$SUDO_USER`.
//!
//! Looked up with libc's reentrant `getpwnam_r`/`getpwuid_r` (so NSS sources such as LDAP or
//! systemd-homed answer too) behind one bounded loop (`lookup`): the daemon already speaks libc
//! everywhere, and two calls do not earn a crate.
use std::{
    ffi::{CStr, CString, OsStr},
    os::unix::ffi::OsStrExt,
    path::PathBuf,
};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Account {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    /// From the passwd database; `--home` overrides where files go, not this.
    pub home: PathBuf,
}

/// The most a passwd entry may take (name, password, gecos, home, shell): glibc asks for a
/// bigger buffer with ERANGE, and a database that keeps asking (a broken NSS module, a hostile
/// directory service) is refused here rather than followed without end.
const MAX_ENTRY_BYTES: usize = 1 << 20;
/// Where the lookup starts: `sysconf(_SC_GETPW_R_SIZE_MAX)` is 1024 on glibc, too small for some
/// directory services, so one read usually does it at 4 KiB.
const FIRST_ENTRY_BYTES: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum AccountError {
    #[error("no account named `{0}` in the passwd database: pass an existing account with --user NAME|UID")]
    NoSuchName(String),
    #[error("no account with uid {0} in the passwd database: pass an existing account with --user NAME|UID")]
    NoSuchUid(u32),
    #[error("account lookup failed for `{who}`: {source}")]
    Lookup { who: String, source: std::io::Error },
    #[error(
        "the passwd entry of `{who}` does not fit in {limit} bytes: check the passwd database (nsswitch.conf) \
         for that account"
    )]
    EntryTooLarge { who: String, limit: usize },
    /// Run as root without `--user` and not through sudo, a subcommand that acts (or shows
    /// command lines) would do so to root's own processes: never without being told.
    #[error(
        "no account named: run as root without --user (and not through sudo), guard-user {command} would {what} \
         root's own processes; name the account, e.g. guard-user {command} --user alice (or --user root if root \
         is really what you mean)"
    )]
    ImplicitRoot { command: &'static str, what: &'static str },
}

/// What a subcommand does with the account it names, which decides what happens when the
/// default would be root ([`Resolved::for_purpose`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// Guards, signals, installs or records (`run`, `holders --stop`, `install`, `uninstall`,
    /// `record`): refused for an implicit root.
    Acts,
    /// Prints the account's command lines (`match` without `--cmdline`, `explain`): root's hold
    /// secrets in their arguments, so refused for an implicit root too.
    ShowsCommandLines,
    /// Reads the account's files (`status`, `tree`, `validate`, `check`): goes on, and says whom
    /// it read.
    Reads,
}

/// How the account was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Chosen {
    /// `--user`.
    Named,
    /// `$SUDO_USER`, as root through sudo.
    SudoUser,
    /// The invoking user (the real uid).
    Invoker,
}

/// Which account the rule picks before any lookup: the pure half of [`Account::resolve`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Choice {
    Named(String),
    SudoUser(String),
    Invoker(u32),
}

/// The rule itself. `$SUDO_USER` counts only when this process runs as root (sudo to root sets
/// it; a shell that inherited the variable, or `sudo -u bob`, is not "root through sudo") and
/// names someone other than root.
pub fn choose(user: Option<&str>, sudo_user: Option<&str>, euid: u32, uid: u32) -> Choice {
    match (user, sudo_user) {
        (Some(u), _) => Choice::Named(u.to_string()),
        (None, Some(s)) if euid == 0 && !s.is_empty() && s != "root" => Choice::SudoUser(s.to_string()),
        _ => Choice::Invoker(uid),
    }
}

/// An account and how it was chosen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    pub account: Account,
    pub chosen: Chosen,
}

impl Resolved {
    /// Root, though nobody named it: the default fell through to the invoking root.
    pub fn is_implicit_root(&self) -> bool {
        self.chosen != Chosen::Named && self.account.uid == 0
    }

    /// The account `command` may use for `purpose`: refused ([`AccountError::ImplicitRoot`],
    /// exit 2) when it acts or shows command lines and nobody named root.
    pub fn for_purpose(self, command: &'static str, purpose: Purpose) -> Result<Account, AccountError> {
        let what = match purpose {
            Purpose::Acts => "act on",
            Purpose::ShowsCommandLines => "print the command lines (secrets included) of",
            Purpose::Reads => return Ok(self.account),
        };
        if self.is_implicit_root() {
            return Err(AccountError::ImplicitRoot { command, what });
        }
        Ok(self.account)
    }

    /// The first line a reading subcommand prints when nobody named the account and it fell
    /// through to root, so the reader knows whose files they are looking at.
    pub fn notice(&self, command: &str) -> Option<String> {
        self.is_implicit_root().then(|| {
            format!(
                "guard-user {command}: account root (uid 0), since it runs as root without --user and not through \
                 sudo; --user NAME names another account"
            )
        })
    }
}

impl Account {
    /// The one rule ([`choose`]) applied to this process: `--user` (a name, or digits for a
    /// uid), else `$SUDO_USER` as root, else the real uid of this process.
    pub fn resolve(user: Option<&str>) -> Result<Resolved, AccountError> {
        let sudo_user = std::env::var("SUDO_USER").ok();
        // SAFETY: geteuid and getuid cannot fail.
        let (euid, uid) = unsafe { (libc::geteuid(), libc::getuid()) };
        Ok(match choose(user, sudo_user.as_deref(), euid, uid) {
            Choice::Named(u) => Resolved { account: Account::named(&u)?, chosen: Chosen::Named },
            Choice::SudoUser(s) => Resolved { account: Account::by_name(&s)?, chosen: Chosen::SudoUser },
            Choice::Invoker(uid) => Resolved { account: Account::by_uid(uid)?, chosen: Chosen::Invoker },
        })
    }

    /// `--user NAME|UID`: digits are a uid.
    fn named(u: &str) -> Result<Account, AccountError> {
        match u {
            u if !u.is_empty() && u.bytes().all(|b| b.is_ascii_digit()) => match u.parse::<u32>() {
                Ok(uid) => Account::by_uid(uid),
                Err(_) => Err(AccountError::NoSuchName(u.to_string())),
            },
            u => Account::by_name(u),
        }
    }

    pub fn by_name(name: &str) -> Result<Account, AccountError> {
        let c = CString::new(name).map_err(|_| AccountError::NoSuchName(name.to_string()))?;
        lookup(name, MAX_ENTRY_BYTES, |pw, buf, res| {
            // SAFETY: `c` is NUL-terminated; `pw`, `buf` (with its length) and `res` are valid for
            // writes for the call (see `lookup`).
            unsafe { libc::getpwnam_r(c.as_ptr(), pw, buf.as_mut_ptr(), buf.len(), res) }
        })?
        .ok_or_else(|| AccountError::NoSuchName(name.to_string()))
    }

    pub fn by_uid(uid: u32) -> Result<Account, AccountError> {
        lookup(&uid.to_string(), MAX_ENTRY_BYTES, |pw, buf, res| {
            // SAFETY: `pw`, `buf` (with its length) and `res` are valid for writes for the call.
            unsafe { libc::getpwuid_r(uid, pw, buf.as_mut_ptr(), buf.len(), res) }
        })?
        .ok_or(AccountError::NoSuchUid(uid))
    }
}

/// One `getpw*_r` lookup: `call` fills `pw` with pointers into the buffer and sets the result
/// pointer when an entry was found. The buffer grows fourfold on ERANGE, up to `max` bytes.
fn lookup(
    who: &str,
    max: usize,
    mut call: impl FnMut(*mut libc::passwd, &mut [libc::c_char], *mut *mut libc::passwd) -> libc::c_int,
) -> Result<Option<Account>, AccountError> {
    let mut buf: Vec<libc::c_char> = vec![0; FIRST_ENTRY_BYTES.min(max)];
    loop {
        // SAFETY: passwd is plain data (integers and pointers), for which all zeroes is valid.
        let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
        let mut res: *mut libc::passwd = std::ptr::null_mut();
        let rc = call(&mut pw, &mut buf, &mut res);
        if rc == libc::ERANGE {
            if buf.len() >= max {
                return Err(AccountError::EntryTooLarge { who: who.to_string(), limit: max });
            }
            buf.resize((buf.len() * 4).min(max), 0);
            continue;
        }
        // Not found is rc 0 with no result; glibc also reports it as ENOENT or ESRCH from some
        // NSS modules (getpwnam_r(3), NOTES).
        if rc != 0 && rc != libc::ENOENT && rc != libc::ESRCH {
            return Err(AccountError::Lookup { who: who.to_string(), source: std::io::Error::from_raw_os_error(rc) });
        }
        if res.is_null() {
            return Ok(None);
        }
        // SAFETY: on success pw_name and pw_dir point to NUL-terminated strings in `buf`, which
        // outlives these borrows.
        let (name, home) = unsafe { (CStr::from_ptr(pw.pw_name), CStr::from_ptr(pw.pw_dir)) };
        return Ok(Some(Account {
            name: name.to_string_lossy().into_owned(),
            uid: pw.pw_uid,
            gid: pw.pw_gid,
            home: PathBuf::from(OsStr::from_bytes(home.to_bytes())),
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_resolves_by_name_and_by_uid() {
        assert_eq!(Account::by_name("root").unwrap().uid, 0);
        assert_eq!(Account::resolve(Some("0")).unwrap().account.name, "root");
    }

    #[test]
    fn an_account_that_does_not_exist_is_a_clear_error() {
        let e = Account::resolve(Some("no-such-user-guard")).unwrap_err().to_string();
        assert!(e.contains("no-such-user-guard") && e.contains("--user"), "{e}");
        assert!(matches!(Account::resolve(Some("3999999999")), Err(AccountError::NoSuchUid(_))));
    }

    /// A name no passwd entry can have (a NUL byte, a uid past u32) is "no such account", never
    /// a truncated lookup of something else.
    #[test]
    fn a_name_with_a_nul_byte_or_an_oversized_uid_is_no_such_account() {
        assert!(matches!(Account::resolve(Some("root\0x")), Err(AccountError::NoSuchName(n)) if n == "root\0x"));
        assert!(matches!(Account::resolve(Some("99999999999")), Err(AccountError::NoSuchName(_))));
    }

    #[test]
    fn the_rule_is_user_then_sudo_user_as_root_then_the_invoker() {
        let named = |s: &str| Choice::Named(s.into());
        assert_eq!(choose(Some("bob"), Some("alice"), 0, 0), named("bob"));
        assert_eq!(choose(Some("root"), None, 0, 0), named("root"));
        assert_eq!(choose(None, Some("alice"), 0, 1000), Choice::SudoUser("alice".into()));
        // sudo by root, an empty variable, or a variable inherited by a non-root process.
        assert_eq!(choose(None, Some("root"), 0, 0), Choice::Invoker(0));
        assert_eq!(choose(None, Some(""), 0, 0), Choice::Invoker(0));
        assert_eq!(choose(None, Some("alice"), 1001, 1001), Choice::Invoker(1001));
        assert_eq!(choose(None, None, 0, 0), Choice::Invoker(0));
    }

    #[test]
    fn an_implicit_root_is_refused_for_acting_and_command_lines_and_announced_for_reading() {
        let root = Account { name: "root".into(), uid: 0, gid: 0, home: "/root".into() };
        let alice = Account { name: "alice".into(), uid: 1000, gid: 1000, home: "/home/alice".into() };
        let r = |account: &Account, chosen| Resolved { account: account.clone(), chosen };
        for purpose in [Purpose::Acts, Purpose::ShowsCommandLines] {
            let e = r(&root, Chosen::Invoker).for_purpose("run", purpose).unwrap_err().to_string();
            assert!(e.contains("--user") && e.contains("guard-user run --user alice"), "{e}");
            assert!(r(&root, Chosen::Named).for_purpose("run", purpose).is_ok());
            assert!(r(&alice, Chosen::Invoker).for_purpose("run", purpose).is_ok());
            assert!(r(&alice, Chosen::SudoUser).for_purpose("run", purpose).is_ok());
        }
        assert!(r(&root, Chosen::Invoker).for_purpose("status", Purpose::Reads).is_ok());
        let notice = r(&root, Chosen::Invoker).notice("status").unwrap();
        assert!(notice.starts_with("guard-user status: account root (uid 0), since"), "{notice}");
        assert_eq!(r(&root, Chosen::Named).notice("status"), None);
        assert_eq!(r(&alice, Chosen::Invoker).notice("status"), None);
    }

    /// Writes an entry into the lookup's buffer the way glibc does: strings in `buf`, pointers
    /// to them in `pw`.
    fn fill(pw: *mut libc::passwd, buf: &mut [libc::c_char], res: *mut *mut libc::passwd, name: &[u8], home: &[u8]) {
        let mut at = 0;
        let mut put = |s: &[u8]| {
            let start = at;
            for &b in s.iter().chain([0u8].iter()) {
                buf[at] = b as libc::c_char;
                at += 1;
            }
            // SAFETY: `start` is inside `buf`.
            unsafe { buf.as_mut_ptr().add(start) }
        };
        let (n, h) = (put(name), put(home));
        // SAFETY: `pw` and `res` point to the lookup's locals, valid for writes.
        unsafe {
            (*pw).pw_name = n;
            (*pw).pw_dir = h;
            (*pw).pw_uid = 1234;
            (*pw).pw_gid = 99;
            *res = pw;
        }
    }

    #[test]
    fn the_buffer_grows_until_a_large_entry_fits() {
        let mut sizes = Vec::new();
        let home = vec![b'h'; 20_000];
        let found = lookup("big", MAX_ENTRY_BYTES, |pw, buf, res| {
            sizes.push(buf.len());
            if buf.len() < 20_100 {
                return libc::ERANGE;
            }
            fill(pw, buf, res, b"big", &home);
            0
        })
        .unwrap()
        .unwrap();
        assert_eq!(sizes, [4096, 16_384, 65_536]);
        assert_eq!((found.name.as_str(), found.uid, found.gid), ("big", 1234, 99));
        assert_eq!(found.home.as_os_str().len(), 20_000);
    }

    /// A database that answers ERANGE whatever the size (a broken or hostile NSS module) costs a
    /// few calls and at most the cap, then a clear error.
    #[test]
    fn an_entry_that_never_fits_stops_at_the_cap() {
        let mut sizes = Vec::new();
        let e = lookup("endless", MAX_ENTRY_BYTES, |_, buf, _| {
            sizes.push(buf.len());
            libc::ERANGE
        })
        .unwrap_err();
        assert_eq!(sizes, [4096, 16_384, 65_536, 262_144, 1_048_576]);
        assert!(matches!(&e, AccountError::EntryTooLarge { limit: MAX_ENTRY_BYTES, .. }), "{e:?}");
        assert!(e.to_string().contains("endless") && e.to_string().contains("nsswitch"), "{e}");
    }

    #[test]
    fn not_found_and_failed_lookups_are_told_apart() {
        assert!(lookup("gone", MAX_ENTRY_BYTES, |_, _, _| 0).unwrap().is_none());
        assert!(lookup("gone", MAX_ENTRY_BYTES, |_, _, _| libc::ENOENT).unwrap().is_none());
        let e = lookup("broken", MAX_ENTRY_BYTES, |_, _, _| libc::EIO).unwrap_err();
        assert!(
            matches!(&e, AccountError::Lookup { who, source } if who == "broken" && source.raw_os_error() == Some(libc::EIO))
        );
    }
}
