//! `rdma/fi_rma.h`: RDMA reads and writes.

use std::ffi::c_void;

use crate::bindings::*;

/// `fi_read`.
///
/// # Safety
/// `ep` is open; `buf` stays valid for `len` bytes until the completion; `addr` and `key`
/// name a region registered for remote reads on `src_addr`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn fi_read(
    ep: *mut fid_ep,
    buf: *mut c_void,
    len: usize,
    desc: *mut c_void,
    src_addr: fi_addr_t,
    addr: u64,
    key: u64,
    context: *mut c_void,
) -> isize {
    call_op!(
        unsafe { (*ep).rma },
        read(ep, buf, len, desc, src_addr, addr, key, context)
    )
}

/// `fi_readv`.
///
/// # Safety
/// As [`fi_read`], for `count` buffers.
#[allow(clippy::too_many_arguments)]
pub unsafe fn fi_readv(
    ep: *mut fid_ep,
    iov: *const iovec,
    desc: *mut *mut c_void,
    count: usize,
    src_addr: fi_addr_t,
    addr: u64,
    key: u64,
    context: *mut c_void,
) -> isize {
    call_op!(
        unsafe { (*ep).rma },
        readv(ep, iov, desc, count, src_addr, addr, key, context)
    )
}

/// `fi_readmsg`.
///
/// # Safety
/// As [`fi_read`], with the buffers in `msg`.
pub unsafe fn fi_readmsg(ep: *mut fid_ep, msg: *const fi_msg_rma, flags: u64) -> isize {
    call_op!(unsafe { (*ep).rma }, readmsg(ep, msg, flags))
}

/// `fi_write`.
///
/// # Safety
/// `ep` is open; `buf` stays valid for `len` bytes until the completion; `addr` and `key`
/// name a region registered for remote writes on `dest_addr`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn fi_write(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    desc: *mut c_void,
    dest_addr: fi_addr_t,
    addr: u64,
    key: u64,
    context: *mut c_void,
) -> isize {
    call_op!(
        unsafe { (*ep).rma },
        write(ep, buf, len, desc, dest_addr, addr, key, context)
    )
}

/// `fi_writev`.
///
/// # Safety
/// As [`fi_write`], for `count` buffers.
#[allow(clippy::too_many_arguments)]
pub unsafe fn fi_writev(
    ep: *mut fid_ep,
    iov: *const iovec,
    desc: *mut *mut c_void,
    count: usize,
    dest_addr: fi_addr_t,
    addr: u64,
    key: u64,
    context: *mut c_void,
) -> isize {
    call_op!(
        unsafe { (*ep).rma },
        writev(ep, iov, desc, count, dest_addr, addr, key, context)
    )
}

/// `fi_writemsg`.
///
/// # Safety
/// As [`fi_write`], with the buffers in `msg`.
pub unsafe fn fi_writemsg(ep: *mut fid_ep, msg: *const fi_msg_rma, flags: u64) -> isize {
    call_op!(unsafe { (*ep).rma }, writemsg(ep, msg, flags))
}

/// `fi_inject_write`.
///
/// # Safety
/// As [`fi_write`]; `buf` may be reused on return.
pub unsafe fn fi_inject_write(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    dest_addr: fi_addr_t,
    addr: u64,
    key: u64,
) -> isize {
    call_op!(
        unsafe { (*ep).rma },
        inject(ep, buf, len, dest_addr, addr, key)
    )
}

/// `fi_writedata`: a write that also delivers `data` as remote CQ data.
///
/// # Safety
/// As [`fi_write`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn fi_writedata(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    desc: *mut c_void,
    data: u64,
    dest_addr: fi_addr_t,
    addr: u64,
    key: u64,
    context: *mut c_void,
) -> isize {
    call_op!(
        unsafe { (*ep).rma },
        writedata(ep, buf, len, desc, data, dest_addr, addr, key, context)
    )
}

/// `fi_inject_writedata`.
///
/// # Safety
/// As [`fi_inject_write`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn fi_inject_writedata(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    data: u64,
    dest_addr: fi_addr_t,
    addr: u64,
    key: u64,
) -> isize {
    call_op!(
        unsafe { (*ep).rma },
        injectdata(ep, buf, len, data, dest_addr, addr, key)
    )
}
