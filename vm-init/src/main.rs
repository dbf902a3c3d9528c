//! PID 1 of guard's test VMs (`cargo xtask vm`), after aya's `init` crate.
//!
//! The kernel unpacks the initramfs xtask wrote and runs this binary as `/init`. It:
//! 1. mounts proc, sysfs, devtmpfs, tracefs, debugfs, bpffs, cgroup2 and tmpfs on /tmp (unless the image has files there: a checkout under /tmp) and /run
//!    (the initramfs holds only files; everything guard reads about processes comes from these);
//! 2. with `guard.hide_btf` on the kernel command line, hides /sys/kernel/btf under an empty
//!    read-only tmpfs: user space then sees a kernel without BTF (the `no-btf` guest);
//! 3. sets the hostname and brings up loopback, so tests that listen on 127.0.0.1 work;
//! 4. runs every executable in `/tests` with `--test-threads=1`, then the arguments listed one
//!    per line in `/etc/guard-vm/test-args`, with `GUARD_TESTS_REQUIRE` from the kernel command
//!    line's `guard.require=`, printing one `init: PASS|FAIL <name>` line each;
//! 5. prints exactly one sentinel line, `init: success` or `init: failure`, which is what xtask
//!    waits for on the serial console;
//! 6. powers off. PID 1 must never exit (the kernel panics), so every path, a panic included,
//!    ends in `reboot(RB_POWER_OFF)`.
//!
//! Every line this program prints starts with `init: `, so xtask can tell them from the kernel's
//! and the tests' output; the first one also marks the end of the kernel's boot.
use std::{
    ffi::CString,
    fs,
    io::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

/// Where xtask puts the test binaries.
const TESTS_DIR: &str = "/tests";
/// Extra arguments for every test binary, one per line (written by `cargo xtask vm -- <args>`).
const TEST_ARGS_FILE: &str = "/etc/guard-vm/test-args";
/// Extra `KEY=VALUE` environment lines for the test binaries.
const TEST_ENV_FILE: &str = "/etc/guard-vm/env";
/// One binary's own arguments (`<dir>/<binary name>`, one per line): the tests of it the guests run.
const TEST_OWN_ARGS_DIR: &str = "/etc/guard-vm/args";

/// The kernel command-line word that makes this guest one without BTF.
const HIDE_BTF: &str = "guard.hide_btf";
/// The kernel command-line word naming what this guest's tests must run (`guard.require=root,…`,
/// written by xtask per kernel): exported to them as `GUARD_TESTS_REQUIRE`, so a test whose need
/// is missing here fails instead of being ignored.
const REQUIRE: &str = "guard.require=";
/// What a kernel with `CONFIG_DEBUG_INFO_BTF` exposes (`vmlinux` and the modules' BTF).
const BTF_DIR: &str = "/sys/kernel/btf";

/// The guest's hostname (also in the image's /etc/hostname).
const HOSTNAME: &str = "guard-vm";

/// One filesystem to mount: `(source, target, fstype, flags, data, required)`.
type MountSpec = (&'static str, &'static str, &'static str, libc::c_ulong, &'static str, bool);

const MOUNTS: &[MountSpec] = &[
    ("proc", "/proc", "proc", libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC, "", true),
    ("sysfs", "/sys", "sysfs", libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC, "", true),
    ("devtmpfs", "/dev", "devtmpfs", libc::MS_NOSUID, "mode=0755", true),
    ("devpts", "/dev/pts", "devpts", libc::MS_NOSUID | libc::MS_NOEXEC, "", false),
    // Not nosuid: tests build setuid binaries in temp dirs.
    ("tmpfs", "/tmp", "tmpfs", libc::MS_NODEV, "mode=1777", true),
    ("tmpfs", "/run", "tmpfs", libc::MS_NOSUID | libc::MS_NODEV, "mode=0755", true),
    ("tracefs", "/sys/kernel/tracing", "tracefs", libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC, "", true),
    ("debugfs", "/sys/kernel/debug", "debugfs", libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC, "", false),
    ("bpf", "/sys/fs/bpf", "bpf", libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC, "mode=0700", true),
    ("cgroup2", "/sys/fs/cgroup", "cgroup2", libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC, "", true),
];

fn main() {
    let success = match std::panic::catch_unwind(run) {
        Ok(success) => success,
        Err(_) => {
            say("vm-init panicked (message above)");
            false
        }
    };
    say(if success { "success" } else { "failure" });
    power_off();
}

/// Prints one `init: ` line and flushes it: the console is all xtask sees.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "init: {line}");
    let _ = out.flush();
}

