//! # storm-pmi
//!
//! `libstorm_pmi.so`: the PMI-1 client library API (`PMI_Init`, `PMI_KVS_Put`,
//! `PMI_Barrier`, ...) for MPI libraries that load a PMI library instead of speaking the wire
//! protocol themselves. Open MPI 4's `flux` component is one: it is chosen when `FLUX_JOB_ID`
//! is set and opens the library named by `FLUX_PMI_LIBRARY_PATH` (`storm-submit --mpi
//! openmpi` sets both). MPICH speaks the wire protocol itself and does not need this.
//!
//! Each call is one request and reply on the task's `PMI_FD`, served by its node manager
//! (storm-nm/src/pmi); [`client`] holds that protocol, without C. The clique (the ranks on
//! this node) comes from storm's block placement: `STORM_LOCAL_SIZE` ranks from
//! `STORM_RANK - STORM_LOCAL_RANK` on.
//!
//! No call panics across the C boundary: a panic is caught and returns `PMI_FAIL`.

pub mod client;

use std::ffi::{CStr, c_char, c_int};
use std::fs::File;
use std::os::fd::FromRawFd;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Mutex;

use client::Client;

const PMI_SUCCESS: c_int = 0;
const PMI_FAIL: c_int = -1;
const PMI_ERR_INIT: c_int = 1;
const PMI_ERR_INVALID_ARG: c_int = 3;
const PMI_ERR_INVALID_LENGTH: c_int = 8;

static CLIENT: Mutex<Option<Client<File>>> = Mutex::new(None);

fn say(what: &str) {
    eprintln!("storm-pmi: {what}");
}

fn env_number(name: &str) -> Result<i32, String> {
    std::env::var(name)
        .map_err(|_| format!("{name} is not set (is this task started by storm with --mpi?)"))?
        .parse()
        .map_err(|_| format!("{name} is not a number"))
}

/// Runs `f` on the initialised client; PMI_ERR_INIT before `PMI_Init`.
fn with_client(f: impl FnOnce(&mut Client<File>) -> c_int) -> c_int {
    guarded(|| match CLIENT.lock() {
        Ok(mut c) => match c.as_mut() {
            Some(c) => f(c),
            None => PMI_ERR_INIT,
        },
        Err(_) => PMI_FAIL,
    })
}

fn guarded(f: impl FnOnce() -> c_int) -> c_int {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(PMI_FAIL)
}

fn report(result: Result<(), client::Error>) -> c_int {
    match result {
        Ok(()) => PMI_SUCCESS,
        Err(e) => {
            say(&e.to_string());
            PMI_FAIL
        }
    }
}

/// # Safety
/// `p` is null or points to a writable int.
unsafe fn store(p: *mut c_int, value: c_int) -> c_int {
    if p.is_null() {
        return PMI_ERR_INVALID_ARG;
    }
    // SAFETY: not null, and the caller passes a writable int.
    unsafe { *p = value };
    PMI_SUCCESS
}

/// # Safety
/// `p` is null or a NUL-terminated string.
unsafe fn text<'a>(p: *const c_char) -> Option<&'a str> {
    if p.is_null() {
        return None;
    }
    // SAFETY: not null, and the caller passes a NUL-terminated string.
    unsafe { CStr::from_ptr(p) }.to_str().ok()
}

/// Copies `s` with its NUL into `buf` of `len` bytes.
///
/// # Safety
/// `buf` is null or has room for `len` bytes.
unsafe fn copy_out(s: &str, buf: *mut c_char, len: c_int) -> c_int {
    if buf.is_null() {
        return PMI_ERR_INVALID_ARG;
    }
    if s.len() + 1 > len.max(0) as usize {
        return PMI_ERR_INVALID_LENGTH;
    }
    // SAFETY: `buf` has room for `len` > s.len() bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), s.len());
        *buf.add(s.len()) = 0;
    }
    PMI_SUCCESS
}

/// # Safety
/// `spawned` is null or points to a writable int.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn PMI_Init(spawned: *mut c_int) -> c_int {
    guarded(|| {
        let Ok(mut slot) = CLIENT.lock() else {
            return PMI_FAIL;
        };
        if slot.is_none() {
            let opened = (|| {
                let fd = env_number("PMI_FD")?;
                let rank = env_number("PMI_RANK")?;
                let size = env_number("PMI_SIZE")?;
                // SAFETY: PMI_FD names the socket the NM gave this task, owned by no one
                // else in this process (MPI libraries that load a PMI library leave it).
                let stream = unsafe { File::from_raw_fd(fd) };
                Client::init(stream, rank, size).map_err(|e| e.to_string())
            })();
            match opened {
                Ok(c) => *slot = Some(c),
                Err(e) => {
                    say(&e);
                    return PMI_FAIL;
                }
            }
        }
        // SAFETY: the caller's pointer, checked for null.
        if !spawned.is_null() {
            unsafe { store(spawned, 0) };
        }
        PMI_SUCCESS
    })
}

