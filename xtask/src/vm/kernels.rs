//! The Debian cloud kernels the VM tests boot, resolved from apt metadata and cached.
//!
//! apt runs against a private configuration under `target/vm/apt` (its own sources list,
//! package lists, cache and an empty dpkg status), so adding trixie, backports or sid here can
//! never change what the machine itself installs or upgrades. Each [`KernelSpec`] names a
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
    time::{Duration, SystemTime},
};

use anyhow::{bail, Context as _};

use crate::{
    arch::Arch,
    build_ebpf::{run_checked, target_dir},
};

/// The metapackage every kernel of `arch` is resolved through.
fn metapackage(arch: Arch) -> String {
    format!("linux-image-cloud-{}", arch.debian())
}

/// Debian suites the private apt configuration reads (main only). An architecture other than
/// the build machine's gets its own configuration with only the suites its kernels and the
/// guests' user space ([`super::userland`], bookworm's) come from.
const SOURCES: &[(&str, &str)] = &[
    ("http://deb.debian.org/debian", "bullseye"),
    ("http://security.debian.org/debian-security", "bullseye-security"),
    ("http://deb.debian.org/debian", "bookworm"),
    ("http://deb.debian.org/debian-security", "bookworm-security"),
    ("http://deb.debian.org/debian", "bookworm-backports"),
    ("http://deb.debian.org/debian", "trixie"),
    ("http://deb.debian.org/debian-security", "trixie-security"),
    ("http://deb.debian.org/debian", "trixie-backports"),
    ("http://deb.debian.org/debian", "sid"),
];

/// Package lists younger than this are used without `apt-get update`.
const LISTS_MAX_AGE: Duration = Duration::from_secs(24 * 3600);

/// One kernel line of the test matrix.
pub struct KernelSpec {
    /// What `--kernel` selects and the matrix shows.
    pub name: &'static str,
    /// The architectures it is booted for (Debian builds every line for amd64; arm64 guests
    /// boot Debian 12's and 13's kernels, the ones an arm64 workstation runs).
    pub arches: &'static [Arch],
    /// The metapackage version must start with this.
    version_prefix: &'static str,
    /// Suites to take it from, in order of preference; the newest version among them wins.
    suites: &'static [&'static str],
    /// Extra kernel command-line words for this line of the matrix.
    pub cmdline: &'static str,
}

const AMD64: &[Arch] = &[Arch::Amd64];
const BOTH: &[Arch] = &[Arch::Amd64, Arch::Arm64];

pub const KERNELS: &[KernelSpec] = &[
    // Debian 11's kernel (LTS), the oldest guard supports: tp_btf, ring buffers (5.8) and the
    // task iterator (5.8) are all there.
    KernelSpec {
        name: "5.10",
        arches: AMD64,
        version_prefix: "5.10.",
        suites: &["bullseye-security", "bullseye"],
        cmdline: "",
    },
    // Debian 12's kernel.
    KernelSpec {
        name: "6.1",
        arches: BOTH,
        version_prefix: "6.1.",
        suites: &["bookworm-security", "bookworm"],
        cmdline: "",
    },
    // Debian 13's kernel (also bookworm-backports).
    KernelSpec {
        name: "6.12",
        arches: BOTH,
        version_prefix: "6.12.",
        suites: &["trixie-security", "trixie", "bookworm-backports"],
        cmdline: "",
    },
    // The newest Debian builds: trixie-backports, else unstable.
    KernelSpec { name: "7.x", arches: AMD64, version_prefix: "7.", suites: &["trixie-backports", "sid"], cmdline: "" },
    // Debian 12's kernel with its BTF hidden (see the module doc): the daemon must fall back to
    // procfs, and everything but the BPF tests must pass.
    KernelSpec {
        name: "no-btf",
        arches: AMD64,
        version_prefix: "6.1.",
        suites: &["bookworm-security", "bookworm"],
        cmdline: "guard.hide_btf",
    },
];

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

/// apt-get/apt-cache bound to the private configuration under `target/vm/apt` (the build
/// machine's architecture) or `target/vm/apt-<arch>` (another one, as apt's native architecture
/// there, so its package names need no `:arch`).
pub(crate) struct Apt {
    dir: PathBuf,
    pub arch: Arch,
}

