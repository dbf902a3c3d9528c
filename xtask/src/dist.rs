//! `cargo xtask dist [--check]`: the Debian package an operator installs with
//! `apt install ./guard-user_<version>_<arch>.deb` on a machine without Rust.
//!
//! 1. `cargo xtask build --release` (the BPF object embedded); the man pages and completions
//!    rendered here from guard-user's command line (the `guard-cli` crate, [`generate`]); the
//!    unit template printed by the built binary itself (`guard-user __unit`), so the package
//!    installs exactly the unit that binary's `check` compares with;
//! 2. a staging tree `target/dist/root` in Debian's layout (below), files 0644 / 0755, every
//!    mtime clamped to `SOURCE_DATE_EPOCH` (default: the last commit's time);
//! 3. DEBIAN/control (Depends from `dpkg-shlibdeps`), md5sums and the maintainer scripts of
//!    `packaging/debian/`; `dpkg-deb --root-owner-group --build` (no fakeroot: every file is
//!    root's in the archive);
//! 4. with `--check`, [`check`] reads the package back and runs lintian.
//!
//! The last line printed is the package's path, `target/dist/guard-user_<version>_<arch>.deb`.
//!
//! | in the package | from |
//! |---|---|
//! | `/usr/bin/guard-user` | the release build, stripped like dh_strip does |
//! | `/lib/systemd/system/guard-user@.service` | `guard::install::unit_text("/usr/bin")` via `guard-user __unit` |
//! | `/usr/share/man/man8/guard-user*.8.gz` | clap_mangen over `guard-cli` ([`generate`]) |
//! | `/usr/share/man/man5/guard-config.json.5.gz` | `packaging/man/guard-config.json.5` |
//! | `/usr/share/{bash-completion/completions,zsh/vendor-completions,fish/vendor_completions.d}` | clap_complete over `guard-cli` ([`generate`]) |
//! | `/usr/share/doc/guard-user/examples/` | the Grafana dashboard and Prometheus alert rules of `packaging/monitoring/` |
//! | `/usr/share/guard-user/guard-config.json` | `config/guard-config.json` (install's default source on a packaged host) |
//! | `/etc/default/guard-user` | `packaging/debian/default`, a conffile: the flags every instance's `run` gets (`GUARD_ARGS`) |
//! | `/usr/share/doc/guard-user/` | README.md, `docs/*.md`, copyright (DEP-5), changelog.Debian.gz |
use std::{
    env, fs,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _};

use crate::{
    arch::Arch,
    build,
    build_ebpf::is_root,
    build_ebpf::{self, run_checked, which},
};

mod check;
pub mod completion_check;
mod crates;
mod cross;
mod debian;
pub mod generate;
mod monitoring;

#[derive(clap::Args, Debug, Default)]
pub struct Options {
    /// Then check the package: its fields and listing, the man pages and completions, lintian.
    #[arg(long)]
    pub check: bool,
    /// The Maintainer field, "Name <email>" (default: $DEBFULLNAME <$DEBEMAIL>, else git's
    /// user.name <user.email>, else the project's maintainers from Cargo.toml).
    #[arg(long, value_name = "NAME <EMAIL>")]
    pub maintainer: Option<String>,
    /// The Debian revision after the workspace version (0.1.0-<REVISION>).
    #[arg(long, value_name = "REVISION", default_value = "1")]
    pub revision: String,
    /// The package's architecture: amd64 (the build machine's) or arm64 (cross-built; its
    /// `Depends` computed against Debian's arm64 libraries, its unit printed by the arm64
    /// binary under qemu-user).
    #[arg(long, value_enum, default_value_t = Arch::host())]
    pub arch: Arch,
}

