//! `rdma/fabric.h`: closing, controlling and aliasing any object.

use std::ffi::{c_char, c_int, c_void};

use crate::bindings::*;

/// `fi_close`.
///
/// # Safety
/// `fid` is an open libfabric object, not used again.
pub unsafe fn fi_close(fid: *mut fid) -> c_int {
    call_op!(unsafe { (*fid).ops }, close(fid))
}

/// `fi_control`.
///
/// # Safety
/// `fid` is an open object; `arg` is what `command` expects.
pub unsafe fn fi_control(fid: *mut fid, command: c_int, arg: *mut c_void) -> c_int {
    call_op!(unsafe { (*fid).ops }, control(fid, command, arg))
}

/// `fi_alias`.
///
/// # Safety
/// As [`fi_control`]; `alias_fid` receives the alias.
pub unsafe fn fi_alias(fid: *mut fid, alias_fid: *mut *mut fid, flags: u64) -> c_int {
    let mut alias = fi_alias {
        fid: alias_fid,
        flags,
    };
    unsafe { fi_control(fid, FI_ALIAS as c_int, (&raw mut alias).cast()) }
}

/// `fi_get_val`.
///
/// # Safety
/// As [`fi_control`]; `val` has room for the value `name` names.
pub unsafe fn fi_get_val(fid: *mut fid, name: c_int, val: *mut c_void) -> c_int {
    let mut var = fi_fid_var { name, val };
    unsafe { fi_control(fid, FI_GET_VAL as c_int, (&raw mut var).cast()) }
}

/// `fi_set_val`.
///
/// # Safety
/// As [`fi_control`]; `val` holds the value `name` names.
pub unsafe fn fi_set_val(fid: *mut fid, name: c_int, val: *mut c_void) -> c_int {
    let mut var = fi_fid_var { name, val };
    unsafe { fi_control(fid, FI_SET_VAL as c_int, (&raw mut var).cast()) }
}

/// `fi_open_ops`.
///
/// # Safety
/// `fid` is an open object; `ops` receives the named extension's table.
pub unsafe fn fi_open_ops(
    fid: *mut fid,
    name: *const c_char,
    flags: u64,
    ops: *mut *mut c_void,
    context: *mut c_void,
) -> c_int {
    call_op!(
        unsafe { (*fid).ops },
        ops_open(fid, name, flags, ops, context)
    )
}

/// `fi_set_ops`.
///
/// # Safety
/// `fid` is an open object; `ops` is the named extension's table.
pub unsafe fn fi_set_ops(
    fid: *mut fid,
    name: *const c_char,
    flags: u64,
    ops: *mut c_void,
    context: *mut c_void,
) -> c_int {
    call_checked_op!(
        unsafe { (*fid).ops },
        fi_ops,
        ops_set(fid, name, flags, ops, context)
    )
}

/// `fi_tc_dscp_set`: a traffic class carrying a DSCP value.
pub fn fi_tc_dscp_set(dscp: u8) -> u32 {
    dscp as u32 | FI_TC_DSCP
}

/// `fi_tc_dscp_get`: the DSCP value of a traffic class, or 0.
pub fn fi_tc_dscp_get(tclass: u32) -> u8 {
    if tclass & FI_TC_DSCP != 0 {
        tclass as u8
    } else {
        0
    }
}
