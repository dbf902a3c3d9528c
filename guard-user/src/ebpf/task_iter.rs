//! The BPF task iterator (`iter/task`, Linux ≥ 5.8): every process of the machine — identity,
//! effective uid, name and the group's CPU time — from one pass over the kernel's task list,
//! read as fixed-size records from one fd. It replaces the /proc scan for the start-up table,
//! the lost-event resync and the audit (about 12 µs of kernel time per process through /proc:
//! docs/BENCH.md), and gives the stall watch its CPU samples without reading a file per process.
//!
//! Kernel side: `task_iter` in guard-ebpf writes one [`TaskRecord`] per task that is not a
//! kernel thread; the last call of a session (no task) writes an end marker, and a task whose
//! record could not be built writes a broken marker, so a snapshot is trusted only when it is
//! complete ([`SnapshotError`]). Threads arrive as their own records and are folded into their
//! process here (see [`TaskRecord`] for why that sum is what /proc reports).
//!
//! Which processes count is the rule of `procfs::read_process` and SPEC §1: kernel threads
//! never, and a process counts until its whole thread group has exited. The iterator reads that
//! from `signal->live` (0 once every thread has passed `atomic_dec_and_test(&sig->live)` in
//! do_exit(), the same moment the EXIT event fires), so a zombie leader whose other threads
//! still run counts, and an exited group whose last thread is still being torn down does not
//! (/proc shows the latter for a few microseconds more; the EXIT event has already removed it
//! from the table, which this agrees with).
//!
//! Where the iterator cannot load (kernels before 5.8 have no `bpf_iter_task`; a verifier that
//! refuses the program), [`TaskIterError::reason`] gives the token of the daemon's
//! `WARN task_iter_fallback reason=<token>` line and /proc stays the source
//! ([`snapshot_states`]).
use std::{
    io::{self, Read},
    os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
    sync::Arc,
};

use aya::{programs::Iter, Btf as AyaBtf, Ebpf};
use guard_common::{TaskRecord, EXIT_DEAD, TASK_MARK_BROKEN, TASK_MARK_END};

use crate::{
    comm::Comm,
    event::{ns_to_ticks, ProcId, ProcState},
    procfs,
};

/// The program's name in the BPF object.
const PROGRAM: &str = "task_iter";
/// The kernel's function the iterator is typed by (its BTF id is what aya looks up).
pub const BTF_FUNCTION: &str = "bpf_iter_task";

#[derive(Debug, thiserror::Error)]
pub enum TaskIterError {
    #[error("this BPF object has no `{PROGRAM}` program")]
    NoProgram,
    #[error("the kernel has no BPF task iterator (`bpf_iter_task` needs Linux 5.8 or later): {detail}")]
    Unsupported { detail: String },
    /// EPERM: advice only where this process lacks the capabilities (never "needs root" to root).
    #[error("{}", if crate::ebpf::holds_bpf_capabilities() {
        format!("the kernel refused the task iterator although this process holds CAP_BPF and CAP_PERFMON ({detail})")
    } else {
        format!("loading the task iterator needs CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN): {detail}")
    })]
    Permission { detail: String },
    #[error("the kernel refused the task iterator: {detail}")]
    Refused { detail: String },
    #[error("cannot create the task iterator's link: {0}")]
    Link(io::Error),
}

impl TaskIterError {
    /// The token for `WARN task_iter_fallback reason=<token>` (one word, documented in
    /// docs/dev/kernel.md): the daemon then reads /proc for its snapshots.
    pub fn reason(&self) -> &'static str {
        match self {
            TaskIterError::NoProgram => "no_program",
            TaskIterError::Unsupported { .. } => "unsupported_kernel",
            TaskIterError::Permission { .. } => "permission_denied",
            TaskIterError::Refused { .. } => "verifier_refused",
            TaskIterError::Link(_) => "attach_failed",
        }
    }
}

/// Why a read of the iterator is not a snapshot to trust.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SnapshotError {
    #[error("the task iterator's output is {0} bytes, not a whole number of {size}-byte records", size = TaskRecord::SIZE)]
    Truncated(usize),
    #[error("the task iterator could not read {0} task(s): the snapshot would miss processes")]
    Broken(u64),
    #[error("the task iterator's output has no end marker: the snapshot may be incomplete")]
    NoEnd,
    #[error("the task iterator wrote a record after its end marker")]
    AfterEnd,
}

