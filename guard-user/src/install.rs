//! SPEC §8: what `install` puts on a host, what `uninstall` takes away, and the drift `check`
//! reports. The CLI edges (`cmd/install.rs`, `cmd/check.rs`) print; this module decides.
//!
//! # Choices where SPEC is silent
//! - systemd "is running" when `/run/systemd/system` exists (what `sd_booted(3)` tests).
//!   `GUARD_SYSTEMD_RUNNING=1|0` overrides that answer (tests run without systemd, with a fake
//!   `systemctl` first in `PATH`; `systemctl` is always looked up in `PATH`).
//! - The unit is a template, so the account's home cannot be named in it: install writes a
//!   per-instance drop-in `guard-user@<user>.service.d/home.conf` with `ReadWritePaths=<home>`.
//!   `check` reports that drop-in like the unit.
//! - A leaked daemon is a process whose argv is `guard-user run …` (or bare `guard-user [--flags]`)
//!   with `--user <name|uid>` naming the account, or with no `--user` and the account's euid;
//!   we do not chase `$SUDO_USER` in another process's environment.
//! - A missing status file is not drift by itself (the first status is written after the first
//!   tick); `is not active` already covers a guard that never started.
use std::{
    fs,
    io::{self, Write},
    os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, SystemTime},
};

use crate::{account::Account, config, procfs, status};

/// The unit template's file name.
pub const UNIT_NAME: &str = "guard-user@.service";
/// The legacy guard's files, relative to the home (SPEC §8 step 2).
pub const LEGACY_SCRIPT: &str = "guard-daemon.sh";
pub const LEGACY_UNITS: [&str; 2] = ["guard-daemon.timer", "guard-daemon.service"];
pub const LEGACY_UNIT_DIR: &str = ".config/systemd/user";

#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error("the config source {} is invalid: {reason}; fix it or pass --config-source FILE", path.display())]
    InvalidSource { path: PathBuf, reason: config::ConfigError },
    #[error("the config source {} does not exist ({source}); pass --config-source FILE", path.display())]
    NoSource { path: PathBuf, source: io::Error },
    #[error("`systemctl {args}` failed: {detail}")]
    Systemctl { args: String, detail: String },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> InstallError + '_ {
    move |source| InstallError::Io { path: path.to_path_buf(), source }
}

/// Where everything goes for one account.
#[derive(Clone, Debug)]
pub struct Layout {
    pub account: Account,
    /// `--home` or the passwd home: where the config link and the legacy files live.
    pub home: PathBuf,
    /// The link install writes (`<home>/guard-config.json`, or `--config`).
    pub config_link: PathBuf,
    /// What the link points to, canonical.
    pub source: PathBuf,
    pub unit_dir: PathBuf,
    pub bin_dir: PathBuf,
}

impl Layout {
    pub fn unit_path(&self) -> PathBuf {
        self.unit_dir.join(UNIT_NAME)
    }
    pub fn instance(&self) -> String {
        instance_name(&self.account.name)
    }
    pub fn dropin_path(&self) -> PathBuf {
        self.unit_dir.join(format!("{}.d", self.instance())).join("home.conf")
    }
    pub fn bin_path(&self) -> PathBuf {
        self.bin_dir.join("guard-user")
    }
    pub fn legacy_paths(&self) -> Vec<PathBuf> {
        let mut v = vec![self.home.join(LEGACY_SCRIPT)];
        v.extend(LEGACY_UNITS.iter().map(|u| self.home.join(LEGACY_UNIT_DIR).join(u)));
        v
    }
}

pub fn instance_name(user: &str) -> String {
    format!("guard-user@{user}.service")
}

/// The shipped config in the checkout this binary was built from.
pub fn default_source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/guard-config.json")
}

/// The config source, canonical (the link points at the real file, not at another link).
pub fn resolve_source(given: Option<&Path>) -> Result<PathBuf, InstallError> {
    let path = given.map(Path::to_path_buf).unwrap_or_else(default_source);
    fs::canonicalize(&path).map_err(|source| InstallError::NoSource { path, source })
}

