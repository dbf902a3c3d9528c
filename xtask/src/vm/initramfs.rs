//! The guest's whole root filesystem: one uncompressed newc cpio the kernel unpacks into RAM.
//!
//! Layout (merged-/usr like Debian, so paths `ldd` prints on the host resolve the same way):
//! - `/init`: vm-init (static); `/tests/<package>.<target>`: the test binaries the guests run
//!   (their own libtest arguments in `/etc/guard-vm/args/<name>`), with their libraries;
//! - `/usr/bin/guard-user` (and `guard-probe` when built): what the tests start;
//! - [`HOST_TOOLS`] (bash, sleep, true and a few coreutils) and the optional tools, with the
//!   shared libraries `ldd` names for them (some tests use bash as an oracle), `/bin/sh` → bash;
//!   `/bin`, `/sbin`, `/lib`, `/lib64` → `usr/…`;
//! - `/etc/passwd` and `/etc/group` with root, nobody (65534) and the test accounts guardtest1
//!   (4201) and guardtest2 (4202), whose homes exist and belong to them;
//! - the workspace's `config/` at its host path, and its package directories (empty), so test
//!   paths built from `env!("CARGO_MANIFEST_DIR")` resolve;
//! - `/dev/console`, so the kernel can give vm-init its stdout before devtmpfs is mounted;
//! - `/etc/guard-vm/{test-args,env}`: what vm-init passes on to every test binary.
use std::{
    collections::BTreeMap,
    fs,
    io::BufWriter,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _};

use super::{
    cpio::{CpioWriter, Owner},
    payload::{GuestBin, GuestTest},
    userland::Userland,
};
use crate::build_ebpf::{self, which};

/// Host programs copied in with their libraries: tests run bash, sleep and true by name; the
/// coreutils are for shell snippets (a test's script that calls a missing one does not fail
/// loudly: `$(cat f 2>/dev/null || echo x)` just answers x, which is how the install tests once
/// failed in the guests).
const HOST_TOOLS: &[&str] = &["bash", "sleep", "true", "cat", "env", "id", "grep", "ls", "mkdir", "rm"];
/// Copied in when the host has them; without redis-server the guests do not require `redis`,
/// without lsof the holders tests check their expected holders alone, and without script the
/// slots' interactive-shell test fails saying so (a guest of another architecture takes both
/// from its own packages, [`super::userland::PACKAGES`]).
const OPTIONAL_HOST_TOOLS: &[&str] = &["unshare", "setpriv", "redis-server", "redis-cli", "lsof", "script"];
/// Workspace directories tests read through `env!("CARGO_MANIFEST_DIR")`; copied to the same
/// absolute path in the guest.
const FIXTURE_DIRS: &[&str] = &["config", "guard-user/tests/fixtures"];
/// Test accounts (name, uid); their gid equals the uid. Must match tests/src/lib.rs.
pub const TEST_ACCOUNTS: &[(&str, u32)] = &[("guardtest1", 4201), ("guardtest2", 4202)];

/// What goes into the image besides the fixed layout.
pub struct Payload<'a> {
    pub init: PathBuf,
    /// Under /tests, with their own arguments under /etc/guard-vm/args/.
    pub tests: &'a [GuestTest],
    /// Under /usr/bin.
    pub bins: &'a [GuestBin],
    /// Appended to every test binary's command line.
    pub test_args: Vec<String>,
    /// Added to every test binary's environment.
    pub env: Vec<(String, String)>,
    /// Where the programs and libraries come from for a guest of another architecture than the
    /// build machine's (None: the build machine's own, found with `ldd`).
    pub userland: Option<&'a Userland>,
    /// Extra files (the package scenario's .deb).
    pub extra: Vec<ExtraFile>,
}

/// A file the image carries besides the fixed layout: `(guest path, mode, host file)`.
pub type ExtraFile = (String, u32, PathBuf);

/// A library as `(guest path, file to copy)`.
type Library = (PathBuf, PathBuf);

enum Node {
    Dir(Owner),
    File(Owner, Content),
    Symlink(String),
    CharDevice(Owner, u32, u32),
}

enum Content {
    Host(PathBuf),
    Bytes(Vec<u8>),
}

/// Paths (relative, `usr/bin/bash`) to nodes; sorted order puts every directory before its
/// children, which is the order the kernel needs them in.
#[derive(Default)]
struct Image(BTreeMap<String, Node>);

impl Image {
    fn add(&mut self, path: &str, node: Node) {
        let path = path.trim_start_matches('/').to_string();
        if let Some((parent, _)) = path.rsplit_once('/') {
            self.mkdir(parent, Owner::root(0o755));
        }
        self.0.insert(path, node);
    }

