//! The OpenPMIx server library (`pmix-sys`, loaded at run time), hosted in this helper
//! process for one node manager: every PMIx client of every job on the node connects here
//! (docs/mpi.md, PMIx).
//!
//! What the library's callbacks say goes to the NM as [`Event`]s (through the sink given to
//! [`Server::start`]); the NM's PMI thread decides, as it does for PMI-1 and PMI-2:
//!
//! * a job about to start is registered ([`Server::register`]): its namespace
//!   (`storm-JOB`), the job-level keys (`PMIX_JOB_SIZE`, `PMIX_UNIV_SIZE`, `PMIX_LOCAL_SIZE`,
//!   `PMIX_LOCAL_PEERS`, `PMIX_NODE_MAP`, `PMIX_PROC_MAP`, ...) and each rank's
//!   (`PMIX_RANK`, `PMIX_LOCAL_RANK`, `PMIX_NODE_RANK`, `PMIX_NODEID`, `PMIX_HOSTNAME`), and
//!   each local rank as a client of its job's account; what the library puts in a client's
//!   environment (`PMIX_NAMESPACE`, `PMIX_RANK`, the server's address) goes back to the NM
//!   for the task's;
//! * a fence the library asks for (once per node, with the node's collected data) goes to
//!   the NM, which makes it this node's contribution to the job's fence at the MM; the
//!   fence's result, every node's data in node order, comes back ([`Server::complete_fence`]);
//! * `PMIx_Abort`, a client's connection and its finalization go to the NM;
//! * a direct modex (a client's `PMIx_Get` of a remote rank's key that no fence collected)
//!   goes to the NM, which fetches that rank's data from its node through the MM and
//!   answers ([`Server::complete_modex`]); the other way, the NM asks the library for a
//!   local rank's data on another node's behalf ([`Server::serve_modex`]);
//! * a rank's end, here or on another node, is raised as a PMIx event to the job's local
//!   clients ([`Server::notify`]).
//!
//! The library keeps process-wide state: one server per process, which is one reason it runs
//! in a helper of its own.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use pmix_sys::{
    Pmix, keys, pmix_data_array_t, pmix_info_t, pmix_modex_cbfunc_t, pmix_op_cbfunc_t, pmix_proc_t,
    pmix_server_module_t, pmix_status_t,
};

use crate::wire::{EnvVar, Event, JobInfo, MAX_ABORT_MESSAGE};

/// The library's callback for a fence's result, called once.
struct FenceDone {
    cb: pmix_modex_cbfunc_t,
    cbdata: *mut c_void,
}

// SAFETY: the library may be called back from any thread (it moves the result onto its own
// progress thread); `cbdata` is its own handle, used once.
unsafe impl Send for FenceDone {}

impl FenceDone {
    /// Hands the fence's collected data (or a failure) to the library. The bytes stay alive
    /// until the library releases them.
    fn complete(self, status: pmix_status_t, data: Vec<u8>) {
        let Some(cb) = self.cb else {
            return;
        };
        let data = Box::new(data);
        let (ptr, len) = (data.as_ptr() as *const c_char, data.len());
        let keep = Box::into_raw(data) as *mut c_void;
        // SAFETY: `cb` and `cbdata` are what the library gave `fence_nb`, called once; the
        // bytes live in `keep` until the library calls `release_data` with it.
        unsafe { cb(status, ptr, len, self.cbdata, Some(release_data), keep) };
    }
}

unsafe extern "C" fn release_data(keep: *mut c_void) {
    if !keep.is_null() {
        // SAFETY: `keep` is the box `FenceDone::complete` leaked, released once.
        drop(unsafe { Box::from_raw(keep as *mut Vec<u8>) });
    }
}

