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

use crate::build_ebpf::{run_checked, target_dir};

/// The metapackage every kernel is resolved through.
const METAPACKAGE: &str = "linux-image-cloud-amd64";

/// Debian suites the private apt configuration reads (main only, amd64).
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
    /// The metapackage version must start with this.
    version_prefix: &'static str,
    /// Suites to take it from, in order of preference; the newest version among them wins.
    suites: &'static [&'static str],
    /// Extra kernel command-line words for this line of the matrix.
    pub cmdline: &'static str,
}

pub const KERNELS: &[KernelSpec] = &[
    // Debian 11's kernel (LTS), the oldest guard supports: tp_btf, ring buffers (5.8) and the
    // task iterator (5.8) are all there.
    KernelSpec { name: "5.10", version_prefix: "5.10.", suites: &["bullseye-security", "bullseye"], cmdline: "" },
    // Debian 12's kernel.
    KernelSpec { name: "6.1", version_prefix: "6.1.", suites: &["bookworm-security", "bookworm"], cmdline: "" },
    // Debian 13's kernel (also bookworm-backports).
    KernelSpec {
        name: "6.12",
        version_prefix: "6.12.",
        suites: &["trixie-security", "trixie", "bookworm-backports"],
        cmdline: "",
    },
    // The newest Debian builds: trixie-backports, else unstable.
    KernelSpec { name: "7.x", version_prefix: "7.", suites: &["trixie-backports", "sid"], cmdline: "" },
    // Debian 12's kernel with its BTF hidden (see the module doc): the daemon must fall back to
    // procfs, and everything but the BPF tests must pass.
    KernelSpec {
        name: "no-btf",
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

/// Selects the specs named by `--kernel` (all when empty).
pub fn select(names: &[String]) -> anyhow::Result<Vec<&'static KernelSpec>> {
    if names.is_empty() {
        return Ok(KERNELS.iter().collect());
    }
    names
        .iter()
        .map(|name| {
            let wanted = name.trim_end_matches(".x");
            KERNELS.iter().find(|k| k.name == name || k.name.trim_end_matches(".x") == wanted).with_context(|| {
                let known: Vec<_> = KERNELS.iter().map(|k| k.name).collect();
                format!("unknown kernel {name:?}: choose from {}", known.join(", "))
            })
        })
        .collect()
}

/// Resolves and (if not cached) downloads every selected kernel.
pub fn prepare(specs: &[&KernelSpec]) -> anyhow::Result<Vec<Kernel>> {
    let apt = Apt::new()?;
    apt.update_if_stale()?;
    let madison = apt.madison(METAPACKAGE)?;
    specs.iter().map(|spec| prepare_one(&apt, &madison, spec)).collect()
}

/// The newest version of the spec's line that can be fetched: a mirror may list a package its
/// pool no longer (or not yet) serves (seen with bullseye-security's 5.10.262 behind a proxy), so
/// each older candidate is tried in turn, and every failure is printed.
fn prepare_one(apt: &Apt, madison: &[(String, String)], spec: &KernelSpec) -> anyhow::Result<Kernel> {
    let candidates = pick_versions(madison, spec);
    if candidates.is_empty() {
        bail!(
            "no {METAPACKAGE} {}* in {} (apt-cache madison found: {madison:?})",
            spec.version_prefix,
            spec.suites.join(", ")
        );
    }
    let mut errors = Vec::new();
    for (meta_version, suite) in candidates {
        match prepare_version(apt, spec, &meta_version, &suite) {
            Ok(k) => return Ok(k),
            Err(err) => {
                println!("vm: kernel {}: {METAPACKAGE}={meta_version} ({suite}) unusable: {err:#}", spec.name);
                errors.push(format!("{meta_version}: {err:#}"));
            }
        }
    }
    bail!("no version of kernel {} could be fetched: {}", spec.name, errors.join("; "))
}

fn prepare_version(apt: &Apt, spec: &KernelSpec, meta_version: &str, suite: &str) -> anyhow::Result<Kernel> {
    let (meta_version, suite) = (meta_version.to_string(), suite.to_string());
    let depends = apt.depends(METAPACKAGE, &meta_version)?;
    let package = depends
        .iter()
        .find(|d| d.starts_with("linux-image-") && d.ends_with("-cloud-amd64"))
        .with_context(|| format!("{METAPACKAGE}={meta_version} depends on no linux-image-*-cloud-amd64: {depends:?}"))?
        .clone();
    let abi = package.trim_start_matches("linux-image-").to_string();
    let dir = target_dir().join("vm/kernels").join(&abi);
    let record = dir.join("packages");
    let cached_vmlinuz = dir.join("vmlinuz");
    let config = dir.join("config");

    if cached_vmlinuz.is_file() && record.is_file() {
        let downloaded = fs::read_to_string(&record)?.lines().map(String::from).collect();
        println!("vm: kernel {}: {package} (cached in {})", spec.name, dir.display());
        return Ok(Kernel {
            name: spec.name.to_string(),
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
        "vm: kernel {}: {METAPACKAGE}={meta_version} ({suite}) → {package}; downloading {}",
        spec.name,
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

/// apt-get/apt-cache bound to the private configuration under `target/vm/apt`.
struct Apt {
    dir: PathBuf,
}

impl Apt {
    fn new() -> anyhow::Result<Self> {
        let dir = target_dir().join("vm/apt");
        for sub in ["lists/partial", "cache/archives/partial", "sources.list.d", "preferences.d"] {
            fs::create_dir_all(dir.join(sub)).with_context(|| format!("creating {}", dir.join(sub).display()))?;
        }
        let keyring = "/usr/share/keyrings/debian-archive-keyring.gpg";
        let sources: String = SOURCES
            .iter()
            .map(|(uri, suite)| format!("deb [arch=amd64 signed-by={keyring}] {uri} {suite} main\n"))
            .collect();
        write_if_changed(&dir.join("sources.list"), &sources)?;
        write_if_changed(&dir.join("status"), "")?;
        write_if_changed(&dir.join("preferences"), "")?;
        Ok(Self { dir })
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
            ("APT::Architecture", "amd64".into()),
            ("APT::Architectures", "amd64".into()),
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

    fn update_if_stale(&self) -> anyhow::Result<()> {
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
}

fn write_if_changed(path: &Path, text: &str) -> anyhow::Result<()> {
    if fs::read_to_string(path).ok().as_deref() != Some(text) {
        fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
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
            assert_eq!(select(&[k.name.to_string()]).unwrap()[0].name, k.name);
        }
        let no_btf = select(&["no-btf".into()]).unwrap()[0];
        assert_eq!((no_btf.version_prefix, no_btf.cmdline), ("6.1.", "guard.hide_btf"));
        assert_eq!(select(&["7".into()]).unwrap()[0].name, "7.x");
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
