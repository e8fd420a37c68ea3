//! `rdma/fi_eq.h`: event queues, completion queues, counters, wait and poll sets.

use std::ffi::{c_char, c_int, c_void};

use crate::bindings::*;

/// `fi_trywait`.
///
/// # Safety
/// `fabric` is open; `fids` holds `count` open objects.
pub unsafe fn fi_trywait(fabric: *mut fid_fabric, fids: *mut *mut fid, count: c_int) -> c_int {
    call_op!(unsafe { (*fabric).ops }, trywait(fabric, fids, count))
}

/// `fi_wait`.
///
/// # Safety
/// `waitset` is open.
pub unsafe fn fi_wait(waitset: *mut fid_wait, timeout: c_int) -> c_int {
    call_op!(unsafe { (*waitset).ops }, wait(waitset, timeout))
}

/// `fi_poll`.
///
/// # Safety
/// `pollset` is open; `context` has room for `count` pointers.
pub unsafe fn fi_poll(pollset: *mut fid_poll, context: *mut *mut c_void, count: c_int) -> c_int {
    call_op!(unsafe { (*pollset).ops }, poll(pollset, context, count))
}

/// `fi_poll_add`.
///
/// # Safety
/// `pollset` and `event_fid` are open.
pub unsafe fn fi_poll_add(pollset: *mut fid_poll, event_fid: *mut fid, flags: u64) -> c_int {
    call_op!(
        unsafe { (*pollset).ops },
        poll_add(pollset, event_fid, flags)
    )
}

/// `fi_poll_del`.
///
/// # Safety
/// `pollset` and `event_fid` are open.
pub unsafe fn fi_poll_del(pollset: *mut fid_poll, event_fid: *mut fid, flags: u64) -> c_int {
    call_op!(
        unsafe { (*pollset).ops },
        poll_del(pollset, event_fid, flags)
    )
}

/// `fi_eq_open`.
///
/// # Safety
/// `fabric` is open; `eq` receives the event queue.
pub unsafe fn fi_eq_open(
    fabric: *mut fid_fabric,
    attr: *mut fi_eq_attr,
    eq: *mut *mut fid_eq,
    context: *mut c_void,
) -> c_int {
    call_op!(unsafe { (*fabric).ops }, eq_open(fabric, attr, eq, context))
}

/// `fi_eq_read`.
///
/// # Safety
/// `eq` is open; `buf` has `len` bytes of room.
pub unsafe fn fi_eq_read(
    eq: *mut fid_eq,
    event: *mut u32,
    buf: *mut c_void,
    len: usize,
    flags: u64,
) -> isize {
    call_op!(unsafe { (*eq).ops }, read(eq, event, buf, len, flags))
}

/// `fi_eq_readerr`.
///
/// # Safety
/// `eq` is open.
pub unsafe fn fi_eq_readerr(eq: *mut fid_eq, buf: *mut fi_eq_err_entry, flags: u64) -> isize {
    call_op!(unsafe { (*eq).ops }, readerr(eq, buf, flags))
}

/// `fi_eq_write`.
///
/// # Safety
/// `eq` is open; `buf` holds `len` bytes.
pub unsafe fn fi_eq_write(
    eq: *mut fid_eq,
    event: u32,
    buf: *const c_void,
    len: usize,
    flags: u64,
) -> isize {
    call_op!(unsafe { (*eq).ops }, write(eq, event, buf, len, flags))
}

/// `fi_eq_sread`.
///
/// # Safety
/// As [`fi_eq_read`].
pub unsafe fn fi_eq_sread(
    eq: *mut fid_eq,
    event: *mut u32,
    buf: *mut c_void,
    len: usize,
    timeout: c_int,
    flags: u64,
) -> isize {
    call_op!(
        unsafe { (*eq).ops },
        sread(eq, event, buf, len, timeout, flags)
    )
}

/// `fi_eq_strerror`.
///
/// # Safety
/// `eq` is open; `buf` (if not null) has `len` bytes of room.
pub unsafe fn fi_eq_strerror(
    eq: *mut fid_eq,
    prov_errno: c_int,
    err_data: *const c_void,
    buf: *mut c_char,
    len: usize,
) -> *const c_char {
    call_op!(
        unsafe { (*eq).ops },
        strerror(eq, prov_errno, err_data, buf, len)
    )
}

/// `fi_cq_read`.
///
/// # Safety
/// `cq` is open; `buf` has room for `count` entries of the queue's format.
pub unsafe fn fi_cq_read(cq: *mut fid_cq, buf: *mut c_void, count: usize) -> isize {
    call_op!(unsafe { (*cq).ops }, read(cq, buf, count))
}

