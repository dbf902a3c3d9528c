//! The user space of a guest whose architecture is not the build machine's: Debian's own
//! packages for it, unpacked into a root the image is filled from.
//!
//! An x86_64 guest carries the build machine's bash, coreutils and C library (`ldd` names
//! them). An arm64 guest needs arm64 builds of the same programs, so they come from bookworm's
//! arm64 packages: apt, through the private configuration of that architecture
//! ([`super::apt::Apt`]), resolves and downloads [`PACKAGES`] and everything they depend on
//! (nothing is installed on the machine), and each `.deb` is unpacked with `dpkg-deb -x` into
//! `target/vm/userland-<arch>/root`. A program's libraries are found by reading its ELF
//! dynamic section (`readelf -d`, `-l` for the loader), since `ldd` runs programs and cannot
//! run these; they resolve in the root's multiarch directories, as the guest's loader will.
//!
//! The root also yields a dpkg status file listing exactly the packages unpacked there, so the
//! package scenario's `dpkg -i` in the guest checks the .deb's `Depends` against what the guest
//! really has.
use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _};

use super::apt::Apt;
use crate::{
    arch::Arch,
    build_ebpf::{run_checked, target_dir},
};

/// What the guests run besides guard's own binaries: the shell and coreutils the tests call,
/// grep, sed, find and diff (Essential packages, so nothing depends on them; dpkg wants diff), util-linux (`unshare`, `setpriv`),
/// bsdutils (`script`, the pty of the slots' interactive-shell test), lsof (what the holders tests
/// compare `holders` with, as on the x86_64 guests), Redis (server and cli, for parity with the x86_64
/// guests, whose image has them when the host does), dpkg (and libc-bin's `ldconfig`, which dpkg
/// insists on finding) for the package scenario, and the C library and libgcc the Rust binaries
/// link.
pub const PACKAGES: &[&str] = &[
    "bash",
    "coreutils",
    "grep",
    "sed",
    "findutils",
    "diffutils",
    "util-linux",
    "bsdutils",
    "lsof",
    "redis-tools",
    "dpkg",
    "libc-bin",
    "libc6",
    "libgcc-s1",
];

/// Debian's arm64 packages unpacked into one root.
pub struct Userland {
    pub arch: Arch,
    pub root: PathBuf,
    /// `Package`, `Version`, `Architecture`, … of every unpacked package (their control files).
    controls: Vec<String>,
    /// Each package's dpkg file list, as `(info file name, text)`: without them dpkg believes a
    /// package it removes owns `/lib` alone, and removing guard-user took the `/lib` link (and
    /// with it the loader) away.
    lists: Vec<(String, String)>,
}

