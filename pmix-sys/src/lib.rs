//! # pmix-sys
//!
//! The OpenPMIx server library (`libpmix.so.2`, PMIx 4.2 and later), opened with `dlopen` the
//! first time a node manager serves PMIx, as `ofi-sys` opens libfabric: storm builds with Rust
//! alone, and a node without libpmix serves PMI-1 and PMI-2 as before.
//!
//! Only what a host resource manager's server needs is here, written by hand from
//! `pmix_common.h` and `pmix_server.h` of OpenPMIx 4.2: the process name ([`pmix_proc_t`]),
//! the module of host callbacks ([`pmix_server_module_t`]), opaque `pmix_info_t` arrays built
//! through the library's own list calls (so the value union's layout is never written here),
//! the constants used, and the exports ([`Pmix`]). `tests/layout.rs` compiles a C program
//! against the installed headers, where there are, and checks every size, offset and
//! constant against these.

#![allow(non_camel_case_types)]

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::OnceLock;

/// `pmix_status_t`.
pub type pmix_status_t = c_int;
/// `pmix_rank_t`.
pub type pmix_rank_t = u32;
/// `pmix_data_type_t`.
pub type pmix_data_type_t = u16;

/// `PMIX_MAX_NSLEN + 1`: a namespace's bytes, its terminating zero included.
pub const PMIX_NSPACE_BYTES: usize = 256;
/// `sizeof(pmix_info_t)` in PMIx 4.2.
pub const PMIX_INFO_BYTES: usize = 552;

pub const PMIX_SUCCESS: pmix_status_t = 0;
pub const PMIX_ERROR: pmix_status_t = -1;
pub const PMIX_ERR_NOT_FOUND: pmix_status_t = -46;
pub const PMIX_ERR_NOT_SUPPORTED: pmix_status_t = -47;
pub const PMIX_RANK_WILDCARD: pmix_rank_t = u32::MAX - 1;

/// Events of a process's end (`pmix_common.h`, "process-related events"), which a host
/// server raises for its clients with [`Pmix::notify_event`].
pub const PMIX_ERR_PROC_REQUESTED_ABORT: pmix_status_t = -8;
pub const PMIX_ERR_PROC_TERM_WO_SYNC: pmix_status_t = -200;
pub const PMIX_ERR_PROC_ABORTED_BY_SIG: pmix_status_t = -402;
pub const PMIX_ERR_EXIT_NONZERO_TERM: pmix_status_t = -404;

/// `pmix_data_range_t`.
pub type pmix_data_range_t = u8;
/// The processes of the source's namespace only.
pub const PMIX_RANGE_NAMESPACE: pmix_data_range_t = 3;

pub const PMIX_BOOL: pmix_data_type_t = 1;
pub const PMIX_INT: pmix_data_type_t = 6;
pub const PMIX_STRING: pmix_data_type_t = 3;
pub const PMIX_UINT16: pmix_data_type_t = 13;
pub const PMIX_UINT32: pmix_data_type_t = 14;
pub const PMIX_INFO: pmix_data_type_t = 24;
pub const PMIX_DATA_ARRAY: pmix_data_type_t = 39;
pub const PMIX_PROC: pmix_data_type_t = 22;
pub const PMIX_PROC_RANK: pmix_data_type_t = 40;

