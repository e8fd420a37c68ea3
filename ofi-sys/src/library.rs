//! Opening libfabric with `dlopen` and resolving the functions it exports.
//!
//! libfabric versions its symbols: `fi_getinfo@FABRIC_1.3`, `fi_fabric@FABRIC_1.1`, and newer
//! releases add newer versions whose structures are larger. A C program built against the
//! 1.17 headers binds the versions those headers describe; [`library`] asks for the same ones
//! (`dlvsym`), so the `fi_info` a newer libfabric returns has the layout of [`crate::fi_info`].
//! Where a symbol has no such version (a libfabric built without symbol versioning), the
//! default one is taken.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::sync::OnceLock;

use crate::bindings::{fi_fabric_attr, fi_info, fid_fabric};
use crate::{fi_version_of, fi_version_parts};

/// The library's soname, as the dynamic loader finds it (package `libfabric1` on Debian).
pub const SONAME: &str = "libfabric.so.1";

/// Environment variable naming another libfabric to load (a path, or a soname for the
/// loader's search path), e.g. a build of a newer release under /opt.
pub const LIBRARY_VAR: &str = "STORM_LIBFABRIC";

/// The oldest libfabric storm runs on: the headers the bindings were generated from.
pub const OLDEST_VERSION: (u32, u32) = (1, 17);

/// Why libfabric could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    #[error(
        "cannot load libfabric ({reason}). The ofi backend needs libfabric {}.{} or newer: \
         install it (Debian and Ubuntu: apt-get install libfabric1), or set {LIBRARY_VAR} to \
         the library's path",
        OLDEST_VERSION.0, OLDEST_VERSION.1
    )]
    NotFound {
        /// What was asked of the loader (its message names it too).
        library: String,
        reason: String,
    },
    #[error("{library} is not a usable libfabric: it lacks {symbol} ({reason})")]
    MissingSymbol {
        library: String,
        symbol: &'static str,
        reason: String,
    },
    #[error(
        "{library} is libfabric {}.{}; the ofi backend needs {}.{} or newer",
        found.0, found.1, OLDEST_VERSION.0, OLDEST_VERSION.1
    )]
    TooOld { library: String, found: (u32, u32) },
}

/// `fi_getinfo`.
pub type FiGetinfo = unsafe extern "C" fn(
    version: u32,
    node: *const c_char,
    service: *const c_char,
    flags: u64,
    hints: *const fi_info,
    info: *mut *mut fi_info,
) -> c_int;
/// `fi_freeinfo`.
pub type FiFreeinfo = unsafe extern "C" fn(info: *mut fi_info);
/// `fi_dupinfo`.
pub type FiDupinfo = unsafe extern "C" fn(info: *const fi_info) -> *mut fi_info;
/// `fi_fabric`.
pub type FiFabric = unsafe extern "C" fn(
    attr: *mut fi_fabric_attr,
    fabric: *mut *mut fid_fabric,
    context: *mut c_void,
) -> c_int;
/// `fi_strerror`.
pub type FiStrerror = unsafe extern "C" fn(errnum: c_int) -> *const c_char;
/// `fi_version`.
pub type FiVersion = unsafe extern "C" fn() -> u32;
/// `fi_tostr`.
pub type FiTostr = unsafe extern "C" fn(data: *const c_void, datatype: u32) -> *mut c_char;

/// The functions libfabric exports, resolved once. Their signatures are those of the 1.17
/// headers (`rdma/fabric.h`).
pub struct LibFabric {
    pub fi_getinfo: FiGetinfo,
    pub fi_freeinfo: FiFreeinfo,
    pub fi_dupinfo: FiDupinfo,
    pub fi_fabric: FiFabric,
    pub fi_strerror: FiStrerror,
    pub fi_version: FiVersion,
    pub fi_tostr: FiTostr,
    /// What was loaded: the soname, or the path from [`LIBRARY_VAR`].
    pub name: String,
    /// `FI_VERSION` of the loaded library.
    pub version: u32,
    // Never closed: libfabric cannot be unloaded while providers hold threads and memory.
    _handle: libloading::os::unix::Library,
}

impl LibFabric {
    /// `fi_allocinfo()`: an empty `fi_info` with every attribute structure allocated, to free
    /// with `fi_freeinfo`.
    ///
    /// # Safety
    /// The result must be freed with this library's `fi_freeinfo` and nothing else.
    pub unsafe fn fi_allocinfo(&self) -> *mut fi_info {
        unsafe { (self.fi_dupinfo)(std::ptr::null()) }
    }

    /// `fi_strerror` as an owned string.
    pub fn strerror(&self, errnum: c_int) -> String {
        // SAFETY: fi_strerror returns a static string for any value.
        unsafe { CStr::from_ptr((self.fi_strerror)(errnum)) }
            .to_string_lossy()
            .into_owned()
    }

    /// The loaded version as `(major, minor)`.
    pub fn version_parts(&self) -> (u32, u32) {
        fi_version_parts(self.version)
    }
}

