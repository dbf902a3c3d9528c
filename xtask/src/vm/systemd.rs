//! `cargo xtask vm --systemd [--kernel 6.12]`: guard-user's install → check → drift → check under
//! a real systemd, in a Debian bookworm guest; then install with a `--home`/`--config` full of
//! characters systemd must have escaped, from a hostile config, checked with
//! `systemd-analyze verify`, `systemctl show` and the running daemon's own argv.
//!
//! 1. a minbase Debian rootfs with systemd is built once with debootstrap and cached in
//!    `target/vm/systemd/rootfs-bookworm` (delete it to rebuild);
//! 2. the host's debug guard-user (the test guests' build; the rootfs is bookworm like the build
//!    machine, so its glibc runs it) and [`GUEST_SCRIPT`] are added, with a oneshot unit `guard-vm-systemd.service` that runs it
//!    after multi-user.target; serial-getty@ttyS0 and getty.target are masked (without udev the
//!    getty waits 90 s for a device that never appears);
//! 3. the whole tree goes into one uncompressed cpio (`target/vm/systemd.cpio`) that the kernel
//!    unpacks into its tmpfs rootfs, and `rdinit=/lib/systemd/systemd` makes systemd PID 1: no
//!    disk, no drivers;
//! 4. the guest prints every command with its output (lines prefixed `sg| `), then
//!    `systemd-guest: success` or `systemd-guest: failure <why>`, and powers off. The transcript,
//!    the boot time (until the script's first line) and the total time end the run.
//!
//! The console is kept in `target/vm/logs/systemd-<kernel>.log`.
use std::{
    collections::BTreeSet,
    fs,
    io::BufWriter,
    os::unix::fs::{FileTypeExt as _, MetadataExt as _},
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};

use super::{
    cpio::{CpioWriter, Owner},
    kernels, payload,
    qemu::{self, Boot, Mark},
};
mod package;

use crate::{
    arch::Arch,
    build_ebpf::is_root,
    build_ebpf::{self, run_checked, which},
};

const SUITE: &str = "bookworm";
const MIRROR: &str = "http://deb.debian.org/debian";
/// minbase has bash, coreutils, util-linux (setpriv) and passwd (useradd); procps is for pgrep.
/// man-db is for the package scenario's `man guard-user` ([`package`]).
const INCLUDE: &str = "systemd,systemd-sysv,dbus,procps,man-db";
/// The kernel booted when `--kernel` is not given.
const DEFAULT_KERNEL: &str = "6.12";
/// Rootfs paths left out of the image (apt's caches and lists, documentation): the guest never
/// runs apt, and every MiB is copied twice into guest RAM.
const SKIPPED: &[&str] = &["var/cache/apt", "var/lib/apt/lists", "usr/share/doc", "usr/share/man", "usr/share/locale"];

const UNIT_NAME: &str = "guard-vm-systemd.service";
const UNIT: &str = "\
[Unit]
Description=guard systemd guest: guard-user install, check, drift, check (cargo xtask vm --systemd)
After=multi-user.target

[Service]
Type=oneshot
ExecStart=/opt/guard/systemd-guest.sh
StandardInput=null
StandardOutput=journal+console
StandardError=journal+console

[Install]
WantedBy=multi-user.target
";

/// The config the account's guard-config.json is linked to: small enough for a guest.
const CONFIG: &str = "{\n  \"threshold\": 3,\n  \"timeout\": \"5s\"\n}\n";
/// Another valid config, for the "not a link to <source>" drift.
const OTHER_CONFIG: &str = "{\n  \"threshold\": 30,\n  \"timeout\": \"1h\"\n}\n";

/// What runs in the guest (as `guard-vm-systemd.service`), after [`PRELUDE`].
const GUEST_SCRIPT: &str = include_str!("systemd/guest.sh");
/// The start of every scenario's script: the console, the account, and the shell helpers
/// (`run`, `has`, `fail`, `wait_for`, …) both scenarios use.
const PRELUDE: &str = include_str!("systemd/prelude.sh");

