//! Structure offsets from the running kernel's BTF (`/sys/kernel/btf/vmlinux`), so one BPF
//! object works on every kernel: the programs read `task_struct` fields at the offsets this
//! module finds.
//!
//! A deliberately small parser (format: Documentation/bpf/btf.rst): it indexes the type
//! section, then answers three questions — where is `struct.member` (looking through anonymous
//! nested structs and unions, which `task_struct` uses), how big is that member, and what is a
//! tracepoint's prototype (`btf_trace_<name>`: typedef → pointer → func_proto). aya 0.14 does
//! parse BTF, but its type tables are not public API.
use std::path::{Path, PathBuf};

use guard_common::{KernelOffsets, COMM_LEN};

pub const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    #[error("cannot read {}: {source} (the kernel needs CONFIG_DEBUG_INFO_BTF)", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{}: not BTF data ({what})", path.display())]
    Format { path: PathBuf, what: &'static str },
    #[error("{}: no `{ty}.{member}` in the kernel's BTF", path.display())]
    Missing { path: PathBuf, ty: String, member: String },
    #[error("{}: `{ty}.{member}` is {found} bytes, expected {expected}", path.display())]
    Layout { path: PathBuf, ty: String, member: String, found: u32, expected: u32 },
    #[error("{}: `task_struct.tgid` is at {tgid}, not right after `pid` at {pid} (the programs read both at once)", path.display())]
    PidTgidApart { path: PathBuf, pid: u32, tgid: u32 },
    #[error("{}: no prototype `btf_trace_{name}` for the tracepoint `{name}`", path.display())]
    Tracepoint { path: PathBuf, name: String },
}

const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC: u32 = 12;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

/// One entry of the type section (`struct btf_type`).
#[derive(Clone, Debug)]
struct Type {
    name_off: u32,
    kind: u32,
    vlen: u32,
    /// For structs/unions: member offsets are `bitfield_size << 24 | bit_offset`.
    kind_flag: bool,
    /// `size` or `type`, depending on the kind.
    size_type: u32,
    /// Byte offset in `data` of the kind-specific data that follows the entry.
    extra: usize,
}

/// Where a member sits, from the start of the outer struct, and its type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Member {
    /// Byte offset (of the byte holding the first bit, for a bitfield).
    pub offset: u32,
    pub bit_offset: u32,
    /// Width of a bitfield, 0 for a plain member.
    pub bitfield_bits: u32,
    pub type_id: u32,
}

/// A parsed BTF blob: enough to find struct members and tracepoint prototypes.
pub struct Btf {
    path: PathBuf,
    data: Vec<u8>,
    /// index = type id - 1 (id 0 is `void`).
    types: Vec<Type>,
    str_start: usize,
    str_len: usize,
}

impl Btf {
    pub fn from_file(path: &Path) -> Result<Btf, BtfError> {
        let data = std::fs::read(path).map_err(|source| BtfError::Read { path: path.into(), source })?;
        Btf::parse(path, data)
    }

