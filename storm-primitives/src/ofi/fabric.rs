//! Owned libfabric objects: one endpoint with its fabric, domain, address vector, completion
//! queue and the registered global-memory region. Every raw call is in this file.
//!
//! Memory-registration modes (`mr_mode`) are all honoured, because real InfiniBand providers
//! (verbs;ofi_rxm) need them even though the providers on a development machine return none:
//!
//! * `FI_MR_LOCAL`: local buffers must be registered too; local operands live in the
//!   registered region and transfer sources are registered per transfer.
//! * `FI_MR_VIRT_ADDR`: remote addresses are virtual addresses (base + offset), not offsets.
//! * `FI_MR_PROV_KEY`: the provider picks the key; it is read back and exchanged.
//! * `FI_MR_ENDPOINT`: the region is bound to the endpoint and enabled before use.
//! * `FI_MR_ALLOCATED`: only allocated memory may be registered (global memory is).
//!
//! `FI_MR_RAW` (keys wider than 64 bits) is refused with a clear error.
//!
//! libfabric itself is opened here, at the first [`Fabric::open`] or [`available_providers`]:
//! a process that never uses the ofi backend never loads it.

use std::ffi::{CStr, CString};
use std::ptr;

use ofi_sys::{self as sys, LibFabric};

use crate::error::PrimError;

/// libfabric, loaded on first use; a clear error naming the library and its package if it
/// cannot be.
pub fn library() -> Result<&'static LibFabric, PrimError> {
    sys::library().map_err(|e| PrimError::Unavailable(e.to_string()))
}

/// A libfabric return code as an error.
pub fn fi_error(what: &str, code: isize) -> PrimError {
    let errno = (-code) as i32;
    let text = match sys::library() {
        Ok(lib) => lib.strerror(errno),
        Err(_) => format!("error {errno}"),
    };
    PrimError::InvalidArgument(format!("libfabric {what}: {text} ({code})"))
}

fn check(what: &str, code: i32) -> Result<(), PrimError> {
    if code < 0 {
        Err(fi_error(what, code as isize))
    } else {
        Ok(())
    }
}

/// What the provider requires of memory registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MrMode(pub u64);

impl MrMode {
    pub fn local(self) -> bool {
        self.0 & sys::FI_MR_LOCAL != 0
    }
    pub fn virt_addr(self) -> bool {
        self.0 & sys::FI_MR_VIRT_ADDR != 0
    }
    pub fn endpoint(self) -> bool {
        self.0 & sys::FI_MR_ENDPOINT != 0
    }
    pub fn names(self) -> Vec<&'static str> {
        [
            (sys::FI_MR_LOCAL, "FI_MR_LOCAL"),
            (sys::FI_MR_VIRT_ADDR, "FI_MR_VIRT_ADDR"),
            (sys::FI_MR_PROV_KEY, "FI_MR_PROV_KEY"),
            (sys::FI_MR_ENDPOINT, "FI_MR_ENDPOINT"),
            (sys::FI_MR_ALLOCATED, "FI_MR_ALLOCATED"),
            (sys::FI_MR_RAW, "FI_MR_RAW"),
        ]
        .into_iter()
        .filter(|(bit, _)| self.0 & bit != 0)
        .map(|(_, n)| n)
        .collect()
    }
}

/// The result of `fi_getinfo` (or `fi_allocinfo`), freed with `fi_freeinfo`.
struct InfoList(*mut sys::fi_info, &'static LibFabric);

impl Drop for InfoList {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: allocated by this library's fi_getinfo or fi_dupinfo.
            unsafe { (self.1.fi_freeinfo)(self.0) };
        }
    }
}

/// Providers that offer RMA and atomics on reliable datagram endpoints here (none where
/// libfabric is not installed).
pub fn available_providers() -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    if let Ok(list) = getinfo(None, None) {
        let mut cur = list.0;
        while !cur.is_null() {
            // SAFETY: walking the list fi_getinfo returned.
            unsafe {
                let attr = (*cur).fabric_attr;
                if !attr.is_null() && !(*attr).prov_name.is_null() {
                    let n = CStr::from_ptr((*attr).prov_name)
                        .to_string_lossy()
                        .into_owned();
                    if !names.contains(&n) {
                        names.push(n);
                    }
                }
                cur = (*cur).next;
            }
        }
    }
    names
}

