//! What a test needs from the machine, how the harness finds out, and the reason it gives when
//! something is missing (with the way to get it).
//!
//! A run may *require* needs (`GUARD_TESTS_REQUIRE=root,ebpf,…` or `all`): a test whose required
//! need is missing then fails with the reason instead of being ignored. `cargo xtask test`
//! requires what it provides itself (root when run as root, the BPF object it builds, the
//! redis-server it installs), `.ci/run` requires `all`, and each VM guest what its kernel has.
use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

/// The environment variable a run names its required needs in.
pub const REQUIRE_ENV: &str = "GUARD_TESTS_REQUIRE";

/// One thing a test needs. In `#[guard_test(needs = [...])]` each is written in snake case
/// (`memory_cgroup`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Need {
    /// Effective uid 0: loading BPF, signalling other accounts, running probes as them.
    Root,
    /// The kernel's BTF (`/sys/kernel/btf/vmlinux`), which the ebpf backend reads offsets from.
    Btf,
    /// The ebpf backend can load here: BTF, and the BPF object embedded in this build (a plain
    /// `cargo test` embeds none; `cargo xtask test` builds it).
    Ebpf,
    /// `redis-server` on `PATH` (the mirror's tests start their own on loopback).
    Redis,
    /// A memory cgroup the test can create and limit: cgroup v2's memory controller at
    /// `/sys/fs/cgroup`, or v1's hierarchy at `/sys/fs/cgroup/memory`.
    MemoryCgroup,
    /// A Python with the reference Prometheus parser (`python3-prometheus-client`).
    PrometheusClient,
    /// A throwaway guest kernel (`cargo xtask vm` sets `GUARD_IN_VM=1`): the test lowers
    /// `kernel.pid_max` and exhausts the pid space, which a developer's host must not suffer.
    Guest,
    /// `kernel.pid_max` of at least [`PID_SPACE`]: a test that starts hundreds of processes in a
    /// row and needs their pids distinct.
    PidSpace,
    /// A kernel *without* BTF (the `no-btf` guest of `cargo xtask vm`), for the procfs fallback.
    NoBtf,
    /// `groff` (groff-base, which man-db pulls in): the man pages are formatted with warnings on.
    Groff,
    /// `promtool` (Debian's prometheus package): the alert rules are checked and tested.
    Promtool,
    /// `zsh` and `fish`: the completions are tried in every shell the package ships them for.
    Shells,
    /// systemd's binary (`/lib/systemd/systemd`), whose own unit loader reads back what install
    /// wrote (`systemd --test`); no running systemd is needed.
    Systemd,
    /// The cgroup v2 freezer heavy-command slots hold commands with: a cgroup2 hierarchy mounted
    /// (`/sys/fs/cgroup` on a unified host, `/sys/fs/cgroup/unified` on a hybrid one) and
    /// Linux 5.2 or later.
    Freezer,
    /// The kernel runs 32-bit programs' syscalls: x86_64's ia32 emulation (`int 0x80`), arm64's
    /// AArch32 at EL0 (the CPU and `CONFIG_COMPAT`). The credential fallback must see their
    /// `setresuid32`.
    Compat32,
}

/// The smallest `kernel.pid_max` [`Need::PidSpace`] accepts.
pub const PID_SPACE: u64 = 8192;

