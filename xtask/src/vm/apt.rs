//! apt-get and apt-cache bound to a private configuration under `target/vm/apt` (its own
//! sources list, package lists, cache and an empty dpkg status), so adding trixie, backports or
//! sid here can never change what the machine itself installs or upgrades. The kernels
//! ([`super::kernels`]), another architecture's user space ([`super::userland`]) and its
//! libraries for `dist --arch` (`dist/cross.rs`) are resolved and downloaded through it.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, SystemTime},
};

use anyhow::{bail, Context as _};

use super::matrix::KERNELS;
use crate::{
    arch::Arch,
    build_ebpf::{run_checked, target_dir},
};

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
    pub(super) fn madison(&self, package: &str) -> anyhow::Result<Vec<(String, String)>> {
        Ok(parse_madison(&self.stdout("apt-cache", &["madison", package])?))
    }

    /// The package names in the `Depends:` of `package=version` (alternatives: the first).
    pub(super) fn depends(&self, package: &str, version: &str) -> anyhow::Result<Vec<String>> {
        let show = self.stdout("apt-cache", &["show", &format!("{package}={version}")])?;
        Ok(parse_depends(&show))
    }

    /// The newest version apt knows of `package` (none: not in any list).
    pub(super) fn candidate(&self, package: &str) -> anyhow::Result<Option<String>> {
        Ok(parse_madison(&self.stdout("apt-cache", &["madison", package])?).into_iter().next().map(|(v, _)| v))
    }

    pub(super) fn download(&self, packages: &[(String, String)], into: &Path) -> anyhow::Result<()> {
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
    fn depends_take_the_first_alternative_without_versions() {
        let show = "Package: x\nDepends: dracut | initramfs-tools (>= 0.120), linux-binary-7.3.4+deb13-cloud-amd64 (= 7.3.4-1~bpo13+1)\n";
        assert_eq!(parse_depends(show), vec!["dracut", "linux-binary-7.3.4+deb13-cloud-amd64"]);
    }
}
