//! The host `install`, `check` and `uninstall` run against in tests/tests/install*.rs: real
//! files in a temp root (`--unit-dir`, `--bin-dir`, optionally a simulated packaged tree
//! through `GUARD_PACKAGED_ROOT`) and a fake `systemctl` first in PATH: it appends its argv to
//! `calls` and answers is-enabled / is-active / show MainPID / is-system-running from files the
//! test controls (`enable --now` and `disable --now` update them, like the real one). A real
//! systemd parses what install wrote ([`systemd_parse`]) where its binary exists.
#![allow(dead_code)] // each test binary uses a different part

use std::{
    ffi::OsStr,
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use integration_tests::*;

const FAKE_SYSTEMCTL: &str = r#"#!/bin/sh
# Shell builtins only (no cat, grep, ...): a missing external tool must not turn into a wrong answer,
# and the VM guests (`cargo xtask vm`) carry only the tools xtask copies in.
d="$FAKE_SYSTEMCTL_DIR"
# answer FILE DEFAULT: the first line of $d/FILE, else DEFAULT.
answer() { v=$2; if [ -f "$d/$1" ]; then IFS= read -r v < "$d/$1" || [ -n "$v" ]; fi; echo "$v"; }
echo "$*" >> "$d/calls"
case "$*" in
  *is-system-running*) if [ -f "$d/user-manager" ]; then answer user-manager ""; else echo offline; exit 1; fi ;;
  *"enable --now"*) echo enabled > "$d/is-enabled"; echo active > "$d/is-active" ;;
  *"disable --now guard-user@"*) echo disabled > "$d/is-enabled"; echo inactive > "$d/is-active" ;;
  is-enabled*) v=$(answer is-enabled disabled); echo "$v"; [ "$v" = enabled ]; exit $? ;;
  is-active*) v=$(answer is-active inactive); echo "$v"; [ "$v" = active ]; exit $? ;;
  *MainPID*) answer MainPID 0 ;;
esac
exit 0
"#;

/// Homes must sit under directories only root can write (install refuses others, and /tmp is
/// private to the unit), so every test root lives here, root-owned 0755.
const BASE: &str = "/run/guard-install-tests";

/// A temp root holding the unit dir, the bin dir, the fake systemctl and two config sources
/// (`a.json`, the one install links; `b.json`, another checkout), and the account's home.
pub struct Host {
    pub home: Home,
    pub root: tempfile::TempDir,
    /// The account installed for. Tests other than the leaked-daemon one use OTHER_USER, so a
    /// `guard-user run --user TEST_USER` of a concurrently running test binary is not drift here.
    pub user: &'static str,
    pub uid: u32,
    /// `GUARD_PACKAGED_ROOT` and the packaged binary the commands run, when simulating a package.
    pub packaged: Option<PathBuf>,
}

pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

fn mkdir_0755(p: &Path) {
    fs::create_dir_all(p).unwrap();
    fs::set_permissions(p, fs::Permissions::from_mode(0o755)).unwrap();
}

impl Host {
    pub fn new() -> Host {
        Host::for_account(OTHER_USER, OTHER_UID, "home-")
    }

