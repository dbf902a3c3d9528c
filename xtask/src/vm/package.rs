//! `cargo xtask vm --arch arm64 --package`: the arm64 Debian package in the plain arm64 guest.
//!
//! The x86_64 package runs under a real systemd (`--systemd --package`, a debootstrap'd rootfs).
//! An arm64 rootfs with systemd would have to be debootstrap'd for a foreign architecture (its
//! second stage run under qemu-user on the build machine, a binfmt_misc registration on the
//! host) and then boot systemd under arm64 TCG, several times slower than x86_64's: the plain
//! guest is used instead, with the same init contract. Its image carries dpkg from the
//! architecture's packages and a dpkg database listing every package the image really holds
//! ([`super::userland`]), so `dpkg -i` checks the .deb's `Depends` against what is there.
//!
//! vm-init runs [`SCRIPT`] as its only test binary (`/tests/package`): `dpkg -i` the .deb
//! built by `cargo xtask dist --arch arm64`, `dpkg -s`/`-L`, the packaged binary's `--version`
//! and `validate` of the packaged config, then `guard-user run --user guardtest1` (the packaged
//! binary, root, the ebpf backend) ends a pile of six probes over a threshold of 3 and a timeout
//! of 5 s; then `dpkg -r` and `--purge` leave no `/usr/bin/guard-user`. What systemd adds (the
//! unit, install, check) is architecture-independent and covered by the x86_64 systemd guest.
use anyhow::Context as _;

use super::{
    initramfs::ExtraFile,
    payload::{self, Built, GuestTest},
};
use crate::{arch::Arch, build_ebpf, dist};

/// The guest's path of the package.
const DEB: &str = "opt/guard/guard-user.deb";

/// The test binaries' place in the image holds this scenario's script instead.
pub fn payload(arch: Arch) -> anyhow::Result<(Built, Vec<ExtraFile>)> {
    let deb = dist::build(&dist::Options { revision: "1".into(), arch, ..Default::default() })?;
    println!("vm: package scenario with {} as /{DEB}", deb.display());
    let script = build_ebpf::target_dir().join("vm/package-guest.sh");
    std::fs::write(&script, SCRIPT).with_context(|| format!("writing {}", script.display()))?;
    let built = Built {
        init: payload::static_init(arch)?,
        tests: vec![GuestTest { name: "package".into(), binary: script, args: Vec::new() }],
        bins: Vec::new(),
        host_only: Vec::new(),
    };
    Ok((built, vec![(DEB.to_string(), 0o644, deb)]))
}

const SCRIPT: &str = r#"#!/bin/bash
# /tests/package in the guest of `cargo xtask vm --arch arm64 --package` (vm-init runs it like a
# test binary and ignores nothing it prints). Every command and its output is prefixed `pkg| `.
U=guardtest1 UID_=4201 H=/home/guardtest1 DEB=/opt/guard/guard-user.deb
PROBE=ghost-sleeper PROBES=6 LOG=/home/guardtest1/guard-daemon.log
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
say() { printf 'pkg| %s\n' "$*"; }
run() {
    say "\$ $*"
    "$@" >/tmp/pkg.out 2>&1
    RC=$?
    OUT=$(cat /tmp/pkg.out)
    sed 's/^/pkg|   /' /tmp/pkg.out
    say "[exit $RC]"
}
fail() {
    say "FAILED: $*"
    [[ -f $LOG ]] && sed 's/^/pkg| log: /' "$LOG"
    [[ -f /tmp/daemon.out ]] && sed 's/^/pkg| stderr: /' /tmp/daemon.out
    exit 1
}
ok() { [[ $RC == 0 ]] || fail "$1 (exit $RC)"; }
has() { [[ $OUT == *"$1"* ]] || fail "expected \"$1\" in the output of the last command"; }
count_probes() {
    local n=0 p
    for p in /proc/[0-9]*; do
        [[ $(cat "$p/comm" 2>/dev/null) == "$PROBE" ]] && n=$((n + 1))
    done
    echo "$n"
}