pub fn systemd_running() -> bool {
    match std::env::var("GUARD_SYSTEMD_RUNNING").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => Path::new("/run/systemd/system").is_dir(),
    }
}

/// The unit template this build installs. `bin_dir` is where `install` put the binary.
pub fn unit_text(bin_dir: &Path) -> String {
    let exe = bin_dir.join("guard-user");
    let exe = exe.display();
    format!(
        r#"# Installed by `guard-user install`; `guard-user check` reports any edit as drift.
# One instance per guarded account: guard-user@<account>.service. The account's home is made
# writable by the per-instance drop-in guard-user@<account>.service.d/home.conf.
[Unit]
Description=guard: ends process names that pile up for %i
Documentation=file://{exe}
# Classic tracepoints (the setuid family) resolve their ids in tracefs. systemd mounts it here;
# the unit does not get CAP_SYS_ADMIN to mount it itself. Without it the guard still runs and
# logs a WARN (uid changes without exec are then caught by the periodic audit).
Wants=sys-kernel-tracing.mount
After=sys-kernel-tracing.mount network.target
# No start-rate limit: a guard that gives up is worse than one that keeps retrying. (A [Unit]
# setting: systemd ignores it in [Service], with a warning on every daemon-reload.)
StartLimitIntervalSec=0

[Service]
Type=simple
ExecStart={exe} run --user %i
Restart=always
RestartSec=5s

# Least privilege: root's uid, but only these capabilities.
#   CAP_BPF             load the BPF programs and create their maps
#   CAP_PERFMON         attach the tp_btf programs and read the kernel's BTF. The classic
#                       setuid-family tracepoints go through perf_event_open, which Debian and
#                       Ubuntu kernels at their default kernel.perf_event_paranoid=3 allow only
#                       with CAP_SYS_ADMIN: there the guard logs WARN setuid_untracked and the
#                       periodic audit catches uid changes without exec.
#   CAP_KILL            signal processes of another uid (the guarded account's)
#   CAP_SETUID/SETGID   setfsuid/setfsgid: files in the home are written as the account (safefs)
#   CAP_DAC_READ_SEARCH traverse a 0700 home and read /proc entries of other uids
# Not CAP_SYS_ADMIN: tracefs comes from sys-kernel-tracing.mount (see [Unit]).
# Not CAP_DAC_OVERRIDE/CAP_FOWNER/CAP_CHOWN: writes happen as the account, never as root.
CapabilityBoundingSet=CAP_BPF CAP_PERFMON CAP_KILL CAP_SETUID CAP_SETGID CAP_DAC_READ_SEARCH
AmbientCapabilities=CAP_BPF CAP_PERFMON CAP_KILL CAP_SETUID CAP_SETGID CAP_DAC_READ_SEARCH
NoNewPrivileges=yes
# BPF maps are charged to memlock on kernels before 5.11; systemd raises it before exec.
LimitMEMLOCK=infinity

# The file system is read-only except the account's home (the drop-in's ReadWritePaths).
# Trade-off: the whole home is writable (as the account's fsuid), because the log, state and
# status files live in it by default; a stateFile elsewhere gets its directory added too.
ProtectSystem=strict
ProtectHome=read-only
PrivateTmp=yes
PrivateDevices=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
RestrictNamespaces=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
SystemCallArchitectures=native
# Unix sockets for the journal, INET for the optional swarm Redis.
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6

# The guard must outlive the pile it ends: small, bounded, and last in line for the OOM killer.
MemoryMax=64M
TasksMax=32
OOMScoreAdjust=-900

[Install]
WantedBy=multi-user.target
"#
    )
}

