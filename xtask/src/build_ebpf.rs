//! `cargo xtask build-ebpf`: make sure the nightly toolchain can build BPF, then build guard-ebpf.
//!
//! Each step is idempotent and prints one line saying what it found or did:
//! 1. the nightly toolchain has `rust-src` (guard-ebpf rebuilds `core` for the BPF target);
//! 2. `bpf-linker` starts and is linked against the *nightly's* LLVM major. rustc hands the
//!    linker LLVM bitcode, and an LLVM older than the one that wrote it rejects it, so the
//!    linker is built against the very `libLLVM` the nightly ships (found under its sysroot);
//! 3. `cargo +nightly build --release` inside guard-ebpf, with the outer (stable) cargo's
//!    environment removed so the nightly and guard-ebpf's own `.cargo/config.toml` decide.
use std::{
    env,
    ffi::OsString,
    fs,
    path::{Path, PathBuf},
    process::{Command, Output},
};

use anyhow::{bail, Context as _};

#[derive(clap::Args, Debug, Default)]
pub struct Options {
    /// Rebuild bpf-linker against the nightly's LLVM even if the installed one looks fine.
    #[arg(long)]
    pub rebuild_linker: bool,
}

pub fn run(opts: Options) -> anyhow::Result<()> {
    let object = build(&opts)?;
    println!("BPF object: {}", object.display());
    Ok(())
}

/// Runs every step and returns the absolute path of the built BPF object.
pub fn build(opts: &Options) -> anyhow::Result<PathBuf> {
    let nightly = Nightly::probe()?;
    ensure_rust_src()?;
    ensure_bpf_linker(&nightly, opts.rebuild_linker)?;

    let ebpf_dir = workspace_root().join("guard-ebpf");
    println!("guard-ebpf: cargo +nightly build --release");
    let mut cargo = nightly_command("cargo");
    cargo.args(["+nightly", "build", "--release"]).current_dir(&ebpf_dir);
    run_checked(&mut cargo, "building guard-ebpf")?;

    let object = ebpf_dir.join("target/bpfel-unknown-none/release/guard");
    if !object.is_file() {
        bail!("the guard-ebpf build succeeded but left no object at {}", object.display());
    }
    Ok(object)
}

/// The repository root (xtask lives one directory below it).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask has a parent directory").to_path_buf()
}

/// The host workspace's target directory: `CARGO_TARGET_DIR` if set, else `<root>/target`.
pub fn target_dir() -> PathBuf {
    let root = workspace_root();
    match env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => root.join(dir),
        _ => root.join("target"),
    }
}

/// Finds `name` on `PATH`.
pub fn which(name: &str) -> Option<PathBuf> {
    env::split_paths(&env::var_os("PATH")?).map(|dir| dir.join(name)).find(|path| path.is_file())
}

/// Runs `cmd`, failing with `what` and the exit status unless it succeeds.
pub fn run_checked(cmd: &mut Command, what: &str) -> anyhow::Result<()> {
    let status = cmd.status().with_context(|| format!("{what}: could not start {:?}", cmd.get_program()))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}

/// `cargo +nightly`, clean of the outer cargo's environment (see [`nightly_command`]).
pub fn ebpf_cargo() -> Command {
    let mut cmd = nightly_command("cargo");
    cmd.arg("+nightly");
    cmd
}

