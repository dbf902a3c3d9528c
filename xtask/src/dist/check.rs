//! `cargo xtask dist --check`: reads the built package back the way dpkg and an operator would
//! and fails on anything that would surprise them.
//! 1. `dpkg-deb -I`: the control fields Debian requires, Depends filled in;
//! 2. `dpkg-deb -c`: every file an operator or `guard-user install` relies on is there, root's,
//!    with its mode, and nothing lies outside /usr and /lib;
//! 3. the extracted binary runs, says its version, and the unit it would write for /usr/bin is
//!    byte for byte the packaged one (what its `check` compares with);
//! 4. every man page formats without a groff warning (`man --warnings -l`); the completions
//!    complete real command lines ([`super::completion_check`]: bash's function called as readline
//!    calls it, `fish -c 'complete -C …'`, zsh loading it under compinit);
//! 5. the monitoring examples: `promtool check rules` and `promtool test rules` on the alert
//!    rules and their recorded series, the dashboard's JSON ([`super::monitoring`]);
//! 6. lintian, failing on any error or warning (info, pedantic and overridden tags are shown).
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _};

use super::{ensure_tool, output, output_bytes, CONFIG, GENERATED, MAN5_DIR, MAN_DIR, PACKAGE};

/// Control fields that must be present and non-empty.
const FIELDS: &[&str] = &[
    "Package",
    "Version",
    "Architecture",
    "Maintainer",
    "Installed-Size",
    "Depends",
    "Section",
    "Priority",
    "Description",
];

pub fn run(deb: &Path, arch: crate::arch::Arch) -> anyhow::Result<()> {
    println!("dist --check: dpkg-deb -I {}", deb.display());
    println!("{}", output(Command::new("dpkg-deb").arg("-I").arg(deb), "dpkg-deb -I")?);
    for field in FIELDS {
        let value = output(Command::new("dpkg-deb").args(["-f"]).arg(deb).arg(field), "dpkg-deb -f")?;
        anyhow::ensure!(!value.is_empty(), "the control file has no {field}");
    }
    let depends = output(Command::new("dpkg-deb").arg("-f").arg(deb).arg("Depends"), "dpkg-deb -f")?;
    anyhow::ensure!(depends.contains("libc6 (>="), "Depends names no minimum libc6: {depends}");
    // A cross build's Depends must name the architecture's own packages, never the build
    // machine's cross ones (`libgcc-s1-arm64-cross`) or an arch-qualified name.
    anyhow::ensure!(
        !depends.contains("-cross") && !depends.contains(':'),
        "Depends names build-machine packages: {depends}"
    );
    let architecture = output(Command::new("dpkg-deb").arg("-f").arg(deb).arg("Architecture"), "dpkg-deb -f")?;
    anyhow::ensure!(architecture == arch.debian(), "Architecture: {architecture}, expected {}", arch.debian());

    let listing = output(Command::new("dpkg-deb").arg("-c").arg(deb), "dpkg-deb -c")?;
    println!("dist --check: dpkg-deb -c {}\n{listing}", deb.display());
    check_listing(&listing)?;
    let conffiles = output(Command::new("dpkg-deb").arg("-I").arg(deb).arg("conffiles"), "dpkg-deb -I conffiles")?;
    anyhow::ensure!(conffiles == format!("/{}", super::DEFAULTS), "the conffiles are {conffiles:?}");

    let dir = deb.with_extension("check");
    if dir.exists() {
        fs::remove_dir_all(&dir)?;
    }
    crate::build_ebpf::run_checked(Command::new("dpkg-deb").arg("-x").arg(deb).arg(&dir), "dpkg-deb -x")?;
    check_binary(&dir, arch)?;
    check_man_pages(&dir)?;
    check_completions(&dir)?;
    super::monitoring::check(&dir.join(super::EXAMPLES_DIR))?;
    lintian(deb)?;
    println!("dist --check: {} passed ({} KiB)", deb.display(), fs::metadata(deb)?.len() / 1024);
    Ok(())
}

/// One `dpkg-deb -c` line: `-rwxr-xr-x root/root 12345 2026-12-04 05:31 ./usr/bin/guard-user`.
fn check_listing(listing: &str) -> anyhow::Result<()> {
    let mut want: Vec<(String, &str)> = vec![
        ("./usr/bin/guard-user".into(), "-rwxr-xr-x"),
        (format!("./{CONFIG}"), "-rw-r--r--"),
        (format!("./{}", super::DEFAULTS), "-rw-r--r--"),
        (format!("./{MAN_DIR}/guard-user.8.gz"), "-rw-r--r--"),
        (format!("./{MAN5_DIR}/guard-config.json.5.gz"), "-rw-r--r--"),
        ("./usr/share/doc/guard-user/copyright".into(), "-rw-r--r--"),
        ("./usr/share/doc/guard-user/changelog.Debian.gz".into(), "-rw-r--r--"),
    ];
    want.extend(GENERATED.iter().map(|(_, dest)| (format!("./{dest}"), "-rw-r--r--")));
    want.extend(super::monitoring::FILES.iter().map(|f| (format!("./{}/{f}", super::EXAMPLES_DIR), "-rw-r--r--")));
    for line in listing.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        anyhow::ensure!(fields.len() >= 6, "unexpected dpkg-deb -c line: {line}");
        let (mode, owner, path) = (fields[0], fields[1], fields[5]);
        anyhow::ensure!(owner == "root/root", "{path} belongs to {owner}, not root/root");
        anyhow::ensure!(
            path == "./"
                || path.starts_with("./usr/")
                || path.starts_with("./lib/")
                || path == "./etc/"
                || path == "./etc/default/"
                || path == format!("./{}", super::DEFAULTS),
            "{path} is outside /usr and /lib (and is not the conffile /{})",
            super::DEFAULTS
        );
        anyhow::ensure!(!mode.contains('s') && !mode.contains('S'), "{path} is setuid/setgid: {mode}");
        let expected = if mode.starts_with('d') { "drwxr-xr-x" } else { mode };
        anyhow::ensure!(mode == expected, "{path} is {mode}, directories are drwxr-xr-x");
        if let Some(at) = want.iter().position(|(p, _)| p == path) {
            let (_, m) = want.remove(at);
            anyhow::ensure!(mode == m, "{path} is {mode}, expected {m}");
        }
    }
    if !want.is_empty() {
        bail!("the package lacks {}", want.iter().map(|(p, _)| p.as_str()).collect::<Vec<_>>().join(", "));
    }
    Ok(())
}