impl Need {
    /// Every need, in the order reasons are listed.
    pub const ALL: &'static [Need] = &[
        Need::Root,
        Need::Btf,
        Need::Ebpf,
        Need::Redis,
        Need::MemoryCgroup,
        Need::PrometheusClient,
        Need::Guest,
        Need::PidSpace,
        Need::NoBtf,
        Need::Groff,
        Need::Promtool,
        Need::Shells,
        Need::Systemd,
        Need::Freezer,
        Need::Compat32,
    ];

    /// Whether a host can have it: `GUARD_TESTS_REQUIRE=all` requires every need a host can have
    /// (not [`Need::Guest`] nor [`Need::NoBtf`], which only a guest of `cargo xtask vm` is).
    pub fn on_a_host(self) -> bool {
        !matches!(self, Need::Guest | Need::NoBtf)
    }

    /// Its name in `needs = [...]` and in `GUARD_TESTS_REQUIRE`.
    pub fn name(self) -> &'static str {
        match self {
            Need::Root => "root",
            Need::Btf => "btf",
            Need::Ebpf => "ebpf",
            Need::Redis => "redis",
            Need::MemoryCgroup => "memory_cgroup",
            Need::PrometheusClient => "prometheus_client",
            Need::Guest => "guest",
            Need::PidSpace => "pid_space",
            Need::NoBtf => "no_btf",
            Need::Groff => "groff",
            Need::Promtool => "promtool",
            Need::Shells => "shells",
            Need::Systemd => "systemd",
            Need::Freezer => "freezer",
            Need::Compat32 => "compat32",
        }
    }

    /// `None` when this machine has it, else why not and how to get it.
    pub fn missing(self, facts: &Facts) -> Option<String> {
        match self {
            // SAFETY: geteuid cannot fail.
            Need::Root if unsafe { libc::geteuid() } != 0 => {
                Some("needs root — run `cargo xtask test` as root (sudo -E cargo xtask test)".into())
            }
            Need::Btf | Need::Ebpf if !Path::new(VMLINUX).exists() => Some(format!(
                "needs BTF — no {VMLINUX} (a kernel without CONFIG_DEBUG_INFO_BTF, like the no-btf guest, runs the \
                 procfs backend)"
            )),
            Need::Ebpf if !facts.bpf_object => Some(
                "needs the ebpf backend — this build embeds no BPF object (a plain `cargo test`); run \
                 `cargo xtask test`, which builds it"
                    .into(),
            ),
            Need::Redis if which("redis-server").is_none() => Some(
                "needs redis-server on PATH — `cargo xtask test` as root installs it (apt-get install redis-server)"
                    .into(),
            ),
            Need::MemoryCgroup if !memory_cgroup() => Some(
                "needs a memory cgroup — no cgroup v2 memory controller at /sys/fs/cgroup and no v1 hierarchy at \
                 /sys/fs/cgroup/memory"
                    .into(),
            ),
            Need::PrometheusClient if prometheus_python().is_none() => Some(
                "needs python3 with prometheus_client — apt-get install python3-prometheus-client (.ci/run does)"
                    .into(),
            ),
            Need::Guest if std::env::var_os("GUARD_IN_VM").is_none() => Some(
                "runs only in a throwaway guest kernel — it lowers kernel.pid_max and exhausts the pid space; \
                 `cargo xtask vm` runs it (GUARD_IN_VM=1)"
                    .into(),
            ),
            Need::PidSpace if pid_max() < PID_SPACE => {
                Some(format!("needs kernel.pid_max of at least {PID_SPACE} (it is {})", pid_max()))
            }
            Need::NoBtf if Path::new(VMLINUX).exists() => Some(format!(
                "needs a kernel without BTF — this one has {VMLINUX}; the no-btf guest of `cargo xtask vm` runs it"
            )),
            Need::Groff if which("groff").is_none() => {
                Some("needs groff — apt-get install groff-base (man-db brings it; .ci/run installs it)".into())
            }
            Need::Promtool if which("promtool").is_none() => Some(
                "needs promtool — apt-get install prometheus (.ci/run installs it and leaves the service off)".into(),
            ),
            Need::Shells if which("zsh").is_none() || which("fish").is_none() => {
                Some("needs zsh and fish — apt-get install zsh fish (.ci/run installs them)".into())
            }
            Need::Systemd if SYSTEMD.iter().all(|p| !Path::new(p).exists()) => {
                Some("needs systemd's binary (its unit loader) — apt-get install systemd".into())
            }
            Need::Freezer if !freezer() => Some(
                "needs the cgroup v2 freezer — a cgroup2 mount (unified, or /sys/fs/cgroup/unified on a hybrid \
                 host) and Linux 5.2 or later"
                    .into(),
            ),
            Need::Compat32 if !compat32() => Some(format!(
                "needs 32-bit syscalls — this kernel or CPU runs no 32-bit programs on {} (x86_64: \
                 CONFIG_IA32_EMULATION and no ia32_emulation=0; arm64: CONFIG_COMPAT and AArch32 at EL0)",
                std::env::consts::ARCH
            )),
            _ => None,
        }
    }
}