/// A command for a rustup-proxied tool (`cargo`, `rustc`) with everything the outer
/// `cargo xtask` (running under stable) put into the environment removed, so that `+nightly`
/// and the directory's own toolchain file and `.cargo/config.toml` decide the build.
fn nightly_command(tool: &str) -> Command {
    let mut cmd = Command::new(tool);
    for (key, _) in env::vars_os() {
        let Some(key) = key.to_str() else { continue };
        let from_outer_cargo = key == "CARGO" || (key.starts_with("CARGO_") && key != "CARGO_HOME");
        let toolchain_choice = matches!(
            key,
            "RUSTUP_TOOLCHAIN"
                | "RUSTUP_TOOLCHAIN_SOURCE"
                | "RUSTC"
                | "RUSTC_WRAPPER"
                | "RUSTC_WORKSPACE_WRAPPER"
                | "RUSTDOC"
                | "RUSTFLAGS"
                | "RUSTDOCFLAGS"
        );
        if from_outer_cargo || toolchain_choice {
            cmd.env_remove(key);
        }
    }
    // rustc runs the linker by name, so the directory `cargo install` puts it in must be on PATH.
    cmd.env("PATH", path_with(&cargo_home().join("bin")));
    cmd
}

fn cargo_home() -> PathBuf {
    match env::var_os("CARGO_HOME") {
        Some(home) if !home.is_empty() => PathBuf::from(home),
        _ => PathBuf::from(env::var_os("HOME").unwrap_or_default()).join(".cargo"),
    }
}

/// `PATH` with `dir` appended unless it is already there.
fn path_with(dir: &Path) -> OsString {
    let mut dirs: Vec<PathBuf> = env::var_os("PATH").map(|p| env::split_paths(&p).collect()).unwrap_or_default();
    if !dirs.iter().any(|d| d == dir) {
        dirs.push(dir.to_path_buf());
    }
    env::join_paths(dirs).unwrap_or_default()
}

