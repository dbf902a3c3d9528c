//! The operator's settings beside the unit, as Debian daemons keep them (earlyoom,
//! prometheus-node-exporter): `/etc/default/guard-user` for every instance, then
//! `/etc/default/guard-user@<account>` for one, whose `GUARD_ARGS` wins. The unit reads both
//! (`EnvironmentFile=-…`) and appends `$GUARD_ARGS` to `run`, so `--metrics-file` or
//! `--interval` need no copied `ExecStart=`. Both files are root's (a conffile of the package);
//! nothing of the account's reaches them.
//!
//! `check` reads them as systemd does, shows the flags in force, refuses flags the service
//! would not start with (the same validation `run` applies: [`crate::daemon::flags`]), and
//! notices a running daemon started with other flags than the files now say.
use std::{
    fs,
    path::{Path, PathBuf},
};

use super::{
    escape::AccountName,
    shown,
    unit::{ARGS_VAR, DEFAULTS_FILE},
    Layout, Systemctl,
};

/// The largest defaults file read: a line of flags is a few hundred bytes.
const MAX_BYTES: u64 = 64 * 1024;

/// The flags the unit would add, and the file they came from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Flags {
    /// `$GUARD_ARGS` split into words as systemd splits it.
    pub words: Vec<String>,
    /// The last file that set `GUARD_ARGS` (`None`: neither file sets it).
    pub from: Option<PathBuf>,
}

/// The two files for `user`, in the order systemd reads them, under `root` (`/` on a host).
pub fn files(root: &Path, user: &AccountName) -> [PathBuf; 2] {
    let base = root.join(DEFAULTS_FILE.trim_start_matches('/'));
    let mut own = base.clone().into_os_string();
    own.push(format!("@{user}"));
    [base, PathBuf::from(own)]
}

/// `GUARD_ARGS` as the unit would get it from `files` (a missing file is skipped, as `-` says).
pub fn read(files: &[PathBuf]) -> Result<Flags, String> {
    let mut flags = Flags::default();
    for f in files {
        let text = match fs::metadata(f) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(format!("{}: {e}", shown(f))),
            Ok(m) if !m.is_file() || m.len() > MAX_BYTES => {
                return Err(format!("{}: not a regular file of at most 64 KiB", shown(f)))
            }
            Ok(_) => fs::read_to_string(f).map_err(|e| format!("{}: {e}", shown(f)))?,
        };
        if let Some(value) = env_file_value(&text, ARGS_VAR) {
            flags.words = split_words(&value);
            flags.from = Some(f.clone());
        }
    }
    Ok(flags)
}

/// The last value of `key` in an `EnvironmentFile=` (systemd.exec(5)): `KEY=VALUE` lines, `#`
/// and `;` comments, a value in single quotes taken as it is, in double quotes with `\"`, `\\`,
/// `` \` `` and `\$` unescaped, unquoted with surrounding blanks trimmed; a trailing backslash
/// joins the next line.
pub fn env_file_value(text: &str, key: &str) -> Option<String> {
    let mut joined = String::new();
    let mut found = None;
    for raw in text.lines() {
        if let Some(head) = raw.strip_suffix('\\') {
            joined.push_str(head);
            continue;
        }
        joined.push_str(raw);
        let line = std::mem::take(&mut joined);
        let line = line.trim();
        if line.is_empty() || line.starts_with(['#', ';']) {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else { continue };
        if k.trim() == key {
            found = Some(unquote(v.trim()));
        }
    }
    found
}

fn unquote(v: &str) -> String {
    if let Some(inner) = v.strip_prefix('\'').and_then(|r| r.strip_suffix('\'')) {
        return inner.to_string();
    }
    if let Some(inner) = v.strip_prefix('"').and_then(|r| r.strip_suffix('"')) {
        let mut out = String::new();
        let mut chars = inner.chars();
        while let Some(c) = chars.next() {
            match (c, chars.clone().next()) {
                ('\\', Some(n @ ('"' | '\\' | '`' | '$'))) => {
                    out.push(n);
                    chars.next();
                }
                (c, _) => out.push(c),
            }
        }
        return out;
    }
    v.to_string()
}

/// `$GUARD_ARGS` as systemd splits an unbraced variable into arguments: at white space, quotes
/// keeping a word together.
pub fn split_words(value: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut quote: Option<char> = None;
    for c in value.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.get_or_insert_with(String::new).push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                word.get_or_insert_with(String::new);
            }
            (None, c) if c.is_whitespace() => words.extend(word.take()),
            (None, c) => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    words
}