    /// Creates `path` and its missing parents; leaves existing ones as they are.
    fn mkdir(&mut self, path: &str, owner: Owner) {
        let path = path.trim_start_matches('/');
        if self.0.contains_key(path) {
            return;
        }
        self.add(path, Node::Dir(owner));
    }

    fn text(&mut self, path: &str, mode: u32, text: String) {
        self.add(path, Node::File(Owner::root(mode), Content::Bytes(text.into_bytes())));
    }

    fn host_file(&mut self, path: &str, mode: u32, source: &Path) {
        self.add(path, Node::File(Owner::root(mode), Content::Host(source.to_path_buf())));
    }

    fn write(&self, path: &Path) -> anyhow::Result<u64> {
        let file = fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
        let mut cpio = CpioWriter::new(BufWriter::new(file));
        for (name, node) in &self.0 {
            let result = match node {
                Node::Dir(owner) => cpio.dir(name, *owner),
                Node::Symlink(target) => cpio.symlink(name, target),
                Node::CharDevice(owner, major, minor) => cpio.char_device(name, *owner, *major, *minor),
                Node::File(owner, Content::Bytes(bytes)) => cpio.file(name, *owner, bytes),
                Node::File(owner, Content::Host(source)) => {
                    let bytes =
                        fs::read(source).with_context(|| format!("reading {} for /{name}", source.display()))?;
                    cpio.file(name, *owner, &bytes)
                }
            };
            result.with_context(|| format!("writing /{name} to {}", path.display()))?;
        }
        cpio.finish()?;
        Ok(fs::metadata(path)?.len())
    }
}

/// Writes the image to `path` and returns its size in bytes.
pub fn write(path: &Path, payload: &Payload) -> anyhow::Result<u64> {
    let mut image = Image::default();
    for (link, target) in [("bin", "usr/bin"), ("sbin", "usr/sbin"), ("lib", "usr/lib"), ("lib64", "usr/lib64")] {
        image.mkdir(target, Owner::root(0o755));
        image.add(link, Node::Symlink(target.into()));
    }
    for dir in ["proc", "sys", "run", "etc", "tests", "var/tmp", "home"] {
        image.mkdir(dir, Owner::root(0o755));
    }
    image.mkdir("tmp", Owner::root(0o1777));
    image.mkdir("root", Owner::root(0o700));
    image.mkdir("dev", Owner::root(0o755));
    image.add("dev/console", Node::CharDevice(Owner::root(0o600), 5, 1));
    image.add("dev/null", Node::CharDevice(Owner::root(0o666), 1, 3));

    image.host_file("init", 0o755, &payload.init);
    let mut libraries = Vec::new();
    let libs = payload.userland;
    for test in payload.tests {
        image.host_file(&format!("tests/{}", test.name), 0o755, &test.binary);
        if !test.args.is_empty() {
            let args = test.args.iter().map(|a| format!("{a}\n")).collect();
            image.text(&format!("etc/guard-vm/args/{}", test.name), 0o644, args);
        }
        libraries.extend(shared_libraries(&test.binary, libs)?);
    }
    for bin in payload.bins {
        image.host_file(&format!("usr/bin/{}", bin.name), 0o755, &bin.binary);
        // Tests built by cargo find their package's binaries at `env!("CARGO_BIN_EXE_<name>")`,
        // the build's host path (the pattern worker is `guard-user __pattern-worker`).
        image.add(bin.built.to_string_lossy().trim_start_matches('/'), Node::Symlink(format!("/usr/bin/{}", bin.name)));
        libraries.extend(shared_libraries(&bin.binary, libs)?);
    }
    add_libraries(&mut image, libraries)?;
    match libs {
        None => add_host_tools(&mut image)?,
        Some(userland) => add_userland_tools(&mut image, userland)?,
    }
    for (path, mode, file) in &payload.extra {
        image.host_file(path, *mode, file);
    }
    image.add("usr/bin/sh", Node::Symlink("bash".into()));
    add_accounts(&mut image);
    // `env!("CARGO_MANIFEST_DIR")/../config/…` only resolves if every package directory exists.
    let root = build_ebpf::workspace_root();
    for entry in fs::read_dir(&root).with_context(|| format!("reading {}", root.display()))? {
        let path = entry?.path();
        if path.is_dir() && path.join("Cargo.toml").is_file() {
            image.mkdir(&path.to_string_lossy(), Owner::root(0o755));
        }
    }
    for dir in FIXTURE_DIRS {
        add_tree(&mut image, &root.join(dir))?;
    }
    image.text("etc/guard-vm/test-args", 0o644, payload.test_args.iter().map(|a| format!("{a}\n")).collect());
    image.text("etc/guard-vm/env", 0o644, payload.env.iter().map(|(k, v)| format!("{k}={v}\n")).collect());
    image.write(path)
}

