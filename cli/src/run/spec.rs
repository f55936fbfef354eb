//! The OCI runtime spec of a `weenv run` container, built with `oci-spec`'s runtime types the
//! way containerd 1.6 builds it for `ctr run IMAGE ID [CMD...]` (`oci.WithDefaultSpec`,
//! `oci.WithDefaultUnixDevices`, `oci.WithImageConfig`, `--mount`, `oci.WithProcessArgs`):
//! containerd's default Unix spec (root `rootfs`, cwd `/`, uid/gid 0, no new privileges, its
//! 14 default capabilities, `RLIMIT_NOFILE` 1024, masked and read-only `/proc` paths, cgroups
//! path `/<namespace>/<id>`, a deny-all device rule plus the default Unix devices, pid/ipc/uts/
//! mount/network namespaces, the mounts proc, /dev, /dev/pts, /dev/shm, /dev/mqueue, /sys and
//! /run), then the image config (env or the default `PATH`, entrypoint + cmd or the given
//! command, working dir, user and additional gids from the image's `/etc/passwd` and
//! `/etc/group`). Pure: the rootfs is read by the caller ([`UserDb`]).

use oci_spec::image::ImageConfiguration;
use oci_spec::runtime::{
    Capability, LinuxBuilder, LinuxCapabilitiesBuilder, LinuxCpuBuilder, LinuxDeviceCgroup,
    LinuxDeviceCgroupBuilder, LinuxDeviceType, LinuxMemoryBuilder, LinuxNamespaceBuilder,
    LinuxNamespaceType, LinuxResourcesBuilder, Mount, MountBuilder, PosixRlimitBuilder,
    PosixRlimitType, ProcessBuilder, RootBuilder, Spec, SpecBuilder, UserBuilder,
};
use std::collections::HashMap;
use thiserror::Error;

/// containerd's type URL of a runtime spec in `Container.spec` (an `Any` holding JSON).
pub const SPEC_TYPE_URL: &str = "types.containerd.io/opencontainers/runtime-spec/1/Spec";
/// The runtime spec version containerd 1.6 writes.
pub const SPEC_VERSION: &str = "1.0.2-dev";
/// containerd's environment when the image config has none.
pub const DEFAULT_PATH_ENV: &str =
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Container label containerd's `WithImageStopSignal` sets (default `SIGTERM`).
pub const LABEL_STOP_SIGNAL: &str = "io.containerd.image.config.stop-signal";

