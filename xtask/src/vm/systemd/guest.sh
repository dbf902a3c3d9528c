# Runs in the guest of `cargo xtask vm --systemd` as guard-vm-systemd.service: installs guard-user
# for a test account under the real systemd, lets it end a pile of probes, checks, creates drift
# and checks again. It follows prelude.sh (xtask writes both into one script).
SRC=/opt/guard/guard-config.json GU=/opt/guard/guard-user
ticks() { grep -c TICK_COMPLETE "$LOG" 2>/dev/null; }
ticked_again() { (($(ticks) > TICKS)) && systemctl is-active -q "$UNIT"; }

echo "systemd-guest: start (kernel $(uname -r), $(systemctl --version | head -n1), state $(systemctl is-system-running))"
run grep -E ' (tracefs|bpf|debugfs|cgroup2) ' /proc/mounts
run cat /proc/sys/kernel/perf_event_paranoid

say "=== install"
run groupadd --gid $UID_ $U
run useradd --create-home --uid $UID_ --gid $UID_ --shell /bin/bash $U
((RC == 0)) || fail "useradd exited $RC"
run "$GU" install --user $U --config-source "$SRC"
((RC == 0)) || fail "install exited $RC"
has "[OK] Host guard installed for $U in $H from $SRC"
wait_for 120 "$UNIT active with a completed tick" ticked
run systemctl --no-pager status "$UNIT"
systemctl is-active -q "$UNIT" || fail "$UNIT is not active"
run systemd-analyze verify /etc/systemd/system/guard-user@.service
run cat "$LOG"

say "=== $PROBES $PROBE probes as $U (threshold 3, timeout 5s, a tick every 60s)"
run install -m 0755 /bin/sleep /usr/local/bin/$PROBE
for _ in $(seq $PROBES); do
    # A subshell, so the probes are reparented to PID 1 (reaped there) rather than left as our zombies.
    (setpriv --reuid=$UID_ --regid=$UID_ --clear-groups /usr/local/bin/$PROBE 3600 </dev/null >/dev/null 2>&1 &)
done
sleep 1
run pgrep -u $UID_ -a -x $PROBE
(($(pgrep -u $UID_ -c -x $PROBE) == PROBES)) || fail "not all $PROBES probes started"
wait_for 400 "the guard's KILLED lines and no probe left" probes_gone
run grep -E "FLAGGED|KILLED|STARTED|WARN|ERROR" "$LOG"
run pgrep -u $UID_ -a -x $PROBE

say "=== the pile was ended under the unit's hardening: a syscall filter, no W+X memory, no kernel log"
run systemctl show -p SystemCallFilter -p SystemCallErrorNumber -p MemoryDenyWriteExecute -p ProtectKernelLogs "$UNIT"
[[ $(systemctl show -p MemoryDenyWriteExecute --value "$UNIT") == yes ]] || fail "MemoryDenyWriteExecute is off"
[[ $(systemctl show -p ProtectKernelLogs --value "$UNIT") == yes ]] || fail "ProtectKernelLogs is off"
# systemd 252 shows the errno as a number (1), later ones by name.
[[ $(systemctl show -p SystemCallErrorNumber --value "$UNIT") == @(1|EPERM) ]] || fail "SystemCallErrorNumber is not EPERM"
filter=" $(systemctl show -p SystemCallFilter --value "$UNIT") "
[[ $filter == *" bpf "* ]] || fail "bpf is not in the filter"
[[ $filter != *" perf_event_open "* ]] || fail "perf_event_open is in the filter, which nothing of guard's calls"
PID=$(systemctl show -p MainPID --value "$UNIT")
run grep -E '^(Seccomp|Seccomp_filters|NoNewPrivs|CapEff):' "/proc/$PID/status"
grep -qE '^Seccomp:[[:space:]]+2$' "/proc/$PID/status" || fail "the daemon runs without its seccomp filter"
# The BPF backend loaded (bpf(2) passes the filter), the sandboxed matcher ran the shipped
# patterns (its own seccomp filter stacks on the unit's), and nothing was refused.
grep -q "STARTED .*backend=ebpf" "$LOG" || fail "the BPF backend did not load under the unit's filter"
grep -qE "pattern_matcher_down|backend_fallback" "$LOG" && fail "the unit's hardening degraded the guard"
run systemd-analyze security --no-pager "$UNIT"

say "=== check (no --config-source: it compares against the source install recorded)"
run cat "/etc/systemd/system/$UNIT.d/config-source"
run "$GU" check --user $U
((RC == 0)) || fail "check exited $RC after install"
has "[OK] Host guard in sync with $SRC"