pub fn run(opts: &super::Options) -> anyhow::Result<()> {
    let total = Instant::now();
    let names = if opts.kernel.is_empty() { vec![DEFAULT_KERNEL.to_string()] } else { opts.kernel.clone() };
    let kernels = kernels::prepare(&kernels::select(&names, Arch::Amd64)?, Arch::Amd64)?;
    let qemu = qemu::ensure_installed(Arch::Amd64)?;
    let vm_dir = build_ebpf::target_dir().join("vm");
    let rootfs = ensure_rootfs(&vm_dir.join("systemd"))?;

    let ebpf_object = if opts.skip_ebpf {
        let default = build_ebpf::workspace_root().join("guard-ebpf/target/bpfel-unknown-none/release/guard");
        default.is_file().then_some(default)
    } else {
        Some(build_ebpf::build(&build_ebpf::Options::default())?)
    };
    // The package scenario runs the packaged binary; the test guests' build is the source scenario's.
    let (guard_user, scenario) = match opts.package {
        true => (None, Some(package::prepare()?)),
        false => (Some(payload::guard_user(ebpf_object.as_deref())?), None),
    };

    let initrd = vm_dir.join("systemd.cpio");
    let size = write_image(&initrd, &rootfs, guard_user.as_deref(), scenario)?;
    println!("vm: {} ({} MiB): {} + guard-user + {UNIT_NAME}", initrd.display(), size >> 20, rootfs.display());

    let logs = vm_dir.join("logs");
    fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
    let mut failed = Vec::new();
    for kernel in &kernels {
        let log = logs.join(format!("systemd-{}.log", kernel.name));
        let started = Instant::now();
        let outcome = boot(&qemu::Boot {
            name: &format!("systemd-{}", kernel.name),
            arch: Arch::Amd64,
            qemu: &qemu,
            vmlinuz: &kernel.vmlinuz,
            initrd: &initrd,
            memory: &opts.memory,
            cpus: opts.cpus,
            cmdline: &opts.cmdline,
            boot_timeout: Duration::from_secs(opts.boot_timeout),
            timeout: Duration::from_secs(opts.timeout),
            log: &log,
        })?;
        let secs = |d: Option<Duration>| d.map(|d| format!("{:.1}s", d.as_secs_f64())).unwrap_or_else(|| "-".into());
        println!();
        println!("vm: systemd guest, kernel {} ({}): transcript", kernel.name, kernel.package);
        for line in &outcome.transcript {
            println!("  {line}");
        }
        println!(
            "vm: systemd guest, kernel {}: {}; boot {} (qemu start → the guest script's first line), script {}, \
             qemu {:.1}s; console log: {}",
            kernel.name,
            outcome.verdict,
            secs(outcome.boot_time),
            secs(outcome.script_time),
            started.elapsed().as_secs_f64(),
            log.display()
        );
        if outcome.verdict != "success" {
            failed.push(kernel.name.clone());
        }
    }
    println!("vm: systemd guest: total {:.1}s (build, image and boots)", total.elapsed().as_secs_f64());
    if !failed.is_empty() {
        bail!("the systemd guest failed on kernel {}", failed.join(", "));
    }
    Ok(())
}

/// The debootstrap tree, built once (into a temp directory renamed into place on success).
fn ensure_rootfs(dir: &Path) -> anyhow::Result<PathBuf> {
    let rootfs = dir.join(format!("rootfs-{SUITE}"));
    if rootfs.join("lib/systemd/systemd").exists() && package::has_man(&rootfs) {
        println!("vm: systemd rootfs: {} (cached; delete it to rebuild)", rootfs.display());
        return Ok(rootfs);
    }
    if rootfs.exists() {
        println!("vm: systemd rootfs: {} lacks man-db; rebuilding it", rootfs.display());
        fs::remove_dir_all(&rootfs).with_context(|| format!("removing {}", rootfs.display()))?;
    }
    if !is_root() {
        bail!("building the systemd guest's rootfs needs root (debootstrap); run `cargo xtask vm --systemd` as root");
    }
    if which("debootstrap").is_none() && !Path::new("/usr/sbin/debootstrap").exists() {
        println!("vm: systemd rootfs: installing debootstrap");
        run_checked(
            Command::new("apt-get")
                .args(["install", "-y", "-q", "debootstrap"])
                .env("DEBIAN_FRONTEND", "noninteractive"),
            "apt-get install debootstrap",
        )?;
    }
    let tmp = dir.join(format!("rootfs-{SUITE}.tmp"));
    if tmp.exists() {
        fs::remove_dir_all(&tmp).with_context(|| format!("removing the leftover {}", tmp.display()))?;
    }
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    println!(
        "vm: systemd rootfs: debootstrap --variant=minbase --include={INCLUDE} {SUITE} {} {MIRROR}",
        tmp.display()
    );
    run_checked(
        Command::new("debootstrap")
            .args(["--variant=minbase", &format!("--include={INCLUDE}"), SUITE])
            .arg(&tmp)
            .arg(MIRROR),
        "debootstrap",
    )?;
    fs::rename(&tmp, &rootfs).with_context(|| format!("renaming {} to {}", tmp.display(), rootfs.display()))?;
    Ok(rootfs)
}

