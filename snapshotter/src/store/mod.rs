//! Persistent metadata in an embedded transactional store (redb).
//!
//! Tables:
//! - `snapshots`: snapshot key -> [`SnapshotRecord`] (JSON). Active, view and committed
//!   snapshots share one key space, as in containerd.
//! - `layers`: layer digest -> [`LayerRecord`] (weenv or not, TOC path, reference).
//! - `refs`: image reference -> resolved digest.
//! - `meta`: counters (`next_id`).
//!
//! Every containerd snapshotter rule that depends on more than one record (key uniqueness,
//! parent committed, no removal with children, commit moves active -> committed) is checked
//! inside one write transaction. Directory work happens in the service, outside the store.

pub mod filter;
mod record;

pub use filter::{Filter, FilterError};
pub use record::{Kind, LayerKind, LayerRecord, RemoteLayerRef, SnapshotRecord};

use redb::{Database, ReadableTable, TableDefinition, WriteTransaction};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use thiserror::Error;

const SNAPSHOTS: TableDefinition<&str, &[u8]> = TableDefinition::new("snapshots");
const LAYERS: TableDefinition<&str, &[u8]> = TableDefinition::new("layers");
const REFS: TableDefinition<&str, &str> = TableDefinition::new("refs");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

/// Store errors; the first four map to containerd's errdefs.
#[derive(Debug, Error)]
pub enum StoreError {
    #[error("snapshot {0:?} not found")]
    NotFound(String),
    #[error("snapshot {0:?} already exists")]
    AlreadyExists(String),
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    InvalidArgument(String),
    #[error("metadata store {path}: {message}")]
    Db { path: PathBuf, message: String },
    #[error("corrupt metadata record {key:?}: {message}")]
    Corrupt { key: String, message: String },
}

/// The metadata store.
pub struct MetaStore {
    db: Database,
    path: PathBuf,
}

/// A new snapshot to insert.
#[derive(Clone, Debug)]
pub struct NewSnapshot {
    pub key: String,
    pub parent: String,
    pub kind: Kind,
    pub labels: BTreeMap<String, String>,
    pub remote: Option<RemoteLayerRef>,
    /// (bytes, inodes) reported by Usage for a committed (remote) snapshot.
    pub usage: (i64, i64),
    pub now_nanos: u64,
    /// Layers whose native tree the snapshot's mount uses (see [`SnapshotRecord::native`]).
    pub native: Vec<String>,
}