/// Keys (`pmix_common.h`).
pub mod keys {
    pub const UNIV_SIZE: &std::ffi::CStr = c"pmix.univ.size";
    pub const JOB_SIZE: &std::ffi::CStr = c"pmix.job.size";
    pub const MAX_PROCS: &std::ffi::CStr = c"pmix.max.size";
    pub const APPNUM: &std::ffi::CStr = c"pmix.appnum";
    pub const APP_SIZE: &std::ffi::CStr = c"pmix.app.size";
    pub const LOCAL_SIZE: &std::ffi::CStr = c"pmix.local.size";
    pub const NODE_SIZE: &std::ffi::CStr = c"pmix.node.size";
    pub const NUM_NODES: &std::ffi::CStr = c"pmix.num.nodes";
    pub const LOCAL_PEERS: &std::ffi::CStr = c"pmix.lpeers";
    pub const LOCAL_RANK: &std::ffi::CStr = c"pmix.lrank";
    pub const NODE_RANK: &std::ffi::CStr = c"pmix.nrank";
    pub const RANK: &std::ffi::CStr = c"pmix.rank";
    pub const NODEID: &std::ffi::CStr = c"pmix.nodeid";
    pub const HOSTNAME: &std::ffi::CStr = c"pmix.hname";
    pub const PROC_DATA: &std::ffi::CStr = c"pmix.pdata";
    pub const NODE_MAP: &std::ffi::CStr = c"pmix.nmap";
    pub const PROC_MAP: &std::ffi::CStr = c"pmix.pmap";
    pub const SERVER_TMPDIR: &std::ffi::CStr = c"pmix.srvr.tmpdir";
    pub const SYSTEM_TMPDIR: &std::ffi::CStr = c"pmix.sys.tmpdir";
    pub const SOCKET_MODE: &std::ffi::CStr = c"pmix.sockmode";
    pub const SERVER_NSPACE: &std::ffi::CStr = c"pmix.srv.nspace";
    pub const SERVER_RANK: &std::ffi::CStr = c"pmix.srv.rank";
    pub const EVENT_AFFECTED_PROC: &std::ffi::CStr = c"pmix.evproc";
    pub const EXIT_CODE: &std::ffi::CStr = c"pmix.exit.code";
}

/// `pmix_proc_t`: a process's namespace and rank.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct pmix_proc_t {
    pub nspace: [c_char; PMIX_NSPACE_BYTES],
    pub rank: pmix_rank_t,
}

impl pmix_proc_t {
    /// The process `rank` of namespace `nspace` (cut at 255 bytes).
    pub fn new(nspace: &str, rank: pmix_rank_t) -> Self {
        let mut p = Self {
            nspace: [0; PMIX_NSPACE_BYTES],
            rank,
        };
        for (d, s) in p
            .nspace
            .iter_mut()
            .zip(nspace.bytes().take(PMIX_NSPACE_BYTES - 1))
        {
            *d = s as c_char;
        }
        p
    }

