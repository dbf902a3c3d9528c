//! Embeds the BPF object built by `cargo xtask build-ebpf`.
//!
//! xtask sets `GUARD_EBPF_OBJ` to the object's path. Without it (a plain `cargo build`), the
//! default location under guard-ebpf/target is tried; if that does not exist either, an empty
//! object is embedded and `guard-user run --backend ebpf` says the binary was built without
//! BPF programs (the procfs backend still works).
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
        Err(_) => {
            println!("cargo:warning=no BPF object at {} (run `cargo xtask build`): embedding none", src.display());
            fs::write(&out, b"").unwrap();
        }
    }
}