/// Whether `words` are flags `run` starts with, appended to the drop-in's command line: parsed
/// as `run` parses them (an unknown flag, a second `--user`, a missing value are refused), then
/// validated as `run` validates them. `Err` is why not.
pub fn validate(layout: &Layout, words: &[String]) -> Result<(), String> {
    use clap::Parser as _;
    // The drop-in's own `--config` (when install was given one) comes with `--user` and `--home`;
    // a second one stops the service, and without one the daemon would read another config than
    // the one `check` compares: either way it is not GUARD_ARGS' to say.
    if words.iter().any(|w| w == "--config" || w.starts_with("--config=")) {
        return Err("--config is set per instance by guard-user install --config FILE, never in GUARD_ARGS".into());
    }
    let mut argv: Vec<String> =
        ["guard-user", "run", "--user", layout.user.as_str(), "--home"].map(String::from).into();
    argv.push(layout.home.to_string_lossy().into_owned());
    argv.extend(words.iter().cloned());
    let args = match guard_cli::Cli::try_parse_from(&argv) {
        Ok(guard_cli::Cli { command: Some(guard_cli::Command::Run(args)), .. }) => args,
        Ok(_) => return Err("it does not read as flags of run".into()),
        // clap's first line says what is wrong (its usage lines follow).
        Err(e) => {
            return Err(e.to_string().lines().next().unwrap_or_default().trim_start_matches("error: ").to_string())
        }
    };
    crate::daemon::flags::run_flags(&args, &layout.user.to_string()).map(|_| ()).map_err(|e| e.to_string())
}

/// What `check` learns from the defaults files: its drift lines, and the flags in force.
#[derive(Debug, Default)]
pub struct Findings {
    pub drift: Vec<String>,
    /// `flags: … (GUARD_ARGS from …)`, when any flag is in force.
    pub flags: Option<String>,
}

/// `check`'s part: the flags in force, flags the service would not start with (drift), and a
/// running daemon started with other flags than the files now say (drift: `systemctl restart`
/// applies them).
pub fn check(layout: &Layout, sc: &Systemctl) -> Findings {
    let mut r = Findings::default();
    let files = files(&layout.defaults_root, &layout.user);
    let flags = match read(&files) {
        Ok(f) => f,
        Err(why) => {
            r.drift.push(format!("{why}, so the unit cannot read its GUARD_ARGS"));
            return r;
        }
    };
    let from = flags.from.as_deref().map(|p| shown(p).to_string());
    if let (Some(from), Err(why)) = (&from, validate(layout, &flags.words)) {
        r.drift.push(format!(
            "{from}: GUARD_ARGS \"{}\" is refused ({why}), so {} cannot start",
            shown_words(&flags.words),
            layout.instance()
        ));
    }
    let running = running_flags(layout, sc);
    if let Some(running) = running.as_ref().filter(|r| **r != flags.words) {
        let now = from
            .as_deref()
            .map_or("no GUARD_ARGS".to_string(), |f| format!("{f} says \"{}\"", shown_words(&flags.words)));
        r.drift.push(format!(
            "{} runs with flags \"{}\", {now}: systemctl restart {} applies it",
            layout.instance(),
            shown_words(running),
            layout.instance()
        ));
    }
    // Nothing in force is nothing to show (the packaged file sets GUARD_ARGS="").
    let (in_force, origin) = match running {
        Some(running) if running != flags.words => (running, "as the running instance was started".to_string()),
        _ => (flags.words, from.map_or_else(|| "no defaults file".to_string(), |f| format!("GUARD_ARGS from {f}"))),
    };
    if !in_force.is_empty() {
        r.flags = Some(format!("flags: {} ({origin})", shown_words(&in_force)));
    }
    r
}

