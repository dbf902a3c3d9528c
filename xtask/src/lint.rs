//! `cargo xtask lint`: the gate CI runs before the tests — `cargo fmt --check` and
//! `cargo clippy --all-targets -D warnings` over the host workspace, again over guard-user's
//! library and binary as shipped (without the `testing` feature, so dead code is an error),
//! then the same over the BPF crate with its own nightly toolchain (its `rust-toolchain.toml`),
//! when that toolchain has clippy and rustfmt (say so and skip otherwise). Before those,
//! [`stray_tests`]: a `#[test]` in a test binary that guard-test's harness runs would never run;
//! and [`policy_imports`]: the pure rules (`guard-user/src/policy/`) use no output or IO module.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context};

use crate::{build, build_ebpf};

#[derive(clap::Args, Debug, Default)]
pub struct Options {
    /// Only the host workspace (skip guard-ebpf).
    #[arg(long)]
    pub host_only: bool,
}

fn step(name: &str, cmd: &mut Command) -> anyhow::Result<()> {
    println!("lint: {name}");
    let status = cmd.status().with_context(|| format!("running {name}"))?;
    if !status.success() {
        bail!("{name} failed ({status})");
    }
    Ok(())
}

/// Whether `rustup component list --toolchain nightly --installed` lists `component`.
fn nightly_has(component: &str) -> bool {
    Command::new("rustup")
        .args(["component", "list", "--toolchain", "nightly", "--installed"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).lines().any(|l| l.starts_with(component)))
        .unwrap_or(false)
}

/// The test directories whose binaries are `harness = false` targets run by guard-test
/// (`guard_test::main!()`): a test there is registered by `#[guard_test]`.
pub const HARNESS_TEST_DIRS: &[&str] = &["guard-user/tests", "tests/tests"];

/// `path:line: text` of every `#[test]` or `#[tokio::test]` under [`HARNESS_TEST_DIRS`]: without
/// libtest's harness nothing runs them, and rustc says nothing about it.
pub fn stray_tests(root: &Path) -> anyhow::Result<Vec<String>> {
    let mut files = Vec::new();
    for dir in HARNESS_TEST_DIRS {
        walk_rs(&root.join(dir), &mut files)?;
    }
    files.sort();
    let mut stray = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
        for (i, line) in text.lines().enumerate() {
            let attr = line.trim_start();
            if attr.starts_with("#[test]") || attr.starts_with("#[tokio::test") {
                let rel = file.strip_prefix(root).unwrap_or(&file);
                stray.push(format!("{}:{}: {}", rel.display(), i + 1, attr));
            }
        }
    }
    Ok(stray)
}

/// The most lines a source file may have (test directories excepted): a longer one holds more
/// than one thing and is split.
pub const MAX_LINES: usize = 600;

/// `path: N lines` of every tracked `.rs` file outside a `tests/` directory longer than
/// [`MAX_LINES`].
pub fn long_files(root: &Path) -> anyhow::Result<Vec<String>> {
    let out = Command::new("git").args(["ls-files", "-z", "*.rs"]).current_dir(root).output()?;
    anyhow::ensure!(out.status.success(), "git ls-files failed in {}", root.display());
    let mut long = Vec::new();
    for rel in out.stdout.split(|&b| b == 0).filter(|p| !p.is_empty()) {
        let rel = String::from_utf8_lossy(rel);
        if rel.starts_with("tests/") || rel.contains("/tests/") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(root.join(&*rel)) else { continue };
        let lines = text.lines().count();
        if lines > MAX_LINES {
            long.push(format!("{rel}: {lines} lines"));
        }
    }
    Ok(long)
}

/// The directory of the pure rules, and the modules it must not use: the files, signals, metrics
/// and mirror the daemon writes through. What the rules work on lives in `crate::domain`.
pub const POLICY_DIR: &str = "guard-user/src/policy";
pub const NOT_IN_POLICY: &[&str] = &[
    "status", "enforcer", "state", "mirror", "metrics", "daemon", "cmd", "install", "safefs", "procfs", "ebpf",
    "trace", "holders", "cgroup",
];

