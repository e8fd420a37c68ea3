//! `rdma/fi_endpoint.h`: endpoints, their contexts and options, and untagged messages.

use std::ffi::{c_int, c_void};

use super::endpoint_of;
use crate::bindings::*;

/// `fi_passive_ep`.
///
/// # Safety
/// `fabric` is open; `info` comes from `fi_getinfo`; `pep` receives the endpoint.
pub unsafe fn fi_passive_ep(
    fabric: *mut fid_fabric,
    info: *mut fi_info,
    pep: *mut *mut fid_pep,
    context: *mut c_void,
) -> c_int {
    call_op!(
        unsafe { (*fabric).ops },
        passive_ep(fabric, info, pep, context)
    )
}

/// `fi_endpoint`.
///
/// # Safety
/// `domain` is open; `info` comes from `fi_getinfo`; `ep` receives the endpoint.
pub unsafe fn fi_endpoint(
    domain: *mut fid_domain,
    info: *mut fi_info,
    ep: *mut *mut fid_ep,
    context: *mut c_void,
) -> c_int {
    call_op!(
        unsafe { (*domain).ops },
        endpoint(domain, info, ep, context)
    )
}

/// `fi_endpoint2`.
///
/// # Safety
/// As [`fi_endpoint`].
pub unsafe fn fi_endpoint2(
    domain: *mut fid_domain,
    info: *mut fi_info,
    ep: *mut *mut fid_ep,
    flags: u64,
    context: *mut c_void,
) -> c_int {
    if flags == 0 {
        return unsafe { fi_endpoint(domain, info, ep, context) };
    }
    call_checked_op!(
        unsafe { (*domain).ops },
        fi_ops_domain,
        endpoint2(domain, info, ep, flags, context)
    )
}

/// `fi_scalable_ep`.
///
/// # Safety
/// As [`fi_endpoint`].
pub unsafe fn fi_scalable_ep(
    domain: *mut fid_domain,
    info: *mut fi_info,
    sep: *mut *mut fid_ep,
    context: *mut c_void,
) -> c_int {
    call_op!(
        unsafe { (*domain).ops },
        scalable_ep(domain, info, sep, context)
    )
}

/// `fi_ep_bind`.
///
/// # Safety
/// `ep` and `bfid` are open.
pub unsafe fn fi_ep_bind(ep: *mut fid_ep, bfid: *mut fid, flags: u64) -> c_int {
    let fid = unsafe { &raw mut (*ep).fid };
    call_op!(unsafe { (*fid).ops }, bind(fid, bfid, flags))
}

/// `fi_pep_bind`.
///
/// # Safety
/// `pep` and `bfid` are open.
pub unsafe fn fi_pep_bind(pep: *mut fid_pep, bfid: *mut fid, flags: u64) -> c_int {
    let fid = unsafe { &raw mut (*pep).fid };
    call_op!(unsafe { (*fid).ops }, bind(fid, bfid, flags))
}

/// `fi_scalable_ep_bind`.
///
/// # Safety
/// `sep` and `bfid` are open.
pub unsafe fn fi_scalable_ep_bind(sep: *mut fid_ep, bfid: *mut fid, flags: u64) -> c_int {
    unsafe { fi_ep_bind(sep, bfid, flags) }
}

/// `fi_enable`.
///
/// # Safety
/// `ep` is open and bound to what it needs.
pub unsafe fn fi_enable(ep: *mut fid_ep) -> c_int {
    let fid = unsafe { &raw mut (*ep).fid };
    call_op!(
        unsafe { (*fid).ops },
        control(fid, FI_ENABLE as c_int, std::ptr::null_mut())
    )
}

/// `fi_cancel`.
///
/// # Safety
/// `fid` is an open endpoint's `fid`.
pub unsafe fn fi_cancel(fid: fid_t, context: *mut c_void) -> isize {
    let ep = endpoint_of(fid);
    call_op!(unsafe { (*ep).ops }, cancel(fid, context))
}

/// `fi_setopt`.
///
/// # Safety
/// `fid` is an open endpoint's `fid`; `optval` holds `optlen` bytes.
pub unsafe fn fi_setopt(
    fid: fid_t,
    level: c_int,
    optname: c_int,
    optval: *const c_void,
    optlen: usize,
) -> c_int {
    let ep = endpoint_of(fid);
    call_op!(
        unsafe { (*ep).ops },
        setopt(fid, level, optname, optval, optlen)
    )
}

/// `fi_getopt`.
///
/// # Safety
/// `fid` is an open endpoint's `fid`; `optval` has `*optlen` bytes of room.
pub unsafe fn fi_getopt(
    fid: fid_t,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: *mut usize,
) -> c_int {
    let ep = endpoint_of(fid);
    call_op!(
        unsafe { (*ep).ops },
        getopt(fid, level, optname, optval, optlen)
    )
}

/// `fi_ep_alias`.
///
/// # Safety
/// `ep` is open; `alias_ep` receives the alias.
pub unsafe fn fi_ep_alias(ep: *mut fid_ep, alias_ep: *mut *mut fid_ep, flags: u64) -> c_int {
    let mut fid: *mut fid = std::ptr::null_mut();
    let ret = unsafe { super::fi_alias(&raw mut (*ep).fid, &mut fid, flags) };
    if ret == 0 {
        unsafe { *alias_ep = endpoint_of(fid) };
    }
    ret
}

/// `fi_tx_context`.
///
/// # Safety
/// `ep` is an open scalable endpoint; `tx_ep` receives the context.
pub unsafe fn fi_tx_context(
    ep: *mut fid_ep,
    idx: c_int,
    attr: *mut fi_tx_attr,
    tx_ep: *mut *mut fid_ep,
    context: *mut c_void,
) -> c_int {
    call_op!(unsafe { (*ep).ops }, tx_ctx(ep, idx, attr, tx_ep, context))
}