/// Everything but the sentinel; `true` when every test binary passed.
fn run() -> bool {
    say(&format!("guard vm-init starting (kernel {})", kernel_release()));
    let mut ok = true;
    for &(source, target, fstype, flags, data, required) in MOUNTS {
        // A checkout under /tmp (CI's clone may live there) has its config/ and package
        // directories packed at their host paths: a tmpfs would hide them. The initramfs root
        // is writable (and allows setuid), so /tmp stays part of it then.
        if target == "/tmp" && fs::read_dir(target).is_ok_and(|mut d| d.next().is_some()) {
            use std::os::unix::fs::PermissionsExt;
            if let Err(err) = fs::set_permissions(target, fs::Permissions::from_mode(0o1777)) {
                say(&format!("ERROR chmod 1777 /tmp: {err}"));
                ok = false;
            }
            continue;
        }
        if let Err(err) = mount(source, target, fstype, flags, data) {
            say(&format!("{} mount {fstype} on {target}: {err}", if required { "ERROR" } else { "warning:" }));
            ok &= !required;
        }
    }
    if !ok {
        return false;
    }
    if kernel_cmdline().split_whitespace().any(|w| w == HIDE_BTF) {
        match mount(
            "tmpfs",
            BTF_DIR,
            "tmpfs",
            libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            "mode=0555",
        ) {
            Ok(()) => {
                say(&format!("{HIDE_BTF}: {BTF_DIR} hidden under an empty tmpfs (no BTF, as user space sees it)"))
            }
            Err(err) => {
                say(&format!("ERROR {HIDE_BTF}: mount tmpfs on {BTF_DIR}: {err}"));
                return false;
            }
        }
    }
    // The kernel's hostname is "(none)" until someone sets it; guard puts it in Redis keys.
    // SAFETY: a valid buffer and its length.
    if unsafe { libc::sethostname(HOSTNAME.as_ptr().cast(), HOSTNAME.len()) } != 0 {
        say(&format!("warning: sethostname: {}", std::io::Error::last_os_error()));
    }
    if let Err(err) = loopback_up() {
        say(&format!("warning: bringing up lo: {err}"));
    }
    run_tests()
}

fn kernel_release() -> String {
    // SAFETY: uname fills the zeroed struct; its fields are NUL-terminated.
    unsafe {
        let mut uts: libc::utsname = std::mem::zeroed();
        if libc::uname(&mut uts) != 0 {
            return "unknown".into();
        }
        std::ffi::CStr::from_ptr(uts.release.as_ptr()).to_string_lossy().into_owned()
    }
}

fn kernel_cmdline() -> String {
    fs::read_to_string("/proc/cmdline").unwrap_or_default()
}

fn mount(source: &str, target: &str, fstype: &str, flags: libc::c_ulong, data: &str) -> std::io::Result<()> {
    // sysfs and devtmpfs provide their own subdirectories; creating one there fails harmlessly.
    let _ = fs::create_dir_all(target);
    let c = |s: &str| CString::new(s).expect("no NUL in mount arguments");
    let (source, target, fstype, data) = (c(source), c(target), c(fstype), c(data));
    // SAFETY: all pointers are valid NUL-terminated strings for the duration of the call.
    let rc = unsafe { libc::mount(source.as_ptr(), target.as_ptr(), fstype.as_ptr(), flags, data.as_ptr().cast()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// `ip link set lo up`, by ioctl (the initramfs has no `ip`).
fn loopback_up() -> std::io::Result<()> {
    // SAFETY: plain socket/ioctl calls on a zeroed ifreq naming "lo"; the fd is closed below.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut req: libc::ifreq = std::mem::zeroed();
        for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
            *dst = *src as libc::c_char;
        }
        let mut result = Ok(());
        if libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut req) < 0 {
            result = Err(std::io::Error::last_os_error());
        } else {
            req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
            if libc::ioctl(fd, libc::SIOCSIFFLAGS, &req) < 0 {
                result = Err(std::io::Error::last_os_error());
            }
        }
        libc::close(fd);
        result
    }
}

/// Non-empty lines of an optional file.
fn lines_of(path: &str) -> Vec<String> {
    fs::read_to_string(path)
        .map(|text| text.lines().map(str::trim).filter(|l| !l.is_empty()).map(String::from).collect())
        .unwrap_or_default()
}

