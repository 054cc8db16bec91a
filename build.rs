//! Finds libfabric, generates Rust bindings for it (static-inline functions included),
//! compiles the generated C wrappers, and checks the NCCL ABI header.
//!
//! libfabric is found with pkg-config (`libfabric` >= 1.17), or under `LIBFABRIC_DIR`
//! (a prefix holding `include/rdma/fabric.h` and `lib/libfabric.so`), which wins when set.

use std::env;
use std::path::{Path, PathBuf};
use std::process::exit;

const MIN_VERSION: &str = "1.17";

struct Libfabric {
    include_dirs: Vec<PathBuf>,
    lib_dirs: Vec<PathBuf>,
    /// Set when the library lives outside the linker's default path; baked in as rpath.
    rpath: Option<PathBuf>,
}

fn fail(message: &str) -> ! {
    eprintln!("error: {message}");
    exit(1);
}

fn find_libfabric() -> Libfabric {
    println!("cargo:rerun-if-env-changed=LIBFABRIC_DIR");
    if let Some(dir) = env::var_os("LIBFABRIC_DIR").filter(|d| !d.is_empty()) {
        let dir = PathBuf::from(dir);
        let include = dir.join("include");
        if !include.join("rdma/fabric.h").exists() {
            fail(&format!(
                "LIBFABRIC_DIR={} has no include/rdma/fabric.h: point it at a libfabric install prefix \
                 (scripts/build-libfabric.sh makes one)",
                dir.display()
            ));
        }
        let lib = ["lib", "lib64"]
            .iter()
            .map(|l| dir.join(l))
            .find(|l| l.join("libfabric.so").exists())
            .unwrap_or_else(|| {
                fail(&format!(
                    "LIBFABRIC_DIR={} has no lib/libfabric.so",
                    dir.display()
                ))
            });
        return Libfabric {
            include_dirs: vec![include],
            lib_dirs: vec![lib.clone()],
            rpath: Some(lib),
        };
    }
    match pkg_config::Config::new()
        .atleast_version(MIN_VERSION)
        .cargo_metadata(false)
        .probe("libfabric")
    {
        Ok(lib) => Libfabric {
            include_dirs: lib.include_paths,
            lib_dirs: lib.link_paths,
            rpath: None,
        },
        Err(e) => fail(&format!(
            "libfabric >= {MIN_VERSION} not found by pkg-config ({}): install it (Debian: apt-get install \
             libfabric-dev, or run scripts/setup-debian.sh) or set LIBFABRIC_DIR to an install prefix",
            e.to_string().lines().next().unwrap_or("")
        )),
    }
}

fn generate_bindings(fabric: &Libfabric, out: &Path) -> String {
    let wrappers = out.join("fabric_wrappers");
    let mut builder = bindgen::Builder::default()
        .header("include/fabric.h")
        .allowlist_function("fi_.*")
        .allowlist_type("fi_.*|fid.*")
        .allowlist_var("FI_.*")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        .layout_tests(false)
        .wrap_static_fns(true)
        .wrap_static_fns_path(&wrappers)
        .generate_comments(false);
    for dir in &fabric.include_dirs {
        builder = builder.clang_arg(format!("-I{}", dir.display()));
    }
    // bindgen panics when it cannot load libclang; turn that into one actionable line.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || builder.generate()));
    std::panic::set_hook(default_hook);
    let bindings = match result {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => fail(&format!(
            "bindgen could not parse the libfabric headers: {e}"
        )),
        Err(_) => fail(
            "libclang not found: install it (Debian: apt-get install libclang-dev, or run \
             scripts/setup-debian.sh) or set LIBCLANG_PATH",
        ),
    };
    let text = bindings.to_string();
    std::fs::write(out.join("fabric_bindings.rs"), &text)
        .unwrap_or_else(|e| fail(&format!("cannot write bindings: {e}")));

    let mut cc = cc::Build::new();
    cc.file(wrappers.with_extension("c"))
        .file("src/c/mr_reg.c")
        .include(env!("CARGO_MANIFEST_DIR"))
        .include("include")
        .warnings(false);
    for dir in &fabric.include_dirs {
        cc.include(dir);
    }
    cc.compile("fabric_wrappers");
    text
}

fn check_nccl_header(out: &Path) {
    // The header carries _Static_asserts on every size NCCL relies on; compiling it checks them.
    let check = out.join("nccl_net_check.c");
    std::fs::write(
        &check,
        "#include \"nccl_net.h\"\nint nccl_net_fabric_abi_checked;\n",
    )
    .unwrap_or_else(|e| fail(&format!("cannot write {}: {e}", check.display())));
    cc::Build::new()
        .file(&check)
        .include("include")
        .compile("nccl_net_check");
}

fn main() {
    println!("cargo:rerun-if-changed=include/fabric.h");
    println!("cargo:rerun-if-changed=include/nccl_net.h");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/c/mr_reg.c");
    println!("cargo::rustc-check-cfg=cfg(fi_has_cuda_api_permitted)");
    println!("cargo::rustc-check-cfg=cfg(fi_progress_in_union)");

    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let fabric = find_libfabric();
    let bindings = generate_bindings(&fabric, &out);
    if bindings.contains("FI_OPT_CUDA_API_PERMITTED") {
        println!("cargo:rustc-cfg=fi_has_cuda_api_permitted");
    }
    // libfabric 2.x keeps domain_attr's data_progress in a union with its new name,
    // `progress`.
    if bindings.contains("pub progress: fi_progress") {
        println!("cargo:rustc-cfg=fi_progress_in_union");
    }
    check_nccl_header(&out);

    for dir in &fabric.lib_dirs {
        println!("cargo:rustc-link-search=native={}", dir.display());
    }
    println!("cargo:rustc-link-lib=dylib=fabric");
    if let Some(rpath) = &fabric.rpath {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", rpath.display());
    }
    // NCCL finds an LD_PRELOADed plugin by its SONAME.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl-net.so");
    // NCCL dlcloses a plugin whose init failed, and (2.28+) after its last communicator.
    // Unmapping this library would unload libfabric under threads and handlers that providers
    // left behind (seen: a segfault right after a failed init under NCCL 2.28 with a CUDA
    // libfabric). Stay loaded; a later init finds the state of the first.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
}
