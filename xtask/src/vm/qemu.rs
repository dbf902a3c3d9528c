//! qemu: installing it (from bookworm-backports only) and booting one kernel with the initramfs.
//!
//! KVM is not available on the machines this runs on, so every boot is TCG (`-accel tcg`, the
//! default CPU model) and every boot runs under a deadline: qemu is killed when the guest has
//! printed nothing from vm-init within the boot timeout, or no sentinel within the suite timeout.
use std::{
    fs,
    io::{BufRead as _, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use anyhow::Context as _;

use crate::{
    arch::{apt_install, Arch},
    build_ebpf::which,
};

/// Makes the architecture's qemu system emulator available (`qemu-system-x86_64` from
/// qemu-system-x86, `qemu-system-aarch64` from qemu-system-arm). The machine carries qemu-utils
/// from bookworm-backports; installing either from bookworm proper would make apt remove it, so
/// they come from backports, and a simulation that would remove anything aborts.
pub fn ensure_installed(arch: Arch) -> anyhow::Result<PathBuf> {
    let (binary, package) = arch.qemu_system();
    if let Some(path) = which(binary) {
        println!("vm: qemu: present ({})", path.display());
        return Ok(path);
    }
    println!("vm: qemu: {binary} missing; installing {package} from bookworm-backports");
    apt_install(&[package.to_string()], Some("bookworm-backports"), binary)?;
    which(binary).with_context(|| format!("{package} is installed but {binary} is not on PATH"))
}

/// What one boot is given.
pub struct Boot<'a> {
    /// Prefix for echoed lines and the log file name.
    pub name: &'a str,
    /// The guest's architecture (the machine model, CPU and console differ).
    pub arch: Arch,
    pub qemu: &'a Path,
    pub vmlinuz: &'a Path,
    pub initrd: &'a Path,
    pub memory: &'a str,
    pub cpus: u32,
    /// Extra kernel command-line words after the fixed ones.
    pub cmdline: &'a str,
    /// Until vm-init's first line.
    pub boot_timeout: Duration,
    /// Until the sentinel, from qemu's start.
    pub timeout: Duration,
    /// Where the whole console is written.
    pub log: &'a Path,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Passed,
    /// `init: failure`.
    Failed,
    /// No sentinel: timed out or qemu exited; says which.
    Broken(String),
}

#[derive(Debug)]
pub struct Outcome {
    pub verdict: Verdict,
    /// `uname -r` in the guest, from vm-init's first line.
    pub release: Option<String>,
    /// From qemu's start to vm-init's first line.
    pub boot_time: Option<Duration>,
    /// From vm-init's first line to the sentinel.
    pub suite_time: Option<Duration>,
}

/// Kills and reaps qemu however `boot` ends.
struct QemuChild(Child);

impl Drop for QemuChild {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

pub fn boot(b: &Boot) -> anyhow::Result<Outcome> {
    // mitigations=off: under TCG the default CPU model looks vulnerable to everything, and page
    // table isolation & co. made every syscall and fork several times slower (7.x booted in 16 s
    // instead of 6, and 400 forks overran a test's 5 s bound). The tests need none of them.
    let append =
        format!("console={} panic=-1 quiet mitigations=off {}", b.arch.console(), b.cmdline).trim().to_string();
    let mut release = None;
    let console = run_console(b, &append, "no output from vm-init", Duration::from_secs(30), |line| {
        let Some(init_line) = line.find("init: ").map(|at| &line[at..]) else { return Mark::Nothing };
        if release.is_none() {
            release = parse_release(init_line);
        }
        match init_line.trim_end() {
            "init: success" => Mark::Ended("success".into()),
            "init: failure" => Mark::Ended("failure".into()),
            _ => Mark::Started,
        }
    })?;
    let verdict = match (&console.ended, &console.broken) {
        (Some((_, end)), _) if end == "success" => Verdict::Passed,
        (Some(_), _) => Verdict::Failed,
        (None, why) => Verdict::Broken(why.clone().unwrap_or_default()),
    };
    Ok(Outcome {
        verdict,
        release,
        boot_time: console.started.map(|at| at - console.spawned),
        suite_time: console.started.zip(console.ended.as_ref()).map(|(from, (to, _))| *to - from),
    })
}

/// What a console line means to the guest's runner.
pub enum Mark {
    Nothing,
    /// The guest's own program speaks (the boot is over; from now on the whole timeout applies).
    Started,
    /// Its sentinel, with what it said: the run is over.
    Ended(String),
}

/// How one guest's console went.
pub struct Console {
    /// When qemu was started.
    pub spawned: Instant,
    /// The first line marked [`Mark::Started`] (or the end, if that came first).
    pub started: Option<Instant>,
    /// The sentinel: when, and what it said.
    pub ended: Option<(Instant, String)>,
    /// Why there was no sentinel (a timeout, qemu's exit), with qemu's stderr.
    pub broken: Option<String>,
}

/// The one guest loop: starts qemu with `append`, echoes every console line as `[name] …` and
/// into the log, and asks `mark` what each means. qemu is killed when nothing was
/// [`Mark::Started`] within the boot timeout (`not_started` says what was missing) or no
/// [`Mark::Ended`] came within the whole timeout; after the sentinel the guest gets `grace` to
/// power off by itself.
pub fn run_console(
    b: &Boot,
    append: &str,
    not_started: &str,
    grace: Duration,
    mut mark: impl FnMut(&str) -> Mark,
) -> anyhow::Result<Console> {
    let mut cmd = Command::new(b.qemu);
    if b.arch == Arch::Arm64 {
        // The virt board boots a Linux Image (gzip or EFI zboot, both unpacked by qemu) directly,
        // no firmware. `max` is every feature TCG emulates (pointer authentication and BTI
        // included, which the BPF JIT emits code for); `pauth-impdef` picks qemu's cheap
        // authentication algorithm instead of QARMA, which made every function return costly.
        cmd.args(["-machine", "virt", "-cpu", "max,pauth-impdef=on"]);
    }
    cmd.args(["-accel", "tcg", "-m", b.memory, "-smp", &b.cpus.to_string()])
        .args(["-nographic", "-no-reboot", "-nic", "none"])
        .arg("-kernel")
        .arg(b.vmlinuz)
        .arg("-initrd")
        .arg(b.initrd)
        .args(["-append", append])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    println!("[{}] {}", b.name, describe(&cmd));
    let spawned = Instant::now();
    let mut child = QemuChild(cmd.spawn().with_context(|| format!("starting {}", b.qemu.display()))?);
    let stdout = child.0.stdout.take().expect("piped stdout");
    let stderr = child.0.stderr.take().expect("piped stderr");
    let (tx, rx) = mpsc::channel::<String>();
    thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut buf = Vec::new();
        while matches!(reader.read_until(b'\n', &mut buf), Ok(n) if n > 0) {
            if tx.send(clean_console_line(&buf)).is_err() {
                break;
            }
            buf.clear();
        }
    });
    let stderr_text = thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut BufReader::new(stderr), &mut text);
        text
    });
    let mut log = fs::File::create(b.log).with_context(|| format!("creating {}", b.log.display()))?;
    let mut echo = |line: &str| {
        let _ = writeln!(log, "{line}");
        println!("[{}] {line}", b.name);
    };
    let mut console = Console { spawned, started: None, ended: None, broken: None };
    loop {
        let limit = if console.started.is_none() { b.boot_timeout.min(b.timeout) } else { b.timeout };
        let Some(wait) = (spawned + limit).checked_duration_since(Instant::now()) else {
            let what = if console.started.is_none() { not_started } else { "no sentinel" };
            console.broken = Some(format!("timeout: {what} after {}s; qemu killed", limit.as_secs()));
            break;
        };
        let line = match rx.recv_timeout(wait) {
            Ok(line) => line,
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = child.0.wait().map(|s| s.to_string()).unwrap_or_else(|e| e.to_string());
                console.broken = Some(format!("qemu exited ({status}) before the sentinel"));
                break;
            }
        };
        echo(&line);
        let now = Instant::now();
        match mark(&line) {
            Mark::Nothing => continue,
            Mark::Started => {
                console.started.get_or_insert(now);
            }
            Mark::Ended(what) => {
                console.started.get_or_insert(now);
                console.ended = Some((now, what));
                // The guest powers off next; give it a moment to do so cleanly.
                let exit_by = Instant::now() + grace;
                while Instant::now() < exit_by && matches!(child.0.try_wait(), Ok(None)) {
                    while let Ok(line) = rx.try_recv() {
                        echo(&line);
                    }
                    thread::sleep(Duration::from_millis(100));
                }
                break;
            }
        }
    }
    drop(child);
    if let Some(why) = &mut console.broken {
        let stderr = stderr_text.join().unwrap_or_default();
        if !stderr.trim().is_empty() {
            why.push_str(&format!("; qemu stderr: {}", stderr.trim()));
        }
    }
    Ok(console)
}

