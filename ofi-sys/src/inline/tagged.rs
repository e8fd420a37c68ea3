//! `rdma/fi_tagged.h`: tag-matched messages.

use std::ffi::c_void;

use crate::bindings::*;

/// `fi_trecv`.
///
/// # Safety
/// `ep` is open; `buf` stays valid for `len` bytes until the completion.
#[allow(clippy::too_many_arguments)]
pub unsafe fn fi_trecv(
    ep: *mut fid_ep,
    buf: *mut c_void,
    len: usize,
    desc: *mut c_void,
    src_addr: fi_addr_t,
    tag: u64,
    ignore: u64,
    context: *mut c_void,
) -> isize {
    call_op!(
        unsafe { (*ep).tagged },
        recv(ep, buf, len, desc, src_addr, tag, ignore, context)
    )
}

/// `fi_trecvv`.
///
/// # Safety
/// As [`fi_trecv`], for `count` buffers.
#[allow(clippy::too_many_arguments)]
pub unsafe fn fi_trecvv(
    ep: *mut fid_ep,
    iov: *const iovec,
    desc: *mut *mut c_void,
    count: usize,
    src_addr: fi_addr_t,
    tag: u64,
    ignore: u64,
    context: *mut c_void,
) -> isize {
    call_op!(
        unsafe { (*ep).tagged },
        recvv(ep, iov, desc, count, src_addr, tag, ignore, context)
    )
}

/// `fi_trecvmsg`.
///
/// # Safety
/// As [`fi_trecv`], with the buffers in `msg`.
pub unsafe fn fi_trecvmsg(ep: *mut fid_ep, msg: *const fi_msg_tagged, flags: u64) -> isize {
    call_op!(unsafe { (*ep).tagged }, recvmsg(ep, msg, flags))
}

/// `fi_tsend`.
///
/// # Safety
/// `ep` is open; `buf` stays valid for `len` bytes until the completion.
pub unsafe fn fi_tsend(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    desc: *mut c_void,
    dest_addr: fi_addr_t,
    tag: u64,
    context: *mut c_void,
) -> isize {
    call_op!(
        unsafe { (*ep).tagged },
        send(ep, buf, len, desc, dest_addr, tag, context)
    )
}

/// `fi_tsendv`.
///
/// # Safety
/// As [`fi_tsend`], for `count` buffers.
#[allow(clippy::too_many_arguments)]
pub unsafe fn fi_tsendv(
    ep: *mut fid_ep,
    iov: *const iovec,
    desc: *mut *mut c_void,
    count: usize,
    dest_addr: fi_addr_t,
    tag: u64,
    context: *mut c_void,
) -> isize {
    call_op!(
        unsafe { (*ep).tagged },
        sendv(ep, iov, desc, count, dest_addr, tag, context)
    )
}

/// `fi_tsendmsg`.
///
/// # Safety
/// As [`fi_tsend`], with the buffers in `msg`.
pub unsafe fn fi_tsendmsg(ep: *mut fid_ep, msg: *const fi_msg_tagged, flags: u64) -> isize {
    call_op!(unsafe { (*ep).tagged }, sendmsg(ep, msg, flags))
}

/// `fi_tinject`.
///
/// # Safety
/// `ep` is open; `buf` holds `len` bytes (reusable on return).
pub unsafe fn fi_tinject(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    dest_addr: fi_addr_t,
    tag: u64,
) -> isize {
    call_op!(
        unsafe { (*ep).tagged },
        inject(ep, buf, len, dest_addr, tag)
    )
}

/// `fi_tsenddata`.
///
/// # Safety
/// As [`fi_tsend`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn fi_tsenddata(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    desc: *mut c_void,
    data: u64,
    dest_addr: fi_addr_t,
    tag: u64,
    context: *mut c_void,
) -> isize {
    call_op!(
        unsafe { (*ep).tagged },
        senddata(ep, buf, len, desc, data, dest_addr, tag, context)
    )
}

/// `fi_tinjectdata`.
///
/// # Safety
/// As [`fi_tinject`].
pub unsafe fn fi_tinjectdata(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    data: u64,
    dest_addr: fi_addr_t,
    tag: u64,
) -> isize {
    call_op!(
        unsafe { (*ep).tagged },
        injectdata(ep, buf, len, data, dest_addr, tag)
    )
}