    /// Its namespace, as text.
    pub fn nspace(&self) -> String {
        let bytes: Vec<u8> = self
            .nspace
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// `pmix_info_t`, opaque: built and read only through the library.
#[repr(C, align(8))]
pub struct pmix_info_t {
    _bytes: [u8; PMIX_INFO_BYTES],
}

/// `pmix_data_array_t`.
#[repr(C)]
pub struct pmix_data_array_t {
    pub type_: pmix_data_type_t,
    pub size: usize,
    pub array: *mut c_void,
}

impl Default for pmix_data_array_t {
    fn default() -> Self {
        Self {
            type_: 0,
            size: 0,
            array: std::ptr::null_mut(),
        }
    }
}

/// `pmix_op_cbfunc_t`.
pub type pmix_op_cbfunc_t = Option<unsafe extern "C" fn(pmix_status_t, *mut c_void)>;
/// `pmix_release_cbfunc_t`.
pub type pmix_release_cbfunc_t = Option<unsafe extern "C" fn(*mut c_void)>;
/// `pmix_modex_cbfunc_t`.
pub type pmix_modex_cbfunc_t = Option<
    unsafe extern "C" fn(
        pmix_status_t,
        *const c_char,
        usize,
        *mut c_void,
        pmix_release_cbfunc_t,
        *mut c_void,
    ),
>;

/// `pmix_server_client_connected_fn_t` and `pmix_server_client_finalized_fn_t`.
pub type pmix_server_client_fn_t = Option<
    unsafe extern "C" fn(
        *const pmix_proc_t,
        *mut c_void,
        pmix_op_cbfunc_t,
        *mut c_void,
    ) -> pmix_status_t,
>;
/// `pmix_server_abort_fn_t`.
pub type pmix_server_abort_fn_t = Option<
    unsafe extern "C" fn(
        *const pmix_proc_t,
        *mut c_void,
        c_int,
        *const c_char,
        *mut pmix_proc_t,
        usize,
        pmix_op_cbfunc_t,
        *mut c_void,
    ) -> pmix_status_t,
>;
/// `pmix_server_fencenb_fn_t`.
pub type pmix_server_fencenb_fn_t = Option<
    unsafe extern "C" fn(
        *const pmix_proc_t,
        usize,
        *const pmix_info_t,
        usize,
        *mut c_char,
        usize,
        pmix_modex_cbfunc_t,
        *mut c_void,
    ) -> pmix_status_t,
>;
/// `pmix_dmodex_response_fn_t`: the data of one process, for
/// [`Pmix::server_dmodex_request`].
pub type pmix_dmodex_response_fn_t =
    Option<unsafe extern "C" fn(pmix_status_t, *mut c_char, usize, *mut c_void)>;

/// `pmix_server_dmodex_req_fn_t`.
pub type pmix_server_dmodex_req_fn_t = Option<
    unsafe extern "C" fn(
        *const pmix_proc_t,
        *const pmix_info_t,
        usize,
        pmix_modex_cbfunc_t,
        *mut c_void,
    ) -> pmix_status_t,
>;

/// `pmix_server_module_t` of PMIx 4 (28 entries): the host's callbacks. Those a host does
/// not serve are `None`; the library answers "not supported" for them.
#[repr(C)]
#[derive(Default)]
pub struct pmix_server_module_t {
    pub client_connected: pmix_server_client_fn_t,
    pub client_finalized: pmix_server_client_fn_t,
    pub abort: pmix_server_abort_fn_t,
    pub fence_nb: pmix_server_fencenb_fn_t,
    pub direct_modex: pmix_server_dmodex_req_fn_t,
    /// publish, lookup, unpublish, spawn, connect, disconnect, register_events,
    /// deregister_events, listener (v1); notify_event, query, tool_connected, log, allocate,
    /// job_control, monitor (v2); get_credential, validate_credential, iof_pull, push_stdin
    /// (v3); group, fabric, client_connected2 (v4): not served.
    pub unserved: [Option<unsafe extern "C" fn()>; 23],
}

/// Why libpmix could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    #[error(
        "cannot load the PMIx server library {library} ({reason}): PMIx needs OpenPMIx 4.2 or \
         newer (Debian: apt-get install libpmix2), or {LIBRARY_VAR} naming it"
    )]
    NotFound { library: String, reason: String },
    #[error("{library} is not a usable PMIx server library: it lacks {symbol} ({reason})")]
    MissingSymbol {
        library: String,
        symbol: &'static str,
        reason: String,
    },
}

/// The library's soname (Debian's `libpmix2`).
pub const SONAME: &str = "libpmix.so.2";
/// Names another library than [`SONAME`] (a path, or a soname).
pub const LIBRARY_VAR: &str = "STORM_LIBPMIX";

macro_rules! exports {
    ($($field:ident = $symbol:literal : fn($($arg:ty),*) $(-> $ret:ty)?;)*) => {
        /// The functions of libpmix a host server calls, resolved once.
        pub struct Pmix {
            $(pub $field: unsafe extern "C" fn($($arg),*) $(-> $ret)?,)*
            /// What was loaded.
            pub name: String,
            _handle: libloading::os::unix::Library,
        }

        fn resolve_all(
            handle: libloading::os::unix::Library,
            name: String,
        ) -> Result<Pmix, LoadError> {
            $(
                // SAFETY: the symbol is the named libpmix function, whose C signature (PMIx
                // 4.2's pmix.h and pmix_server.h) the field's type spells out.
                let $field = unsafe {
                    handle
                        .get::<unsafe extern "C" fn($($arg),*) $(-> $ret)?>(
                            concat!($symbol, "\0").as_bytes(),
                        )
                        .map(|s| *s)
                        .map_err(|e| LoadError::MissingSymbol {
                            library: name.clone(),
                            symbol: $symbol,
                            reason: e.to_string(),
                        })?
                };
            )*
            Ok(Pmix { $($field,)* name, _handle: handle })
        }
    };
}

