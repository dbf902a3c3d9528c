//! Builds what runs in the guest: statically linked test binaries, guard-user, guard-probe (when
//! the workspace has it) and vm-init.
//!
//! The guest has no libraries besides the few copied for bash, so everything is linked with
//! `-C target-feature=+crt-static`. An explicit `--target` keeps that flag away from build
//! scripts and proc-macros (they must stay dynamic to be loaded by the host), and a separate
//! target directory (`target/vm/build`) keeps the host build's artifacts valid.
use std::{
    collections::HashMap,
    ffi::OsString,
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{bail, Context as _};
use serde_json::Value;

use crate::{build::host_cargo, build_ebpf};

const TARGET: &str = "x86_64-unknown-linux-gnu";
const RUSTFLAGS: &str = "-C target-feature=+crt-static -C strip=debuginfo";
/// Dependencies (not workspace members) built optimized: under TCG an unoptimized aya parsing
/// the kernel's BTF took seconds per load, longer than the tests' 5 s bounds on helper
/// processes. The workspace's own code keeps the dev profile the host tests use.
const DEPENDENCY_OPT_LEVEL: &str = r#"profile.dev.package."*".opt-level=1"#;
/// Host-only crates whose tests make no sense in the guest.
const HOST_ONLY: &[&str] = &["xtask", "vm-init"];

/// Where the static build's artifacts go.
pub fn build_dir() -> PathBuf {
    build_ebpf::target_dir().join("vm/build")
}

pub struct Built {
    pub init: PathBuf,
    /// `(name under /tests, binary)`.
    pub tests: Vec<(String, PathBuf)>,
    /// `(name under /usr/bin, binary)`.
    pub bins: Vec<(String, PathBuf)>,
}

/// `cargo_args` replace the default `--workspace --exclude xtask --exclude vm-init` of the
/// test build (e.g. `-p guard-user --lib`).
pub fn build(cargo_args: &[OsString], ebpf_object: Option<&Path>) -> anyhow::Result<Built> {
    let packages = workspace_packages()?;
    let probe_package = packages.iter().find(|p| p.bins.iter().any(|b| b == "guard-probe")).map(|p| p.name.clone());

    let mut bin_args: Vec<OsString> =
        ["-p", "vm-init", "--bin", "vm-init", "-p", "guard-user", "--bin", "guard-user"].map(OsString::from).to_vec();
    if let Some(package) = &probe_package {
        bin_args.extend(["-p", package, "--bin", "guard-probe"].map(OsString::from));
    } else {
        println!("vm: no guard-probe binary in the workspace yet; GUARD_PROBE_BIN stays unset");
    }
    let bins =
        static_cargo("build", &bin_args, ebpf_object, &packages, |artifact| artifact.kind == "bin" && !artifact.test)?;
    let find_bin = |name: &str| {
        bins.iter()
            .find(|a| a.target == name)
            .map(|a| a.executable.clone())
            .with_context(|| format!("the static build produced no {name} binary"))
    };
    let init = find_bin("vm-init")?;
    let mut guest_bins = vec![("guard-user".to_string(), find_bin("guard-user")?)];
    if probe_package.is_some() {
        guest_bins.push(("guard-probe".to_string(), find_bin("guard-probe")?));
    }

    let mut test_args: Vec<OsString> = vec!["--no-run".into()];
    if cargo_args.is_empty() {
        test_args.push("--workspace".into());
        for crate_name in HOST_ONLY {
            test_args.extend(["--exclude", crate_name].map(OsString::from));
        }
    } else {
        test_args.extend(cargo_args.iter().cloned());
    }
    let tests = static_cargo("test", &test_args, ebpf_object, &packages, |artifact| artifact.test)?;
    if tests.is_empty() {
        bail!("`cargo test --no-run` built no test binaries (arguments: {test_args:?})");
    }
    let tests = tests.into_iter().map(|a| (a.guest_name(), a.executable)).collect();
    Ok(Built { init, tests, bins: guest_bins })
}

struct Package {
    name: String,
    manifest_path: PathBuf,
    bins: Vec<String>,
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
            bins: p["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|t| t["kind"].as_array().is_some_and(|k| k.iter().any(|k| k == "bin")))
                .filter_map(|t| t["name"].as_str().map(String::from))
                .collect(),
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

/// Runs `cargo <subcommand> --target … --target-dir target/vm/build --message-format=json`
/// statically linked and returns the executables `keep` accepts.
fn static_cargo(
    subcommand: &str,
    args: &[OsString],
    ebpf_object: Option<&Path>,
    packages: &[Package],
    keep: impl Fn(&Artifact) -> bool,
) -> anyhow::Result<Vec<Artifact>> {
    let dir = build_dir();
    let mut cargo: Command = host_cargo();
    cargo
        .arg(subcommand)
        .args(["--target", TARGET, "--message-format=json-render-diagnostics", "--config", DEPENDENCY_OPT_LEVEL])
        .arg("--target-dir")
        .arg(&dir)
        .args(args)
        .env("RUSTFLAGS", RUSTFLAGS)
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .current_dir(build_ebpf::workspace_root())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    match ebpf_object {
        Some(object) => cargo.env("GUARD_EBPF_OBJ", object),
        None => cargo.env_remove("GUARD_EBPF_OBJ"),
    };
    println!(
        "vm: RUSTFLAGS=\"{RUSTFLAGS}\" cargo {subcommand} --target {TARGET} --config '{DEPENDENCY_OPT_LEVEL}' \
         --target-dir {} {}",
        dir.display(),
        args.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>().join(" ")
    );
    let mut child = cargo.spawn().with_context(|| format!("starting cargo {subcommand}"))?;
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
        let artifact = Artifact {
            package: by_manifest.get(manifest).map(|s| s.to_string()).unwrap_or_else(|| "unknown".into()),
            target: message["target"]["name"].as_str().unwrap_or_default().to_string(),
            kind: message["target"]["kind"][0].as_str().unwrap_or_default().to_string(),
            test: message["profile"]["test"].as_bool().unwrap_or(false),
            executable: PathBuf::from(executable),
        };
        if keep(&artifact) {
            artifacts.push(artifact);
        }
    }
    let status = child.wait()?;
    if !status.success() {
        bail!(
            "the static cargo {subcommand} failed ({status}). If linking failed on a missing static library, a \
             dependency does not link statically against glibc; x86_64-unknown-linux-musl is the fallback"
        );
    }
    Ok(artifacts)
}
