//! The Debian cloud kernels the VM tests boot, resolved from apt metadata and cached.
//!
//! apt runs against a private configuration ([`super::apt`]), so adding trixie, backports or
//! sid here can never change what the machine itself installs or upgrades. Each [`KernelSpec`] names a
//! metapackage version line (`linux-image-cloud-amd64` 6.1.x from bookworm, …); the newest
//! matching version decides the ABI package, and the package holding `vmlinuz` (the unsigned
//! image, or the `linux-binary-*` package of the split 7.x packaging) is downloaded and
//! unpacked once into `target/vm/kernels/<abi>/`.
//!
//! One line of the matrix is not a kernel of its own: `no-btf` boots the 6.1 kernel with
//! `guard.hide_btf` on its command line, and vm-init then hides `/sys/kernel/btf` under an empty
//! tmpfs, which is what a kernel built without `CONFIG_DEBUG_INFO_BTF` looks like to user space
//! (no Debian kernel on the mirror is that old: buster's 4.19 is only on archive.debian.org).
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _};

use super::{
    apt::Apt,
    matrix::{KernelSpec, KERNELS},
};
use crate::{
    arch::Arch,
    build_ebpf::{run_checked, target_dir},
};

/// The metapackage every kernel of `arch` is resolved through.
fn metapackage(arch: Arch) -> String {
    format!("linux-image-cloud-{}", arch.debian())
}

/// A kernel ready to boot.
#[derive(Debug, Clone)]
pub struct Kernel {
    /// The spec's name (`6.12`).
    pub name: String,
    /// What it runs on, and the name of its console log and lines: the spec's name for amd64
    /// (`6.12`), prefixed for another architecture (`arm64-6.12`).
    pub arch: Arch,
    pub label: String,
    /// The metapackage version it was resolved from (`6.12.118-1`) and its suite.
    pub meta_version: String,
    pub suite: String,
    /// The ABI image package (`linux-image-6.12.118+deb13-cloud-amd64`).
    pub package: String,
    /// What was downloaded for vmlinuz, with versions (`name=version`).
    pub downloaded: Vec<String>,
    pub vmlinuz: PathBuf,
    /// The kernel's build configuration, when the packages carried one.
    pub config: Option<PathBuf>,
    /// Extra kernel command-line words (the spec's).
    pub cmdline: String,
}

/// `--kernel` words grouped by architecture: `6.1` stands for that kernel of each of `arches`,
/// `arm64-6.1` for arm64's whatever `arches` says, `arm64` for every arm64 kernel. No word:
/// every kernel of each of `arches`. Architectures come in the order of `arches`, then of the
/// words.
pub fn by_arch(words: &[String], arches: &[Arch]) -> anyhow::Result<Vec<(Arch, Vec<String>)>> {
    let mut groups: Vec<(Arch, Vec<String>, bool)> =
        arches.iter().map(|&a| (a, Vec::new(), words.is_empty())).collect();
    let mut group = |arch: Arch, name: Option<&str>| {
        let at = match groups.iter().position(|(a, ..)| *a == arch) {
            Some(at) => at,
            None => {
                groups.push((arch, Vec::new(), false));
                groups.len() - 1
            }
        };
        match name {
            Some(name) => groups[at].1.push(name.to_string()),
            None => groups[at].2 = true,
        }
    };
    for word in words {
        let parsed = [Arch::Amd64, Arch::Arm64].into_iter().find_map(|a| {
            if word == a.debian() {
                Some((a, None))
            } else {
                word.strip_prefix(&format!("{}-", a.debian())).map(|rest| (a, Some(rest)))
            }
        });
        match parsed {
            Some((arch, name)) => group(arch, name),
            None => arches.iter().for_each(|&a| group(a, Some(word))),
        }
    }
    // An architecture named alone wants all of its kernels: an empty list selects them.
    Ok(groups
        .into_iter()
        .filter(|(_, names, all)| *all || !names.is_empty())
        .map(|(arch, names, all)| (arch, if all { Vec::new() } else { names }))
        .collect())
}

