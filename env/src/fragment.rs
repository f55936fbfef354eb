//! Image-config fragments of layer groups: the fragment an image config or a group config
//! contributes ([`source_config`], for groups cut from images or other groups), and a
//! command-line fragment merged over an inherited one ([`merge_fragment`]). Pure.

use crate::group::{ConfigFragment, GroupConfig, MEDIA_TYPE_GROUP_CONFIG};
use crate::plan::merge_env;
use weenv_format::Digest;
use weenv_registry::Platform;

/// Fragment of an OCI image config (`config` section) for `--from` sources.
pub fn image_fragment(cfg: &serde_json::Value) -> ConfigFragment {
    let c = &cfg["config"];
    let strs = |v: &serde_json::Value| -> Option<Vec<String>> {
        v.as_array().map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
    };
    let s = |v: &serde_json::Value| v.as_str().filter(|s| !s.is_empty()).map(str::to_string);
    ConfigFragment {
        env: strs(&c["Env"]).unwrap_or_default(),
        workdir: s(&c["WorkingDir"]),
        entrypoint: strs(&c["Entrypoint"]),
        cmd: strs(&c["Cmd"]),
        user: s(&c["User"]),
        labels: c["Labels"]
            .as_object()
            .map(|o| {
                o.iter()
                    .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                    .collect()
            })
            .unwrap_or_default(),
    }
}

/// diff_ids, config fragment and platform of a `--from` source: an image config, or the
/// config of a layer group (so groups can be cut from groups).
pub fn source_config(
    media_type: &str,
    bytes: &[u8],
    host: &Platform,
) -> Result<(Vec<Digest>, ConfigFragment, Platform), String> {
    if media_type == MEDIA_TYPE_GROUP_CONFIG {
        let g = GroupConfig::from_json(bytes).map_err(|e| e.to_string())?;
        return Ok((g.diff_ids, g.config, g.platform));
    }
    let cfg: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
    let diff_ids: Vec<Digest> = cfg["rootfs"]["diff_ids"]
        .as_array()
        .map(|a| a.iter().filter_map(|d| d.as_str()?.parse().ok()).collect())
        .unwrap_or_default();
    let platform = Platform {
        os: cfg["os"].as_str().unwrap_or("linux").to_string(),
        architecture: cfg["architecture"]
            .as_str()
            .unwrap_or(&host.architecture)
            .to_string(),
        variant: cfg["variant"].as_str().map(str::to_string),
        ..Default::default()
    };
    Ok((diff_ids, image_fragment(&cfg), platform))
}

/// Command-line fragment over an inherited one: env merged, other fields replaced when set.
pub fn merge_fragment(base: ConfigFragment, over: &ConfigFragment) -> ConfigFragment {
    let mut labels = base.labels;
    labels.extend(over.labels.clone());
    ConfigFragment {
        env: merge_env(&base.env, &over.env),
        workdir: over.workdir.clone().or(base.workdir),
        entrypoint: over.entrypoint.clone().or(base.entrypoint),
        cmd: over.cmd.clone().or(base.cmd),
        user: over.user.clone().or(base.user),
        labels,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::group::GroupKind;

    #[test]
    fn fragments_merge() {
        let base = ConfigFragment {
            env: vec!["PATH=/usr/bin".into(), "A=1".into()],
            cmd: Some(vec!["sh".into()]),
            ..Default::default()
        };
        let over = ConfigFragment {
            env: vec!["PATH=/opt/bin".into()],
            workdir: Some("/w".into()),
            ..Default::default()
        };
        let m = merge_fragment(base, &over);
        assert_eq!(m.env, vec!["PATH=/opt/bin:/usr/bin", "A=1"]);
        assert_eq!(m.cmd, Some(vec!["sh".to_string()]));
        assert_eq!(m.workdir.as_deref(), Some("/w"));
        let cfg = serde_json::json!({"config": {"Env": ["X=1"], "WorkingDir": "", "Cmd": ["a"]}});
        let f = image_fragment(&cfg);
        let g = GroupConfig {
            version: 1,
            kind: GroupKind::Task,
            name: "t".into(),
            platform: weenv_registry::manifest::host_platform(),
            config: ConfigFragment {
                workdir: Some("/w".into()),
                ..Default::default()
            },
            diff_ids: vec![Digest::sha256(b"x")],
        };
        let (d, fr, _) = source_config(
            MEDIA_TYPE_GROUP_CONFIG,
            &g.to_json(),
            &weenv_registry::manifest::host_platform(),
        )
        .unwrap();
        assert_eq!((d.len(), fr.workdir.as_deref()), (1, Some("/w")));
        let (d, _, p) = source_config(
            "application/vnd.oci.image.config.v1+json",
            br#"{"architecture":"arm64","os":"linux","rootfs":{"diff_ids":[]}}"#,
            &weenv_registry::manifest::host_platform(),
        )
        .unwrap();
        assert_eq!((d.len(), p.architecture.as_str()), (0, "arm64"));
        assert_eq!(
            (f.env.len(), f.workdir, f.cmd),
            (1, None, Some(vec!["a".to_string()]))
        );
    }
}
