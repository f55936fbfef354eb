//! `impl Task for TaskService`: the ttrpc task API methods. Each decodes the request,
//! works on the shared state in `super`; failures are [`ShimError`]s, turned into ttrpc
//! statuses by `?` through the one mapping in `crate::error`.

use super::*;
use crate::stats::metrics_any;
use containerd_shim::protos::shim::shim::CheckpointTaskRequest;

impl State {
    /// The container `id`, or [`ShimError::ContainerNotFound`].
    fn container(&self, id: &str) -> Result<&Container, ShimError> {
        self.containers
            .get(id)
            .ok_or_else(|| ShimError::ContainerNotFound(id.to_string()))
    }

    /// The container `id` for changing, or [`ShimError::ContainerNotFound`].
    fn container_mut(&mut self, id: &str) -> Result<&mut Container, ShimError> {
        self.containers
            .get_mut(id)
            .ok_or_else(|| ShimError::ContainerNotFound(id.to_string()))
    }
}

impl Container {
    /// The init process for an empty `exec_id`, else that exec, or
    /// [`ShimError::ExecNotFound`].
    fn process(&self, exec_id: &str) -> Result<&Process, ShimError> {
        if exec_id.is_empty() {
            return Ok(&self.init);
        }
        self.exec(exec_id)
    }

    /// [`Container::process`] for changing.
    fn process_mut(&mut self, exec_id: &str) -> Result<&mut Process, ShimError> {
        if exec_id.is_empty() {
            return Ok(&mut self.init);
        }
        self.execs
            .get_mut(exec_id)
            .ok_or_else(|| ShimError::ExecNotFound(exec_id.to_string()))
    }

    /// The exec `exec_id` (never the init process), or [`ShimError::ExecNotFound`].
    fn exec(&self, exec_id: &str) -> Result<&Process, ShimError> {
        self.execs
            .get(exec_id)
            .ok_or_else(|| ShimError::ExecNotFound(exec_id.to_string()))
    }
}

/// Maps a failed runc `op` to [`ShimError::Runc`], with the reason from the bundle's runc log.
fn runc_err<'a>(
    op: &'static str,
    bundle: &'a Path,
) -> impl FnOnce(runc::error::Error) -> ShimError + 'a {
    move |e| ShimError::runc(op, bundle, &e)
}

#[async_trait]
impl Task for TaskService {
    async fn create(
        &self,
        _ctx: &TtrpcContext,
        req: CreateTaskRequest,
    ) -> TtrpcResult<CreateTaskResponse> {
        info!(id = %req.id, bundle = %req.bundle, "create");
        self.create_inner(&req).await.map_err(|e| {
            error!(id = %req.id, error = %e, "create failed");
            e.into()
        })
    }