/// The per-instance drop-in: the directories the daemon writes to.
pub fn dropin_text(home: &Path, state_dir: Option<&Path>) -> String {
    let mut s = String::from("# Installed by `guard-user install`: where this account's guard files live.\n[Service]\n");
    s.push_str(&format!("ReadWritePaths={}\n", home.display()));
    if let Some(d) = state_dir.filter(|d| !d.starts_with(home)) {
        s.push_str(&format!("ReadWritePaths={}\n", d.display()));
    }
    s
}

/// The stateFile directory the config names (None when the config cannot be read).
pub fn state_dir(layout: &Layout) -> Option<PathBuf> {
    config::load(&layout.config_link, &layout.home).ok().and_then(|c| c.state_file.parent().map(Path::to_path_buf))
}

fn status_path(layout: &Layout) -> PathBuf {
    let state = config::load(&layout.config_link, &layout.home)
        .map(|c| c.state_file)
        .unwrap_or_else(|_| config::expand_tilde(config::DEFAULT_STATE_FILE, &layout.home));
    status::path_beside(&state)
}

/// `systemctl`, looked up in PATH (tests put a fake first).
#[derive(Clone, Debug, Default)]
pub struct Systemctl;

pub struct Answer {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Systemctl {
    pub fn query(&self, args: &[&str]) -> Answer {
        match Command::new("systemctl").args(args).stdin(std::process::Stdio::null()).output() {
            Ok(o) => Answer {
                ok: o.status.success(),
                stdout: String::from_utf8_lossy(&o.stdout).trim().to_string(),
                stderr: String::from_utf8_lossy(&o.stderr).trim().to_string(),
            },
            Err(e) => Answer { ok: false, stdout: String::new(), stderr: format!("cannot run systemctl: {e}") },
        }
    }

    pub fn run(&self, args: &[&str]) -> Result<(), InstallError> {
        let a = self.query(args);
        if a.ok {
            Ok(())
        } else {
            Err(InstallError::Systemctl { args: args.join(" "), detail: if a.stderr.is_empty() { a.stdout } else { a.stderr } })
        }
    }

    pub fn is_enabled(&self, unit: &str) -> bool {
        let a = self.query(&["is-enabled", unit]);
        a.ok && a.stdout.starts_with("enabled")
    }

    pub fn is_active(&self, unit: &str) -> bool {
        self.query(&["is-active", unit]).stdout == "active"
    }

    /// Whether `user`'s systemd user manager answers (`--user -M user@`).
    pub fn user_manager_answers(&self, user: &str) -> bool {
        let m = format!("{user}@");
        let a = self.query(&["--user", "-M", &m, "is-system-running"]);
        matches!(a.stdout.as_str(), "running" | "degraded" | "starting" | "initializing" | "maintenance")
    }

