//! `Depends:` of a cross-built package, from the target architecture's own library packages.
//!
//! dpkg-shlibdeps maps each library the binary needs to the package that ships it and reads
//! that package's `symbols` (or `shlibs`) file from the dpkg database. On the build machine the
//! arm64 C library is only there as Debian's cross package (`libc6-arm64-cross`, under
//! `/usr/aarch64-linux-gnu`), whose database entry names `libc6-arm64-cross`, not `libc6`, and
//! has no symbols file: a `Depends` computed from it is wrong (`libgcc-s1-arm64-cross`). The
//! machine's own dpkg database never gets a foreign architecture either.
//!
//! So the packages an arm64 guard-user links against (libc6, libgcc-s1 and what they depend
//! on, resolved and downloaded by apt through the private arm64 configuration of `cargo xtask
//! vm`) are unpacked into a directory beside a private dpkg database (`--admindir`) that lists
//! exactly them: their control files as `status` entries, their files (at the unpacked paths)
//! in `info/<package>:<arch>.list`, their `symbols`/`shlibs` files. dpkg-shlibdeps then runs as
//! it would on an arm64 machine (`DEB_HOST_ARCH`, the unpacked library directories with `-l`).
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _};

use crate::{arch::Arch, build_ebpf::run_checked, vm::apt::Apt};

/// What a Rust binary links (`NEEDED`: libc.so.6, libm.so.6, libgcc_s.so.1): their packages.
const LIBRARY_PACKAGES: &[&str] = &["libc6", "libgcc-s1"];

pub struct Libraries {
    arch: Arch,
    root: PathBuf,
    admin: PathBuf,
}

impl Libraries {
    /// Downloads (apt's cache keeps them) and unpacks the library packages into `dir`.
    pub fn prepare(arch: Arch, dir: &Path) -> anyhow::Result<Libraries> {
        let apt = Apt::new(arch)?;
        apt.update_if_stale()?;
        let debs = apt.download_closure(LIBRARY_PACKAGES)?;
        if dir.exists() {
            fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
        }
        let (root, admin) = (dir.join("root"), dir.join("admin"));
        fs::create_dir_all(admin.join("info"))?;
        fs::create_dir_all(admin.join("updates"))?;
        let mut status = String::new();
        for deb in &debs {
            let control = dir.join("control");
            let _ = fs::remove_dir_all(&control);
            run_checked(Command::new("dpkg-deb").arg("-x").arg(deb).arg(&root), "dpkg-deb -x")?;
            run_checked(Command::new("dpkg-deb").arg("-e").arg(deb).arg(&control), "dpkg-deb -e")?;
            let fields = fs::read_to_string(control.join("control"))?;
            let package = field(&fields, "Package").with_context(|| format!("{}: no Package field", deb.display()))?;
            let entry = format!("{package}:{}", arch.debian());
            let mut lines: Vec<&str> = fields.lines().collect();
            lines.insert(1, "Status: install ok installed");
            status.push_str(&lines.join("\n"));
            status.push_str("\n\n");
            for file in ["symbols", "shlibs"] {
                if control.join(file).is_file() {
                    fs::copy(control.join(file), admin.join("info").join(format!("{entry}.{file}")))?;
                }
            }
            let listing =
                Command::new("dpkg-deb").arg("--fsys-tarfile").arg(deb).output().context("dpkg-deb --fsys-tarfile")?;
            if !listing.status.success() {
                bail!("dpkg-deb --fsys-tarfile {} failed", deb.display());
            }
            let names = tar_names(&listing.stdout)?;
            let list: String =
                names.iter().map(|n| format!("{}\n", root.join(n.trim_start_matches("./")).display())).collect();
            fs::write(admin.join("info").join(format!("{entry}.list")), list)?;
            fs::remove_dir_all(&control)?;
        }
        fs::write(admin.join("status"), status)?;
        // A database of multiarch format (info files named `<package>:<arch>`) that knows the
        // architecture as one of its own.
        fs::write(admin.join("info/format"), "1\n")?;
        fs::write(admin.join("arch"), format!("{}\n{}\n", Arch::host().debian(), arch.debian()))?;
        println!(
            "dist: {} libraries for dpkg-shlibdeps: {} (unpacked in {})",
            arch.debian(),
            debs.iter().filter_map(|d| d.file_name()?.to_str()).collect::<Vec<_>>().join(" "),
            root.display()
        );
        Ok(Libraries { arch, root, admin })
    }

    /// Points dpkg-shlibdeps at these libraries as the target architecture's.
    pub fn configure(&self, shlibdeps: &mut Command) {
        let gnu = self.arch.gnu();
        shlibdeps.env("DEB_HOST_ARCH", self.arch.debian()).arg(format!("--admindir={}", self.admin.display()));
        for dir in [format!("lib/{gnu}"), format!("usr/lib/{gnu}")] {
            shlibdeps.arg(format!("-l{}", self.root.join(dir).display()));
        }
    }
}

fn field<'a>(control: &'a str, name: &str) -> Option<&'a str> {
    control.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':')).map(str::trim)
}

/// The member names of a tar archive (`tar -t`).
fn tar_names(tar: &[u8]) -> anyhow::Result<Vec<String>> {
    use std::io::Write as _;
    let mut child = Command::new("tar")
        .arg("-t")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("running tar -t")?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    let bytes = tar.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&bytes));
    let out = child.wait_with_output()?;
    writer.join().expect("tar's writer").context("writing to tar -t")?;
    if !out.status.success() {
        bail!("tar -t failed ({})", out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).lines().map(String::from).collect())
}
