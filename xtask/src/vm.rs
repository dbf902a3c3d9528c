//! `cargo xtask vm [--kernel 6.12] [-- <cargo test args>]`: guard's tests inside qemu guests
//! booting several Debian kernels (aya's VM test layout).
//!
//! 1. qemu-system-x86_64 is installed if missing (from bookworm-backports; [`qemu`]);
//! 2. the kernels are resolved through Debian's `linux-image-cloud-amd64` metapackage with a
//!    private apt configuration and cached under `target/vm/kernels` ([`kernels`]);
//! 3. the BPF object, then statically linked test binaries, guard-user, guard-probe and vm-init
//!    are built into `target/vm/build` ([`payload`]);
//! 4. one uncompressed cpio initramfs holds all of it ([`initramfs`], [`cpio`]);
//! 5. each kernel boots it under TCG; vm-init runs the tests and prints `init: success` or
//!    `init: failure`; a matrix of the results ends the run, which fails if any kernel did.
//!
//! Console logs are kept in `target/vm/logs/<kernel>.log`.
use std::{
    ffi::OsString,
    fs,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};

use crate::{arch::Arch, build_ebpf};

pub(crate) mod apt;
mod cpio;
mod initramfs;
pub(crate) mod kernels;
mod matrix;
mod package;
mod payload;
mod qemu;
mod suite;
mod systemd;
mod userland;

#[derive(clap::Args, Clone, Debug)]
pub struct Options {
    /// Boot only these kernels (repeatable or comma-separated): 5.10, 6.1, 6.12, 7.x, no-btf (6.1
    /// with /sys/kernel/btf hidden) of each `--arch`; `arm64-6.1` names one architecture's kernel
    /// whatever `--arch` says, and `arm64` alone all of its kernels. Default: every kernel of
    /// each `--arch`.
    #[arg(long, value_delimiter = ',')]
    pub kernel: Vec<String>,
    /// The guests' architectures (repeatable or comma-separated): amd64 (the build machine's,
    /// its own test build) and arm64 (cross-built, Debian's arm64 kernels and packages under
    /// qemu-system-aarch64: 6.1 and 6.12). Every selected guest shares the `--jobs` pool.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "amd64")]
    pub arch: Vec<Arch>,
    /// Instead of the test suite: boot a Debian rootfs with a real systemd (one kernel, default 6.12)
    /// and run guard-user install → check → drift → check there ([`systemd`]).
    #[arg(long)]
    pub systemd: bool,
    /// With --systemd: install the Debian package (`cargo xtask dist`) in the guest and run
    /// guard-user from it (apt install → install → a pile ended → check → reinstall, remove, purge).
    /// Without it, for arm64 guests: instead of the test binaries, the arm64 package (`cargo
    /// xtask dist --arch arm64`) installed with dpkg in the plain guest, where its guard-user
    /// ends a pile ([`package`]).
    #[arg(long, conflicts_with = "all_tests")]
    pub package: bool,
    /// Resolve and download the kernels, print them, and stop.
    #[arg(long)]
    pub list_kernels: bool,
    /// Seconds one guest may run, boot included, before qemu is killed.
    #[arg(long, default_value_t = 1800)]
    pub timeout: u64,
    /// Seconds until vm-init's first line before the boot counts as hung.
    #[arg(long, default_value_t = 180)]
    pub boot_timeout: u64,
    /// Guest memory (qemu -m).
    #[arg(long, default_value = "2G")]
    pub memory: String,
    /// Guest CPUs (qemu -smp).
    #[arg(long, default_value_t = 2)]
    pub cpus: u32,
    /// Guests booted at once (each keeps about one host core busy under TCG).
    #[arg(long, default_value_t = 2)]
    pub jobs: usize,
    /// After the kernels' guests, in the same pool of `--jobs`: the systemd guest (`--systemd`,
    /// then `--systemd --package`), so it fills the core the last kernel's guest leaves idle.
    #[arg(long, conflicts_with = "systemd")]
    pub with_systemd: bool,
    /// Extra kernel command-line words (e.g. "loglevel=7" to see the kernel's messages).
    #[arg(long, default_value = "")]
    pub cmdline: String,
    /// An argument for every test binary, after --test-threads=1 (repeatable; e.g. a test name filter).
    #[arg(long = "test-arg", allow_hyphen_values = true)]
    pub test_args: Vec<String>,
    /// Also run the long tests (GUARD_LONG_TESTS=1 in the guest).
    #[arg(long)]
    pub long: bool,
    /// Do not build the BPF object; embed whatever guard-ebpf/target already holds.
    #[arg(long)]
    pub skip_ebpf: bool,
    /// Every test binary, all of its tests, in every guest (the full matrix). By default the
    /// guests run only the binaries that depend on the kernel (`vm/suite.rs`).
    #[arg(long)]
    pub all_tests: bool,
    /// Guests of another architecture than the build machine's (arm64) run only the binaries
    /// whose outcome can depend on the architecture (`vm/suite.rs`, `ARCH_DEPENDENT`): CI's
    /// arm64 guest, to fit CI's time.
    #[arg(long, conflicts_with = "all_tests")]
    pub arch_subset: bool,
    /// Arguments for `cargo test --no-run` instead of `--workspace` (after `--`, e.g.
    /// `-- -p guard-user --lib`).
    #[arg(last = true)]
    pub cargo_args: Vec<OsString>,
}