    /// The unit's main pid (0 when it has none).
    pub fn main_pid(&self, unit: &str) -> u32 {
        self.query(&["show", "-p", "MainPID", "--value", unit]).stdout.parse().unwrap_or(0)
    }
}

/// Temp name beside `path` (same directory, so the rename is atomic).
fn temp_beside(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp.{}", std::process::id()))
}

/// Whether `link` is a symlink to `source` (resolving a relative target against its directory,
/// and comparing canonical paths, so `../x` and `/abs/x` to the same file agree).
pub fn links_to(link: &Path, source: &Path) -> bool {
    let Ok(target) = fs::read_link(link) else { return false };
    let target = if target.is_absolute() { target } else { link.parent().unwrap_or(Path::new("/")).join(target) };
    target == source || fs::canonicalize(&target).ok().as_deref() == Some(source)
}

/// Points `link` at `source` in one step: a symlink written beside it under a temp name,
/// owned by the account (lchown), renamed over whatever is there (a hand copy, a link to
/// another checkout). A reader sees the old entry or the new one, never none.
/// Returns whether anything changed.
pub fn relink(link: &Path, source: &Path, uid: u32, gid: u32) -> Result<bool, InstallError> {
    if links_to(link, source) {
        let meta = fs::symlink_metadata(link).map_err(io_err(link))?;
        if meta.uid() == uid && meta.gid() == gid {
            return Ok(false);
        }
        std::os::unix::fs::lchown(link, Some(uid), Some(gid)).map_err(io_err(link))?;
        return Ok(true);
    }
    let tmp = temp_beside(link);
    // A leftover (or planted) temp entry: unlink removes the entry, never a link's target.
    let _ = fs::remove_file(&tmp);
    let result = (|| {
        std::os::unix::fs::symlink(source, &tmp).map_err(io_err(&tmp))?;
        std::os::unix::fs::lchown(&tmp, Some(uid), Some(gid)).map_err(io_err(&tmp))?;
        fs::rename(&tmp, link).map_err(io_err(link))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map(|()| true)
}

/// Writes `bytes` to `path` unless it already holds exactly them (temp file, fsync, rename).
/// Returns whether it wrote.
pub fn write_if_different(path: &Path, bytes: &[u8], mode: u32) -> Result<bool, InstallError> {
    if let Ok(meta) = fs::symlink_metadata(path) {
        if meta.file_type().is_file() && meta.permissions().mode() & 0o7777 == mode && fs::read(path).ok().as_deref() == Some(bytes) {
            return Ok(false);
        }
    }
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).map_err(io_err(dir))?;
    }
    let tmp = temp_beside(path);
    let _ = fs::remove_file(&tmp);
    let result = (|| {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)
            .map_err(io_err(&tmp))?;
        f.write_all(bytes).map_err(io_err(&tmp))?;
        // The umask may have narrowed `mode`.
        f.set_permissions(fs::Permissions::from_mode(mode)).map_err(io_err(&tmp))?;
        f.sync_all().map_err(io_err(&tmp))?;
        fs::rename(&tmp, path).map_err(io_err(path))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map(|()| true)
}

fn remove_if_present(path: &Path) -> Result<bool, InstallError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(InstallError::Io { path: path.into(), source: e }),
    }
}

/// What one install did, in order; empty when nothing changed.
pub type Changes = Vec<String>;

/// SPEC §8 step 2: disables the legacy user units where the account's user manager answers,
/// then removes them (and their `.wants` links) and the legacy script.
pub fn retire_legacy(layout: &Layout, sc: &Systemctl, changes: &mut Changes) -> Result<(), InstallError> {
    let unit_dir = layout.home.join(LEGACY_UNIT_DIR);
    let present: Vec<&str> = LEGACY_UNITS.iter().copied().filter(|u| fs::symlink_metadata(unit_dir.join(u)).is_ok()).collect();
    let manager = format!("{}@", layout.account.name);
    let answering = !present.is_empty() && sc.user_manager_answers(&layout.account.name);
    if answering {
        for u in &present {
            // A unit that is already disabled or not loaded is not a failure here.
            let _ = sc.query(&["--user", "-M", &manager, "disable", "--now", u]);
            changes.push(format!("disabled the legacy user unit {u}"));
        }
    }
    for u in LEGACY_UNITS {
        for wants in ["timers.target.wants", "default.target.wants"] {
            remove_if_present(&unit_dir.join(wants).join(u))?;
        }
        if remove_if_present(&unit_dir.join(u))? {
            changes.push(format!("removed {}", unit_dir.join(u).display()));
        }
    }
    if answering {
        let _ = sc.query(&["--user", "-M", &manager, "daemon-reload"]);
    }
    let script = layout.home.join(LEGACY_SCRIPT);
    if remove_if_present(&script)? {
        changes.push(format!("removed {}", script.display()));
    }
    Ok(())
}

/// How install ended: scheduled under systemd, or only linked (systemd not running).
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Scheduled,
    NotScheduled,
}