/// Selects the specs of `arch` named by `--kernel` (all of the architecture's when empty).
pub fn select(names: &[String], arch: Arch) -> anyhow::Result<Vec<&'static KernelSpec>> {
    let known: Vec<&'static KernelSpec> = KERNELS.iter().filter(|k| k.arches.contains(&arch)).collect();
    if names.is_empty() {
        return Ok(known);
    }
    names
        .iter()
        .map(|name| {
            let wanted = name.trim_end_matches(".x");
            known.iter().copied().find(|k| k.name == name || k.name.trim_end_matches(".x") == wanted).with_context(
                || {
                    let names: Vec<_> = known.iter().map(|k| k.name).collect();
                    format!("unknown kernel {name:?} for {}: choose from {}", arch.debian(), names.join(", "))
                },
            )
        })
        .collect()
}

/// Resolves and (if not cached) downloads every selected kernel of `arch`.
pub fn prepare(specs: &[&KernelSpec], arch: Arch) -> anyhow::Result<Vec<Kernel>> {
    let apt = Apt::new(arch)?;
    apt.update_if_stale()?;
    let madison = apt.madison(&metapackage(arch))?;
    specs.iter().map(|spec| prepare_one(&apt, &madison, spec)).collect()
}

/// The newest version of the spec's line that can be fetched: a mirror may list a package its
/// pool no longer (or not yet) serves (seen with bullseye-security's 5.10.262 behind a proxy), so
/// each older candidate is tried in turn, and every failure is printed.
fn prepare_one(apt: &Apt, madison: &[(String, String)], spec: &KernelSpec) -> anyhow::Result<Kernel> {
    let meta = metapackage(apt.arch);
    let candidates = pick_versions(madison, spec);
    if candidates.is_empty() {
        bail!(
            "no {meta} {}* in {} (apt-cache madison found: {madison:?})",
            spec.version_prefix,
            spec.suites.join(", ")
        );
    }
    let mut errors = Vec::new();
    for (meta_version, suite) in candidates {
        match prepare_version(apt, spec, &meta_version, &suite) {
            Ok(k) => return Ok(k),
            Err(err) => {
                println!("vm: kernel {}: {meta}={meta_version} ({suite}) unusable: {err:#}", spec.name);
                errors.push(format!("{meta_version}: {err:#}"));
            }
        }
    }
    bail!("no version of kernel {} could be fetched: {}", spec.name, errors.join("; "))
}

