//! `containerd-shim-weenv-v1`: started by containerd (`--runtime io.containerd.weenv.v1`).
//! `containerd-shim-weenv-v1 status <namespace>/<id> [status-dir]` prints a container's
//! weenv status (state, quota, termination reason). `-info` answers containerd 2.x's question
//! what this runtime is and can do (`weenv_shim::info`).

use weenv_shim::service::{Service, RUNTIME_ID};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("status") {
        std::process::exit(weenv_shim::status::print_status(&args[2..]));
    }
    if args.iter().skip(1).any(|a| a == "-info" || a == "--info") {
        std::process::exit(weenv_shim::info::print_info());
    }
    containerd_shim::asynchronous::run::<Service>(RUNTIME_ID, None).await;
}