/// The words a running instance got beyond its drop-in's command line: `None` when it does not
/// run, or runs something else than the drop-in says (the leaked-daemon and drop-in checks
/// report that).
fn running_flags(layout: &Layout, sc: &Systemctl) -> Option<Vec<String>> {
    let pid = sc.main_pid(&layout.instance());
    if pid == 0 {
        return None;
    }
    let raw = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let argv: Vec<String> =
        raw.split(|&b| b == 0).filter(|w| !w.is_empty()).map(|w| String::from_utf8_lossy(w).into_owned()).collect();
    let base = layout.dropin().ok()?.argv();
    argv.strip_prefix(base.as_slice()).map(<[String]>::to_vec)
}

/// Words as one line, each escaped (root's file, but a terminal is still a terminal).
fn shown_words(words: &[String]) -> String {
    words.iter().map(|w| crate::escape::text(w.as_bytes())).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_environment_file_reads_as_systemd_reads_it() {
        let text =
            "# comment\n; also\nOTHER=1\nGUARD_ARGS=\"--interval 30s \\\"x\\\"\"\n\n  GUARD_ARGS = '--dry-run'\n";
        assert_eq!(env_file_value(text, "GUARD_ARGS").as_deref(), Some("--dry-run"));
        assert_eq!(env_file_value("GUARD_ARGS=\"a \\\"b\\\" \\\\c\"", "GUARD_ARGS").as_deref(), Some("a \"b\" \\c"));
        assert_eq!(
            env_file_value("GUARD_ARGS=--interval \\\n 30s\n", "GUARD_ARGS").as_deref(),
            Some("--interval  30s")
        );
        assert_eq!(env_file_value("GUARD_ARGS=\n", "GUARD_ARGS").as_deref(), Some(""));
        assert_eq!(env_file_value("#GUARD_ARGS=x\n", "GUARD_ARGS"), None);
    }

    #[test]
    fn the_value_splits_into_words_at_white_space_with_quotes_keeping_words_together() {
        assert_eq!(
            split_words("  --interval 30s\t--metrics-file  /a/b/ "),
            ["--interval", "30s", "--metrics-file", "/a/b/"]
        );
        assert_eq!(split_words(r#"--metrics-file "/srv/a b/x.prom""#), ["--metrics-file", "/srv/a b/x.prom"]);
        assert!(split_words("").is_empty());
    }

    #[test]
    fn the_instance_file_comes_after_the_shared_one() {
        let user = AccountName::new("alice").unwrap();
        let [a, b] = files(Path::new("/r"), &user);
        assert_eq!(
            (a.as_path(), b.as_path()),
            (Path::new("/r/etc/default/guard-user"), Path::new("/r/etc/default/guard-user@alice"))
        );
        let dir = tempfile::tempdir().unwrap();
        let [shared, own] = files(dir.path(), &user);
        fs::create_dir_all(shared.parent().unwrap()).unwrap();
        fs::write(&shared, "GUARD_ARGS=\"--interval 30s\"\n").unwrap();
        assert_eq!(read(&[shared.clone(), own.clone()]).unwrap().words, ["--interval", "30s"]);
        fs::write(&own, "GUARD_ARGS=--dry-run\n").unwrap();
        let f = read(&[shared, own.clone()]).unwrap();
        assert_eq!((f.words, f.from), (vec!["--dry-run".to_string()], Some(own)));
    }
}
