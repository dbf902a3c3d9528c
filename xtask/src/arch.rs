//! The machine architectures guard is built, packaged and tested for, and what a build for
//! another one than the build machine's needs.
//!
//! The build machine is x86_64 (Debian's amd64). arm64 is cross-built with Debian's cross
//! toolchain (`gcc-aarch64-linux-gnu` as the linker, `libc6-dev-arm64-cross` for the C
//! library it links against) and rustup's `aarch64-unknown-linux-gnu` standard library. The BPF
//! object is one little-endian object for both: its programs read the kernel's structures at
//! offsets taken from the running kernel's BTF, so nothing in it depends on the architecture
//! (guard-ebpf's crate doc; the syscall numbers of the credential fallback come from user space,
//! `guard::ebpf::syscalls`).
//!
//! An arm64 binary runs on the build machine under `qemu-aarch64-static` (user-mode emulation,
//! from bookworm-backports like the system emulators): `dist` prints the packaged unit with the
//! very binary it packages.
use std::{path::PathBuf, process::Command};

use anyhow::{bail, Context as _};

use crate::{
    build_ebpf::is_root,
    build_ebpf::{run_checked, which},
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Arch {
    /// x86_64 (Debian's amd64), the build machine's.
    #[value(alias = "x86_64", alias = "x86-64")]
    Amd64,
    /// AArch64 (Debian's arm64), cross-built.
    #[value(alias = "aarch64")]
    Arm64,
}

impl Default for Arch {
    fn default() -> Self {
        Arch::host()
    }
}

impl Arch {
    /// The machine xtask runs on.
    pub fn host() -> Arch {
        if cfg!(target_arch = "aarch64") {
            Arch::Arm64
        } else {
            Arch::Amd64
        }
    }

    /// The architecture of a Rust target triple `--target` names.
    pub fn from_target(triple: &str) -> anyhow::Result<Arch> {
        [Arch::Amd64, Arch::Arm64].into_iter().find(|a| a.rust_target() == triple).with_context(|| {
            format!(
                "unsupported target {triple:?}: guard builds for {} and {}",
                Arch::Amd64.rust_target(),
                Arch::Arm64.rust_target()
            )
        })
    }

    pub fn is_host(self) -> bool {
        self == Arch::host()
    }

    /// Debian's name (`dpkg --print-architecture`, package file names, `linux-image-cloud-*`).
    pub fn debian(self) -> &'static str {
        match self {
            Arch::Amd64 => "amd64",
            Arch::Arm64 => "arm64",
        }
    }

    pub fn rust_target(self) -> &'static str {
        match self {
            Arch::Amd64 => "x86_64-unknown-linux-gnu",
            Arch::Arm64 => "aarch64-unknown-linux-gnu",
        }
    }

    /// The GNU triplet: Debian's multiarch directory (`/lib/aarch64-linux-gnu`) and the prefix
    /// of the cross tools (`aarch64-linux-gnu-gcc`).
    pub fn gnu(self) -> &'static str {
        match self {
            Arch::Amd64 => "x86_64-linux-gnu",
            Arch::Arm64 => "aarch64-linux-gnu",
        }
    }

    /// A binutils tool that reads and writes this architecture's ELF files (`objcopy`, `strip`,
    /// `readelf`): the host's own, or the cross one (`aarch64-linux-gnu-objcopy`, installed with
    /// the cross compiler).
    pub fn binutil(self, tool: &str) -> String {
        if self.is_host() {
            tool.to_string()
        } else {
            format!("{}-{tool}", self.gnu())
        }
    }

    /// The cargo target directory's subdirectory for this architecture's builds: none for the
    /// host (a plain `cargo build`), `<triple>/` for a cross build.
    pub fn target_subdir(self) -> PathBuf {
        if self.is_host() {
            PathBuf::new()
        } else {
            PathBuf::from(self.rust_target())
        }
    }

    /// Adds what a cargo build for this architecture needs to `cargo`: nothing for the host;
    /// `--target` and the cross linker otherwise.
    pub fn cargo_args(self, cargo: &mut Command) {
        if self.is_host() {
            return;
        }
        let var = format!("CARGO_TARGET_{}_LINKER", self.rust_target().to_uppercase().replace('-', "_"));
        cargo.args(["--target", self.rust_target()]).env(var, format!("{}-gcc", self.gnu()));
    }

    /// Makes a build for this architecture possible: the rustup target and Debian's cross
    /// toolchain, each added only when missing, with one line saying what was found or done.
    pub fn ensure_toolchain(self) -> anyhow::Result<()> {
        if self.is_host() {
            return Ok(());
        }
        let target = self.rust_target();
        let installed = Command::new("rustup").args(["target", "list", "--installed"]).output();
        let present = installed.as_ref().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).lines().any(|l| l == target));
        if present {
            println!("{target}: rust-std present");
        } else {
            println!("{target}: installing its standard library (rustup target add {target})");
            run_checked(Command::new("rustup").args(["target", "add", target]), "rustup target add")?;
        }
        let gcc = format!("{}-gcc", self.gnu());
        let libc = format!("/usr/{}/lib/libc.so.6", self.gnu());
        if which(&gcc).is_some() && std::path::Path::new(&libc).exists() {
            println!("{target}: {gcc} and {libc} present");
            return Ok(());
        }
        let packages = [format!("gcc-{}", self.gnu()), format!("libc6-dev-{}-cross", self.debian())];
        apt_install(&packages, None, &format!("the {} cross toolchain", self.debian()))
    }

    /// A command that runs `binary`, built for this architecture, on the build machine: itself,
    /// or under qemu's user-mode emulator with the cross C library as its root for libraries.
    pub fn run_command(self, binary: &std::path::Path) -> anyhow::Result<Command> {
        if self.is_host() {
            return Ok(Command::new(binary));
        }
        let qemu = ensure_user_emulator(self)?;
        let mut cmd = Command::new(qemu);
        cmd.arg("-L").arg(format!("/usr/{}", self.gnu())).arg(binary);
        Ok(cmd)
    }

    /// The serial console of this architecture's qemu machine (`console=` on the kernel command
    /// line): the PC's 8250 UART, the virt board's PL011.
    pub fn console(self) -> &'static str {
        match self {
            Arch::Amd64 => "ttyS0",
            Arch::Arm64 => "ttyAMA0",
        }
    }

    /// The qemu system emulator of this architecture and the Debian package that has it.
    pub fn qemu_system(self) -> (&'static str, &'static str) {
        match self {
            Arch::Amd64 => ("qemu-system-x86_64", "qemu-system-x86"),
            Arch::Arm64 => ("qemu-system-aarch64", "qemu-system-arm"),
        }
    }
}

