//! Shim configuration: a versioned, strict TOML file plus per-container annotations.
//!
//! Sources, later wins: built-in defaults → the file (`$WEENV_SHIM_CONFIG`, else
//! `/etc/weenv/shim.toml` if present) → the file named by annotation `io.weenv.config`
//! → individual annotations ([`ShimConfig::apply_annotations`]):
//!
//! | annotation | meaning |
//! |---|---|
//! | `io.weenv.elastic` | `false` disables all scaling (fixed quota, stock runc behaviour) |
//! | `io.weenv.cpu.elastic`, `io.weenv.memory.elastic` | per resource |
//! | `io.weenv.cpu.max` | per-environment CPU maximum, cores (e.g. `4`, `0.5`) |
//! | `io.weenv.memory.max` | per-environment memory maximum, bytes (`Ki`/`Mi`/`Gi` suffix ok) |
//! | `io.weenv.interval_ms` | sample period |
//! | `io.weenv.memory.oom_grace_ms` | how long an OOM at the maximum may persist |
//! | `io.weenv.cpu.scale_down_window_s`, `io.weenv.memory.scale_down_window_s` | quiet windows |
//! | `io.weenv.ledger.dir` | node ledger directory |
//! | `io.weenv.status.dir` | status directory (`<dir>/<ns>/<id>/status.json`) |
//! | `io.weenv.config` | path of a whole config file for this container |

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::policy::{CpuPolicy, MemPolicy, Policy};

/// Default config file location.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/weenv/shim.toml";
/// Environment variable naming the config file.
pub const CONFIG_ENV: &str = "WEENV_SHIM_CONFIG";

/// Errors of configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("read shim config {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("parse shim config {path}: {source}")]
    Parse {
        path: PathBuf,
        source: toml::de::Error,
    },
    #[error("shim config field `{field}`: {problem}")]
    Invalid { field: String, problem: String },
}

fn invalid(field: &str, problem: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: field.to_string(),
        problem: problem.into(),
    }
}

/// The whole config file (`version = 1`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ShimConfig {
    /// Format version; must be 1.
    pub version: u32,
    pub monitor: MonitorConfig,
    pub cpu: CpuConfig,
    pub memory: MemoryConfig,
    pub node: NodeConfig,
}

/// `[monitor]`
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MonitorConfig {
    /// Master switch for elastic provisioning. Default true.
    pub elastic: bool,
    /// Sample period in ms. Default 200.
    pub interval_ms: u64,
    /// Exit status reported when the shim terminates a task for OOM at the maximum. Default 247.
    pub terminate_exit_code: u32,
    /// Where `<ns>/<id>/status.json` and `changes.jsonl` go. Default `/run/weenv/status`.
    pub status_dir: PathBuf,
}

/// `[cpu]`
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CpuConfig {
    /// Scale CPU. Default true.
    pub elastic: bool,
    /// Per-environment maximum in cores. Default 64.
    pub max_cores: f64,
    /// Utilisation of the quota that doubles it. Default 0.85.
    pub scale_up_utilisation: f64,
    /// Fraction of throttled periods that doubles it. Default 0.10.
    pub scale_up_throttled: f64,
    /// Fraction of throttled periods that quadruples it. Default 0.80.
    pub severe_throttled: f64,
    /// Utilisation below which (for the whole window) it halves. Default 0.30.
    pub scale_down_utilisation: f64,
    /// "Negligible" throttling for scale-down. Default 0.01.
    pub scale_down_throttled: f64,
    /// Quiet window before a halving, seconds. Default 10.
    pub scale_down_window_s: f64,
}

/// `[memory]`
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MemoryConfig {
    /// Scale memory. Default true.
    pub elastic: bool,
    /// Per-environment maximum, bytes. Default 32 GiB.
    pub max_bytes: u64,
    /// Working set / limit that doubles the limit. Default 0.60.
    pub scale_up_working_set: f64,
    /// v2 PSI `some avg10` (%) counted as pressure. Default 10.
    pub psi_some_avg10: f64,
    /// Working set / limit below which (for the whole window) it halves. Default 0.20.
    pub scale_down_working_set: f64,
    /// Quiet window before a halving, seconds. Default 60.
    pub scale_down_window_s: f64,
    /// How long an OOM emergency at the maximum may last before the task is killed, ms. Default 1000.
    pub oom_grace_ms: u64,
    /// v1: set `memory.oom_control` = 1 so tasks freeze at the limit (the shim raises the
    /// limit) instead of being OOM-killed. Default true.
    pub v1_freeze_on_oom: bool,
    /// v2: `memory.high` as a fraction of `memory.max` (≥ 1 leaves memory.high alone). Default 0.9.
    pub v2_high_ratio: f64,
}

