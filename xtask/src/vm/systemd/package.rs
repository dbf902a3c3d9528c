//! `cargo xtask vm --systemd --package`: the Debian package under a real systemd. The guest
//! installs `cargo xtask dist`'s .deb the way an operator does (`apt-get install /….deb`,
//! offline: its dependencies are already in the rootfs), reads `man guard-user`, runs
//! `guard-user install --user guardtest1` with no path options (the packaged unit and default
//! config), lets the service end a pile of probes, expects `check` → `[OK]`, then walks the
//! package's life: reinstall (postinst restarts the running instance), remove (prerm stops it),
//! purge (postrm removes what install added under /etc/systemd/system).
//!
//! The pile needs a small threshold and timeout, and the packaged config (threshold 30, timeout
//! 1h) is what the account's config links to: the script rewrites that file in place after
//! install. The daemon re-reads the config every tick, and check still sees a link to the
//! packaged source. (On a real host an operator points `--config-source` at their own file.)
use std::path::Path;

use anyhow::Context as _;

use super::Extra;
use crate::dist;

/// The guest's path of the package.
const DEB: &str = "opt/guard/guard-user.deb";

/// The script and files this scenario adds to the systemd image (in place of the source-install
/// scenario's script).
pub struct Scenario {
    pub script: &'static str,
    pub extras: Vec<(String, Extra)>,
}

/// Builds the package (`cargo xtask dist`) and returns what the image needs.
pub fn prepare() -> anyhow::Result<Scenario> {
    let deb = dist::build(&dist::Options { revision: "1".into(), ..Default::default() })?;
    let bytes = std::fs::read(&deb).with_context(|| format!("reading {}", deb.display()))?;
    println!("vm: package scenario with {} ({} KiB) as /{DEB}", deb.display(), bytes.len() / 1024);
    let mut extras = vec![(DEB.to_string(), Extra::File(0o644, bytes))];
    // apt wants its state directories even offline (the image leaves out lists and caches).
    for dir in ["var/lib/apt/lists", "var/lib/apt/lists/partial", "var/cache/apt", "var/cache/apt/archives"] {
        extras.push((dir.to_string(), Extra::Dir));
    }
    extras.push(("var/cache/apt/archives/partial".to_string(), Extra::Dir));
    Ok(Scenario { script: SCRIPT, extras })
}

/// Whether a rootfs has what this scenario reads the man page with.
pub fn has_man(rootfs: &Path) -> bool {
    rootfs.join("usr/bin/man").exists()
}

/// The scenario's lines, after the shared prelude (`systemd/prelude.sh`).
pub(super) const SCRIPT: &str = r#"# Runs in the guest of `cargo xtask vm --systemd --package` as guard-vm-systemd.service: installs
# the Debian package, then guard-user for a test account from the packaged unit and config, lets
# it end a pile of probes, checks, and reinstalls, removes and purges the package. It follows
# prelude.sh (xtask writes both into one script).
DEB=/opt/guard/guard-user.deb SRC=/usr/share/guard-user/guard-config.json
# Set when install needed path options on the packaged host: the run then ends as a failure
# that says so, after the rest of the package's life has been exercised.
DEGRADED=
XARGS=()
main_pid() { systemctl show -p MainPID --value "$UNIT"; }
restarted() { local p; p=$(main_pid); [[ $p != 0 && $p != "$PID_BEFORE" ]] && systemctl is-active -q "$UNIT"; }

echo "systemd-guest: start (kernel $(uname -r), $(systemctl --version | head -n1), state $(systemctl is-system-running))"

say "=== the package, as an operator installs it"
run apt-get install -y "$DEB"
if ((RC != 0)); then
    say "apt-get could not install the file offline; dpkg -i instead"
    run dpkg -i "$DEB"
fi
((RC == 0)) || fail "installing the package exited $RC"
run dpkg -s guard-user
has "Status: install ok installed"
run dpkg -L guard-user
run dpkg-query -W -f='${Conffiles}\n' guard-user
has "/etc/default/guard-user "
run cat /etc/default/guard-user
run guard-user --version
run systemd-analyze verify /lib/systemd/system/guard-user@.service
run ls -l /usr/share/bash-completion/completions/guard-user /usr/share/zsh/vendor-completions/_guard-user /usr/share/fish/vendor_completions.d/guard-user.fish "$SRC"

say "=== man guard-user"
if command -v man >/dev/null; then
    run env MANWIDTH=80 man guard-user
    ((RC == 0)) || fail "man guard-user exited $RC"
    has "guard-user - "
    run env MANWIDTH=80 man guard-user-install
    ((RC == 0)) || fail "man guard-user-install exited $RC"
else
    say "man-db is not in this rootfs: man not tried"
fi

say "=== guard-user install with the packaged unit and config"
run groupadd --gid $UID_ $U
run useradd --create-home --uid $UID_ --gid $UID_ --shell /bin/bash $U
((RC == 0)) || fail "useradd exited $RC"
run guard-user install --user $U
if ((RC != 0)) || [[ $OUT != *"[OK] Host guard installed for $U in $H from $SRC"* ]]; then
    DEGRADED="guard-user install --user $U on the packaged host exited $RC: $(head -n1 /tmp/sg.out)"
    say "OBSERVED: $DEGRADED"
    say "continuing with the packaged config and binary named explicitly"
    XARGS=(--config-source "$SRC" --bin-dir /usr/bin)
    run guard-user install --user $U "${XARGS[@]}"
    ((RC == 0)) || fail "install with explicit packaged paths exited $RC"
