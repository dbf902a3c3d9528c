//! The two unit files: the template `guard-user@.service` (the same for every account, in the
//! unit directory or shipped by the package) and the per-account drop-in
//! `guard-user@<account>.service.d/home.conf` that makes the instance run exactly what
//! `install` was told. Both are pure text built from validated values ([`super::escape`]).
use super::escape::{split_exec_line, AccountName, Executable, UnitPath, UnitValueError};

/// The unit template's file name.
pub const UNIT_NAME: &str = "guard-user@.service";
/// The drop-in's file name inside `guard-user@<account>.service.d/`.
pub const DROPIN_NAME: &str = "home.conf";
/// The first line of every unit file `install` writes: how `install` recognises its own
/// files (e.g. a source install's unit shadowing the packaged one).
pub const HEADER: &str = "# Written by guard-user";

/// The operator's settings the unit reads (Debian's `/etc/default/<package>` convention): the
/// file for every instance, then the instance's own, whose variables win. Both optional (`-`).
pub const DEFAULTS_FILE: &str = "/etc/default/guard-user";
/// The variable of [`DEFAULTS_FILE`] whose words are added to every instance's `run`.
pub const ARGS_VAR: &str = "GUARD_ARGS";
/// How the drop-in's `ExecStart=` ends: `$GUARD_ARGS` unbraced, which systemd splits at white
/// space into zero or more arguments (nothing when unset).
const ARGS_WORD: &str = " $GUARD_ARGS";

/// `guard-user@<account>.service`.
pub fn instance_name(user: &AccountName) -> String {
    format!("guard-user@{user}.service")
}