/// Where the callbacks' events go, and the calls waiting for the NM's answers.
struct Callbacks {
    sink: Box<dyn Fn(Event) + Send + Sync>,
    fences: Mutex<HashMap<u64, FenceDone>>,
    /// Direct modex requests waiting for a remote rank's data (answered as a fence is).
    modexes: Mutex<HashMap<u64, FenceDone>>,
    ops: Mutex<HashMap<u64, OpDone>>,
    next_id: AtomicU64,
    /// The most data one node may give a fence.
    max_fence_bytes: usize,
}

static CALLBACKS: OnceLock<Callbacks> = OnceLock::new();

/// The library's callback for a connection, finalization or abort, called once.
struct OpDone {
    cb: pmix_op_cbfunc_t,
    cbdata: *mut c_void,
}

// SAFETY: as for FenceDone: the library's own handle, used once, from any thread.
unsafe impl Send for OpDone {}

/// The namespace and rank of `proc`.
///
/// # Safety
/// `proc` is null or a valid `pmix_proc_t`.
unsafe fn who(proc: *const pmix_proc_t) -> Option<(String, u32)> {
    // SAFETY: as the caller says.
    let p = unsafe { proc.as_ref() }?;
    Some((p.nspace(), p.rank))
}

/// `PMIX_OPERATION_SUCCEEDED`: done at once, no callback follows.
const OPERATION_SUCCEEDED: pmix_status_t = -157;

/// Tells the NM `event` (made with the id its answer will carry), and has the library wait
/// for that answer ([`Server::complete_op`]) when it gave a callback; without one the event
/// goes with id 0 and the call is done at once.
fn tell_and_wait(
    cb: pmix_op_cbfunc_t,
    cbdata: *mut c_void,
    event: impl FnOnce(u64) -> Event,
) -> pmix_status_t {
    let Some(c) = CALLBACKS.get() else {
        return OPERATION_SUCCEEDED;
    };
    if cb.is_none() {
        (c.sink)(event(0));
        return OPERATION_SUCCEEDED;
    }
    let id = c.next_id.fetch_add(1, Ordering::Relaxed);
    c.ops
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(id, OpDone { cb, cbdata });
    (c.sink)(event(id));
    pmix_sys::PMIX_SUCCESS
}

unsafe extern "C" fn client_connected(
    proc: *const pmix_proc_t,
    _server_object: *mut c_void,
    cb: pmix_op_cbfunc_t,
    cbdata: *mut c_void,
) -> pmix_status_t {
    // SAFETY: the library passes its client's name.
    match unsafe { who(proc) } {
        Some((nspace, rank)) => {
            tell_and_wait(cb, cbdata, |id| Event::Connected { nspace, rank, id })
        }
        None => OPERATION_SUCCEEDED,
    }
}

