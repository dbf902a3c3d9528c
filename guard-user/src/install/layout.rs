//! Where everything goes for one account: the operator's request validated into a
//! [`Layout`], the packaged-or-source decision, and the default config source.
use std::{
    fs,
    path::{Path, PathBuf},
};

use super::{
    escape::{AccountName, Executable, UnitValueError},
    hidden::{self, refuse_hidden, Judge},
    home::{validate_config_path, validate_home},
    record::{self, RECORD_NAME},
    unit::{instance_name, DropIn, DROPIN_NAME, UNIT_NAME},
    InstallError,
};
use crate::account::Account;

/// The legacy guard's files, relative to the home (docs/operations.md step 2).
pub const LEGACY_SCRIPT: &str = "guard-daemon.sh";
pub const LEGACY_UNITS: [&str; 2] = ["guard-daemon.timer", "guard-daemon.service"];
pub const LEGACY_UNIT_DIR: &str = ".config/systemd/user";

/// Where the Debian package puts its files, relative to the packaged root (`/`).
pub const PACKAGED_BIN_DIR: &str = "usr/bin";
/// Debian bookworm's debhelper ships units in /lib; later releases in /usr/lib (the same
/// directory on a merged-/usr host). The first that holds the unit wins.
pub const PACKAGED_UNIT_DIRS: [&str; 2] = ["lib/systemd/system", "usr/lib/systemd/system"];
pub const PACKAGED_CONFIG: &str = "usr/share/guard-user/guard-config.json";

/// What the operator asked for, before validation (cmd/ fills it from the arguments).
#[derive(Clone, Debug)]
pub struct Request {
    /// The account, resolved by the one rule ([`Account::resolve`]) before install, check or
    /// uninstall look at anything.
    pub account: Account,
    pub home: Option<PathBuf>,
    pub config: Option<PathBuf>,
    pub config_source: Option<PathBuf>,
    /// Where drop-ins go, and the unit when installing from source (`/etc/systemd/system`).
    pub unit_dir: PathBuf,
    /// Where a source install copies the binary (`/usr/local/bin`).
    pub bin_dir: PathBuf,
    /// `/` on a host; a temp tree in tests, so the packaged layout can be simulated.
    pub packaged_root: PathBuf,
    /// The running binary: what a source install copies, and how a packaged host is recognised.
    pub exe: PathBuf,
}

/// Who provides the binary and the unit template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Provider {
    /// A build from source: `install` copies the running binary into `bin_dir` and writes the
    /// template into the unit directory.
    Source { bin_dir: PathBuf },
    /// The Debian package owns `/usr/bin/guard-user` and the template in `/lib/systemd/system`;
    /// `install` writes only the per-instance drop-in.
    Packaged { bin_dir: PathBuf, unit_dir: PathBuf },
}

impl Provider {
    /// Packaged when the running binary is the packaged one (`<root>/usr/bin/guard-user`, same
    /// file) and the packaged unit exists; otherwise the running build is installed from source
    /// (its unit in /etc then takes precedence over a packaged one, as systemd orders them).
    pub fn detect(req: &Request) -> Provider {
        let bin_dir = req.packaged_root.join(PACKAGED_BIN_DIR);
        let same_file = |a: &Path, b: &Path| match (fs::canonicalize(a), fs::canonicalize(b)) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        };
        if same_file(&req.exe, &bin_dir.join("guard-user")) {
            for d in PACKAGED_UNIT_DIRS {
                let unit_dir = req.packaged_root.join(d);
                if unit_dir.join(UNIT_NAME).is_file() {
                    return Provider::Packaged { bin_dir, unit_dir };
                }
            }
        }
        Provider::Source { bin_dir: req.bin_dir.clone() }
    }
}

/// Everything install, check and uninstall need for one account, validated.
#[derive(Clone, Debug)]
pub struct Layout {
    pub account: Account,
    pub user: AccountName,
    /// `--home`, else what the installed drop-in says (check), else the passwd home.
    pub home: PathBuf,
    /// `--config` (or the drop-in's, for check) when given.
    pub config: Option<PathBuf>,
    /// The link install writes: `--config`, else `<home>/guard-config.json`.
    pub config_link: PathBuf,
    /// What the link points to, canonical. install: `--config-source`, else the recorded one
    /// ([`record`]), else [`default_source`]; always set. check: `--config-source` when given
    /// (otherwise check compares against the record). uninstall: none.
    pub source: Option<PathBuf>,
    /// Where the drop-in goes (and the template, from source).
    pub unit_dir: PathBuf,
    pub provider: Provider,
    /// The running binary (what a source install copies).
    pub exe: PathBuf,
    /// Where `/etc/default/guard-user` is looked for: `/` on a host (`GUARD_PACKAGED_ROOT` in
    /// tests; the file is a conffile of the package).
    pub defaults_root: PathBuf,
}

