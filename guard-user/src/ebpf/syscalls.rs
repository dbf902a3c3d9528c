//! The setuid family as the credential fallback's programs recognise it on the raw syscall
//! tracepoints: this architecture's syscall numbers, native and 32-bit compat, and where the
//! running kernel shows that a syscall is a compat one (offsets from its BTF).
//!
//! Where the `commit_creds` hook cannot attach, the fallback watches every syscall's entry and
//! exit (`sys_enter`/`sys_exit`) and keeps only the setuid family. The per-syscall tracepoints
//! (`syscalls/sys_exit_setresuid`, …) would be cheaper to filter but never fire for a compat
//! syscall (`trace_get_syscall_nr()` answers -1 for them), so a process could re-enter the
//! account through `setresuid32` (`int 0x80` on x86_64, an AArch32 program on arm64) unseen
//! until the audit. Each number below is from the kernel's syscall tables (x86_64:
//! arch/x86/entry/syscalls/syscall_64.tbl and syscall_32.tbl; arm64: include/uapi/asm-generic/
//! unistd.h and arch/arm64/include/asm/unistd32.h); they are ABI and never change.
use guard_common::SetuidSyscalls;

use crate::btf::{Btf, BtfError};

/// This architecture's numbers and compat flag, with the offsets from `btf`.
pub(super) fn setuid_syscalls(btf: &Btf) -> Result<SetuidSyscalls, BtfError> {
    arch::syscalls(btf)
}

#[cfg(target_arch = "x86_64")]
mod arch {
    use super::*;

    /// `TS_COMPAT` (arch/x86/include/asm/thread_info.h): set in `thread_info.status` while a
    /// 32-bit syscall runs, whichever way it entered (`int 0x80` from a 64-bit program too).
    const TS_COMPAT: u32 = 0x0002;
    /// x32's syscalls are the 64-bit ones with this bit set (`__X32_SYSCALL_BIT`).
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;

    pub(super) fn syscalls(btf: &Btf) -> Result<SetuidSyscalls, BtfError> {
        let thread_info = btf.member("task_struct", "thread_info")?.offset;
        let status = btf.member("thread_info", "status")?.offset;
        Ok(SetuidSyscalls {
            regs_nr: btf.member("pt_regs", "orig_ax")?.offset,
            compat_in_regs: 0,
            compat_off: thread_info + status,
            compat_mask: TS_COMPAT,
            native_mask: !X32_SYSCALL_BIT,
            // setuid, setreuid, setresuid (syscall_64.tbl).
            native: [105, 113, 117],
            // setuid, setreuid, setresuid (16-bit uids), setreuid32, setresuid32, setuid32
            // (syscall_32.tbl).
            compat: [23, 70, 164, 203, 208, 213],
        })
    }
}

#[cfg(target_arch = "aarch64")]
mod arch {
    use super::*;

    /// `PSR_MODE32_BIT` (arch/arm64/include/uapi/asm/ptrace.h): the saved PSTATE of an AArch32
    /// task, the only kind that makes compat syscalls on arm64.
    const PSR_MODE32_BIT: u32 = 0x10;

    pub(super) fn syscalls(btf: &Btf) -> Result<SetuidSyscalls, BtfError> {
        Ok(SetuidSyscalls {
            regs_nr: btf.member("pt_regs", "syscallno")?.offset,
            compat_in_regs: 1,
            compat_off: btf.member("pt_regs", "pstate")?.offset,
            compat_mask: PSR_MODE32_BIT,
            native_mask: u32::MAX,
            // setreuid 145, setuid 146, setresuid 147 (asm-generic/unistd.h), in the order of
            // the other architectures: setuid, setreuid, setresuid.
            native: [146, 145, 147],
            // The ARM EABI numbers (unistd32.h), the same as i386's: setuid, setreuid,
            // setresuid (16-bit uids), setreuid32, setresuid32, setuid32.
            compat: [23, 70, 164, 203, 208, 213],
        })
    }
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
mod arch {
    use super::*;

    /// Numbers nobody checked for this architecture: the fallback stays off (the audit covers).
    pub(super) fn syscalls(_btf: &Btf) -> Result<SetuidSyscalls, BtfError> {
        Ok(SetuidSyscalls::NONE)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::btf::VMLINUX;

    /// Needs the running kernel's BTF (guard-test's `need::here`).
    mod needs_btf {
        use super::*;

        /// The running kernel's BTF has every field the fallback reads, at plausible offsets, and
        /// the numbers are this architecture's (the host's libc agrees with each of them).
        #[test]
        #[ignore = "needs the kernel's BTF: `cargo xtask test` runs it (--ignored)"]
        fn the_running_kernel_gives_the_fallback_its_offsets_and_libc_its_numbers() {
            use guard_test::need::{here, Need};
            if !here(&[Need::Btf], guard_test::Facts { bpf_object: crate::ebpf::object_embedded() }) {
                return;
            }
            let btf = Btf::from_file(Path::new(VMLINUX)).unwrap();
            let s = setuid_syscalls(&btf).unwrap();
            assert!(s.native_mask != 0 && s.compat_mask != 0, "{s:?}");
            assert!(s.regs_nr > 0 && s.regs_nr < 512 && s.compat_off < 16384, "{s:?}");
            let libc = [libc::SYS_setuid, libc::SYS_setreuid, libc::SYS_setresuid].map(|n| n as u32);
            assert_eq!(s.native, libc, "native numbers against libc's");
            // i386 and ARM EABI share these: setuid32 213, setreuid32 203, setresuid32 208.
            assert_eq!([s.compat[5], s.compat[3], s.compat[4]], [213, 203, 208]);
        }
    }
}