fn run_tests() -> bool {
    let mut binaries: Vec<PathBuf> = match fs::read_dir(TESTS_DIR) {
        Ok(dir) => dir.filter_map(|e| e.ok().map(|e| e.path())).collect(),
        Err(err) => {
            say(&format!("ERROR reading {TESTS_DIR}: {err}"));
            return false;
        }
    };
    binaries.sort();
    if binaries.is_empty() {
        say(&format!("ERROR no test binaries in {TESTS_DIR}"));
        return false;
    }
    let extra_args = lines_of(TEST_ARGS_FILE);
    let cmdline = kernel_cmdline();
    let required = cmdline.split_whitespace().find_map(|w| w.strip_prefix(REQUIRE)).unwrap_or_default().to_string();
    say(&format!("the tests must run what needs {}", if required.is_empty() { "(nothing named)" } else { &required }));
    let extra_env: Vec<(String, String)> = lines_of(TEST_ENV_FILE)
        .into_iter()
        .filter_map(|line| line.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
        .collect();

    let mut failed = Vec::new();
    for binary in &binaries {
        let name = binary.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let own_args = own_args(lines_of(&format!("{TEST_OWN_ARGS_DIR}/{name}")), &required);
        if own_args.is_empty() {
            say(&format!("running {name}"));
        } else {
            say(&format!("running {name} {}", own_args.join(" ")));
        }
        let started = Instant::now();
        let mut cmd = Command::new(binary);
        cmd.arg("--test-threads=1")
            .args(&own_args)
            .args(&extra_args)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("HOME", "/root")
            .env("USER", "root")
            .env("RUST_BACKTRACE", "1")
            .env("GUARD_IN_VM", "1")
            .env("GUARD_USER_BIN", "/bin/guard-user")
            .env("GUARD_TESTS_REQUIRE", &required)
            .envs(extra_env.iter().map(|(k, v)| (k, v)))
            .current_dir("/tmp")
            .stdin(Stdio::null());
        if Path::new("/bin/guard-probe").exists() {
            cmd.env("GUARD_PROBE_BIN", "/bin/guard-probe");
        }
        let status = cmd.spawn().and_then(wait_reaping);
        let secs = started.elapsed().as_secs_f64();
        reap_orphans();
        match status {
            Ok(status) if status.success() => say(&format!("PASS {name} ({secs:.1}s)")),
            Ok(status) => {
                say(&format!("FAIL {name} ({status}, {secs:.1}s)"));
                failed.push(name);
            }
            Err(err) => {
                say(&format!("FAIL {name} (could not start: {err})"));
                failed.push(name);
            }
        }
    }
    say(&format!(
        "{} test binaries, {} passed, {} failed{}",
        binaries.len(),
        binaries.len() - failed.len(),
        failed.len(),
        if failed.is_empty() { String::new() } else { format!(": {}", failed.join(" ")) }
    ));
    failed.is_empty()
}

/// Waits for `child` while reaping every orphan that exits meanwhile: as PID 1 we inherit what a
/// test's processes leave when they exit (a process that keeps forking to new pids leaves one per
/// generation), and zombies left to pile up until the binary ends would count against the test
/// accounts' process limit and make their next fork or exec fail.
fn wait_reaping(child: std::process::Child) -> std::io::Result<std::process::ExitStatus> {
    use std::os::unix::process::ExitStatusExt;
    let pid = child.id() as libc::pid_t;
    loop {
        let mut status = 0;
        // SAFETY: waitpid on any child with a status we own.
        let got = unsafe { libc::waitpid(-1, &mut status, 0) };
        if got == pid {
            return Ok(std::process::ExitStatus::from_raw(status));
        }
        if got < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

/// As PID 1 we inherit every process a test left behind; collect the ones that have exited.
fn reap_orphans() {
    // SAFETY: waitpid with WNOHANG on any child; no memory is shared.
    unsafe { while libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) > 0 {} }
}

fn power_off() -> ! {
    // SAFETY: sync and reboot take no pointers; as PID 1 we may power off.
    unsafe {
        libc::sync();
        libc::reboot(libc::RB_POWER_OFF);
    }
    say(&format!("reboot(RB_POWER_OFF) failed: {}", std::io::Error::last_os_error()));
    loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}

/// A binary's own arguments as the test binary takes them: `--skip-unless-required=<need>`
/// (xtask's, for a unit-test binary run with `--include-ignored`) becomes `--skip
/// ::needs_<need>::` where this guest does not require that need (so it lacks it: every guest
/// requires what it has), and nothing where it does.
fn own_args(args: Vec<String>, required: &str) -> Vec<String> {
    let required: Vec<&str> = required.split(',').map(str::trim).collect();
    let mut out = Vec::new();
    for arg in args {
        match arg.strip_prefix("--skip-unless-required=") {
            Some(need) if required.contains(&need) => {}
            Some(need) => out.extend(["--skip".to_string(), format!("::needs_{need}::")]),
            None => out.push(arg),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::own_args;

    #[test]
    fn a_need_the_guest_does_not_require_skips_its_unit_tests() {
        let args = ["--include-ignored", "--skip-unless-required=btf", "--skip-unless-required=root"]
            .map(String::from)
            .to_vec();
        assert_eq!(own_args(args.clone(), "root,no_btf"), ["--include-ignored", "--skip", "::needs_btf::"]);
        assert_eq!(own_args(args, "root, btf"), ["--include-ignored"]);
    }
}