pub const PACKAGE: &str = "guard-user";
/// Where the generated files go, by the name [`build`] gives them in `target/dist/generated`.
const GENERATED: &[(&str, &str)] = &[
    ("guard-user@.service", "lib/systemd/system/guard-user@.service"),
    ("guard-user.bash", "usr/share/bash-completion/completions/guard-user"),
    ("_guard-user", "usr/share/zsh/vendor-completions/_guard-user"),
    ("guard-user.fish", "usr/share/fish/vendor_completions.d/guard-user.fish"),
];
const MAN_DIR: &str = "usr/share/man/man8";
const MAN5_DIR: &str = "usr/share/man/man5";
const DOC_DIR: &str = "usr/share/doc/guard-user";
/// The monitoring examples ([`monitoring::FILES`]), uncompressed so they can be used as they are.
const EXAMPLES_DIR: &str = "usr/share/doc/guard-user/examples";
pub const CONFIG: &str = "usr/share/guard-user/guard-config.json";
/// The operator's settings the unit reads (`EnvironmentFile=-/etc/default/guard-user`): a
/// conffile, so dpkg keeps an operator's edit across upgrades and asks before replacing it.
pub const DEFAULTS: &str = "etc/default/guard-user";
/// Docs over this size are gzipped, as dh_compress does (Debian policy 12.3).
const COMPRESS_OVER: u64 = 4096;

pub fn run(opts: Options) -> anyhow::Result<()> {
    let deb = build(&opts)?;
    if opts.check {
        check::run(&deb, opts.arch)?;
    }
    println!("{}", deb.display());
    Ok(())
}

/// Builds the package and returns its path.
pub fn build(opts: &Options) -> anyhow::Result<PathBuf> {
    let root_dir = build_ebpf::workspace_root();
    let epoch = source_date_epoch(&root_dir)?;
    let version = format!("{}-{}", env!("CARGO_PKG_VERSION"), opts.revision);
    let arch = opts.arch.debian();
    let (maintainer, from) = maintainer(opts.maintainer.as_deref(), &root_dir)?;
    println!("dist: {PACKAGE} {version} {arch}, SOURCE_DATE_EPOCH={epoch}, Maintainer: {maintainer} (from {from})");

    let binary = build::build_for(true, opts.arch)?;
    let dist = build_ebpf::target_dir().join("dist");
    let root = dist.join("root");
    if root.exists() {
        fs::remove_dir_all(&root).with_context(|| format!("removing the previous {}", root.display()))?;
    }
    let generated = dist.join("generated");
    if generated.exists() {
        fs::remove_dir_all(&generated).with_context(|| format!("removing {}", generated.display()))?;
    }
    fs::create_dir_all(&generated).with_context(|| format!("creating {}", generated.display()))?;
    let date = debian::iso_date(epoch);
    for page in generate::man_pages(&date, env!("CARGO_PKG_VERSION")).context("rendering the man pages")? {
        write_file(&generated.join(&page.name), &page.bytes, 0o644)?;
    }
    for (shell, name) in [
        (clap_complete::Shell::Bash, "guard-user.bash"),
        (clap_complete::Shell::Zsh, "_guard-user"),
        (clap_complete::Shell::Fish, "guard-user.fish"),
    ] {
        write_file(&generated.join(name), &generate::completion(shell), 0o644)?;
    }
    let unit =
        output_bytes(opts.arch.run_command(&binary)?.args(["__unit", "--bin-dir", "/usr/bin"]), "guard-user __unit")?;
    write_file(&generated.join("guard-user@.service"), &unit, 0o644)?;

    // The binary, stripped of its symbols and debug info (dh_strip's options for executables).
    let bin = root.join("usr/bin/guard-user");
    install_file(&binary, &bin, 0o755)?;
    let strip = opts.arch.binutil("strip");
    if opts.arch.is_host() {
        ensure_tool("strip", "binutils")?;
    }
    run_checked(Command::new(&strip).args(["--remove-section=.comment", "--remove-section=.note"]).arg(&bin), &strip)?;
    for (name, dest) in GENERATED {
        install_file(&generated.join(name), &root.join(dest), 0o644)?;
    }
    let mut pages: Vec<_> = fs::read_dir(&generated)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "8"))
        .collect();
    pages.sort();
    anyhow::ensure!(pages.iter().any(|p| p.ends_with("guard-user.8")), "no guard-user.8 was rendered");
    for page in &pages {
        let dest = root.join(MAN_DIR).join(page.file_name().unwrap());
        install_file(page, &dest, 0o644)?;
        gzip(&dest)?;
    }
    let config_page = root.join(MAN5_DIR).join("guard-config.json.5");
    install_file(&root_dir.join(generate::CONFIG_PAGE), &config_page, 0o644)?;
    gzip(&config_page)?;
    install_file(&root_dir.join("config/guard-config.json"), &root.join(CONFIG), 0o644)?;
    install_file(&root_dir.join("packaging/debian/default"), &root.join(DEFAULTS), 0o644)?;
    docs(&root_dir, &root.join(DOC_DIR), &maintainer, &version, epoch)?;
    let overrides = root_dir.join("packaging/debian/lintian-overrides");
    if overrides.exists() {
        install_file(&overrides, &root.join("usr/share/lintian/overrides").join(PACKAGE), 0o644)?;
    }

    // DEBIAN/: the control file last, since Installed-Size counts everything else.
    let control_dir = root.join("DEBIAN");
    for script in ["postinst", "prerm", "postrm"] {
        install_file(&root_dir.join("packaging/debian").join(script), &control_dir.join(script), 0o755)?;
    }
    write_file(&control_dir.join("conffiles"), format!("/{DEFAULTS}\n").as_bytes(), 0o644)?;
    let (files, others) = walk(&root)?;
    let payload: Vec<&PathBuf> = files.iter().filter(|f| !f.starts_with("DEBIAN")).collect();
    write_file(&control_dir.join("md5sums"), md5sums(&root, &payload)?.as_bytes(), 0o644)?;
    let sizes = payload.iter().map(|f| fs::metadata(root.join(f)).map(|m| m.len())).collect::<Result<Vec<_>, _>>()?;
    let payload_dirs = others.iter().filter(|d| !d.starts_with("DEBIAN")).count() as u64;
    let depends = shlib_depends(&dist, &bin, opts.arch)?;
    let template = fs::read_to_string(root_dir.join("packaging/debian/control.in"))?;
    let control = debian::control(
        &template,
        &debian::Control {
            version: &version,
            arch,
            maintainer: &maintainer,
            installed_size_kib: debian::installed_size_kib(&sizes, payload_dirs),
            depends: &depends,
        },
    )?;
    write_file(&control_dir.join("control"), control.as_bytes(), 0o644)?;
    clamp_mtimes(&root, epoch)?;

    let deb = dist.join(format!("{PACKAGE}_{version}_{arch}.deb"));
    run_checked(
        Command::new("dpkg-deb")
            .args(["--root-owner-group", "-Zxz", "--build"])
            .arg(&root)
            .arg(&deb)
            .env("SOURCE_DATE_EPOCH", epoch.to_string())
            .stdout(std::process::Stdio::null()),
        "dpkg-deb --build",
    )?;
    let size = fs::metadata(&deb)?.len();
    println!("dist: {} ({} KiB; Installed-Size {} KiB; Depends: {depends})", deb.display(), size / 1024, {
        debian::installed_size_kib(&sizes, payload_dirs)
    });
    Ok(deb)
}

