//! Embeds the BPF object built by `cargo xtask build-ebpf`.
//!
//! xtask sets `GUARD_EBPF_OBJ` to the object's path. Without it (a plain `cargo build` or
//! `cargo test`), the default location under guard-ebpf/target is tried; if that does not exist
//! either, an empty object is embedded and the build says so loudly, on every build until there
//! is one (cargo re-runs this script while the path it watches is missing). Such a binary is
//! not one to ship: `guard-user run --backend ebpf` refuses with the fix, the default backend
//! falls back to procfs with `WARN backend_fallback reason=no_bpf_object`, and the tests that
//! need the ebpf backend are ignored (or fail, where the run requires it).
use std::{env, fs, path::PathBuf};

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let default = manifest.join("../guard-ebpf/target/bpfel-unknown-none/release/guard");
    println!("cargo:rerun-if-env-changed=GUARD_EBPF_OBJ");
    let src = env::var_os("GUARD_EBPF_OBJ").map(PathBuf::from).unwrap_or(default);
    println!("cargo:rerun-if-changed={}", src.display());
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("guard.bpf.o");
    match fs::read(&src) {
        Ok(bytes) => fs::write(&out, bytes).unwrap(),
        Err(e) => {
            for line in [
                format!("guard-user is built WITHOUT its BPF programs: no object at {} ({e})", src.display()),
                "  this binary's ebpf backend refuses to start (`run --backend ebpf`), the default backend falls \
                 back to procfs (WARN backend_fallback reason=no_bpf_object), and the tests that need the ebpf \
                 backend are ignored"
                    .to_string(),
                "  build with `cargo xtask build` (tests: `cargo xtask test`), which builds the BPF object first"
                    .to_string(),
            ] {
                println!("cargo:warning={line}");
            }
            fs::write(&out, b"").unwrap();
        }
    }
}