/// `fi_cq_readfrom`.
///
/// # Safety
/// As [`fi_cq_read`]; `src_addr` has room for `count` addresses.
pub unsafe fn fi_cq_readfrom(
    cq: *mut fid_cq,
    buf: *mut c_void,
    count: usize,
    src_addr: *mut fi_addr_t,
) -> isize {
    call_op!(unsafe { (*cq).ops }, readfrom(cq, buf, count, src_addr))
}

/// `fi_cq_readerr`.
///
/// # Safety
/// `cq` is open.
pub unsafe fn fi_cq_readerr(cq: *mut fid_cq, buf: *mut fi_cq_err_entry, flags: u64) -> isize {
    call_op!(unsafe { (*cq).ops }, readerr(cq, buf, flags))
}

/// `fi_cq_sread`.
///
/// # Safety
/// As [`fi_cq_read`]; the queue has a wait object.
pub unsafe fn fi_cq_sread(
    cq: *mut fid_cq,
    buf: *mut c_void,
    count: usize,
    cond: *const c_void,
    timeout: c_int,
) -> isize {
    call_op!(unsafe { (*cq).ops }, sread(cq, buf, count, cond, timeout))
}

/// `fi_cq_sreadfrom`.
///
/// # Safety
/// As [`fi_cq_sread`] and [`fi_cq_readfrom`].
pub unsafe fn fi_cq_sreadfrom(
    cq: *mut fid_cq,
    buf: *mut c_void,
    count: usize,
    src_addr: *mut fi_addr_t,
    cond: *const c_void,
    timeout: c_int,
) -> isize {
    call_op!(
        unsafe { (*cq).ops },
        sreadfrom(cq, buf, count, src_addr, cond, timeout)
    )
}

/// `fi_cq_signal`.
///
/// # Safety
/// `cq` is open.
pub unsafe fn fi_cq_signal(cq: *mut fid_cq) -> c_int {
    call_op!(unsafe { (*cq).ops }, signal(cq))
}

/// `fi_cq_strerror`.
///
/// # Safety
/// `cq` is open; `buf` (if not null) has `len` bytes of room.
pub unsafe fn fi_cq_strerror(
    cq: *mut fid_cq,
    prov_errno: c_int,
    err_data: *const c_void,
    buf: *mut c_char,
    len: usize,
) -> *const c_char {
    call_op!(
        unsafe { (*cq).ops },
        strerror(cq, prov_errno, err_data, buf, len)
    )
}

/// `fi_cntr_read`.
///
/// # Safety
/// `cntr` is open.
pub unsafe fn fi_cntr_read(cntr: *mut fid_cntr) -> u64 {
    call_op!(unsafe { (*cntr).ops }, read(cntr))
}

/// `fi_cntr_readerr`.
///
/// # Safety
/// `cntr` is open.
pub unsafe fn fi_cntr_readerr(cntr: *mut fid_cntr) -> u64 {
    call_op!(unsafe { (*cntr).ops }, readerr(cntr))
}

/// `fi_cntr_add`.
///
/// # Safety
/// `cntr` is open.
pub unsafe fn fi_cntr_add(cntr: *mut fid_cntr, value: u64) -> c_int {
    call_op!(unsafe { (*cntr).ops }, add(cntr, value))
}

/// `fi_cntr_adderr`.
///
/// # Safety
/// `cntr` is open.
pub unsafe fn fi_cntr_adderr(cntr: *mut fid_cntr, value: u64) -> c_int {
    call_checked_op!(unsafe { (*cntr).ops }, fi_ops_cntr, adderr(cntr, value))
}

/// `fi_cntr_set`.
///
/// # Safety
/// `cntr` is open.
pub unsafe fn fi_cntr_set(cntr: *mut fid_cntr, value: u64) -> c_int {
    call_op!(unsafe { (*cntr).ops }, set(cntr, value))
}

/// `fi_cntr_seterr`.
///
/// # Safety
/// `cntr` is open.
pub unsafe fn fi_cntr_seterr(cntr: *mut fid_cntr, value: u64) -> c_int {
    call_checked_op!(unsafe { (*cntr).ops }, fi_ops_cntr, seterr(cntr, value))
}

/// `fi_cntr_wait`.
///
/// # Safety
/// `cntr` is open and has a wait object.
pub unsafe fn fi_cntr_wait(cntr: *mut fid_cntr, threshold: u64, timeout: c_int) -> c_int {
    call_op!(unsafe { (*cntr).ops }, wait(cntr, threshold, timeout))
}