fn output_of(cmd: &mut Command, what: &str) -> anyhow::Result<Output> {
    let out = cmd.output().with_context(|| format!("{what}: could not start {:?}", cmd.get_program()))?;
    if !out.status.success() {
        bail!("{what} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(out)
}

/// What the nightly toolchain says about itself.
struct Nightly {
    /// Its sysroot; `lib/` there holds the `libLLVM` the linker must use.
    sysroot: PathBuf,
    /// The LLVM major rustc emits bitcode for, from `LLVM version: 22.1.4`.
    llvm_major: u32,
}

impl Nightly {
    fn probe() -> anyhow::Result<Self> {
        const HINT: &str =
            "is the nightly toolchain installed? (rustup toolchain install nightly --component rust-src)";
        let version =
            output_of(nightly_command("rustc").args(["+nightly", "-vV"]), "rustc +nightly -vV").context(HINT)?;
        let version = String::from_utf8_lossy(&version.stdout).into_owned();
        let llvm = version
            .lines()
            .find_map(|line| line.strip_prefix("LLVM version:"))
            .map(str::trim)
            .with_context(|| format!("`rustc +nightly -vV` printed no `LLVM version:` line:\n{version}"))?;
        let llvm_major = llvm
            .split('.')
            .next()
            .and_then(|major| major.parse().ok())
            .with_context(|| format!("unreadable nightly LLVM version {llvm:?}"))?;
        let sysroot = output_of(
            nightly_command("rustc").args(["+nightly", "--print", "sysroot"]),
            "rustc +nightly --print sysroot",
        )?;
        let sysroot = PathBuf::from(String::from_utf8_lossy(&sysroot.stdout).trim());
        Ok(Self { sysroot, llvm_major })
    }

    /// The nightly's shared LLVM, e.g. `lib/libLLVM.so.22.1-rust-1.97.0-nightly`.
    fn libllvm(&self) -> anyhow::Result<PathBuf> {
        let lib = self.sysroot.join("lib");
        let mut found: Vec<PathBuf> = fs::read_dir(&lib)
            .with_context(|| format!("reading {}", lib.display()))?
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .filter(|path| {
                let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
                name.starts_with("libLLVM.so.") && name.contains("-rust-") && name.ends_with("-nightly")
            })
            .collect();
        found.sort();
        found.pop().with_context(|| format!("no libLLVM.so.<ver>-rust-*-nightly in {}", lib.display()))
    }
}

pub fn ensure_rust_src() -> anyhow::Result<()> {
    let listed = output_of(
        Command::new("rustup").args(["component", "list", "--toolchain", "nightly", "--installed"]),
        "rustup component list --toolchain nightly --installed",
    )?;
    let installed = String::from_utf8_lossy(&listed.stdout);
    if installed.lines().any(|line| line.trim() == "rust-src" || line.trim().starts_with("rust-src-")) {
        println!("rust-src: present");
        return Ok(());
    }
    println!("rust-src: installing (rustup component add rust-src --toolchain nightly)");
    run_checked(
        Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", "nightly"]),
        "rustup component add rust-src --toolchain nightly",
    )
}

fn ensure_bpf_linker(nightly: &Nightly, force: bool) -> anyhow::Result<()> {
    let reason = match linker_state(nightly) {
        _ if force => "rebuild requested (--rebuild-linker)".to_string(),
        LinkerState::Matches { version, llvm } => {
            println!("bpf-linker: {version}, linked against the nightly's LLVM {} ({llvm})", nightly.llvm_major);
            return Ok(());
        }
        LinkerState::Static { version, llvm_major: Some(major) } if major == nightly.llvm_major => {
            println!("bpf-linker: {version}, installed with feature llvm-{major} (the nightly's LLVM major)");
            return Ok(());
        }
        LinkerState::Static { version, llvm_major: None } => {
            println!(
                "bpf-linker: {version}; its LLVM major is unknown (not linked to a libLLVM, no install record) — \
                 keeping it; `cargo xtask build-ebpf --rebuild-linker` rebuilds it if linking fails"
            );
            return Ok(());
        }
        LinkerState::Static { llvm_major: Some(major), .. } => {
            format!("it was built for LLVM {major}, the nightly uses LLVM {}", nightly.llvm_major)
        }
        LinkerState::Mismatch { llvm } => format!("it links {llvm}, the nightly uses LLVM {}", nightly.llvm_major),
        LinkerState::Broken(why) => why,
    };
    println!("bpf-linker: {reason}; installing it against the nightly's LLVM {} (about a minute)", nightly.llvm_major);
    install_bpf_linker(nightly)
}

enum LinkerState {
    /// Starts and its `libLLVM` dependency has the nightly's major.
    Matches { version: String, llvm: String },
    /// Starts but depends on a `libLLVM` of another major.
    Mismatch { llvm: String },
    /// Starts without a shared `libLLVM`; the major comes from cargo's install record, if any.
    Static { version: String, llvm_major: Option<u32> },
    /// Missing, or does not start (typically: the nightly it was linked to was replaced).
    Broken(String),
}

fn linker_state(nightly: &Nightly) -> LinkerState {
    let Some(linker) =
        which("bpf-linker").or_else(|| Some(cargo_home().join("bin/bpf-linker")).filter(|p| p.is_file()))
    else {
        return LinkerState::Broken("not installed".into());
    };
    // Under `cargo +nightly`, rustup puts the nightly's lib/ on LD_LIBRARY_PATH; do the same.
    let nightly_lib = nightly.sysroot.join("lib");
    let run = |program: &Path, arg: &Path| Command::new(program).arg(arg).env("LD_LIBRARY_PATH", &nightly_lib).output();
    let version = match run(&linker, Path::new("--version")) {
        Ok(out) if out.status.success() => {
            String::from_utf8_lossy(&out.stdout).trim().trim_start_matches("bpf-linker ").to_string()
        }
        Ok(out) => {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let first = stderr.lines().next().unwrap_or("").trim().to_string();
            return LinkerState::Broken(format!("{} --version fails ({first})", linker.display()));
        }
        Err(err) => return LinkerState::Broken(format!("{} does not start ({err})", linker.display())),
    };
    let libllvm = run(Path::new("ldd"), &linker).ok().and_then(|out| {
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.split_whitespace().find(|word| word.starts_with("libLLVM")).map(str::to_string)
    });
    match libllvm {
        Some(llvm) if llvm_major_of(&llvm) == Some(nightly.llvm_major) => LinkerState::Matches { version, llvm },
        Some(llvm) => LinkerState::Mismatch { llvm },
        None => LinkerState::Static { version, llvm_major: recorded_llvm_feature() },
    }
}

/// The major in a library name: `libLLVM.so.22.1-rust-…` or `libLLVM-22.so` → 22.
fn llvm_major_of(name: &str) -> Option<u32> {
    let digits: String = name
        .trim_start_matches("libLLVM")
        .chars()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// The `llvm-<major>` feature bpf-linker was installed with, from cargo's `.crates2.json`
/// (one compact JSON line; a plain scan keeps xtask free of a JSON dependency).
fn recorded_llvm_feature() -> Option<u32> {
    let record = fs::read_to_string(cargo_home().join(".crates2.json")).ok()?;
    let entry = &record[record.find("\"bpf-linker ")?..];
    let features = &entry[entry.find("\"features\":[")? + "\"features\":[".len()..];
    let features = &features[..features.find(']')?];
    features
        .split(',')
        .map(|f| f.trim().trim_matches('"'))
        .find_map(|f| f.strip_prefix("llvm-").or_else(|| f.strip_prefix("rust-llvm-")))
        .and_then(|major| major.parse().ok())
}

/// `cargo install bpf-linker` against the nightly's `libLLVM`: llvm-sys finds it through
/// `LLVM_PREFIX`, a directory under target/ whose `lib/libLLVM.so` points into the sysroot.
fn install_bpf_linker(nightly: &Nightly) -> anyhow::Result<()> {
    let prefix = workspace_root().join("target/llvm-prefix");
    let lib = prefix.join("lib");
    fs::create_dir_all(&lib).with_context(|| format!("creating {}", lib.display()))?;
    let libllvm = nightly.libllvm()?;
    let link = lib.join("libLLVM.so");
    if fs::symlink_metadata(&link).is_ok() {
        fs::remove_file(&link).with_context(|| format!("removing the old {}", link.display()))?;
    }
    std::os::unix::fs::symlink(&libllvm, &link)
        .with_context(|| format!("linking {} to {}", link.display(), libllvm.display()))?;
    println!("bpf-linker: LLVM_PREFIX={} ({} -> {})", prefix.display(), link.display(), libllvm.display());

    let feature = format!("llvm-{}", nightly.llvm_major);
    println!("bpf-linker: cargo install bpf-linker --no-default-features --features {feature} --force");
    // The host toolchain (stable) builds the linker; only the LLVM it links comes from the nightly.
    let mut cargo = nightly_command("cargo");
    cargo
        .args(["install", "bpf-linker", "--no-default-features", "--features", &feature, "--force"])
        .env("LLVM_PREFIX", &prefix)
        .current_dir(&prefix);
    run_checked(&mut cargo, "cargo install bpf-linker")
}

/// Whether xtask runs with effective uid 0. `/proc/self` is owned by the effective uid, which
/// spares xtask a libc dependency; `id -u` is the fallback.
pub fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt as _;
    match std::fs::metadata("/proc/self") {
        Ok(meta) => meta.uid() == 0,
        Err(_) => std::process::Command::new("id")
            .arg("-u")
            .output()
            .map(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
            .unwrap_or(false),
    }
}

#[cfg(test)]
mod tests {
    use super::llvm_major_of;

    #[test]
    fn llvm_major_is_read_from_rust_and_distro_library_names() {
        assert_eq!(llvm_major_of("libLLVM.so.22.1-rust-1.97.0-nightly"), Some(22));
        assert_eq!(llvm_major_of("libLLVM-21.so"), Some(21));
        assert_eq!(llvm_major_of("libLLVM.so.19.1"), Some(19));
        assert_eq!(llvm_major_of("libLLVM.so"), None);
    }
}
