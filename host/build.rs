//! Compiles the host's NCCL-style logger (variadic, so C) against the plugin's header.

fn main() {
    println!("cargo:rerun-if-changed=src/host_logger.c");
    println!("cargo:rerun-if-changed=../include/nccl_net.h");
    cc::Build::new()
        .file("src/host_logger.c")
        .include("../include")
        .compile("nccl_net_host_logger");
}