    async fn start(&self, _ctx: &TtrpcContext, req: StartRequest) -> TtrpcResult<StartResponse> {
        let mut st = self.inner.state.lock().await;
        let c = st.container_mut(&req.id)?;
        let runc = c.runc.clone();
        if req.exec_id.is_empty() {
            runc.start(&req.id)
                .await
                .map_err(runc_err("start", &c.bundle))?;
            if c.init.exit.is_none() {
                c.init.status = TaskStatus::RUNNING;
            }
            c.status.state = "running".into();
            let _ = c.status_dir.write(&c.status);
            if let Some(m) = c.monitor.clone() {
                let (tx, rx) = watch::channel(false);
                c.stop_monitor = Some(tx);
                let iv = Duration::from_millis(c.cfg.monitor.interval_ms);
                self.spawn_monitor(req.id.clone(), m, iv, rx);
            }
            let pid = c.init.pid as u32;
            self.publish(
                topics::TASK_START_EVENT_TOPIC,
                Box::new(TaskStart {
                    container_id: req.id.clone(),
                    pid,
                    ..Default::default()
                }),
            );
            return Ok(StartResponse {
                pid,
                ..Default::default()
            });
        }
        let bundle = c.bundle.clone();
        let p = c.exec(&req.exec_id)?;
        let spec: oci_spec::runtime::Process =
            serde_json::from_slice(p.spec.as_deref().unwrap_or_default()).map_err(|source| {
                ShimError::BadRequest {
                    what: "exec process spec",
                    source,
                }
            })?;
        let pid_file = bundle.join(format!("{}.pid", req.exec_id));
        let mut opts = ExecOpts::new().pid_file(&pid_file).detach(true);
        let mut tty = Process::new("", &p.stdin, &p.stdout, &p.stderr, p.terminal);
        let console = if p.terminal {
            let sock = ConsoleSocket::new().map_err(ShimError::io("console socket"))?;
            opts = opts
                .console_socket(sock.path())
                .io(Arc::new(FifoIo::default()));
            Some(tokio::spawn(sock.receive(CONSOLE_TIMEOUT)))
        } else {
            opts = opts.io(Arc::new(p.stdio.clone()));
            None
        };
        drop(st);
        if let Err(e) = runc.exec(&req.id, &spec, Some(&opts)).await {
            if let Some(c) = console {
                c.abort();
            }
            return Err(ShimError::runc("exec", &bundle, &e).into());
        }
        if let Some(c) = console {
            attach_console(&mut tty, c).await?;
        }
        let pid = read_pid_from_file(&pid_file)
            .await
            .map_err(ShimError::shim(format!("read {}", pid_file.display())))?;
        let mut st = self.inner.state.lock().await;
        let early = st.early.take(pid);
        let c = st.container_mut(&req.id)?;
        let p = c.process_mut(&req.exec_id)?;
        p.pid = pid;
        p.status = TaskStatus::RUNNING;
        p.console = tty.console.take();
        p.stdin_closer = tty.stdin_closer.take();
        self.publish(
            topics::TASK_EXEC_STARTED_EVENT_TOPIC,
            Box::new(TaskExecStarted {
                container_id: req.id.clone(),
                exec_id: req.exec_id.clone(),
                pid: pid as u32,
                ..Default::default()
            }),
        );
        if let Some(code) = early {
            p.set_exited(code as u32, timestamp().unwrap_or_default());
        }
        Ok(StartResponse {
            pid: pid as u32,
            ..Default::default()
        })
    }

    async fn state(&self, _ctx: &TtrpcContext, req: StateRequest) -> TtrpcResult<StateResponse> {
        let st = self.inner.state.lock().await;
        let c = st.container(&req.id)?;
        let p = c.process(&req.exec_id)?;
        let mut r = StateResponse {
            id: if req.exec_id.is_empty() {
                req.id.clone()
            } else {
                req.exec_id.clone()
            },
            bundle: c.bundle.display().to_string(),
            pid: p.pid.max(0) as u32,
            stdin: p.stdin.clone(),
            stdout: p.stdout.clone(),
            stderr: p.stderr.clone(),
            terminal: p.terminal,
            exec_id: req.exec_id.clone(),
            ..Default::default()
        };
        r.status = Self::status_of(p).into();
        if let Some(e) = &p.exit {
            r.exit_status = e.status;
            r.exited_at = Some(e.at.clone()).into();
        }
        Ok(r)
    }

    async fn wait(&self, _ctx: &TtrpcContext, req: WaitRequest) -> TtrpcResult<WaitResponse> {
        let rx = {
            let st = self.inner.state.lock().await;
            let c = st.container(&req.id)?;
            let p = c.process(&req.exec_id)?;
            p.subscribe()
        };
        let e = wait_exit(rx).await.ok_or(ShimError::ExitLost)?;
        Ok(WaitResponse {
            exit_status: e.status,
            exited_at: Some(e.at).into(),
            ..Default::default()
        })
    }