impl Userland {
    /// Downloads (if not cached) and unpacks [`PACKAGES`] with their dependencies for `arch`.
    pub fn prepare(arch: Arch) -> anyhow::Result<Userland> {
        let apt = Apt::new(arch)?;
        apt.update_if_stale()?;
        let debs = apt.download_closure(PACKAGES)?;
        let dir = target_dir().join(format!("vm/userland-{}", arch.debian()));
        let root = dir.join("root");
        let record = dir.join("debs");
        let names: String = debs.iter().filter_map(|d| d.file_name()?.to_str()).map(|n| format!("{n}\n")).collect();
        let controls_file = dir.join("controls");
        let lists_dir = dir.join("lists");
        if fs::read_to_string(&record).ok().as_deref() == Some(names.as_str()) && root.is_dir() && lists_dir.is_dir() {
            let controls = fs::read_to_string(&controls_file)?.split("\n\n").map(String::from).collect();
            let mut lists = Vec::new();
            for entry in fs::read_dir(&lists_dir)? {
                let path = entry?.path();
                let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
                lists.push((name, fs::read_to_string(&path)?));
            }
            println!("vm: {} user space: {} packages (cached in {})", arch.debian(), debs.len(), root.display());
            return Ok(Userland { arch, root, controls, lists });
        }
        println!("vm: {} user space: unpacking {} packages into {}", arch.debian(), debs.len(), root.display());
        if root.exists() {
            fs::remove_dir_all(&root).with_context(|| format!("removing {}", root.display()))?;
        }
        fs::create_dir_all(&root)?;
        let _ = fs::remove_dir_all(&lists_dir);
        fs::create_dir_all(&lists_dir)?;
        let mut controls = Vec::new();
        let mut lists = Vec::new();
        for deb in &debs {
            run_checked(
                Command::new("dpkg-deb").arg("-x").arg(deb).arg(&root),
                &format!("dpkg-deb -x {}", deb.display()),
            )?;
            let out = Command::new("dpkg-deb").arg("-f").arg(deb).output().context("dpkg-deb -f")?;
            if !out.status.success() {
                bail!("dpkg-deb -f {} failed: {}", deb.display(), String::from_utf8_lossy(&out.stderr).trim());
            }
            let control = String::from_utf8_lossy(&out.stdout).trim_end().to_string();
            let field = |name: &str| {
                control.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':')).map(str::trim).unwrap_or_default()
            };
            // dpkg's info files are `<package>:<arch>.list` for `Multi-Arch: same` packages.
            let info = match field("Multi-Arch") {
                "same" => format!("{}:{}.list", field("Package"), arch.debian()),
                _ => format!("{}.list", field("Package")),
            };
            let tar = Command::new("sh")
                .args(["-c", "dpkg-deb --fsys-tarfile \"$1\" | tar -t", "sh"])
                .arg(deb)
                .output()
                .context("dpkg-deb --fsys-tarfile | tar -t")?;
            if !tar.status.success() {
                bail!("listing {} failed: {}", deb.display(), String::from_utf8_lossy(&tar.stderr).trim());
            }
            let list = dpkg_list(&String::from_utf8_lossy(&tar.stdout));
            fs::write(lists_dir.join(&info), &list)?;
            lists.push((info, list));
            controls.push(control);
        }
        fs::write(&controls_file, controls.join("\n\n"))?;
        // Written last: its presence marks the root complete.
        fs::write(&record, names)?;
        Ok(Userland { arch, root, controls, lists })
    }

    /// A program of the root by name (`bash`), where Debian puts programs.
    pub fn tool(&self, name: &str) -> Option<PathBuf> {
        ["usr/bin", "bin", "usr/sbin", "sbin"].iter().map(|d| self.root.join(d).join(name)).find(|p| p.is_file())
    }

    /// A root path as the guest sees it (`<root>/lib/x/libc.so.6` → `/lib/x/libc.so.6`).
    pub fn guest_path(&self, path: &Path) -> anyhow::Result<PathBuf> {
        let rel = path
            .strip_prefix(&self.root)
            .with_context(|| format!("{} is not in {}", path.display(), self.root.display()))?;
        Ok(Path::new("/").join(rel))
    }

    /// Every shared library `binary` loads, directly or through another, and its loader, as
    /// `(guest path, file in the root)`.
    pub fn libraries(&self, binary: &Path) -> anyhow::Result<Vec<(PathBuf, PathBuf)>> {
        let mut found = BTreeMap::new();
        let mut queue = vec![binary.to_path_buf()];
        let mut seen = BTreeSet::new();
        while let Some(file) = queue.pop() {
            if !seen.insert(file.clone()) {
                continue;
            }
            let (interp, needed) = self.dynamic(&file)?;
            if let Some(interp) = interp {
                let in_root = self.root.join(interp.trim_start_matches('/'));
                anyhow::ensure!(
                    in_root.exists(),
                    "{}: its loader {interp} is not in {}",
                    file.display(),
                    self.root.display()
                );
                found.insert(PathBuf::from(&interp), in_root);
            }
            for name in needed {
                let (guest, in_root) = self.find_library(&name).with_context(|| {
                    format!(
                        "{} needs {name}, which no package of {} has: add its package to xtask/src/vm/userland.rs",
                        file.display(),
                        self.root.display()
                    )
                })?;
                queue.push(in_root.clone());
                found.insert(guest, in_root);
            }
        }
        Ok(found.into_iter().collect())
    }

    /// `/var/lib/dpkg/status` for the guest: every unpacked package, installed.
    pub fn dpkg_status(&self) -> String {
        let mut text = String::new();
        for control in &self.controls {
            let mut lines: Vec<&str> = control.lines().collect();
            let at = lines.iter().position(|l| l.starts_with("Package:")).map_or(0, |i| i + 1);
            lines.insert(at, "Status: install ok installed");
            text.push_str(&lines.join("\n"));
            text.push_str("\n\n");
        }
        text
    }

    /// `/var/lib/dpkg/info/<name>.list` files for the guest, one per unpacked package.
    pub fn dpkg_lists(&self) -> &[(String, String)] {
        &self.lists
    }

    /// The library `name` in the root's search path, as `(guest path, file)`.
    fn find_library(&self, name: &str) -> Option<(PathBuf, PathBuf)> {
        let gnu = self.arch.gnu();
        [format!("lib/{gnu}"), format!("usr/lib/{gnu}"), "lib".into(), "usr/lib".into()]
            .iter()
            .map(|dir| Path::new("/").join(dir).join(name))
            .find_map(|guest| {
                let file = self.root.join(guest.strip_prefix("/").ok()?);
                file.exists().then_some((guest, file))
            })
    }

    /// The ELF interpreter and `NEEDED` entries of `file`.
    fn dynamic(&self, file: &Path) -> anyhow::Result<(Option<String>, Vec<String>)> {
        let readelf = self.arch.binutil("readelf");
        let out = Command::new(&readelf)
            .args(["-d", "-l", "-W"])
            .arg(file)
            .output()
            .with_context(|| format!("running {readelf}"))?;
        if !out.status.success() {
            bail!("{readelf} -d -l {} failed: {}", file.display(), String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(parse_readelf(&String::from_utf8_lossy(&out.stdout)))
    }
}

/// A dpkg file list (`/.`, `/bin`, `/bin/bash`) from `tar -t` of a package's data (`./`,
/// `./bin/`, `./bin/bash`).
fn dpkg_list(tar: &str) -> String {
    tar.lines()
        .map(|l| l.trim_start_matches('.').trim_end_matches('/'))
        .map(|p| if p.is_empty() { "/.".to_string() } else { p.to_string() })
        .map(|p| p + "\n")
        .collect()
}

/// `[Requesting program interpreter: /lib/ld-linux-aarch64.so.1]` and `(NEEDED) Shared library: [libc.so.6]`.
fn parse_readelf(text: &str) -> (Option<String>, Vec<String>) {
    let bracketed = |line: &str, after: &str| -> Option<String> {
        let rest = &line[line.find(after)? + after.len()..];
        Some(rest[..rest.find(']')?].trim().to_string())
    };
    let interp = text.lines().find_map(|l| bracketed(l, "program interpreter:"));
    let needed =
        text.lines().filter(|l| l.contains("(NEEDED)")).filter_map(|l| bracketed(l, "Shared library: [")).collect();
    (interp, needed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tar_listings_become_dpkg_file_lists() {
        assert_eq!(
            dpkg_list("./\n./bin/\n./bin/bash\n./usr/share/doc/bash/\n"),
            "/.\n/bin\n/bin/bash\n/usr/share/doc/bash\n"
        );
    }

    #[test]
    fn readelf_gives_the_loader_and_the_needed_libraries() {
        let text = "      [Requesting program interpreter: /lib/ld-linux-aarch64.so.1]\n\
                    \x20 0x0000000000000001 (NEEDED)             Shared library: [libtinfo.so.6]\n\
                    \x20 0x0000000000000001 (NEEDED)             Shared library: [libc.so.6]\n\
                    \x20 0x000000000000000e (SONAME)             Library soname: [libx.so.1]\n";
        let (interp, needed) = parse_readelf(text);
        assert_eq!(interp.as_deref(), Some("/lib/ld-linux-aarch64.so.1"));
        assert_eq!(needed, ["libtinfo.so.6", "libc.so.6"]);
    }
}