/// Where systemd's binary is, first that exists ([`Need::Systemd`]).
pub const SYSTEMD: &[&str] = &["/lib/systemd/systemd", "/usr/lib/systemd/systemd"];

/// For a test outside guard-test's harness (a unit test of guard-user's library or of xtask):
/// whether `needs` are all here. Such a test is `#[ignore = "needs …"]` (a plain `cargo test`
/// lists it as ignored) and sits in a module named for each need, `mod needs_btf { … }` (see
/// [`declared`]): `cargo xtask test` runs the ignored tests of a need only where [`crate::decide`]
/// says run or fail, so there a missing need is never a pass. Here a missing need panics where
/// the run requires it, else says why and returns `false` (a run that did not filter: a guest's
/// `--include-ignored`, a hand-made `--ignored`). A test that asks for a need its module path
/// does not declare panics, wherever it runs: the filter would not know it.
pub fn here(needs: &[Need], facts: Facts) -> bool {
    // libtest runs each test on a thread named after it.
    if let Some(test) = std::thread::current().name().filter(|n| n.contains("::")) {
        let declared = declared(test);
        for need in needs {
            assert!(
                declared.contains(need),
                "{test} needs `{0}` but is not in a `mod needs_{0}`: `cargo xtask test` ignores a missing need's \
                 tests by that module",
                need.name()
            );
        }
    }
    let required = required().unwrap_or_else(|e| panic!("{e}"));
    for &need in needs {
        if let Some(why) = need.missing(&facts) {
            assert!(!required.contains(&need), "{why} (this run requires `{}`: {REQUIRE_ENV})", need.name());
            eprintln!("ignored: {why}");
            return false;
        }
    }
    true
}

/// The needs a unit test's path declares: one per `needs_<need>` module in it
/// (`btf::tests::needs_btf::offsets` needs `btf`).
pub fn declared(test: &str) -> Vec<Need> {
    test.split("::")
        .filter_map(|m| m.strip_prefix("needs_"))
        .filter_map(|name| Need::ALL.iter().copied().find(|n| n.name() == name))
        .collect()
}

/// The `--skip` pattern of the unit tests that need `need` ([`declared`]).
pub fn skip_pattern(need: Need) -> String {
    format!("::needs_{}::", need.name())
}

/// What the test binary itself knows and the machine does not say (filled in by `main!`).
#[derive(Clone, Copy, Debug)]
pub struct Facts {
    /// Whether this build embeds the BPF object (`guard::ebpf::object_embedded()`).
    pub bpf_object: bool,
}

/// The kernel's BTF, as the daemon reads it.
pub const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

/// The needs a run requires, from `GUARD_TESTS_REQUIRE` (names separated by commas, or `all`:
/// every need a host can have, see [`Need::on_a_host`]).
pub fn required() -> Result<Vec<Need>, String> {
    let Some(value) = std::env::var_os(REQUIRE_ENV) else { return Ok(Vec::new()) };
    parse_required(&value.to_string_lossy())
}

pub fn parse_required(value: &str) -> Result<Vec<Need>, String> {
    let mut needs = Vec::new();
    for word in value.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        if word == "all" {
            needs.extend(Need::ALL.iter().copied().filter(|n| n.on_a_host()));
            continue;
        }
        match Need::ALL.iter().find(|n| n.name() == word) {
            Some(n) => needs.push(*n),
            None => {
                let names: Vec<&str> = Need::ALL.iter().map(|n| n.name()).collect();
                return Err(format!("{REQUIRE_ENV}={value}: unknown need `{word}` (known: all, {})", names.join(", ")));
            }
        }
    }
    Ok(needs)
}

