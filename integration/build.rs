//! Generates a tonic 0.14 client for the CRI subset in `proto/runtime/v1/api.proto` (the
//! kubelet's side of `runtime.v1`), used by the CRI end-to-end test. Needs `protoc` on PATH
//! (or `PROTOC`), like the snapshotter's build script.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .compile_protos(&["proto/runtime/v1/api.proto"], &["proto"])?;
    Ok(())
}
