//! Loading the BPF programs in a test that declares `needs = [root, ebpf]`: the harness has
//! already ignored it (or failed it, where the run requires them) when this machine is not root,
//! has no BTF, or this build has no BPF object, so any load error here fails the test.

use guard::ebpf::{EbpfOptions, EbpfSource};

/// `EbpfSource::load(opts)`, or a panic with the reason.
pub fn load(opts: &EbpfOptions) -> EbpfSource {
    EbpfSource::load(opts).unwrap_or_else(|e| panic!("loading the BPF programs: {e} (reason={})", e.reason()))
}