impl MetaStore {
    /// Open (or create) the database at `path` and make sure all tables exist.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let db = Database::create(path).map_err(|e| db_err(path, e))?;
        let s = Self {
            db,
            path: path.to_path_buf(),
        };
        s.write(|tx| {
            tx.open_table(SNAPSHOTS).map_err(|e| s.err(e))?;
            tx.open_table(LAYERS).map_err(|e| s.err(e))?;
            tx.open_table(REFS).map_err(|e| s.err(e))?;
            tx.open_table(META).map_err(|e| s.err(e))?;
            Ok(())
        })?;
        Ok(s)
    }

    fn err(&self, e: impl Into<redb::Error>) -> StoreError {
        db_err(&self.path, e)
    }

    fn write<T>(
        &self,
        f: impl FnOnce(&WriteTransaction) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let tx = self.db.begin_write().map_err(|e| self.err(e))?;
        let out = f(&tx)?; // dropping `tx` on error aborts it
        tx.commit().map_err(|e| self.err(e))?;
        Ok(out)
    }

    /// One snapshot by key.
    pub fn get(&self, key: &str) -> Result<SnapshotRecord, StoreError> {
        let tx = self.db.begin_read().map_err(|e| self.err(e))?;
        let t = tx.open_table(SNAPSHOTS).map_err(|e| self.err(e))?;
        let v = t.get(key).map_err(|e| self.err(e))?;
        match v {
            Some(v) => decode(key, v.value()),
            None => Err(StoreError::NotFound(key.to_string())),
        }
    }

    /// All snapshots, sorted by key.
    pub fn list(&self) -> Result<Vec<SnapshotRecord>, StoreError> {
        let tx = self.db.begin_read().map_err(|e| self.err(e))?;
        let t = tx.open_table(SNAPSHOTS).map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        for item in t.iter().map_err(|e| self.err(e))? {
            let (k, v) = item.map_err(|e| self.err(e))?;
            out.push(decode(k.value(), v.value())?);
        }
        Ok(out)
    }

    /// Insert an active/view snapshot (or a committed remote one). Checks: key free,
    /// parent exists and is committed. Allocates a fresh id.
    pub fn create(&self, new: NewSnapshot) -> Result<SnapshotRecord, StoreError> {
        if new.key.is_empty() {
            return Err(StoreError::InvalidArgument(
                "snapshot key must not be empty".into(),
            ));
        }
        if new.kind == Kind::Committed && new.remote.is_none() {
            return Err(StoreError::InvalidArgument(
                "only remote snapshots are created committed".into(),
            ));
        }
        self.write(|tx| {
            let mut t = tx.open_table(SNAPSHOTS).map_err(|e| self.err(e))?;
            if t.get(new.key.as_str()).map_err(|e| self.err(e))?.is_some() {
                return Err(StoreError::AlreadyExists(new.key.clone()));
            }
            if !new.parent.is_empty() {
                let p = t
                    .get(new.parent.as_str())
                    .map_err(|e| self.err(e))?
                    .ok_or_else(|| StoreError::NotFound(new.parent.clone()))?;
                let p: SnapshotRecord = decode(&new.parent, p.value())?;
                if p.kind != Kind::Committed {
                    return Err(StoreError::InvalidArgument(format!(
                        "parent {:?} is not a committed snapshot",
                        new.parent
                    )));
                }
            }
            let id = next_id(tx, self)?;
            let rec = SnapshotRecord {
                key: new.key.clone(),
                id,
                kind: new.kind,
                parent: new.parent.clone(),
                labels: new.labels.clone(),
                created_nanos: new.now_nanos,
                updated_nanos: new.now_nanos,
                size: new.usage.0,
                inodes: new.usage.1,
                remote: new.remote.clone(),
                native: new.native.clone(),
            };
            t.insert(new.key.as_str(), encode(&rec).as_slice())
                .map_err(|e| self.err(e))?;
            Ok(rec)
        })
    }

    /// Commit active `key` as `name` (same id and directory), with `labels` and usage.
    pub fn commit(
        &self,
        name: &str,
        key: &str,
        labels: BTreeMap<String, String>,
        usage: (i64, i64),
        now_nanos: u64,
    ) -> Result<SnapshotRecord, StoreError> {
        if name.is_empty() {
            return Err(StoreError::InvalidArgument(
                "commit name must not be empty".into(),
            ));
        }
        self.write(|tx| {
            let mut t = tx.open_table(SNAPSHOTS).map_err(|e| self.err(e))?;
            let active: SnapshotRecord = t
                .get(key)
                .map_err(|e| self.err(e))?
                .ok_or_else(|| StoreError::NotFound(key.to_string()))
                .and_then(|v| decode(key, v.value()))?;
            if active.kind != Kind::Active {
                return Err(StoreError::FailedPrecondition(format!(
                    "snapshot {key:?} is not active (kind {:?})",
                    active.kind
                )));
            }
            if t.get(name).map_err(|e| self.err(e))?.is_some() {
                return Err(StoreError::AlreadyExists(name.to_string()));
            }
            let rec = SnapshotRecord {
                key: name.to_string(),
                kind: Kind::Committed,
                labels,
                created_nanos: now_nanos,
                updated_nanos: now_nanos,
                size: usage.0,
                inodes: usage.1,
                native: Vec::new(), // a committed snapshot is not mounted
                ..active
            };
            t.remove(key).map_err(|e| self.err(e))?;
            t.insert(name, encode(&rec).as_slice())
                .map_err(|e| self.err(e))?;
            Ok(rec)
        })
    }

    /// Remove `key`; fails with FailedPrecondition if any snapshot has it as parent.
    pub fn remove(&self, key: &str) -> Result<SnapshotRecord, StoreError> {
        self.write(|tx| {
            let mut t = tx.open_table(SNAPSHOTS).map_err(|e| self.err(e))?;
            let rec: SnapshotRecord = t
                .get(key)
                .map_err(|e| self.err(e))?
                .ok_or_else(|| StoreError::NotFound(key.to_string()))
                .and_then(|v| decode(key, v.value()))?;
            for item in t.iter().map_err(|e| self.err(e))? {
                let (k, v) = item.map_err(|e| self.err(e))?;
                let child: SnapshotRecord = decode(k.value(), v.value())?;
                if child.parent == key {
                    return Err(StoreError::FailedPrecondition(format!(
                        "cannot remove snapshot {key:?}: snapshot {:?} has it as parent",
                        child.key
                    )));
                }
            }
            t.remove(key).map_err(|e| self.err(e))?;
            Ok(rec)
        })
    }

    /// Apply a containerd label update (`fieldpaths` empty = replace all labels).
    pub fn update_labels(
        &self,
        key: &str,
        labels: &BTreeMap<String, String>,
        fieldpaths: &[String],
        now_nanos: u64,
    ) -> Result<SnapshotRecord, StoreError> {
        self.write(|tx| {
            let mut t = tx.open_table(SNAPSHOTS).map_err(|e| self.err(e))?;
            let mut rec: SnapshotRecord = t
                .get(key)
                .map_err(|e| self.err(e))?
                .ok_or_else(|| StoreError::NotFound(key.to_string()))
                .and_then(|v| decode(key, v.value()))?;
            rec.labels = apply_label_update(&rec.labels, labels, fieldpaths)?;
            rec.updated_nanos = now_nanos;
            t.insert(key, encode(&rec).as_slice())
                .map_err(|e| self.err(e))?;
            Ok(rec)
        })
    }

    /// Layer record by digest.
    pub fn layer(&self, digest: &str) -> Result<Option<LayerRecord>, StoreError> {
        let tx = self.db.begin_read().map_err(|e| self.err(e))?;
        let t = tx.open_table(LAYERS).map_err(|e| self.err(e))?;
        let v = t.get(digest).map_err(|e| self.err(e))?;
        v.map(|v| decode(digest, v.value())).transpose()
    }

    /// Insert or replace a layer record.
    pub fn put_layer(&self, rec: &LayerRecord) -> Result<(), StoreError> {
        self.write(|tx| {
            let mut t = tx.open_table(LAYERS).map_err(|e| self.err(e))?;
            t.insert(rec.digest.as_str(), encode(rec).as_slice())
                .map_err(|e| self.err(e))?;
            Ok(())
        })
    }

    /// Changes layer record `digest` in one transaction; `Ok(false)` when there is none.
    pub fn update_layer(
        &self,
        digest: &str,
        f: impl FnOnce(&mut LayerRecord),
    ) -> Result<bool, StoreError> {
        self.write(|tx| {
            let mut t = tx.open_table(LAYERS).map_err(|e| self.err(e))?;
            let rec = t
                .get(digest)
                .map_err(|e| self.err(e))?
                .map(|v| decode::<LayerRecord>(digest, v.value()))
                .transpose()?;
            let Some(mut rec) = rec else {
                return Ok(false);
            };
            f(&mut rec);
            t.insert(digest, encode(&rec).as_slice())
                .map_err(|e| self.err(e))?;
            Ok(true)
        })
    }

    /// All layer records.
    pub fn layers(&self) -> Result<Vec<LayerRecord>, StoreError> {
        let tx = self.db.begin_read().map_err(|e| self.err(e))?;
        let t = tx.open_table(LAYERS).map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        for item in t.iter().map_err(|e| self.err(e))? {
            let (k, v) = item.map_err(|e| self.err(e))?;
            out.push(decode(k.value(), v.value())?);
        }
        Ok(out)
    }

    /// Record that `reference` resolved to `digest`.
    pub fn put_ref(&self, reference: &str, digest: &str) -> Result<(), StoreError> {
        self.write(|tx| {
            let mut t = tx.open_table(REFS).map_err(|e| self.err(e))?;
            t.insert(reference, digest).map_err(|e| self.err(e))?;
            Ok(())
        })
    }

    /// The digest `reference` last resolved to.
    pub fn get_ref(&self, reference: &str) -> Result<Option<String>, StoreError> {
        let tx = self.db.begin_read().map_err(|e| self.err(e))?;
        let t = tx.open_table(REFS).map_err(|e| self.err(e))?;
        let v = t.get(reference).map_err(|e| self.err(e))?;
        Ok(v.map(|v| v.value().to_string()))
    }
}

