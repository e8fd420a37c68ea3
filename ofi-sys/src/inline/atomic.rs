//! `rdma/fi_atomic.h`: network atomics (write, fetch, compare) and their validity queries.

use std::ffi::{c_int, c_void};

use crate::bindings::*;

/// `fi_atomic`.
///
/// # Safety
/// `ep` is open; `buf` holds `count` operands of `datatype` until the completion; `addr` and
/// `key` name a region registered for remote writes on `dest_addr`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn fi_atomic(
    ep: *mut fid_ep,
    buf: *const c_void,
    count: usize,
    desc: *mut c_void,
    dest_addr: fi_addr_t,
    addr: u64,
    key: u64,
    datatype: fi_datatype,
    op: fi_op,
    context: *mut c_void,
) -> isize {
    call_op!(
        unsafe { (*ep).atomic },
        write(
            ep, buf, count, desc, dest_addr, addr, key, datatype, op, context
        )
    )
}

/// `fi_atomicv`.
///
/// # Safety
/// As [`fi_atomic`], for `count` operand vectors.
#[allow(clippy::too_many_arguments)]
pub unsafe fn fi_atomicv(
    ep: *mut fid_ep,
    iov: *const fi_ioc,
    desc: *mut *mut c_void,
    count: usize,
    dest_addr: fi_addr_t,
    addr: u64,
    key: u64,
    datatype: fi_datatype,
    op: fi_op,
    context: *mut c_void,
) -> isize {
    call_op!(
        unsafe { (*ep).atomic },
        writev(
            ep, iov, desc, count, dest_addr, addr, key, datatype, op, context
        )
    )
}

/// `fi_atomicmsg`.
///
/// # Safety
/// As [`fi_atomic`], with the operands in `msg`.
pub unsafe fn fi_atomicmsg(ep: *mut fid_ep, msg: *const fi_msg_atomic, flags: u64) -> isize {
    call_op!(unsafe { (*ep).atomic }, writemsg(ep, msg, flags))
}

/// `fi_inject_atomic`.
///
/// # Safety
/// As [`fi_atomic`]; `buf` may be reused on return.
#[allow(clippy::too_many_arguments)]
pub unsafe fn fi_inject_atomic(
    ep: *mut fid_ep,
    buf: *const c_void,
    count: usize,
    dest_addr: fi_addr_t,
    addr: u64,
    key: u64,
    datatype: fi_datatype,
    op: fi_op,
) -> isize {
    call_op!(
        unsafe { (*ep).atomic },
        inject(ep, buf, count, dest_addr, addr, key, datatype, op)
    )
}

/// `fi_fetch_atomic`: an atomic that returns the remote value as it was before.
///
/// # Safety
/// As [`fi_atomic`]; `result` has room for `count` values until the completion.
#[allow(clippy::too_many_arguments)]
pub unsafe fn fi_fetch_atomic(
    ep: *mut fid_ep,
    buf: *const c_void,
    count: usize,
    desc: *mut c_void,
    result: *mut c_void,
    result_desc: *mut c_void,
    dest_addr: fi_addr_t,
    addr: u64,
    key: u64,
    datatype: fi_datatype,
    op: fi_op,
    context: *mut c_void,
) -> isize {
    call_op!(
        unsafe { (*ep).atomic },
        readwrite(
            ep,
            buf,
            count,
            desc,
            result,
            result_desc,
            dest_addr,
            addr,
            key,
            datatype,
            op,
            context
        )
    )
}

/// `fi_fetch_atomicv`.
///
/// # Safety
/// As [`fi_fetch_atomic`], for operand and result vectors.
#[allow(clippy::too_many_arguments)]
pub unsafe fn fi_fetch_atomicv(
    ep: *mut fid_ep,
    iov: *const fi_ioc,
    desc: *mut *mut c_void,
    count: usize,
    resultv: *mut fi_ioc,
    result_desc: *mut *mut c_void,
    result_count: usize,
    dest_addr: fi_addr_t,
    addr: u64,
    key: u64,
    datatype: fi_datatype,
    op: fi_op,
    context: *mut c_void,
) -> isize {
    call_op!(
        unsafe { (*ep).atomic },
        readwritev(
            ep,
            iov,
            desc,
            count,
            resultv,
            result_desc,
            result_count,
            dest_addr,
            addr,
            key,
            datatype,
            op,
            context
        )
    )
}

/// `fi_fetch_atomicmsg`.
///
/// # Safety
/// As [`fi_fetch_atomic`], with the operands in `msg`.
pub unsafe fn fi_fetch_atomicmsg(
    ep: *mut fid_ep,
    msg: *const fi_msg_atomic,
    resultv: *mut fi_ioc,
    result_desc: *mut *mut c_void,
    result_count: usize,
    flags: u64,
) -> isize {
    call_op!(
        unsafe { (*ep).atomic },
        readwritemsg(ep, msg, resultv, result_desc, result_count, flags)
    )
}