impl From<SnapshotError> for io::Error {
    fn from(e: SnapshotError) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, e)
    }
}

/// A loaded and attached task iterator. Cheap to clone and `Send`, so a snapshot can run on a
/// blocking thread while the event pump owns the [`super::EbpfSource`]; each snapshot is its own
/// iterator session (`BPF_ITER_CREATE` on the link), so concurrent snapshots do not interfere.
#[derive(Clone, Debug)]
pub struct TaskIter {
    /// The `BPF_LINK_CREATE` link, which also keeps the program loaded.
    link: Arc<OwnedFd>,
}

impl TaskIter {
    /// Loads `task_iter` from `ebpf` against the running kernel's BTF and attaches it.
    pub fn load(ebpf: &mut Ebpf, btf: &AyaBtf) -> Result<TaskIter, TaskIterError> {
        let prog: &mut Iter =
            ebpf.program_mut(PROGRAM).ok_or(TaskIterError::NoProgram)?.try_into().map_err(|e| {
                TaskIterError::Refused { detail: format!("`{PROGRAM}` is not an iterator program: {e}") }
            })?;
        prog.load("task", btf).map_err(|e| {
            let detail = super::describe(&e);
            match e {
                // No `bpf_iter_task` in the kernel's BTF: a kernel before 5.8.
                aya::programs::ProgramError::Btf(_) => TaskIterError::Unsupported { detail },
                e if super::is_permission(&e) => TaskIterError::Permission { detail },
                _ => TaskIterError::Refused { detail },
            }
        })?;
        let prog_fd = prog.fd().map_err(|e| TaskIterError::Refused { detail: e.to_string() })?;
        // aya's `IterLink::into_file` consumes the link, so one attach would give one read; the
        // link is created here instead and kept, and every snapshot opens a session on it.
        let link = link_create(prog_fd.as_fd()).map_err(TaskIterError::Link)?;
        Ok(TaskIter { link: Arc::new(link) })
    }

    /// Every task record of one iterator session, threads folded into their process, with only
    /// the processes that count (see the module doc). Each record's `cpu_ns` is its group's CPU
    /// time. Sorted by pid.
    pub fn snapshot(&self) -> io::Result<Vec<TaskRecord>> {
        let mut session = self.session()?;
        let mut folder = Folder::default();
        read_records(&mut session, |r| folder.push(r))?;
        Ok(folder.finish()?)
    }

    /// [`Self::snapshot`] as the table's process states (drop-in for `procfs::snapshot`).
    pub fn proc_states(&self) -> io::Result<Vec<ProcState>> {
        Ok(self.snapshot()?.iter().map(ProcState::from).collect())
    }

    /// The processes of `euid` with their CPU time (for the stall watch's per-tick sample).
    pub fn cpu_sample(&self, euid: u32) -> io::Result<Vec<CpuSample>> {
        Ok(self
            .snapshot()?
            .iter()
            .filter(|r| r.euid == euid)
            .map(|r| CpuSample { state: ProcState::from(r), cpu_ns: r.cpu_ns })
            .collect())
    }

    /// A new iterator session: a file whose reads run the program over the tasks.
    fn session(&self) -> io::Result<std::fs::File> {
        iter_create(self.link.as_fd())
    }
}

/// One process's CPU time at the moment of a sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuSample {
    pub state: ProcState,
    /// The whole group's CPU time (user + system) in ns; /proc/PID/stat's utime+stime are this
    /// value split and rounded to clock ticks (`cputime_adjust()`).
    pub cpu_ns: u64,
}

impl From<&TaskRecord> for ProcState {
    fn from(r: &TaskRecord) -> ProcState {
        ProcState {
            id: ProcId { pid: r.tgid, start_ticks: ns_to_ticks(r.start_boottime_ns) },
            euid: r.euid,
            comm: Comm::from_kernel(&r.comm),
        }
    }
}