unsafe extern "C" fn client_finalized(
    proc: *const pmix_proc_t,
    _server_object: *mut c_void,
    cb: pmix_op_cbfunc_t,
    cbdata: *mut c_void,
) -> pmix_status_t {
    // SAFETY: as above.
    match unsafe { who(proc) } {
        Some((nspace, rank)) => {
            tell_and_wait(cb, cbdata, |id| Event::Finalized { nspace, rank, id })
        }
        None => OPERATION_SUCCEEDED,
    }
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn abort(
    proc: *const pmix_proc_t,
    _server_object: *mut c_void,
    status: c_int,
    msg: *const c_char,
    _procs: *mut pmix_proc_t,
    _nprocs: usize,
    cb: pmix_op_cbfunc_t,
    cbdata: *mut c_void,
) -> pmix_status_t {
    let message = if msg.is_null() {
        "PMIx_Abort".to_string()
    } else {
        // SAFETY: a non-null message is the client's NUL-terminated string.
        let text = unsafe { CStr::from_ptr(msg) }.to_string_lossy();
        let mut cut = text.len().min(MAX_ABORT_MESSAGE);
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        format!("PMIx_Abort: {}", &text[..cut])
    };
    // SAFETY: as above.
    match unsafe { who(proc) } {
        Some((nspace, rank)) => tell_and_wait(cb, cbdata, |id| Event::Abort {
            nspace,
            rank,
            status,
            message,
            id,
        }),
        None => OPERATION_SUCCEEDED,
    }
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn fence_nb(
    procs: *const pmix_proc_t,
    nprocs: usize,
    _info: *const pmix_info_t,
    _ninfo: usize,
    data: *mut c_char,
    ndata: usize,
    cb: pmix_modex_cbfunc_t,
    cbdata: *mut c_void,
) -> pmix_status_t {
    let done = FenceDone { cb, cbdata };
    // SAFETY: `procs` holds `nprocs` names (the library's); the first names the job.
    let nspace = match (nprocs, unsafe { who(procs) }) {
        (1.., Some((nspace, _))) => nspace,
        _ => return pmix_sys::PMIX_ERR_NOT_SUPPORTED,
    };
    let bytes = if data.is_null() || ndata == 0 {
        Vec::new()
    } else {
        // SAFETY: the library gives `ndata` bytes at `data`, valid for this call.
        unsafe { std::slice::from_raw_parts(data as *const u8, ndata) }.to_vec()
    };
    let Some(c) = CALLBACKS.get() else {
        return pmix_sys::PMIX_ERROR;
    };
    let id = c.next_id.fetch_add(1, Ordering::Relaxed);
    c.fences
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(id, done);
    // More than a node may give a fence is not sent: the NM ends the job, naming the limit.
    (c.sink)(if bytes.len() > c.max_fence_bytes {
        Event::FenceTooLarge {
            id,
            nspace,
            bytes: bytes.len() as u64,
        }
    } else {
        Event::Fence {
            id,
            nspace,
            data: bytes,
        }
    });
    pmix_sys::PMIX_SUCCESS
}

unsafe extern "C" fn direct_modex(
    proc: *const pmix_proc_t,
    _info: *const pmix_info_t,
    _ninfo: usize,
    cb: pmix_modex_cbfunc_t,
    cbdata: *mut c_void,
) -> pmix_status_t {
    // SAFETY: the library passes the name of the process whose data a client wants.
    let Some((nspace, rank)) = (unsafe { who(proc) }) else {
        return pmix_sys::PMIX_ERR_NOT_FOUND;
    };
    let Some(c) = CALLBACKS.get() else {
        return pmix_sys::PMIX_ERROR;
    };
    let id = c.next_id.fetch_add(1, Ordering::Relaxed);
    c.modexes
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(id, FenceDone { cb, cbdata });
    (c.sink)(Event::DirectModex { id, nspace, rank });
    pmix_sys::PMIX_SUCCESS
}

/// Which local rank's data [`Server::serve_modex`] asked the library for.
struct Serving {
    nspace: String,
    rank: u32,
}

/// The library's answer to [`Server::serve_modex`]: the rank's data, which goes to the NM
/// (more than one node may give a fence is refused, naming its size).
unsafe extern "C" fn modex_served(
    status: pmix_status_t,
    data: *mut c_char,
    size: usize,
    cbdata: *mut c_void,
) {
    if cbdata.is_null() {
        return;
    }
    // SAFETY: `cbdata` is the box `serve_modex` leaked, taken back once.
    let Serving { nspace, rank } = *unsafe { Box::from_raw(cbdata as *mut Serving) };
    let Some(c) = CALLBACKS.get() else {
        return;
    };
    let result = if status != pmix_sys::PMIX_SUCCESS {
        Err(pmix_sys::library()
            .map(|lib| lib.error(status))
            .unwrap_or_else(|_| format!("PMIx status {status}")))
    } else if size > c.max_fence_bytes {
        Err(format!(
            "{size} bytes of data, more than one node may give a fence ({} bytes)",
            c.max_fence_bytes
        ))
    } else if data.is_null() || size == 0 {
        Ok(Vec::new())
    } else {
        // SAFETY: the library gives `size` bytes at `data`, valid for this call.
        Ok(unsafe { std::slice::from_raw_parts(data as *const u8, size) }.to_vec())
    };
    (c.sink)(Event::ModexData {
        nspace,
        rank,
        result,
    });
}

/// A list of `pmix_info_t` being built through the library (freed when dropped).
struct InfoList<'a> {
    lib: &'a Pmix,
    list: *mut c_void,
}

impl<'a> InfoList<'a> {
    fn new(lib: &'a Pmix) -> Self {
        // SAFETY: PMIx_Info_list_start takes nothing and returns the list's handle.
        Self {
            lib,
            list: unsafe { (lib.info_list_start)() },
        }
    }

    /// Adds `key` = the value at `value`, of PMIx type `kind` (the library copies it).
    fn add_raw(&mut self, key: &CStr, value: *const c_void, kind: u16) -> Result<(), String> {
        // SAFETY: the list is this one's; `value` points to a value of type `kind`.
        let rc = unsafe { (self.lib.info_list_add)(self.list, key.as_ptr(), value, kind) };
        if rc == pmix_sys::PMIX_SUCCESS {
            Ok(())
        } else {
            Err(format!("{}: {}", key.to_string_lossy(), self.lib.error(rc)))
        }
    }

    fn u32(&mut self, key: &CStr, v: u32) -> Result<(), String> {
        self.add_raw(
            key,
            &v as *const u32 as *const c_void,
            pmix_sys::PMIX_UINT32,
        )
    }

    fn rank(&mut self, key: &CStr, v: u32) -> Result<(), String> {
        self.add_raw(
            key,
            &v as *const u32 as *const c_void,
            pmix_sys::PMIX_PROC_RANK,
        )
    }

    fn u16(&mut self, key: &CStr, v: u16) -> Result<(), String> {
        self.add_raw(
            key,
            &v as *const u16 as *const c_void,
            pmix_sys::PMIX_UINT16,
        )
    }

    fn string(&mut self, key: &CStr, v: &str) -> Result<(), String> {
        let c = CString::new(v).map_err(|_| format!("{key:?}: a NUL byte"))?;
        // A PMIX_STRING value is passed as the string itself (the library copies it).
        self.add_raw(key, c.as_ptr() as *const c_void, pmix_sys::PMIX_STRING)
    }

    /// Adds `key` = the array `inner` holds (a `PMIX_DATA_ARRAY` of `PMIX_INFO`).
    fn array(&mut self, key: &CStr, inner: InfoList<'_>) -> Result<(), String> {
        let mut darray = inner.convert()?;
        let added = self.add_raw(
            key,
            &darray as *const pmix_data_array_t as *const c_void,
            pmix_sys::PMIX_DATA_ARRAY,
        );
        // SAFETY: `darray` is the library's array from convert, copied by the add above.
        unsafe { (self.lib.data_array_destruct)(&mut darray) };
        added
    }

    /// The list as an array of `pmix_info_t` (to destruct with the library).
    fn convert(self) -> Result<pmix_data_array_t, String> {
        let mut darray = pmix_data_array_t::default();
        // SAFETY: the list is this one's; `darray` receives a copy.
        let rc = unsafe { (self.lib.info_list_convert)(self.list, &mut darray) };
        if rc == pmix_sys::PMIX_SUCCESS {
            Ok(darray)
        } else {
            Err(format!(
                "cannot build the PMIx info array: {}",
                self.lib.error(rc)
            ))
        }
    }
}

impl Drop for InfoList<'_> {
    fn drop(&mut self) {
        // SAFETY: the list is this one's, released once.
        unsafe { (self.lib.info_list_release)(self.list) };
    }
}