fn prepare_version(apt: &Apt, spec: &KernelSpec, meta_version: &str, suite: &str) -> anyhow::Result<Kernel> {
    let (meta_version, suite) = (meta_version.to_string(), suite.to_string());
    let (arch, meta) = (apt.arch, metapackage(apt.arch));
    let label = if arch == Arch::Amd64 { spec.name.to_string() } else { format!("{}-{}", arch.debian(), spec.name) };
    let flavour = format!("-cloud-{}", arch.debian());
    let depends = apt.depends(&meta, &meta_version)?;
    let package = depends
        .iter()
        .find(|d| d.starts_with("linux-image-") && d.ends_with(&flavour))
        .with_context(|| format!("{meta}={meta_version} depends on no linux-image-*{flavour}: {depends:?}"))?
        .clone();
    let abi = package.trim_start_matches("linux-image-").to_string();
    let dir = target_dir().join("vm/kernels").join(&abi);
    let record = dir.join("packages");
    let cached_vmlinuz = dir.join("vmlinuz");
    let config = dir.join("config");

    if cached_vmlinuz.is_file() && record.is_file() {
        let downloaded = fs::read_to_string(&record)?.lines().map(String::from).collect();
        println!("vm: kernel {label}: {package} (cached in {})", dir.display());
        return Ok(Kernel {
            name: spec.name.to_string(),
            arch,
            label,
            meta_version,
            suite,
            package,
            downloaded,
            vmlinuz: cached_vmlinuz,
            config: config.is_file().then_some(config),
            cmdline: spec.cmdline.to_string(),
        });
    }

    // The unsigned image when there is one (bookworm/trixie packaging); otherwise the image is a
    // metapackage over linux-binary-* (vmlinuz) and linux-base-* (config), the 7.x layout.
    let unsigned = format!("{package}-unsigned");
    let mut wanted = Vec::new();
    if let Some(version) = apt.candidate(&unsigned)? {
        wanted.push((unsigned, version));
    } else {
        let version = apt.candidate(&package)?.with_context(|| format!("{package} has no candidate version"))?;
        for dep in apt.depends(&package, &version)? {
            if dep.starts_with("linux-binary-") || dep.starts_with("linux-base-") {
                let v = apt.candidate(&dep)?.with_context(|| format!("{dep} has no candidate version"))?;
                wanted.push((dep, v));
            }
        }
        if wanted.is_empty() {
            wanted.push((package.clone(), version));
        }
    }

    println!(
        "vm: kernel {label}: {meta}={meta_version} ({suite}) → {package}; downloading {}",
        wanted.iter().map(|(p, v)| format!("{p}={v}")).collect::<Vec<_>>().join(" ")
    );
    let staging = target_dir().join("vm/kernels/.staging").join(&abi);
    if staging.exists() {
        fs::remove_dir_all(&staging).with_context(|| format!("removing {}", staging.display()))?;
    }
    let debs = staging.join("debs");
    let root = staging.join("root");
    fs::create_dir_all(&debs)?;
    fs::create_dir_all(&root)?;
    apt.download(&wanted, &debs)?;
    for deb in fs::read_dir(&debs)? {
        let deb = deb?.path();
        run_checked(
            Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root),
            &format!("dpkg-deb -x {}", deb.display()),
        )?;
    }
    let found_vmlinuz = find_file(&root, is_vmlinuz)
        .with_context(|| format!("no vmlinuz in {:?} (unpacked in {})", wanted, root.display()))?;
    let found_config = find_file(&root, is_config);

    fs::create_dir_all(&dir)?;
    fs::copy(&found_vmlinuz, &cached_vmlinuz).with_context(|| format!("copying {}", found_vmlinuz.display()))?;
    if let Some(found) = &found_config {
        fs::copy(found, &config)?;
    }
    let downloaded: Vec<String> = wanted.iter().map(|(p, v)| format!("{p}={v}")).collect();
    // Written last: its presence marks the cache entry complete.
    fs::write(&record, downloaded.join("\n") + "\n")?;
    fs::remove_dir_all(&staging)?;
    Ok(Kernel {
        name: spec.name.to_string(),
        arch,
        label,
        meta_version,
        suite,
        package,
        downloaded,
        vmlinuz: cached_vmlinuz,
        config: found_config.map(|_| config),
        cmdline: spec.cmdline.to_string(),
    })
}

/// The madison rows of the spec's suites whose version has its prefix, newest first (`apt-cache
/// madison` lists newest first).
fn pick_versions(madison: &[(String, String)], spec: &KernelSpec) -> Vec<(String, String)> {
    madison
        .iter()
        .filter(|(version, suite)| version.starts_with(spec.version_prefix) && spec.suites.contains(&suite.as_str()))
        .cloned()
        .collect()
}

/// `boot/vmlinuz-<abi>` (classic packaging) or `usr/lib/modules/<abi>/vmlinuz` (split packaging).
fn is_vmlinuz(path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    name == "vmlinuz" || name.starts_with("vmlinuz-")
}

