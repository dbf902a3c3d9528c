//! `cargo xtask test [--long] [-- <cargo test args>]`: every test of the host workspace.
//!
//! Builds the BPF object first and hands its path to the build through `GUARD_EBPF_OBJ`, so
//! the kernel tests load what was just built. Those tests need root (BPF, signals to other
//! uids) and are ignored without it, with the reason; the Redis tests need a `redis-server`
//! binary, which is installed with apt-get when missing and possible. As root, the run
//! requires what it provides (`GUARD_TESTS_REQUIRE`, see guard-test's `need`): root, the ebpf
//! backend where the kernel has BTF (the object is built here), redis-server once it is there;
//! a test needing one of them then fails rather than being ignored. A `GUARD_TESTS_REQUIRE`
//! already set (`.ci/run` sets `all`) is kept. The same tests in guests of other kernels are
//! `cargo xtask vm`.
use std::{ffi::OsString, process::Command};

use guard_test::Need;

use crate::{build, build_ebpf, build_ebpf::is_root};

#[derive(clap::Args, Debug)]
pub struct Options {
    /// Also run the long tests (sets GUARD_LONG_TESTS=1).
    #[arg(long)]
    pub long: bool,
    /// Arguments for `cargo test --workspace`, after `--` (e.g. `-- -p guard-user -- --test-threads=1`).
    #[arg(last = true)]
    pub cargo_args: Vec<OsString>,
}

pub fn run(opts: Options) -> anyhow::Result<()> {
    let object = build_ebpf::build(&build_ebpf::Options::default())?;
    let root = is_root();
    if !root {
        eprintln!("test: WARNING: not root — the kernel tests (BPF loading, signalling other uids) are ignored; run `sudo -E cargo xtask test`");
    }
    ensure_redis_server(root);
    let requires = std::env::var_os(REQUIRE_ENV).map(|v| v.to_string_lossy().into_owned()).unwrap_or_else(|| {
        let btf = std::path::Path::new("/sys/kernel/btf/vmlinux").exists();
        host_requires(root, btf, build_ebpf::which("redis-server").is_some())
    });

    let mut cargo = build::host_cargo();
    cargo
        // Every test binary runs even when one fails: a failure early in the list must not hide
        // the rest from the run that found it (CI has one run).
        .args(["test", "--workspace", "--no-fail-fast"])
        .args(&opts.cargo_args)
        .env("GUARD_EBPF_OBJ", &object)
        .env(REQUIRE_ENV, &requires)
        .current_dir(build_ebpf::workspace_root());
    if opts.long {
        cargo.env("GUARD_LONG_TESTS", "1");
    }
    println!(
        "test: cargo test --workspace --no-fail-fast{}{} (GUARD_EBPF_OBJ={}, {REQUIRE_ENV}={requires})",
        opts.cargo_args.iter().map(|a| format!(" {}", a.to_string_lossy())).collect::<String>(),
        if opts.long { ", GUARD_LONG_TESTS=1" } else { "" },
        object.display()
    );
    build_ebpf::run_checked(&mut cargo, "cargo test --workspace")?;
    if !opts.cargo_args.is_empty() {
        return Ok(());
    }
    // The unit tests that need the machine (root, BTF, the BPF object, groff, promtool, the
    // shells) are `#[ignore = "needs …"]` in libtest's harness, which cannot decide at run time:
    // the pass above listed them as ignored. Each sits in a `mod needs_<need>`; this pass runs
    // them with `--ignored` under guard-test's rule, need by need: a need missing here and not
    // required is `--skip`ped (its tests stay ignored, with the reason said here), a required one
    // that is missing runs and fails, a present one runs. So none of them passes by skipping.
    let required = guard_test::need::parse_required(&requires).map_err(anyhow::Error::msg)?;
    // The object was built above and is embedded through GUARD_EBPF_OBJ.
    let facts = guard_test::Facts { bpf_object: true };
    let skips = unit_test_skips(|n| n.missing(&facts), &required);
    for (need, why) in &skips {
        println!("test: ignored, the unit tests in `mod needs_{}`: {why}", need.name());
    }
    let skip_args: Vec<String> =
        skips.iter().flat_map(|(n, _)| ["--skip".to_string(), guard_test::need::skip_pattern(*n)]).collect();
    for (package, target) in UNIT_TESTS_WITH_NEEDS {
        let mut cargo = build::host_cargo();
        cargo
            .args(["test", "-p", package, target, "--", "--ignored"])
            .args(&skip_args)
            .env("GUARD_EBPF_OBJ", &object)
            .env(REQUIRE_ENV, &requires)
            .current_dir(build_ebpf::workspace_root());
        let shown = format!(
            "cargo test -p {package} {target} -- --ignored{}",
            skip_args.iter().map(|a| format!(" {a}")).collect::<String>()
        );
        println!("test: {shown} (the unit tests that need the machine)");
        build_ebpf::run_checked(&mut cargo, &shown)?;
    }
    Ok(())
}

