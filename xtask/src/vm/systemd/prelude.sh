#!/bin/bash
# The start of both scripts of the systemd guest (`cargo xtask vm --systemd`: guest.sh, and
# `--package`: package.rs's): xtask writes this, then the scenario's own lines, as the script
# guard-vm-systemd.service runs. Every command and its output goes to the serial console,
# prefixed `sg| `; `systemd-guest: success` or `systemd-guest: failure <why>` ends the run.
exec >/dev/ttyS0 2>&1
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
U=guardtest1 UID_=4201 H=/home/guardtest1
UNIT=guard-user@guardtest1.service PROBE=ghost-sleeper PROBES=6
LOG=$H/guard-daemon.log

say() { printf 'sg| %s\n' "$*"; }
# run CMD...: prints `$ CMD`, its output and `[exit N]`; leaves the exit code in RC, the output in OUT.
run() {
    say "\$ $*"
    "$@" >/tmp/sg.out 2>&1
    RC=$?
    OUT=$(cat /tmp/sg.out)
    sed 's/^/sg|   /' /tmp/sg.out
    say "[exit $RC]"
}
has() { [[ $OUT == *"$1"* ]] || fail "expected \"$1\" in the output of the last command"; }
diagnostics() {
    say "--- diagnostics"
    run systemctl --no-pager status "$UNIT"
    run journalctl -b --no-pager -o short-monotonic -u "$UNIT"
    run cat "$LOG"
    run systemctl --no-pager --failed
}
fail() {
    diagnostics
    echo "systemd-guest: failure $*"
    systemctl --no-block poweroff
    exit 1
}
# wait_for SECONDS WHAT CMD...: polls CMD every second.
wait_for() {
    local limit=$1 what=$2 start=$SECONDS
    shift 2
    until "$@" >/dev/null 2>&1; do
        ((SECONDS - start >= limit)) && fail "$what not within ${limit}s"
        sleep 1
    done
    say "($what after $((SECONDS - start))s)"
}
ticked() { systemctl is-active -q "$UNIT" && grep -q TICK_COMPLETE "$LOG"; }
probes_gone() { grep -q "KILLED .*name=$PROBE" "$LOG" && ! pgrep -u $UID_ -x $PROBE; }