fn is_config(path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let parent = path.parent().and_then(|p| p.file_name()).and_then(|n| n.to_str()).unwrap_or("");
    (name.starts_with("config-") && parent == "boot")
        || (name == "config" && path.parent().and_then(Path::parent).is_some_and(|p| p.ends_with("lib/modules")))
}

fn find_file(dir: &Path, matches: impl Fn(&Path) -> bool + Copy) -> Option<PathBuf> {
    for entry in fs::read_dir(dir).ok()? {
        let entry = entry.ok()?;
        let path = entry.path();
        let kind = entry.file_type().ok()?;
        if kind.is_dir() {
            if let Some(found) = find_file(&path, matches) {
                return Some(found);
            }
        } else if kind.is_file() && matches(&path) {
            return Some(path);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_lines_do_not_confuse_6_1_with_6_12() {
        let rows = vec![
            ("6.12.118-1".to_string(), "bookworm-security".to_string()),
            ("6.1.192-3".into(), "bookworm-security".into()),
        ];
        let six_one = KERNELS.iter().find(|k| k.name == "6.1").unwrap();
        assert_eq!(pick_versions(&rows, six_one)[0].0, "6.1.192-3");
    }

    #[test]
    fn every_line_of_the_matrix_is_selectable_by_name_and_no_btf_hides_it_on_6_1() {
        for k in KERNELS {
            for &arch in k.arches {
                assert_eq!(select(&[k.name.to_string()], arch).unwrap()[0].name, k.name);
            }
        }
        let no_btf = select(&["no-btf".into()], Arch::Amd64).unwrap()[0];
        assert_eq!((no_btf.version_prefix, no_btf.cmdline), ("6.1.", "guard.hide_btf"));
        assert_eq!(select(&["7".into()], Arch::Amd64).unwrap()[0].name, "7.x");
        let arm64: Vec<_> = select(&[], Arch::Arm64).unwrap().iter().map(|k| k.name).collect();
        assert_eq!(arm64, ["6.1", "6.12"]);
        assert!(select(&["7.x".into()], Arch::Arm64).is_err());
    }

    #[test]
    fn kernel_words_name_kernels_of_each_arch_or_of_one() {
        let w = |words: &[&str]| words.iter().map(|w| w.to_string()).collect::<Vec<_>>();
        let amd = [Arch::Amd64];
        assert_eq!(by_arch(&[], &amd).unwrap(), [(Arch::Amd64, vec![])]);
        assert_eq!(
            by_arch(&w(&["6.1"]), &[Arch::Amd64, Arch::Arm64]).unwrap(),
            [(Arch::Amd64, w(&["6.1"])), (Arch::Arm64, w(&["6.1"]))]
        );
        // CI: every amd64 kernel and arm64's 6.1.
        assert_eq!(
            by_arch(&w(&["amd64", "arm64-6.1"]), &amd).unwrap(),
            [(Arch::Amd64, vec![]), (Arch::Arm64, w(&["6.1"]))]
        );
        assert_eq!(by_arch(&w(&["arm64"]), &amd).unwrap(), [(Arch::Arm64, vec![])]);
        assert_eq!(
            by_arch(&w(&["6.12", "arm64-6.1"]), &amd).unwrap(),
            [(Arch::Amd64, w(&["6.12"])), (Arch::Arm64, w(&["6.1"]))]
        );
    }

    #[test]
    fn both_packagings_name_their_kernel_and_config() {
        assert!(is_vmlinuz(Path::new("r/boot/vmlinuz-6.1.0-57-cloud-amd64")));
        assert!(is_vmlinuz(Path::new("r/usr/lib/modules/7.3.4+deb13-cloud-amd64/vmlinuz")));
        assert!(is_config(Path::new("r/boot/config-6.1.0-57-cloud-amd64")));
        assert!(is_config(Path::new("r/usr/lib/modules/7.3.4+deb13-cloud-amd64/config")));
        assert!(!is_config(Path::new("r/usr/lib/modules/7.3.4/kernel/config")));
    }
}
