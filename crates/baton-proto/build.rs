//! Compiles the hand-written `.proto` files under `proto/` with `protox`
//! (a pure-Rust protobuf compiler, so no system `protoc` is needed) and
//! generates prost messages plus tonic clients/servers from the result.

use std::{env, error::Error, fs, path::PathBuf};

/// Every top-level proto file; imports are resolved relative to `proto/`.
const PROTOS: &[&str] = &[
    "mvccpb/kv.proto",
    "authpb/auth.proto",
    "etcdserverpb/rpc.proto",
    "v3lockpb/v3lock.proto",
    "v3electionpb/v3election.proto",
    "baton/v1/baton.proto",
    "baton/raft/v1/raft.proto",
];

fn main() -> Result<(), Box<dyn Error>> {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    let proto_dir = manifest_dir.join("proto");
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);

    println!("cargo:rerun-if-changed={}", proto_dir.display());
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={}", proto_dir.join(proto).display());
    }
    println!("cargo:rerun-if-changed=build.rs");

    let mut compiler = protox::Compiler::new([&proto_dir])?;
    compiler.include_imports(true);
    compiler.open_files(PROTOS)?;

    // Encoded via protox's reflection path so that custom options survive;
    // exposed as `FILE_DESCRIPTOR_SET` for gRPC reflection / gateways.
    fs::write(
        out_dir.join("baton_descriptor.bin"),
        compiler.encode_file_descriptor_set(),
    )?;

    // `codec::Codec`: prost's, but a txn nested in a txn is decoded level by level (prost's
    // recursion limit would refuse etcd's deepest txns).
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .codec_path("crate::codec::Codec")
        .compile_fds(compiler.file_descriptor_set())?;

    Ok(())
}