/// `fi_rx_context`.
///
/// # Safety
/// `ep` is an open scalable endpoint; `rx_ep` receives the context.
pub unsafe fn fi_rx_context(
    ep: *mut fid_ep,
    idx: c_int,
    attr: *mut fi_rx_attr,
    rx_ep: *mut *mut fid_ep,
    context: *mut c_void,
) -> c_int {
    call_op!(unsafe { (*ep).ops }, rx_ctx(ep, idx, attr, rx_ep, context))
}

/// `fi_rx_size_left` (deprecated in libfabric).
///
/// # Safety
/// `ep` is open.
pub unsafe fn fi_rx_size_left(ep: *mut fid_ep) -> isize {
    call_op!(unsafe { (*ep).ops }, rx_size_left(ep))
}

/// `fi_tx_size_left` (deprecated in libfabric).
///
/// # Safety
/// `ep` is open.
pub unsafe fn fi_tx_size_left(ep: *mut fid_ep) -> isize {
    call_op!(unsafe { (*ep).ops }, tx_size_left(ep))
}

/// `fi_stx_context`.
///
/// # Safety
/// `domain` is open; `stx` receives the shared context.
pub unsafe fn fi_stx_context(
    domain: *mut fid_domain,
    attr: *mut fi_tx_attr,
    stx: *mut *mut fid_stx,
    context: *mut c_void,
) -> c_int {
    call_op!(
        unsafe { (*domain).ops },
        stx_ctx(domain, attr, stx, context)
    )
}

/// `fi_srx_context`.
///
/// # Safety
/// `domain` is open; `rx_ep` receives the shared context.
pub unsafe fn fi_srx_context(
    domain: *mut fid_domain,
    attr: *mut fi_rx_attr,
    rx_ep: *mut *mut fid_ep,
    context: *mut c_void,
) -> c_int {
    call_op!(
        unsafe { (*domain).ops },
        srx_ctx(domain, attr, rx_ep, context)
    )
}

/// `fi_recv`.
///
/// # Safety
/// `ep` is open; `buf` stays valid for `len` bytes until the completion.
pub unsafe fn fi_recv(
    ep: *mut fid_ep,
    buf: *mut c_void,
    len: usize,
    desc: *mut c_void,
    src_addr: fi_addr_t,
    context: *mut c_void,
) -> isize {
    call_op!(
        unsafe { (*ep).msg },
        recv(ep, buf, len, desc, src_addr, context)
    )
}

/// `fi_recvv`.
///
/// # Safety
/// As [`fi_recv`], for `count` buffers.
pub unsafe fn fi_recvv(
    ep: *mut fid_ep,
    iov: *const iovec,
    desc: *mut *mut c_void,
    count: usize,
    src_addr: fi_addr_t,
    context: *mut c_void,
) -> isize {
    call_op!(
        unsafe { (*ep).msg },
        recvv(ep, iov, desc, count, src_addr, context)
    )
}

/// `fi_recvmsg`.
///
/// # Safety
/// As [`fi_recv`], with the buffers in `msg`.
pub unsafe fn fi_recvmsg(ep: *mut fid_ep, msg: *const fi_msg, flags: u64) -> isize {
    call_op!(unsafe { (*ep).msg }, recvmsg(ep, msg, flags))
}

/// `fi_send`.
///
/// # Safety
/// `ep` is open; `buf` stays valid for `len` bytes until the completion.
pub unsafe fn fi_send(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    desc: *mut c_void,
    dest_addr: fi_addr_t,
    context: *mut c_void,
) -> isize {
    call_op!(
        unsafe { (*ep).msg },
        send(ep, buf, len, desc, dest_addr, context)
    )
}

/// `fi_sendv`.
///
/// # Safety
/// As [`fi_send`], for `count` buffers.
pub unsafe fn fi_sendv(
    ep: *mut fid_ep,
    iov: *const iovec,
    desc: *mut *mut c_void,
    count: usize,
    dest_addr: fi_addr_t,
    context: *mut c_void,
) -> isize {
    call_op!(
        unsafe { (*ep).msg },
        sendv(ep, iov, desc, count, dest_addr, context)
    )
}

/// `fi_sendmsg`.
///
/// # Safety
/// As [`fi_send`], with the buffers in `msg`.
pub unsafe fn fi_sendmsg(ep: *mut fid_ep, msg: *const fi_msg, flags: u64) -> isize {
    call_op!(unsafe { (*ep).msg }, sendmsg(ep, msg, flags))
}

/// `fi_inject`.
///
/// # Safety
/// `ep` is open; `buf` holds `len` bytes (reusable on return).
pub unsafe fn fi_inject(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    dest_addr: fi_addr_t,
) -> isize {
    call_op!(unsafe { (*ep).msg }, inject(ep, buf, len, dest_addr))
}

/// `fi_senddata`.
///
/// # Safety
/// As [`fi_send`].
pub unsafe fn fi_senddata(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    desc: *mut c_void,
    data: u64,
    dest_addr: fi_addr_t,
    context: *mut c_void,
) -> isize {
    call_op!(
        unsafe { (*ep).msg },
        senddata(ep, buf, len, desc, data, dest_addr, context)
    )
}

/// `fi_injectdata`.
///
/// # Safety
/// As [`fi_inject`].
pub unsafe fn fi_injectdata(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    data: u64,
    dest_addr: fi_addr_t,
) -> isize {
    call_op!(
        unsafe { (*ep).msg },
        injectdata(ep, buf, len, data, dest_addr)
    )
}
