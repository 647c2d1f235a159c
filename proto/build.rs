//! Generate the gRPC code. madsim-tonic-build writes both the real tonic code
//! and the simulated one; `tonic::include_proto!` picks by `cfg(madsim)`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var_os("PROTOC").is_none() {
        // No system protoc needed: use the vendored binary.
        std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?);
    }
    tonic_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_protos(&["proto/raft.proto", "proto/keel.proto"], &["proto"])?;
    Ok(())
}