/// `[node]`
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NodeConfig {
    /// Node ledger directory. Default `/run/weenv/ledger`.
    pub ledger_dir: PathBuf,
    /// Node CPU capacity, millicores; 0 = number of CPUs × 1000.
    pub cpu_millicores: u64,
    /// Node memory capacity, bytes; 0 = MemTotal.
    pub memory_bytes: u64,
    /// Share of the capacity reserved for admissions (no scale-up may use it). Default 0.10.
    pub reserve_fraction: f64,
}

impl Default for ShimConfig {
    fn default() -> Self {
        ShimConfig {
            version: 1,
            monitor: MonitorConfig::default(),
            cpu: CpuConfig::default(),
            memory: MemoryConfig::default(),
            node: NodeConfig::default(),
        }
    }
}
impl Default for MonitorConfig {
    fn default() -> Self {
        MonitorConfig {
            elastic: true,
            interval_ms: 200,
            terminate_exit_code: 247,
            status_dir: PathBuf::from(crate::status::DEFAULT_STATUS_DIR),
        }
    }
}
impl Default for CpuConfig {
    fn default() -> Self {
        CpuConfig {
            elastic: true,
            max_cores: 64.0,
            scale_up_utilisation: 0.85,
            scale_up_throttled: 0.10,
            severe_throttled: 0.80,
            scale_down_utilisation: 0.30,
            scale_down_throttled: 0.01,
            scale_down_window_s: 10.0,
        }
    }
}
impl Default for MemoryConfig {
    fn default() -> Self {
        MemoryConfig {
            elastic: true,
            max_bytes: 32 << 30,
            scale_up_working_set: 0.60,
            psi_some_avg10: 10.0,
            scale_down_working_set: 0.20,
            scale_down_window_s: 60.0,
            oom_grace_ms: 1000,
            v1_freeze_on_oom: true,
            v2_high_ratio: 0.9,
        }
    }
}
impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            ledger_dir: PathBuf::from("/run/weenv/ledger"),
            cpu_millicores: 0,
            memory_bytes: 0,
            reserve_fraction: 0.10,
        }
    }
}

fn fraction(field: &str, v: f64) -> Result<(), ConfigError> {
    if !(v > 0.0 && v <= 1.0) {
        return Err(invalid(field, format!("{v} must be in (0, 1]")));
    }
    Ok(())
}

/// Parses `123`, `64Mi`, `1Gi`, `512Ki`, `2G`, `10M`.
pub fn parse_bytes(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mult) = [
        ("Ki", 1u64 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("K", 1000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
    ]
    .iter()
    .find_map(|(suf, m)| s.strip_suffix(suf).map(|n| (n, *m)))
    .unwrap_or((s, 1));
    num.trim().parse::<u64>().ok()?.checked_mul(mult)
}

fn num(field: &str, v: &str) -> Result<f64, ConfigError> {
    v.trim()
        .parse()
        .map_err(|_| invalid(field, format!("{v:?} is not a number")))
}

fn parse_bool(field: &str, v: &str) -> Result<bool, ConfigError> {
    match v.trim() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        o => Err(invalid(field, format!("{o:?} is not a boolean"))),
    }
}

impl ShimConfig {
    /// Parses and validates TOML text (`path` for messages).
    pub fn from_toml(text: &str, path: &Path) -> Result<ShimConfig, ConfigError> {
        let c: ShimConfig = toml::from_str(text).map_err(|source| ConfigError::Parse {
            path: path.to_path_buf(),
            source,
        })?;
        c.validate()?;
        Ok(c)
    }

