//! The environments the service knows and their events. Everything needed to find an
//! environment again after a restart of the service is in its containerd container record's
//! labels ([`labels`]); the rest (sessions, running execs) lives and dies with the process.

use crate::proto::{EnvInfo, EnvState, Event};
use crate::session::Session;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::sync::broadcast;

/// Container labels holding an environment's service state.
pub mod labels {
    /// `"1"` on every container the service manages (the reconcile filter).
    pub const MANAGED: &str = "io.weenv.envd.managed";
    /// Unix seconds of creation.
    pub const CREATED: &str = "io.weenv.envd.created";
    /// Unix seconds after which the service deletes it (time to live).
    pub const EXPIRES: &str = "io.weenv.envd.expires";
    /// What it was created from (plan path, `inline plan`, groups, image reference).
    pub const SOURCE: &str = "io.weenv.envd.source";
    /// The caller's labels (JSON object).
    pub const USER: &str = "io.weenv.envd.labels";
    /// Environment variables added to every exec and session (JSON object).
    pub const ENV: &str = "io.weenv.envd.env";
    /// containerd image record created for it (deleted with it; empty for an image source).
    pub const IMAGE: &str = "io.weenv.envd.image";
}

pub fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

pub fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// One environment.
pub struct Env {
    pub id: String,
    pub created_at: i64,
    pub expires_at: i64,
    pub source: String,
    pub snapshotter: String,
    pub runtime: String,
    pub user_labels: BTreeMap<String, String>,
    pub env: BTreeMap<String, String>,
    /// Image record to delete with the environment (empty: none).
    pub image_record: String,
    pub state: Mutex<(EnvState, String)>,
    pub pid: AtomicU32,
    /// The OCI `Process` of the container's spec (JSON): the template of every exec.
    pub process: Mutex<Option<serde_json::Value>>,
    pub sessions: Mutex<HashMap<String, Arc<Session>>>,
    pub running_execs: AtomicU32,
    /// Counter for exec ids (unique per service process; ids also carry a random part).
    pub exec_seq: AtomicU32,
    /// An exec process started ahead, waiting for the next exec's line ([`crate::exec::LAUNCHER`]).
    pub launcher: Mutex<Option<crate::exec::Started>>,
    /// A launcher is being started.
    pub launcher_pending: std::sync::atomic::AtomicBool,
    /// Notified when a launcher start ended (ready or failed).
    pub launcher_ready: tokio::sync::Notify,
}

impl Env {
    /// The labels of its container record.
    pub fn container_labels(&self) -> HashMap<String, String> {
        let mut l = HashMap::new();
        l.insert(labels::MANAGED.into(), "1".into());
        l.insert(labels::CREATED.into(), self.created_at.to_string());
        l.insert(labels::EXPIRES.into(), self.expires_at.to_string());
        l.insert(labels::SOURCE.into(), self.source.clone());
        l.insert(
            labels::USER.into(),
            serde_json::to_string(&self.user_labels).unwrap_or_default(),
        );
        l.insert(
            labels::ENV.into(),
            serde_json::to_string(&self.env).unwrap_or_default(),
        );
        l.insert(labels::IMAGE.into(), self.image_record.clone());
        l
    }

    /// An environment found again from its container record's labels (`None`: not ours).
    pub fn from_labels(
        id: &str,
        l: &HashMap<String, String>,
        snapshotter: &str,
        runtime: &str,
    ) -> Option<Env> {
        if l.get(labels::MANAGED).map(String::as_str) != Some("1") {
            return None;
        }
        let num = |k: &str| l.get(k).and_then(|v| v.parse::<i64>().ok()).unwrap_or(0);
        let map = |k: &str| -> BTreeMap<String, String> {
            l.get(k)
                .and_then(|v| serde_json::from_str(v).ok())
                .unwrap_or_default()
        };
        Some(Env {
            id: id.to_string(),
            created_at: num(labels::CREATED),
            expires_at: num(labels::EXPIRES),
            source: l.get(labels::SOURCE).cloned().unwrap_or_default(),
            snapshotter: snapshotter.to_string(),
            runtime: runtime.to_string(),
            user_labels: map(labels::USER),
            env: map(labels::ENV),
            image_record: l.get(labels::IMAGE).cloned().unwrap_or_default(),
            state: Mutex::new((EnvState::Creating, String::new())),
            pid: AtomicU32::new(0),
            process: Mutex::new(None),
            sessions: Mutex::new(HashMap::new()),
            running_execs: AtomicU32::new(0),
            exec_seq: AtomicU32::new(0),
            launcher: Mutex::new(None),
            launcher_pending: Default::default(),
            launcher_ready: Default::default(),
        })
    }

    pub fn state(&self) -> (EnvState, String) {
        self.state.lock().clone()
    }

    pub fn info(&self) -> EnvInfo {
        let (state, cause) = self.state();
        EnvInfo {
            id: self.id.clone(),
            state: state as i32,
            cause,
            labels: self
                .user_labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            created_at: self.created_at,
            expires_at: self.expires_at,
            source: self.source.clone(),
            snapshotter: self.snapshotter.clone(),
            runtime: self.runtime.clone(),
            pid: self.pid.load(Ordering::Relaxed),
        }
    }

    /// Its labels include every `want` pair.
    pub fn matches(&self, want: &HashMap<String, String>) -> bool {
        want.iter()
            .all(|(k, v)| self.user_labels.get(k).is_some_and(|x| x == v))
    }
}

/// State changes with causes: a broadcast to live `Events` streams and the last
/// [`Events::KEEP`] events for replay.
pub struct Events {
    tx: broadcast::Sender<Event>,
    history: Mutex<VecDeque<Event>>,
}

impl Default for Events {
    fn default() -> Self {
        Events {
            tx: broadcast::channel(4096).0,
            history: Mutex::new(VecDeque::new()),
        }
    }
}

impl Events {
    pub const KEEP: usize = 4096;

    pub fn emit(&self, env_id: &str, state: EnvState, cause: impl Into<String>) {
        let ev = Event {
            env_id: env_id.to_string(),
            state: state as i32,
            cause: cause.into(),
            unix_ms: unix_ms(),
        };
        tracing::info!(env = env_id, state = ?state, cause = %ev.cause, "environment event");
        {
            let mut h = self.history.lock();
            if h.len() == Self::KEEP {
                h.pop_front();
            }
            h.push_back(ev.clone());
        }
        let _ = self.tx.send(ev);
    }

    /// The held events (oldest first) and a receiver of the ones that follow.
    pub fn subscribe(&self) -> (Vec<Event>, broadcast::Receiver<Event>) {
        let h = self.history.lock();
        (h.iter().cloned().collect(), self.tx.subscribe())
    }
}

/// Set the state (and emit the event) unless it is already `state`.
pub fn set_state(env: &Env, events: &Events, state: EnvState, cause: impl Into<String>) {
    let cause = cause.into();
    {
        let mut s = env.state.lock();
        if s.0 == state && s.1 == cause {
            return;
        }
        *s = (state, cause.clone());
    }
    events.emit(&env.id, state, cause);
}

/// A short random hex string (ids).
pub fn random_hex(bytes: usize) -> String {
    let mut b = vec![0u8; bytes];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .is_err()
    {
        use sha2::Digest;
        let seed = format!("{:?}{}", SystemTime::now(), std::process::id());
        b = sha2::Sha256::digest(seed.as_bytes())[..bytes].to_vec();
    }
    hex::encode(b)
}
