//! Generates the envd gRPC server (tonic 0.14) from `proto/weenv/envd/v1/envd.proto` (the
//! Python SDK's stubs come from the same file). Needs `protoc` on PATH (or `PROTOC`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_protos(&["proto/weenv/envd/v1/envd.proto"], &["proto"])?;
    Ok(())
}