/// A PMIx operation's completion, waited for (the library calls back from its thread).
struct Waiter {
    tx: std::sync::mpsc::SyncSender<pmix_status_t>,
}

unsafe extern "C" fn op_done(status: pmix_status_t, cbdata: *mut c_void) {
    if !cbdata.is_null() {
        // SAFETY: `cbdata` is the Waiter box `wait_op` leaked, taken back once.
        let w = unsafe { Box::from_raw(cbdata as *mut Waiter) };
        let _ = w.tx.send(status);
    }
}

/// Runs `start` (a library call given `op_done` and a waiter) and waits for its completion.
fn wait_op(
    lib: &Pmix,
    what: &str,
    start: impl FnOnce(pmix_op_cbfunc_t, *mut c_void) -> pmix_status_t,
) -> Result<(), String> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let cbdata = Box::into_raw(Box::new(Waiter { tx })) as *mut c_void;
    let rc = start(Some(op_done), cbdata);
    let rc = match rc {
        pmix_sys::PMIX_SUCCESS => rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .map_err(|_| format!("{what}: the PMIx library did not complete it"))?,
        // Done at once, or refused: the callback will not come.
        other => {
            // SAFETY: the library did not take `cbdata`; it is ours to free.
            drop(unsafe { Box::from_raw(cbdata as *mut Waiter) });
            if other == OPERATION_SUCCEEDED {
                pmix_sys::PMIX_SUCCESS
            } else {
                other
            }
        }
    };
    if rc == pmix_sys::PMIX_SUCCESS {
        Ok(())
    } else {
        Err(format!("{what}: {}", lib.error(rc)))
    }
}

