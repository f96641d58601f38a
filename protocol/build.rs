//! Compiles `proto/*.proto` with protox (pure Rust), so no system `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["proto/relay/v1/relay.proto"];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    // `prost::Name` on every message: its `relay.v1.<Message>` is the `Relay-Type` header
    // (`bus::type_name`).
    prost_build::Config::new()
        .enable_type_names()
        .compile_fds(fds)?;
    Ok(())
}