impl Layout {
    /// For `install`: every value is checked now, so a bad one stops install before it writes
    /// anything.
    pub fn for_install(req: &Request) -> Result<Layout, InstallError> {
        let account = req.account.clone();
        let user = AccountName::new(&account.name)?;
        let home = req.home.clone().unwrap_or_else(|| account.home.clone());
        validate_home(&account, &home)?;
        if let Some(c) = &req.config {
            validate_config_path(c)?;
            let fix = "pass a --config FILE the service can see, e.g. in the account's home";
            refuse_hidden("--config", c, Judge::LinkPlace, fix)?;
        }
        let given = match &req.config_source {
            Some(p) => p.clone(),
            // Repairing keeps the operator's choice: the source the last install recorded. A
            // record that is there but cannot be trusted stops install: falling back to the
            // default could discard that choice, and taking it could link the account's.
            None => {
                let path = dropin_dir(&req.unit_dir, &user).join(RECORD_NAME);
                match record::read(&path, &user) {
                    Ok(recorded) => recorded,
                    Err(record::RecordError::Missing) => default_source(&req.packaged_root, &req.exe)?,
                    Err(why) => return Err(InstallError::UntrustedRecord { path, why }),
                }
            }
        };
        let source = canonical_source(given)?;
        Ok(Self::build(req, account, user, home, req.config.clone(), Some(source)))
    }

    /// For `check`: learns `--home`/`--config` from the installed drop-in when not given, and
    /// validates nothing beyond the account (check reports invalid values as drift). The
    /// source is `--config-source` when given; otherwise check reads the record.
    pub fn for_check(req: &Request) -> Result<Layout, InstallError> {
        let source = req.config_source.clone().map(canonical_source).transpose()?;
        Self::learned(req, source)
    }

    /// For `uninstall`: like [`Layout::for_check`], without a config source (an install whose
    /// source has gone must still be removable).
    pub fn for_uninstall(req: &Request) -> Result<Layout, InstallError> {
        Self::learned(req, None)
    }

    fn learned(req: &Request, source: Option<PathBuf>) -> Result<Layout, InstallError> {
        let account = req.account.clone();
        let user = AccountName::new(&account.name)?;
        let dropin = fs::read_to_string(dropin_path(&req.unit_dir, &user)).ok();
        let installed = dropin.as_deref().and_then(|t| DropIn::parse(t).ok());
        let (home, config) = match installed {
            Some(i) if req.home.as_deref().is_none_or(|h| h == i.home.as_path()) => {
                let installed_config = i.config.map(|c| c.as_path().to_path_buf());
                (i.home.as_path().to_path_buf(), req.config.clone().or(installed_config))
            }
            _ => (req.home.clone().unwrap_or_else(|| account.home.clone()), req.config.clone()),
        };
        Ok(Self::build(req, account, user, home, config, source))
    }

    fn build(
        req: &Request,
        account: Account,
        user: AccountName,
        home: PathBuf,
        config: Option<PathBuf>,
        source: Option<PathBuf>,
    ) -> Layout {
        let config_link = config.clone().unwrap_or_else(|| home.join("guard-config.json"));
        Layout {
            account,
            user,
            home,
            config,
            config_link,
            source,
            unit_dir: req.unit_dir.clone(),
            provider: Provider::detect(req),
            exe: req.exe.clone(),
            defaults_root: req.packaged_root.clone(),
        }
    }

    /// The template the instance uses: ours in the unit directory, or the packaged one.
    pub fn unit_path(&self) -> PathBuf {
        match &self.provider {
            Provider::Source { .. } => self.unit_dir.join(UNIT_NAME),
            Provider::Packaged { unit_dir, .. } => unit_dir.join(UNIT_NAME),
        }
    }

    /// On a packaged host, where a template would shadow the packaged one.
    pub fn shadowing_unit_path(&self) -> Option<PathBuf> {
        matches!(self.provider, Provider::Packaged { .. }).then(|| self.unit_dir.join(UNIT_NAME))
    }

    pub fn bin_dir(&self) -> &Path {
        match &self.provider {
            Provider::Source { bin_dir } | Provider::Packaged { bin_dir, .. } => bin_dir,
        }
    }

    pub fn bin_path(&self) -> PathBuf {
        self.bin_dir().join("guard-user")
    }

    /// The binary as the units name it.
    pub fn executable(&self) -> Result<Executable, UnitValueError> {
        Executable::new(&self.bin_path())
    }