/// A map the library compressed (`PMIx_generate_regex`, `PMIx_generate_ppn`): its own
/// format, which may hold NUL bytes, so it is passed on as `PMIX_REGEX`, never read here.
struct Regex<'a> {
    lib: &'a Pmix,
    raw: *mut c_char,
}

/// `PMIX_REGEX`.
const PMIX_REGEX: u16 = 49;

impl<'a> Regex<'a> {
    fn of(
        lib: &'a Pmix,
        f: unsafe extern "C" fn(*const c_char, *mut *mut c_char) -> pmix_status_t,
        input: &str,
    ) -> Result<Self, String> {
        let c = CString::new(input).map_err(|_| "a NUL in a node name")?;
        let mut raw: *mut c_char = std::ptr::null_mut();
        // SAFETY: `c` is a valid string; the library allocates `raw`.
        let rc = unsafe { f(c.as_ptr(), &mut raw) };
        if rc != pmix_sys::PMIX_SUCCESS || raw.is_null() {
            return Err(format!("a PMIx map of {input:?}: {}", lib.error(rc)));
        }
        Ok(Self { lib, raw })
    }

    fn add(&self, info: &mut InfoList<'_>, key: &CStr) -> Result<(), String> {
        let _ = self.lib;
        // A PMIX_REGEX value is passed as the map itself; the library copies it.
        info.add_raw(key, self.raw as *const c_void, PMIX_REGEX)
    }
}

impl Drop for Regex<'_> {
    fn drop(&mut self) {
        // SAFETY: the library allocated it with malloc; freed once.
        unsafe { libc::free(self.raw as *mut c_void) };
    }
}

/// The node's PMIx server, once started.
pub struct Server {
    lib: &'static Pmix,
}

