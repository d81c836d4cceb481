//! Compiles `holdfast/v1/holdfast.proto` with protox (pure Rust; no protoc needed) and
//! writes the encoded file descriptor set (with imports) for server reflection.

use std::path::PathBuf;

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "holdfast/v1/holdfast.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::Compiler::new(["."])?
        .include_imports(true)
        .include_source_info(true)
        .open_files([proto])?
        .file_descriptor_set();
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("holdfast_descriptor.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Debug for Certificate is hand-written (src/certificate.rs): never the key.
        .skip_debug([".holdfast.v1.Certificate"])
        // Hand-written (see src/wire.rs) so snapshot bytes are shared across streams.
        .extern_path(
            ".holdfast.v1.DiscoveryResponse",
            "crate::wire::DiscoveryResponse",
        )
        .compile_fds(fds)?;
    Ok(())
}
