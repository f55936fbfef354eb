//! One container's lifecycle through containerd's gRPC API (what `ctr run` does through
//! containerd's Go client): a lease, the rootfs snapshot (`Snapshots.Prepare`, key = the
//! container id, parent = the image's top chain id), the container record (`Containers.Create`:
//! image, snapshotter, snapshot key, runtime, the runtime spec as an `Any`), the task
//! (`Tasks.Create` with the snapshot's mounts as rootfs and FIFO stdio, `Start`, `Wait`,
//! `Kill`, `Delete`, `CloseIO` once this side's stdin copy ended), and the clean-up (task,
//! container, snapshot).
//!
//! GC: the snapshot is prepared under a lease (expiring after an hour if this process dies),
//! the container record then references it (`snapshotter` + `snapshot_key`, a GC root), and
//! the lease is deleted; removing the container removes the snapshot too.

use crate::pull::{ctd, Ctd, PullError};
use containerd_client::services::v1::containers_client::ContainersClient;
use containerd_client::services::v1::snapshots::snapshots_client::SnapshotsClient;
use containerd_client::services::v1::snapshots::RemoveSnapshotRequest;
use containerd_client::services::v1::tasks_client::TasksClient;
use containerd_client::services::v1::{
    container::Runtime, CloseIoRequest, Container, CreateContainerRequest, CreateTaskRequest,
    DeleteContainerRequest, DeleteProcessRequest, DeleteTaskRequest, ExecProcessRequest,
    KillRequest, StartRequest, WaitRequest,
};
use containerd_client::types::Mount;
use std::collections::HashMap;

/// containerd's default runtime (`ctr run --runtime`).
pub const DEFAULT_RUNTIME: &str = "io.containerd.runc.v2";

/// What the container record holds.
#[derive(Clone, Debug)]
pub struct ContainerRecord {
    pub id: String,
    pub image: String,
    pub snapshotter: String,
    pub runtime: String,
    pub labels: HashMap<String, String>,
    pub spec: prost_types::Any,
}

/// Stdio paths of a task (FIFOs or empty).
#[derive(Clone, Debug, Default)]
pub struct TaskStdio {
    pub stdin: String,
    pub stdout: String,
    pub stderr: String,
}

/// containerd calls of one container's lifecycle, in one namespace.
#[derive(Clone)]
pub struct Lifecycle {
    c: Ctd,
}

impl Lifecycle {
    pub fn new(channel: tonic::transport::Channel, namespace: &str) -> Lifecycle {
        Lifecycle {
            c: Ctd::new(channel, namespace),
        }
    }

    /// Lease `id` for the calls that follow (see [`Ctd::begin_lease`]).
    pub async fn begin_lease(&mut self, id: String) -> Result<(), PullError> {
        self.c.begin_lease(id).await
    }

    pub async fn end_lease(&mut self) -> Result<(), PullError> {
        self.c.end_lease().await
    }

    /// Prepare the container's active snapshot `key` on `parent`; its mounts.
    pub async fn prepare_snapshot(
        &self,
        snapshotter: &str,
        key: &str,
        parent: &str,
    ) -> Result<Vec<Mount>, PullError> {
        self.c
            .prepare(snapshotter, key, parent, HashMap::new())
            .await
            .map_err(ctd("snapshot prepare"))
    }

    /// Remove snapshot `key`. Already gone counts as removed: once the container record is
    /// deleted nothing references the snapshot, and containerd's garbage collector may remove
    /// it before this call does.
    pub async fn remove_snapshot(&self, snapshotter: &str, key: &str) -> Result<(), PullError> {
        match SnapshotsClient::new(self.c.ch.clone())
            .remove(self.c.req(RemoveSnapshotRequest {
                snapshotter: snapshotter.to_string(),
                key: key.to_string(),
            }))
            .await
        {
            Ok(_) => Ok(()),
            Err(s) if s.code() == tonic::Code::NotFound => Ok(()),
            Err(s) => Err(ctd("snapshot remove")(s)),
        }
    }

    pub async fn create_container(&self, r: &ContainerRecord) -> Result<(), PullError> {
        let container = Container {
            id: r.id.clone(),
            labels: r.labels.clone(),
            image: r.image.clone(),
            runtime: Some(Runtime {
                name: r.runtime.clone(),
                options: None,
            }),
            spec: Some(r.spec.clone()),
            snapshotter: r.snapshotter.clone(),
            snapshot_key: r.id.clone(),
            ..Default::default()
        };
        ContainersClient::new(self.c.ch.clone())
            .create(self.c.req(CreateContainerRequest {
                container: Some(container),
            }))
            .await
            .map_err(ctd("container create"))?;
        Ok(())
    }

    pub async fn delete_container(&self, id: &str) -> Result<(), PullError> {
        ContainersClient::new(self.c.ch.clone())
            .delete(self.c.req(DeleteContainerRequest { id: id.to_string() }))
            .await
            .map_err(ctd("container delete"))?;
        Ok(())
    }