/// SPEC §8 `install`, steps 1–3. `exe` is the binary to install (the running one).
pub fn install(layout: &Layout, exe: &Path, sc: &Systemctl) -> Result<(Outcome, Changes), InstallError> {
    config::load(&layout.source, &layout.home)
        .map_err(|reason| InstallError::InvalidSource { path: layout.source.clone(), reason })?;
    let mut changes = Changes::new();
    if relink(&layout.config_link, &layout.source, layout.account.uid, layout.account.gid)? {
        changes.push(format!("linked {} to {}", layout.config_link.display(), layout.source.display()));
    }
    retire_legacy(layout, sc, &mut changes)?;

    let bin = fs::read(exe).map_err(io_err(exe))?;
    let bin_changed = write_if_different(&layout.bin_path(), &bin, 0o755)?;
    if bin_changed {
        changes.push(format!("installed {}", layout.bin_path().display()));
    }
    let mut unit_changed = write_if_different(&layout.unit_path(), unit_text(&layout.bin_dir).as_bytes(), 0o644)?;
    if unit_changed {
        changes.push(format!("wrote {}", layout.unit_path().display()));
    }
    let dropin = dropin_text(&layout.home, state_dir(layout).as_deref());
    if write_if_different(&layout.dropin_path(), dropin.as_bytes(), 0o644)? {
        unit_changed = true;
        changes.push(format!("wrote {}", layout.dropin_path().display()));
    }

    if !systemd_running() {
        return Ok((Outcome::NotScheduled, changes));
    }
    let instance = layout.instance();
    if unit_changed {
        sc.run(&["daemon-reload"])?;
        changes.push("reloaded systemd".into());
    }
    let was_active = sc.is_active(&instance);
    if !sc.is_enabled(&instance) || !was_active {
        sc.run(&["enable", "--now", &instance])?;
        changes.push(format!("enabled and started {instance}"));
    } else if unit_changed || bin_changed {
        // enable --now leaves a running instance on the old build.
        sc.run(&["restart", &instance])?;
        changes.push(format!("restarted {instance}"));
    }
    Ok((Outcome::Scheduled, changes))
}

/// Other accounts' enabled instances (links in `<unit-dir>/*.wants/`).
fn other_instances(layout: &Layout) -> Vec<String> {
    let mine = layout.instance();
    let mut out = Vec::new();
    let Ok(dir) = fs::read_dir(&layout.unit_dir) else { return out };
    for wants in dir.flatten().filter(|e| e.file_name().to_string_lossy().ends_with(".wants")) {
        for e in fs::read_dir(wants.path()).into_iter().flatten().flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if n.starts_with("guard-user@") && n.ends_with(".service") && n != mine && !out.contains(&n) {
                out.push(n);
            }
        }
    }
    out
}

/// `uninstall`: stops and disables the instance, removes its drop-in, and the unit and the
/// binary unless another account's instance still uses them. Keeps the config link and the log.
/// Returns the changes and the other instances that kept the shared files.
pub fn uninstall(layout: &Layout, sc: &Systemctl) -> Result<(Changes, Vec<String>), InstallError> {
    let mut changes = Changes::new();
    let instance = layout.instance();
    let running = systemd_running();
    if running && (sc.is_enabled(&instance) || sc.is_active(&instance)) {
        sc.run(&["disable", "--now", &instance])?;
        changes.push(format!("stopped and disabled {instance}"));
    }
    let dropin = layout.dropin_path();
    if remove_if_present(&dropin)? {
        changes.push(format!("removed {}", dropin.display()));
    }
    if let Some(d) = dropin.parent() {
        let _ = fs::remove_dir(d); // only when empty: an operator's own drop-ins stay
    }
    let others = other_instances(layout);
    if others.is_empty() {
        for p in [layout.unit_path(), layout.bin_path()] {
            if remove_if_present(&p)? {
                changes.push(format!("removed {}", p.display()));
            }
        }
    }
    if running && !changes.is_empty() {
        sc.run(&["daemon-reload"])?;
    }
    Ok((changes, others))
}

/// `check`'s findings: SPEC §8 drift lines, and checks that could not run (and why).
#[derive(Debug, Default)]
pub struct Report {
    pub drift: Vec<String>,
    pub skipped: Vec<String>,
}