say "=== a config source under /tmp is refused: the unit's PrivateTmp=yes would hide it from the guard"
run install -m 0644 "$SRC" /tmp/guard-tmp-config.json
run "$GU" install --user $U --config-source /tmp/guard-tmp-config.json
((RC == 2)) || fail "install accepted a config source under /tmp (exit $RC)"
has "inside /tmp, which the unit replaces with an empty directory of the service's own (PrivateTmp=yes)"
[[ $(readlink "$H/guard-config.json") == "$SRC" ]] || fail "the refused install relinked the config"
grep -qx "$SRC" "/etc/systemd/system/$UNIT.d/config-source" || fail "the refused install changed the record"

say "=== drift"
run systemctl disable --now "$UNIT"
run ln -sfn /opt/guard/other-config.json "$H/guard-config.json"
run sed -i 's/^MemoryMax=.*/MemoryMax=1G/' /etc/systemd/system/guard-user@.service
run touch "$H/guard-daemon.sh"
run "$GU" check --user $U
((RC == 1)) || fail "check exited $RC with drift (expected 1)"
has "$H/guard-config.json is not a link to $SRC; run guard-user install --user $U --config-source $SRC"
has "$H/guard-daemon.sh is still present"
has "/etc/systemd/system/guard-user@.service is missing or differs from this build"
has "$UNIT is not enabled"
has "$UNIT is not active"

say "=== repair"
TICKS=$(ticks)
run "$GU" install --user $U --config-source "$SRC"
((RC == 0)) || fail "install exited $RC when repairing"
wait_for 120 "$UNIT active with a new tick" ticked_again
run "$GU" check --user $U --config-source "$SRC"
((RC == 0)) || fail "check exited $RC after the repair"
has "[OK] Host guard in sync with $SRC"
run journalctl -b --no-pager -o cat -u "$UNIT"

say "=== Type=notify: status text, reload, and the watchdog restarting a stopped daemon"
run systemctl show -p Type -p NotifyAccess -p WatchdogUSec -p StatusText -p ExecReload "$UNIT"
[[ $(systemctl show -p Type --value "$UNIT") == notify ]] || fail "the unit is not Type=notify"
[[ $(systemctl show -p StatusText --value "$UNIT") == tracking* ]] || fail "no STATUS= text from the daemon"
run systemctl reload "$UNIT"
((RC == 0)) || fail "systemctl reload exited $RC"
wait_for 30 "a RELOAD line" grep -q "RELOAD reason=sighup" "$LOG"
systemctl is-active -q "$UNIT" || fail "reload stopped the guard"
PID0=$(systemctl show -p MainPID --value "$UNIT")
N0=$(systemctl show -p NRestarts --value "$UNIT")
restarted() {
    (($(systemctl show -p NRestarts --value "$UNIT") > N0)) && systemctl is-active -q "$UNIT" &&
        [[ $(systemctl show -p MainPID --value "$UNIT") != "$PID0" ]]
}
run kill -STOP "$PID0"
wait_for 150 "the watchdog to kill and restart the stopped daemon" restarted
TICKS=$(ticks)
run systemctl show -p MainPID -p NRestarts -p Result "$UNIT"
say "--- the journal of the watchdog restart"
journalctl -b --no-pager -o short-monotonic -u "$UNIT" | grep -iE "watchdog|killing|main process exited|failed with result|scheduled restart|started|stopped" | tail -n 12 | sed 's/^/sg|   /'
journalctl -b --no-pager -o cat -u "$UNIT" | grep -q -i "watchdog timeout" || fail "no watchdog timeout in the journal"
wait_for 120 "$UNIT ticking again after the restart" ticked_again