/// The unit-test binaries whose ignored tests are the ones that need the machine (guard-test's
/// `need::here`): guard-user's library (kernel BTF, BPF, tracefs) and xtask (groff, promtool,
/// zsh and fish). The VM guests run guard-user's with `--include-ignored` (`vm/suite.rs`).
const UNIT_TESTS_WITH_NEEDS: &[(&str, &str)] = &[("guard-user", "--lib"), ("xtask", "--bins")];

/// The needs whose unit tests (`mod needs_<need>`) this run leaves ignored, each with why:
/// those guard-test's rule ([`guard_test::decide`]) ignores, missing and not required.
fn unit_test_skips(missing: impl Fn(Need) -> Option<String>, required: &[Need]) -> Vec<(Need, String)> {
    Need::ALL
        .iter()
        .filter_map(|&n| match guard_test::decide(&[n], &missing, required) {
            guard_test::Verdict::Ignore(why) => Some((n, why)),
            guard_test::Verdict::Run | guard_test::Verdict::Fail(_) => None,
        })
        .collect()
}

/// The variable guard-test reads the needs a run requires from.
const REQUIRE_ENV: &str = "GUARD_TESTS_REQUIRE";

/// What a host run requires when the caller named nothing: what this run provides itself.
fn host_requires(root: bool, btf: bool, redis: bool) -> String {
    let mut needs = Vec::new();
    if root {
        needs.push("root");
    }
    if btf {
        // The BPF object is built above; the kernel's BTF is the machine's.
        needs.extend(["btf", "ebpf"]);
    }
    if redis {
        needs.push("redis");
    }
    needs.join(",")
}

/// Makes `redis-server` available for the Redis mirror tests; never fails the run (those
/// tests say themselves what is missing).
fn ensure_redis_server(root: bool) {
    if let Some(path) = build_ebpf::which("redis-server") {
        println!("redis-server: present ({})", path.display());
        return;
    }
    if !root || build_ebpf::which("apt-get").is_none() {
        eprintln!(
            "redis-server: missing and cannot install it here (needs root and apt-get); the Redis tests are ignored"
        );
        return;
    }
    println!("redis-server: installing (apt-get install -y redis-server)");
    let install = || {
        Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends", "redis-server"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success())
    };
    if install() {
        return;
    }
    // A fresh machine may have no package lists yet.
    println!("redis-server: install failed; running apt-get update and retrying");
    let updated = Command::new("apt-get").arg("update").status().is_ok_and(|s| s.success());
    if !(updated && install()) {
        eprintln!("redis-server: could not be installed; the Redis tests are ignored");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_root_run_requires_what_it_provides() {
        assert_eq!(host_requires(true, true, true), "root,btf,ebpf,redis");
        assert_eq!(host_requires(false, true, false), "btf,ebpf");
        assert_eq!(host_requires(true, false, true), "root,redis");
    }

    #[test]
    fn a_needs_unit_tests_are_skipped_only_where_it_is_missing_and_not_required() {
        let no_btf_nor_groff = |n: Need| matches!(n, Need::Btf | Need::Groff).then(|| format!("no {}", n.name()));
        let skipped = |required: &[Need]| -> Vec<Need> {
            unit_test_skips(no_btf_nor_groff, required).into_iter().map(|(n, _)| n).collect()
        };
        assert_eq!(skipped(&[]), [Need::Btf, Need::Groff]);
        // Required: not skipped, so its tests run and fail with the reason.
        assert_eq!(skipped(&[Need::Btf, Need::Root]), [Need::Groff]);
        assert_eq!(unit_test_skips(no_btf_nor_groff, &[])[0].1, "no btf");
    }
}