fn denied(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::PermissionDenied
}

/// SPEC §8 `check`: reads only. `exe` is this build (the installed binary must match it).
pub fn check(layout: &Layout, exe: &Path, sc: &Systemctl, now: SystemTime) -> Report {
    let mut r = Report::default();
    let link = &layout.config_link;
    let d = link.display();
    match fs::symlink_metadata(link) {
        Err(e) if denied(&e) => r.skipped.push(format!("{d}: {e} (run as root)")),
        Err(_) => r.drift.push(format!("{d} is missing")),
        Ok(_) => {
            if !links_to(link, &layout.source) {
                r.drift.push(format!("{d} is not a link to {}", layout.source.display()));
            }
            match config::load(link, &layout.home) {
                Err(config::ConfigError::Io { source, .. }) if denied(&source) => {
                    r.skipped.push(format!("{d}: {source} (run as root)"))
                }
                Err(e) => r.drift.push(format!("{d} is invalid: {e}")),
                Ok(_) => {}
            }
        }
    }
    for p in layout.legacy_paths() {
        match fs::symlink_metadata(&p) {
            Ok(_) if p.ends_with(LEGACY_SCRIPT) => {
                r.drift.push(format!("{} is still present, so the legacy guard can run beside guard-user", p.display()))
            }
            Ok(_) => r.drift.push(format!("{} still runs the legacy guard", p.display())),
            Err(e) if denied(&e) => r.skipped.push(format!("{}: {e} (run as root)", p.display())),
            Err(_) => {}
        }
    }
    if fs::read(layout.unit_path()).ok().as_deref() != Some(unit_text(&layout.bin_dir).as_bytes()) {
        r.drift.push(format!("{} is missing or differs from this build", layout.unit_path().display()));
    }
    let dropin = dropin_text(&layout.home, state_dir(layout).as_deref());
    if fs::read(layout.dropin_path()).ok().as_deref() != Some(dropin.as_bytes()) {
        r.drift.push(format!("{} is missing or differs from this build", layout.dropin_path().display()));
    }
    let same_binary = match (fs::read(layout.bin_path()), fs::read(exe)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if !same_binary {
        r.drift.push(format!("{} is missing or differs from this build", layout.bin_path().display()));
    }
    let instance = layout.instance();
    if !sc.is_enabled(&instance) {
        r.drift.push(format!("{instance} is not enabled"));
    }
    if !sc.is_active(&instance) {
        r.drift.push(format!("{instance} is not active"));
    }
    heartbeat(layout, now, &mut r);
    leaked_daemons(layout, sc, &mut r);
    r
}

fn heartbeat(layout: &Layout, now: SystemTime, r: &mut Report) {
    let path = status_path(layout);
    let s = match status::read(&path) {
        Ok(s) => s,
        Err(e) => {
            if matches!(fs::metadata(&path), Err(ref e) if denied(e)) {
                r.skipped.push(format!("heartbeat: {e} (run as root)"));
            }
            return;
        }
    };
    let now_secs = now.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
    let age = now_secs - s.last_tick;
    if age > 2.0 * s.interval_secs.max(1.0) {
        let last = crate::log::local_timestamp(SystemTime::UNIX_EPOCH + Duration::from_secs_f64(s.last_tick.max(0.0)));
        r.drift.push(format!("the guard has not completed a tick for {}s (last at {last})", age as u64));
    }
}

/// Whether `argv` is a `guard-user run` for `account` (see the module doc).
pub fn is_guard_run_for(argv: &[String], euid: u32, account: &Account) -> bool {
    let Some(exe) = argv.first() else { return false };
    if Path::new(exe).file_name().and_then(|n| n.to_str()) != Some("guard-user") {
        return false;
    }
    // `run`, or no subcommand at all (bare `guard-user [--flags]` runs the daemon).
    let is_run = argv.get(1).is_some_and(|a| a == "run") || !argv[1..].iter().any(|a| SUBCOMMANDS.contains(&a.as_str()));
    if !is_run {
        return false;
    }
    let mut user = None;
    let mut it = argv[1..].iter();
    while let Some(a) = it.next() {
        if a == "--user" {
            user = it.next().cloned();
        } else if let Some(v) = a.strip_prefix("--user=") {
            user = Some(v.to_string());
        }
    }
    match user {
        Some(u) => u == account.name || u == account.uid.to_string(),
        None => euid == account.uid,
    }
}

const SUBCOMMANDS: &[&str] = &["run", "match", "status", "check", "install", "uninstall", "help"];

fn leaked_daemons(layout: &Layout, sc: &Systemctl, r: &mut Report) {
    let instance = layout.instance();
    let mut buf = Vec::new();
    // The unit's process, identified by pid and start time read right after asking systemd.
    let main_pid = sc.main_pid(&instance);
    let main = (main_pid != 0).then(|| procfs::read_process(main_pid, &mut buf).map(|p| p.id)).flatten();
    let Ok(dir) = fs::read_dir("/proc") else {
        r.skipped.push("leaked daemons: /proc is not readable".into());
        return;
    };
    let me = std::process::id();
    let mut leaked = Vec::new();
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        if pid == me {
            continue;
        }
        let Ok(raw) = fs::read(format!("/proc/{pid}/cmdline")) else { continue };
        let argv: Vec<String> =
            raw.split(|&b| b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
        let Some(p) = procfs::read_process(pid, &mut buf) else { continue };
        if !is_guard_run_for(&argv, p.euid, &layout.account) {
            continue;
        }
        if main == Some(p.id) {
            continue;
        }
        leaked.push(pid);
    }
    leaked.sort_unstable();
    for pid in leaked {
        r.drift.push(format!("guard-user pid {pid} is running outside {instance}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acct() -> Account {
        Account { name: "alice".into(), uid: 1000, gid: 1000, home: "/home/alice".into() }
    }

    fn v(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn a_run_for_the_account_is_recognised_by_name_uid_or_euid() {
        let a = acct();
        assert!(is_guard_run_for(&v(&["/usr/local/bin/guard-user", "run", "--user", "alice"]), 0, &a));
        assert!(is_guard_run_for(&v(&["guard-user", "run", "--user=1000"]), 0, &a));
        assert!(is_guard_run_for(&v(&["guard-user", "--dry-run"]), 1000, &a));
        assert!(is_guard_run_for(&v(&["guard-user"]), 1000, &a));
        assert!(!is_guard_run_for(&v(&["guard-user", "run", "--user", "bob"]), 1000, &a));
        assert!(!is_guard_run_for(&v(&["guard-user", "check", "--user", "alice"]), 0, &a));
        assert!(!is_guard_run_for(&v(&["guard-user", "--home", "/x", "status"]), 1000, &a));
        assert!(!is_guard_run_for(&v(&["vim", "run", "--user", "alice"]), 1000, &a));
    }

    #[test]
    fn the_unit_names_the_installed_binary_and_restarts_always() {
        let t = unit_text(Path::new("/opt/bin"));
        assert!(t.contains("ExecStart=/opt/bin/guard-user run --user %i\n"), "{t}");
        assert!(t.contains("Restart=always\n") && t.contains("NoNewPrivileges=yes\n"));
        assert!(!t.contains("CAP_SYS_ADMIN C"), "SYS_ADMIN must not be granted");
    }

    #[test]
    fn relink_replaces_a_hand_copy_and_is_then_a_no_op() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src.json");
        fs::write(&src, "{}").unwrap();
        let link = dir.path().join("guard-config.json");
        fs::write(&link, "{}").unwrap();
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        assert!(relink(&link, &src, uid, gid).unwrap());
        assert!(links_to(&link, &src));
        assert!(!relink(&link, &src, uid, gid).unwrap());
    }
}