exports! {
    server_init = "PMIx_server_init":
        fn(*mut pmix_server_module_t, *mut pmix_info_t, usize) -> pmix_status_t;
    server_finalize = "PMIx_server_finalize": fn() -> pmix_status_t;
    register_nspace = "PMIx_server_register_nspace":
        fn(*const c_char, c_int, *mut pmix_info_t, usize, pmix_op_cbfunc_t, *mut c_void)
            -> pmix_status_t;
    deregister_nspace = "PMIx_server_deregister_nspace":
        fn(*const c_char, pmix_op_cbfunc_t, *mut c_void);
    register_client = "PMIx_server_register_client":
        fn(*const pmix_proc_t, u32, u32, *mut c_void, pmix_op_cbfunc_t, *mut c_void)
            -> pmix_status_t;
    deregister_client = "PMIx_server_deregister_client":
        fn(*const pmix_proc_t, pmix_op_cbfunc_t, *mut c_void);
    setup_fork = "PMIx_server_setup_fork":
        fn(*const pmix_proc_t, *mut *mut *mut c_char) -> pmix_status_t;
    generate_regex = "PMIx_generate_regex": fn(*const c_char, *mut *mut c_char) -> pmix_status_t;
    generate_ppn = "PMIx_generate_ppn": fn(*const c_char, *mut *mut c_char) -> pmix_status_t;
    info_list_start = "PMIx_Info_list_start": fn() -> *mut c_void;
    info_list_add = "PMIx_Info_list_add":
        fn(*mut c_void, *const c_char, *const c_void, pmix_data_type_t) -> pmix_status_t;
    info_list_convert = "PMIx_Info_list_convert":
        fn(*mut c_void, *mut pmix_data_array_t) -> pmix_status_t;
    info_list_release = "PMIx_Info_list_release": fn(*mut c_void);
    data_array_destruct = "PMIx_Data_array_destruct": fn(*mut pmix_data_array_t);
    error_string = "PMIx_Error_string": fn(pmix_status_t) -> *const c_char;
    get_version = "PMIx_Get_version": fn() -> *const c_char;
    server_dmodex_request = "PMIx_server_dmodex_request":
        fn(*const pmix_proc_t, pmix_dmodex_response_fn_t, *mut c_void) -> pmix_status_t;
    notify_event = "PMIx_Notify_event":
        fn(pmix_status_t, *const pmix_proc_t, pmix_data_range_t, *const pmix_info_t, usize,
            pmix_op_cbfunc_t, *mut c_void) -> pmix_status_t;
}

impl Pmix {
    /// `PMIx_Error_string` as text.
    pub fn error(&self, status: pmix_status_t) -> String {
        // SAFETY: PMIx_Error_string returns a static string for any status.
        let s = unsafe { (self.error_string)(status) };
        if s.is_null() {
            return format!("PMIx status {status}");
        }
        // SAFETY: a non-null result is a NUL-terminated static string.
        unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
    }

    /// `PMIx_Get_version` as text.
    pub fn version(&self) -> String {
        // SAFETY: PMIx_Get_version returns a static string.
        let s = unsafe { (self.get_version)() };
        if s.is_null() {
            return String::new();
        }
        // SAFETY: as above.
        unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
    }
}

static LOADED: OnceLock<Result<Pmix, LoadError>> = OnceLock::new();

/// libpmix, opened on first use ([`SONAME`], or what [`LIBRARY_VAR`] names); later calls
/// return the same library or the same error.
pub fn library() -> Result<&'static Pmix, LoadError> {
    LOADED.get_or_init(open).as_ref().map_err(Clone::clone)
}

fn open() -> Result<Pmix, LoadError> {
    let library = std::env::var(LIBRARY_VAR)
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| SONAME.to_string());
    // SAFETY: loading libpmix runs its initialisers, as linking it would at start-up.
    let handle = unsafe {
        libloading::os::unix::Library::open(
            Some(&library),
            libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL,
        )
    }
    .map_err(|e| LoadError::NotFound {
        library: library.clone(),
        reason: e.to_string(),
    })?;
    let pmix = resolve_all(handle, library)?;
    tracing::debug!(library = %pmix.name, version = %pmix.version(), "libpmix loaded");
    Ok(pmix)
}
