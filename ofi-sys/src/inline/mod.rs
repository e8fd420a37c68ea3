//! libfabric's `static inline` calls, in Rust.
//!
//! In C each of these is one indirect call through an ops table that the provider filled in
//! (`ep->rma->write(...)`, `cq->ops->read(...)`); bindgen cannot bind them, because they are
//! not symbols of the library. They are written here under their C names, with their C
//! parameters, one module per header. The function pointers' types come from the generated
//! ops-table structs, so a call with a wrong argument type does not compile.
//!
//! Two differences from C, both where C would call through a null pointer: a missing ops
//! table or operation returns `-FI_ENOSYS` (null for calls returning a string, 0 for counter
//! reads), and operations that the headers guard with `FI_CHECK_OP` (added to a table after
//! its first version) are guarded the same way, by the table's `size`.
//!
//! `fi_allocinfo` calls an exported function and is [`crate::LibFabric::fi_allocinfo`].

/// Calls operation `$op` of the ops table `$table` (a raw pointer), or returns the "missing"
/// value of the return type when the table or the operation is absent.
macro_rules! call_op {
    ($table:expr, $op:ident ( $($arg:expr),* $(,)? )) => {{
        let table = $table;
        // SAFETY: the caller guarantees the object is open, so its ops table is the
        // provider's (or null, which is handled).
        match unsafe { table.as_ref() }.and_then(|t| t.$op) {
            // SAFETY: the provider's implementation of the operation, called with the
            // arguments the caller vouched for.
            Some(f) => unsafe { f($($arg),*) },
            None => $crate::inline::Missing::missing(),
        }
    }};
}

/// `FI_CHECK_OP(table, $ty, $op) ? table->$op(...) : -FI_ENOSYS`: for operations added to a
/// table after its first version, which an older provider's (shorter) table lacks.
macro_rules! call_checked_op {
    ($table:expr, $ty:ty, $op:ident ( $($arg:expr),* $(,)? )) => {{
        let table = $table;
        // SAFETY: as in call_op; `size` is the first field of every ops table.
        match unsafe { table.as_ref() }
            .filter(|t| t.size > ::core::mem::offset_of!($ty, $op))
            .and_then(|t| t.$op)
        {
            // SAFETY: as in call_op.
            Some(f) => unsafe { f($($arg),*) },
            None => $crate::inline::Missing::missing(),
        }
    }};
}

mod atomic;
mod cm;
mod domain;
mod endpoint;
mod eq;
mod fabric;
mod rma;
mod tagged;

pub use atomic::*;
pub use cm::*;
pub use domain::*;
pub use endpoint::*;
pub use eq::*;
pub use fabric::*;
pub use rma::*;
pub use tagged::*;

/// What a call returns when the provider does not implement the operation.
pub(crate) trait Missing {
    fn missing() -> Self;
}

impl Missing for isize {
    fn missing() -> Self {
        -(crate::FI_ENOSYS as isize)
    }
}

impl Missing for i32 {
    fn missing() -> Self {
        -crate::FI_ENOSYS
    }
}

/// Counter reads (`fi_cntr_read`, `fi_cntr_readerr`) have no error value: a provider without
/// the operation reads as 0.
impl Missing for u64 {
    fn missing() -> Self {
        0
    }
}

impl<T> Missing for *const T {
    fn missing() -> Self {
        std::ptr::null()
    }
}

/// `container_of(fid, struct fid_ep, fid)`: the endpoint whose `fid` member this is.
fn endpoint_of(fid: crate::fid_t) -> *mut crate::fid_ep {
    fid.wrapping_byte_sub(::core::mem::offset_of!(crate::fid_ep, fid))
        .cast()
}

#[cfg(test)]
mod tests {
    //! The calling convention, with fake ops tables (no libfabric needed): missing operations,
    //! `FI_CHECK_OP` guards, and arguments passed through in the headers' order.

    use std::cell::RefCell;
    use std::ffi::c_void;
    use std::ptr;

    use crate::*;

    thread_local! {
        static SEEN: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
    }

    fn record(args: &[u64]) {
        SEEN.with(|s| *s.borrow_mut() = args.to_vec());
    }

    fn seen() -> Vec<u64> {
        SEEN.with(|s| s.borrow().clone())
    }

    #[test]
    fn a_missing_table_or_operation_is_enosys_not_a_null_call() {
        let mut ep = fid_ep::default();
        let p = &raw mut ep;
        // SAFETY: a fake endpoint whose ops tables are all null.
        unsafe {
            assert_eq!(
                fi_write(p, ptr::null(), 0, ptr::null_mut(), 0, 0, 0, ptr::null_mut()),
                -(FI_ENOSYS as isize)
            );
            assert_eq!(fi_enable(p), -FI_ENOSYS);
            let mut rma = fi_ops_rma {
                size: size_of::<fi_ops_rma>(),
                ..Default::default()
            };
            (*p).rma = &raw mut rma;
            assert_eq!(
                fi_read(
                    p,
                    ptr::null_mut(),
                    0,
                    ptr::null_mut(),
                    0,
                    0,
                    0,
                    ptr::null_mut()
                ),
                -(FI_ENOSYS as isize),
                "a table without the operation"
            );
            let mut cq = fid_cq::default();
            assert_eq!(
                fi_cq_read(&raw mut cq, ptr::null_mut(), 1),
                -(FI_ENOSYS as isize)
            );
            let mut cntr = fid_cntr::default();
            assert_eq!(fi_cntr_read(&raw mut cntr), 0);
            let mut av = fid_av::default();
            assert!(
                fi_av_straddr(&raw mut av, ptr::null(), ptr::null_mut(), ptr::null_mut()).is_null()
            );
        }
    }

