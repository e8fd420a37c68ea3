//! The hand-written layout of `pmix-sys` against the installed OpenPMIx headers (libpmix-dev):
//! a C program prints every size, offset and constant the crate spells out, and each must be
//! the crate's. Without the headers (no `pkg-config pmix`) it says NOT TESTED; `.ci/run`
//! installs libpmix-dev in its second phase and runs it there.

use std::process::Command;

const PROBE: &str = r#"
#include <stdio.h>
#include <stddef.h>
#include <pmix_server.h>
#include <pmix.h>
int main(void) {
    printf("info %zu\nproc %zu\nproc.rank %zu\nmodule %zu\ndarray %zu\ndarray.size %zu\ndarray.array %zu\n",
           sizeof(pmix_info_t), sizeof(pmix_proc_t), offsetof(pmix_proc_t, rank),
           sizeof(pmix_server_module_t), sizeof(pmix_data_array_t),
           offsetof(pmix_data_array_t, size), offsetof(pmix_data_array_t, array));
    printf("fence_nb %zu\nabort %zu\ndirect_modex %zu\n",
           offsetof(pmix_server_module_t, fence_nb), offsetof(pmix_server_module_t, abort),
           offsetof(pmix_server_module_t, direct_modex));
    printf("BOOL %d\nSTRING %d\nUINT16 %d\nUINT32 %d\nINFO %d\nDATA_ARRAY %d\nPROC_RANK %d\n",
           PMIX_BOOL, PMIX_STRING, PMIX_UINT16, PMIX_UINT32, PMIX_INFO, PMIX_DATA_ARRAY, PMIX_PROC_RANK);
    printf("INT %d\nPROC %d\nRANGE_NAMESPACE %d\n", PMIX_INT, PMIX_PROC, PMIX_RANGE_NAMESPACE);
    printf("REQUESTED_ABORT %d\nTERM_WO_SYNC %d\nABORTED_BY_SIG %d\nEXIT_NONZERO %d\n",
           PMIX_ERR_PROC_REQUESTED_ABORT, PMIX_ERR_PROC_TERM_WO_SYNC, PMIX_ERR_PROC_ABORTED_BY_SIG,
           PMIX_ERR_EXIT_NONZERO_TERM);
    printf("key2 %s %s\n", PMIX_EVENT_AFFECTED_PROC, PMIX_EXIT_CODE);
    printf("SUCCESS %d\nERR_NOT_FOUND %d\nERR_NOT_SUPPORTED %d\nRANK_WILDCARD %u\n",
           PMIX_SUCCESS, PMIX_ERR_NOT_FOUND, PMIX_ERR_NOT_SUPPORTED, PMIX_RANK_WILDCARD);
    printf("key %s %s %s %s %s %s %s %s %s %s %s %s %s %s %s %s %s %s %s %s %s %s\n",
           PMIX_UNIV_SIZE, PMIX_JOB_SIZE, PMIX_MAX_PROCS, PMIX_APPNUM, PMIX_APP_SIZE,
           PMIX_LOCAL_SIZE, PMIX_NODE_SIZE, PMIX_NUM_NODES, PMIX_LOCAL_PEERS, PMIX_LOCAL_RANK,
           PMIX_NODE_RANK, PMIX_RANK, PMIX_NODEID, PMIX_HOSTNAME, PMIX_PROC_DATA, PMIX_NODE_MAP,
           PMIX_PROC_MAP, PMIX_SERVER_TMPDIR, PMIX_SYSTEM_TMPDIR, PMIX_SOCKET_MODE,
           PMIX_SERVER_NSPACE, PMIX_SERVER_RANK);
    return 0;
}
"#;