fi
has "[OK] Host guard installed for $U in $H from $SRC"
run readlink "$H/guard-config.json"
[[ $OUT == "$SRC" ]] || fail "the account's config links to $OUT, not $SRC"
run systemctl show -p FragmentPath -p DropInPaths "$UNIT"
[[ -n $DEGRADED || $OUT == *"FragmentPath=/lib/systemd/system/guard-user@.service"* ]] ||
    fail "$UNIT does not run from the packaged unit"
run ls -l /usr/local/bin/guard-user /etc/systemd/system/guard-user@.service
wait_for 120 "$UNIT active with a completed tick" ticked

say "=== $PROBES $PROBE probes as $U (the packaged config rewritten to threshold 3, timeout 5s)"
run sed -i -e 's/"threshold": *[0-9]*/"threshold": 3/' -e 's/"timeout": *"[^"]*"/"timeout": "5s"/' "$SRC"
run grep -E '"(threshold|timeout)"' "$SRC"
run install -m 0755 /bin/sleep /usr/local/bin/$PROBE
for _ in $(seq $PROBES); do
    (setpriv --reuid=$UID_ --regid=$UID_ --clear-groups /usr/local/bin/$PROBE 3600 </dev/null >/dev/null 2>&1 &)
done
sleep 1
(($(pgrep -u $UID_ -c -x $PROBE) == PROBES)) || fail "not all $PROBES probes started"
wait_for 400 "the guard's KILLED lines and no probe left" probes_gone
run grep -E "FLAGGED|KILLED|STARTED|WARN|ERROR" "$LOG"

say "=== check"
run guard-user check --user $U "${XARGS[@]}"
((RC == 0)) || fail "check exited $RC"
has "[OK] Host guard in sync with $SRC"

say "=== the conffile /etc/default/guard-user: an operator's flags, shown by check once in force"
run mkdir -p /var/lib/prometheus/node-exporter
run sed -i 's|^GUARD_ARGS=.*|GUARD_ARGS="--metrics-file /var/lib/prometheus/node-exporter/"|' /etc/default/guard-user
run guard-user check --user $U "${XARGS[@]}"
((RC == 1)) || fail "check exited $RC with flags the running guard has not got (expected 1)"
has "$UNIT runs with flags \"\", /etc/default/guard-user says \"--metrics-file /var/lib/prometheus/node-exporter/\": systemctl restart $UNIT applies it"
run systemctl restart "$UNIT"
metrics() { [[ -s /var/lib/prometheus/node-exporter/guard-$U.prom ]]; }
wait_for 120 "the metrics file, written under ProtectSystem=strict" metrics
run guard-user check --user $U "${XARGS[@]}"
((RC == 0)) || fail "check exited $RC with the flags in force"
has "flags: --metrics-file /var/lib/prometheus/node-exporter/ (GUARD_ARGS from /etc/default/guard-user)"
run head -n 4 /var/lib/prometheus/node-exporter/guard-$U.prom

if [[ -n $DEGRADED ]]; then
    # What install should have left on a packaged host: the packaged template only. The one it
    # wrote is the same text, so removing it changes nothing but where systemd reads it from,
    # and the package's own scripts below meet the layout they are written for.
    say "=== the packaged layout by hand: /etc/systemd/system/guard-user@.service equals the packaged unit"
    run cmp /etc/systemd/system/guard-user@.service /lib/systemd/system/guard-user@.service
    ((RC == 0)) || fail "install wrote a unit that differs from the packaged one"
    run rm /etc/systemd/system/guard-user@.service
    run systemctl daemon-reload
    run systemctl restart "$UNIT"
    run systemctl show -p FragmentPath "$UNIT"
    has "FragmentPath=/lib/systemd/system/guard-user@.service"
fi

say "=== reinstall (an upgrade to the same version): postinst restarts the running instance"
PID_BEFORE=$(main_pid)
run dpkg -i "$DEB"
((RC == 0)) || fail "dpkg -i exited $RC on reinstall"
wait_for 30 "$UNIT restarted (MainPID was $PID_BEFORE)" restarted
run systemctl show -p MainPID -p ActiveState "$UNIT"

say "=== remove: prerm stops the instances"
run apt-get remove -y guard-user
((RC == 0)) || fail "apt-get remove exited $RC"
systemctl is-active -q "$UNIT" && fail "$UNIT still active after remove"
run systemctl show -p ActiveState "$UNIT"
[[ -e /usr/bin/guard-user ]] && fail "/usr/bin/guard-user is still there after remove"
run ls -l "$H/guard-config.json" "$LOG"

[[ -e /etc/default/guard-user ]] || fail "remove took the conffile /etc/default/guard-user (only purge may)"

say "=== purge: postrm removes what install added under /etc/systemd/system"
run dpkg --purge guard-user
((RC == 0)) || fail "dpkg --purge exited $RC"
[[ -e /etc/default/guard-user ]] && fail "purge left the conffile /etc/default/guard-user"
run find /etc/systemd/system -name 'guard-user@*'
if [[ -e /etc/systemd/system/guard-user@.service ]]; then
    say "a guard-user@.service in /etc/systemd/system (install wrote its own) keeps the instances' links"
else
    [[ -z $OUT ]] || fail "purge left $OUT"
fi

if [[ -n $DEGRADED ]]; then
    echo "systemd-guest: failure (everything else passed) $DEGRADED"
else
    echo "systemd-guest: success"
fi
systemctl --no-block poweroff
"#;