    unsafe extern "C" fn fake_adderr(_: *mut fid_cntr, value: u64) -> i32 {
        record(&[value]);
        0
    }

    #[test]
    fn operations_added_later_are_guarded_by_the_table_size() {
        let mut ops = fi_ops_cntr {
            size: std::mem::offset_of!(fi_ops_cntr, adderr),
            adderr: Some(fake_adderr),
            ..Default::default()
        };
        let ops = &raw mut ops;
        let mut cntr = fid_cntr {
            ops,
            ..Default::default()
        };
        // SAFETY: a fake counter whose table is too short for adderr, then long enough.
        unsafe {
            assert_eq!(
                fi_cntr_adderr(&raw mut cntr, 3),
                -FI_ENOSYS,
                "an older provider's shorter table"
            );
            (*ops).size = size_of::<fi_ops_cntr>();
            assert_eq!(fi_cntr_adderr(&raw mut cntr, 3), 0);
        }
        assert_eq!(seen(), vec![3]);
    }

    #[allow(clippy::too_many_arguments)]
    unsafe extern "C" fn fake_writedata(
        _: *mut fid_ep,
        buf: *const c_void,
        len: usize,
        desc: *mut c_void,
        data: u64,
        dest: fi_addr_t,
        addr: u64,
        key: u64,
        ctx: *mut c_void,
    ) -> isize {
        record(&[
            buf as u64,
            len as u64,
            desc as u64,
            data,
            dest,
            addr,
            key,
            ctx as u64,
        ]);
        0
    }

    #[allow(clippy::too_many_arguments)]
    unsafe extern "C" fn fake_compwrite(
        _: *mut fid_ep,
        buf: *const c_void,
        count: usize,
        desc: *mut c_void,
        compare: *const c_void,
        compare_desc: *mut c_void,
        result: *mut c_void,
        result_desc: *mut c_void,
        dest: fi_addr_t,
        addr: u64,
        key: u64,
        datatype: fi_datatype,
        op: fi_op,
        ctx: *mut c_void,
    ) -> isize {
        record(&[
            buf as u64,
            count as u64,
            desc as u64,
            compare as u64,
            compare_desc as u64,
            result as u64,
            result_desc as u64,
            dest,
            addr,
            key,
            datatype as u64,
            op as u64,
            ctx as u64,
        ]);
        0
    }

    #[allow(clippy::too_many_arguments)]
    unsafe extern "C" fn fake_readwrite(
        _: *mut fid_ep,
        buf: *const c_void,
        count: usize,
        desc: *mut c_void,
        result: *mut c_void,
        result_desc: *mut c_void,
        dest: fi_addr_t,
        addr: u64,
        key: u64,
        datatype: fi_datatype,
        op: fi_op,
        ctx: *mut c_void,
    ) -> isize {
        record(&[
            buf as u64,
            count as u64,
            desc as u64,
            result as u64,
            result_desc as u64,
            dest,
            addr,
            key,
            datatype as u64,
            op as u64,
            ctx as u64,
        ]);
        0
    }

    /// A distinct pointer-sized value per argument position.
    fn arg(i: u64) -> *mut c_void {
        (0x1000 * i) as *mut c_void
    }

    #[test]
    fn arguments_reach_the_provider_in_the_headers_order() {
        let mut rma = fi_ops_rma {
            size: size_of::<fi_ops_rma>(),
            writedata: Some(fake_writedata),
            ..Default::default()
        };
        let mut atomic = fi_ops_atomic {
            size: size_of::<fi_ops_atomic>(),
            compwrite: Some(fake_compwrite),
            readwrite: Some(fake_readwrite),
            ..Default::default()
        };
        let mut ep = fid_ep {
            rma: &raw mut rma,
            atomic: &raw mut atomic,
            ..Default::default()
        };
        let p = &raw mut ep;
        // SAFETY: fake tables whose operations only record their arguments.
        unsafe {
            fi_writedata(p, arg(1), 2, arg(3), 4, 5, 6, 7, arg(8));
            assert_eq!(seen(), vec![0x1000, 2, 0x3000, 4, 5, 6, 7, 0x8000]);
            fi_compare_atomic(
                p,
                arg(1),
                2,
                arg(3),
                arg(4),
                arg(5),
                arg(6),
                arg(7),
                8,
                9,
                10,
                FI_UINT64,
                FI_CSWAP_GE,
                arg(13),
            );
            assert_eq!(
                seen(),
                vec![
                    0x1000,
                    2,
                    0x3000,
                    0x4000,
                    0x5000,
                    0x6000,
                    0x7000,
                    8,
                    9,
                    10,
                    FI_UINT64 as u64,
                    FI_CSWAP_GE as u64,
                    0xd000
                ]
            );
            fi_fetch_atomic(
                p,
                arg(1),
                2,
                arg(3),
                arg(4),
                arg(5),
                6,
                7,
                8,
                FI_UINT32,
                FI_SUM,
                arg(11),
            );
            assert_eq!(
                seen(),
                vec![
                    0x1000,
                    2,
                    0x3000,
                    0x4000,
                    0x5000,
                    6,
                    7,
                    8,
                    FI_UINT32 as u64,
                    FI_SUM as u64,
                    0xb000
                ]
            );
        }
    }

    #[test]
    fn container_of_finds_the_endpoint_from_its_fid() {
        let mut ep = fid_ep::default();
        let fid = &raw mut ep.fid;
        assert_eq!(super::endpoint_of(fid), &raw mut ep);
    }

    #[test]
    fn rx_addr_matches_the_header_and_never_overflows() {
        assert_eq!(fi_rx_addr(5, 3, 8), (3u64 << 56) | 5);
        assert_eq!(fi_rx_addr(5, 3, 0), 5);
    }
}