/// The unit template this build installs, running `bin`. The instance's command line comes
/// from its drop-in; the template's own `ExecStart=` only serves an instance started without
/// one. `tests::the_template_pins_its_directives` lists every directive: change both together.
pub fn unit_text(bin: &Executable) -> String {
    // The package ships guard-user(8) and guard-config.json(5); a source install has no man page
    // (and `systemd-analyze verify` fails on a man: link that does not resolve).
    let docs = if bin.as_str() == "/usr/bin/guard-user" {
        "man:guard-user(8) man:guard-config.json(5)".to_string()
    } else {
        format!("file://{bin}")
    };
    format!(
        r#"{HEADER} (install, or the package); `guard-user check` reports any edit as drift.
# One instance per guarded account: guard-user@<account>.service. The per-instance drop-in
# guard-user@<account>.service.d/{DROPIN_NAME} sets the command line (--home, --config) and
# makes the account's home writable.
[Unit]
Description=guard: ends process names that pile up for %i
Documentation={docs}
# tracefs: guard's programs no longer need it (every one attaches through BTF, the credential
# hook's fallback on the raw syscall tracepoints included); ordering after it is harmless.
Wants=sys-kernel-tracing.mount
After=sys-kernel-tracing.mount network.target
# No start-rate limit: a guard that gives up is worse than one that keeps retrying. (A [Unit]
# setting: systemd ignores it in [Service], with a warning on every daemon-reload.)
StartLimitIntervalSec=0

[Service]
# The daemon says READY=1 once its start-up table is built and its first tick is done, and
# WATCHDOG=1 every 30 s while both its tick loop and its event pump make progress: a guard
# that hangs (or is stopped) is killed and restarted within a minute. A hung tick also ends the
# daemon by itself (exit 70) at ten times its deadline.
Type=notify
NotifyAccess=main
WatchdogSec=60s
# Flags for every instance's `run` (GUARD_ARGS="--interval 30s --metrics-file DIR"), then an
# instance's own file, whose GUARD_ARGS wins: root's files, read at each start (systemctl
# restart applies an edit); `guard-user check` shows the flags in force. Optional.
EnvironmentFile=-{DEFAULTS_FILE}
EnvironmentFile=-{DEFAULTS_FILE}@%i
ExecStart={bin} run --user %i $GUARD_ARGS
# Heavy-command slots (guard-config.json `slots`) freeze waiting commands in cgroups of guard's
# own at the top of the cgroup v2 hierarchy. Before the daemon starts and after it stops, however
# it stopped (SIGKILL, a crash, a watchdog abort, uninstall), every command a daemon that is gone
# left waiting is put back where it was and thawed. `+`: with full privileges, because the top
# of the hierarchy is root's 0555 directory, which the daemon's capabilities cannot write; the
# command line is this fixed one, nothing from the account.
ExecStartPre=+{bin} __slots-release
ExecStopPost=+{bin} __slots-release
# SIGHUP: reopen the log (logrotate), re-read the config, tick at once (RELOAD reason=sighup).
ExecReload=/bin/kill -HUP $MAINPID
Restart=always
RestartSec=5s
# The daemon stops within 3 s; a watchdog abort of a stopped or wedged one ends in SIGKILL 10 s
# later (TimeoutAbortSec follows TimeoutStopSec), so a restart never waits the default 90 s.
TimeoutStopSec=10s
# One daemon per (account, home): its lock lives here, root's 0700 directory, out of the
# account's reach and writable under ProtectSystem=strict. Kept across restarts of one
# instance, shared by all of them.
RuntimeDirectory=guard-user
RuntimeDirectoryMode=0700
RuntimeDirectoryPreserve=yes

# Least privilege: root's uid, but only these capabilities.
#   CAP_BPF             load the BPF programs and create their maps
#   CAP_PERFMON         attach the tp_btf and fentry programs and read the kernel's BTF. None
#                       goes through perf_event_open, so Debian's and Ubuntu's default
#                       kernel.perf_event_paranoid=3 refuses the guard nothing.
#   CAP_KILL            signal processes of another uid (the guarded account's)
#   CAP_SETUID/SETGID   setfsuid/setfsgid: files in the home are written as the account (safefs)
#   CAP_DAC_READ_SEARCH traverse a 0700 home and read /proc entries of other uids
# Not CAP_SYS_ADMIN: nothing is mounted (see [Unit]).
# Not CAP_DAC_OVERRIDE/CAP_FOWNER/CAP_CHOWN: writes happen as the account, never as root.
CapabilityBoundingSet=CAP_BPF CAP_PERFMON CAP_KILL CAP_SETUID CAP_SETGID CAP_DAC_READ_SEARCH
AmbientCapabilities=CAP_BPF CAP_PERFMON CAP_KILL CAP_SETUID CAP_SETGID CAP_DAC_READ_SEARCH
NoNewPrivileges=yes
# BPF maps are charged to memlock on kernels before 5.11; systemd raises it before exec.
LimitMEMLOCK=infinity

# The file system is read-only except the account's home (the drop-in's ReadWritePaths=) and
# Debian's textfile-collector directory of prometheus-node-exporter, for --metrics-file (the
# `-` ignores it where that package is not installed).
# Trade-off: the whole home is writable (as the account's fsuid), because the log, state and
# status files live in it by default. Nothing from the account's config reaches a unit file:
# a stateFile outside the home stays read-only here and the daemon reports it as
# `ERROR state_unwritable` while its in-memory clocks keep enforcing.
ProtectSystem=strict
ReadWritePaths=-/var/lib/prometheus/node-exporter
ProtectHome=read-only
PrivateTmp=yes
PrivateDevices=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
# Not ProtectControlGroups=: slots move the account's waiting commands into guard's frozen cgroup
# and back to the cgroup each came from, wherever that is. /sys/fs/cgroup stays writable (to
# root's uid, for the cgroups root owns; never a cgroup delegated to the account: no
# CAP_DAC_OVERRIDE), which a service with CAP_KILL over every process gains little from.
ProtectClock=yes
ProtectHostname=yes
RestrictNamespaces=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
# Nothing is mapped writable and executable (no JIT: glibc's regex and the BPF loader need none).
MemoryDenyWriteExecute=yes
SystemCallArchitectures=native
# What a system service uses, plus bpf (loading and attaching the programs: every one attaches
# through BTF, none through perf_event_open). Anything else fails with EPERM rather than killing
# the guard (the default action): a new glibc or kernel path degrades, never disarms.
SystemCallFilter=@system-service bpf
SystemCallErrorNumber=EPERM
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

/// What one instance runs: every value root gave `install` (or passwd did), none from the
/// account's files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DropIn {
    pub bin: Executable,
    pub user: AccountName,
    pub home: UnitPath,
    /// `--config` when install was given it; otherwise the daemon uses `<home>/guard-config.json`.
    pub config: Option<UnitPath>,
}

/// Why an installed drop-in is not one `install` wrote.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DropInError {
    #[error("it is not in the format guard-user install writes")]
    Foreign,
    #[error("it was edited after guard-user install wrote it")]
    Edited,
    #[error("an older guard-user wrote it (its ExecStart= has no $GUARD_ARGS); run guard-user install again")]
    Older,
    #[error("it names a value install would refuse today: {0}")]
    Invalid(#[from] UnitValueError),
}

impl DropIn {
    /// The argv the instance runs, as the daemon will see it.
    pub fn argv(&self) -> Vec<String> {
        let mut v = vec![
            self.bin.as_str().to_string(),
            "run".into(),
            "--user".into(),
            self.user.as_str().to_string(),
            "--home".into(),
            self.home.as_str().to_string(),
        ];
        if let Some(c) = &self.config {
            v.extend(["--config".to_string(), c.as_str().to_string()]);
        }
        v
    }

    /// The drop-in's bytes. `ExecStart=` is reset first (a service other than `Type=oneshot` takes
    /// one); it ends with `$GUARD_ARGS`, the operator's flags from [`DEFAULTS_FILE`].
    pub fn text(&self) -> String {
        self.render(true)
    }

    /// The text, with or without `$GUARD_ARGS` (a drop-in written before it existed has none).
    fn render(&self, with_args: bool) -> String {
        let mut exec = format!("{} run --user {} --home {}", self.bin, self.user, self.home.exec_arg());
        if let Some(c) = &self.config {
            exec.push_str(&format!(" --config {}", c.exec_arg()));
        }
        if with_args {
            exec.push_str(ARGS_WORD);
        }
        format!(
            "{HEADER} install for {user}, from the values root gave it\n\
             # (--user, --home, --config; never the account's own files). `guard-user check` reports any\n\
             # edit as drift; run `guard-user install` again to change it.\n\
             [Service]\n\
             ExecStart=\n\
             ExecStart={exec}\n\
             ReadWritePaths={rw}\n",
            user = self.user,
            rw = self.home.path_list_item(),
        )
    }

    /// Reads back a drop-in [`DropIn::text`] wrote: the values install was told, validated
    /// again. Anything else (a hand edit, a planted file) is an error, so `check` never trusts
    /// more than it would write.
    pub fn parse(text: &str) -> Result<DropIn, DropInError> {
        let exec = text
            .lines()
            .filter_map(|l| l.strip_prefix("ExecStart="))
            .find(|v| !v.is_empty())
            .ok_or(DropInError::Foreign)?;
        // Every value install writes is quoted with `$` doubled, so a bare ` $GUARD_ARGS` at the
        // end is ours.
        let (exec, with_args) = match exec.strip_suffix(ARGS_WORD) {
            Some(head) => (head, true),
            None => (exec, false),
        };
        let words = split_exec_line(exec).ok_or(DropInError::Foreign)?;
        let w: Vec<&str> = words.iter().map(String::as_str).collect();
        let (bin, user, home, config) = match w.as_slice() {
            [bin, "run", "--user", user, "--home", home] => (bin, user, home, None),
            [bin, "run", "--user", user, "--home", home, "--config", config] => (bin, user, home, Some(config)),
            _ => return Err(DropInError::Foreign),
        };
        let fix = "run guard-user install again";
        let dropin = DropIn {
            bin: Executable::new(std::path::Path::new(bin))?,
            user: AccountName::new(user)?,
            home: UnitPath::new("the home", std::path::Path::new(home), fix)?,
            config: config.map(|c| UnitPath::new("the config", std::path::Path::new(c), fix)).transpose()?,
        };
        if dropin.render(with_args) != text {
            return Err(DropInError::Edited);
        }
        if !with_args {
            return Err(DropInError::Older);
        }
        Ok(dropin)
    }
}