/// `SOURCE_DATE_EPOCH` when set, else the last commit's time: the same commit gives the same dates.
fn source_date_epoch(root: &Path) -> anyhow::Result<u64> {
    if let Ok(value) = env::var("SOURCE_DATE_EPOCH") {
        return value.trim().parse().with_context(|| format!("SOURCE_DATE_EPOCH={value:?} is not a number"));
    }
    let out = output(Command::new("git").args(["log", "-1", "--format=%ct"]).current_dir(root), "git log")?;
    out.parse().with_context(|| format!("git log printed {out:?} for the commit time"))
}

/// The Maintainer field, and where it came from: `--maintainer`, then Debian's `$DEBFULLNAME
/// <$DEBEMAIL>`, then git's `user.name <user.email>` (who builds the package), then the project's
/// maintainers as the workspace's Cargo.toml declares them, so a build machine without an identity
/// still writes a real address, never a placeholder or nothing.
fn maintainer(given: Option<&str>, root: &Path) -> anyhow::Result<(String, &'static str)> {
    if let Some(m) = given {
        return Ok((m.to_string(), "--maintainer"));
    }
    if let (Ok(name), Ok(email)) = (env::var("DEBFULLNAME"), env::var("DEBEMAIL")) {
        return Ok((format!("{name} <{email}>"), "$DEBFULLNAME <$DEBEMAIL>"));
    }
    let git = |key: &str| output(Command::new("git").args(["config", key]).current_dir(root), "git config");
    if let (Ok(name), Ok(email)) = (git("user.name"), git("user.email")) {
        if !name.is_empty() && !email.is_empty() {
            return Ok((format!("{name} <{email}>"), "git config user.name/user.email"));
        }
    }
    let project = env!("CARGO_PKG_AUTHORS").split(':').next().unwrap_or_default().trim();
    anyhow::ensure!(
        project.contains('<'),
        "Cargo.toml's workspace authors has no \"Name <email>\" to use as Maintainer"
    );
    Ok((project.to_string(), "the project's maintainers (Cargo.toml authors)"))
}