/// Queries providers with RMA + atomics on RDM endpoints, optionally one provider by name and
/// a source node (address) to bind.
fn getinfo(provider: Option<&str>, node: Option<&str>) -> Result<InfoList, PrimError> {
    let lib = library()?;
    // SAFETY: allocates an empty fi_info with all sub-attributes, freed by InfoList.
    let hints = unsafe { lib.fi_allocinfo() };
    if hints.is_null() {
        return Err(PrimError::invalid("libfabric: cannot allocate hints"));
    }
    let hints = InfoList(hints, lib);
    // SAFETY: hints and its attribute structs were allocated by fi_dupinfo.
    unsafe {
        let h = &mut *hints.0;
        h.caps = sys::FI_RMA
            | sys::FI_ATOMIC
            | sys::FI_READ
            | sys::FI_WRITE
            | sys::FI_REMOTE_READ
            | sys::FI_REMOTE_WRITE;
        (*h.ep_attr).type_ = sys::FI_EP_RDM;
        let d = &mut *h.domain_attr;
        d.threading = sys::FI_THREAD_SAFE;
        d.mr_mode = (sys::FI_MR_LOCAL
            | sys::FI_MR_VIRT_ADDR
            | sys::FI_MR_ALLOCATED
            | sys::FI_MR_PROV_KEY
            | sys::FI_MR_ENDPOINT) as i32;
        if let Some(p) = provider {
            let c =
                CString::new(p).map_err(|_| PrimError::invalid("provider name has a NUL byte"))?;
            // fi_freeinfo frees prov_name: it must come from the C allocator.
            (*h.fabric_attr).prov_name = libc::strdup(c.as_ptr());
        }
    }
    let node_c = node
        .map(CString::new)
        .transpose()
        .map_err(|_| PrimError::invalid("node has a NUL byte"))?;
    let mut out: *mut sys::fi_info = ptr::null_mut();
    let flags = if node.is_some() { sys::FI_SOURCE } else { 0 };
    // SAFETY: valid hints; out receives a list we free.
    let rc = unsafe {
        (lib.fi_getinfo)(
            sys::STORM_FI_VERSION,
            node_c.as_ref().map_or(ptr::null(), |c| c.as_ptr()),
            ptr::null(),
            flags,
            hints.0,
            &mut out,
        )
    };
    check("fi_getinfo", rc)?;
    Ok(InfoList(out, lib))
}

/// An open endpoint and everything it needs.
pub struct Fabric {
    info: InfoList,
    fabric: *mut sys::fid_fabric,
    domain: *mut sys::fid_domain,
    pub ep: *mut sys::fid_ep,
    av: *mut sys::fid_av,
    pub cq: *mut sys::fid_cq,
    mr: *mut sys::fid_mr,
    pub mr_mode: MrMode,
    pub provider: String,
    /// Whether the CQ has a wait object (so `fi_cq_sread` can block).
    pub cq_waits: bool,
    closed: std::sync::atomic::AtomicBool,
}

// SAFETY: the domain is opened with FI_THREAD_SAFE; every object may be used from any thread.
unsafe impl Send for Fabric {}
unsafe impl Sync for Fabric {}

fn as_fid<T>(p: *mut T) -> *mut sys::fid {
    // Every libfabric object begins with its `struct fid`.
    p.cast()
}

