//! The kernel lines of the VM test matrix: which Debian kernels are booted, for which
//! architectures, from which suites ([`super::kernels`] resolves and downloads them; [`super::apt`]
//! configures its sources from the suites named here).
use crate::arch::Arch;

/// One kernel line of the test matrix.
pub struct KernelSpec {
    /// What `--kernel` selects and the matrix shows.
    pub name: &'static str,
    /// The architectures it is booted for (Debian builds every line for amd64; arm64 guests
    /// boot Debian 12's and 13's kernels, the ones an arm64 workstation runs).
    pub arches: &'static [Arch],
    /// The metapackage version must start with this.
    pub(super) version_prefix: &'static str,
    /// Suites to take it from, in order of preference; the newest version among them wins.
    pub(super) suites: &'static [&'static str],
    /// Extra kernel command-line words for this line of the matrix.
    pub cmdline: &'static str,
}

const AMD64: &[Arch] = &[Arch::Amd64];
const BOTH: &[Arch] = &[Arch::Amd64, Arch::Arm64];

pub const KERNELS: &[KernelSpec] = &[
    // Debian 11's kernel (LTS), the oldest guard supports: tp_btf, ring buffers (5.8) and the
    // task iterator (5.8) are all there.
    KernelSpec {
        name: "5.10",
        arches: AMD64,
        version_prefix: "5.10.",
        suites: &["bullseye-security", "bullseye"],
        cmdline: "",
    },
    // Debian 12's kernel.
    KernelSpec {
        name: "6.1",
        arches: BOTH,
        version_prefix: "6.1.",
        suites: &["bookworm-security", "bookworm"],
        cmdline: "",
    },
    // Debian 13's kernel (also bookworm-backports).
    KernelSpec {
        name: "6.12",
        arches: BOTH,
        version_prefix: "6.12.",
        suites: &["trixie-security", "trixie", "bookworm-backports"],
        cmdline: "",
    },
    // The newest Debian builds: trixie-backports, else unstable.
    KernelSpec { name: "7.x", arches: AMD64, version_prefix: "7.", suites: &["trixie-backports", "sid"], cmdline: "" },
    // Debian 12's kernel with its BTF hidden (see the module doc): the daemon must fall back to
    // procfs, and everything but the BPF tests must pass.
    KernelSpec {
        name: "no-btf",
        arches: AMD64,
        version_prefix: "6.1.",
        suites: &["bookworm-security", "bookworm"],
        cmdline: "guard.hide_btf",
    },
];
