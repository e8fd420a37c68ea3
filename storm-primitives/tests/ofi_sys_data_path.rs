//! ofi-sys's Rust versions of libfabric's `static inline` calls, on a real provider, for the
//! families the conformance suite does not reach: RMA reads and injected writes, non-fetching
//! atomics and the validity queries, counters, untagged and tagged messages, and address
//! lookups. (Writes, remote CQ data, fetch and compare atomics, CQ reads and memory
//! registration are exercised by every ofi conformance case.)
//!
//! Two endpoints of one `sockets` domain talk to each other in this process; `sockets` is the
//! provider here with counters as well as RMA, atomics, messages and tags.

#![cfg_attr(not(libfabric), allow(dead_code, unused_imports))]

use std::collections::BTreeSet;
use std::ffi::{CStr, CString, c_void};
use std::ptr;
use std::time::{Duration, Instant};

use ofi_sys::*;

/// Words of the registered region: where remote operations land, and local operands.
const TARGET: usize = 0;
const LOCAL: usize = 16;
const WORDS: usize = 64;

struct Fixture {
    lib: &'static LibFabric,
    info: *mut fi_info,
    fabric: *mut fid_fabric,
    domain: *mut fid_domain,
    cq: *mut fid_cq,
    av: *mut fid_av,
    cntr: *mut fid_cntr,
    eps: [*mut fid_ep; 2],
    addrs: [fi_addr_t; 2],
    names: [Vec<u8>; 2],
    mr: *mut fid_mr,
    mem: Box<[u64; WORDS]>,
    virt_addr: bool,
    /// Contexts of completions read but not yet waited for.
    seen: BTreeSet<usize>,
}

/// The context an operation is posted with, and which its completion names.
fn ctx(n: usize) -> *mut c_void {
    n as *mut c_void
}

fn ok(what: &str, rc: impl Into<i64>) {
    let rc = rc.into();
    assert!(rc >= 0, "{what} failed: {rc}");
}

impl Fixture {
    fn open() -> Fixture {
        // SAFETY: set before this process's first libfabric call (this test file is one
        // process with one test); sockets otherwise sleeps ~10 ms per progress pass.
        unsafe { std::env::set_var("FI_SOCKETS_PE_WAITTIME", "0") };
        let lib = library().expect("libfabric loads");
        // SAFETY: every call below follows libfabric's documented order of opening objects;
        // each pointer passed was returned by the call before it.
        unsafe {
            let hints = lib.fi_allocinfo();
            (*hints).caps = FI_MSG
                | FI_TAGGED
                | FI_RMA
                | FI_ATOMIC
                | FI_READ
                | FI_WRITE
                | FI_REMOTE_READ
                | FI_REMOTE_WRITE
                | FI_SEND
                | FI_RECV;
            (*(*hints).ep_attr).type_ = FI_EP_RDM;
            (*(*hints).domain_attr).mr_mode =
                (FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY) as i32;
            (*(*hints).fabric_attr).prov_name = libc::strdup(c"sockets".as_ptr());
            let node = CString::new("127.0.0.1").unwrap();
            let mut info = ptr::null_mut();
            ok(
                "fi_getinfo",
                (lib.fi_getinfo)(
                    STORM_FI_VERSION,
                    node.as_ptr(),
                    ptr::null(),
                    FI_SOURCE,
                    hints,
                    &mut info,
                ),
            );
            (lib.fi_freeinfo)(hints);
            let mr_mode = (*(*info).domain_attr).mr_mode as u64;
            let mut f = Fixture {
                lib,
                info,
                fabric: ptr::null_mut(),
                domain: ptr::null_mut(),
                cq: ptr::null_mut(),
                av: ptr::null_mut(),
                cntr: ptr::null_mut(),
                eps: [ptr::null_mut(); 2],
                addrs: [0; 2],
                names: [Vec::new(), Vec::new()],
                mr: ptr::null_mut(),
                mem: Box::new([0; WORDS]),
                virt_addr: mr_mode & FI_MR_VIRT_ADDR != 0,
                seen: BTreeSet::new(),
            };
            ok(
                "fi_fabric",
                (lib.fi_fabric)((*info).fabric_attr, &mut f.fabric, ptr::null_mut()),
            );
            ok(
                "fi_domain",
                fi_domain(f.fabric, info, &mut f.domain, ptr::null_mut()),
            );
            let mut cq_attr = fi_cq_attr {
                size: 64,
                format: FI_CQ_FORMAT_CONTEXT,
                wait_obj: FI_WAIT_NONE,
                ..Default::default()
            };
            ok(
                "fi_cq_open",
                fi_cq_open(f.domain, &mut cq_attr, &mut f.cq, ptr::null_mut()),
            );
            let mut av_attr = fi_av_attr {
                type_: FI_AV_TABLE,
                ..Default::default()
            };
            ok(
                "fi_av_open",
                fi_av_open(f.domain, &mut av_attr, &mut f.av, ptr::null_mut()),
            );
            let mut cntr_attr = fi_cntr_attr {
                events: FI_CNTR_EVENTS_COMP,
                ..Default::default()
            };
            ok(
                "fi_cntr_open",
                fi_cntr_open(f.domain, &mut cntr_attr, &mut f.cntr, ptr::null_mut()),
            );
            for i in 0..2 {
                ok(
                    "fi_endpoint",
                    fi_endpoint(f.domain, info, &mut f.eps[i], ptr::null_mut()),
                );
                ok(
                    "fi_ep_bind(cq)",
                    fi_ep_bind(f.eps[i], f.cq.cast(), FI_TRANSMIT | FI_RECV),
                );
                ok("fi_ep_bind(av)", fi_ep_bind(f.eps[i], f.av.cast(), 0));
            }
            // Endpoint 0's completed RMA writes count on the counter.
            ok(
                "fi_ep_bind(cntr)",
                fi_ep_bind(f.eps[0], f.cntr.cast(), FI_WRITE),
            );
            for i in 0..2 {
                ok("fi_enable", fi_enable(f.eps[i]));
                let mut name = vec![0u8; 256];
                let mut len = name.len();
                ok(
                    "fi_getname",
                    fi_getname(&raw mut (*f.eps[i]).fid, name.as_mut_ptr().cast(), &mut len),
                );
                name.truncate(len);
                let n = fi_av_insert(
                    f.av,
                    name.as_ptr().cast(),
                    1,
                    &mut f.addrs[i],
                    0,
                    ptr::null_mut(),
                );
                assert_eq!(n, 1, "fi_av_insert of endpoint {i}");
                f.names[i] = name;
            }
            let access = FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE | FI_SEND | FI_RECV;
            ok(
                "fi_mr_reg",
                fi_mr_reg(
                    f.domain,
                    f.mem.as_ptr().cast(),
                    WORDS * 8,
                    access,
                    0,
                    7,
                    0,
                    &mut f.mr,
                    ptr::null_mut(),
                ),
            );
            f
        }
    }