say "arm64 package scenario on $(uname -m), kernel $(uname -r)"
run dpkg-deb -f "$DEB" Package Version Architecture Depends
ok "dpkg-deb -f"
has "Architecture: arm64"
run dpkg -i "$DEB"
ok "dpkg -i (its Depends against the image's dpkg database)"
run dpkg -s guard-user
has "Status: install ok installed"
run dpkg -L guard-user
has "/usr/bin/guard-user"
run /usr/bin/guard-user --version
ok "the packaged binary runs"
run /usr/bin/guard-user validate /usr/share/guard-user/guard-config.json
ok "validate of the packaged config"

printf '{\n  "threshold": 3,\n  "timeout": "5s"\n}\n' >"$H/guard-config.json"
chown "$U:$U" "$H/guard-config.json"
say "\$ guard-user run --user $U --interval 1s (background)"
/usr/bin/guard-user run --user "$U" --interval 1s >/tmp/daemon.out 2>&1 &
DAEMON=$!
for _ in $(seq 120); do
    grep -q TICK_COMPLETE "$LOG" 2>/dev/null && break
    kill -0 "$DAEMON" 2>/dev/null || fail "the daemon exited before its first tick"
    sleep 0.5
done
grep -q TICK_COMPLETE "$LOG" 2>/dev/null || fail "no TICK_COMPLETE within 60 s"
cp /usr/bin/sleep "$H/$PROBE"
chown "$U:$U" "$H/$PROBE"
for _ in $(seq "$PROBES"); do
    setpriv --reuid="$UID_" --regid="$UID_" --clear-groups "$H/$PROBE" 600 &
done
say "$PROBES probes started as $U: $(count_probes) running"
for _ in $(seq 240); do
    [[ $(count_probes) == 0 ]] && break
    sleep 0.5
done
wait_left=$(count_probes)
run grep -E 'STARTED|WARN|FLAGGED|KILLED' "$LOG"
[[ $wait_left == 0 ]] || fail "$wait_left probes still run 120 s after the pile"
has "backend=ebpf"
has "KILLED"
killed=$(grep -c "KILLED .*name=$PROBE" "$LOG")
[[ $killed == "$PROBES" ]] || fail "$killed KILLED lines for $PROBE, expected $PROBES"
grep -q ' ERROR ' "$LOG" && fail "the daemon logged an ERROR"
# The credential hook: Debian's arm64 kernels before 6.4 cannot attach fentry programs (no
# direct calls on arm64 until then), so the daemon must say it tracks through the syscall
# tracepoints; from 6.4 on the hook must attach and nothing be said.
release=$(uname -r)
major=${release%%.*} rest=${release#*.} minor=${rest%%.*}
if (( major < 6 || (major == 6 && minor < 4) )); then
    grep -q 'WARN setuid_untracked reason=attach_failed fallback=syscall_tracepoints' "$LOG" ||
        fail "kernel $release: no WARN setuid_untracked reason=attach_failed fallback=syscall_tracepoints"
    say "kernel $release: the credential hook's fallback, as logged"
else
    grep -q 'setuid_untracked' "$LOG" && fail "kernel $release: the credential hook did not attach"
    say "kernel $release: the credential hook attached"
fi
kill -TERM "$DAEMON"
wait "$DAEMON"
RC=$?
ok "the daemon's exit after SIGTERM"
say "the daemon stopped (exit $RC)"

run dpkg -r guard-user
ok "dpkg -r"
[[ -e /usr/bin/guard-user ]] && fail "/usr/bin/guard-user is still there after dpkg -r"
run dpkg --purge guard-user
ok "dpkg --purge"
run dpkg -s guard-user
[[ $RC != 0 ]] || fail "dpkg still knows guard-user after the purge"
say "package: success"
"#;

#[cfg(test)]
mod tests {
    use super::SCRIPT;

    /// The guest's script is only run in the arm64 guest: a syntax error would cost a whole
    /// guest boot to find. (It keeps its own helpers: it runs under vm-init, printing to the
    /// console through vm-init's stdout, not under systemd like the prelude's scenarios.)
    #[test]
    fn the_package_scenario_parses() {
        let out = std::process::Command::new("bash").args(["-n", "-c", SCRIPT]).output().expect("bash");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(SCRIPT.starts_with("#!/bin/bash\n"));
    }
}
