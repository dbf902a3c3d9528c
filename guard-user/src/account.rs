//! The guarded account: docs/architecture.md (`--user NAME|UID`, default `$SUDO_USER`, else the invoking user).
use std::{
    ffi::{CStr, CString},
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

#[derive(Debug, thiserror::Error)]
pub enum AccountError {
    #[error("no account named `{0}` in the passwd database: pass an existing account with --user NAME|UID")]
    NoSuchName(String),
    #[error("no account with uid {0} in the passwd database: pass an existing account with --user NAME|UID")]
    NoSuchUid(u32),
    #[error("account lookup failed for `{who}`: {source}")]
    Lookup { who: String, source: std::io::Error },
}

impl Account {
    /// Resolves `--user` (a name, or digits for a uid); `None` means `$SUDO_USER` when set, else
    /// the real uid of this process.
    pub fn resolve(user: Option<&str>) -> Result<Account, AccountError> {
        match user {
            Some(u) if !u.is_empty() && u.bytes().all(|b| b.is_ascii_digit()) => match u.parse::<u32>() {
                Ok(uid) => Account::by_uid(uid),
                Err(_) => Err(AccountError::NoSuchName(u.to_string())),
            },
            Some(u) => Account::by_name(u),
            None => match std::env::var("SUDO_USER") {
                Ok(s) if !s.is_empty() && s != "root" => Account::by_name(&s),
                // SAFETY: getuid cannot fail.
                _ => Account::by_uid(unsafe { libc::getuid() }),
            },
        }
    }

    pub fn by_name(name: &str) -> Result<Account, AccountError> {
        let c = CString::new(name).map_err(|_| AccountError::NoSuchName(name.to_string()))?;
        lookup(name, |pw, buf, res| unsafe { libc::getpwnam_r(c.as_ptr(), pw, buf.as_mut_ptr(), buf.len(), res) })?
            .ok_or_else(|| AccountError::NoSuchName(name.to_string()))
    }

    pub fn by_uid(uid: u32) -> Result<Account, AccountError> {
        lookup(&uid.to_string(), |pw, buf, res| unsafe { libc::getpwuid_r(uid, pw, buf.as_mut_ptr(), buf.len(), res) })?
            .ok_or(AccountError::NoSuchUid(uid))
    }
}

fn lookup(
    who: &str,
    call: impl Fn(*mut libc::passwd, &mut Vec<libc::c_char>, *mut *mut libc::passwd) -> libc::c_int,
) -> Result<Option<Account>, AccountError> {
    let mut buf: Vec<libc::c_char> = vec![0; 4096];
    loop {
        // SAFETY: passwd is plain data; getpw*_r fills it with pointers into `buf`.
        let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
        let mut res: *mut libc::passwd = std::ptr::null_mut();
        let rc = call(&mut pw, &mut buf, &mut res);
        if rc == libc::ERANGE && buf.len() < (1 << 20) {
            buf.resize(buf.len() * 4, 0);
            continue;
        }
        if rc != 0 && rc != libc::ENOENT && rc != libc::ESRCH {
            return Err(AccountError::Lookup { who: who.to_string(), source: std::io::Error::from_raw_os_error(rc) });
        }
        if res.is_null() {
            return Ok(None);
        }
        // SAFETY: on success pw_name and pw_dir point to NUL-terminated strings in `buf`.
        let (name, home) = unsafe { (CStr::from_ptr(pw.pw_name), CStr::from_ptr(pw.pw_dir)) };
        use std::os::unix::ffi::OsStrExt;
        return Ok(Some(Account {
            name: name.to_string_lossy().into_owned(),
            uid: pw.pw_uid,
            gid: pw.pw_gid,
            home: PathBuf::from(std::ffi::OsStr::from_bytes(home.to_bytes())),
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_resolves_by_name_and_by_uid() {
        assert_eq!(Account::by_name("root").unwrap().uid, 0);
        assert_eq!(Account::resolve(Some("0")).unwrap().name, "root");
    }

    #[test]
    fn an_account_that_does_not_exist_is_a_clear_error() {
        let e = Account::resolve(Some("no-such-user-guard")).unwrap_err().to_string();
        assert!(e.contains("no-such-user-guard") && e.contains("--user"), "{e}");
        assert!(matches!(Account::resolve(Some("3999999999")), Err(AccountError::NoSuchUid(_))));
    }
}
