//! `rdma/fi_domain.h`: domains, memory registration, address vectors, and the objects a
//! domain opens (completion queues, counters, wait and poll sets).

use std::ffi::{c_char, c_int, c_void};

use crate::bindings::*;

/// `fi_domain`.
///
/// # Safety
/// `fabric` is open; `info` comes from `fi_getinfo`; `domain` receives the new domain.
pub unsafe fn fi_domain(
    fabric: *mut fid_fabric,
    info: *mut fi_info,
    domain: *mut *mut fid_domain,
    context: *mut c_void,
) -> c_int {
    call_op!(
        unsafe { (*fabric).ops },
        domain(fabric, info, domain, context)
    )
}

/// `fi_domain2`.
///
/// # Safety
/// As [`fi_domain`].
pub unsafe fn fi_domain2(
    fabric: *mut fid_fabric,
    info: *mut fi_info,
    domain: *mut *mut fid_domain,
    flags: u64,
    context: *mut c_void,
) -> c_int {
    if flags == 0 {
        return unsafe { fi_domain(fabric, info, domain, context) };
    }
    call_checked_op!(
        unsafe { (*fabric).ops },
        fi_ops_fabric,
        domain2(fabric, info, domain, flags, context)
    )
}

/// `fi_domain_bind`.
///
/// # Safety
/// `domain` and `fid` are open.
pub unsafe fn fi_domain_bind(domain: *mut fid_domain, fid: *mut fid, flags: u64) -> c_int {
    let dfid = unsafe { &raw mut (*domain).fid };
    call_op!(unsafe { (*dfid).ops }, bind(dfid, fid, flags))
}

/// `fi_cq_open`.
///
/// # Safety
/// `domain` is open; `cq` receives the completion queue.
pub unsafe fn fi_cq_open(
    domain: *mut fid_domain,
    attr: *mut fi_cq_attr,
    cq: *mut *mut fid_cq,
    context: *mut c_void,
) -> c_int {
    call_op!(unsafe { (*domain).ops }, cq_open(domain, attr, cq, context))
}

/// `fi_cntr_open`.
///
/// # Safety
/// `domain` is open; `cntr` receives the counter.
pub unsafe fn fi_cntr_open(
    domain: *mut fid_domain,
    attr: *mut fi_cntr_attr,
    cntr: *mut *mut fid_cntr,
    context: *mut c_void,
) -> c_int {
    call_op!(
        unsafe { (*domain).ops },
        cntr_open(domain, attr, cntr, context)
    )
}

/// `fi_wait_open`.
///
/// # Safety
/// `fabric` is open; `waitset` receives the wait set.
pub unsafe fn fi_wait_open(
    fabric: *mut fid_fabric,
    attr: *mut fi_wait_attr,
    waitset: *mut *mut fid_wait,
) -> c_int {
    call_op!(unsafe { (*fabric).ops }, wait_open(fabric, attr, waitset))
}

/// `fi_poll_open`.
///
/// # Safety
/// `domain` is open; `pollset` receives the poll set.
pub unsafe fn fi_poll_open(
    domain: *mut fid_domain,
    attr: *mut fi_poll_attr,
    pollset: *mut *mut fid_poll,
) -> c_int {
    call_op!(unsafe { (*domain).ops }, poll_open(domain, attr, pollset))
}

/// `fi_mr_reg`.
///
/// # Safety
/// `domain` is open; `buf..buf+len` stays valid while registered; `mr` receives the region.
#[allow(clippy::too_many_arguments)]
pub unsafe fn fi_mr_reg(
    domain: *mut fid_domain,
    buf: *const c_void,
    len: usize,
    acs: u64,
    offset: u64,
    requested_key: u64,
    flags: u64,
    mr: *mut *mut fid_mr,
    context: *mut c_void,
) -> c_int {
    let dfid = unsafe { &raw mut (*domain).fid };
    call_op!(
        unsafe { (*domain).mr },
        reg(
            dfid,
            buf,
            len,
            acs,
            offset,
            requested_key,
            flags,
            mr,
            context
        )
    )
}

/// `fi_mr_regv`.
///
/// # Safety
/// As [`fi_mr_reg`], for `count` buffers.
#[allow(clippy::too_many_arguments)]
pub unsafe fn fi_mr_regv(
    domain: *mut fid_domain,
    iov: *const iovec,
    count: usize,
    acs: u64,
    offset: u64,
    requested_key: u64,
    flags: u64,
    mr: *mut *mut fid_mr,
    context: *mut c_void,
) -> c_int {
    let dfid = unsafe { &raw mut (*domain).fid };
    call_op!(
        unsafe { (*domain).mr },
        regv(
            dfid,
            iov,
            count,
            acs,
            offset,
            requested_key,
            flags,
            mr,
            context
        )
    )
}

