//! What runs in the guest: vm-init (static), and the host's own debug build of guard-user,
//! guard-probe and the test binaries the guests run ([`super::suite`]), with their libraries.
//!
//! The test binaries are the ones `cargo xtask test` builds and runs on the host (the same
//! `cargo test --workspace` invocation, so after it nothing is rebuilt): the guests test exactly
//! what the host tested. They are dynamically linked; the image carries the host's libraries
//! for them (`ldd`), as it does for bash. Copies stripped of debug information go into the
//! image (`target/vm/stripped`), which keeps it small. Dependencies are built at opt-level 1
//! in the dev profile (the workspace's Cargo.toml): unoptimized, aya's parsing of the kernel's
//! BTF took seconds per load under TCG, past the 5 s bounds of the BPF tests' helpers.
//!
//! vm-init alone is linked statically (`-C target-feature=+crt-static`, its own target
//! directory `target/vm/build`): it is PID 1 and only needs the libc crate.
use std::{
    collections::HashMap,
    ffi::OsString,
    fs,
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{bail, Context as _};
use serde_json::Value;

use super::suite::{self, Place};
use crate::{arch::Arch, build::host_cargo, build_ebpf};

/// An argument vm-init reads (never passed on): `--skip-unless-required=<need>`.
pub const SKIP_UNLESS_REQUIRED: &str = "--skip-unless-required=";

const STATIC_RUSTFLAGS: &str = "-C target-feature=+crt-static -C strip=debuginfo";

/// Where vm-init's static build goes.
pub fn build_dir() -> PathBuf {
    build_ebpf::target_dir().join("vm/build")
}

/// One test binary for the guest.
pub struct GuestTest {
    /// Its name under /tests.
    pub name: String,
    /// The stripped copy that goes into the image.
    pub binary: PathBuf,
    /// libtest arguments of its own (the filters of [`suite::Place::Guests::only`]).
    pub args: Vec<String>,
}

/// A program the tests start.
pub struct GuestBin {
    /// Its name under /usr/bin.
    pub name: String,
    /// Where cargo built it: the tests find it there (`CARGO_BIN_EXE_<name>`), so that path
    /// becomes a link in the image.
    pub built: PathBuf,
    /// The stripped copy that goes into the image.
    pub binary: PathBuf,
}

pub struct Built {
    pub init: PathBuf,
    pub tests: Vec<GuestTest>,
    pub bins: Vec<GuestBin>,
    /// Test binaries left to the host, with the reason (printed once).
    pub host_only: Vec<(String, &'static str)>,
}

/// What to build and pick.
pub struct Selection<'a> {
    /// The guests' architecture: the build machine's (its own test build, reused), or another
    /// one (cross-built, only the test binaries the guests run).
    pub arch: Arch,
    /// Arguments for `cargo test --no-run` instead of `--workspace` (e.g. `-p guard-user --lib`);
    /// the suite's choice still applies unless `all_tests`.
    pub cargo_args: &'a [OsString],
    /// Every test binary, with all of its tests, in every guest (the full matrix).
    pub all_tests: bool,
    /// The developer gave test filters of their own: the suite's filters would widen them.
    pub own_filters: bool,
    /// For another architecture: only [`suite::ARCH_DEPENDENT`]'s binaries.
    pub arch_subset: bool,
}

pub fn build(selection: &Selection, ebpf_object: Option<&Path>) -> anyhow::Result<Built> {
    let arch = selection.arch;
    let packages = workspace_packages()?;
    let init = static_init(arch)?;

    let mut test_args: Vec<OsString> = vec!["test".into(), "--no-run".into()];
    if !selection.cargo_args.is_empty() {
        test_args.extend(selection.cargo_args.iter().cloned());
    } else if arch.is_host() || selection.all_tests {
        // Exactly what `cargo xtask test` runs (plus --no-run): the same features, so the
        // same artifacts, which that step already built.
        test_args.push("--workspace".into());
    } else {
        // A cross build reuses nothing of the host's: build only what the guests run.
        test_args.extend(guest_targets(selection.arch_subset).into_iter().map(OsString::from));
    }
    let artifacts = cargo_artifacts(&test_args, arch, ebpf_object, &packages)?;
    let stripped_dir = build_ebpf::target_dir().join(if arch.is_host() {
        "vm/stripped".to_string()
    } else {
        format!("vm/stripped-{}", arch.debian())
    });
    fs::create_dir_all(&stripped_dir).with_context(|| format!("creating {}", stripped_dir.display()))?;

    let mut bins = Vec::new();
    for name in ["guard-user", "guard-probe"] {
        match artifacts.iter().find(|a| a.kind == "bin" && !a.test && a.target == name) {
            Some(a) => bins.push(GuestBin {
                name: name.to_string(),
                built: a.executable.clone(),
                binary: strip_copy(arch, &a.executable, &stripped_dir.join(format!("bin-{name}")))?,
            }),
            None if name == "guard-probe" => println!("vm: no guard-probe binary built; GUARD_PROBE_BIN stays unset"),
            None => bail!("`cargo {}` built no guard-user binary", join(&test_args)),
        }
    }

    let mut tests = Vec::new();
    let mut host_only = Vec::new();
    for a in artifacts.iter().filter(|a| a.test) {
        let name = a.guest_name();
        let place = suite::place(&name)?;
        if selection.arch_subset && !arch.is_host() && !suite::ARCH_DEPENDENT.iter().any(|(n, _)| *n == name) {
            continue;
        }
        let only = match place {
            Place::Guests { only, .. } => only,
            Place::Host { why } if !selection.all_tests => {
                host_only.push((name, why));
                continue;
            }
            Place::Host { .. } => &[][..],
        };
        if selection.all_tests && suite::HOST_TOOLING.iter().any(|p| name.starts_with(&format!("{p}."))) {
            continue;
        }
        let mut args = Vec::new();
        if suite::INCLUDE_IGNORED.contains(&name.as_str()) {
            args.push("--include-ignored".to_string());
            // Which needs a guest has is its `guard.require=`: vm-init turns each of these into
            // `--skip ::needs_<need>::` where that need is not required, so a unit test whose
            // need the guest lacks (BTF in the no-btf guest) is not run rather than passed.
            args.extend(guard_test::Need::ALL.iter().map(|n| format!("{SKIP_UNLESS_REQUIRED}{}", n.name())));
        }
        if !selection.all_tests && !selection.own_filters && !only.is_empty() {
            args.push("--exact".to_string());
            args.extend(only.iter().map(|t| t.to_string()));
        }
        let binary = strip_copy(arch, &a.executable, &stripped_dir.join(&name))?;
        tests.push(GuestTest { name, binary, args });
    }
    if tests.is_empty() {
        bail!("no test binary to run in the guests (cargo {})", join(&test_args));
    }
    tests.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Built { init, tests, bins, host_only })
}