fn add_accounts(image: &mut Image) {
    let mut passwd = String::from("root:x:0:0:root:/root:/bin/bash\n");
    let mut group = String::from("root:x:0:\n");
    for &(name, uid) in TEST_ACCOUNTS {
        passwd.push_str(&format!("{name}:x:{uid}:{uid}:guard test account:/home/{name}:/bin/bash\n"));
        group.push_str(&format!("{name}:x:{uid}:\n"));
        image.mkdir(&format!("home/{name}"), Owner { mode: 0o755, uid, gid: uid });
    }
    // Debian's unprivileged account (the pattern worker's uid; some tests guard it).
    passwd.push_str("nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n");
    group.push_str("nogroup:x:65534:\n");
    image.text("etc/passwd", 0o644, passwd);
    image.text("etc/group", 0o644, group);
    image.text("etc/nsswitch.conf", 0o644, "passwd: files\ngroup: files\nshadow: files\nhosts: files\n".into());
    image.text("etc/hosts", 0o644, "127.0.0.1 localhost\n::1 localhost\n".into());
    image.text("etc/hostname", 0o644, "guard-vm\n".into());
}

/// Copies each host tool and every library `ldd` names for it. Statically linked glibc
/// programs `dlopen` the NSS module for /etc/passwd lookups, so it comes along when present.
fn add_host_tools(image: &mut Image) -> anyhow::Result<()> {
    let mut libraries = Vec::new();
    let required = HOST_TOOLS
        .iter()
        .map(|tool| which(tool).map(Some).with_context(|| format!("{tool} is not on PATH; the VM image needs it")));
    let optional = OPTIONAL_HOST_TOOLS.iter().map(|tool| Ok(which(tool)));
    for path in required.chain(optional) {
        let Some(path) = path? else { continue };
        image.host_file(&image_path(&path), 0o755, &fs::canonicalize(&path)?);
        libraries.extend(shared_libraries(&path, None)?);
    }
    for nss in ["/lib/x86_64-linux-gnu/libnss_files.so.2", "/lib/x86_64-linux-gnu/libc.so.6"] {
        if Path::new(nss).exists() {
            libraries.push((PathBuf::from(nss), PathBuf::from(nss)));
        }
    }
    add_libraries(image, libraries)
}

/// [`add_host_tools`] for a guest of another architecture: the same programs from its
/// packages ([`Userland`]), with dpkg and what it runs for the package scenario, and a dpkg
/// database that lists the unpacked packages.
fn add_userland_tools(image: &mut Image, userland: &Userland) -> anyhow::Result<()> {
    let mut libraries = Vec::new();
    // dpkg, what it runs or insists on finding (ldconfig, start-stop-daemon), and what the
    // package scenario's script and the maintainer scripts call.
    let dpkg_tools = [
        "dpkg",
        "dpkg-deb",
        "dpkg-query",
        "dpkg-split",
        "dpkg-divert",
        "dpkg-trigger",
        "ldconfig",
        "start-stop-daemon",
        "tar",
        "sed",
        "find",
        "chmod",
        "chown",
        "ln",
        "mv",
        "cp",
        "touch",
        "head",
        "tail",
        "wc",
        "sort",
        "seq",
        "rmdir",
        "uname",
        "basename",
        "dirname",
        "readlink",
        "expr",
        "stat",
        "diff",
    ];
    let required = HOST_TOOLS.iter().map(|&t| (t, true));
    let optional = OPTIONAL_HOST_TOOLS.iter().chain(dpkg_tools.iter()).map(|&t| (t, false));
    for (tool, needed) in required.chain(optional) {
        let Some(path) = userland.tool(tool) else {
            anyhow::ensure!(!needed, "{tool} is in none of the packages of {}", userland.root.display());
            continue;
        };
        let guest = userland.guest_path(&path)?;
        image.host_file(&image_path(&guest), 0o755, &path);
        libraries.extend(userland.libraries(&path)?);
    }
    let gnu = userland.arch.gnu();
    for nss in [format!("lib/{gnu}/libnss_files.so.2"), format!("lib/{gnu}/libc.so.6")] {
        let file = userland.root.join(&nss);
        if file.exists() {
            libraries.push((Path::new("/").join(&nss), file));
        }
    }
    add_libraries(image, libraries)?;
    for dir in [
        "var/lib/dpkg/info",
        "var/lib/dpkg/updates",
        "var/lib/dpkg/triggers",
        "var/lib/dpkg/alternatives",
        "etc/dpkg/dpkg.cfg.d",
        "var/log",
    ] {
        image.mkdir(dir, Owner::root(0o755));
    }
    image.text("var/lib/dpkg/status", 0o644, userland.dpkg_status());
    image.text("var/lib/dpkg/info/format", 0o644, "1\n".into());
    for (name, list) in userland.dpkg_lists() {
        image.text(&format!("var/lib/dpkg/info/{name}"), 0o644, list.clone());
    }
    image.text("var/lib/dpkg/available", 0o644, String::new());
    image.text("etc/dpkg/dpkg.cfg", 0o644, String::new());
    Ok(())
}