/// The first segment of every path `text` names through `crate::`, groups included:
/// `crate::a::b`, `crate::{a::b, c::{d, e}}` give `a`, `a`, `c`. Comments are left out.
pub fn crate_paths(text: &str) -> Vec<String> {
    let code: String = text.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n");
    let mut found = Vec::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find("crate::") {
        let preceded = rest[..at].chars().next_back().is_some_and(|c| c.is_alphanumeric() || c == '_');
        rest = &rest[at + "crate::".len()..];
        if preceded {
            continue; // `my_crate::` (`$crate::` in a macro is this crate, and counts)
        }
        if let Some(group) = rest.strip_prefix('{') {
            // The group's top-level items, up to its closing brace.
            let (mut depth, mut item) = (0usize, String::new());
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        found.extend(first_segment(&item));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                if depth == 0 || item.is_empty() {
                    item.push(c);
                }
            }
            found.extend(first_segment(&item));
        } else {
            found.extend(first_segment(rest));
        }
    }
    found
}

fn first_segment(path: &str) -> Option<String> {
    let name: String = path.trim_start().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
    (!name.is_empty() && name != "self").then_some(name)
}

/// `path: crate::<module>` of every use of a [`NOT_IN_POLICY`] module under [`POLICY_DIR`].
pub fn policy_imports(root: &Path) -> anyhow::Result<Vec<String>> {
    let mut files = Vec::new();
    walk_rs(&root.join(POLICY_DIR), &mut files)?;
    files.sort();
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
        let rel = file.strip_prefix(root).unwrap_or(&file);
        for module in crate_paths(&text) {
            if NOT_IN_POLICY.contains(&module.as_str()) {
                found.push(format!("{}: crate::{module}", rel.display()));
            }
        }
    }
    Ok(found)
}

fn walk_rs(dir: &Path, files: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            walk_rs(&path, files)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    Ok(())
}