/// The test guests' guard-user (stripped), for the systemd guest: built by the same command, so
/// nothing is rebuilt after `cargo xtask test`.
pub fn guard_user(ebpf_object: Option<&Path>) -> anyhow::Result<PathBuf> {
    let args: Vec<OsString> = ["test", "--no-run", "--workspace"].map(OsString::from).to_vec();
    let artifacts = cargo_artifacts(&args, Arch::host(), ebpf_object, &workspace_packages()?)?;
    let built = artifacts
        .iter()
        .find(|a| a.kind == "bin" && !a.test && a.target == "guard-user")
        .with_context(|| format!("`cargo {}` built no guard-user binary", join(&args)))?;
    let dir = build_ebpf::target_dir().join("vm/stripped");
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    strip_copy(Arch::host(), &built.executable, &dir.join("bin-guard-user"))
}

/// `cargo test --no-run` arguments that build exactly the test binaries [`suite::SUITE`]
/// places in the guests (only [`suite::ARCH_DEPENDENT`]'s with `arch_subset`): `-p <package>` for each of their packages, `--lib` and `--test <name>`
/// for each binary (cargo applies every target filter to every selected package, and a
/// package without that target simply has nothing to build for it).
pub fn guest_targets(arch_subset: bool) -> Vec<String> {
    let mut packages = Vec::new();
    let mut targets = Vec::new();
    for (name, place) in suite::SUITE {
        if !matches!(place, Place::Guests { .. })
            || (arch_subset && !suite::ARCH_DEPENDENT.iter().any(|(n, _)| n == name))
        {
            continue;
        }
        let (package, target) = name.split_once('.').expect("suite names are <package>.<target>");
        if !packages.contains(&package) {
            packages.push(package);
        }
        let filter =
            if target == "lib" { vec!["--lib".to_string()] } else { vec!["--test".to_string(), target.to_string()] };
        if !targets.contains(&filter) {
            targets.push(filter);
        }
    }
    packages.iter().flat_map(|p| ["-p".to_string(), p.to_string()]).chain(targets.into_iter().flatten()).collect()
}

fn join(args: &[OsString]) -> String {
    args.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>().join(" ")
}

/// `objcopy --strip-debug` into `dest` (skipped when `dest` is newer than `source`), with the
/// objcopy of the binary's architecture.
fn strip_copy(arch: Arch, source: &Path, dest: &Path) -> anyhow::Result<PathBuf> {
    let newer = |a: &Path, b: &Path| -> bool {
        let m = |p: &Path| fs::metadata(p).and_then(|m| m.modified()).ok();
        matches!((m(a), m(b)), (Some(x), Some(y)) if x >= y)
    };
    if !newer(dest, source) {
        let objcopy = arch.binutil("objcopy");
        let status = Command::new(&objcopy)
            .arg("--strip-debug")
            .arg(source)
            .arg(dest)
            .status()
            .with_context(|| format!("running {objcopy} (binutils)"))?;
        if !status.success() {
            bail!("objcopy --strip-debug {} failed ({status})", source.display());
        }
    }
    Ok(dest.to_path_buf())
}