impl Apt {
    pub fn new(arch: Arch) -> anyhow::Result<Self> {
        let dir =
            target_dir().join(if arch.is_host() { "vm/apt".to_string() } else { format!("vm/apt-{}", arch.debian()) });
        for sub in ["lists/partial", "cache/archives/partial", "sources.list.d", "preferences.d"] {
            fs::create_dir_all(dir.join(sub)).with_context(|| format!("creating {}", dir.join(sub).display()))?;
        }
        let keyring = "/usr/share/keyrings/debian-archive-keyring.gpg";
        let wanted = |suite: &str| {
            arch.is_host()
                || suite == "bookworm"
                || KERNELS.iter().any(|k| k.arches.contains(&arch) && k.suites.contains(&suite))
        };
        let sources: String = SOURCES
            .iter()
            .filter(|(_, suite)| wanted(suite))
            .map(|(uri, suite)| format!("deb [arch={} signed-by={keyring}] {uri} {suite} main\n", arch.debian()))
            .collect();
        // New sources make the lists stale at once.
        if write_if_changed(&dir.join("sources.list"), &sources)? {
            let _ = fs::remove_file(dir.join("lists/.updated"));
        }
        write_if_changed(&dir.join("status"), "")?;
        write_if_changed(&dir.join("preferences"), "")?;
        Ok(Self { dir, arch })
    }

    fn command(&self, tool: &str) -> Command {
        let d = |sub: &str| self.dir.join(sub).display().to_string();
        let mut cmd = Command::new(tool);
        for (key, value) in [
            ("Dir::Etc::SourceList", d("sources.list")),
            ("Dir::Etc::SourceParts", d("sources.list.d")),
            ("Dir::Etc::Preferences", d("preferences")),
            ("Dir::Etc::PreferencesParts", d("preferences.d")),
            ("Dir::State::Lists", d("lists")),
            ("Dir::State::status", d("status")),
            ("Dir::Cache", d("cache")),
            ("APT::Architecture", self.arch.debian().into()),
            ("APT::Architectures", self.arch.debian().into()),
            ("Acquire::Languages", "none".into()),
            // Only Packages files are needed; skip AppStream and Contents indexes.
            ("Acquire::IndexTargets::deb::DEP-11::DefaultEnabled", "false".into()),
            ("Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled", "false".into()),
            ("Acquire::IndexTargets::deb::DEP-11-icons-small::DefaultEnabled", "false".into()),
            ("Acquire::IndexTargets::deb::DEP-11-icons-hidpi::DefaultEnabled", "false".into()),
            ("Acquire::IndexTargets::deb::Contents-deb::DefaultEnabled", "false".into()),
            // Files land under target/, which the unprivileged _apt user may not write.
            ("APT::Sandbox::User", "root".into()),
        ] {
            cmd.arg("-o").arg(format!("{key}={value}"));
        }
        cmd
    }