/// # Safety
/// `initialized` is null or points to a writable int.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn PMI_Initialized(initialized: *mut c_int) -> c_int {
    guarded(|| {
        let yes = CLIENT.lock().map(|c| c.is_some()).unwrap_or(false);
        // SAFETY: the caller's pointer.
        unsafe { store(initialized, c_int::from(yes)) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn PMI_Finalize() -> c_int {
    guarded(|| {
        let Ok(mut slot) = CLIENT.lock() else {
            return PMI_FAIL;
        };
        match slot.take() {
            Some(mut c) => report(c.finalize()),
            None => PMI_SUCCESS,
        }
    })
}

/// # Safety
/// `size` is null or points to a writable int.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn PMI_Get_size(size: *mut c_int) -> c_int {
    // SAFETY: the caller's pointer.
    with_client(|c| unsafe { store(size, c.size) })
}

/// # Safety
/// `rank` is null or points to a writable int.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn PMI_Get_rank(rank: *mut c_int) -> c_int {
    // SAFETY: the caller's pointer.
    with_client(|c| unsafe { store(rank, c.rank) })
}

/// # Safety
/// `size` is null or points to a writable int.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn PMI_Get_universe_size(size: *mut c_int) -> c_int {
    // SAFETY: the caller's pointer.
    with_client(|c| unsafe { store(size, c.universe_size) })
}

/// # Safety
/// `appnum` is null or points to a writable int.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn PMI_Get_appnum(appnum: *mut c_int) -> c_int {
    // SAFETY: the caller's pointer.
    with_client(|c| unsafe { store(appnum, c.appnum) })
}

#[unsafe(no_mangle)]
pub extern "C" fn PMI_Barrier() -> c_int {
    with_client(|c| report(c.barrier()))
}

/// Ends the job on every node with `exit_code`; does not return.
///
/// # Safety
/// `error_msg` is null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn PMI_Abort(exit_code: c_int, error_msg: *const c_char) -> c_int {
    // SAFETY: the caller's string.
    let msg = unsafe { text(error_msg) }
        .unwrap_or("PMI_Abort")
        .to_string();
    with_client(|c| report(c.abort(exit_code, &msg)));
    std::process::exit(exit_code)
}

/// # Safety
/// `kvsname` is null or has room for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn PMI_KVS_Get_my_name(kvsname: *mut c_char, length: c_int) -> c_int {
    // SAFETY: the caller's buffer of `length` bytes.
    with_client(|c| unsafe { copy_out(&c.kvsname, kvsname, length) })
}

/// # Safety
/// `length` is null or points to a writable int.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn PMI_KVS_Get_name_length_max(length: *mut c_int) -> c_int {
    // SAFETY: the caller's pointer.
    with_client(|c| unsafe { store(length, c.kvsname_max) })
}

/// # Safety
/// `length` is null or points to a writable int.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn PMI_KVS_Get_key_length_max(length: *mut c_int) -> c_int {
    // SAFETY: the caller's pointer.
    with_client(|c| unsafe { store(length, c.key_max) })
}

/// # Safety
/// `length` is null or points to a writable int.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn PMI_KVS_Get_value_length_max(length: *mut c_int) -> c_int {
    // SAFETY: the caller's pointer.
    with_client(|c| unsafe { store(length, c.value_max) })
}

/// # Safety
/// `key` and `value` are null or NUL-terminated strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn PMI_KVS_Put(
    _kvsname: *const c_char,
    key: *const c_char,
    value: *const c_char,
) -> c_int {
    // SAFETY: the caller's strings.
    let (Some(key), Some(value)) = (unsafe { text(key) }, unsafe { text(value) }) else {
        return PMI_ERR_INVALID_ARG;
    };
    with_client(|c| report(c.put(key, value)))
}

/// Puts go to the server as they are made: nothing is left to commit.
#[unsafe(no_mangle)]
pub extern "C" fn PMI_KVS_Commit(_kvsname: *const c_char) -> c_int {
    with_client(|_| PMI_SUCCESS)
}

/// # Safety
/// `key` is null or a NUL-terminated string; `value` is null or has room for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn PMI_KVS_Get(
    _kvsname: *const c_char,
    key: *const c_char,
    value: *mut c_char,
    length: c_int,
) -> c_int {
    // SAFETY: the caller's string.
    let Some(key) = (unsafe { text(key) }) else {
        return PMI_ERR_INVALID_ARG;
    };
    with_client(|c| match c.get(key) {
        // SAFETY: the caller's buffer of `length` bytes.
        Ok(Some(v)) => unsafe { copy_out(&v, value, length) },
        Ok(None) => PMI_FAIL,
        Err(e) => report(Err(e)),
    })
}

/// This node's ranks under storm's block placement.
fn clique() -> Result<Vec<c_int>, String> {
    let rank = env_number("STORM_RANK")?;
    let local = env_number("STORM_LOCAL_RANK")?;
    let size = env_number("STORM_LOCAL_SIZE")?;
    Ok((rank - local..rank - local + size).collect())
}

/// # Safety
/// `size` is null or points to a writable int.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn PMI_Get_clique_size(size: *mut c_int) -> c_int {
    with_client(|_| match clique() {
        // SAFETY: the caller's pointer.
        Ok(ranks) => unsafe { store(size, ranks.len() as c_int) },
        Err(e) => {
            say(&e);
            PMI_FAIL
        }
    })
}

/// # Safety
/// `ranks` is null or has room for `length` ints.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn PMI_Get_clique_ranks(ranks: *mut c_int, length: c_int) -> c_int {
    with_client(|_| match clique() {
        Ok(mine) if ranks.is_null() || (length.max(0) as usize) < mine.len() => {
            PMI_ERR_INVALID_LENGTH
        }
        Ok(mine) => {
            // SAFETY: `ranks` has room for `length` >= mine.len() ints.
            unsafe { std::ptr::copy_nonoverlapping(mine.as_ptr(), ranks, mine.len()) };
            PMI_SUCCESS
        }
        Err(e) => {
            say(&e);
            PMI_FAIL
        }
    })
}
