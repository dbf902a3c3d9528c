//! Structure offsets from the running kernel's BTF (`/sys/kernel/btf/vmlinux`), so one BPF
//! object works on every kernel: the programs read `task_struct` fields at the offsets this
//! module finds (format: Documentation/bpf/btf.rst).
use std::path::{Path, PathBuf};

use guard_common::KernelOffsets;

pub const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    #[error("cannot read {}: {source} (the kernel needs CONFIG_DEBUG_INFO_BTF)", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{}: not BTF data ({what})", path.display())]
    Format { path: PathBuf, what: &'static str },
    #[error("{}: no `{ty}.{member}` in the kernel's BTF", path.display())]
    Missing { path: PathBuf, ty: String, member: String },
}

const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_TYPEDEF: u32 = 8;
const KIND_PTR: u32 = 2;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_TYPE_TAG: u32 = 18;

#[derive(Clone, Debug)]
struct Type {
    name_off: u32,
    kind: u32,
    vlen: u32,
    kind_flag: bool,
    /// size or referenced type id
    size_type: u32,
    /// byte offset of the kind-specific data
    extra: usize,
}

/// A parsed BTF blob: enough to find struct members and typedefs.
pub struct Btf {
    path: PathBuf,
    data: Vec<u8>,
    types: Vec<Type>, // index = type id - 1
    str_start: usize,
    str_len: usize,
}

impl Btf {
    pub fn from_file(path: &Path) -> Result<Btf, BtfError> {
        let data = std::fs::read(path).map_err(|source| BtfError::Read { path: path.into(), source })?;
        Btf::parse(path, data)
    }

    fn parse(path: &Path, data: Vec<u8>) -> Result<Btf, BtfError> {
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
        let t0 = hdr_len + type_off;
        let tend = t0.checked_add(type_len).filter(|&e| e <= data.len()).ok_or(bad("type section out of bounds"))?;
        let str_start = hdr_len + str_off;
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
                1 => 4,
                3 => 12,
                4 | 5 => 12 * vlen as usize,
                6 => 8 * vlen as usize,
                13 => 8 * vlen as usize,
                14 => 4,
                15 => 12 * vlen as usize,
                17 => 4,
                19 => 12 * vlen as usize,
                2 | 7 | 8 | 9 | 10 | 11 | 12 | 16 | 18 => 0,
                _ => return Err(bad("unknown type kind")),
            };
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
        let s = self.str_start + off as usize;
        if off as usize >= self.str_len {
            return b"";
        }
        let end = self.data[s..self.str_start + self.str_len].iter().position(|&b| b == 0).map(|p| s + p).unwrap_or(s);
        &self.data[s..end]
    }

    fn ty(&self, id: u32) -> Option<&Type> {
        id.checked_sub(1).and_then(|i| self.types.get(i as usize))
    }

    fn find(&self, name: &str, kind: u32) -> Option<u32> {
        // Prefer a complete definition (structs may appear as empty forward copies).
        let mut found = None;
        for (i, t) in self.types.iter().enumerate() {
            if t.kind == kind && self.name(t.name_off) == name.as_bytes() {
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
                Some(t) if matches!(t.kind, KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG) => {
                    id = t.size_type
                }
                _ => break,
            }
        }
        id
    }

    /// Byte offset of `member` in struct/union `id`, looking into anonymous members.
    fn member_in(&self, id: u32, member: &str, depth: u32) -> Option<u32> {
        let t = self.ty(id)?;
        if !matches!(t.kind, KIND_STRUCT | KIND_UNION) || depth > 8 {
            return None;
        }
        for m in 0..t.vlen as usize {
            let base = t.extra + 12 * m;
            let name_off = self.u32_at(base);
            let mty = self.u32_at(base + 4);
            let raw = self.u32_at(base + 8);
            let bits = if t.kind_flag { raw & 0x00ff_ffff } else { raw };
            let name = self.name(name_off);
            if name == member.as_bytes() {
                return Some(bits / 8);
            }
            if name.is_empty() {
                if let Some(inner) = self.member_in(self.strip(mty), member, depth + 1) {
                    return Some(bits / 8 + inner);
                }
            }
        }
        None
    }

    pub fn member_offset(&self, ty: &str, member: &str) -> Result<u32, BtfError> {
        let missing = || BtfError::Missing { path: self.path.clone(), ty: ty.into(), member: member.into() };
        let id = self.find(ty, KIND_STRUCT).ok_or_else(missing)?;
        self.member_in(id, member, 0).ok_or_else(missing)
    }

    /// Number of arguments (after the leading `void *`) of the tracepoint's prototype
    /// `btf_trace_<name>` (typedef → pointer → func_proto), if present.
    pub fn tracepoint_args(&self, name: &str) -> Option<u32> {
        let td = self.find(&format!("btf_trace_{name}"), KIND_TYPEDEF)?;
        let ptr = self.ty(self.ty(td)?.size_type)?;
        if ptr.kind != KIND_PTR {
            return None;
        }
        let proto = self.ty(ptr.size_type)?;
        (proto.kind == KIND_FUNC_PROTO).then(|| proto.vlen.saturating_sub(1))
    }

    /// Every offset the BPF programs need; `ready` is left 0 for the loader to set last.
    pub fn kernel_offsets(&self) -> Result<KernelOffsets, BtfError> {
        let t = |m| self.member_offset("task_struct", m);
        Ok(KernelOffsets {
            task_pid: t("pid")?,
            task_tgid: t("tgid")?,
            task_flags: t("flags")?,
            task_comm: t("comm")?,
            task_cred: t("cred")?,
            task_start_boottime: t("start_boottime")?,
            task_group_leader: t("group_leader")?,
            task_signal: t("signal")?,
            signal_live: self.member_offset("signal_struct", "live")?,
            cred_euid: self.member_offset("cred", "euid")?,
            // Linux 6.16 added `bool group_dead` to sched_process_exit.
            exit_has_group_dead: (self.tracepoint_args("sched_process_exit").unwrap_or(1) >= 2) as u32,
            ready: 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_running_kernels_offsets_resolve() {
        let Ok(btf) = Btf::from_file(Path::new(VMLINUX)) else {
            eprintln!("skipped: no readable {VMLINUX}");
            return;
        };
        let o = btf.kernel_offsets().unwrap();
        assert!(o.task_tgid == o.task_pid + 4, "pid and tgid are adjacent pid_t fields: {o:?}");
        assert!(o.task_comm > 0 && o.task_cred > 0 && o.task_start_boottime > 0);
        assert!(o.cred_euid > 0 && o.cred_euid < 64);
        assert!(btf.member_offset("task_struct", "no_such_member").is_err());
    }
}