/// README, the operator docs present at build time, copyright and changelog.Debian.gz.
fn docs(root_dir: &Path, doc: &Path, maintainer: &str, version: &str, epoch: u64) -> anyhow::Result<()> {
    let mut sources = vec![(root_dir.join("README.md"), doc.join("README.md"))];
    let mut pages: Vec<PathBuf> = fs::read_dir(root_dir.join("docs"))
        .context("reading docs/")?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    // docs/notes-*.md are working notes between developers, folded into the docs later.
    pages.retain(|p| {
        p.extension().is_some_and(|e| e == "md")
            && !p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("notes-"))
    });
    pages.sort();
    for page in pages {
        let name = page.file_name().unwrap().to_owned();
        sources.push((page, doc.join("docs").join(name)));
    }
    for (src, dest) in sources {
        install_file(&src, &dest, 0o644)?;
        if fs::metadata(&dest)?.len() > COMPRESS_OVER {
            gzip(&dest)?;
        }
    }
    let examples = doc.join("examples");
    for name in monitoring::FILES {
        install_file(&root_dir.join(monitoring::SOURCE_DIR).join(name), &examples.join(name), 0o644)?;
    }
    let commit = output(Command::new("git").args(["rev-parse", "--short=12", "HEAD"]).current_dir(root_dir), "git")?;
    let crates = crates::linked(root_dir)?;
    write_file(&doc.join("copyright"), debian::copyright(maintainer, epoch, &crates).as_bytes(), 0o644)?;
    let changelog = doc.join("changelog.Debian");
    write_file(&changelog, debian::changelog(version, maintainer, &commit, epoch).as_bytes(), 0o644)?;
    gzip(&changelog)
}

/// `Depends:` from dpkg-shlibdeps, which maps each shared library the binary needs (and the
/// newest symbol version it uses) to the package and minimum version providing it. For another
/// architecture, against that architecture's own library packages ([`cross::Libraries`]).
fn shlib_depends(dist: &Path, bin: &Path, arch: Arch) -> anyhow::Result<String> {
    ensure_tool("dpkg-shlibdeps", "dpkg-dev")?;
    // dpkg-shlibdeps wants to run in a source tree: a debian/control naming the package is enough.
    let tree = dist.join("shlibdeps");
    write_file(
        &tree.join("debian/control"),
        format!("Source: guard\n\nPackage: {PACKAGE}\nArchitecture: any\n").as_bytes(),
        0o644,
    )?;
    let mut shlibdeps = Command::new("dpkg-shlibdeps");
    if !arch.is_host() {
        cross::Libraries::prepare(arch, &dist.join(format!("libs-{}", arch.debian())))?.configure(&mut shlibdeps);
    }
    let out = output(shlibdeps.arg("-O").arg(format!("-e{}", bin.display())).current_dir(&tree), "dpkg-shlibdeps")?;
    let depends = out
        .lines()
        .find_map(|l| l.strip_prefix("shlibs:Depends="))
        .with_context(|| format!("dpkg-shlibdeps printed no shlibs:Depends: {out}"))?;
    Ok(depends.to_string())
}

fn md5sums(root: &Path, files: &[&PathBuf]) -> anyhow::Result<String> {
    let out = output(Command::new("md5sum").arg("--").args(files).current_dir(root), "md5sum")?;
    Ok(out + "\n")
}