/// `name` on `PATH`.
pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| {
        use std::os::unix::fs::PermissionsExt;
        p.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

/// A Python that imports `prometheus_client`: `python3` on `PATH` first, else Debian's
/// `/usr/bin/python3` (the Debian package installs for it; a venv or pyenv on `PATH` does not
/// see it).
pub fn prometheus_python() -> Option<&'static str> {
    ["python3", "/usr/bin/python3"].into_iter().find(|py| {
        Command::new(py)
            .args(["-c", "import prometheus_client.parser"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

fn memory_cgroup() -> bool {
    let v2 = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers").unwrap_or_default();
    v2.split_whitespace().any(|c| c == "memory") || Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists()
}

/// A cgroup2 hierarchy's root is mounted (in this namespace) and the kernel has `cgroup.freeze`.
fn freezer() -> bool {
    let mounted = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default().lines().any(|l| {
        let (pre, post) = l.split_once(" - ").unwrap_or_default();
        post.starts_with("cgroup2 ") && pre.split(' ').nth(3) == Some("/")
    });
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut v = release.split(|c: char| !c.is_ascii_digit()).filter_map(|x| x.parse::<u32>().ok());
    let (major, minor) = (v.next().unwrap_or(0), v.next().unwrap_or(0));
    mounted && (major, minor) >= (5, 2)
}

/// Whether a 32-bit syscall runs here, tried in a forked child (it may die of it): `int 0x80`
/// (ia32 `getuid32`) on x86_64, where a kernel without ia32 emulation answers SIGSEGV;
/// `personality(PER_LINUX32)` on arm64, which the kernel refuses (EINVAL) where no CPU runs
/// AArch32 at EL0 or it was built without `CONFIG_COMPAT`.
fn compat32() -> bool {
    if !cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
        return false;
    }
    // SAFETY: the child only runs a syscall and _exit (async-signal-safe after fork).
    match unsafe { libc::fork() } {
        -1 => false,
        0 => {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: ia32 getuid32 (199) takes no arguments and touches no memory; the 64-bit
            // registers an `int 0x80` may clobber (r8–r11) are declared.
            unsafe {
                std::arch::asm!("int 0x80", inlateout("eax") 199u32 => _, out("r8") _, out("r9") _,
                    out("r10") _, out("r11") _);
            }
            // linux/personality.h's PER_LINUX32 (not in the libc crate).
            #[cfg(target_arch = "aarch64")]
            const PER_LINUX32: libc::c_ulong = 0x0008;
            #[cfg(target_arch = "aarch64")]
            // SAFETY: personality only sets this (forked, about to exit) task's execution domain.
            if unsafe { libc::personality(PER_LINUX32) } == -1 {
                unsafe { libc::_exit(1) };
            }
            // SAFETY: _exit ends the child without running the parent's atexit handlers.
            unsafe { libc::_exit(0) }
        }
        pid => {
            let mut status = 0;
            // SAFETY: reaps the child forked above.
            let reaped = unsafe { libc::waitpid(pid, &mut status, 0) } == pid;
            reaped && libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0
        }
    }
}

fn pid_max() -> u64 {
    std::fs::read_to_string("/proc/sys/kernel/pid_max").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_unit_tests_needs_are_its_needs_modules() {
        assert_eq!(declared("ebpf::tests::needs_root::needs_ebpf::loads"), [Need::Root, Need::Ebpf]);
        assert_eq!(declared("a::needs_memory_cgroup::b"), [Need::MemoryCgroup]);
        assert!(declared("btf::tests::offsets").is_empty());
        assert!("btf::tests::needs_btf::offsets".contains(&skip_pattern(Need::Btf)));
        assert!(!"btf::tests::needs_btf_x::offsets".contains(&skip_pattern(Need::Btf)));
    }

    #[test]
    fn all_is_every_need_but_the_guest_and_names_are_checked() {
        let all = parse_required("all").unwrap();
        assert!(!all.contains(&Need::Guest) && !all.contains(&Need::NoBtf) && all.len() == Need::ALL.len() - 2);
        assert!(all.contains(&Need::Promtool));
        assert_eq!(parse_required("root, ebpf,,guest").unwrap(), [Need::Root, Need::Ebpf, Need::Guest]);
        let e = parse_required("root,rooot").unwrap_err();
        assert!(e.contains("`rooot`") && e.contains("memory_cgroup"), "{e}");
    }
}