/// `qemu-aarch64-static`, installed from bookworm-backports when missing.
fn ensure_user_emulator(arch: Arch) -> anyhow::Result<PathBuf> {
    let name = match arch {
        Arch::Amd64 => "qemu-x86_64-static",
        Arch::Arm64 => "qemu-aarch64-static",
    };
    if let Some(path) = which(name) {
        return Ok(path);
    }
    apt_install(&["qemu-user-static".to_string()], Some("bookworm-backports"), name)?;
    which(name).with_context(|| format!("qemu-user-static is installed but {name} is not on PATH"))
}

/// The apt source bookworm-backports, added when no source names it.
const BACKPORTS_SOURCE: &str = "/etc/apt/sources.list.d/bookworm-backports.sources";

/// `apt-get install` of `packages` (from `release` when given), as root, refusing a plan that
/// would remove any package. The machine's qemu-utils is bookworm-backports' 10.x: every qemu
/// package comes from there, since bookworm's 7.2 would make apt remove it.
pub fn apt_install(packages: &[String], release: Option<&str>, what: &str) -> anyhow::Result<()> {
    let mut install: Vec<&str> = vec!["install", "-y", "-q", "--no-install-recommends"];
    if let Some(release) = release {
        install.extend(["-t", release]);
    }
    install.extend(packages.iter().map(String::as_str));
    if !is_root() {
        bail!("{what} is missing and installing it needs root: run `sudo apt-get {}`", install.join(" "));
    }
    if release == Some("bookworm-backports") && !backports_configured() {
        println!("xtask: adding the bookworm-backports apt source ({BACKPORTS_SOURCE})");
        std::fs::write(
            BACKPORTS_SOURCE,
            "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm-backports\nComponents: main\n\
             Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n",
        )
        .with_context(|| format!("writing {BACKPORTS_SOURCE}"))?;
        run_checked(Command::new("apt-get").args(["-q", "update"]), "apt-get update")?;
    }
    let simulate = || Command::new("apt-get").arg("-s").args(&install).output().context("apt-get -s install");
    let mut simulated = simulate()?;
    if !simulated.status.success() {
        // A fresh machine may have no package lists yet.
        run_checked(Command::new("apt-get").args(["-q", "update"]), "apt-get update")?;
        simulated = simulate()?;
    }
    let plan = String::from_utf8_lossy(&simulated.stdout);
    if !simulated.status.success() {
        bail!("apt-get -s {} failed:\n{}{}", install.join(" "), plan, String::from_utf8_lossy(&simulated.stderr));
    }
    let removals: Vec<&str> = plan.lines().filter(|l| l.starts_with("Remv ")).collect();
    if !removals.is_empty() {
        bail!("installing {} would remove packages, refusing:\n{}", packages.join(" "), removals.join("\n"));
    }
    println!("xtask: {what}: apt-get {}", install.join(" "));
    run_checked(
        Command::new("apt-get").args(&install).env("DEBIAN_FRONTEND", "noninteractive"),
        &format!("apt-get install {}", packages.join(" ")),
    )
}

fn backports_configured() -> bool {
    let mut files = vec![PathBuf::from("/etc/apt/sources.list")];
    if let Ok(dir) = std::fs::read_dir("/etc/apt/sources.list.d") {
        files.extend(
            dir.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|e| e == "list" || e == "sources")),
        );
    }
    files.iter().filter_map(|f| std::fs::read_to_string(f).ok()).any(|text| {
        text.lines().map(str::trim).filter(|l| !l.starts_with('#')).any(|l| l.contains("bookworm-backports"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_and_debian_names_agree() {
        for arch in [Arch::Amd64, Arch::Arm64] {
            assert_eq!(Arch::from_target(arch.rust_target()).unwrap(), arch);
        }
        assert_eq!(Arch::Arm64.debian(), "arm64");
        assert_eq!(Arch::Arm64.gnu(), "aarch64-linux-gnu");
        assert!(Arch::from_target("riscv64gc-unknown-linux-gnu").is_err());
    }

    #[test]
    fn a_cross_build_names_its_target_and_linker() {
        let mut cargo = Command::new("cargo");
        Arch::Arm64.cargo_args(&mut cargo);
        let args: Vec<_> = cargo.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(args, ["--target", "aarch64-unknown-linux-gnu"]);
        let envs: Vec<_> = cargo.get_envs().map(|(k, v)| (k.to_owned(), v.map(|v| v.to_owned()))).collect();
        assert_eq!(
            envs,
            [("CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER".into(), Some("aarch64-linux-gnu-gcc".into()))]
        );
        assert_eq!(Arch::Arm64.binutil("objcopy"), "aarch64-linux-gnu-objcopy");
        assert_eq!(Arch::Amd64.binutil("objcopy"), "objcopy");
    }
}