say "=== /etc/default/guard-user: flags for every instance, an instance's own file wins, check shows them"
run mkdir -p /var/lib/prometheus/node-exporter
printf '%s\n' '# test' 'GUARD_ARGS="--metrics-file /var/lib/prometheus/node-exporter/ --audit-interval 5m"' >/etc/default/guard-user
run cat /etc/default/guard-user
run "$GU" check --user $U
((RC == 1)) || fail "check exited $RC with flags the running guard has not got (expected 1)"
has "$UNIT runs with flags \"\", /etc/default/guard-user says \"--metrics-file /var/lib/prometheus/node-exporter/ --audit-interval 5m\": systemctl restart $UNIT applies it"
TICKS=$(ticks)
run systemctl restart "$UNIT"
wait_for 120 "$UNIT ticking with the flags" ticked_again
metrics() { [[ -s /var/lib/prometheus/node-exporter/guard-$U.prom ]]; }
wait_for 60 "the metrics file, written under ProtectSystem=strict" metrics
run head -n 6 /var/lib/prometheus/node-exporter/guard-$U.prom
run "$GU" check --user $U
((RC == 0)) || fail "check exited $RC with the flags in force"
has "flags: --metrics-file /var/lib/prometheus/node-exporter/ --audit-interval 5m (GUARD_ARGS from /etc/default/guard-user)"
printf '%s\n' "GUARD_ARGS='--interval soon'" >"/etc/default/guard-user@$U"
run "$GU" check --user $U
((RC == 1)) || fail "check exited $RC with flags run refuses (expected 1)"
has "/etc/default/guard-user@$U: GUARD_ARGS \"--interval soon\" is refused (--interval: \`soon\` is not a duration"
run rm "/etc/default/guard-user@$U" /etc/default/guard-user
TICKS=$(ticks)
run systemctl restart "$UNIT"
wait_for 120 "$UNIT ticking without the flags" ticked_again
run "$GU" check --user $U
((RC == 0)) || fail "check exited $RC after the defaults files were removed"

say "=== heavy-command slots under the unit's capabilities: a second job waits frozen, SIGKILL of the daemon lets it go"
# No CAP_SYS_ADMIN or CAP_DAC_OVERRIDE: the top of guard's cgroups comes from ExecStartPre=+,
# and after `systemctl kill -s KILL` only ExecStopPost=+'s releaser can thaw what waits.
waiting() { cat /sys/fs/cgroup/guard-user/*/wait/cgroup.procs 2>/dev/null | grep -q .; }
reloads() { grep -c "RELOAD reason=sighup" "$LOG"; }
cp "$SRC" /tmp/sg.src
run install -m 0755 /bin/sleep /usr/local/bin/slotjob
printf '%s\n' '{"threshold": 3, "timeout": "5s",' ' "slots": {"build": {"commands": ["(^|/)slotjob "], "max": 1, "mode": "queue"}}}' >"$SRC"
R0=$(reloads)
run systemctl reload "$UNIT"
wait_for 30 "the config with a slot read" eval '(($(reloads) > R0))'
(setpriv --reuid=$UID_ --regid=$UID_ --clear-groups /usr/local/bin/slotjob 600 </dev/null >/dev/null 2>&1 &)
wait_for 30 "the first slotjob holding the slot" grep -q "SLOT_START slot=build" "$LOG"
(setpriv --reuid=$UID_ --regid=$UID_ --clear-groups /usr/local/bin/slotjob 2 </dev/null >/dev/null 2>&1 &)
wait_for 30 "the second slotjob waiting" grep -q "SLOT_WAIT slot=build" "$LOG"
wait_for 10 "the waiting slotjob in guard's frozen cgroup" waiting
run grep -E "SLOT_|slots_" "$LOG"
run sh -c 'cat /sys/fs/cgroup/guard-user/*/wait/cgroup.procs /sys/fs/cgroup/guard-user/*/wait/cgroup.events'
grep -q "slots_unavailable" "$LOG" && fail "slots are unavailable under the unit"
WAITER=$(cat /sys/fs/cgroup/guard-user/*/wait/cgroup.procs | head -n1)
[[ $(awk '{print $3}' "/proc/$WAITER/stat") != T ]] || fail "the waiting slotjob is stopped (T), not frozen"
N0=$(systemctl show -p NRestarts --value "$UNIT")
PID0=$(systemctl show -p MainPID --value "$UNIT")
run systemctl kill -s KILL "$UNIT"
wait_for 30 "no command left waiting after SIGKILL of the daemon" eval '! waiting'
wait_for 30 "the released slotjob finishing" eval '! kill -0 $WAITER'
wait_for 60 "$UNIT restarted" restarted
run pkill -u $UID_ -x slotjob
cp /tmp/sg.src "$SRC"
R0=$(reloads)
run systemctl reload "$UNIT"
wait_for 30 "the config without slots read" eval '(($(reloads) > R0))'

say "=== a config link routed through /tmp: root reads the config, the guard in its own /tmp does not"
run ln -sfn "$SRC" /tmp/guard-hop.json
run ln -sfn /tmp/guard-hop.json "$H/guard-config.json"
run systemctl reload "$UNIT"
wait_for 30 "ERROR config_missing from the guard" grep -q "ERROR config_missing" "$LOG"
run grep "ERROR config_missing" "$LOG"
run "$GU" check --user $U
((RC == 1)) || fail "check exited $RC with the config link through /tmp (expected 1)"
has "$H/guard-config.json leads to /tmp/guard-hop.json, inside /tmp"
run "$GU" install --user $U
((RC == 0)) || fail "install without --config-source exited $RC"
has "from $SRC,"
run "$GU" check --user $U
((RC == 0)) || fail "check exited $RC after relinking"