#[test]
fn the_crates_layout_is_the_installed_libpmix_headers() {
    let Ok(flags) = Command::new("pkg-config")
        .args(["--cflags", "--libs", "pmix"])
        .output()
    else {
        eprintln!(
            "NOT TESTED: pkg-config is not installed (apt-get install pkg-config libpmix-dev)"
        );
        return;
    };
    if !flags.status.success() {
        eprintln!("NOT TESTED: no libpmix headers (apt-get install libpmix-dev)");
        return;
    }
    let dir = tempfile_dir();
    let src = dir.join("probe.c");
    std::fs::write(&src, PROBE).unwrap();
    let exe = dir.join("probe");
    let flags = String::from_utf8(flags.stdout).unwrap();
    let built = Command::new("cc")
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .args(flags.split_whitespace())
        .output()
        .expect("cc");
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let out = Command::new(&exe).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let value = |name: &str| -> String {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name} not printed: {text}"))
            .to_string()
    };
    let num = |name: &str| value(name).parse::<i64>().unwrap();
    use pmix_sys::*;
    assert_eq!(num("info"), PMIX_INFO_BYTES as i64);
    assert_eq!(num("info"), std::mem::size_of::<pmix_info_t>() as i64);
    assert_eq!(num("proc"), std::mem::size_of::<pmix_proc_t>() as i64);
    assert_eq!(
        num("proc.rank"),
        std::mem::offset_of!(pmix_proc_t, rank) as i64
    );
    assert_eq!(
        num("module"),
        std::mem::size_of::<pmix_server_module_t>() as i64
    );
    assert_eq!(
        num("fence_nb"),
        std::mem::offset_of!(pmix_server_module_t, fence_nb) as i64
    );
    assert_eq!(
        num("abort"),
        std::mem::offset_of!(pmix_server_module_t, abort) as i64
    );
    assert_eq!(
        num("direct_modex"),
        std::mem::offset_of!(pmix_server_module_t, direct_modex) as i64
    );
    assert_eq!(
        num("darray"),
        std::mem::size_of::<pmix_data_array_t>() as i64
    );
    assert_eq!(
        num("darray.size"),
        std::mem::offset_of!(pmix_data_array_t, size) as i64
    );
    assert_eq!(
        num("darray.array"),
        std::mem::offset_of!(pmix_data_array_t, array) as i64
    );
    for (name, ours) in [
        ("BOOL", PMIX_BOOL),
        ("STRING", PMIX_STRING),
        ("UINT16", PMIX_UINT16),
        ("UINT32", PMIX_UINT32),
        ("INFO", PMIX_INFO),
        ("DATA_ARRAY", PMIX_DATA_ARRAY),
        ("PROC_RANK", PMIX_PROC_RANK),
        ("INT", PMIX_INT),
        ("PROC", PMIX_PROC),
    ] {
        assert_eq!(num(name), ours as i64, "{name}");
    }
    assert_eq!(num("RANGE_NAMESPACE"), PMIX_RANGE_NAMESPACE as i64);
    for (name, ours) in [
        ("REQUESTED_ABORT", PMIX_ERR_PROC_REQUESTED_ABORT),
        ("TERM_WO_SYNC", PMIX_ERR_PROC_TERM_WO_SYNC),
        ("ABORTED_BY_SIG", PMIX_ERR_PROC_ABORTED_BY_SIG),
        ("EXIT_NONZERO", PMIX_ERR_EXIT_NONZERO_TERM),
    ] {
        assert_eq!(num(name), ours as i64, "{name}");
    }
    assert_eq!(
        value("key2"),
        format!(
            "{} {}",
            keys::EVENT_AFFECTED_PROC.to_string_lossy(),
            keys::EXIT_CODE.to_string_lossy()
        )
    );
    assert_eq!(num("SUCCESS"), PMIX_SUCCESS as i64);
    assert_eq!(num("ERR_NOT_FOUND"), PMIX_ERR_NOT_FOUND as i64);
    assert_eq!(num("ERR_NOT_SUPPORTED"), PMIX_ERR_NOT_SUPPORTED as i64);
    assert_eq!(num("RANK_WILDCARD"), PMIX_RANK_WILDCARD as i64);
    let theirs: Vec<String> = value("key").split(' ').map(str::to_string).collect();
    let ours: Vec<String> = [
        keys::UNIV_SIZE,
        keys::JOB_SIZE,
        keys::MAX_PROCS,
        keys::APPNUM,
        keys::APP_SIZE,
        keys::LOCAL_SIZE,
        keys::NODE_SIZE,
        keys::NUM_NODES,
        keys::LOCAL_PEERS,
        keys::LOCAL_RANK,
        keys::NODE_RANK,
        keys::RANK,
        keys::NODEID,
        keys::HOSTNAME,
        keys::PROC_DATA,
        keys::NODE_MAP,
        keys::PROC_MAP,
        keys::SERVER_TMPDIR,
        keys::SYSTEM_TMPDIR,
        keys::SOCKET_MODE,
        keys::SERVER_NSPACE,
        keys::SERVER_RANK,
    ]
    .iter()
    .map(|k| k.to_string_lossy().into_owned())
    .collect();
    assert_eq!(theirs, ours);
}

/// A fresh directory under the target's temporary space.
fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("pmix-sys-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