fn check_binary(dir: &Path, arch: crate::arch::Arch) -> anyhow::Result<()> {
    let bin = dir.join("usr/bin/guard-user");
    // Run on the build machine, under qemu-user for another architecture.
    let version = output(arch.run_command(&bin)?.arg("--version"), "guard-user --version")?;
    anyhow::ensure!(version == format!("guard-user {}", env!("CARGO_PKG_VERSION")), "--version says {version:?}");
    let help = output(arch.run_command(&bin)?.arg("--help"), "guard-user --help")?;
    anyhow::ensure!(!help.contains("SPEC"), "--help mentions SPEC, which the package does not ship:\n{help}");
    let fresh = output_bytes(arch.run_command(&bin)?.args(["__unit", "--bin-dir", "/usr/bin"]), "guard-user __unit")?;
    let packaged = fs::read(dir.join("lib/systemd/system/guard-user@.service"))?;
    anyhow::ensure!(
        packaged == fresh,
        "the packaged unit differs from the one the packaged binary renders for /usr/bin"
    );
    let unit = String::from_utf8_lossy(&packaged);
    anyhow::ensure!(
        unit.lines().any(|l| l.starts_with("Documentation=man:guard-user(8)")),
        "the packaged unit's Documentation= does not name guard-user(8)"
    );
    println!("dist --check: {version}; the packaged unit is the one it renders for /usr/bin");
    Ok(())
}

fn check_man_pages(dir: &Path) -> anyhow::Result<()> {
    ensure_tool("man", "man-db")?;
    let mut pages: Vec<PathBuf> = Vec::new();
    for sub in [MAN_DIR, MAN5_DIR] {
        pages.extend(fs::read_dir(dir.join(sub))?.map(|e| e.map(|e| e.path())).collect::<Result<Vec<_>, _>>()?);
    }
    pages.sort();
    for page in &pages {
        let out = Command::new("man")
            .args(["--warnings", "-E", "UTF-8", "-l"])
            .arg(page)
            .env("MANWIDTH", "80")
            .output()
            .context("running man")?;
        let warnings = String::from_utf8_lossy(&out.stderr);
        anyhow::ensure!(
            out.status.success() && warnings.trim().is_empty(),
            "man -l {} ({}): {warnings}",
            page.display(),
            out.status
        );
        if page.ends_with("guard-user.8.gz") {
            let text = String::from_utf8_lossy(&out.stdout);
            println!("dist --check: man guard-user, the first 20 lines:");
            for line in text.lines().take(20) {
                println!("  {line}");
            }
        }
    }
    println!("dist --check: {} man pages format without warnings", pages.len());
    Ok(())
}

fn check_completions(dir: &Path) -> anyhow::Result<()> {
    let path = |shell: &str| {
        let dest = GENERATED.iter().find(|(name, _)| name.contains(shell)).map(|(_, d)| *d).expect("a completion");
        dir.join(dest)
    };
    let lines = super::completion_check::check(&path("bash"), &path("_guard-user"), &path("fish"))?;
    for line in lines {
        println!("dist --check: {line}");
    }
    Ok(())
}

fn lintian(deb: &Path) -> anyhow::Result<()> {
    ensure_tool("lintian", "lintian")?;
    let version = output(Command::new("lintian").arg("--version"), "lintian --version")?;
    // --show-overrides makes lintian count overridden tags in its exit status, so the verdict is
    // read from the tags themselves: any E: or W: line fails.
    let out = Command::new("lintian")
        .args(["--fail-on", "none", "--display-info", "--pedantic", "--show-overrides"])
        .arg(deb)
        .output()
        .context("running lintian")?;
    let text = String::from_utf8_lossy(&out.stdout);
    for line in text.lines().chain(String::from_utf8_lossy(&out.stderr).lines()) {
        println!("  lintian: {line}");
    }
    let fatal = text.lines().filter(|l| l.starts_with("E: ") || l.starts_with("W: ")).count();
    if !out.status.success() || fatal > 0 {
        bail!("{version} reports {fatal} errors or warnings for {PACKAGE} (above; exit {})", out.status);
    }
    let count = |prefix: &str| text.lines().filter(|l| l.starts_with(prefix)).count();
    println!(
        "dist --check: {version}: no errors or warnings ({} info, {} pedantic, {} overridden with reasons)",
        count("I: "),
        count("P: "),
        count("O: ")
    );
    Ok(())
}