    /// The remote address of word `w` of the region.
    fn remote(&self, w: usize) -> u64 {
        let offset = (w * 8) as u64;
        if self.virt_addr {
            self.mem.as_ptr() as u64 + offset
        } else {
            offset
        }
    }

    fn local(&mut self, w: usize) -> *mut c_void {
        (&raw mut self.mem[w]).cast()
    }

    fn word(&self, w: usize) -> u64 {
        // SAFETY: the provider writes the region concurrently; read it as volatile.
        unsafe { ptr::read_volatile(&self.mem[w]) }
    }

    fn desc(&self) -> *mut c_void {
        // SAFETY: mr is open.
        unsafe { fi_mr_desc(self.mr) }
    }

    fn key(&self) -> u64 {
        // SAFETY: mr is open.
        unsafe { fi_mr_key(self.mr) }
    }

    /// Reads the completion queue until the operation posted with context `ctx` completed.
    fn wait(&mut self, ctx: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.seen.remove(&ctx) {
            assert!(
                Instant::now() < deadline,
                "operation {ctx} did not complete"
            );
            self.progress();
        }
    }

    /// One pass over the completion queue (also what drives a manual-progress provider).
    fn progress(&mut self) {
        let mut entries = [fi_cq_entry::default(); 8];
        // SAFETY: entries has room for 8 entries of the queue's format (FI_CQ_FORMAT_CONTEXT).
        let n = unsafe { fi_cq_read(self.cq, entries.as_mut_ptr().cast(), entries.len()) };
        if n > 0 {
            for e in &entries[..n as usize] {
                self.seen.insert(e.op_context as usize);
            }
        } else if n == -(FI_EAVAIL as isize) {
            let mut err = fi_cq_err_entry::default();
            // SAFETY: reads one error entry; fi_cq_strerror returns a string for it.
            let text = unsafe {
                fi_cq_readerr(self.cq, &mut err, 0);
                CStr::from_ptr(fi_cq_strerror(
                    self.cq,
                    err.prov_errno,
                    err.err_data,
                    ptr::null_mut(),
                    0,
                ))
                .to_string_lossy()
                .into_owned()
            };
            panic!(
                "operation {} failed: {} ({text})",
                err.op_context as usize,
                self.lib.strerror(err.err)
            );
        } else {
            assert_eq!(n, -(FI_EAGAIN as isize), "fi_cq_read");
        }
    }