/// Errors building a runtime spec.
#[derive(Debug, Error)]
pub enum SpecError {
    #[error("building the runtime spec: {0}")]
    Oci(#[from] oci_spec::OciSpecError),
    #[error("mount {spec:?}: {reason}")]
    MountSpec { spec: String, reason: String },
    #[error("user {user:?} of the image config: {reason}")]
    User { user: String, reason: String },
    #[error("encoding the runtime spec: {0}")]
    Json(#[from] serde_json::Error),
}

fn default_caps() -> Vec<Capability> {
    use Capability::*;
    vec![
        Chown,
        DacOverride,
        Fsetid,
        Fowner,
        Mknod,
        NetRaw,
        Setgid,
        Setuid,
        Setfcap,
        Setpcap,
        NetBindService,
        SysChroot,
        Kill,
        AuditWrite,
    ]
}

fn mount(dst: &str, typ: &str, src: &str, opts: &[&str]) -> Result<Mount, SpecError> {
    Ok(MountBuilder::default()
        .destination(dst)
        .typ(typ)
        .source(src)
        .options(opts.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        .build()?)
}

/// containerd's default Linux mounts (`oci/mounts.go`).
pub fn default_mounts() -> Result<Vec<Mount>, SpecError> {
    let dev = ["nosuid", "strictatime", "mode=755", "size=65536k"];
    Ok(vec![
        mount("/proc", "proc", "proc", &["nosuid", "noexec", "nodev"])?,
        mount("/dev", "tmpfs", "tmpfs", &dev)?,
        mount(
            "/dev/pts",
            "devpts",
            "devpts",
            &[
                "nosuid",
                "noexec",
                "newinstance",
                "ptmxmode=0666",
                "mode=0620",
                "gid=5",
            ],
        )?,
        mount(
            "/dev/shm",
            "tmpfs",
            "shm",
            &["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
        )?,
        mount(
            "/dev/mqueue",
            "mqueue",
            "mqueue",
            &["nosuid", "noexec", "nodev"],
        )?,
        mount(
            "/sys",
            "sysfs",
            "sysfs",
            &["nosuid", "noexec", "nodev", "ro"],
        )?,
        mount("/run", "tmpfs", "tmpfs", &dev)?,
    ])
}

fn dev_rule(
    allow: bool,
    typ: Option<LinuxDeviceType>,
    major: Option<i64>,
    minor: Option<i64>,
) -> Result<LinuxDeviceCgroup, SpecError> {
    let mut b = LinuxDeviceCgroupBuilder::default()
        .allow(allow)
        .access("rwm");
    if let Some(t) = typ {
        b = b.typ(t);
    }
    if let Some(m) = major {
        b = b.major(m);
    }
    if let Some(m) = minor {
        b = b.minor(m);
    }
    Ok(b.build()?)
}

/// Deny all, then containerd's `WithDefaultUnixDevices` (null, random, full, tty, zero,
/// urandom, console, pts, ptmx, tuntap).
fn device_rules() -> Result<Vec<LinuxDeviceCgroup>, SpecError> {
    let c = Some(LinuxDeviceType::C);
    let mut v = vec![dev_rule(false, None, None, None)?];
    for (major, minor) in [
        (1, Some(3)),
        (1, Some(8)),
        (1, Some(7)),
        (5, Some(0)),
        (1, Some(5)),
        (1, Some(9)),
        (5, Some(1)),
        (136, None),
        (5, Some(2)),
        (10, Some(200)),
    ] {
        v.push(dev_rule(true, c, Some(major), minor)?);
    }
    Ok(v)
}

/// A ctr-style `--mount` spec, `type=bind,src=/a,dst=/b,options=rbind:rw` (keys `type`,
/// `source`/`src`, `destination`/`dst`/`target`, `options` separated by `:`).
pub fn parse_mount_spec(s: &str) -> Result<Mount, SpecError> {
    let err = |reason: &str| SpecError::MountSpec {
        spec: s.to_string(),
        reason: reason.to_string(),
    };
    let mut b = MountBuilder::default();
    let mut dst = false;
    for kv in s.split(',') {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| err(&format!("{kv:?} is not key=value")))?;
        b = match k {
            "type" => b.typ(v),
            "source" | "src" => b.source(v),
            "destination" | "dst" | "target" => {
                dst = true;
                b.destination(v)
            }
            "options" => b.options(v.split(':').map(str::to_string).collect::<Vec<_>>()),
            other => return Err(err(&format!("unknown key {other:?}"))),
        };
    }
    if !dst {
        return Err(err("no destination"));
    }
    Ok(b.build()?)
}

/// Users and groups of an image's rootfs (`/etc/passwd`, `/etc/group`); empty if absent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserDb {
    /// (name, uid, gid)
    pub users: Vec<(String, u32, u32)>,
    /// (name, gid, members)
    pub groups: Vec<(String, u32, Vec<String>)>,
}

impl UserDb {
    /// Parse `/etc/passwd` and `/etc/group` texts (malformed lines are skipped, like
    /// containerd's parser does).
    pub fn parse(passwd: &str, group: &str) -> UserDb {
        let users = passwd
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .filter_map(|l| {
                let f: Vec<&str> = l.split(':').collect();
                Some((
                    f.first()?.to_string(),
                    f.get(2)?.parse().ok()?,
                    f.get(3)?.parse().ok()?,
                ))
            })
            .collect();
        let groups = group
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .filter_map(|l| {
                let f: Vec<&str> = l.split(':').collect();
                let members = f
                    .get(3)
                    .map(|m| {
                        m.split(',')
                            .map(str::trim)
                            .filter(|s| !s.is_empty())
                            .map(str::to_string)
                            .collect()
                    })
                    .unwrap_or_default();
                Some((f.first()?.to_string(), f.get(2)?.parse().ok()?, members))
            })
            .collect();
        UserDb { users, groups }
    }
}

/// The process user of image config user `user` (`""`, `uid`, `name`, `uid:gid`,
/// `name:group`, ...): uid, gid and additional gids (the primary gid first, then the groups
/// listing the user), as containerd's `WithUser` + `WithAdditionalGIDs`.
pub fn resolve_user(user: &str, db: &UserDb) -> Result<(u32, u32, Vec<u32>), SpecError> {
    let err = |reason: String| SpecError::User {
        user: user.to_string(),
        reason,
    };
    let by_name = |n: &str| db.users.iter().find(|u| u.0 == n);
    let by_uid = |id: u32| db.users.iter().find(|u| u.1 == id);
    let (uid, gid) = match user.split_once(':') {
        _ if user.is_empty() => (0, 0),
        None => match user.parse::<u32>() {
            // A uid without a passwd entry runs with gid 0.
            Ok(uid) => (uid, by_uid(uid).map(|u| u.2).unwrap_or(0)),
            Err(_) => {
                let u = by_name(user).ok_or_else(|| err("no such user in /etc/passwd".into()))?;
                (u.1, u.2)
            }
        },
        Some((u, g)) => {
            let uid = match u.parse::<u32>() {
                Ok(uid) => uid,
                Err(_) => {
                    by_name(u)
                        .ok_or_else(|| err(format!("no user {u:?} in /etc/passwd")))?
                        .1
                }
            };
            let gid = match g.parse::<u32>() {
                Ok(gid) => gid,
                Err(_) => {
                    db.groups
                        .iter()
                        .find(|x| x.0 == g)
                        .ok_or_else(|| err(format!("no group {g:?} in /etc/group")))?
                        .1
                }
            };
            (uid, gid)
        }
    };
    // Supplementary groups: the groups listing the user by name (not its own-named group).
    let name = if user.is_empty() {
        Some("root".to_string())
    } else {
        by_uid(uid).map(|u| u.0.clone())
    };
    let mut gids = vec![gid];
    if let Some(name) = name {
        for (gname, g, members) in &db.groups {
            if *gname != name && members.contains(&name) && !gids.contains(g) {
                gids.push(*g);
            }
        }
    }
    Ok((uid, gid, gids))
}

/// Resource limits and annotations of a container, as `ctr run --cpus/--memory-limit/
/// --annotation` set them (the weenv shim reads the limits as the container's request and
/// `io.weenv.*` annotations as its elastic policy).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Limits {
    /// CPU quota in cores (CFS quota = cores × the 100 ms period).
    pub cpus: Option<f64>,
    /// Memory limit in bytes.
    pub memory_bytes: Option<i64>,
    /// OCI annotations of the runtime spec.
    pub annotations: HashMap<String, String>,
}

/// CFS period `ctr run --cpus` uses (µs).
const CPU_PERIOD_US: u64 = 100_000;

/// What the runtime spec is built from besides the image config.
#[derive(Clone, Debug, Default)]
pub struct SpecInput<'a> {
    pub namespace: &'a str,
    pub id: &'a str,
    /// Replaces entrypoint + cmd when not empty (like `ctr run IMAGE ID CMD...`).
    pub cmd: &'a [String],
    /// Extra mounts (after the defaults).
    pub mounts: Vec<Mount>,
    /// The image's users and groups.
    pub users: UserDb,
    pub limits: Limits,
}

