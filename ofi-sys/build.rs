//! Generates the bindings with bindgen and compiles the C shims bindgen writes for libfabric's
//! `static inline` calls (fi_write, fi_cq_read, fi_mr_reg, ... are all inline in the headers).

use std::env;
use std::path::PathBuf;

use bindgen::callbacks::{IntKind, ParseCallbacks};

/// bindgen gives each macro the type of its value, so `FI_MSG | FI_RMA_EVENT` would not even
/// type-check. Flags and capability bits become u64; error numbers become i32.
#[derive(Debug)]
struct MacroTypes;

impl ParseCallbacks for MacroTypes {
    fn int_macro(&self, name: &str, _value: i64) -> Option<IntKind> {
        if name.starts_with("FI_E") && !name.starts_with("FI_EP_") && !name.starts_with("FI_EQ_") {
            Some(IntKind::I32)
        } else if name.starts_with("FI_") {
            Some(IntKind::U64)
        } else {
            None
        }
    }
}

fn main() {
    let lib = pkg_config::Config::new()
        .atleast_version("1.17")
        .probe("libfabric")
        .unwrap_or_else(|e| {
            panic!("libfabric >= 1.17 not found ({e}); install it: apt-get install libfabric-dev libclang-dev pkg-config")
        });
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
    let shims = out.join("ofi_shims");
    let mut builder = bindgen::Builder::default()
        .header("wrapper.h")
        .allowlist_function("fi_.*")
        .allowlist_type("fi_.*|fid.*")
        .allowlist_var("FI_.*")
        .prepend_enum_name(false)
        .wrap_static_fns(true)
        .wrap_static_fns_path(&shims)
        .parse_callbacks(Box::new(MacroTypes))
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .derive_default(true)
        .layout_tests(false);
    for inc in &lib.include_paths {
        builder = builder.clang_arg(format!("-I{}", inc.display()));
    }
    let bindings = builder
        .generate()
        .expect("bindgen failed on libfabric's headers");
    bindings
        .write_to_file(out.join("bindings.rs"))
        .expect("writing bindings");

    let mut build = cc::Build::new();
    build
        .file(shims.with_extension("c"))
        .include(env::current_dir().expect("cwd"));
    for inc in &lib.include_paths {
        build.include(inc);
    }
    // The generated file includes wrapper.h by its path relative to this directory.
    build
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-deprecated-declarations")
        .compile("ofi_shims");
    println!("cargo:rerun-if-changed=wrapper.h");
}