impl Server {
    /// Starts the library's server (once per process): its files in `tmpdir`, its own
    /// namespace `storm-nm.NODE`, what its callbacks say going to `sink` (from the library's
    /// threads); a node's data to one fence above `max_fence_bytes` is not passed on.
    /// Which credentials a client must show, and how the library keeps job data,
    /// the caller set in the environment first (`PMIX_MCA_psec`, `PMIX_MCA_gds`).
    pub fn start(
        tmpdir: &Path,
        node_name: &str,
        max_fence_bytes: usize,
        sink: Box<dyn Fn(Event) + Send + Sync>,
    ) -> Result<Self, String> {
        let lib = pmix_sys::library().map_err(|e| e.to_string())?;
        let callbacks = Callbacks {
            sink,
            fences: Mutex::new(HashMap::new()),
            modexes: Mutex::new(HashMap::new()),
            ops: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            max_fence_bytes,
        };
        if CALLBACKS.set(callbacks).is_err() {
            return Err("a PMIx server runs already in this process".into());
        }
        let mut info = InfoList::new(lib);
        let dir = tmpdir.display().to_string();
        info.string(keys::SERVER_TMPDIR, &dir)?;
        info.string(keys::SYSTEM_TMPDIR, &dir)?;
        info.string(keys::SERVER_NSPACE, &format!("storm-nm.{node_name}"))?;
        info.rank(keys::SERVER_RANK, 0)?;
        let mut array = info.convert()?;
        let module = Box::leak(Box::new(pmix_server_module_t {
            client_connected: Some(client_connected),
            client_finalized: Some(client_finalized),
            abort: Some(abort),
            fence_nb: Some(fence_nb),
            direct_modex: Some(direct_modex),
            ..Default::default()
        }));
        // SAFETY: the module lives for good (leaked); the info array is the library's,
        // destructed after the call copied what it needs.
        let rc = unsafe { (lib.server_init)(module, array.array as *mut pmix_info_t, array.size) };
        // SAFETY: as above.
        unsafe { (lib.data_array_destruct)(&mut array) };
        if rc != pmix_sys::PMIX_SUCCESS {
            return Err(format!("PMIx_server_init: {}", lib.error(rc)));
        }
        Ok(Self { lib })
    }

    /// The library's version.
    pub fn version(&self) -> String {
        self.lib.version()
    }

    /// The NM has taken event `id`: the client's call returns.
    pub fn complete_op(&self, id: u64) {
        let Some(c) = CALLBACKS.get() else {
            return;
        };
        let done = c.ops.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
        match done {
            Some(OpDone {
                cb: Some(cb),
                cbdata,
            }) => {
                // SAFETY: the library's callback and handle for this operation, called once.
                unsafe { cb(pmix_sys::PMIX_SUCCESS, cbdata) }
            }
            _ => tracing::warn!(id, "an answer for no call waiting"),
        }
    }

    /// Hands fence `id`'s result to the library (a fence it does not wait for is ignored).
    pub fn complete_fence(&self, id: u64, result: Result<Vec<u8>, String>) {
        let Some(c) = CALLBACKS.get() else {
            return;
        };
        let done = c
            .fences
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        match (done, result) {
            (Some(done), Ok(data)) => done.complete(pmix_sys::PMIX_SUCCESS, data),
            (Some(done), Err(why)) => {
                tracing::warn!(id, "a PMIx fence failed: {why}");
                done.complete(pmix_sys::PMIX_ERROR, Vec::new());
            }
            (None, _) => tracing::warn!(id, "a result for no fence waiting"),
        }
    }

    /// Hands direct modex `id`'s answer to the library (one it does not wait for is
    /// ignored): the remote rank's data, or a failure the client's `PMIx_Get` returns.
    pub fn complete_modex(&self, id: u64, result: Result<Vec<u8>, String>) {
        let Some(c) = CALLBACKS.get() else {
            return;
        };
        let done = c
            .modexes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        match (done, result) {
            (Some(done), Ok(data)) => done.complete(pmix_sys::PMIX_SUCCESS, data),
            (Some(done), Err(why)) => {
                tracing::warn!(id, "a direct modex failed: {why}");
                done.complete(pmix_sys::PMIX_ERR_NOT_FOUND, Vec::new());
            }
            (None, _) => tracing::warn!(id, "an answer for no direct modex waiting"),
        }
    }