    /// `path` only names the source in errors.
    pub fn parse(path: &Path, data: Vec<u8>) -> Result<Btf, BtfError> {
        let bad = |what| BtfError::Format { path: path.into(), what };
        let u32_at = |o: usize| data.get(o..o + 4).map(|b| u32::from_le_bytes(b.try_into().unwrap()));
        if data.len() < 24 || data[0..2] != [0x9f, 0xeb] {
            return Err(bad("bad magic (big-endian BTF is not supported)"));
        }
        let hdr_len = u32_at(4).ok_or(bad("short header"))? as usize;
        let type_off = u32_at(8).ok_or(bad("short header"))? as usize;
        let type_len = u32_at(12).ok_or(bad("short header"))? as usize;
        let str_off = u32_at(16).ok_or(bad("short header"))? as usize;
        let str_len = u32_at(20).ok_or(bad("short header"))? as usize;
        let t0 = hdr_len.checked_add(type_off).ok_or(bad("type section out of bounds"))?;
        let tend = t0.checked_add(type_len).filter(|&e| e <= data.len()).ok_or(bad("type section out of bounds"))?;
        let str_start = hdr_len.checked_add(str_off).ok_or(bad("string section out of bounds"))?;
        if str_start.checked_add(str_len).is_none_or(|e| e > data.len()) {
            return Err(bad("string section out of bounds"));
        }
        let mut types = Vec::new();
        let mut o = t0;
        while o + 12 <= tend {
            let info = u32_at(o + 4).unwrap();
            let kind = (info >> 24) & 0x1f;
            let vlen = info & 0xffff;
            let extra = o + 12;
            let extra_len = match kind {
                1 => 4,                                // INT: encoding
                3 => 12,                               // ARRAY: btf_array
                4 | 5 | 15 | 19 => 12 * vlen as usize, // STRUCT/UNION members, DATASEC vars, ENUM64
                6 | 13 => 8 * vlen as usize,           // ENUM values, FUNC_PROTO params
                14 | 17 => 4,                          // VAR linkage, DECL_TAG component
                2 | 7 | 8 | 9 | 10 | 11 | 12 | 16 | 18 => 0,
                _ => return Err(bad("unknown type kind")),
            };
            if extra + extra_len > tend {
                return Err(bad("type entry runs past the type section"));
            }
            types.push(Type {
                name_off: u32_at(o).unwrap(),
                kind,
                vlen,
                kind_flag: info >> 31 == 1,
                size_type: u32_at(o + 8).unwrap(),
                extra,
            });
            o = extra + extra_len;
        }
        Ok(Btf { path: path.into(), data, types, str_start, str_len })
    }

    fn u32_at(&self, o: usize) -> u32 {
        u32::from_le_bytes(self.data[o..o + 4].try_into().unwrap())
    }

    fn name(&self, off: u32) -> &[u8] {
        if off as usize >= self.str_len {
            return b"";
        }
        let s = self.str_start + off as usize;
        let strings = &self.data[s..self.str_start + self.str_len];
        &strings[..strings.iter().position(|&b| b == 0).unwrap_or(strings.len())]
    }

    /// `self.name(off) == name`, without measuring the string first (`find` asks it of every
    /// type of a kind: tens of thousands of functions).
    fn name_is(&self, off: u32, name: &[u8]) -> bool {
        let (off, end) = (off as usize, off as usize + name.len());
        end < self.str_len
            && self.data[self.str_start + off..self.str_start + end] == *name
            && self.data[self.str_start + end] == 0
    }

    fn ty(&self, id: u32) -> Option<&Type> {
        id.checked_sub(1).and_then(|i| self.types.get(i as usize))
    }

    /// Whether the kernel has the tracepoint `name` (its `btf_trace_<name>` prototype).
    pub fn has_tracepoint(&self, name: &str) -> bool {
        self.find(&format!("btf_trace_{name}"), KIND_TYPEDEF).is_some()
    }

    fn find(&self, name: &str, kind: u32) -> Option<u32> {
        // Prefer a complete definition: a struct may also appear as an empty forward copy.
        let mut found = None;
        for (i, t) in self.types.iter().enumerate() {
            if t.kind == kind && self.name_is(t.name_off, name.as_bytes()) {
                if kind != KIND_STRUCT || t.vlen > 0 {
                    return Some(i as u32 + 1);
                }
                found.get_or_insert(i as u32 + 1);
            }
        }
        found
    }

    /// Skips typedef/const/volatile/restrict/type_tag.
    fn strip(&self, mut id: u32) -> u32 {
        for _ in 0..32 {
            match self.ty(id) {
                Some(t)
                    if matches!(t.kind, KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG) =>
                {
                    id = t.size_type
                }
                _ => break,
            }
        }
        id
    }