/// Files the image adds to (or puts in place of) the rootfs's.
enum Extra {
    Dir,
    File(u32, Vec<u8>),
    Symlink(&'static str),
}

fn extras(guard_user: Option<&Path>, scenario: Option<package::Scenario>) -> anyhow::Result<Vec<(String, Extra)>> {
    let unit = format!("etc/systemd/system/{UNIT_NAME}");
    let script = scenario.as_ref().map_or(GUEST_SCRIPT, |s| s.script);
    let mut extras = vec![
        ("etc/hostname".into(), Extra::File(0o644, b"guard-systemd\n".to_vec())),
        // No udev in the guest, so no dev-ttyS0.device: the console getty would wait 90 s for it.
        ("etc/systemd/system/serial-getty@ttyS0.service".into(), Extra::Symlink("/dev/null")),
        ("etc/systemd/system/getty.target".into(), Extra::Symlink("/dev/null")),
        // Never prompt on the console (the machine-id is set, but be sure).
        ("etc/systemd/system/systemd-firstboot.service".into(), Extra::Symlink("/dev/null")),
        (unit.clone(), Extra::File(0o644, UNIT.as_bytes().to_vec())),
        (
            format!("etc/systemd/system/multi-user.target.wants/{UNIT_NAME}"),
            Extra::Symlink("/etc/systemd/system/guard-vm-systemd.service"),
        ),
        ("opt/guard".into(), Extra::Dir),
        ("opt/guard/systemd-guest.sh".into(), Extra::File(0o755, format!("{PRELUDE}\n{script}").into_bytes())),
        ("opt/guard/guard-config.json".into(), Extra::File(0o644, CONFIG.as_bytes().to_vec())),
        ("opt/guard/other-config.json".into(), Extra::File(0o644, OTHER_CONFIG.as_bytes().to_vec())),
    ];
    if let Some(path) = guard_user {
        let bin = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        extras.push(("opt/guard/guard-user".into(), Extra::File(0o755, bin)));
    }
    extras.extend(scenario.map(|s| s.extras).unwrap_or_default());
    Ok(extras)
}

/// The rootfs (minus [`SKIPPED`] and the paths [`extras`] replaces), then the extras.
fn write_image(
    path: &Path,
    rootfs: &Path,
    guard_user: Option<&Path>,
    scenario: Option<package::Scenario>,
) -> anyhow::Result<u64> {
    let extras = extras(guard_user, scenario)?;
    let replaced: BTreeSet<&str> = extras.iter().map(|(p, _)| p.as_str()).collect();
    let tmp = path.with_extension("cpio.tmp");
    let file = fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let mut cpio = CpioWriter::new(BufWriter::with_capacity(1 << 20, file));
    walk(&mut cpio, rootfs, "", &replaced)?;
    for (name, extra) in &extras {
        match extra {
            Extra::Dir => cpio.dir(name, Owner::root(0o755)),
            Extra::File(mode, data) => cpio.file(name, Owner::root(*mode), data),
            Extra::Symlink(target) => cpio.symlink(name, target),
        }
        .with_context(|| format!("writing {name} to {}", tmp.display()))?;
    }
    cpio.finish().and_then(|w| w.into_inner().map_err(|e| e.into_error())).context("finishing the cpio")?;
    fs::rename(&tmp, path).with_context(|| format!("renaming {}", tmp.display()))?;
    Ok(fs::metadata(path)?.len())
}

/// Depth-first, a directory before its entries, names sorted (the same tree gives the same image).
fn walk<W: std::io::Write>(
    cpio: &mut CpioWriter<W>,
    root: &Path,
    rel: &str,
    replaced: &BTreeSet<&str>,
) -> anyhow::Result<()> {
    let dir = root.join(rel);
    let mut entries: Vec<_> = fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()?;
    entries.sort();
    for name in entries {
        let name = name.to_str().with_context(|| format!("a non-UTF-8 name in {}", dir.display()))?;
        let path = if rel.is_empty() { name.to_string() } else { format!("{rel}/{name}") };
        if replaced.contains(path.as_str()) || SKIPPED.contains(&path.as_str()) {
            continue;
        }
        let full = root.join(&path);
        let meta = fs::symlink_metadata(&full).with_context(|| format!("reading {}", full.display()))?;
        let owner = Owner { mode: meta.mode() & 0o7777, uid: meta.uid(), gid: meta.gid() };
        let kind = meta.file_type();
        let written = if kind.is_dir() {
            cpio.dir(&path, owner).map_err(anyhow::Error::from).and_then(|()| walk(cpio, root, &path, replaced))
        } else if kind.is_symlink() {
            let target = fs::read_link(&full)?;
            cpio.symlink(&path, &target.to_string_lossy()).map_err(Into::into)
        } else if kind.is_file() {
            let data = fs::read(&full).with_context(|| format!("reading {}", full.display()))?;
            cpio.file(&path, owner, &data).map_err(Into::into)
        } else if kind.is_char_device() {
            let rdev = meta.rdev();
            cpio.char_device(&path, owner, libc::major(rdev), libc::minor(rdev)).map_err(Into::into)
        } else {
            Ok(()) // sockets, fifos, block devices: none that matter in a fresh debootstrap
        };
        written.with_context(|| format!("adding {path}"))?;
    }
    Ok(())
}

struct Outcome {
    /// `success`, `failure <why>`, or what went wrong without a sentinel.
    verdict: String,
    /// The script's lines (`sg| ` removed) and its sentinels.
    transcript: Vec<String>,
    /// qemu start → `systemd-guest: start`.
    boot_time: Option<Duration>,
    /// `systemd-guest: start` → the sentinel.
    script_time: Option<Duration>,
}

const SENTINEL: &str = "systemd-guest: ";
const PREFIX: &str = "sg| ";

fn boot(b: &Boot) -> anyhow::Result<Outcome> {
    // quiet keeps the kernel's messages off the console; systemd still prints its unit status.
    let append =
        format!("console=ttyS0 panic=-1 rdinit=/lib/systemd/systemd quiet systemd.show_status=1 {}", b.cmdline)
            .trim()
            .to_string();
    let mut transcript = Vec::new();
    let console = qemu::run_console(b, &append, "no line from the guest script", Duration::from_secs(60), |line| {
        if let Some(at) = line.find(PREFIX) {
            transcript.push(line[at + PREFIX.len()..].to_string());
            return Mark::Nothing;
        }
        let Some(sentinel) = line.find(SENTINEL).map(|at| &line[at + SENTINEL.len()..]) else { return Mark::Nothing };
        transcript.push(format!("{SENTINEL}{sentinel}"));
        if sentinel.starts_with("start") {
            Mark::Started
        } else if sentinel == "success" || sentinel.starts_with("failure") {
            Mark::Ended(sentinel.to_string())
        } else {
            Mark::Nothing
        }
    })?;
    Ok(Outcome {
        verdict: console.ended.as_ref().map(|(_, v)| v.clone()).or(console.broken).unwrap_or_default(),
        transcript,
        boot_time: console.started.map(|at| at - console.spawned),
        script_time: console.started.zip(console.ended.as_ref()).map(|(from, (to, _))| *to - from),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both scenarios are the prelude then their own lines; each whole script parses, and uses
    /// the prelude's helpers rather than defining its own.
    #[test]
    fn each_scenario_is_the_prelude_then_its_own_lines_and_parses() {
        for (name, script) in [("guest.sh", GUEST_SCRIPT), ("package.rs", package::SCRIPT)] {
            let whole = format!("{PRELUDE}\n{script}");
            let out = Command::new("bash").args(["-n", "-c", &whole]).output().expect("bash");
            assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
            for helper in ["say()", "run()", "fail()", "wait_for()", "has()"] {
                assert!(!script.contains(helper), "{name} defines {helper} again: it is the prelude's");
            }
            assert!(whole.starts_with("#!/bin/bash\n") && whole.matches("#!/bin/bash").count() == 1, "{name}");
        }
    }
}