    /// Retries a post while the provider answers -FI_EAGAIN.
    fn post(&mut self, what: &str, mut f: impl FnMut(&mut Self) -> isize) {
        loop {
            let rc = f(self);
            if rc == -(FI_EAGAIN as isize) {
                self.progress();
                continue;
            }
            assert_eq!(rc, 0, "{what}: {}", self.lib.strerror(-rc as i32));
            return;
        }
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        // SAFETY: reverse order of opening; every object is open and unused now.
        unsafe {
            for ep in self.eps {
                fi_close(&raw mut (*ep).fid);
            }
            for fid in [
                self.mr.cast::<fid>(),
                self.cntr.cast(),
                self.av.cast(),
                self.cq.cast(),
                self.domain.cast(),
                self.fabric.cast(),
            ] {
                fi_close(fid);
            }
            (self.lib.fi_freeinfo)(self.info);
        }
    }
}

#[test]
#[cfg_attr(
    not(libfabric),
    ignore = "libfabric is not installed (apt-get install libfabric1): the ofi-sys data-path test needs it"
)]
fn inline_calls_work_on_a_real_provider() {
    let mut f = Fixture::open();
    let (ep0, to1) = (f.eps[0], f.addrs[1]);
    let (desc, key) = (f.desc(), f.key());

    // RMA write, counted by the counter bound to endpoint 0.
    f.mem[LOCAL] = 0x1122_3344_5566_7788;
    let (src, dst) = (f.local(LOCAL), f.remote(TARGET));
    // SAFETY (every unsafe block of this test): the endpoints, region and counter are open;
    // buffers are words of the registered region, alive until the operation completes.
    f.post("fi_write", |_| unsafe {
        fi_write(ep0, src, 8, desc, to1, dst, key, ctx(1))
    });
    f.wait(1);
    assert_eq!(f.word(TARGET), 0x1122_3344_5566_7788, "fi_write landed");
    assert_eq!(unsafe { fi_cntr_read(f.cntr) }, 1, "the write was counted");
    assert_eq!(unsafe { fi_cntr_add(f.cntr, 5) }, 0);
    assert_eq!(unsafe { fi_cntr_read(f.cntr) }, 6, "fi_cntr_add");
    assert_eq!(unsafe { fi_cntr_set(f.cntr, 0) }, 0);
    assert_eq!(unsafe { fi_cntr_read(f.cntr) }, 0, "fi_cntr_set");
    let adderr = unsafe { fi_cntr_adderr(f.cntr, 2) };
    if adderr == 0 {
        assert_eq!(unsafe { fi_cntr_readerr(f.cntr) }, 2, "fi_cntr_adderr");
        assert_eq!(unsafe { fi_cntr_seterr(f.cntr, 0) }, 0);
        assert_eq!(unsafe { fi_cntr_readerr(f.cntr) }, 0, "fi_cntr_seterr");
    } else {
        assert_eq!(adderr, -FI_ENOSYS, "fi_cntr_adderr: supported or ENOSYS");
    }

    // RMA read of what was written.
    let (dst, src) = (f.local(LOCAL + 1), f.remote(TARGET));
    f.post("fi_read", |_| unsafe {
        fi_read(ep0, dst, 8, desc, to1, src, key, ctx(2))
    });
    f.wait(2);
    assert_eq!(f.word(LOCAL + 1), 0x1122_3344_5566_7788, "fi_read");

    // Injected write: no completion; seen in memory.
    f.mem[LOCAL + 2] = 99;
    let (src, dst) = (f.local(LOCAL + 2), f.remote(TARGET + 2));
    f.post("fi_inject_write", |_| unsafe {
        fi_inject_write(ep0, src, 8, to1, dst, key)
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while f.word(TARGET + 2) != 99 {
        assert!(Instant::now() < deadline, "fi_inject_write never landed");
        f.progress();
    }

    // Atomics: two sums, a fetch, a compare-and-swap, and what the endpoint supports.
    for (i, c) in [(0, 3usize), (1, 4)] {
        f.mem[LOCAL + 3 + i] = 5;
        let (src, dst) = (f.local(LOCAL + 3 + i), f.remote(TARGET + 3));
        f.post("fi_atomic", |_| unsafe {
            fi_atomic(ep0, src, 1, desc, to1, dst, key, FI_UINT64, FI_SUM, ctx(c))
        });
        f.wait(c);
    }
    assert_eq!(f.word(TARGET + 3), 10, "two fi_atomic FI_SUM of 5");
    let (operand, result, dst) = (f.local(LOCAL + 5), f.local(LOCAL + 6), f.remote(TARGET + 3));
    f.post("fi_fetch_atomic", |_| unsafe {
        fi_fetch_atomic(
            ep0,
            operand,
            1,
            desc,
            result,
            desc,
            to1,
            dst,
            key,
            FI_UINT64,
            FI_ATOMIC_READ,
            ctx(5),
        )
    });
    f.wait(5);
    assert_eq!(f.word(LOCAL + 6), 10, "fi_fetch_atomic FI_ATOMIC_READ");
    f.mem[LOCAL + 7] = 42;
    f.mem[LOCAL + 8] = 10;
    let (swap, compare, result) = (f.local(LOCAL + 7), f.local(LOCAL + 8), f.local(LOCAL + 9));
    f.post("fi_compare_atomic", |_| unsafe {
        fi_compare_atomic(
            ep0,
            swap,
            1,
            desc,
            compare,
            desc,
            result,
            desc,
            to1,
            dst,
            key,
            FI_UINT64,
            FI_CSWAP,
            ctx(6),
        )
    });
    f.wait(6);
    assert_eq!(
        f.word(LOCAL + 9),
        10,
        "fi_compare_atomic returns the old value"
    );
    assert_eq!(f.word(TARGET + 3), 42, "and swaps in the new one");
    let mut count = 0usize;
    assert_eq!(
        unsafe { fi_atomicvalid(ep0, FI_UINT64, FI_SUM, &mut count) },
        0
    );
    assert!(count >= 1, "fi_atomicvalid: FI_SUM on u64");
    count = 0;
    assert_eq!(
        unsafe { fi_fetch_atomicvalid(ep0, FI_UINT64, FI_ATOMIC_READ, &mut count) },
        0
    );
    assert!(count >= 1, "fi_fetch_atomicvalid");
    count = 0;
    assert_eq!(
        unsafe { fi_compare_atomicvalid(ep0, FI_UINT64, FI_CSWAP, &mut count) },
        0
    );
    assert!(count >= 1, "fi_compare_atomicvalid");

    // Messages: untagged, then tagged, from endpoint 0 to endpoint 1.
    let ep1 = f.eps[1];
    let from0 = f.addrs[0];
    f.mem[LOCAL + 10] = 0xabcd;
    let (buf, into) = (f.local(LOCAL + 10), f.local(LOCAL + 11));
    f.post("fi_recv", |_| unsafe {
        fi_recv(ep1, into, 8, desc, from0, ctx(7))
    });
    f.post("fi_send", |_| unsafe {
        fi_send(ep0, buf, 8, desc, to1, ctx(8))
    });
    f.wait(8);
    f.wait(7);
    assert_eq!(f.word(LOCAL + 11), 0xabcd, "fi_send / fi_recv");
    f.mem[LOCAL + 12] = 0xbeef;
    let (buf, into) = (f.local(LOCAL + 12), f.local(LOCAL + 13));
    f.post("fi_trecv", |_| unsafe {
        fi_trecv(ep1, into, 8, desc, from0, 0x77, 0, ctx(9))
    });
    f.post("fi_tsend", |_| unsafe {
        fi_tsend(ep0, buf, 8, desc, to1, 0x77, ctx(10))
    });
    f.wait(10);
    f.wait(9);
    assert_eq!(f.word(LOCAL + 13), 0xbeef, "fi_tsend / fi_trecv");

    // The address vector gives back what was inserted.
    let mut name = vec![0u8; 256];
    let mut len = name.len();
    assert_eq!(
        unsafe { fi_av_lookup(f.av, to1, name.as_mut_ptr().cast(), &mut len) },
        0
    );
    name.truncate(len);
    assert_eq!(name, f.names[1], "fi_av_lookup");
    let mut text = vec![0 as std::ffi::c_char; 128];
    let mut tlen = text.len();
    let s = unsafe { fi_av_straddr(f.av, name.as_ptr().cast(), text.as_mut_ptr(), &mut tlen) };
    assert!(!s.is_null(), "fi_av_straddr");
    let s = unsafe { CStr::from_ptr(s) }.to_string_lossy();
    assert!(
        s.contains("127.0.0.1"),
        "fi_av_straddr names the address: {s}"
    );
}