/// The snapshot the daemon's rebuild needs, with the same shape as `procfs::snapshot`: the
/// iterator's when there is one and its read is complete, else /proc's (and why, on stderr).
pub fn snapshot_states(iter: Option<&TaskIter>) -> io::Result<Vec<ProcState>> {
    if let Some(it) = iter {
        match it.proc_states() {
            Ok(v) => return Ok(v),
            Err(e) => tracing::warn!("task iterator snapshot failed, reading /proc instead: {e}"),
        }
    }
    procfs::snapshot()
}

/// `GUARD_SNAPSHOT=procfs` forces the /proc scan for snapshots and CPU samples even where the
/// iterator loads (`cargo xtask bench --only snapshot` times the start-up both ways in one run).
pub fn forced_procfs() -> bool {
    std::env::var_os("GUARD_SNAPSHOT").is_some_and(|v| v == "procfs")
}

/// Decodes one record: exactly one `guard_common::TaskRecord`, read as that type.
fn decode(bytes: &[u8]) -> Result<TaskRecord, SnapshotError> {
    crate::pod::read(bytes).ok_or(SnapshotError::Truncated(bytes.len()))
}

/// The bytes the kernel writes for `r` (for tests).
#[cfg(test)]
fn encode(r: &TaskRecord) -> [u8; TaskRecord::SIZE] {
    let mut out = [0u8; TaskRecord::SIZE];
    out.copy_from_slice(crate::pod::bytes(r));
    out
}

/// Reads a session up to its end marker, passing each decoded record to `f`, which says whether
/// to go on (false: the end marker came). The kernel returns whole records only (an object that
/// does not fit is shown again by the next read: bpf_seq_read()), at most one seq buffer (8 pages)
/// per read, and the end marker last in its read. Reading stops there: the kernel's end is not
/// sticky, and a further read() would walk on to tasks created since (found by the concurrent
/// snapshot test on 6.1, whose own threads were such tasks). A fixed 64 KiB buffer keeps the
/// memory flat whatever the number of processes.
fn read_records(src: &mut impl Read, mut f: impl FnMut(TaskRecord) -> bool) -> io::Result<()> {
    let mut buf = vec![0u8; 64 << 10];
    let mut filled = 0;
    let mut more = true;
    while more {
        let n = match src.read(&mut buf[filled..]) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            break;
        }
        filled += n;
        let whole = filled / TaskRecord::SIZE * TaskRecord::SIZE;
        for rec in buf[..whole].chunks_exact(TaskRecord::SIZE) {
            // Records after the end marker in the same read are still handed over: the caller
            // treats them as the anomaly they would be.
            more &= f(decode(rec)?);
        }
        buf.copy_within(whole..filled, 0);
        filled -= whole;
    }
    if filled != 0 {
        return Err(SnapshotError::Truncated(filled).into());
    }
    Ok(())
}

/// Folds one session's records into processes: leader records keep their place, each other
/// thread's CPU time is added to its leader's.
#[derive(Default)]
struct Folder {
    leaders: Vec<TaskRecord>,
    /// (tgid, cpu ns) of non-leader threads.
    threads: Vec<(u32, u64)>,
    broken: u64,
    ended: bool,
    after_end: bool,
}

impl Folder {
    /// Takes one record; false once the session's end marker has come.
    fn push(&mut self, r: TaskRecord) -> bool {
        if self.ended {
            self.after_end = true;
        }
        if r.tgid == 0 {
            match r.tid {
                TASK_MARK_END => self.ended = true,
                TASK_MARK_BROKEN => self.broken += 1,
                _ => self.broken += 1,
            }
        } else if r.tid == r.tgid {
            self.leaders.push(r);
        } else if r.cpu_ns != 0 {
            self.threads.push((r.tgid, r.cpu_ns));
        }
        !self.ended
    }

    fn finish(mut self) -> Result<Vec<TaskRecord>, SnapshotError> {
        if self.broken > 0 {
            return Err(SnapshotError::Broken(self.broken));
        }
        if self.after_end {
            return Err(SnapshotError::AfterEnd);
        }
        if !self.ended {
            return Err(SnapshotError::NoEnd);
        }
        // The kernel walks tids in ascending order, so the leaders come sorted; sort anyway
        // rather than trust it.
        if !self.leaders.is_sorted_by_key(|r| r.tgid) {
            self.leaders.sort_unstable_by_key(|r| r.tgid);
        }
        for (tgid, cpu) in self.threads {
            if let Ok(i) = self.leaders.binary_search_by_key(&tgid, |r| r.tgid) {
                self.leaders[i].cpu_ns = self.leaders[i].cpu_ns.saturating_add(cpu);
            }
        }
        self.leaders.retain(counts);
        Ok(self.leaders)
    }
}

