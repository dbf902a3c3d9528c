//! Loading the BPF programs in a test: the loaded source, or `None` with the reason printed where
//! this machine cannot run the test — not root, a kernel without BTF, or a build without the BPF
//! object (plain `cargo test`; `cargo xtask test` builds it). Any other load error fails the test.

use guard::ebpf::{EbpfError, EbpfOptions, EbpfSource};

/// `EbpfSource::load(opts)` for the test named `test`, or `None` with the reason it was skipped.
pub fn load(test: &str, opts: &EbpfOptions) -> Option<EbpfSource> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped {test}: needs root to load BPF programs (run `cargo xtask test` as root)");
        return None;
    }
    if !std::path::Path::new(guard::btf::VMLINUX).exists() {
        eprintln!("skipped {test}: no {} (a kernel without CONFIG_DEBUG_INFO_BTF)", guard::btf::VMLINUX);
        return None;
    }
    match EbpfSource::load(opts) {
        Ok(src) => Some(src),
        Err(e @ EbpfError::NoObject) => {
            eprintln!("skipped {test}: {e}");
            None
        }
        Err(e) => panic!("{test}: loading the BPF programs: {e}"),
    }
}