pub fn run(opts: Options) -> anyhow::Result<()> {
    let root = build_ebpf::workspace_root();
    println!("lint: no source file over {MAX_LINES} lines");
    let long = long_files(&root)?;
    if !long.is_empty() {
        bail!("split these files (at most {MAX_LINES} lines each, tests/ excepted):\n  {}", long.join("\n  "));
    }
    println!("lint: no #[test] where guard-test's harness runs the tests");
    let stray = stray_tests(&root)?;
    if !stray.is_empty() {
        bail!(
            "these tests would never run (their binaries run under guard-test's harness): write \
             #[guard_test(needs = [...])] instead\n  {}",
            stray.join("\n  ")
        );
    }
    println!("lint: the rules in {POLICY_DIR} use no output or IO module");
    let imports = policy_imports(&root)?;
    if !imports.is_empty() {
        bail!(
            "policy/ uses an output or IO module: move the type it needs to guard-user/src/domain/ \
             (or pass the rule what it needs)\n  {}",
            imports.join("\n  ")
        );
    }
    step("cargo fmt --all --check", build::host_cargo().args(["fmt", "--all", "--check"]).current_dir(&root))?;
    step(
        "cargo clippy --workspace --all-targets -- -D warnings",
        build::host_cargo().args(["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"]).current_dir(&root),
    )?;
    // The run above builds guard-user with its `testing` feature (its tests and the
    // integration-tests package ask for it), where the library's inside is public API and so
    // never dead. The shipped build has no such feature: linted on its own, whatever the binary
    // does not call is dead code, and an error.
    step(
        "cargo clippy -p guard-user --lib --bins -- -D warnings (as shipped: no testing feature)",
        build::host_cargo()
            .args(["clippy", "-p", "guard-user", "--lib", "--bins", "--", "-D", "warnings"])
            .current_dir(&root),
    )?;
    if opts.host_only {
        return Ok(());
    }
    let ebpf = root.join("guard-ebpf");
    // The BPF crate builds `core` from source (build-std), so even clippy needs the nightly's
    // rust-src: a fresh machine has the toolchain without it.
    build_ebpf::ensure_rust_src()?;
    if nightly_has("rustfmt") {
        step("guard-ebpf: cargo fmt --check", build_ebpf::ebpf_cargo().args(["fmt", "--check"]).current_dir(&ebpf))?;
    } else {
        println!("lint: guard-ebpf fmt skipped: the nightly toolchain has no rustfmt (rustup component add rustfmt --toolchain nightly)");
    }
    if nightly_has("clippy") {
        step(
            "guard-ebpf: cargo clippy -- -D warnings",
            build_ebpf::ebpf_cargo().args(["clippy", "--release", "--", "-D", "warnings"]).current_dir(&ebpf),
        )?;
    } else {
        println!("lint: guard-ebpf clippy skipped: the nightly toolchain has no clippy (rustup component add clippy --toolchain nightly)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Also in `cargo xtask test`, so a stray `#[test]` fails the run that would have dropped it.
    #[test]
    fn every_test_in_the_harness_binaries_is_registered_with_guard_test() {
        let stray = stray_tests(&build_ebpf::workspace_root()).unwrap();
        assert!(stray.is_empty(), "write #[guard_test] instead of:\n{}", stray.join("\n"));
    }

    #[test]
    fn a_stray_test_attribute_is_found_with_its_place() {
        let dir = tempfile_dir("stray");
        for sub in HARNESS_TEST_DIRS {
            std::fs::create_dir_all(dir.join(sub).join("helpers")).unwrap();
        }
        std::fs::write(dir.join("tests/tests/helpers/mod.rs"), "fn a() {}\n    #[tokio::test]\nasync fn b() {}\n")
            .unwrap();
        std::fs::write(dir.join("guard-user/tests/x.rs"), "#[guard_test]\nfn a() {}\n#[test]\nfn b() {}\n").unwrap();
        assert_eq!(
            stray_tests(&dir).unwrap(),
            ["guard-user/tests/x.rs:3: #[test]", "tests/tests/helpers/mod.rs:2: #[tokio::test]"]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Also in `cargo xtask test`: the rules stay off the output and IO modules.
    #[test]
    fn the_policy_rules_use_no_output_or_io_module() {
        let found = policy_imports(&build_ebpf::workspace_root()).unwrap();
        assert!(found.is_empty(), "move these types to guard-user/src/domain/:\n{}", found.join("\n"));
    }

    #[test]
    fn every_form_of_a_crate_path_is_seen() {
        let text = "use crate::status::NameStatus;\n\
                    use crate::{\n    comm::Comm,\n    domain::{Outcome, State},\n    enforcer::Refusal,\n};\n\
                    fn f() { let _ = crate::state::load; }\n\
                    // crate::metrics in a comment is not a use\n\
                    macro_rules! m { () => { $crate::mirror::x } }\n\
                    use crate::{self as g, log::Line};\n\
                    use other_crate::status;";
        assert_eq!(crate_paths(text), ["status", "comm", "domain", "enforcer", "state", "mirror", "log"]);
        let dir = tempfile_dir("policy-scan");
        std::fs::create_dir_all(dir.join(POLICY_DIR).join("slots")).unwrap();
        std::fs::write(dir.join(POLICY_DIR).join("ok.rs"), "use crate::{domain::State, log::Line};\n").unwrap();
        std::fs::write(dir.join(POLICY_DIR).join("slots/q.rs"), "use crate::{comm::Comm, status::{self, X}};\n")
            .unwrap();
        assert_eq!(policy_imports(&dir).unwrap(), [format!("{POLICY_DIR}/slots/q.rs: crate::status")]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A directory of the test's own (`name`): the tests of this binary run at once.
    fn tempfile_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("xtask-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
