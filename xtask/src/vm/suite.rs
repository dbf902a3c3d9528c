//! Which test binaries the guests run, and why.
//!
//! The host (`cargo xtask test`) runs every test. A guest boots a kernel under TCG, several
//! times slower than the host, so the guests run only what can differ from one kernel to the
//! next: loading and verifying the BPF programs, the tracepoints and their arguments, the task
//! iterator, the scheduler's accounting, /proc and the VFS as each kernel shows them, pid
//! namespaces, capabilities and seccomp, and the procfs fallback. Everything else (the pure
//! rules, parsers, replays, the Redis mirror, install, supervision) behaves the same on every
//! kernel and runs once, on the host. `cargo xtask vm --all-tests` runs every binary in every
//! guest (the full matrix), as before this split.
//!
//! Every test binary of the workspace must be named here: a new one that is not fails the VM
//! build with a message saying where to put it, so nothing silently stops being tested in the
//! guests.

/// Where one test binary runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// In every guest (and on the host). `only` names the tests to run there (libtest filters,
    /// matched exactly); empty means all of the binary's tests.
    Guests { why: &'static str, only: &'static [&'static str] },
    /// On the host only.
    Host { why: &'static str },
}

/// `(guest name, place)`; the guest name is `<package>.lib`, `<package>.<test target>` or
/// `<package>.bin-<bin>` (payload.rs).
pub const SUITE: &[(&str, Place)] = &[
    // In the guests: what depends on the kernel.
    (
        "guard-user.lib",
        Place::Guests {
            why: "/proc parsing, BTF offsets, pidfd identity checks and the account-file opens (O_PATH, \
                  O_NOFOLLOW, FIFOs) on each kernel",
            only: &[],
        },
    ),
    ("guard-user.ebpf_source", Place::Guests { why: "BPF load, verifier and tracepoint arguments", only: &[] }),
    (
        "guard-user.ebpf_filter",
        Place::Guests {
            why: "the account filter and the commit_creds hook (or its fallbacks) on each kernel",
            only: &[],
        },
    ),
    ("guard-user.task_iter", Place::Guests { why: "the BPF task iterator against /proc", only: &[] }),
    (
        "guard-user.kernel_names",
        Place::Guests { why: "the name every source reports (BPF events, iterator, /proc) at every length", only: &[] },
    ),
    ("guard-user.cpu_runtime", Place::Guests { why: "the tp_btf sched_stat_runtime accounting", only: &[] }),
    (
        "guard-user.matcher_sandbox",
        Place::Guests { why: "seccomp, rlimits and capabilities as the kernel applies them", only: &[] },
    ),
    (
        "guard-user.hostile_files",
        Place::Guests { why: "links, FIFOs, devices and sockets as each kernel opens them", only: &[] },
    ),
    ("integration-tests.daemon", Place::Guests { why: "the whole guard on each kernel's events", only: &[] }),
    (
        "integration-tests.names",
        Place::Guests { why: "15-byte names set by exec and rename, ended through each kernel's events", only: &[] },
    ),
    (
        "integration-tests.memory_bounds",
        Place::Guests {
            why: "the daemon under a real 64M memory cgroup (v2 in the guests) with hostile files",
            only: &[],
        },
    ),
    ("integration-tests.no_btf", Place::Guests { why: "the procfs fallback (the no-btf guest)", only: &[] }),
    ("integration-tests.record", Place::Guests { why: "a trace of each kernel's events replays", only: &[] }),
    (
        "integration-tests.reliability",
        Place::Guests {
            why: "ring-buffer overflow and the kernel's lost-event counts (the other two tests are policy \
                  and file handling: host only)",
            only: &["lost_events_trigger_a_resync_after_which_the_table_equals_proc"],
        },
    ),
    (
        "integration-tests.reliability_boundary",
        Place::Guests { why: "other uids, pid namespaces and pid reuse", only: &[] },
    ),
    (
        "integration-tests.redteam",
        Place::Guests {
            why: "the account's tricks against each kernel: signal handlers racing the pidfd kill, a zombie leader \
                  in /proc and the BPF events, exec's argument limit and /proc/PID/cmdline of a rewritten argv",
            only: &[],
        },
    ),
    ("integration-tests.stall", Place::Guests { why: "the scheduler's runtime of a real spinner", only: &[] }),
    (
        "integration-tests.slots",
        Place::Guests {
            why: "the cgroup v2 freezer and cgroup migration on each kernel (vm-init mounts cgroup2 at \
                  /sys/fs/cgroup), exec wake-ups from the BPF programs, a job-control shell under a pty",
            only: &[],
        },
    ),
    (
        "integration-tests.sessions",
        Place::Guests {
            why: "session lineage from each kernel's fork, exec, rename and setuid events (setsid, double forks, \
                  reparenting), pidfd signals to leftovers, and pid reuse in a throwaway guest",
            only: &[],
        },
    ),
    (
        "integration-tests.holders",
        Place::Guests {
            why: "what holds a path as each kernel's /proc shows it: statx through /proc links, `..` across mounts, \
                  PROCMAP_QUERY (6.11+) or the text of maps, kcmp, per-thread cwd and fd tables, a zombie leader, \
                  chroot and bind mounts, against lsof",
            only: &[],
        },
    ),
    (
        "integration-tests.sessions_lineage",
        Place::Guests {
            why: "the lineage through each kernel's credential events: members visiting another uid through a \
                  real set-user-ID program, a root leaving the account, tree from root's copy (the 4,100 and \
                  1,024 crowds test the tick's bounds, and the pid hopper is a race a TCG guest's speed decides: \
                  host only)",
            only: &[
                "members_that_visit_another_uid_through_a_set_user_id_program_stay_in_their_session",
                "a_root_that_leaves_the_account_has_ended_and_what_it_starts_is_its_leftover",
                "tree_lists_reported_leftovers_from_roots_copy_until_they_exit",
            ],
        },
    ),
    // On the host only: the same on every kernel.
    ("guard-common.lib", Place::Host { why: "layout constants checked at compile time" }),
    ("guard-cli.lib", Place::Host { why: "the command-line definitions (clap), no kernel" }),
    ("guard-user.bin-guard-user", Place::Host { why: "no tests in main.rs" }),
    ("guard-user.account_rule", Place::Host { why: "whom each subcommand names by default, as root and not" }),
    ("guard-user.doc_claims", Place::Host { why: "what the docs and man pages claim, against the binary" }),
    ("guard-user.fuzz_inputs", Place::Host { why: "parsers and the matcher on generated input" }),
    ("guard-user.log_grammar", Place::Host { why: "the log's text" }),
    (
        "guard-user.matcher",
        Place::Host { why: "glibc's regex engine behind the bounds (the sandbox is matcher_sandbox)" },
    ),
    ("guard-user.matcher_cache", Place::Host { why: "the verdict cache and round budget over a real worker" }),
    ("guard-user.matcher_measure", Place::Host { why: "a measurement, ignored by default" }),
    ("guard-user.metrics", Place::Host { why: "the Prometheus text" }),
    ("guard-user.mirror_offline", Place::Host { why: "endpoint and fleet text" }),
    ("guard-user.operator_output", Place::Host { why: "validate and journal output" }),
    ("guard-user.json_schema", Place::Host { why: "the JSON outputs against docs/json.md" }),
    ("guard-user.pattern_oracle", Place::Host { why: "patterns against bash" }),
    ("guard-user.redteam_rules", Place::Host { why: "verdicts and warnings from the account's inputs, no kernel" }),
    ("guard-user.redis_mirror", Place::Host { why: "a real redis-server on loopback" }),
    (
        "guard-user.redis_hostile",
        Place::Host { why: "the reply budget against a hostile listener on loopback, no kernel" },
    ),
    ("guard-user.replay", Place::Host { why: "recorded traces through the daemon, no kernel" }),
    ("guard-user.replay_foresight", Place::Host { why: "recorded traces through the daemon, no kernel" }),
    ("guard-user.sessions_replay", Place::Host { why: "recorded session traces through the daemon, no kernel" }),
    ("guard-user.status_view", Place::Host { why: "the status file's reader" }),
    ("integration-tests.lib", Place::Host { why: "the daemon-level helpers, no tests" }),
    ("guard-test.lib", Place::Host { why: "the test harness's own rules (GUARD_TESTS_REQUIRE, waits, the generator)" }),
    ("guard-test-macros.lib", Place::Host { why: "the #[guard_test] attribute, no tests" }),
    ("integration-tests.bin-guard-probe", Place::Host { why: "the probe, no tests" }),
    ("integration-tests.cadence", Place::Host { why: "tick cadence under load: timing, meaningless under TCG" }),
    ("integration-tests.foresight", Place::Host { why: "WARNING and REPEAT: policy over real probes" }),
    (
        "integration-tests.hostile_home",
        Place::Host { why: "the daemon over hostile files; each kernel's file semantics are hostile_files" },
    ),
    (
        "integration-tests.hostile",
        Place::Host {
            why: "every hostile shape at once under a 64M cgroup for minutes: the budgets are the daemon's, \
                  the same on every kernel, and memory_bounds covers each kernel's cgroup",
        },
    ),
    ("integration-tests.install", Place::Host { why: "files and a fake systemctl" }),
    ("integration-tests.install_hostile", Place::Host { why: "files and a fake systemctl" }),
    ("integration-tests.install_source", Place::Host { why: "files and a fake systemctl" }),
    ("integration-tests.redis", Place::Host { why: "a real redis-server on loopback" }),
    ("integration-tests.supervise", Place::Host { why: "sd_notify sockets, signals and the watchdog" }),
];

/// The guest binaries whose outcome can depend on the machine's architecture, not only on the
/// kernel: what `--arch-subset` keeps in a guest of another architecture than the build
/// machine's (CI's arm64 guest, to stay inside CI's time). The others (cgroups, pid namespaces,
/// /proc files, exec's limits, replays) test the kernel's generic code, which the x86_64 guests
/// of the same kernel versions cover; `cargo xtask vm --arch arm64` runs them all.
pub const ARCH_DEPENDENT: &[(&str, &str)] = &[
    ("guard-user.lib", "BTF offsets of the architecture's structures, the setuid family's syscall numbers"),
    ("guard-user.ebpf_source", "the BPF JIT and verifier of the architecture"),
    ("guard-user.ebpf_filter", "the credential hook or its fallback, the 32-bit compat syscalls"),
    ("guard-user.task_iter", "the task iterator through the JIT"),
    ("guard-user.kernel_names", "names read by the programs through the JIT"),
    ("guard-user.cpu_runtime", "sched_stat_runtime through the JIT"),
    ("guard-user.matcher_sandbox", "seccomp: the architecture's syscall numbers and audit arch"),
    ("integration-tests.daemon", "the whole guard end to end"),
    ("integration-tests.sessions", "session lineage from setuid events (the fallback on arm64 6.1)"),
];

/// Unit-test binaries (libtest's harness) whose `#[ignore = "needs …"]` tests are the ones that
/// need the machine (guard-test's `need::here`): the guests run them all, and each says why it
/// returns early where its need is missing and not required (BTF in the no-btf guest).
pub const INCLUDE_IGNORED: &[&str] = &["guard-user.lib"];

/// What a guest must run, as `GUARD_TESTS_REQUIRE` (guard-test's needs): a test that needs one
/// of these and finds it missing fails there instead of being ignored. Every guest is root in a
/// throwaway kernel with a cgroup v2 memory controller and freezer (vm-init mounts cgroup2; every
/// kernel of the matrix is 5.10 or later) and the default pid space, and every
/// Debian kernel booted (amd64 and arm64) runs 32-bit programs (ia32 emulation, AArch32 under
/// qemu's `max` CPU); the kernel has BTF (and then the ebpf backend loads, when the image has
/// the BPF object) unless it is the no-btf guest; redis-server is in the image when the host
/// (or, for another architecture, that architecture's packages) has one. The same for every
/// architecture's guest, `--arch-subset` or not.
pub fn guest_requires(hides_btf: bool, bpf_object: bool, redis: bool) -> String {
    let mut needs = vec!["root", "guest", "memory_cgroup", "freezer", "pid_space", "compat32"];
    if hides_btf {
        needs.push("no_btf");
    } else {
        needs.push("btf");
        if bpf_object {
            needs.push("ebpf");
        }
    }
    if redis {
        needs.push("redis");
    }
    needs.join(",")
}

/// Host tooling: never in a guest, whatever the options.
pub const HOST_TOOLING: &[&str] = &["xtask", "vm-init"];

/// Where `name` runs, or an error naming this file when nobody decided.
pub fn place(name: &str) -> anyhow::Result<Place> {
    if let Some(package) = name.split('.').next().filter(|p| HOST_TOOLING.contains(p)) {
        return Ok(Place::Host { why: if package == "xtask" { "host tooling" } else { "the guest's init itself" } });
    }
    SUITE.iter().find(|(n, _)| *n == name).map(|(_, p)| *p).ok_or_else(|| {
        anyhow::anyhow!(
            "test binary {name} is not in xtask/src/vm/suite.rs: add it as Place::Guests (it depends on the \
             kernel) or Place::Host (it does not), with the reason"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_is_listed_once_and_filters_only_narrow_guest_binaries() {
        for (i, (name, place)) in SUITE.iter().enumerate() {
            assert!(SUITE[i + 1..].iter().all(|(n, _)| n != name), "{name} is listed twice");
            if let Place::Guests { only, .. } = place {
                assert!(only.iter().all(|t| !t.is_empty()), "{name}: an empty filter would match every test");
            }
        }
    }

    /// Every test binary `cargo test --workspace` builds is placed here, so the VM step never
    /// fails late (after the host tests) on a test file added without a place.
    #[test]
    fn every_test_binary_of_the_workspace_has_a_place() {
        let out = std::process::Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
            .args(["metadata", "--no-deps", "--format-version", "1"])
            .current_dir(crate::build_ebpf::workspace_root())
            .output()
            .expect("cargo metadata");
        let metadata: serde_json::Value = serde_json::from_slice(&out.stdout).expect("cargo metadata's JSON");
        let mut unplaced = Vec::new();
        for package in metadata["packages"].as_array().expect("packages") {
            let name = package["name"].as_str().unwrap_or_default();
            for target in package["targets"].as_array().into_iter().flatten() {
                let target_name = target["name"].as_str().unwrap_or_default();
                let kinds: Vec<&str> =
                    target["kind"].as_array().into_iter().flatten().filter_map(|k| k.as_str()).collect();
                let guest_name = match kinds.first().copied() {
                    Some("lib" | "rlib" | "proc-macro") => format!("{name}.lib"),
                    Some("bin") => format!("{name}.bin-{target_name}"),
                    Some("test") => format!("{name}.{target_name}"),
                    _ => continue,
                };
                if place(&guest_name).is_err() {
                    unplaced.push(guest_name);
                }
            }
        }
        assert!(unplaced.is_empty(), "add these to xtask/src/vm/suite.rs: {unplaced:?}");
    }

    #[test]
    fn the_architecture_dependent_binaries_are_guest_binaries() {
        for (name, _) in ARCH_DEPENDENT {
            assert!(matches!(place(name), Ok(Place::Guests { .. })), "{name} is not a guest binary");
        }
    }

    #[test]
    fn the_no_btf_guest_requires_the_fallback_and_the_others_the_ebpf_backend() {
        assert_eq!(guest_requires(true, true, false), "root,guest,memory_cgroup,freezer,pid_space,compat32,no_btf");
        assert_eq!(
            guest_requires(false, true, true),
            "root,guest,memory_cgroup,freezer,pid_space,compat32,btf,ebpf,redis"
        );
        // --skip-ebpf without an object: the ebpf tests are ignored there, not failed.
        assert_eq!(guest_requires(false, false, false), "root,guest,memory_cgroup,freezer,pid_space,compat32,btf");
    }

    #[test]
    fn an_unlisted_binary_is_an_error_that_says_where_to_list_it() {
        let err = place("guard-user.brand_new").unwrap_err().to_string();
        assert!(err.contains("xtask/src/vm/suite.rs"), "{err}");
        assert!(matches!(place("xtask.bin-xtask"), Ok(Place::Host { .. })));
        assert!(matches!(place("integration-tests.daemon"), Ok(Place::Guests { .. })));
    }
}