/// `fi_compare_atomic`: a compare-and-swap family operation (`FI_CSWAP`, `FI_CSWAP_NE`, ...,
/// `FI_MSWAP`) that returns the remote value as it was before.
///
/// # Safety
/// As [`fi_fetch_atomic`]; `compare` holds `count` operands until the completion.
#[allow(clippy::too_many_arguments)]
pub unsafe fn fi_compare_atomic(
    ep: *mut fid_ep,
    buf: *const c_void,
    count: usize,
    desc: *mut c_void,
    compare: *const c_void,
    compare_desc: *mut c_void,
    result: *mut c_void,
    result_desc: *mut c_void,
    dest_addr: fi_addr_t,
    addr: u64,
    key: u64,
    datatype: fi_datatype,
    op: fi_op,
    context: *mut c_void,
) -> isize {
    call_op!(
        unsafe { (*ep).atomic },
        compwrite(
            ep,
            buf,
            count,
            desc,
            compare,
            compare_desc,
            result,
            result_desc,
            dest_addr,
            addr,
            key,
            datatype,
            op,
            context
        )
    )
}

/// `fi_compare_atomicv`.
///
/// # Safety
/// As [`fi_compare_atomic`], for operand, compare and result vectors.
#[allow(clippy::too_many_arguments)]
pub unsafe fn fi_compare_atomicv(
    ep: *mut fid_ep,
    iov: *const fi_ioc,
    desc: *mut *mut c_void,
    count: usize,
    comparev: *const fi_ioc,
    compare_desc: *mut *mut c_void,
    compare_count: usize,
    resultv: *mut fi_ioc,
    result_desc: *mut *mut c_void,
    result_count: usize,
    dest_addr: fi_addr_t,
    addr: u64,
    key: u64,
    datatype: fi_datatype,
    op: fi_op,
    context: *mut c_void,
) -> isize {
    call_op!(
        unsafe { (*ep).atomic },
        compwritev(
            ep,
            iov,
            desc,
            count,
            comparev,
            compare_desc,
            compare_count,
            resultv,
            result_desc,
            result_count,
            dest_addr,
            addr,
            key,
            datatype,
            op,
            context
        )
    )
}

/// `fi_compare_atomicmsg`.
///
/// # Safety
/// As [`fi_compare_atomic`], with the operands in `msg`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn fi_compare_atomicmsg(
    ep: *mut fid_ep,
    msg: *const fi_msg_atomic,
    comparev: *const fi_ioc,
    compare_desc: *mut *mut c_void,
    compare_count: usize,
    resultv: *mut fi_ioc,
    result_desc: *mut *mut c_void,
    result_count: usize,
    flags: u64,
) -> isize {
    call_op!(
        unsafe { (*ep).atomic },
        compwritemsg(
            ep,
            msg,
            comparev,
            compare_desc,
            compare_count,
            resultv,
            result_desc,
            result_count,
            flags
        )
    )
}

/// `fi_atomicvalid`: whether the endpoint does `op` on `datatype` (and how many at once).
///
/// # Safety
/// `ep` is open; `count` receives the limit.
pub unsafe fn fi_atomicvalid(
    ep: *mut fid_ep,
    datatype: fi_datatype,
    op: fi_op,
    count: *mut usize,
) -> c_int {
    call_op!(unsafe { (*ep).atomic }, writevalid(ep, datatype, op, count))
}

/// `fi_fetch_atomicvalid`.
///
/// # Safety
/// As [`fi_atomicvalid`].
pub unsafe fn fi_fetch_atomicvalid(
    ep: *mut fid_ep,
    datatype: fi_datatype,
    op: fi_op,
    count: *mut usize,
) -> c_int {
    call_op!(
        unsafe { (*ep).atomic },
        readwritevalid(ep, datatype, op, count)
    )
}

/// `fi_compare_atomicvalid`.
///
/// # Safety
/// As [`fi_atomicvalid`].
pub unsafe fn fi_compare_atomicvalid(
    ep: *mut fid_ep,
    datatype: fi_datatype,
    op: fi_op,
    count: *mut usize,
) -> c_int {
    call_op!(
        unsafe { (*ep).atomic },
        compwritevalid(ep, datatype, op, count)
    )
}

/// `fi_query_atomic`: the domain's attributes for `op` on `datatype`.
///
/// # Safety
/// `domain` is open; `attr` receives the attributes.
pub unsafe fn fi_query_atomic(
    domain: *mut fid_domain,
    datatype: fi_datatype,
    op: fi_op,
    attr: *mut fi_atomic_attr,
    flags: u64,
) -> c_int {
    call_checked_op!(
        unsafe { (*domain).ops },
        fi_ops_domain,
        query_atomic(domain, datatype, op, attr, flags)
    )
}