fn next_id(tx: &WriteTransaction, s: &MetaStore) -> Result<u64, StoreError> {
    let mut m = tx.open_table(META).map_err(|e| s.err(e))?;
    let id = m
        .get("next_id")
        .map_err(|e| s.err(e))?
        .map(|v| v.value())
        .unwrap_or(1);
    m.insert("next_id", id + 1).map_err(|e| s.err(e))?;
    Ok(id)
}

/// containerd's label update rules: no paths = replace all labels; `labels` = replace all;
/// `labels.<k>` = set (or delete if absent in `new`) one label; anything else is invalid.
pub fn apply_label_update(
    old: &BTreeMap<String, String>,
    new: &BTreeMap<String, String>,
    fieldpaths: &[String],
) -> Result<BTreeMap<String, String>, StoreError> {
    if fieldpaths.is_empty() {
        return Ok(new.clone());
    }
    let mut out = old.clone();
    for p in fieldpaths {
        if p == "labels" {
            out = new.clone();
        } else if let Some(k) = p.strip_prefix("labels.") {
            match new.get(k) {
                Some(v) => out.insert(k.to_string(), v.clone()),
                None => out.remove(k),
            };
        } else {
            return Err(StoreError::InvalidArgument(format!(
                "cannot update field {p:?}: only labels can be updated"
            )));
        }
    }
    Ok(out)
}

fn db_err(path: &Path, e: impl Into<redb::Error>) -> StoreError {
    StoreError::Db {
        path: path.to_path_buf(),
        message: e.into().to_string(),
    }
}

fn encode<T: serde::Serialize>(v: &T) -> Vec<u8> {
    // Serializing plain structs of strings/integers/maps cannot fail.
    serde_json::to_vec(v).unwrap_or_default()
}

fn decode<T: serde::de::DeserializeOwned>(key: &str, b: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(b).map_err(|e| StoreError::Corrupt {
        key: key.to_string(),
        message: e.to_string(),
    })
}

mod tests;