/// One row of the final matrix.
struct Row {
    kernel: kernels::Kernel,
    outcome: Result<qemu::Outcome, String>,
}

pub fn run(opts: Options) -> anyhow::Result<()> {
    if opts.systemd && !opts.list_kernels {
        anyhow::ensure!(
            opts.arch == [Arch::Amd64],
            "--systemd boots the build machine's architecture only (an arm64 guest's package scenario is \
             `cargo xtask vm --arch arm64 --package`)"
        );
        return systemd::run(&opts);
    }
    let mut kernels = Vec::new();
    for (arch, names) in kernels::by_arch(&opts.kernel, &opts.arch)? {
        kernels.extend(kernels::prepare(&kernels::select(&names, arch)?, arch)?);
    }
    if opts.list_kernels {
        for k in &kernels {
            println!(
                "{:10} linux-image-cloud-{} {} ({}) → {}; vmlinuz from {}: {}",
                k.label,
                k.arch.debian(),
                k.meta_version,
                k.suite,
                k.package,
                k.downloaded.join(" "),
                k.vmlinuz.display()
            );
        }
        return Ok(());
    }
    for k in &kernels {
        if let Some(missing) =
            k.config.as_deref().map(|c| missing_config(c, k.arch)).transpose()?.filter(|m| !m.is_empty())
        {
            println!("vm: WARNING: kernel {} lacks {}", k.label, missing.join(", "));
        }
    }
    let mut arches: Vec<Arch> = Vec::new();
    for k in &kernels {
        if !arches.contains(&k.arch) {
            arches.push(k.arch);
        }
    }
    anyhow::ensure!(
        !opts.package || arches.iter().all(|a| !a.is_host()),
        "--package without --systemd is the arm64 guests' package scenario; the build machine's is `--systemd --package`"
    );
    let mut qemus = Vec::new();
    for &arch in &arches {
        qemus.push((arch, qemu::ensure_installed(arch)?));
    }

    let ebpf_object = if opts.skip_ebpf {
        let default = build_ebpf::workspace_root().join("guard-ebpf/target/bpfel-unknown-none/release/guard");
        default.is_file().then_some(default)
    } else {
        Some(build_ebpf::build(&build_ebpf::Options::default())?)
    };
    let vm_dir = build_ebpf::target_dir().join("vm");
    let mut initrds = Vec::new();
    for &arch in &arches {
        let started = Instant::now();
        let built = image(&opts, arch, ebpf_object.as_deref(), &vm_dir)?;
        println!("vm: {} image ready in {:.1}s", arch.debian(), started.elapsed().as_secs_f64());
        initrds.push((arch, built));
    }
    let qemu_of =
        |arch: Arch| qemus.iter().find(|(a, _)| *a == arch).map(|(_, q)| q.clone()).expect("qemu of every arch");
    let image_of = |arch: Arch| initrds.iter().find(|(a, _)| *a == arch).map(|(_, i)| i).expect("image of every arch");

    let logs = vm_dir.join("logs");
    fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
    // Guests run `jobs` at a time: each runs one test at a time (`--test-threads=1`), so one
    // guest keeps about one host core busy under TCG and two side by side use the CI machine's
    // two cores (the VM step's time nearly halves). Their console lines carry the kernel's name.
    // The pool starts another architecture's guests first: emulating arm64 under TCG is the
    // slowest, and the longest job started first leaves no core idle at the end.
    let mut order: Vec<(usize, kernels::Kernel)> = kernels.into_iter().enumerate().collect();
    order.sort_by_key(|(i, k)| (k.arch.is_host(), *i));
    order.reverse();
    let queue = std::sync::Mutex::new(order);
    let done = std::sync::Mutex::new(Vec::new());
    let boot_one = |kernel: kernels::Kernel| -> anyhow::Result<Row> {
        let log = logs.join(format!("{}.log", kernel.label));
        let (qemu, image) = (qemu_of(kernel.arch), image_of(kernel.arch));
        let started = Instant::now();
        // What this guest must run (vm-init exports it as GUARD_TESTS_REQUIRE): a test that
        // needs it and finds it missing fails the guest instead of being ignored. Every
        // architecture's guest declares the same way; redis is what its own image carries.
        let requires = suite::guest_requires(
            kernel.cmdline.split_whitespace().any(|w| w == "guard.hide_btf"),
            ebpf_object.is_some(),
            image.redis,
        );
        let cmdline = format!("{} guard.require={requires} {}", kernel.cmdline, opts.cmdline);
        let boot = qemu::Boot {
            name: &kernel.label,
            arch: kernel.arch,
            qemu: &qemu,
            vmlinuz: &kernel.vmlinuz,
            initrd: &image.path,
            memory: &opts.memory,
            cpus: opts.cpus,
            cmdline: cmdline.trim(),
            boot_timeout: Duration::from_secs(opts.boot_timeout),
            timeout: Duration::from_secs(opts.timeout),
            log: &log,
        };
        let mut outcome = qemu::boot(&boot).map_err(|err| format!("{err:#}"));
        // A guest that never reached its init (no test ran) is booted once more: under TCG a
        // 7.3 guest kernel once died at boot of an emulation fault (invalid opcode on a patched
        // nop in hrtimer code) that the next boot did not repeat. A failing or hanging test
        // suite is never retried.
        if let Ok(qemu::Outcome { verdict: qemu::Verdict::Broken(why), boot_time: None, .. }) = &outcome {
            let first = logs.join(format!("{}.first-boot.log", kernel.label));
            println!(
                "vm: kernel {} did not boot ({why}); booting it once more (first console log: {})",
                kernel.label,
                first.display()
            );
            fs::rename(&log, &first).with_context(|| format!("keeping {}", log.display()))?;
            outcome = qemu::boot(&boot).map_err(|err| format!("{err:#}"));
        }
        println!(
            "vm: kernel {} done in {:.1}s (console log: {})",
            kernel.label,
            started.elapsed().as_secs_f64(),
            log.display()
        );
        Ok(Row { kernel, outcome })
    };
    // The systemd guest waits until no kernel is left to start: it runs beside the last one.
    let systemd_job = std::sync::Mutex::new(opts.with_systemd);
    let systemd_result = std::sync::Mutex::new(None);
    // The systemd guest is the build machine's architecture: it boots the amd64 kernels named
    // (`--kernel 6.1`, `amd64-6.1`), its default (6.12) when they are all or none.
    let systemd_kernels: Vec<String> = kernels::by_arch(&opts.kernel, &opts.arch)?
        .into_iter()
        .find(|(arch, _)| *arch == Arch::Amd64)
        .map(|(_, names)| names)
        .unwrap_or_default();
    let run_systemd = || -> anyhow::Result<()> {
        let source = Options {
            systemd: true,
            package: false,
            with_systemd: false,
            kernel: systemd_kernels.clone(),
            arch: vec![Arch::Amd64],
            ..opts.clone()
        };
        systemd::run(&source)?;
        systemd::run(&Options { package: true, ..source })
    };
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..opts.jobs.max(1))
            .map(|_| {
                s.spawn(|| -> anyhow::Result<()> {
                    loop {
                        let next = queue.lock().unwrap().pop();
                        if let Some((i, kernel)) = next {
                            let row = boot_one(kernel)?;
                            done.lock().unwrap().push((i, row));
                        } else if std::mem::take(&mut *systemd_job.lock().unwrap()) {
                            *systemd_result.lock().unwrap() = Some(run_systemd());
                        } else {
                            return Ok(());
                        }
                    }
                })
            })
            .collect();
        workers.into_iter().try_for_each(|w| w.join().expect("a guest's thread panicked"))
    })?;
    let mut rows = done.into_inner().unwrap();
    rows.sort_by_key(|(i, _)| *i);
    let rows: Vec<Row> = rows.into_iter().map(|(_, row)| row).collect();

    print_matrix(&rows);
    let failed: Vec<&str> = rows
        .iter()
        .filter(|r| !matches!(&r.outcome, Ok(o) if o.verdict == qemu::Verdict::Passed))
        .map(|r| r.kernel.label.as_str())
        .collect();
    let systemd = systemd_result.into_inner().unwrap().transpose();
    if !failed.is_empty() {
        if let Err(e) = &systemd {
            println!("vm: the systemd guest failed too: {e:#}");
        }
        bail!("the VM tests failed on kernel {}", failed.join(", "));
    }
    systemd.map(|_| ()).context("the systemd guest")
}