    /// Asks the library for the data local rank `rank` of job `nspace` committed (once it
    /// has): it comes back as [`Event::ModexData`].
    pub fn serve_modex(&self, nspace: &str, rank: u32) {
        let proc = pmix_proc_t::new(nspace, rank);
        let cbdata = Box::into_raw(Box::new(Serving {
            nspace: nspace.to_string(),
            rank,
        })) as *mut c_void;
        // SAFETY: `proc` outlives the call (the library copies it); `cbdata` is ours until
        // the callback takes it back.
        let rc = unsafe { (self.lib.server_dmodex_request)(&proc, Some(modex_served), cbdata) };
        if rc != pmix_sys::PMIX_SUCCESS {
            // SAFETY: the library refused the request and will not call back.
            drop(unsafe { Box::from_raw(cbdata as *mut Serving) });
            if let Some(c) = CALLBACKS.get() {
                (c.sink)(Event::ModexData {
                    nspace: nspace.to_string(),
                    rank,
                    result: Err(format!(
                        "PMIx_server_dmodex_request: {}",
                        self.lib.error(rc)
                    )),
                });
            }
        }
    }

    /// Raises PMIx event `status` for rank `rank` of job `nspace` (which ended with
    /// `exit_code`) to the job's local clients that registered for it.
    pub fn notify(
        &self,
        nspace: &str,
        rank: u32,
        status: i32,
        exit_code: i32,
    ) -> Result<(), String> {
        let lib = self.lib;
        let source = pmix_proc_t::new(nspace, rank);
        let mut info = InfoList::new(lib);
        info.add_raw(
            keys::EVENT_AFFECTED_PROC,
            &source as *const pmix_proc_t as *const c_void,
            pmix_sys::PMIX_PROC,
        )?;
        info.add_raw(
            keys::EXIT_CODE,
            &exit_code as *const i32 as *const c_void,
            pmix_sys::PMIX_INT,
        )?;
        let mut array = info.convert()?;
        let raised = wait_op(lib, "PMIx_Notify_event", |cb, cbdata| {
            // SAFETY: `source` and the array outlive the call and its completion (the array
            // is destructed below, after `wait_op` saw the callback).
            unsafe {
                (lib.notify_event)(
                    status,
                    &source,
                    pmix_sys::PMIX_RANGE_NAMESPACE,
                    array.array as *const pmix_info_t,
                    array.size,
                    cb,
                    cbdata,
                )
            }
        });
        // SAFETY: the library's array, no longer used.
        unsafe { (lib.data_array_destruct)(&mut array) };
        raised
    }