impl Fabric {
    /// Opens `provider` (bound to `node` if given) and registers `len` bytes at `base`.
    pub fn open(
        provider: &str,
        node: Option<&str>,
        base: *mut u8,
        len: usize,
        force_mr_local: bool,
    ) -> Result<Fabric, PrimError> {
        let info = getinfo(Some(provider), node).map_err(|e| {
            if let PrimError::Unavailable(_) = e {
                return e;
            }
            let found = available_providers();
            PrimError::invalid(format!(
                "provider {provider:?} with RMA and atomics is not available ({e}); providers found: {}",
                if found.is_empty() { "none".to_string() } else { found.join(", ") }
            ))
        })?;
        let mut f = Fabric {
            info,
            fabric: ptr::null_mut(),
            domain: ptr::null_mut(),
            ep: ptr::null_mut(),
            av: ptr::null_mut(),
            cq: ptr::null_mut(),
            mr: ptr::null_mut(),
            mr_mode: MrMode(0),
            provider: provider.to_string(),
            cq_waits: false,
            closed: std::sync::atomic::AtomicBool::new(false),
        };
        // SAFETY: each call gets objects opened just before, in libfabric's documented order.
        unsafe {
            let i = f.info.0;
            f.mr_mode = MrMode(
                (*(*i).domain_attr).mr_mode as u64
                    | if force_mr_local { sys::FI_MR_LOCAL } else { 0 },
            );
            if f.mr_mode.0 & sys::FI_MR_RAW != 0 {
                return Err(PrimError::invalid(format!(
                    "provider {provider} needs FI_MR_RAW keys, which storm does not support"
                )));
            }
            check(
                "fi_fabric",
                (f.info.1.fi_fabric)((*i).fabric_attr, &mut f.fabric, ptr::null_mut()),
            )?;
            check(
                "fi_domain",
                sys::fi_domain(f.fabric, i, &mut f.domain, ptr::null_mut()),
            )?;
            let mut cq_attr = sys::fi_cq_attr {
                size: 4096,
                format: sys::FI_CQ_FORMAT_DATA,
                wait_obj: sys::FI_WAIT_UNSPEC,
                ..Default::default()
            };
            // A blocking read on an shm CQ holds a lock that stalls fi_av_insert on every other
            // shm endpoint of the process (seen with libfabric 1.17): poll shm instead.
            let blocking = provider != "shm";
            if blocking && sys::fi_cq_open(f.domain, &mut cq_attr, &mut f.cq, ptr::null_mut()) == 0
            {
                f.cq_waits = true;
            } else {
                cq_attr.wait_obj = sys::FI_WAIT_NONE;
                check(
                    "fi_cq_open",
                    sys::fi_cq_open(f.domain, &mut cq_attr, &mut f.cq, ptr::null_mut()),
                )?;
            }
            let mut av_attr = sys::fi_av_attr {
                type_: sys::FI_AV_TABLE,
                ..Default::default()
            };
            check(
                "fi_av_open",
                sys::fi_av_open(f.domain, &mut av_attr, &mut f.av, ptr::null_mut()),
            )?;
            check(
                "fi_endpoint",
                sys::fi_endpoint(f.domain, i, &mut f.ep, ptr::null_mut()),
            )?;
            check(
                "fi_ep_bind(cq)",
                sys::fi_ep_bind(f.ep, as_fid(f.cq), sys::FI_TRANSMIT | sys::FI_RECV),
            )?;
            check("fi_ep_bind(av)", sys::fi_ep_bind(f.ep, as_fid(f.av), 0))?;
            check("fi_enable", sys::fi_enable(f.ep))?;
            let access = sys::FI_READ | sys::FI_WRITE | sys::FI_REMOTE_READ | sys::FI_REMOTE_WRITE;
            check(
                "fi_mr_reg",
                sys::fi_mr_reg(
                    f.domain,
                    base as *const _,
                    len,
                    access,
                    0,
                    remote_key((*(*i).domain_attr).mr_key_size),
                    0,
                    &mut f.mr,
                    ptr::null_mut(),
                ),
            )?;
            if f.mr_mode.endpoint() {
                check("fi_mr_bind", sys::fi_mr_bind(f.mr, as_fid(f.ep), 0))?;
                check("fi_mr_enable", sys::fi_mr_enable(f.mr))?;
            }
        }
        Ok(f)
    }

    /// This endpoint's address, to give to the others.
    pub fn name(&self) -> Result<Vec<u8>, PrimError> {
        let mut buf = vec![0u8; 256];
        let mut len = buf.len();
        // SAFETY: buf holds len bytes.
        let rc = unsafe { sys::fi_getname(as_fid(self.ep), buf.as_mut_ptr().cast(), &mut len) };
        check("fi_getname", rc)?;
        buf.truncate(len);
        Ok(buf)
    }

    /// libfabric's text for an error number.
    pub fn strerror(&self, errno: i32) -> String {
        self.info.1.strerror(errno)
    }

    /// The key others use to reach the registered region: the one we asked for, or under
    /// FI_MR_PROV_KEY the one the provider chose. Either way it is exchanged at start-up.
    pub fn key(&self) -> u64 {
        // SAFETY: mr is open.
        unsafe { sys::fi_mr_key(self.mr) }
    }

    /// The descriptor of the registered region, for local operands under FI_MR_LOCAL.
    pub fn desc(&self) -> *mut libc::c_void {
        // SAFETY: mr is open.
        unsafe { sys::fi_mr_desc(self.mr) }
    }