/// Each shared library at its guest path (the loader finds them where `ldd` or the ELF
/// headers said), copied from the file behind it.
fn add_libraries(image: &mut Image, libraries: Vec<Library>) -> anyhow::Result<()> {
    for (guest, file) in libraries {
        let real = fs::canonicalize(&file).with_context(|| format!("resolving {}", file.display()))?;
        image.host_file(&image_path(&guest), 0o755, &real);
    }
    Ok(())
}

/// Copies a host directory's regular files (recursively) to the same absolute path.
fn add_tree(image: &mut Image, dir: &Path) -> anyhow::Result<()> {
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let meta = fs::metadata(&path)?;
        if meta.is_dir() {
            add_tree(image, &path)?;
        } else if meta.is_file() {
            use std::os::unix::fs::PermissionsExt as _;
            image.host_file(&path.to_string_lossy(), meta.permissions().mode() & 0o7777, &path);
        }
    }
    Ok(())
}

/// Where a host path lives in the merged-/usr image: `/lib64/ld-linux…` → `usr/lib64/ld-linux…`.
fn image_path(host: &Path) -> String {
    let host = host.to_string_lossy();
    for dir in ["bin", "sbin", "lib", "lib64"] {
        if let Some(rest) = host.strip_prefix(&format!("/{dir}/")) {
            return format!("usr/{dir}/{rest}");
        }
    }
    host.trim_start_matches('/').to_string()
}

/// The libraries `binary` loads: from `ldd` on the build machine, else from the guest's own
/// packages ([`Userland::libraries`]). A script (the package scenario's) loads none itself.
fn shared_libraries(binary: &Path, userland: Option<&Userland>) -> anyhow::Result<Vec<Library>> {
    let mut magic = [0u8; 4];
    let is_elf = std::io::Read::read_exact(&mut fs::File::open(binary)?, &mut magic).is_ok() && magic == *b"\x7fELF";
    if !is_elf {
        return Ok(Vec::new());
    }
    if let Some(userland) = userland {
        return userland.libraries(binary);
    }
    let out = Command::new("ldd").arg(binary).output().context("running ldd")?;
    if !out.status.success() {
        bail!("ldd {} failed: {}", binary.display(), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(parse_ldd(&String::from_utf8_lossy(&out.stdout)).into_iter().map(|p| (p.clone(), p)).collect())
}

/// `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)` and `/lib64/ld-linux-x86-64.so.2 (0x…)`.
fn parse_ldd(text: &str) -> Vec<PathBuf> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            let path = match line.split_once("=>") {
                Some((_, right)) => right.split_whitespace().next()?,
                None => line.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_lines_name_libraries_and_the_loader_but_not_the_vdso() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibtinfo.so.6 => /lib/x86_64-linux-gnu/libtinfo.so.6 (0x1)\n\
                    \t/lib64/ld-linux-x86-64.so.2 (0x2)\n\tnotfound.so => not found\n";
        assert_eq!(
            parse_ldd(text),
            vec![PathBuf::from("/lib/x86_64-linux-gnu/libtinfo.so.6"), PathBuf::from("/lib64/ld-linux-x86-64.so.2")]
        );
    }

    #[test]
    fn host_paths_map_into_the_merged_usr_image() {
        assert_eq!(image_path(Path::new("/lib64/ld-linux-x86-64.so.2")), "usr/lib64/ld-linux-x86-64.so.2");
        assert_eq!(image_path(Path::new("/usr/bin/bash")), "usr/bin/bash");
        assert_eq!(image_path(Path::new("/bin/sleep")), "usr/bin/sleep");
    }

    #[test]
    fn parents_come_before_children_and_keep_their_owner() {
        let mut image = Image::default();
        image.mkdir("home/guardtest1", Owner { mode: 0o755, uid: 4201, gid: 4201 });
        image.text("home/guardtest1/.profile", 0o644, String::new());
        let names: Vec<_> = image.0.keys().map(String::as_str).collect();
        assert_eq!(names, ["home", "home/guardtest1", "home/guardtest1/.profile"]);
        assert!(matches!(image.0["home/guardtest1"], Node::Dir(Owner { uid: 4201, .. })));
    }
}
