//! Generate the gRPC code. madsim-tonic-build writes both the real tonic code
//! and the simulated one; `tonic::include_proto!` picks by `cfg(madsim)`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var_os("PROTOC").is_none() {
        // No system protoc needed: use the vendored binary.
        std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?);
    }
    let descriptors = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("keel_descriptor.bin");
    tonic_build::configure()
        .build_server(true)
        .build_client(true)
        // A HashMap's first RandomState on a thread draws from madsim's RNG
        // inside a simulation, so a seed would replay differently after
        // another seed ran on the same thread: every map field is a BTreeMap.
        .btree_map(["."])
        .file_descriptor_set_path(&descriptors)
        .compile_protos(&["proto/raft.proto", "proto/keel.proto"], &["proto"])?;
    // serde for the public API, in the proto3 JSON mapping, with the field
    // names of the .proto files and every field present.
    let descriptor_set = std::fs::read(&descriptors)?;
    pbjson_build::Builder::new()
        .register_descriptors(&descriptor_set)?
        .preserve_proto_field_names()
        .emit_fields()
        .btree_map(["."])
        .build(&[".keel.v1"])?;
    Ok(())
}
