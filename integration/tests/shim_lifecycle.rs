//! End-to-end: the weenv shim runs busybox containers under a private containerd:
//! output and exit code, exec, kill/delete cleanup, `ctr task ls`, stats, pause/resume.

mod shim_common;

use anyhow::Result;
use shim_common::{code, machine_cgroup_version, stdout, ShimEnv, RUNTIME};

#[test]
#[ignore = "needs root, containerd, runc, umoci"]
fn run_prints_and_propagates_exit_code() -> Result<()> {
    let env = ShimEnv::start("life-run")?;
    let o = env.run(
        "r1",
        &["--rm"],
        &["/bin/sh", "-c", "echo hello-from-weenv-shim; exit 3"],
    )?;
    assert_eq!(
        stdout(&o),
        "hello-from-weenv-shim\n",
        "stderr: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(code(&o), 3);
    let o = env.run("r2", &["--rm"], &["/bin/true"])?;
    assert_eq!(code(&o), 0);
    // stdin reaches the container (FIFO handed to runc) and its EOF ends `wc`
    let private = env.private_annotations();
    let mut c = env
        .ctd
        .ctr_command(
            env.ctd.namespace(),
            &[
                "run",
                "--rm",
                &format!("--runtime={RUNTIME}"),
                &private[0],
                &private[1],
                env.image,
                "r3",
                "wc",
                "-l",
            ],
        )
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    {
        use std::io::Write;
        let mut stdin = c.stdin.take().expect("piped stdin");
        stdin.write_all(b"a\nb\nc\n")?;
    }
    let c = c.wait_with_output()?;
    assert_eq!(String::from_utf8_lossy(&c.stdout).trim(), "3");
    assert_eq!(code(&c), 0);
    assert_eq!(env.status("r1")?["state"], "exited");
    assert_eq!(env.status("r1")?["exit_status"], 3);
    Ok(())
}

#[test]
#[ignore = "needs root, containerd, runc, umoci"]
fn exec_kill_delete_and_task_ls() -> Result<()> {
    let env = ShimEnv::start("life-exec")?;
    let o = env.run(
        "d1",
        &["-d", "--memory-limit=67108864", "--cpus=0.5"],
        &["/bin/sleep", "1000"],
    )?;
    assert_eq!(code(&o), 0, "{}", String::from_utf8_lossy(&o.stderr));
    let ls = env.ctd.ctr_ok(&["task", "ls"])?;
    assert!(
        ls.lines()
            .any(|l| l.starts_with("d1 ") && l.contains("RUNNING")),
        "{ls}"
    );
    // exec with its own stdio and exit code
    let o = env.ctd.ctr(&[
        "task",
        "exec",
        "--exec-id",
        "e1",
        "d1",
        "/bin/sh",
        "-c",
        "echo in-exec; exit 5",
    ])?;
    assert_eq!(stdout(&o), "in-exec\n");
    assert_eq!(code(&o), 5);
    let o = env.ctd.ctr(&[
        "task",
        "exec",
        "--exec-id",
        "e2",
        "d1",
        "/bin/cat",
        "/proc/1/cmdline",
    ])?;
    assert_eq!(stdout(&o), "/bin/sleep\u{0}1000\u{0}");
    // Short execs race their exit against the pid file read: none may hang or lose its code.
    for i in 0..10 {
        let id = format!("short{i}");
        let o = env.ctd.ctr(&[
            "task",
            "exec",
            "--exec-id",
            &id,
            "d1",
            "/bin/sh",
            "-c",
            &format!("exit {i}"),
        ])?;
        assert_eq!(
            code(&o),
            i,
            "exec {id}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let ps = env.ctd.ctr_ok(&["task", "ps", "d1"])?;
    assert_eq!(ps.lines().count(), 2, "one process after execs ended: {ps}");
    let m = env.ctd.ctr_ok(&["task", "metrics", "d1"])?;
    // ctr names the limit after the cgroup version's metrics type.
    let limit = match machine_cgroup_version() {
        "v1" => "memory.limit_in_bytes",
        _ => "memory.usage_limit",
    };
    assert!(
        m.lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == [limit, "67108864"]),
        "{m}"
    );
    env.ctd.ctr_ok(&["task", "pause", "d1"])?;
    assert!(env.ctd.ctr_ok(&["task", "ls"])?.contains("PAUSED"));
    env.ctd.ctr_ok(&["task", "resume", "d1"])?;
    // kill, then the task is STOPPED with 137 and delete cleans up
    env.ctd.ctr_ok(&["task", "kill", "-s", "SIGKILL", "d1"])?;
    let mut stopped = false;
    for _ in 0..100 {
        if env
            .ctd
            .ctr_ok(&["task", "ls"])?
            .lines()
            .any(|l| l.starts_with("d1 ") && l.contains("STOPPED"))
        {
            stopped = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(stopped, "task never reported STOPPED");
    let bundle = env.ctd.bundle(env.ctd.namespace(), "d1");
    let rootfs = bundle.join("rootfs");
    let rm = env.ctd.ctr(&["task", "rm", "d1"])?;
    assert_eq!(code(&rm), 0, "{}", String::from_utf8_lossy(&rm.stderr));
    env.ctd.ctr_ok(&["containers", "rm", "d1"])?;
    assert!(!env.ctd.ctr_ok(&["task", "ls"])?.contains("d1"));
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")?;
    assert!(
        !mounts.contains(&rootfs.display().to_string()),
        "rootfs still mounted"
    );
    let runc_state = std::path::Path::new("/run/containerd/runc")
        .join(env.ctd.namespace())
        .join("d1");
    assert!(!runc_state.exists(), "runc state left behind");
    assert_eq!(env.status("d1")?["exit_status"], 137);
    Ok(())
}

/// Runs `cmd` under `script` (a pty for ctr), feeding `input` lines after a delay.
fn with_pty(cmd: &str, input: &str) -> Result<(String, i32)> {
    let sh = format!(
        "(sleep 1.5; printf '{input}'; sleep 2) | script -qec \"$CMD\" /dev/null; echo \"rc=$?\""
    );
    let o = std::process::Command::new("timeout")
        .args(["60", "sh", "-c", &sh])
        .env("CMD", cmd)
        .output()?;
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let rc = out
        .lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix("rc=").and_then(|v| v.parse().ok()))
        .unwrap_or(-1);
    Ok((out, rc))
}

#[test]
#[ignore = "needs root, containerd, runc, umoci, script (util-linux)"]
fn tty_run_and_exec_with_resize() -> Result<()> {
    weenv_integration::util::require_bins(&["script", "timeout"])?;
    let env = ShimEnv::start("life-tty")?;
    let ctr = format!(
        "ctr -a {} -n {}",
        env.ctd.address().display(),
        env.ctd.namespace()
    );
    let (out, rc) = with_pty(
        &format!(
            "{ctr} run --rm -t --runtime {RUNTIME} {} {} t1 sh -c 'tty; read x; echo got-$x; exit 7'",
            env.private_annotations().join(" "),
            env.image
        ),
        "hello-in\\r",
    )?;
    assert!(out.contains("/dev/pts/"), "{out}");
    assert!(out.contains("got-hello-in"), "stdin through the pty: {out}");
    assert_eq!(rc, 7, "{out}");

    let o = env.run("t2", &["-d"], &["/bin/sleep", "1000"])?;
    assert_eq!(code(&o), 0);
    let (out, rc) = with_pty(
        &format!("stty cols 123 rows 45; {ctr} task exec -t --exec-id x1 t2 sh -c 'sleep 1; stty size; exit 9'"),
        "",
    )?;
    assert!(
        out.contains("45 123"),
        "resize_pty reached the exec's pty: {out}"
    );
    assert_eq!(rc, 9, "{out}");
    env.ctd.ctr_ok(&["task", "kill", "-s", "SIGKILL", "t2"])?;
    for _ in 0..50 {
        if env.ctd.ctr(&["task", "rm", "t2"])?.status.success() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    env.ctd.ctr_ok(&["containers", "rm", "t2"])?;
    Ok(())
}