/// `fi_mr_regattr`.
///
/// # Safety
/// As [`fi_mr_reg`], with the buffers in `attr`.
pub unsafe fn fi_mr_regattr(
    domain: *mut fid_domain,
    attr: *const fi_mr_attr,
    flags: u64,
    mr: *mut *mut fid_mr,
) -> c_int {
    let dfid = unsafe { &raw mut (*domain).fid };
    call_op!(unsafe { (*domain).mr }, regattr(dfid, attr, flags, mr))
}

/// `fi_mr_desc`: the local descriptor of a registration.
///
/// # Safety
/// `mr` is an open registration.
pub unsafe fn fi_mr_desc(mr: *mut fid_mr) -> *mut c_void {
    unsafe { (*mr).mem_desc }
}

/// `fi_mr_key`: the key peers use to reach a registration.
///
/// # Safety
/// `mr` is an open registration.
pub unsafe fn fi_mr_key(mr: *mut fid_mr) -> u64 {
    unsafe { (*mr).key }
}

/// `fi_mr_raw_attr`.
///
/// # Safety
/// `mr` is open; the out-pointers have room for the raw key.
pub unsafe fn fi_mr_raw_attr(
    mr: *mut fid_mr,
    base_addr: *mut u64,
    raw_key: *mut u8,
    key_size: *mut usize,
    flags: u64,
) -> c_int {
    let mut attr = fi_mr_raw_attr {
        flags,
        base_addr,
        raw_key,
        key_size,
    };
    let fid = unsafe { &raw mut (*mr).fid };
    call_op!(
        unsafe { (*fid).ops },
        control(fid, FI_GET_RAW_MR as c_int, (&raw mut attr).cast())
    )
}

/// `fi_mr_map_raw`.
///
/// # Safety
/// `domain` is open; `raw_key` holds `key_size` bytes; `key` receives the mapped key.
pub unsafe fn fi_mr_map_raw(
    domain: *mut fid_domain,
    base_addr: u64,
    raw_key: *mut u8,
    key_size: usize,
    key: *mut u64,
    flags: u64,
) -> c_int {
    let mut map = fi_mr_map_raw {
        flags,
        base_addr,
        raw_key,
        key_size,
        key,
    };
    let dfid = unsafe { &raw mut (*domain).fid };
    call_op!(
        unsafe { (*dfid).ops },
        control(dfid, FI_MAP_RAW_MR as c_int, (&raw mut map).cast())
    )
}

/// `fi_mr_unmap_key`.
///
/// # Safety
/// `domain` is open.
pub unsafe fn fi_mr_unmap_key(domain: *mut fid_domain, mut key: u64) -> c_int {
    let dfid = unsafe { &raw mut (*domain).fid };
    call_op!(
        unsafe { (*dfid).ops },
        control(dfid, FI_UNMAP_KEY as c_int, (&raw mut key).cast())
    )
}

/// `fi_mr_bind`.
///
/// # Safety
/// `mr` and `bfid` are open.
pub unsafe fn fi_mr_bind(mr: *mut fid_mr, bfid: *mut fid, flags: u64) -> c_int {
    let fid = unsafe { &raw mut (*mr).fid };
    call_op!(unsafe { (*fid).ops }, bind(fid, bfid, flags))
}

/// `fi_mr_refresh`.
///
/// # Safety
/// `mr` is open; `iov` holds `count` buffers.
pub unsafe fn fi_mr_refresh(mr: *mut fid_mr, iov: *const iovec, count: usize, flags: u64) -> c_int {
    let mut modify = fi_mr_modify {
        flags,
        ..Default::default()
    };
    modify.attr.mr_iov = iov;
    modify.attr.iov_count = count;
    let fid = unsafe { &raw mut (*mr).fid };
    call_op!(
        unsafe { (*fid).ops },
        control(fid, FI_REFRESH as c_int, (&raw mut modify).cast())
    )
}