/// `init: guard vm-init starting (kernel 6.1.0-57-cloud-amd64)` → the release.
fn parse_release(init_line: &str) -> Option<String> {
    let rest = &init_line[init_line.find("(kernel ")? + "(kernel ".len()..];
    Some(rest[..rest.find(')')?].to_string())
}

/// A console line as text: without `\r\n`, ANSI escape sequences and other control bytes (the
/// firmware's terminal set-up can be glued to the first line).
pub fn clean_console_line(raw: &[u8]) -> String {
    let text = String::from_utf8_lossy(raw);
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\x1b' => match chars.next() {
                // CSI: parameters and intermediates, then one final byte in @..~.
                Some('[') => {
                    for c in chars.by_ref() {
                        if ('@'..='~').contains(&c) {
                            break;
                        }
                    }
                }
                // Other two-byte escapes (`ESC c`, `ESC 7`, `ESC (B`'s first half).
                Some('(') | Some(')') => {
                    chars.next();
                }
                _ => {}
            },
            '\t' => out.push(' '),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

fn describe(cmd: &Command) -> String {
    let mut text = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        let arg = arg.to_string_lossy();
        if arg.contains(' ') {
            text.push_str(&format!(" \"{arg}\""));
        } else {
            text.push(' ');
            text.push_str(&arg);
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn console_lines_lose_crlf_and_escape_codes() {
        assert_eq!(
            clean_console_line(b"\x1bc\x1b[?7l\x1b[2Jinit: guard vm-init starting\r\n"),
            "init: guard vm-init starting"
        );
        assert_eq!(clean_console_line(b"init: success\r\n"), "init: success");
        assert_eq!(clean_console_line(b"\x1b(Bplain\ttext\r\n"), "plain text");
    }

    #[test]
    fn release_comes_from_the_first_init_line() {
        assert_eq!(
            parse_release("init: guard vm-init starting (kernel 6.12.118+deb13-cloud-amd64)").as_deref(),
            Some("6.12.118+deb13-cloud-amd64")
        );
        assert_eq!(parse_release("init: running x"), None);
    }
}