    pub fn instance(&self) -> String {
        instance_name(&self.user)
    }

    pub fn dropin_path(&self) -> PathBuf {
        dropin_path(&self.unit_dir, &self.user)
    }

    /// Where install records the source it linked ([`record`]), beside the drop-in.
    pub fn record_path(&self) -> PathBuf {
        dropin_dir(&self.unit_dir, &self.user).join(RECORD_NAME)
    }

    /// The command that installs this layout again from `source` (for check's fix lines): the
    /// account, `--home` when it is not the passwd home, `--config` when given, each argument
    /// escaped and quoted as a log value is ([`crate::escape::log_value`]).
    pub fn install_command(&self, source: &Path) -> String {
        use std::os::unix::ffi::OsStrExt;
        let arg = |p: &Path| crate::escape::log_value(p.as_os_str().as_bytes());
        let mut cmd = format!("guard-user install --user {}", self.user);
        if self.home != self.account.home {
            cmd.push_str(&format!(" --home {}", arg(&self.home)));
        }
        if let Some(c) = &self.config {
            cmd.push_str(&format!(" --config {}", arg(c)));
        }
        cmd.push_str(&format!(" --config-source {}", arg(source)));
        cmd
    }

    /// The drop-in install writes for this layout, every value validated again (the home
    /// against the file system as it is now).
    pub fn dropin(&self) -> Result<DropIn, InstallError> {
        Ok(DropIn {
            bin: self.executable()?,
            user: self.user.clone(),
            home: validate_home(&self.account, &self.home)?,
            config: self.config.as_deref().map(validate_config_path).transpose()?,
        })
    }

    pub fn legacy_paths(&self) -> Vec<PathBuf> {
        let mut v = vec![self.home.join(LEGACY_SCRIPT)];
        v.extend(LEGACY_UNITS.iter().map(|u| self.home.join(LEGACY_UNIT_DIR).join(u)));
        v
    }
}

/// The accounts with an instance installed in `unit_dir`: a `guard-user@<account>.service.d/`
/// holding install's drop-in, the account a valid name. Sorted. What `check` checks as root when
/// no account is named (it never checks root's own, absent, instance then).
pub fn installed_accounts(unit_dir: &Path) -> Vec<AccountName> {
    let Ok(entries) = fs::read_dir(unit_dir) else { return Vec::new() };
    let mut found: Vec<AccountName> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let account = name.strip_prefix("guard-user@")?.strip_suffix(".service.d")?;
            let account = AccountName::new(account).ok()?;
            e.path().join(DROPIN_NAME).is_file().then_some(account)
        })
        .collect();
    found.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    found
}

fn dropin_dir(unit_dir: &Path, user: &AccountName) -> PathBuf {
    unit_dir.join(format!("{}.d", instance_name(user)))
}

fn dropin_path(unit_dir: &Path, user: &AccountName) -> PathBuf {
    dropin_dir(unit_dir, user).join(DROPIN_NAME)
}

/// The config source, canonical (the link points at the real file, not at another link), and
/// refused when the service could not see it: its lookup passes through a tree the unit hides
/// ([`hidden`]).
fn canonical_source(path: PathBuf) -> Result<PathBuf, InstallError> {
    let canonical = fs::canonicalize(&path).map_err(|source| InstallError::NoSource { path: path.clone(), source })?;
    refuse_hidden("the config source", &path, Judge::File, hidden::FIX)?;
    Ok(canonical)
}

/// The default config source, first that exists: the packaged config
/// (`/usr/share/guard-user/guard-config.json`), the shipped `config/guard-config.json` of the
/// source checkout the running binary was built in (found by walking up from it to the
/// directory holding `guard-user/Cargo.toml`), or of the checkout this binary was compiled
/// from (`CARGO_MANIFEST_DIR`, while it still exists).
pub fn default_source(packaged_root: &Path, exe: &Path) -> Result<PathBuf, InstallError> {
    let mut tried = vec![packaged_root.join(PACKAGED_CONFIG)];
    if let Ok(exe) = fs::canonicalize(exe) {
        // target/<profile>/guard-user or target/<triple>/<profile>/guard-user
        if let Some(ws) = exe.ancestors().skip(1).take(4).find(|d| d.join("guard-user/Cargo.toml").is_file()) {
            tried.push(ws.join("config/guard-config.json"));
        }
    }
    tried.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/guard-config.json"));
    match tried.iter().find(|p| p.is_file()) {
        Some(p) => Ok(p.clone()),
        None => Err(InstallError::NoDefaultSource {
            tried: tried.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "),
        }),
    }
}