    /// Size in bytes of type `id`, if it has one (not void, not a function).
    pub fn size_of(&self, id: u32) -> Option<u32> {
        let t = self.ty(self.strip(id))?;
        match t.kind {
            KIND_INT | KIND_STRUCT | KIND_UNION | KIND_ENUM | KIND_ENUM64 => Some(t.size_type),
            KIND_PTR => Some(8),
            KIND_ARRAY => {
                let elem = self.u32_at(t.extra);
                let n = self.u32_at(t.extra + 8);
                self.size_of(elem)?.checked_mul(n)
            }
            _ => None,
        }
    }

    /// The member named `member` of struct/union `id`, looking into anonymous members.
    fn member_in(&self, id: u32, member: &str, depth: u32) -> Option<Member> {
        let t = self.ty(id)?;
        if !matches!(t.kind, KIND_STRUCT | KIND_UNION) || depth > 8 {
            return None;
        }
        for m in 0..t.vlen as usize {
            let base = t.extra + 12 * m;
            let name = self.name(self.u32_at(base));
            let type_id = self.u32_at(base + 4);
            let raw = self.u32_at(base + 8);
            let (bits, width) = if t.kind_flag { (raw & 0x00ff_ffff, raw >> 24) } else { (raw, 0) };
            if name == member.as_bytes() {
                return Some(Member { offset: bits / 8, bit_offset: bits, bitfield_bits: width, type_id });
            }
            if name.is_empty() {
                if let Some(inner) = self.member_in(self.strip(type_id), member, depth + 1) {
                    let bit_offset = bits + inner.bit_offset;
                    return Some(Member { offset: bit_offset / 8, bit_offset, ..inner });
                }
            }
        }
        None
    }

    pub fn member(&self, ty: &str, member: &str) -> Result<Member, BtfError> {
        let missing = || BtfError::Missing { path: self.path.clone(), ty: ty.into(), member: member.into() };
        let id = self.find(ty, KIND_STRUCT).ok_or_else(missing)?;
        self.member_in(id, member, 0).ok_or_else(missing)
    }

    #[cfg(test)]
    fn member_offset(&self, ty: &str, member: &str) -> Result<u32, BtfError> {
        Ok(self.member(ty, member)?.offset)
    }

    /// The member's offset, after checking that it is `size` bytes (the BPF side reads exactly
    /// that many, so a changed type must fail here rather than yield garbage).
    fn sized_member(&self, ty: &str, member: &str, size: u32) -> Result<u32, BtfError> {
        let m = self.member(ty, member)?;
        let found = self.size_of(m.type_id).unwrap_or(0);
        if found != size {
            return Err(BtfError::Layout {
                path: self.path.clone(),
                ty: ty.into(),
                member: member.into(),
                found,
                expected: size,
            });
        }
        Ok(m.offset)
    }

    /// A one-bit field as (byte offset, mask within that byte), for a little-endian layout.
    /// None if there is no such member or it is not a one-bit field.
    fn flag_bit(&self, ty: &str, member: &str) -> Option<(u32, u32)> {
        let m = self.member(ty, member).ok()?;
        (m.bitfield_bits == 1).then(|| (m.bit_offset / 8, 1 << (m.bit_offset % 8)))
    }

    /// The parameter types of the tracepoint's BTF prototype `btf_trace_<name>` (typedef →
    /// pointer → func_proto), as type ids. The first is always the `void *` context.
    pub fn tracepoint_params(&self, name: &str) -> Result<Vec<u32>, BtfError> {
        let missing = || BtfError::Tracepoint { path: self.path.clone(), name: name.into() };
        let td = self.find(&format!("btf_trace_{name}"), KIND_TYPEDEF).ok_or_else(missing)?;
        let ptr = self.ty(self.ty(td).ok_or_else(missing)?.size_type).ok_or_else(missing)?;
        if ptr.kind != KIND_PTR {
            return Err(missing());
        }
        let proto = self.ty(ptr.size_type).ok_or_else(missing)?;
        if proto.kind != KIND_FUNC_PROTO {
            return Err(missing());
        }
        Ok((0..proto.vlen as usize).map(|i| self.u32_at(proto.extra + 8 * i + 4)).collect())
    }