/// Whether a leader's record is a process that counts (module doc): some thread of its group
/// has not exited, and the leader is not being released.
fn counts(r: &TaskRecord) -> bool {
    r.live > 0 && r.live < 1 << 31 && r.exit_state & EXIT_DEAD == 0
}

/// `bpf(BPF_LINK_CREATE)` for an iterator program (`attach_type` BPF_TRACE_ITER, no
/// parameters: the task iterator takes none before Linux 6.1, and we want every task).
fn link_create(prog: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    const BPF_LINK_CREATE: libc::c_long = 28;
    const BPF_TRACE_ITER: u32 = 28;
    // union bpf_attr, link_create: prog_fd, target_fd, attach_type, flags, then a union whose
    // iter_info/iter_info_len stay 0. The kernel wants every byte past what it knows zeroed.
    let mut attr = [0u32; 32];
    attr[0] = prog.as_raw_fd() as u32;
    attr[2] = BPF_TRACE_ITER;
    bpf_fd(BPF_LINK_CREATE, &mut attr)
}

/// `bpf(BPF_ITER_CREATE)`: a new session of the iterator behind `link`.
fn iter_create(link: BorrowedFd<'_>) -> io::Result<std::fs::File> {
    const BPF_ITER_CREATE: libc::c_long = 33;
    let mut attr = [0u32; 32];
    attr[0] = link.as_raw_fd() as u32;
    bpf_fd(BPF_ITER_CREATE, &mut attr).map(std::fs::File::from)
}