    /// Create the task (the shim and `runc create`); its pid.
    pub async fn create_task(
        &self,
        id: &str,
        rootfs: Vec<Mount>,
        io: &TaskStdio,
    ) -> Result<u32, PullError> {
        let r = TasksClient::new(self.c.ch.clone())
            .create(self.c.req(CreateTaskRequest {
                container_id: id.to_string(),
                rootfs,
                stdin: io.stdin.clone(),
                stdout: io.stdout.clone(),
                stderr: io.stderr.clone(),
                terminal: false,
                ..Default::default()
            }))
            .await
            .map_err(ctd("task create"))?;
        Ok(r.into_inner().pid)
    }

    pub async fn start_task(&self, id: &str) -> Result<u32, PullError> {
        self.start_process(id, "").await
    }

    /// `Tasks.Start` of the task (`exec_id` empty) or of one of its exec processes; its pid.
    pub async fn start_process(&self, id: &str, exec_id: &str) -> Result<u32, PullError> {
        let r = TasksClient::new(self.c.ch.clone())
            .start(self.c.req(StartRequest {
                container_id: id.to_string(),
                exec_id: exec_id.to_string(),
            }))
            .await
            .map_err(ctd("task start"))?;
        Ok(r.into_inner().pid)
    }

    /// Wait until the task exits; its exit status.
    pub async fn wait_task(&self, id: &str) -> Result<u32, PullError> {
        self.wait_process(id, "").await
    }

    /// Wait until the task (`exec_id` empty) or one of its exec processes exits; its exit
    /// status.
    pub async fn wait_process(&self, id: &str, exec_id: &str) -> Result<u32, PullError> {
        let r = TasksClient::new(self.c.ch.clone())
            .wait(self.c.req(WaitRequest {
                container_id: id.to_string(),
                exec_id: exec_id.to_string(),
            }))
            .await
            .map_err(ctd("task wait"))?;
        Ok(r.into_inner().exit_status)
    }

    pub async fn kill_task(&self, id: &str, signal: u32) -> Result<(), PullError> {
        self.kill_process(id, "", signal, false).await
    }

    /// Signal the task (`exec_id` empty; `all`: every process of the container) or one exec
    /// process.
    pub async fn kill_process(
        &self,
        id: &str,
        exec_id: &str,
        signal: u32,
        all: bool,
    ) -> Result<(), PullError> {
        TasksClient::new(self.c.ch.clone())
            .kill(self.c.req(KillRequest {
                container_id: id.to_string(),
                exec_id: exec_id.to_string(),
                signal,
                all,
            }))
            .await
            .map_err(ctd("task kill"))?;
        Ok(())
    }

    /// `Tasks.Exec`: an extra process `exec_id` in the running task (what `ctr task exec`
    /// does), from an OCI `Process` as an `Any`, with FIFO stdio; started by
    /// [`Lifecycle::start_process`].
    pub async fn exec_process(
        &self,
        id: &str,
        exec_id: &str,
        process: prost_types::Any,
        io: &TaskStdio,
    ) -> Result<(), PullError> {
        TasksClient::new(self.c.ch.clone())
            .exec(self.c.req(ExecProcessRequest {
                container_id: id.to_string(),
                exec_id: exec_id.to_string(),
                stdin: io.stdin.clone(),
                stdout: io.stdout.clone(),
                stderr: io.stderr.clone(),
                terminal: false,
                spec: Some(process),
            }))
            .await
            .map_err(ctd("task exec"))?;
        Ok(())
    }

    /// `Tasks.DeleteProcess`: forget an exited exec process.
    pub async fn delete_process(&self, id: &str, exec_id: &str) -> Result<(), PullError> {
        TasksClient::new(self.c.ch.clone())
            .delete_process(self.c.req(DeleteProcessRequest {
                container_id: id.to_string(),
                exec_id: exec_id.to_string(),
            }))
            .await
            .map_err(ctd("task delete process"))?;
        Ok(())
    }

    /// `Tasks.CloseIO` with `stdin`: the shim closes its own write end of the stdin FIFO (it
    /// holds one so the process does not see EOF between two writers), so the process reads
    /// EOF once what was written is drained — what `ctr run` does when its stdin ends.
    pub async fn close_stdin(&self, id: &str) -> Result<(), PullError> {
        self.close_process_stdin(id, "").await
    }

    /// [`Lifecycle::close_stdin`] of the task or of one exec process.
    pub async fn close_process_stdin(&self, id: &str, exec_id: &str) -> Result<(), PullError> {
        TasksClient::new(self.c.ch.clone())
            .close_io(self.c.req(CloseIoRequest {
                container_id: id.to_string(),
                exec_id: exec_id.to_string(),
                stdin: true,
            }))
            .await
            .map_err(ctd("task close stdin"))?;
        Ok(())
    }

    pub async fn delete_task(&self, id: &str) -> Result<(), PullError> {
        TasksClient::new(self.c.ch.clone())
            .delete(self.c.req(DeleteTaskRequest {
                container_id: id.to_string(),
            }))
            .await
            .map_err(ctd("task delete"))?;
        Ok(())
    }
}