    /// A BTF blob for aya's program loaders, parsed in a few milliseconds: aya only needs the
    /// kernel's type ids of the tracepoints' `btf_trace_<name>` typedefs and of the functions
    /// it attaches to or iterates with (`commit_creds`, `bpf_iter_task`: `BtfTracePoint::load`,
    /// `FEntry::load`, `Iter::load`), while parsing the whole vmlinux BTF costs it ~20 ms of CPU
    /// and megabytes of heap on every start. The stub keeps every type id of the kernel up to
    /// the last one asked for: the asked-for types are real (name and kind), every other id is
    /// an anonymous `void *`. A function the kernel does not have is left out (its program then
    /// fails to load, and the caller falls back).
    pub fn aya_stub(&self, tracepoints: &[&str], functions: &[&str]) -> Result<aya::Btf, BtfError> {
        let blob = self.stub_blob(tracepoints, functions)?;
        aya::Btf::parse(&blob, aya::Endianness::Little)
            .map_err(|_| BtfError::Format { path: self.path.clone(), what: "aya refused the stub BTF" })
    }

    /// The bytes of [`Self::aya_stub`].
    fn stub_blob(&self, tracepoints: &[&str], functions: &[&str]) -> Result<Vec<u8>, BtfError> {
        let mut wanted: Vec<(u32, String)> = Vec::new();
        for tp in tracepoints {
            let name = format!("btf_trace_{tp}");
            let id = self
                .find(&name, KIND_TYPEDEF)
                .ok_or_else(|| BtfError::Tracepoint { path: self.path.clone(), name: tp.to_string() })?;
            wanted.push((id, name));
        }
        for name in functions {
            if let Some(id) = self.find(name, KIND_FUNC) {
                wanted.push((id, name.to_string()));
            }
        }
        wanted.sort();
        let last = wanted.last().map_or(0, |w| w.0);
        let mut strings = vec![0u8];
        let mut types = Vec::with_capacity(12 * last as usize);
        let mut next = wanted.iter().peekable();
        for id in 1..=last {
            let (name_off, info) = match next.peek() {
                Some((wid, name)) if *wid == id => {
                    let off = strings.len() as u32;
                    strings.extend_from_slice(name.as_bytes());
                    strings.push(0);
                    next.next();
                    // Same kind as the kernel's entry (and, for a function, its linkage in vlen).
                    let t = &self.types[id as usize - 1];
                    (off, t.kind << 24 | t.vlen)
                }
                _ => (0, KIND_PTR << 24),
            };
            for v in [name_off, info, 0] {
                types.extend_from_slice(&v.to_le_bytes());
            }
        }
        let mut blob = Vec::with_capacity(24 + types.len() + strings.len());
        blob.extend_from_slice(&[0x9f, 0xeb, 1, 0]);
        for v in [24u32, 0, types.len() as u32, types.len() as u32, strings.len() as u32] {
            blob.extend_from_slice(&v.to_le_bytes());
        }
        blob.extend_from_slice(&types);
        blob.extend_from_slice(&strings);
        Ok(blob)
    }