/// `fi_mr_enable`.
///
/// # Safety
/// `mr` is open (and bound, where the provider asks for FI_MR_ENDPOINT).
pub unsafe fn fi_mr_enable(mr: *mut fid_mr) -> c_int {
    let fid = unsafe { &raw mut (*mr).fid };
    call_op!(
        unsafe { (*fid).ops },
        control(fid, FI_ENABLE as c_int, std::ptr::null_mut())
    )
}

/// `fi_av_open`.
///
/// # Safety
/// `domain` is open; `av` receives the address vector.
pub unsafe fn fi_av_open(
    domain: *mut fid_domain,
    attr: *mut fi_av_attr,
    av: *mut *mut fid_av,
    context: *mut c_void,
) -> c_int {
    call_op!(unsafe { (*domain).ops }, av_open(domain, attr, av, context))
}

/// `fi_av_bind`.
///
/// # Safety
/// `av` and `fid` are open.
pub unsafe fn fi_av_bind(av: *mut fid_av, fid: *mut fid, flags: u64) -> c_int {
    let afid = unsafe { &raw mut (*av).fid };
    call_op!(unsafe { (*afid).ops }, bind(afid, fid, flags))
}

/// `fi_av_insert`.
///
/// # Safety
/// `av` is open; `addr` holds `count` provider addresses; `fi_addr` has room for `count`.
pub unsafe fn fi_av_insert(
    av: *mut fid_av,
    addr: *const c_void,
    count: usize,
    fi_addr: *mut fi_addr_t,
    flags: u64,
    context: *mut c_void,
) -> c_int {
    call_op!(
        unsafe { (*av).ops },
        insert(av, addr, count, fi_addr, flags, context)
    )
}

/// `fi_av_insertsvc`.
///
/// # Safety
/// `av` is open; `node` and `service` are C strings; `fi_addr` has room for one address.
pub unsafe fn fi_av_insertsvc(
    av: *mut fid_av,
    node: *const c_char,
    service: *const c_char,
    fi_addr: *mut fi_addr_t,
    flags: u64,
    context: *mut c_void,
) -> c_int {
    call_op!(
        unsafe { (*av).ops },
        insertsvc(av, node, service, fi_addr, flags, context)
    )
}

/// `fi_av_insertsym`.
///
/// # Safety
/// As [`fi_av_insertsvc`], with room for `nodecnt * svccnt` addresses.
#[allow(clippy::too_many_arguments)]
pub unsafe fn fi_av_insertsym(
    av: *mut fid_av,
    node: *const c_char,
    nodecnt: usize,
    service: *const c_char,
    svccnt: usize,
    fi_addr: *mut fi_addr_t,
    flags: u64,
    context: *mut c_void,
) -> c_int {
    call_op!(
        unsafe { (*av).ops },
        insertsym(av, node, nodecnt, service, svccnt, fi_addr, flags, context)
    )
}

/// `fi_av_remove`.
///
/// # Safety
/// `av` is open; `fi_addr` holds `count` addresses.
pub unsafe fn fi_av_remove(
    av: *mut fid_av,
    fi_addr: *mut fi_addr_t,
    count: usize,
    flags: u64,
) -> c_int {
    call_op!(unsafe { (*av).ops }, remove(av, fi_addr, count, flags))
}

/// `fi_av_lookup`.
///
/// # Safety
/// `av` is open; `addr` has `*addrlen` bytes of room.
pub unsafe fn fi_av_lookup(
    av: *mut fid_av,
    fi_addr: fi_addr_t,
    addr: *mut c_void,
    addrlen: *mut usize,
) -> c_int {
    call_op!(unsafe { (*av).ops }, lookup(av, fi_addr, addr, addrlen))
}

/// `fi_av_straddr`.
///
/// # Safety
/// `av` is open; `buf` has `*len` bytes of room.
pub unsafe fn fi_av_straddr(
    av: *mut fid_av,
    addr: *const c_void,
    buf: *mut c_char,
    len: *mut usize,
) -> *const c_char {
    call_op!(unsafe { (*av).ops }, straddr(av, addr, buf, len))
}

/// `fi_rx_addr`: the address of receive context `rx_index` of a scalable endpoint.
/// (`rx_ctx_bits` of 0 or above 64 leaves the address as it is, where C would shift out of range.)
pub fn fi_rx_addr(fi_addr: fi_addr_t, rx_index: c_int, rx_ctx_bits: c_int) -> fi_addr_t {
    let shift = 64u32.wrapping_sub(rx_ctx_bits as u32);
    (rx_index as u64).checked_shl(shift).unwrap_or(0) | fi_addr
}