/// The runtime spec of a container of an image with config `cfg`.
pub fn build_spec(cfg: &ImageConfiguration, input: &SpecInput<'_>) -> Result<Spec, SpecError> {
    let c = cfg.config().clone().unwrap_or_default();
    let env = match c.env() {
        Some(e) if !e.is_empty() => e.clone(),
        _ => vec![DEFAULT_PATH_ENV.to_string()],
    };
    let args: Vec<String> = if input.cmd.is_empty() {
        let mut a = c.entrypoint().clone().unwrap_or_default();
        a.extend(c.cmd().clone().unwrap_or_default());
        a
    } else {
        input.cmd.to_vec()
    };
    let cwd = match c.working_dir() {
        Some(d) if !d.is_empty() => d.clone(),
        _ => "/".to_string(),
    };
    let (uid, gid, gids) = resolve_user(c.user().as_deref().unwrap_or(""), &input.users)?;
    let caps: std::collections::HashSet<Capability> = default_caps().into_iter().collect();
    let mut capabilities = LinuxCapabilitiesBuilder::default()
        .bounding(caps.clone())
        .permitted(caps.clone())
        .effective(caps)
        .build()?;
    capabilities.set_inheritable(None);
    capabilities.set_ambient(None);
    let process = ProcessBuilder::default()
        .terminal(false)
        .user(
            UserBuilder::default()
                .uid(uid)
                .gid(gid)
                .additional_gids(gids)
                .build()?,
        )
        .args(args)
        .env(env)
        .cwd(cwd)
        .capabilities(capabilities)
        .rlimits(vec![PosixRlimitBuilder::default()
            .typ(PosixRlimitType::RlimitNofile)
            .hard(1024u64)
            .soft(1024u64)
            .build()?])
        .no_new_privileges(true)
        .build()?;
    let namespaces = [
        LinuxNamespaceType::Pid,
        LinuxNamespaceType::Ipc,
        LinuxNamespaceType::Uts,
        LinuxNamespaceType::Mount,
        LinuxNamespaceType::Network,
    ]
    .into_iter()
    .map(|t| LinuxNamespaceBuilder::default().typ(t).build())
    .collect::<Result<Vec<_>, _>>()?;
    let strs = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let linux = LinuxBuilder::default()
        .masked_paths(strs(&[
            "/proc/acpi",
            "/proc/asound",
            "/proc/kcore",
            "/proc/keys",
            "/proc/latency_stats",
            "/proc/timer_list",
            "/proc/timer_stats",
            "/proc/sched_debug",
            "/sys/firmware",
            "/proc/scsi",
        ]))
        .readonly_paths(strs(&[
            "/proc/bus",
            "/proc/fs",
            "/proc/irq",
            "/proc/sys",
            "/proc/sysrq-trigger",
        ]))
        .cgroups_path(format!("/{}/{}", input.namespace, input.id))
        .resources(resources(&input.limits)?)
        .namespaces(namespaces)
        .build()?;
    let mut mounts = default_mounts()?;
    mounts.extend(input.mounts.iter().cloned());
    // oci-spec's builders start from its own defaults (youki's): what containerd leaves
    // unset is cleared explicitly.
    let mut spec = SpecBuilder::default()
        .version(SPEC_VERSION)
        .root(
            RootBuilder::default()
                .path("rootfs")
                .readonly(false)
                .build()?,
        )
        .process(process)
        .mounts(mounts)
        .linux(linux)
        .annotations(input.limits.annotations.clone())
        .build()?;
    spec.set_hostname(None);
    Ok(spec)
}