    /// Registers job `job` and its local `ranks` as clients, and gives each rank's
    /// additions to its environment (in `ranks`' order).
    pub fn register(&self, job: &JobInfo, ranks: &[u32]) -> Result<Vec<Vec<EnvVar>>, String> {
        let lib = self.lib;
        let Some((this_name, local)) = job.nodes.get(job.node as usize) else {
            return Err(format!("node {} is not among the job's", job.node));
        };
        let names: Vec<&str> = job.nodes.iter().map(|(n, _)| n.as_str()).collect();
        let node_map = Regex::of(lib, lib.generate_regex, &names.join(","))?;
        let ppn: Vec<String> = job
            .nodes
            .iter()
            .map(|(_, r)| r.iter().map(u32::to_string).collect::<Vec<_>>().join(","))
            .collect();
        let proc_map = Regex::of(lib, lib.generate_ppn, &ppn.join(";"))?;
        let peers = local
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let mut info = InfoList::new(lib);
        info.u32(keys::UNIV_SIZE, job.size)?;
        info.u32(keys::JOB_SIZE, job.size)?;
        info.u32(keys::MAX_PROCS, job.size)?;
        info.u32(keys::APPNUM, 0)?;
        info.u32(keys::APP_SIZE, job.size)?;
        info.u32(keys::NUM_NODES, job.nodes.len() as u32)?;
        info.u32(keys::LOCAL_SIZE, local.len() as u32)?;
        info.u32(keys::NODE_SIZE, local.len() as u32)?;
        info.string(keys::LOCAL_PEERS, &peers)?;
        node_map.add(&mut info, keys::NODE_MAP)?;
        proc_map.add(&mut info, keys::PROC_MAP)?;
        info.string(keys::HOSTNAME, this_name)?;
        info.u32(keys::NODEID, job.node)?;
        for (node, (name, node_ranks)) in job.nodes.iter().enumerate() {
            for (local_rank, &rank) in node_ranks.iter().enumerate() {
                let mut proc = InfoList::new(lib);
                proc.rank(keys::RANK, rank)?;
                proc.u16(keys::LOCAL_RANK, local_rank as u16)?;
                proc.u16(keys::NODE_RANK, local_rank as u16)?;
                proc.u32(keys::NODEID, node as u32)?;
                proc.string(keys::HOSTNAME, name)?;
                info.array(keys::PROC_DATA, proc)?;
            }
        }
        let mut array = info.convert()?;
        let nspace = CString::new(job.nspace.as_str()).map_err(|_| "a NUL in the namespace")?;
        let registered = wait_op(lib, "PMIx_server_register_nspace", |cb, cbdata| {
            // SAFETY: the array is the library's (destructed below, after the call
            // completed); the namespace outlives the call.
            unsafe {
                (lib.register_nspace)(
                    nspace.as_ptr(),
                    local.len() as c_int,
                    array.array as *mut pmix_info_t,
                    array.size,
                    cb,
                    cbdata,
                )
            }
        });
        // SAFETY: the library's array, no longer used.
        unsafe { (lib.data_array_destruct)(&mut array) };
        registered?;
        let mut envs = Vec::new();
        for &rank in ranks {
            let proc = pmix_proc_t::new(&job.nspace, rank);
            wait_op(lib, "PMIx_server_register_client", |cb, cbdata| {
                // SAFETY: `proc` outlives the call; no server object.
                unsafe {
                    (lib.register_client)(&proc, job.uid, job.gid, std::ptr::null_mut(), cb, cbdata)
                }
            })?;
            envs.push(self.client_env(&proc)?);
        }
        Ok(envs)
    }

    /// What the library puts in client `proc`'s environment.
    fn client_env(&self, proc: &pmix_proc_t) -> Result<Vec<EnvVar>, String> {
        let mut env: *mut *mut c_char = std::ptr::null_mut();
        // SAFETY: `proc` is valid; the library allocates `env` (an argv-style array).
        let rc = unsafe { (self.lib.setup_fork)(proc, &mut env) };
        let mut out = Vec::new();
        if !env.is_null() {
            let mut i = 0;
            loop {
                // SAFETY: `env` is NULL-terminated; each entry a NUL-terminated string.
                let entry = unsafe { *env.add(i) };
                if entry.is_null() {
                    break;
                }
                // SAFETY: as above.
                let bytes = unsafe { CStr::from_ptr(entry) }.to_bytes().to_vec();
                if let Some(eq) = bytes.iter().position(|&b| b == b'=') {
                    out.push((bytes[..eq].to_vec(), bytes[eq + 1..].to_vec()));
                }
                // SAFETY: the library allocated each entry with malloc.
                unsafe { libc::free(entry as *mut c_void) };
                i += 1;
            }
            // SAFETY: the array too.
            unsafe { libc::free(env as *mut c_void) };
        }
        if rc != pmix_sys::PMIX_SUCCESS {
            return Err(format!("PMIx_server_setup_fork: {}", self.lib.error(rc)));
        }
        Ok(out)
    }

    /// Forgets job `nspace` (its clients went with it).
    pub fn deregister(&self, nspace: &str) {
        if let Ok(c) = CString::new(nspace) {
            // SAFETY: the namespace outlives the call; no callback is asked for.
            unsafe { (self.lib.deregister_nspace)(c.as_ptr(), None, std::ptr::null_mut()) };
        }
    }
}