    /// Inserts peers' addresses; returns their fabric addresses in the same order.
    pub fn insert(&self, names: &[Vec<u8>]) -> Result<Vec<sys::fi_addr_t>, PrimError> {
        let mut out = vec![0; names.len()];
        for (i, name) in names.iter().enumerate() {
            // SAFETY: name is a valid address blob from fi_getname; out[i] receives one address.
            let n = unsafe {
                sys::fi_av_insert(
                    self.av,
                    name.as_ptr().cast(),
                    1,
                    &mut out[i],
                    0,
                    ptr::null_mut(),
                )
            };
            if n != 1 {
                return Err(fi_error(
                    &format!("fi_av_insert of node {i}"),
                    if n < 0 {
                        n as isize
                    } else {
                        -(sys::FI_EINVAL as isize)
                    },
                ));
            }
        }
        Ok(out)
    }

    /// Registers a local buffer for the length of one transfer (FI_MR_LOCAL providers).
    pub fn register_local(&self, buf: &[u8]) -> Result<LocalMr, PrimError> {
        let mut mr = ptr::null_mut();
        // SAFETY: buf outlives the registration (LocalMr is dropped before the data).
        let rc = unsafe {
            sys::fi_mr_reg(
                self.domain,
                buf.as_ptr().cast(),
                buf.len().max(1),
                sys::FI_WRITE | sys::FI_READ,
                0,
                0,
                0,
                &mut mr,
                ptr::null_mut(),
            )
        };
        check("fi_mr_reg (local)", rc)?;
        if self.mr_mode.endpoint() {
            // SAFETY: mr and ep are open.
            unsafe {
                check(
                    "fi_mr_bind (local)",
                    sys::fi_mr_bind(mr, as_fid(self.ep), 0),
                )?;
                check("fi_mr_enable (local)", sys::fi_mr_enable(mr))?;
            }
        }
        Ok(LocalMr(mr))
    }
}

/// A registration of a local buffer.
pub struct LocalMr(*mut sys::fid_mr);

// SAFETY: closed once, from whichever thread drops it; the domain is thread-safe.
unsafe impl Send for LocalMr {}
unsafe impl Sync for LocalMr {}

impl LocalMr {
    pub fn desc(&self) -> *mut libc::c_void {
        // SAFETY: open registration.
        unsafe { sys::fi_mr_desc(self.0) }
    }
}

impl Drop for LocalMr {
    fn drop(&mut self) {
        // SAFETY: opened by fi_mr_reg.
        unsafe { sys::fi_close(as_fid(self.0)) };
    }
}

impl Fabric {
    /// Closes every object, as the end of a process would: peers see the endpoint vanish.
    /// The caller guarantees that nothing uses the endpoint any more.
    pub fn close(&self) {
        if self.closed.swap(true, std::sync::atomic::Ordering::AcqRel) {
            return;
        }
        // SAFETY: close in reverse order of opening; null pointers were never opened.
        unsafe {
            for fid in [
                as_fid(self.ep),
                as_fid(self.mr),
                as_fid(self.av),
                as_fid(self.cq),
                as_fid(self.domain),
                as_fid(self.fabric),
            ] {
                if !fid.is_null() {
                    sys::fi_close(fid);
                }
            }
        }
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        self.close();
    }
}
/// The key asked for the region other nodes write: random, so that a process on the fabric
/// cannot guess it (a provider with FI_MR_PROV_KEY picks its own instead), within the
/// provider's key size, and never 0 (the key of local-only regions).
fn remote_key(key_size: usize) -> u64 {
    let bits = (key_size.clamp(1, 8) * 8) as u32;
    let mask = if bits == 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    };
    loop {
        let key = u64::from_le_bytes(crate::tcp::auth::random_bytes::<8>()) & mask;
        if key != 0 {
            return key;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::remote_key;

    #[test]
    fn remote_keys_are_random_nonzero_and_fit_the_providers_key_size() {
        let keys: Vec<u64> = (0..64).map(|_| remote_key(8)).collect();
        let mut distinct = keys.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), keys.len(), "64-bit keys repeat: {keys:?}");
        for size in [1, 2, 4] {
            for _ in 0..200 {
                let k = remote_key(size);
                assert!(k != 0 && k < 1 << (8 * size), "{k:#x} for {size}-byte keys");
            }
        }
        assert_ne!(
            remote_key(0),
            0,
            "a provider reporting no key size still gets a key"
        );
    }
}
