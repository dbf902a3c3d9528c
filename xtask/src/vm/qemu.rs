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

use anyhow::{bail, Context as _};

use crate::{
    build_ebpf::{run_checked, which},
    run::is_root,
};

const QEMU: &str = "qemu-system-x86_64";
const BACKPORTS_SOURCE: &str = "/etc/apt/sources.list.d/bookworm-backports.sources";

/// Makes `qemu-system-x86_64` available. The machine carries qemu-utils from
/// bookworm-backports; installing qemu-system-x86 from bookworm proper would make apt remove
/// it, so the package comes from backports, and a simulation that would remove anything aborts.
pub fn ensure_installed() -> anyhow::Result<PathBuf> {
    if let Some(path) = which(QEMU) {
        println!("vm: qemu: present ({})", path.display());
        return Ok(path);
    }
    if !is_root() {
        bail!(
            "{QEMU} is not installed and installing it needs root: run `sudo apt-get install -t bookworm-backports \
             qemu-system-x86` (the backports source must be configured), or run `cargo xtask vm` as root"
        );
    }
    println!("vm: qemu: {QEMU} missing; installing qemu-system-x86 from bookworm-backports");
    if !backports_configured() {
        println!("vm: qemu: adding the bookworm-backports apt source ({BACKPORTS_SOURCE})");
        fs::write(
            BACKPORTS_SOURCE,
            "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm-backports\nComponents: main\n\
             Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n",
        )
        .with_context(|| format!("writing {BACKPORTS_SOURCE}"))?;
    }
    run_checked(Command::new("apt-get").args(["-q", "update"]), "apt-get update")?;
    let install = ["install", "-y", "--no-install-recommends", "-t", "bookworm-backports", "qemu-system-x86"];
    let simulated = Command::new("apt-get").arg("-s").args(install).output().context("apt-get -s install")?;
    let plan = String::from_utf8_lossy(&simulated.stdout);
    if !simulated.status.success() {
        bail!("apt-get -s {} failed:\n{}{}", install.join(" "), plan, String::from_utf8_lossy(&simulated.stderr));
    }
    let removals: Vec<&str> = plan.lines().filter(|l| l.starts_with("Remv ")).collect();
    if !removals.is_empty() {
        bail!("installing qemu-system-x86 would remove packages, refusing:\n{}", removals.join("\n"));
    }
    println!("vm: qemu: apt-get {}", install.join(" "));
    run_checked(
        Command::new("apt-get").args(install).env("DEBIAN_FRONTEND", "noninteractive"),
        "apt-get install qemu-system-x86",
    )?;
    which(QEMU).with_context(|| format!("qemu-system-x86 is installed but {QEMU} is not on PATH"))
}

fn backports_configured() -> bool {
    let mut files = vec![PathBuf::from("/etc/apt/sources.list")];
    if let Ok(dir) = fs::read_dir("/etc/apt/sources.list.d") {
        files.extend(
            dir.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|e| e == "list" || e == "sources")),
        );
    }
    files.iter().filter_map(|f| fs::read_to_string(f).ok()).any(|text| {
        text.lines().map(str::trim).filter(|l| !l.starts_with('#')).any(|l| l.contains("bookworm-backports"))
    })
}

/// What one boot is given.
pub struct Boot<'a> {
    /// Prefix for echoed lines and the log file name.
    pub name: &'a str,
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
    let append = format!("console=ttyS0 panic=-1 quiet mitigations=off {}", b.cmdline).trim().to_string();
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
