//! `guard-user __slots-release` (hidden): nothing a heavy-command slot held stays frozen after
//! the daemon that held it (docs/architecture.md, "Slots").
//!
//! - `--instance NAME`: the daemon's releaser, started by the daemon with a pipe on its stdin.
//!   It waits for the pipe to close (the daemon ended, however: SIGKILL included), then puts
//!   back everything that instance held.
//! - without: every instance no daemon holds is released and its cgroups removed, and the top
//!   of guard's cgroups is made (root's, 0755) for the daemon, which may not create it itself
//!   under the unit (the hierarchy's root directory is 0555, and the unit gives no
//!   `CAP_DAC_OVERRIDE`). The unit runs it before the daemon starts and after it stops
//!   (`ExecStartPre=+`, `ExecStopPost=+`), and `uninstall` runs it. It never fails: a host
//!   without cgroup v2 has nothing to release.
use std::{os::unix::fs::DirBuilderExt, process::ExitCode};

use super::SlotsReleaseArgs;
use crate::{
    cgroup::{self, sweep, Hierarchy},
    daemon::{instance, slots_io},
};

pub fn main(args: SlotsReleaseArgs) -> anyhow::Result<ExitCode> {
    if let Some(name) = args.instance {
        anyhow::ensure!(
            !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'),
            "--instance {name:?}: not an instance name"
        );
        slots_io::releaser_main(&name);
        return Ok(ExitCode::SUCCESS);
    }
    release_all();
    Ok(ExitCode::SUCCESS)
}

/// Releases every instance no daemon holds and prepares the top of guard's cgroups. Returns
/// how many processes were put back.
pub fn release_all() -> usize {
    let Ok(hierarchy) = Hierarchy::find() else { return 0 };
    let released = sweep::sweep(&hierarchy, &instance::lock_dir());
    for (name, n) in &released {
        if *n > 0 {
            eprintln!("guard-user: released {n} held processes of {name}, whose daemon is gone");
        }
    }
    let top = hierarchy.mount.join(cgroup::TOP);
    if let Err(e) = std::fs::DirBuilder::new().mode(0o755).create(&top) {
        if e.kind() != std::io::ErrorKind::AlreadyExists {
            eprintln!("guard-user: cannot create {}: {e}", top.display());
        }
    }
    released.iter().map(|(_, n)| n).sum()
}