say "=== a hostile stateFile (newlines that would be unit directives) is refused, and nothing is written"
BAD=$H/bad-config.json
printf '%s\n' '{"threshold": 3, "stateFile": "\n[Service]\nExecStartPre=+/bin/sh -c \"touch /pwned\"\n"}' >"$BAD"
chown $U:$U "$BAD"
run "$GU" install --user $U --config-source "$BAD"
((RC != 0)) || fail "install accepted a stateFile with newlines"
has "config_malformed stateFile"
grep -q ExecStartPre "/etc/systemd/system/$UNIT.d/home.conf" && fail "the config reached the drop-in"

say "=== install --home and --config root chose (spaces, %, \$, quotes, a backslash), from a hostile config"
# The account's checkout holds a config whose stateFile tries to become unit directives and to
# widen ReadWritePaths; install must write only what root gave it, escaped so that systemd
# hands the daemon exactly these bytes.
HH=$'/srv/guard home %i %% $HOME ${X} "dq" \'sq\' \\b ;'
HC="$HH/my cfg %n \$USER.json"
HSRC=$H/checkout/guard-config.json
run mkdir -p "$HH" "$H/checkout"
run chown $U:$U "$HH" "$H/checkout"
cat >"$HSRC" <<'JSON'
{"threshold": 3, "timeout": "5s",
 "stateFile": "/etc/guard state %i $HOME.json",
 "excludes": ["/etc/guard-x.json", "/ /etc"]}
JSON
chown $U:$U "$HSRC"
run cat "$HSRC"
run "$GU" install --user $U --home "$HH" --config "$HC" --config-source "$HSRC"
((RC == 0)) || fail "install --home exited $RC"
run cat "/etc/systemd/system/$UNIT.d/home.conf"
grep -q ExecStartPre "/etc/systemd/system/$UNIT.d/home.conf" && fail "the config reached the drop-in"
run systemd-analyze verify "$UNIT"
((RC == 0)) || fail "systemd-analyze verify exited $RC"
[[ $OUT == *home.conf* ]] && fail "systemd-analyze complained about the drop-in"
run systemctl show -p ExecStart -p ExecStartPre -p ReadWritePaths -p DropInPaths "$UNIT"
# The template's one ExecStartPre= (the slots' releaser, a fixed command line), none from the config.
PRE=$(systemctl show -p ExecStartPre --value "$UNIT")
[[ $PRE == *"__slots-release ;"* && $(grep -o 'argv\[\]=' <<<"$PRE" | wc -l) == 1 && $PRE != *pwned* ]] ||
    fail "an ExecStartPre= other than the releaser reached the unit: $PRE"
# systemctl shows each path shell-quoted: the template's textfile-collector directory, then the
# home, and nothing else.
eval "set -- $(systemctl show -p ReadWritePaths --value "$UNIT")"
(($# == 2)) && [[ $1 == -/var/lib/prometheus/node-exporter && $2 == "$HH" ]] || fail "ReadWritePaths is not the home: $*"
LOG="$HH/guard-daemon.log"
wait_for 120 "$UNIT active with a completed tick in the new home" ticked
PID=$(systemctl show -p MainPID --value "$UNIT")
run systemctl show -p MainPID "$UNIT"
# The daemon's argv, one argument per line, against the one root asked for.
tr '\0' '\n' <"/proc/$PID/cmdline" >/tmp/sg.argv
printf '%s\n' /usr/local/bin/guard-user run --user $U --home "$HH" --config "$HC" >/tmp/sg.want
run diff /tmp/sg.want /tmp/sg.argv
((RC == 0)) || fail "the daemon does not run what install was told"
run grep -E "STARTED|ERROR|WARN" "$LOG"
[[ -e /pwned ]] && fail "the hostile stateFile ran a command"
run "$GU" check --user $U --config-source "$HSRC"
((RC == 0)) || fail "check exited $RC after install --home (it must learn the home from the drop-in)"
has "[OK] Host guard in sync with $HSRC"
run sed -i 's/^ReadWritePaths=.*/ReadWritePaths=\/etc/' "/etc/systemd/system/$UNIT.d/home.conf"
run "$GU" check --user $U --config-source "$HSRC"
((RC == 1)) || fail "check exited $RC with an edited drop-in (expected 1)"
has "/etc/systemd/system/$UNIT.d/home.conf is missing or differs from this build"

echo "systemd-guest: success"
systemctl --no-block poweroff