    /// Every offset the BPF programs need.
    pub fn kernel_offsets(&self) -> Result<KernelOffsets, BtfError> {
        let t = |m, size| self.sized_member("task_struct", m, size);
        // sched_process_exit(p) became sched_process_exit(p, group_dead) in Linux 6.16
        // (include/trace/events/sched.h); with the context pointer that is 3 parameters.
        let exit = self.tracepoint_params("sched_process_exit")?;
        let exit_has_group_dead = exit.len() >= 3 && self.size_of(exit[2]) == Some(1);
        // Optional: without it exec yields an extra RENAME, which is harmless.
        let (task_in_execve, in_execve_mask) = self.flag_bit("task_struct", "in_execve").unwrap_or((0, 0));
        // The task iterator reads a thread's CPU time from its CFS entity, the one field the
        // scheduler keeps for every policy (update_curr_common() for RT/DL too).
        let se = self.member("task_struct", "se")?.offset;
        let sum_exec_runtime = self.sized_member("sched_entity", "sum_exec_runtime", 8)?;
        let (task_pid, task_tgid) = (t("pid", 4)?, t("tgid", 4)?);
        if task_tgid != task_pid + 4 {
            return Err(BtfError::PidTgidApart { path: self.path.clone(), pid: task_pid, tgid: task_tgid });
        }
        Ok(KernelOffsets {
            task_pid,
            task_tgid,
            task_flags: t("flags", 4)?,
            task_comm: t("comm", COMM_LEN as u32)?,
            // `real_cred`, the objective credentials, is what /proc/PID/status shows and so
            // what `ps -u` selects (docs/architecture.md); `cred` differs only inside override_creds().
            task_cred: t("real_cred", 8)?,
            task_start_boottime: t("start_boottime", 8)?,
            task_group_leader: t("group_leader", 8)?,
            task_signal: t("signal", 8)?,
            signal_live: self.sized_member("signal_struct", "live", 4)?,
            cred_euid: self.sized_member("cred", "euid", 4)?,
            cred_uid: self.sized_member("cred", "uid", 4)?,
            task_in_execve,
            in_execve_mask,
            exit_has_group_dead: exit_has_group_dead as u32,
            task_exit_state: t("exit_state", 4)?,
            task_sum_exec_runtime: se + sum_exec_runtime,
            signal_sum_sched_runtime: self.sized_member("signal_struct", "sum_sched_runtime", 8)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tests that read the running kernel's BTF (`cargo xtask test` runs them where it has
    /// one: guard-test's `need::here`).
    mod needs_btf {
        use super::*;

        /// The running kernel's BTF, where it has one (these tests run with `--ignored`, see
        /// guard-test's `need::here`).
        fn kernel_btf() -> Option<Btf> {
            use guard_test::need::{here, Need};
            if !here(&[Need::Btf], guard_test::Facts { bpf_object: crate::ebpf::object_embedded() }) {
                return None;
            }
            Some(Btf::from_file(Path::new(VMLINUX)).unwrap())
        }

        #[test]
        #[ignore = "needs the kernel's BTF: `cargo xtask test` runs it (--ignored)"]
        fn the_running_kernels_offsets_resolve_and_are_plausible() {
            let Some(btf) = kernel_btf() else { return };
            let o = btf.kernel_offsets().unwrap();
            assert_eq!(o.task_tgid, o.task_pid + 4, "pid and tgid are adjacent pid_t fields: {o:?}");
            for (name, v) in [
                ("flags", o.task_flags),
                ("comm", o.task_comm),
                ("cred", o.task_cred),
                ("start_boottime", o.task_start_boottime),
                ("group_leader", o.task_group_leader),
                ("signal", o.task_signal),
            ] {
                assert!(v > 0 && v < 16384, "task_struct.{name} at {v}: {o:?}");
            }
            // task_struct begins with thread_info/__state; flags is one of the first fields.
            assert!(o.task_flags < 64, "{o:?}");
            assert!(o.cred_euid > 0 && o.cred_euid < 64, "{o:?}");
            assert!(o.signal_live < 64, "{o:?}");
            assert!(o.task_exit_state > o.task_flags && o.task_exit_state < 16384, "{o:?}");
            assert!(o.task_sum_exec_runtime > o.task_flags && o.task_sum_exec_runtime < 16384, "{o:?}");
            assert!(o.signal_sum_sched_runtime > o.signal_live && o.signal_sum_sched_runtime < 4096, "{o:?}");
            if btf.member("task_struct", "in_execve").is_ok() {
                assert!(o.in_execve_mask.is_power_of_two() && o.in_execve_mask < 256, "{o:?}");
                assert!(o.task_in_execve > 0, "{o:?}");
            }
            let comm = btf.member("task_struct", "comm").unwrap();
            assert_eq!(btf.size_of(comm.type_id), Some(COMM_LEN as u32));
        }

        #[test]
        #[ignore = "needs the kernel's BTF: `cargo xtask test` runs it (--ignored)"]
        fn a_missing_member_is_an_error_naming_the_path_and_member() {
            let Some(btf) = kernel_btf() else { return };
            let e = btf.member_offset("task_struct", "no_such_member").unwrap_err();
            let text = e.to_string();
            assert!(text.contains(VMLINUX) && text.contains("task_struct.no_such_member"), "{text}");
            assert!(matches!(btf.tracepoint_params("no_such_tracepoint"), Err(BtfError::Tracepoint { .. })));
        }

        #[test]
        #[ignore = "needs the kernel's BTF: `cargo xtask test` runs it (--ignored)"]
        fn members_inside_anonymous_unions_are_found() {
            // cred.euid is plain, but task_struct wraps many fields in anonymous structs (the
            // randomized-layout block); `__state` sits outside, `pid` inside on most configs.
            let Some(btf) = kernel_btf() else { return };
            // `state` became `__state` in Linux 5.14.
            let outer =
                btf.member_offset("task_struct", "__state").or_else(|_| btf.member_offset("task_struct", "state")).unwrap();
            let pid = btf.member_offset("task_struct", "pid").unwrap();
            assert!(pid > outer);
        }

        #[test]
        #[ignore = "needs the kernel's BTF: `cargo xtask test` runs it (--ignored)"]
        fn exit_tracepoint_variant_matches_the_kernel_version() {
            let Some(btf) = kernel_btf() else { return };
            let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
            let mut it = release.trim().split(['.', '-']).map(|s| s.parse::<u32>().unwrap_or(0));
            let (major, minor) = (it.next().unwrap(), it.next().unwrap());
            let o = btf.kernel_offsets().unwrap();
            // Distribution kernels may backport the change, so only check the newer direction.
            if (major, minor) >= (6, 16) {
                assert_eq!(o.exit_has_group_dead, 1, "{release}");
            }
            let params = btf.tracepoint_params("sched_process_fork").unwrap();
            assert_eq!(params.len(), 3, "ctx, parent, child");
        }

        #[test]
        #[ignore = "needs the kernel's BTF: `cargo xtask test` runs it (--ignored)"]
        fn the_aya_stub_keeps_the_kernels_ids_for_what_aya_looks_up() {
            let Some(btf) = kernel_btf() else { return };
            let blob = btf.stub_blob(&["sched_process_fork", "task_rename"], &["bpf_iter_task", "commit_creds"]).unwrap();
            let stub = Btf::parse(Path::new("stub"), blob.clone()).unwrap();
            for (name, kind) in [
                ("btf_trace_sched_process_fork", KIND_TYPEDEF),
                ("btf_trace_task_rename", KIND_TYPEDEF),
                ("bpf_iter_task", KIND_FUNC),
                ("commit_creds", KIND_FUNC),
            ] {
                assert_eq!(stub.find(name, kind), btf.find(name, kind), "{name}");
                assert!(stub.find(name, kind).is_some(), "{name}");
            }
            assert!(blob.len() < 12 * btf.types.len() + 1024, "fillers are 12 bytes each");
            btf.aya_stub(&["sched_process_fork"], &["bpf_iter_task", "no_such_function"]).expect("aya parses the stub");
            assert!(matches!(btf.aya_stub(&["no_such_tracepoint"], &[]), Err(BtfError::Tracepoint { .. })));
        }
    }

    #[test]
    fn garbage_is_a_format_error_not_a_panic() {
        let p = Path::new("/test");
        assert!(matches!(Btf::parse(p, vec![0; 10]), Err(BtfError::Format { .. })));
        let mut hdr = vec![0x9f, 0xeb, 1, 0, 24, 0, 0, 0];
        hdr.extend_from_slice(&0u32.to_le_bytes()); // type_off
        hdr.extend_from_slice(&1000u32.to_le_bytes()); // type_len beyond the data
        hdr.extend_from_slice(&0u32.to_le_bytes());
        hdr.extend_from_slice(&0u32.to_le_bytes());
        assert!(matches!(Btf::parse(p, hdr), Err(BtfError::Format { .. })));
    }
}