fn bpf_fd(cmd: libc::c_long, attr: &mut [u32; 32]) -> io::Result<OwnedFd> {
    // SAFETY: `attr` is a zeroed bpf_attr of the size given; both commands return a new fd
    // (close-on-exec: the kernel opens BPF fds with O_CLOEXEC) or -1.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), std::mem::size_of_val(attr) as u32) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leader(pid: u32, cpu: u64) -> TaskRecord {
        let mut comm = [0u8; 16];
        comm[..5].copy_from_slice(b"sleep");
        TaskRecord {
            tgid: pid,
            tid: pid,
            euid: 1000,
            live: 1,
            start_boottime_ns: 1_230_000_000,
            cpu_ns: cpu,
            comm,
            ..TaskRecord::default()
        }
    }

    fn thread(tgid: u32, tid: u32, cpu: u64) -> TaskRecord {
        TaskRecord { tgid, tid, cpu_ns: cpu, ..TaskRecord::default() }
    }

    fn mark(kind: u32) -> TaskRecord {
        TaskRecord { tgid: 0, tid: kind, ..TaskRecord::default() }
    }

    fn session(records: &[TaskRecord]) -> Vec<u8> {
        records.iter().flat_map(encode).collect()
    }

    fn fold(bytes: &[u8]) -> io::Result<Vec<TaskRecord>> {
        let mut f = Folder::default();
        read_records(&mut &bytes[..], |r| f.push(r))?;
        Ok(f.finish()?)
    }

    #[test]
    fn a_record_round_trips_through_its_bytes() {
        let r = TaskRecord { exit_state: 0x20, live: 3, _pad: 0, ..leader(4242, 987_654_321) };
        assert_eq!(decode(&encode(&r)).unwrap(), r);
        assert_eq!(decode(&encode(&r)[..55]), Err(SnapshotError::Truncated(55)));
    }

    #[test]
    fn the_record_becomes_the_tables_process_state() {
        let s = ProcState::from(&leader(77, 0));
        assert_eq!(s.id, ProcId { pid: 77, start_ticks: ns_to_ticks(1_230_000_000) });
        assert_eq!((s.euid, s.comm.as_bytes()), (1000, &b"sleep"[..]));
    }

    #[test]
    fn threads_add_their_cpu_to_their_process_which_counts_once() {
        // A thread whose tid wrapped below its leader's comes first.
        let recs = [thread(300, 12, 5), leader(100, 1), leader(300, 100), thread(300, 301, 10), mark(TASK_MARK_END)];
        let procs = fold(&session(&recs)).unwrap();
        assert_eq!(procs.iter().map(|r| (r.tgid, r.cpu_ns)).collect::<Vec<_>>(), [(100, 1), (300, 115)]);
    }

    #[test]
    fn zombies_count_only_while_a_thread_of_theirs_lives() {
        let zombie_with_threads = TaskRecord { exit_state: guard_common::EXIT_ZOMBIE, live: 1, ..leader(10, 0) };
        let zombie = TaskRecord { exit_state: guard_common::EXIT_ZOMBIE, live: 0, ..leader(11, 0) };
        let exiting = TaskRecord { live: 0, ..leader(12, 0) };
        let dead = TaskRecord { exit_state: EXIT_DEAD, live: 1, ..leader(13, 0) };
        let recs = [zombie_with_threads, thread(10, 20, 1), zombie, exiting, dead, mark(TASK_MARK_END)];
        assert_eq!(fold(&session(&recs)).unwrap().iter().map(|r| r.tgid).collect::<Vec<_>>(), [10]);
    }

    #[test]
    fn an_incomplete_or_broken_session_is_an_error_not_a_smaller_table() {
        let no_end = session(&[leader(1, 0)]);
        assert_eq!(fold(&no_end).unwrap_err().to_string(), SnapshotError::NoEnd.to_string());
        let broken = session(&[leader(1, 0), mark(TASK_MARK_BROKEN), mark(TASK_MARK_END)]);
        assert_eq!(fold(&broken).unwrap_err().to_string(), SnapshotError::Broken(1).to_string());
        let mut cut = session(&[leader(1, 0), mark(TASK_MARK_END)]);
        cut.pop();
        assert_eq!(fold(&cut).unwrap_err().to_string(), SnapshotError::Truncated(55).to_string());
        let after = session(&[mark(TASK_MARK_END), leader(1, 0)]);
        assert_eq!(fold(&after).unwrap_err().to_string(), SnapshotError::AfterEnd.to_string());
    }

    #[test]
    fn reading_stops_at_the_end_marker_though_the_kernel_would_go_on() {
        // Two reads: the session up to its end, then tasks created since (what a further read()
        // of the iterator returns). The second must never be read.
        struct TwoReads(Vec<Vec<u8>>);
        impl Read for TwoReads {
            fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
                assert!(!self.0.is_empty(), "read past the end marker");
                let chunk = self.0.remove(0);
                out[..chunk.len()].copy_from_slice(&chunk);
                Ok(chunk.len())
            }
        }
        let mut src = TwoReads(vec![session(&[leader(1, 0), mark(TASK_MARK_END)]), session(&[leader(2, 0)])]);
        let mut f = Folder::default();
        read_records(&mut src, |r| f.push(r)).unwrap();
        assert_eq!(f.finish().unwrap().len(), 1);
        assert_eq!(src.0.len(), 1, "the second read was not made");
    }

    #[test]
    fn reads_that_split_records_are_reassembled() {
        struct Dribble(Vec<u8>, usize);
        impl Read for Dribble {
            fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
                let n = out.len().min(17).min(self.0.len() - self.1);
                out[..n].copy_from_slice(&self.0[self.1..self.1 + n]);
                self.1 += n;
                Ok(n)
            }
        }
        let recs: Vec<_> = (1..200).map(|p| leader(p, p as u64)).chain([mark(TASK_MARK_END)]).collect();
        let mut f = Folder::default();
        read_records(&mut Dribble(session(&recs), 0), |r| f.push(r)).unwrap();
        assert_eq!(f.finish().unwrap().len(), 199);
    }

    #[test]
    fn reasons_are_single_tokens() {
        let errors = [
            TaskIterError::NoProgram,
            TaskIterError::Unsupported { detail: String::new() },
            TaskIterError::Permission { detail: String::new() },
            TaskIterError::Refused { detail: String::new() },
            TaskIterError::Link(io::Error::other("x")),
        ];
        for e in errors {
            let r = e.reason();
            assert!(!r.is_empty() && r.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'), "{r}");
        }
    }
}
