//! `storm-pmix`: the node's PMIx server, started by its node manager (never by hand).
//!
//! Its standard input is a Unix stream socket to the NM, both ways ([`storm_pmix::wire`]):
//! it reads requests (register a job, forget one, a fence's result) and writes what the
//! library's clients did. When the NM closes its end, the helper exits. It refuses to run as
//! root: it parses what any local process sends it.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, bail};
use clap::{Parser, ValueEnum};
use storm_pmix::server::Server;
use storm_pmix::wire::{Event, Request, WireError, read_frame, write_frame};

/// How a PMIx client proves which account it runs as.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum Security {
    /// A MUNGE credential, checked by the node's munged.
    Munge,
    /// The account the client says it runs as (over TCP, nothing checks it).
    Native,
}

/// The node's PMIx server, for its node manager.
#[derive(Parser, Debug)]
#[command(name = "storm-pmix", version)]
struct Args {
    /// The directory the library keeps its files in (the NM made it, this helper's own).
    #[arg(long)]
    tmpdir: PathBuf,
    /// The node's name (the server's namespace is `storm-nm.NODE`).
    #[arg(long)]
    node: String,
    /// How clients prove their account.
    #[arg(long, value_enum)]
    security: Security,
    /// The longest request the NM may send, in bytes (a fence's whole result and more).
    #[arg(long)]
    max_request: usize,
    /// The most data this node's clients may give one fence, in bytes: more is not passed
    /// on, and the NM ends the job naming the limit.
    #[arg(long)]
    max_fence_bytes: usize,
}

fn main() -> Result<()> {
    storm_cluster::daemon::init_logging();
    let args = Args::parse();
    if nix::unistd::geteuid().is_root() {
        bail!("storm-pmix does not run as root (its node manager starts it as nobody)");
    }
    // No process of the same account may trace it or read its memory.
    // SAFETY: prctl with an integer argument.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        bail!(
            "prctl(PR_SET_DUMPABLE): {}",
            std::io::Error::last_os_error()
        );
    }
    let stdin: OwnedFd = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .context("standard input")?;
    let link = UnixStream::from(stdin);
    let mut reader = link.try_clone().context("the link to the NM")?;
    let writer = Arc::new(Mutex::new(link));
    let psec = match args.security {
        Security::Munge => "munge",
        Security::Native => "native",
    };
    // SAFETY: no other thread runs yet (the library starts its own in Server::start). Only
    // the chosen check is loaded: the library lets a client pick among those loaded. Job
    // data goes over the socket, never through shared-memory files.
    unsafe {
        std::env::set_var("PMIX_MCA_psec", psec);
        std::env::set_var("PMIX_MCA_gds", "hash");
    }
    let sink_writer = writer.clone();
    let sink = Box::new(move |event: Event| {
        let mut w = sink_writer.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = write_frame(&mut *w, &event) {
            tracing::warn!("the NM did not take a PMIx event: {e}");
        }
    });
    let send = |event: Event| -> Result<()> {
        let mut w = writer.lock().unwrap_or_else(|p| p.into_inner());
        write_frame(&mut *w, &event).context("writing to the NM")
    };
    let server = match Server::start(&args.tmpdir, &args.node, args.max_fence_bytes, sink) {
        Ok(s) => s,
        Err(why) => {
            let why = match args.security {
                Security::Munge => {
                    format!("{why} (with [cluster] pmix = \"munge\", munged must run on the node)")
                }
                Security::Native => why,
            };
            send(Event::Failed { why: why.clone() })?;
            bail!(why);
        }
    };
    let version = server.version();
    tracing::info!(%version, security = psec, "PMIx server started");
    send(Event::Ready { version })?;
    loop {
        match read_frame::<Request>(&mut reader, args.max_request) {
            Ok(Request::Register { job, ranks }) => {
                let result = server.register(&job, &ranks);
                send(Event::Registered {
                    nspace: job.nspace,
                    result,
                })?;
            }
            Ok(Request::Deregister { nspace }) => server.deregister(&nspace),
            Ok(Request::FenceResult { id, result }) => server.complete_fence(id, result),
            Ok(Request::Done { id }) => server.complete_op(id),
            Ok(Request::ModexResult { id, result }) => server.complete_modex(id, result),
            Ok(Request::ServeModex { nspace, rank }) => server.serve_modex(&nspace, rank),
            Ok(Request::Notify {
                nspace,
                rank,
                status,
                exit_code,
            }) => {
                if let Err(why) = server.notify(&nspace, rank, status, exit_code) {
                    tracing::warn!(%nspace, rank, "cannot raise a rank's end: {why}");
                }
            }
            Err(WireError::Closed) => return Ok(()),
            Err(e) => bail!("the NM's link: {e}"),
        }
    }
}