    async fn kill(&self, _ctx: &TtrpcContext, req: KillRequest) -> TtrpcResult<Empty> {
        let st = self.inner.state.lock().await;
        let c = st.container(&req.id)?;
        if req.exec_id.is_empty() {
            if c.init.exit.is_some() {
                return Err(ShimError::ProcessFinished.into());
            }
            let runc = c.runc.clone();
            let bundle = c.bundle.clone();
            drop(st);
            runc.kill(&req.id, req.signal, Some(&KillOpts { all: req.all }))
                .await
                .map_err(runc_err("kill", &bundle))?;
            return Ok(Empty::new());
        }
        let p = c.exec(&req.exec_id)?;
        if p.exit.is_some() || p.pid <= 0 {
            return Err(ShimError::ProcessFinished.into());
        }
        // Raw kill(2): nix's `kill` takes its `Signal` enum, which has no real-time signals
        // (SIGRTMIN+n), and containerd forwards any signal number.
        // SAFETY: kill(2) on a pid of a live exec process we started; no memory passed.
        let rc = unsafe { libc::kill(p.pid, req.signal as i32) };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            return Err(ShimError::io(format!("kill exec {}", req.exec_id))(e).into());
        }
        Ok(Empty::new())
    }

    async fn delete(&self, _ctx: &TtrpcContext, req: DeleteRequest) -> TtrpcResult<DeleteResponse> {
        let mut st = self.inner.state.lock().await;
        if !req.exec_id.is_empty() {
            let c = st.container_mut(&req.id)?;
            let p = c
                .execs
                .remove(&req.exec_id)
                .ok_or_else(|| ShimError::ExecNotFound(req.exec_id.clone()))?;
            let e = p.exit.clone().unwrap_or(crate::process::Exit {
                status: 0,
                at: timestamp().unwrap_or_default(),
            });
            return Ok(DeleteResponse {
                pid: p.pid.max(0) as u32,
                exit_status: e.status,
                exited_at: Some(e.at).into(),
                ..Default::default()
            });
        }
        let c = st
            .containers
            .remove(&req.id)
            .ok_or_else(|| ShimError::ContainerNotFound(req.id.clone()))?;
        drop(st);
        if let Err(e) = c
            .runc
            .delete(&req.id, Some(&DeleteOpts { force: true }))
            .await
        {
            warn!(id = %req.id, error = %describe("delete", &c.bundle, &e), "runc delete");
        }
        let rootfs = c.bundle.join("rootfs");
        if let Err(e) = containerd_shim::mount::umount_recursive(rootfs.to_str(), 0) {
            warn!(id = %req.id, error = %e, "unmount rootfs");
        }
        if let Some(s) = &c.stop_monitor {
            let _ = s.send(true);
        }
        if let Some(m) = &c.monitor {
            if let Ok(m) = m.lock() {
                m.release();
            }
        }
        let e = c.init.exit.clone().unwrap_or(crate::process::Exit {
            status: 137,
            at: timestamp().unwrap_or_default(),
        });
        self.publish(
            topics::TASK_DELETE_EVENT_TOPIC,
            Box::new(TaskDelete {
                container_id: req.id.clone(),
                id: req.id.clone(),
                pid: c.init.pid as u32,
                exit_status: e.status,
                exited_at: Some(e.at.clone()).into(),
                ..Default::default()
            }),
        );
        Ok(DeleteResponse {
            pid: c.init.pid as u32,
            exit_status: e.status,
            exited_at: Some(e.at).into(),
            ..Default::default()
        })
    }

    async fn pids(&self, _ctx: &TtrpcContext, req: PidsRequest) -> TtrpcResult<PidsResponse> {
        let (runc, bundle) = {
            let st = self.inner.state.lock().await;
            let c = st.container(&req.id)?;
            (c.runc.clone(), c.bundle.clone())
        };
        let pids = runc.ps(&req.id).await.map_err(runc_err("ps", &bundle))?;
        let processes = pids
            .into_iter()
            .map(|pid| containerd_shim::protos::types::task::ProcessInfo {
                pid: pid as u32,
                ..Default::default()
            })
            .collect();
        Ok(PidsResponse {
            processes,
            ..Default::default()
        })
    }

    async fn pause(&self, _ctx: &TtrpcContext, req: PauseRequest) -> TtrpcResult<Empty> {
        let mut st = self.inner.state.lock().await;
        let c = st.container_mut(&req.id)?;
        c.runc
            .pause(&req.id)
            .await
            .map_err(runc_err("pause", &c.bundle))?;
        c.init.status = TaskStatus::PAUSED;
        self.publish(
            topics::TASK_PAUSED_EVENT_TOPIC,
            Box::new(TaskPaused {
                container_id: req.id.clone(),
                ..Default::default()
            }),
        );
        Ok(Empty::new())
    }

    async fn resume(&self, _ctx: &TtrpcContext, req: ResumeRequest) -> TtrpcResult<Empty> {
        let mut st = self.inner.state.lock().await;
        let c = st.container_mut(&req.id)?;
        c.runc
            .resume(&req.id)
            .await
            .map_err(runc_err("resume", &c.bundle))?;
        c.init.status = TaskStatus::RUNNING;
        self.publish(
            topics::TASK_RESUMED_EVENT_TOPIC,
            Box::new(TaskResumed {
                container_id: req.id.clone(),
                ..Default::default()
            }),
        );
        Ok(Empty::new())
    }

    async fn exec(&self, _ctx: &TtrpcContext, req: ExecProcessRequest) -> TtrpcResult<Empty> {
        let mut st = self.inner.state.lock().await;
        let c = st.container_mut(&req.id)?;
        if c.execs.contains_key(&req.exec_id) {
            return Err(ShimError::ExecExists(req.exec_id.clone()).into());
        }
        let mut p = Process::new(
            &req.exec_id,
            &req.stdin,
            &req.stdout,
            &req.stderr,
            req.terminal,
        );
        if !req.terminal {
            p.open_logs(&req.id, &self.inner.namespace)
                .map_err(ShimError::from)?;
        }
        p.spec = Some(
            req.spec
                .as_ref()
                .map(|a| a.value.clone())
                .unwrap_or_default(),
        );
        c.execs.insert(req.exec_id.clone(), p);
        self.publish(
            topics::TASK_EXEC_ADDED_EVENT_TOPIC,
            Box::new(TaskExecAdded {
                container_id: req.id.clone(),
                exec_id: req.exec_id.clone(),
                ..Default::default()
            }),
        );
        Ok(Empty::new())
    }

    async fn checkpoint(
        &self,
        _ctx: &TtrpcContext,
        _req: CheckpointTaskRequest,
    ) -> TtrpcResult<Empty> {
        Err(ShimError::Unsupported("checkpoint/restore").into())
    }

    async fn resize_pty(&self, _ctx: &TtrpcContext, req: ResizePtyRequest) -> TtrpcResult<Empty> {
        let st = self.inner.state.lock().await;
        let c = st.container(&req.id)?;
        let p = c.process(&req.exec_id)?;
        let master = p.console.as_ref().ok_or(ShimError::NoTty)?;
        resize(master, req.width, req.height).map_err(ShimError::io("resize pty"))?;
        Ok(Empty::new())
    }

    async fn close_io(&self, _ctx: &TtrpcContext, req: CloseIORequest) -> TtrpcResult<Empty> {
        // Without a TTY the container reads containerd's stdin FIFO directly and sees EOF
        // when containerd closes it. With a TTY the shim copies stdin and holds a writer
        // on the FIFO: drop it so the copy loop sees EOF.
        let mut st = self.inner.state.lock().await;
        let c = st.container_mut(&req.id)?;
        let p = c.process_mut(&req.exec_id)?;
        if req.stdin {
            p.stdin_closer = None;
        }
        Ok(Empty::new())
    }

    async fn update(&self, _ctx: &TtrpcContext, req: UpdateTaskRequest) -> TtrpcResult<Empty> {
        let raw = req
            .resources
            .as_ref()
            .map(|a| a.value.clone())
            .unwrap_or_default();
        let res: oci_spec::runtime::LinuxResources =
            serde_json::from_slice(&raw).map_err(|source| ShimError::BadRequest {
                what: "update resources",
                source,
            })?;
        let st = self.inner.state.lock().await;
        let c = st.container(&req.id)?;
        c.runc
            .update(&req.id, &res)
            .await
            .map_err(runc_err("update", &c.bundle))?;
        if let Some(m) = &c.monitor {
            if let Ok(mut m) = m.lock() {
                if let Err(e) = m.rebase(self.inner.clock.elapsed()) {
                    warn!(id = %req.id, error = %e, "rebase elastic quota after update");
                }
            }
        }
        Ok(Empty::new())
    }

    async fn stats(&self, _ctx: &TtrpcContext, req: StatsRequest) -> TtrpcResult<StatsResponse> {
        let st = self.inner.state.lock().await;
        let c = st.container(&req.id)?;
        let m = c.monitor.as_ref().ok_or(ShimError::NoCgroup)?;
        let m = m.lock().map_err(|_| ShimError::Poisoned)?;
        let any = metrics_any(m.io()).map_err(ShimError::Stats)?;
        Ok(StatsResponse {
            stats: Some(any).into(),
            ..Default::default()
        })
    }

    async fn connect(
        &self,
        _ctx: &TtrpcContext,
        req: ConnectRequest,
    ) -> TtrpcResult<ConnectResponse> {
        let st = self.inner.state.lock().await;
        let pid = st.containers.get(&req.id).map(|c| c.init.pid).unwrap_or(0);
        Ok(ConnectResponse {
            shim_pid: std::process::id(),
            task_pid: pid.max(0) as u32,
            version: "weenv-v1".into(),
            ..Default::default()
        })
    }

    async fn shutdown(&self, _ctx: &TtrpcContext, _req: ShutdownRequest) -> TtrpcResult<Empty> {
        let st = self.inner.state.lock().await;
        if st.containers.is_empty() {
            self.inner.exit.signal();
        }
        Ok(Empty::new())
    }
}