    /// `home_prefix` starts the home's name (a random suffix follows), so tests can give it
    /// spaces, `%`, quotes and backslashes.
    pub fn for_account(user: &'static str, uid: u32, home_prefix: &str) -> Host {
        mkdir_0755(Path::new(BASE));
        let root = tempfile::Builder::new().prefix("guard-install-").tempdir_in(BASE).unwrap();
        mkdir_0755(root.path());
        for d in ["units", "bin", "fake"] {
            mkdir_0755(&root.path().join(d));
        }
        let sc = root.path().join("fake/systemctl");
        fs::write(&sc, FAKE_SYSTEMCTL).unwrap();
        fs::set_permissions(&sc, fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(root.path().join("a.json"), shipped_config()).unwrap();
        fs::write(root.path().join("b.json"), shipped_config()).unwrap();
        let dir = tempfile::Builder::new().prefix(home_prefix).tempdir_in(root.path()).unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::chown(dir.path(), Some(uid), Some(uid)).unwrap();
        Host { home: Home { dir }, root, user, uid, packaged: None }
    }

    pub fn p(&self, rel: &str) -> PathBuf {
        self.root.path().join(rel)
    }
    pub fn h(&self, rel: &str) -> PathBuf {
        self.home.path().join(rel)
    }
    pub fn source(&self) -> PathBuf {
        fs::canonicalize(self.p("a.json")).unwrap()
    }
    pub fn link(&self) -> PathBuf {
        self.h("guard-config.json")
    }
    pub fn dropin(&self) -> PathBuf {
        self.p(&format!("units/guard-user@{}.service.d/home.conf", self.user))
    }

    pub fn answer(&self, file: &str, value: &str) {
        fs::write(self.p("fake").join(file), format!("{value}\n")).unwrap();
    }
    pub fn calls(&self) -> String {
        fs::read_to_string(self.p("fake/calls")).unwrap_or_default()
    }

    /// The binary the commands run: the build under test, or its packaged copy.
    pub fn bin(&self) -> PathBuf {
        match &self.packaged {
            Some(root) => root.join("usr/bin/guard-user"),
            None => guard_bin(),
        }
    }

    /// `guard-user <sub> --user <user> --unit-dir … --bin-dir …` with the fake systemctl and
    /// systemd "running"; the caller adds `--home`, `--config-source` and the rest.
    pub fn command(&self, sub: &str) -> Command {
        let path = format!("{}:{}", self.p("fake").display(), std::env::var("PATH").unwrap_or_default());
        let mut c = Command::new(self.bin());
        c.arg(sub).args(["--user", self.user, "--unit-dir"]).arg(self.p("units")).arg("--bin-dir").arg(self.p("bin"));
        c.env("PATH", path).env("FAKE_SYSTEMCTL_DIR", self.p("fake")).env("GUARD_SYSTEMD_RUNNING", "1");
        match &self.packaged {
            Some(root) => c.env("GUARD_PACKAGED_ROOT", root),
            None => c.env("GUARD_PACKAGED_ROOT", self.p("no-package")),
        };
        c.stdin(Stdio::null());
        c
    }

    pub fn run_with(&self, sub: &str, source: &Path, systemd: &str) -> Out {
        let mut c = self.command(sub);
        c.arg("--home").arg(self.home.path()).arg("--config-source").arg(source);
        c.env("GUARD_SYSTEMD_RUNNING", systemd);
        out(c)
    }

    pub fn run(&self, sub: &str) -> Out {
        self.run_with(sub, &self.source(), "1")
    }

    /// Lays out what the Debian package installs under `<root>/pkg` (the binary, the template it
    /// ships, the default config) and runs every command from the packaged binary from now on.
    pub fn simulate_package(&mut self) {
        let pkg = self.p("pkg");
        for d in ["usr/bin", "lib/systemd/system", "usr/share/guard-user"] {
            mkdir_0755(&pkg.join(d));
        }
        let bin = pkg.join("usr/bin/guard-user");
        fs::copy(guard_bin(), &bin).unwrap();
        fs::set_permissions(&bin, fs::Permissions::from_mode(0o755)).unwrap();
        let exe = guard::install::escape::Executable::new(&pkg.join("usr/bin/guard-user")).unwrap();
        fs::write(pkg.join("lib/systemd/system/guard-user@.service"), guard::install::unit_text(&exe)).unwrap();
        fs::write(pkg.join("usr/share/guard-user/guard-config.json"), shipped_config()).unwrap();
        self.packaged = Some(pkg);
    }
}

pub fn shipped_config() -> String {
    fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/guard-config.json")).unwrap()
}

pub fn out(mut c: Command) -> Out {
    let o = c.output().unwrap();
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// Every file under `dir`, relative, sorted.
pub fn tree(dir: &Path) -> Vec<String> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(base, &p, out);
            } else {
                out.push(p.strip_prefix(base).unwrap().display().to_string());
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// One unit as systemd's own loader understood it.
#[derive(Debug, Default)]
pub struct Parsed {
    /// `Fragment Path` and `DropIn Path`.
    pub fragment: String,
    pub dropins: String,
    /// argv of each `ExecStart=` command, as systemd stores it (before `$$` → `$` at exec).
    pub exec_start: Vec<Vec<String>>,
    /// Every `Exec*` kind the unit has (`ExecStart`, …).
    pub exec_kinds: Vec<String>,
    pub read_write_paths: Option<String>,
    /// The loader's complaints about files under the unit directory.
    pub complaints: Vec<String>,
}

/// Loads `instance` from `dirs` (first wins) with systemd's own unit loader (`systemd --test --system`,
/// which dumps every unit it loaded; it refuses to run as root, so it runs as nobody) and
/// returns what it parsed. `None`, with the reason printed, where there is no systemd binary (a
/// failure where the run requires `systemd`).
pub fn systemd_parse(dirs: &[&Path], instance: &str) -> Option<Parsed> {
    if let Some(why) = guard_test::adapt(Need::Systemd) {
        eprintln!("no systemd parse of {instance}: {why}");
        return None;
    }
    let systemd = guard_test::need::SYSTEMD.iter().copied().find(|p| Path::new(p).exists())?;
    let o = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", systemd, "--test", "--system"])
        .arg(format!("--unit={instance}"))
        .arg("--log-target=console")
        // The trailing colon keeps systemd's own directories (sysinit.target and friends).
        .env("SYSTEMD_UNIT_PATH", dirs.iter().map(|d| format!("{}:", d.display())).collect::<String>())
        .env("HOME", "/")
        .output()
        .expect("running systemd --test");
    let text = String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "systemd --test failed:\n{}", tail(&text));
    let mut p = Parsed {
        complaints: text
            .lines()
            .filter(|l| dirs.iter().any(|d| l.contains(&*d.to_string_lossy())) && !l.starts_with('\t'))
            .map(str::to_string)
            .collect(),
        ..Parsed::default()
    };
    let header = format!("\t-> Unit {instance}:");
    let lines = text.lines().skip_while(|l| *l != header).skip(1).take_while(|l| !l.starts_with("\t-> Unit "));
    assert!(text.contains(&header), "systemd did not load {instance}:\n{}", tail(&text));
    for l in lines {
        if let Some(v) = l.strip_prefix("\t\tFragment Path: ") {
            p.fragment = v.into();
        } else if let Some(v) = l.strip_prefix("\t\tDropIn Path: ") {
            p.dropins = v.into();
        } else if let Some(v) = l.strip_prefix("\t\tReadWritePaths: ") {
            p.read_write_paths = Some(v.into());
        } else if let Some(kind) = l.strip_prefix("\t\t-> ").and_then(|k| k.strip_suffix(':')) {
            if kind.starts_with("Exec") {
                p.exec_kinds.push(kind.into());
            }
        } else if let Some(cmd) = l.strip_prefix("\t\t\tCommand Line: ") {
            if p.exec_kinds.last().map(String::as_str) == Some("ExecStart") {
                p.exec_start.push(split_dumped_command(cmd));
            }
        }
    }
    Some(p)
}

fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// Splits a command line as systemd dumps it (`quote_command_line`: a word needing quotes is
/// written `"…"` with `\` before `"`, `\`, `$` and `` ` ``).
fn split_dumped_command(s: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut chars = s.chars().peekable();
    while chars.peek().is_some() {
        while chars.next_if_eq(&' ').is_some() {}
        let mut w = String::new();
        if chars.next_if_eq(&'"').is_some() {
            while let Some(c) = chars.next() {
                match c {
                    '"' => break,
                    '\\' => w.extend(chars.next()),
                    c => w.push(c),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|&c| c != ' ') {
                w.push(c);
            }
        }
        words.push(w);
    }
    words
}

/// What systemd stores for one argument the daemon should receive: `$` doubled (systemd turns
/// `$$` back into `$` when it expands variables at exec time).
pub fn stored(arg: &str) -> String {
    arg.replace('$', "$$")
}

pub fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}
