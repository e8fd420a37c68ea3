//! `rdma/fi_cm.h`: endpoint names and connection management.

use std::ffi::{c_int, c_void};

use super::endpoint_of;
use crate::bindings::*;

/// `fi_setname`.
///
/// # Safety
/// `fid` is an open endpoint's `fid`; `addr` holds `addrlen` bytes.
pub unsafe fn fi_setname(fid: fid_t, addr: *mut c_void, addrlen: usize) -> c_int {
    let ep = endpoint_of(fid);
    call_op!(unsafe { (*ep).cm }, setname(fid, addr, addrlen))
}

/// `fi_getname`.
///
/// # Safety
/// `fid` is an open endpoint's `fid`; `addr` has `*addrlen` bytes of room.
pub unsafe fn fi_getname(fid: fid_t, addr: *mut c_void, addrlen: *mut usize) -> c_int {
    let ep = endpoint_of(fid);
    call_op!(unsafe { (*ep).cm }, getname(fid, addr, addrlen))
}

/// `fi_getpeer`.
///
/// # Safety
/// `ep` is a connected endpoint; `addr` has `*addrlen` bytes of room.
pub unsafe fn fi_getpeer(ep: *mut fid_ep, addr: *mut c_void, addrlen: *mut usize) -> c_int {
    call_op!(unsafe { (*ep).cm }, getpeer(ep, addr, addrlen))
}

/// `fi_listen`.
///
/// # Safety
/// `pep` is an open passive endpoint.
pub unsafe fn fi_listen(pep: *mut fid_pep) -> c_int {
    call_op!(unsafe { (*pep).cm }, listen(pep))
}

/// `fi_connect`.
///
/// # Safety
/// `ep` is open; `addr` is a provider address; `param` holds `paramlen` bytes.
pub unsafe fn fi_connect(
    ep: *mut fid_ep,
    addr: *const c_void,
    param: *const c_void,
    paramlen: usize,
) -> c_int {
    call_op!(unsafe { (*ep).cm }, connect(ep, addr, param, paramlen))
}

/// `fi_accept`.
///
/// # Safety
/// `ep` is open; `param` holds `paramlen` bytes.
pub unsafe fn fi_accept(ep: *mut fid_ep, param: *const c_void, paramlen: usize) -> c_int {
    call_op!(unsafe { (*ep).cm }, accept(ep, param, paramlen))
}

/// `fi_reject`.
///
/// # Safety
/// `pep` is open; `handle` came with a connection request.
pub unsafe fn fi_reject(
    pep: *mut fid_pep,
    handle: fid_t,
    param: *const c_void,
    paramlen: usize,
) -> c_int {
    call_op!(unsafe { (*pep).cm }, reject(pep, handle, param, paramlen))
}

/// `fi_shutdown`.
///
/// # Safety
/// `ep` is open.
pub unsafe fn fi_shutdown(ep: *mut fid_ep, flags: u64) -> c_int {
    call_op!(unsafe { (*ep).cm }, shutdown(ep, flags))
}

/// `fi_join`.
///
/// # Safety
/// `ep` is open; `mc` receives the multicast group.
pub unsafe fn fi_join(
    ep: *mut fid_ep,
    addr: *const c_void,
    flags: u64,
    mc: *mut *mut fid_mc,
    context: *mut c_void,
) -> c_int {
    call_checked_op!(
        unsafe { (*ep).cm },
        fi_ops_cm,
        join(ep, addr, flags, mc, context)
    )
}

/// `fi_mc_addr`.
///
/// # Safety
/// `mc` is a joined multicast group.
pub unsafe fn fi_mc_addr(mc: *mut fid_mc) -> fi_addr_t {
    unsafe { (*mc).fi_addr }
}