/// One architecture's image.
struct Image {
    /// `target/vm/initramfs.cpio`, `initramfs-arm64.cpio`.
    path: std::path::PathBuf,
    /// It carries redis-server (the host's, or the architecture's package): the guests require
    /// `redis`.
    redis: bool,
}

/// Builds the guests' payload for `arch` and writes its image.
fn image(
    opts: &Options,
    arch: Arch,
    ebpf_object: Option<&std::path::Path>,
    vm_dir: &std::path::Path,
) -> anyhow::Result<Image> {
    arch.ensure_toolchain()?;
    let userland = if arch.is_host() { None } else { Some(userland::Userland::prepare(arch)?) };
    let redis = match &userland {
        None => build_ebpf::which("redis-server").is_some(),
        Some(userland) => userland.tool("redis-server").is_some(),
    };
    let selection = payload::Selection {
        arch,
        cargo_args: &opts.cargo_args,
        all_tests: opts.all_tests,
        own_filters: !opts.test_args.is_empty(),
        arch_subset: opts.arch_subset,
    };
    let (built, extra) =
        if opts.package { package::payload(arch)? } else { (payload::build(&selection, ebpf_object)?, Vec::new()) };
    if !built.host_only.is_empty() {
        println!(
            "vm: left to the host (`cargo xtask test`; --all-tests runs them here too): {}",
            built.host_only.iter().map(|(name, _)| name.as_str()).collect::<Vec<_>>().join(", ")
        );
    }
    let mut env = Vec::new();
    if opts.long {
        env.push(("GUARD_LONG_TESTS".to_string(), "1".to_string()));
    }
    let initrd = vm_dir.join(if arch.is_host() {
        "initramfs.cpio".to_string()
    } else {
        format!("initramfs-{}.cpio", arch.debian())
    });
    let size = initramfs::write(
        &initrd,
        &initramfs::Payload {
            init: built.init,
            tests: &built.tests,
            bins: &built.bins,
            test_args: opts.test_args.clone(),
            env,
            userland: userland.as_ref(),
            extra,
        },
    )?;
    println!(
        "vm: {} ({} MiB): {}",
        initrd.display(),
        size >> 20,
        built
            .tests
            .iter()
            .map(|t| if t.args.is_empty() { t.name.clone() } else { format!("{} ({})", t.name, t.args.join(" ")) })
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(Image { path: initrd, redis })
}

fn print_matrix(rows: &[Row]) {
    let secs = |d: Option<Duration>| d.map(|d| format!("{:.1}s", d.as_secs_f64())).unwrap_or_else(|| "-".into());
    let mut table = vec![["kernel", "package", "version string", "result", "boot", "suite"].map(String::from)];
    let mut notes = Vec::new();
    for row in rows {
        let k = &row.kernel;
        let package = format!("{} {}", k.package, k.meta_version);
        let line = match &row.outcome {
            Ok(o) => {
                let result = match &o.verdict {
                    qemu::Verdict::Passed => "pass".to_string(),
                    qemu::Verdict::Failed => "FAIL".to_string(),
                    qemu::Verdict::Broken(why) => {
                        notes.push(format!("{}: {why}", k.label));
                        "BROKEN".to_string()
                    }
                };
                [
                    k.label.clone(),
                    package,
                    o.release.clone().unwrap_or_else(|| "-".into()),
                    result,
                    secs(o.boot_time),
                    secs(o.suite_time),
                ]
            }
            Err(err) => {
                notes.push(format!("{}: {err}", k.label));
                [k.label.clone(), package, "-".into(), "ERROR".into(), "-".into(), "-".into()]
            }
        };
        table.push(line);
    }
    let widths: Vec<usize> = (0..6).map(|c| table.iter().map(|r| r[c].chars().count()).max().unwrap_or(0)).collect();
    println!();
    for (i, row) in table.iter().enumerate() {
        let cells: Vec<String> = row.iter().zip(&widths).map(|(cell, w)| format!("{cell:w$}")).collect();
        println!("| {} |", cells.join(" | "));
        if i == 0 {
            println!("|{}|", widths.iter().map(|w| "-".repeat(w + 2)).collect::<Vec<_>>().join("|"));
        }
    }
    for note in notes {
        println!("  {note}");
    }
}

/// Kernel options guard's tests rely on that a config lacks (`=y` required: the guest loads no
/// modules). The console is the 8250 UART on x86_64 and the virt board's PL011 on arm64.
fn missing_config(config: &std::path::Path, arch: Arch) -> anyhow::Result<Vec<&'static str>> {
    const NEEDED: &[&str] = &[
        "CONFIG_BPF_SYSCALL",
        "CONFIG_DEBUG_INFO_BTF",
        "CONFIG_BPF_EVENTS",
        "CONFIG_TRACING",
        "CONFIG_CGROUP_BPF",
        "CONFIG_DEVTMPFS",
        "CONFIG_TMPFS",
        "CONFIG_BLK_DEV_INITRD",
    ];
    let console = match arch {
        Arch::Amd64 => "CONFIG_SERIAL_8250_CONSOLE",
        Arch::Arm64 => "CONFIG_SERIAL_AMBA_PL011_CONSOLE",
    };
    let text = fs::read_to_string(config).with_context(|| format!("reading {}", config.display()))?;
    Ok(NEEDED
        .iter()
        .copied()
        .chain([console])
        .filter(|option| !text.lines().any(|l| l == format!("{option}=y")))
        .collect())
}