    pub fn update_if_stale(&self) -> anyhow::Result<()> {
        let stamp = self.dir.join("lists/.updated");
        let fresh = fs::metadata(&stamp)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| SystemTime::now().duration_since(t).ok())
            .is_some_and(|age| age < LISTS_MAX_AGE);
        if fresh {
            return Ok(());
        }
        println!("vm: apt-get update (private lists in {}; the machine's apt state is untouched)", self.dir.display());
        let mut cmd = self.command("apt-get");
        cmd.args(["-q", "update"]);
        let out = cmd.output().context("running apt-get update")?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() || stderr.contains("E: ") {
            bail!("apt-get update (private lists) failed ({}):\n{}", out.status, stderr.trim());
        }
        fs::write(&stamp, "")?;
        Ok(())
    }

    fn stdout(&self, tool: &str, args: &[&str]) -> anyhow::Result<String> {
        let mut cmd = self.command(tool);
        cmd.args(args);
        let out = cmd.output().with_context(|| format!("running {tool} {}", args.join(" ")))?;
        if !out.status.success() {
            bail!("{tool} {} failed ({}): {}", args.join(" "), out.status, String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `(version, suite)` rows, newest first.
    fn madison(&self, package: &str) -> anyhow::Result<Vec<(String, String)>> {
        Ok(parse_madison(&self.stdout("apt-cache", &["madison", package])?))
    }

    /// The package names in the `Depends:` of `package=version` (alternatives: the first).
    fn depends(&self, package: &str, version: &str) -> anyhow::Result<Vec<String>> {
        let show = self.stdout("apt-cache", &["show", &format!("{package}={version}")])?;
        Ok(parse_depends(&show))
    }

    /// The newest version apt knows of `package` (none: not in any list).
    fn candidate(&self, package: &str) -> anyhow::Result<Option<String>> {
        Ok(parse_madison(&self.stdout("apt-cache", &["madison", package])?).into_iter().next().map(|(v, _)| v))
    }

    fn download(&self, packages: &[(String, String)], into: &Path) -> anyhow::Result<()> {
        let mut cmd = self.command("apt-get");
        cmd.args(["-q", "download"]).args(packages.iter().map(|(p, v)| format!("{p}={v}"))).current_dir(into);
        run_checked(&mut cmd, "apt-get download")
    }

    /// `packages` and everything they depend on (apt's resolver against the empty private
    /// status: the whole closure), bookworm's versions, downloaded into the private cache;
    /// returns the `.deb` files.
    /// apt takes no dpkg lock for a download-only install, so the machine is never touched.
    pub fn download_closure(&self, packages: &[&str]) -> anyhow::Result<Vec<PathBuf>> {
        // bookworm's, not the newest of every listed suite (trixie's C library would be newer
        // than the build machine's, which the cross toolchain links against).
        let install = ["-q", "-y", "--no-install-recommends", "-o", "APT::Default-Release=bookworm", "install"];
        // The plan first, against an empty archive directory so that it names every file (apt
        // leaves out what its cache holds), then the download into the private cache.
        let empty = self.dir.join("plan-archives");
        fs::create_dir_all(empty.join("partial"))?;
        let mut plan = self.command("apt-get");
        plan.arg("-o").arg(format!("Dir::Cache::Archives={}", empty.display())).arg("--print-uris");
        plan.args(install).args(packages);
        let plan = plan.output().context("running apt-get --print-uris install")?;
        let mut download = self.command("apt-get");
        download.arg("--download-only").args(install).args(packages);
        let out = if plan.status.success() {
            download.output().context("running apt-get --download-only")?
        } else {
            plan.clone()
        };
        if !out.status.success() {
            bail!(
                "apt-get install --download-only {} (private lists, {}) failed ({}): {}",
                packages.join(" "),
                self.arch.debian(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let archives = self.dir.join("cache/archives");
        let mut debs: Vec<PathBuf> = String::from_utf8_lossy(&plan.stdout)
            .lines()
            .filter(|l| l.starts_with('\''))
            .filter_map(|l| l.split_whitespace().nth(1))
            .map(|f| archives.join(f))
            .collect();
        debs.sort();
        if let Some(missing) = debs.iter().find(|d| !d.is_file()) {
            bail!("apt-get --download-only left no {}", missing.display());
        }
        Ok(debs)
    }
}

/// Writes `text` unless the file already holds it; whether it wrote.
fn write_if_changed(path: &Path, text: &str) -> anyhow::Result<bool> {
    if fs::read_to_string(path).ok().as_deref() == Some(text) {
        return Ok(false);
    }
    fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(true)
}

/// ` pkg | 6.12.118-1 | http://deb.debian.org/debian-security trixie-security/main amd64 Packages`
fn parse_madison(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split('|').map(str::trim);
            let (_, version, source) = (fields.next()?, fields.next()?, fields.next()?);
            let suite = source.split_whitespace().nth(1)?.split('/').next()?;
            Some((version.to_string(), suite.to_string()))
        })
        .collect()
}

fn parse_depends(show: &str) -> Vec<String> {
    let Some(line) = show.lines().find_map(|l| l.strip_prefix("Depends:")) else { return Vec::new() };
    line.split(',').filter_map(|dep| dep.split('|').next()?.split_whitespace().next().map(String::from)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn madison_rows_give_version_and_suite() {
        let text = "linux-image-cloud-amd64 | 7.3.4-1~bpo13+1 | http://deb.debian.org/debian trixie-backports/main amd64 Packages\n\
                    linux-image-cloud-amd64 |  6.1.192-3 | http://deb.debian.org/debian-security bookworm-security/main amd64 Packages\n";
        assert_eq!(
            parse_madison(text),
            vec![
                ("7.3.4-1~bpo13+1".into(), "trixie-backports".into()),
                ("6.1.192-3".into(), "bookworm-security".into())
            ]
        );
    }

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
    fn depends_take_the_first_alternative_without_versions() {
        let show = "Package: x\nDepends: dracut | initramfs-tools (>= 0.120), linux-binary-7.3.4+deb13-cloud-amd64 (= 7.3.4-1~bpo13+1)\n";
        assert_eq!(parse_depends(show), vec!["dracut", "linux-binary-7.3.4+deb13-cloud-amd64"]);
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