static LOADED: OnceLock<Result<LibFabric, LoadError>> = OnceLock::new();

/// libfabric, opened on first use: the soname [`SONAME`], or what [`LIBRARY_VAR`] names.
/// Later calls return the same library, or the same error.
pub fn library() -> Result<&'static LibFabric, LoadError> {
    LOADED.get_or_init(open).as_ref().map_err(Clone::clone)
}

fn open() -> Result<LibFabric, LoadError> {
    let library = std::env::var(LIBRARY_VAR)
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| SONAME.to_string());
    // RTLD_NOW: a library that cannot resolve its own dependencies fails here, with the
    // loader's message, not at the first call.
    // SAFETY: loading libfabric runs its initialisers (and its providers' libraries'), which
    // is what any program linked against it does at start-up.
    let handle = unsafe {
        libloading::os::unix::Library::open(
            Some(&library),
            libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_LOCAL,
        )
    }
    .map_err(|e| LoadError::NotFound {
        library: library.clone(),
        reason: loader_reason(&e),
    })?;
    let raw = handle.into_raw();
    let resolve = |symbol: &'static str, version: &str| -> Result<*mut c_void, LoadError> {
        resolve(raw, symbol, version).map_err(|reason| LoadError::MissingSymbol {
            library: library.clone(),
            symbol,
            reason,
        })
    };
    // The versions the 1.17 headers bind (`objdump -T libfabric.so.1`).
    let getinfo = resolve("fi_getinfo", "FABRIC_1.3");
    let freeinfo = resolve("fi_freeinfo", "FABRIC_1.3");
    let dupinfo = resolve("fi_dupinfo", "FABRIC_1.3");
    let fabric = resolve("fi_fabric", "FABRIC_1.1");
    let strerror = resolve("fi_strerror", "FABRIC_1.0");
    let version = resolve("fi_version", "FABRIC_1.0");
    let tostr = resolve("fi_tostr", "FABRIC_1.0");
    // SAFETY: `raw` came from into_raw just above; the library is kept open for good.
    let handle = unsafe { libloading::os::unix::Library::from_raw(raw) };
    // SAFETY: each pointer is the named libfabric function, whose C signature the field's
    // type spells out (rdma/fabric.h of libfabric 1.17, at the symbol version resolved).
    let lib = unsafe {
        LibFabric {
            fi_getinfo: std::mem::transmute::<*mut c_void, FiGetinfo>(getinfo?),
            fi_freeinfo: std::mem::transmute::<*mut c_void, FiFreeinfo>(freeinfo?),
            fi_dupinfo: std::mem::transmute::<*mut c_void, FiDupinfo>(dupinfo?),
            fi_fabric: std::mem::transmute::<*mut c_void, FiFabric>(fabric?),
            fi_strerror: std::mem::transmute::<*mut c_void, FiStrerror>(strerror?),
            fi_version: std::mem::transmute::<*mut c_void, FiVersion>(version?),
            fi_tostr: std::mem::transmute::<*mut c_void, FiTostr>(tostr?),
            name: library.clone(),
            version: 0,
            _handle: handle,
        }
    };
    // SAFETY: fi_version takes nothing and returns FI_VERSION of the library.
    let found = unsafe { (lib.fi_version)() };
    let (major, minor) = fi_version_parts(found);
    if found < fi_version_of(OLDEST_VERSION.0, OLDEST_VERSION.1) {
        return Err(LoadError::TooOld {
            library,
            found: (major, minor),
        });
    }
    tracing::debug!(library = %lib.name, major, minor, "libfabric loaded");
    Ok(LibFabric {
        version: found,
        ..lib
    })
}

/// The dynamic loader's own message (libloading keeps it as the error's source).
fn loader_reason(e: &libloading::Error) -> String {
    match std::error::Error::source(e) {
        Some(detail) => detail.to_string(),
        None => e.to_string(),
    }
}

/// `dlvsym(symbol, version)`, or `dlsym(symbol)` for a library without that version.
fn resolve(handle: *mut c_void, symbol: &str, version: &str) -> Result<*mut c_void, String> {
    let name = CString::new(symbol).map_err(|e| e.to_string())?;
    #[cfg(target_env = "gnu")]
    {
        let ver = CString::new(version).map_err(|e| e.to_string())?;
        // SAFETY: handle is an open library; both strings are NUL-terminated.
        let p = unsafe { libc::dlvsym(handle, name.as_ptr(), ver.as_ptr()) };
        if !p.is_null() {
            return Ok(p);
        }
    }
    #[cfg(not(target_env = "gnu"))]
    let _ = version;
    // SAFETY: as above.
    let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
    if p.is_null() {
        // SAFETY: dlerror returns the loader's last message, or null.
        let err = unsafe { libc::dlerror() };
        return Err(if err.is_null() {
            "not found".into()
        } else {
            // SAFETY: a NUL-terminated string owned by the loader.
            unsafe { CStr::from_ptr(err) }
                .to_string_lossy()
                .into_owned()
        });
    }
    Ok(p)
}