    /// Reads a config file.
    pub fn from_file(path: &Path) -> Result<ShimConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_toml(&text, path)
    }

    /// `$WEENV_SHIM_CONFIG`, else `/etc/weenv/shim.toml` if it exists, else defaults.
    pub fn load_default() -> Result<ShimConfig, ConfigError> {
        if let Some(p) = std::env::var_os(CONFIG_ENV) {
            return Self::from_file(Path::new(&p));
        }
        let p = Path::new(DEFAULT_CONFIG_PATH);
        if p.exists() {
            return Self::from_file(p);
        }
        Ok(ShimConfig::default())
    }

    /// Checks every field; the error names the field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.version != 1 {
            return Err(invalid(
                "version",
                format!("{} is not supported; use 1", self.version),
            ));
        }
        if self.monitor.interval_ms < 10 || self.monitor.interval_ms > 60_000 {
            return Err(invalid("monitor.interval_ms", "must be within 10..=60000"));
        }
        let c = &self.cpu;
        fraction("cpu.scale_up_utilisation", c.scale_up_utilisation)?;
        fraction("cpu.scale_up_throttled", c.scale_up_throttled)?;
        fraction("cpu.severe_throttled", c.severe_throttled)?;
        fraction("cpu.scale_down_utilisation", c.scale_down_utilisation)?;
        fraction("cpu.scale_down_throttled", c.scale_down_throttled)?;
        if c.scale_down_utilisation * 2.0 >= c.scale_up_utilisation {
            return Err(invalid(
                "cpu.scale_down_utilisation",
                "must be below half of cpu.scale_up_utilisation, or halving would oscillate",
            ));
        }
        if c.max_cores.is_nan() || c.max_cores <= 0.0 {
            return Err(invalid("cpu.max_cores", "must be > 0"));
        }
        if c.scale_down_window_s.is_nan() || c.scale_down_window_s < 0.0 {
            return Err(invalid("cpu.scale_down_window_s", "must be >= 0"));
        }
        let m = &self.memory;
        fraction("memory.scale_up_working_set", m.scale_up_working_set)?;
        fraction("memory.scale_down_working_set", m.scale_down_working_set)?;
        if m.scale_down_working_set * 2.0 >= m.scale_up_working_set {
            return Err(invalid(
                "memory.scale_down_working_set",
                "must be below half of memory.scale_up_working_set, or halving would oscillate",
            ));
        }
        if m.max_bytes < (4 << 20) {
            return Err(invalid("memory.max_bytes", "must be at least 4 MiB"));
        }
        if m.scale_down_window_s.is_nan() || m.scale_down_window_s < 0.0 {
            return Err(invalid("memory.scale_down_window_s", "must be >= 0"));
        }
        if m.v2_high_ratio.is_nan() || m.v2_high_ratio <= 0.0 {
            return Err(invalid("memory.v2_high_ratio", "must be > 0"));
        }
        if !(0.0..1.0).contains(&self.node.reserve_fraction) {
            return Err(invalid("node.reserve_fraction", "must be in [0, 1)"));
        }
        if self.monitor.terminate_exit_code > 255 {
            return Err(invalid("monitor.terminate_exit_code", "must be <= 255"));
        }
        Ok(())
    }

    /// Applies `io.weenv.*` annotations (see the module table) and re-validates.
    pub fn apply_annotations(&mut self, ann: &HashMap<String, String>) -> Result<(), ConfigError> {
        if let Some(p) = ann.get("io.weenv.config") {
            *self = Self::from_file(Path::new(p))?;
        }
        for (k, v) in ann {
            let Some(key) = k.strip_prefix("io.weenv.") else {
                continue;
            };
            match key {
                "config" => {}
                "elastic" => self.monitor.elastic = parse_bool(k, v)?,
                "cpu.elastic" => self.cpu.elastic = parse_bool(k, v)?,
                "memory.elastic" => self.memory.elastic = parse_bool(k, v)?,
                "cpu.max" => {
                    self.cpu.max_cores = v
                        .trim()
                        .parse()
                        .map_err(|_| invalid(k, format!("{v:?} is not a number of cores")))?
                }
                "memory.max" => {
                    self.memory.max_bytes =
                        parse_bytes(v).ok_or_else(|| invalid(k, format!("{v:?} is not a size")))?
                }
                "interval_ms" => {
                    self.monitor.interval_ms = v
                        .trim()
                        .parse()
                        .map_err(|_| invalid(k, format!("{v:?} is not milliseconds")))?
                }
                "memory.oom_grace_ms" => {
                    self.memory.oom_grace_ms = v
                        .trim()
                        .parse()
                        .map_err(|_| invalid(k, format!("{v:?} is not milliseconds")))?
                }
                "cpu.scale_down_window_s" => self.cpu.scale_down_window_s = num(k, v)?,
                "memory.scale_down_window_s" => self.memory.scale_down_window_s = num(k, v)?,
                "ledger.dir" => self.node.ledger_dir = PathBuf::from(v),
                "status.dir" => self.monitor.status_dir = PathBuf::from(v),
                _ => return Err(invalid(k, "unknown weenv annotation")),
            }
        }
        self.validate()
    }

    /// The thresholds as a policy.
    pub fn policy(&self) -> Policy {
        let c = &self.cpu;
        let m = &self.memory;
        Policy {
            cpu: CpuPolicy {
                scale_up_utilisation: c.scale_up_utilisation,
                scale_up_throttled: c.scale_up_throttled,
                severe_throttled: c.severe_throttled,
                scale_down_utilisation: c.scale_down_utilisation,
                scale_down_throttled: c.scale_down_throttled,
                scale_down_window: Duration::from_secs_f64(c.scale_down_window_s),
            },
            mem: MemPolicy {
                scale_up_working_set: m.scale_up_working_set,
                psi_some_avg10: m.psi_some_avg10,
                scale_down_working_set: m.scale_down_working_set,
                scale_down_window: Duration::from_secs_f64(m.scale_down_window_s),
                oom_grace: Duration::from_millis(m.oom_grace_ms),
                ceiling_working_set: m.v2_high_ratio.min(1.0),
            },
        }
    }

    /// Per-environment CPU maximum in millicores.
    pub fn cpu_max_millicores(&self) -> u64 {
        (self.cpu.max_cores * 1000.0) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_design() {
        let c = ShimConfig::default();
        c.validate().unwrap();
        assert_eq!(c.policy(), Policy::default());
        assert_eq!(c.cpu_max_millicores(), 64_000);
        assert_eq!(c.memory.max_bytes, 32 << 30);
    }

    #[test]
    fn unknown_fields_and_bad_values_name_the_field() {
        let p = Path::new("t.toml");
        let e = ShimConfig::from_toml("version = 1\n[cpu]\nmax_corez = 3\n", p).unwrap_err();
        assert!(e.to_string().contains("max_corez"), "{e}");
        let e = ShimConfig::from_toml("version = 2\n", p).unwrap_err();
        assert!(e.to_string().contains("`version`"), "{e}");
        let e = ShimConfig::from_toml("version = 1\n[cpu]\nscale_up_utilisation = 1.5\n", p)
            .unwrap_err();
        assert!(e.to_string().contains("cpu.scale_up_utilisation"), "{e}");
    }

    #[test]
    fn annotations_override() {
        let mut c = ShimConfig::default();
        let ann: HashMap<String, String> = [
            ("io.weenv.elastic", "false"),
            ("io.weenv.memory.max", "128Mi"),
            ("io.weenv.cpu.max", "2.5"),
            ("other.annotation", "x"),
        ]
        .into_iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
        c.apply_annotations(&ann).unwrap();
        assert!(!c.monitor.elastic);
        assert_eq!(c.memory.max_bytes, 128 << 20);
        assert_eq!(c.cpu_max_millicores(), 2500);
        let bad: HashMap<String, String> =
            [("io.weenv.cpu.maxx".to_string(), "1".to_string())].into();
        let e = c.apply_annotations(&bad).unwrap_err();
        assert!(e.to_string().contains("io.weenv.cpu.maxx"), "{e}");
    }

    #[test]
    fn shipped_example_config_is_the_default() {
        let text = include_str!("../../config/shim.toml");
        let c = ShimConfig::from_toml(text, Path::new("config/shim.toml")).unwrap();
        assert_eq!(c, ShimConfig::default());
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_bytes("64Mi"), Some(64 << 20));
        assert_eq!(parse_bytes("1Gi"), Some(1 << 30));
        assert_eq!(parse_bytes("1000"), Some(1000));
        assert_eq!(parse_bytes("x"), None);
    }
}