/// Every regular file (sorted, relative to `root`) and every other entry (directories).
fn walk(root: &Path) -> anyhow::Result<(Vec<PathBuf>, Vec<PathBuf>)> {
    fn go(root: &Path, rel: &Path, files: &mut Vec<PathBuf>, others: &mut Vec<PathBuf>) -> anyhow::Result<()> {
        let mut entries: Vec<_> =
            fs::read_dir(root.join(rel))?.map(|e| e.map(|e| e.file_name())).collect::<Result<_, _>>()?;
        entries.sort();
        for name in entries {
            let path = rel.join(&name);
            let meta = fs::symlink_metadata(root.join(&path))?;
            if meta.is_dir() {
                others.push(path.clone());
                go(root, &path, files, others)?;
            } else if meta.is_file() {
                files.push(path);
            } else {
                bail!("{}: only files and directories go into the package", path.display());
            }
        }
        Ok(())
    }
    let (mut files, mut others) = (Vec::new(), Vec::new());
    go(root, Path::new(""), &mut files, &mut others)?;
    Ok((files, others))
}

/// Every mtime in the tree set to `epoch` (dpkg-deb clamps too; this also covers the directories).
fn clamp_mtimes(root: &Path, epoch: u64) -> anyhow::Result<()> {
    let (files, dirs) = walk(root)?;
    let time = std::time::UNIX_EPOCH + std::time::Duration::from_secs(epoch);
    for rel in files.iter().chain(dirs.iter().rev()).map(|p| root.join(p)).chain([root.to_path_buf()]) {
        let file = fs::File::open(&rel).with_context(|| format!("opening {}", rel.display()))?;
        file.set_modified(time).with_context(|| format!("setting the mtime of {}", rel.display()))?;
    }
    Ok(())
}

/// Copies `src` to `dest` with `mode`, creating the parents 0755.
fn install_file(src: &Path, dest: &Path, mode: u32) -> anyhow::Result<()> {
    let bytes = fs::read(src).with_context(|| format!("reading {}", src.display()))?;
    write_file(dest, &bytes, mode)
}

fn write_file(dest: &Path, bytes: &[u8], mode: u32) -> anyhow::Result<()> {
    let parent = dest.parent().expect("a file in a directory");
    fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    let mut dir = parent;
    // create_dir_all honours the umask; the package wants 0755 whatever it is.
    while dir.file_name().is_some() && fs::metadata(dir)?.permissions().mode() & 0o777 != 0o755 {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o755))?;
        dir = dir.parent().unwrap();
    }
    fs::write(dest, bytes).with_context(|| format!("writing {}", dest.display()))?;
    fs::set_permissions(dest, fs::Permissions::from_mode(mode)).with_context(|| format!("chmod {}", dest.display()))
}

/// `gzip -9n`: no name or timestamp in the header, so the bytes depend on the content alone.
fn gzip(path: &Path) -> anyhow::Result<()> {
    run_checked(Command::new("gzip").args(["-9nf", "--"]).arg(path), "gzip")
}

fn ensure_tool(tool: &str, package: &str) -> anyhow::Result<()> {
    if which(tool).is_some() {
        return Ok(());
    }
    if !is_root() {
        bail!("dist needs {tool}: apt-get install {package} (as root), then run again");
    }
    println!("dist: installing {package} for {tool} (apt-get install -y {package})");
    run_checked(
        Command::new("apt-get").args(["install", "-y", "-q", package]).env("DEBIAN_FRONTEND", "noninteractive"),
        &format!("apt-get install {package}"),
    )
}

/// A command's stdout as it is; fails with its stderr.
fn output_bytes(cmd: &mut Command, what: &str) -> anyhow::Result<Vec<u8>> {
    let out = cmd.output().with_context(|| format!("{what}: could not start {:?}", cmd.get_program()))?;
    if !out.status.success() {
        bail!("{what} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(out.stdout)
}

/// A command's stdout, trimmed; fails with its stderr.
fn output(cmd: &mut Command, what: &str) -> anyhow::Result<String> {
    let out = cmd.output().with_context(|| format!("{what}: could not start {:?}", cmd.get_program()))?;
    if !out.status.success() {
        bail!("{what} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}