/// The container's cgroup resources: the device rules, and CPU quota and memory limit when set.
fn resources(l: &Limits) -> Result<oci_spec::runtime::LinuxResources, SpecError> {
    let mut b = LinuxResourcesBuilder::default().devices(device_rules()?);
    if let Some(c) = l.cpus {
        b = b.cpu(
            LinuxCpuBuilder::default()
                .quota((c * CPU_PERIOD_US as f64).round() as i64)
                .period(CPU_PERIOD_US)
                .build()?,
        );
    }
    if let Some(m) = l.memory_bytes {
        b = b.memory(LinuxMemoryBuilder::default().limit(m).build()?);
    }
    Ok(b.build()?)
}

/// The spec as containerd stores it in a container record.
pub fn spec_any(spec: &Spec) -> Result<prost_types::Any, SpecError> {
    Ok(prost_types::Any {
        type_url: SPEC_TYPE_URL.to_string(),
        value: serde_json::to_vec(spec)?,
    })
}

/// Container labels `ctr run` sets from the image config: its labels and the stop signal.
pub fn container_labels(cfg: &ImageConfiguration) -> HashMap<String, String> {
    let c = cfg.config().clone().unwrap_or_default();
    let mut l = c.labels().clone().unwrap_or_default();
    l.insert(
        LABEL_STOP_SIGNAL.to_string(),
        c.stop_signal().clone().unwrap_or_else(|| "SIGTERM".into()),
    );
    l
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn config(json: &str) -> ImageConfiguration {
        serde_json::from_str(&format!(
            r#"{{"architecture":"amd64","os":"linux","rootfs":{{"type":"layers","diff_ids":[]}},"config":{json}}}"#
        ))
        .unwrap()
    }

    fn input<'a>(cmd: &'a [String], users: UserDb) -> SpecInput<'a> {
        SpecInput {
            namespace: "ns",
            id: "c1",
            cmd,
            mounts: vec![],
            users,
            limits: Limits::default(),
        }
    }

    #[test]
    fn limits_are_ctr_runs_cpus_memory_and_annotations() {
        let cfg = config(r#"{"Cmd":["x"]}"#);
        let v = serde_json::to_value(build_spec(&cfg, &input(&[], UserDb::default())).unwrap())
            .unwrap();
        assert!(v["linux"]["resources"].get("cpu").is_none(), "{v}");
        assert!(v["linux"]["resources"].get("memory").is_none(), "{v}");
        let mut i = input(&[], UserDb::default());
        i.limits = Limits {
            cpus: Some(0.25),
            memory_bytes: Some(512 << 20),
            annotations: [("io.weenv.elastic".to_string(), "false".to_string())].into(),
        };
        let v = serde_json::to_value(build_spec(&cfg, &i).unwrap()).unwrap();
        let r = &v["linux"]["resources"];
        assert_eq!(r["cpu"]["quota"], 25_000);
        assert_eq!(r["cpu"]["period"], 100_000);
        assert_eq!(r["memory"]["limit"], 512 << 20);
        assert_eq!(v["annotations"]["io.weenv.elastic"], "false");
        assert!(r["devices"].as_array().is_some_and(|d| !d.is_empty()));
    }

    #[test]
    fn the_spec_is_containerds_default_for_ctr_run() {
        let cfg = config(r#"{"Env":["A=1"],"Entrypoint":["/ep"],"Cmd":["x"],"WorkingDir":"/w"}"#);
        let spec = build_spec(&cfg, &input(&[], UserDb::default())).unwrap();
        let v = serde_json::to_value(&spec).unwrap();
        assert_eq!(v["ociVersion"], SPEC_VERSION);
        assert_eq!(v["root"]["path"], "rootfs");
        assert_eq!(v["root"]["readonly"], false);
        assert!(v.get("hostname").is_none(), "{v}");
        let p = &v["process"];
        assert_eq!(p["args"], serde_json::json!(["/ep", "x"]));
        assert_eq!(p["env"], serde_json::json!(["A=1"]));
        assert_eq!(p["cwd"], "/w");
        assert_eq!(p["noNewPrivileges"], true);
        assert_eq!(p["terminal"], false);
        assert_eq!(
            p["user"],
            serde_json::json!({"uid":0,"gid":0,"additionalGids":[0]})
        );
        assert_eq!(
            p["rlimits"],
            serde_json::json!([{"type":"RLIMIT_NOFILE","hard":1024,"soft":1024}])
        );
        let caps = p["capabilities"]["bounding"].as_array().unwrap();
        assert_eq!(caps.len(), 14);
        assert!(caps.contains(&"CAP_NET_BIND_SERVICE".into()));
        assert!(p["capabilities"].get("inheritable").is_none());
        assert!(p["capabilities"].get("ambient").is_none());
        let l = &v["linux"];
        assert_eq!(l["cgroupsPath"], "/ns/c1");
        assert_eq!(
            l["namespaces"],
            serde_json::json!([{"type":"pid"},{"type":"ipc"},{"type":"uts"},{"type":"mount"},{"type":"network"}])
        );
        let dev = l["resources"]["devices"].as_array().unwrap();
        assert_eq!(dev[0], serde_json::json!({"allow":false,"access":"rwm"}));
        assert_eq!(
            dev[1],
            serde_json::json!({"allow":true,"type":"c","major":1,"minor":3,"access":"rwm"})
        );
        assert_eq!(dev.len(), 11);
        assert_eq!(l["maskedPaths"].as_array().unwrap().len(), 10);
        assert_eq!(l["readonlyPaths"].as_array().unwrap().len(), 5);
        assert!(l.get("seccomp").is_none());
        let dsts: Vec<&str> = v["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["destination"].as_str().unwrap())
            .collect();
        assert_eq!(
            dsts,
            [
                "/proc",
                "/dev",
                "/dev/pts",
                "/dev/shm",
                "/dev/mqueue",
                "/sys",
                "/run"
            ]
        );
        // The Any containerd stores.
        let any = spec_any(&spec).unwrap();
        assert_eq!(any.type_url, SPEC_TYPE_URL);
        let back: Spec = serde_json::from_slice(&any.value).unwrap();
        assert_eq!(back, spec);
    }

    #[test]
    fn a_given_command_replaces_entrypoint_and_cmd_and_defaults_apply() {
        let cfg = config(r#"{"Entrypoint":["/ep"],"Cmd":["x"]}"#);
        let cmd = vec!["/bin/sh".to_string(), "-c".into(), "true".into()];
        let spec = build_spec(&cfg, &input(&cmd, UserDb::default())).unwrap();
        let p = spec.process().as_ref().unwrap();
        assert_eq!(p.args().as_deref(), Some(&cmd[..]));
        assert_eq!(
            p.env().as_deref(),
            Some(&[DEFAULT_PATH_ENV.to_string()][..])
        );
        assert_eq!(p.cwd().to_str(), Some("/"));
        // No config section at all.
        let bare: ImageConfiguration = serde_json::from_str(
            r#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#,
        )
        .unwrap();
        let spec = build_spec(&bare, &input(&cmd, UserDb::default())).unwrap();
        assert_eq!(
            spec.process().as_ref().unwrap().args().as_deref(),
            Some(&cmd[..])
        );
    }

    #[test]
    fn extra_mounts_follow_the_defaults() {
        let cfg = config("{}");
        let mut i = input(&[], UserDb::default());
        i.mounts = vec![parse_mount_spec("type=bind,src=/a,dst=/out,options=rbind:rw").unwrap()];
        let spec = build_spec(&cfg, &i).unwrap();
        let last = spec.mounts().as_ref().unwrap().last().unwrap().clone();
        assert_eq!(last.destination().to_str(), Some("/out"));
        assert_eq!(last.typ().as_deref(), Some("bind"));
        assert_eq!(last.source().as_ref().unwrap().to_str(), Some("/a"));
        assert_eq!(
            last.options().as_deref(),
            Some(&["rbind".to_string(), "rw".into()][..])
        );
    }

    #[test]
    fn mount_specs_are_parsed_like_ctr() {
        let m = parse_mount_spec("type=tmpfs,destination=/t,source=tmpfs,options=size=1m").unwrap();
        assert_eq!(m.destination().to_str(), Some("/t"));
        assert!(parse_mount_spec("type=bind,src=/a").is_err());
        assert!(parse_mount_spec("type=bind,src=/a,dst=/b,colour=red").is_err());
        assert!(parse_mount_spec("bind").is_err());
    }

    #[test]
    fn users_resolve_like_containerd() {
        let db = UserDb::parse(
            "root:x:0:0:root:/root:/bin/sh\n# c\nbad line\napp:x:1000:1001::/home/app:/bin/sh\n",
            "root:x:0:\nwheel:x:10:root,app\napp:x:1001:app\ndocker:x:999: app \n",
        );
        assert_eq!(resolve_user("", &db).unwrap(), (0, 0, vec![0, 10]));
        assert_eq!(
            resolve_user("app", &db).unwrap(),
            (1000, 1001, vec![1001, 10, 999])
        );
        assert_eq!(
            resolve_user("1000", &db).unwrap(),
            (1000, 1001, vec![1001, 10, 999])
        );
        assert_eq!(
            resolve_user("app:wheel", &db).unwrap(),
            (1000, 10, vec![10, 999])
        );
        assert_eq!(resolve_user("5:6", &db).unwrap(), (5, 6, vec![6]));
        // A uid without a passwd entry: gid 0.
        assert_eq!(resolve_user("4242", &db).unwrap(), (4242, 0, vec![0]));
        assert!(resolve_user("nobody", &db).is_err());
        assert!(resolve_user("app:nogroup", &db).is_err());
        // No /etc/passwd at all (scratch images).
        assert_eq!(
            resolve_user("", &UserDb::default()).unwrap(),
            (0, 0, vec![0])
        );
        assert!(resolve_user("app", &UserDb::default()).is_err());
    }

    #[test]
    fn labels_carry_the_stop_signal() {
        let l = container_labels(&config(r#"{"Labels":{"a":"b"},"StopSignal":"SIGINT"}"#));
        assert_eq!(l["a"], "b");
        assert_eq!(l[LABEL_STOP_SIGNAL], "SIGINT");
        assert_eq!(
            container_labels(&config("{}"))[LABEL_STOP_SIGNAL],
            "SIGTERM"
        );
    }
}