/// vm-init, statically linked: PID 1 of the guest. Always built with an explicit `--target`,
/// so RUSTFLAGS reach vm-init and not the build scripts.
pub fn static_init(arch: Arch) -> anyhow::Result<PathBuf> {
    let dir = build_dir();
    let mut cargo = host_cargo();
    let target = arch.rust_target();
    cargo.args(["build", "-p", "vm-init", "--bin", "vm-init"]);
    if arch.is_host() {
        cargo.args(["--target", target]);
    } else {
        arch.cargo_args(&mut cargo);
    }
    cargo
        .arg("--target-dir")
        .arg(&dir)
        .env("RUSTFLAGS", STATIC_RUSTFLAGS)
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .current_dir(build_ebpf::workspace_root());
    println!(
        "vm: RUSTFLAGS=\"{STATIC_RUSTFLAGS}\" cargo build -p vm-init --target {target} --target-dir {}",
        dir.display()
    );
    build_ebpf::run_checked(&mut cargo, "building the static vm-init")?;
    let init = dir.join(target).join("debug/vm-init");
    anyhow::ensure!(init.is_file(), "the static build left no {}", init.display());
    Ok(init)
}

struct Package {
    name: String,
    manifest_path: PathBuf,
}

fn workspace_packages() -> anyhow::Result<Vec<Package>> {
    let out = host_cargo()
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .current_dir(build_ebpf::workspace_root())
        .stderr(Stdio::inherit())
        .output()
        .context("running cargo metadata")?;
    if !out.status.success() {
        bail!("cargo metadata failed ({})", out.status);
    }
    let metadata: Value = serde_json::from_slice(&out.stdout).context("parsing cargo metadata")?;
    let packages = metadata["packages"].as_array().context("cargo metadata has no packages")?;
    Ok(packages
        .iter()
        .map(|p| Package {
            name: p["name"].as_str().unwrap_or_default().to_string(),
            manifest_path: PathBuf::from(p["manifest_path"].as_str().unwrap_or_default()),
        })
        .collect())
}

/// One executable cargo reported.
struct Artifact {
    package: String,
    target: String,
    /// The first target kind: `lib`, `bin`, `test`, …
    kind: String,
    /// Built by `cargo test` (a test harness), not a plain binary.
    test: bool,
    executable: PathBuf,
}

impl Artifact {
    /// `guard-user.lib`, `guard-user.pattern_oracle`, `guard-user.bin-guard-user`.
    fn guest_name(&self) -> String {
        match self.kind.as_str() {
            "lib" | "rlib" | "proc-macro" => format!("{}.lib", self.package),
            "bin" => format!("{}.bin-{}", self.package, self.target),
            _ => format!("{}.{}", self.package, self.target),
        }
    }
}

/// Runs the host's `cargo <args> --message-format=json-render-diagnostics` (dev profile, the
/// host target directory; `--target` and the cross linker for another architecture) and
/// returns every executable it reported.
fn cargo_artifacts(
    args: &[OsString],
    arch: Arch,
    ebpf_object: Option<&Path>,
    packages: &[Package],
) -> anyhow::Result<Vec<Artifact>> {
    let mut cargo: Command = host_cargo();
    cargo.args(args);
    arch.cargo_args(&mut cargo);
    cargo
        .arg("--message-format=json-render-diagnostics")
        .current_dir(build_ebpf::workspace_root())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    match ebpf_object {
        Some(object) => cargo.env("GUARD_EBPF_OBJ", object),
        None => cargo.env_remove("GUARD_EBPF_OBJ"),
    };
    println!(
        "vm: cargo {}{}",
        join(args),
        if arch.is_host() { String::new() } else { format!(" --target {}", arch.rust_target()) }
    );
    let mut child = cargo.spawn().context("starting cargo")?;
    let by_manifest: HashMap<&Path, &str> =
        packages.iter().map(|p| (p.manifest_path.as_path(), p.name.as_str())).collect();
    let mut artifacts = Vec::new();
    for line in BufReader::new(child.stdout.take().expect("piped stdout")).lines() {
        let line = line.context("reading cargo's output")?;
        let Ok(message) = serde_json::from_str::<Value>(&line) else { continue };
        if message["reason"] != "compiler-artifact" {
            continue;
        }
        let Some(executable) = message["executable"].as_str() else { continue };
        let manifest = Path::new(message["manifest_path"].as_str().unwrap_or_default());
        artifacts.push(Artifact {
            package: by_manifest.get(manifest).map(|s| s.to_string()).unwrap_or_else(|| "unknown".into()),
            target: message["target"]["name"].as_str().unwrap_or_default().to_string(),
            kind: message["target"]["kind"][0].as_str().unwrap_or_default().to_string(),
            test: message["profile"]["test"].as_bool().unwrap_or(false),
            executable: PathBuf::from(executable),
        });
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("cargo {} failed ({status})", join(args));
    }
    Ok(artifacts)
}
