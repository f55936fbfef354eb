//! Generates the server side of containerd's Snapshots gRPC service (tonic 0.14) from the
//! vendored `proto/` files. Message types are not generated: they are containerd-client's
//! (`extern_path`), so requests and responses are the very types the client side uses.
//! Needs `protoc` on PATH (or `PROTOC`), like containerd-client's own build script.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const SNAPSHOTS: &str =
        "proto/github.com/containerd/containerd/api/services/snapshots/v1/snapshots.proto";
    println!("cargo:rerun-if-changed=proto");
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(true)
        .extern_path(".containerd.types", "::containerd_client::types")
        .extern_path(
            ".containerd.services.snapshots.v1",
            "::containerd_client::services::v1::snapshots",
        )
        .compile_protos(&[SNAPSHOTS], &["proto"])?;
    Ok(())
}
