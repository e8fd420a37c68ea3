//! The node's PMIx server as its NM sees it: the `storm-pmix` helper (see the `storm-pmix`
//! crate), started and spoken to here. This is host code: a thread reads what the helper
//! says and hands it to the PMI thread ([`crate::pmi::service`]) as [`PmixEvent`]s, where
//! the job cores decide.
//!
//! The attacker here is a local user: the helper takes TCP connections from any process on
//! the node, and parses them in C. So the helper runs apart from the NM, as `nobody` when
//! the NM is root (`[cluster] pmix_user`; a job of that account gets no PMIx), with a directory of
//! its own; it checks each client's MUNGE credential against the account its job runs as
//! (`[cluster] pmix`); and the NM takes what it says as claims: each message bounded, read
//! without panicking, and acted on only for a job the NM registered with it and a rank of
//! that job on this node.

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use storm_cluster::config::PmixSecurity;
use storm_cluster::daemon_dir::DaemonDir;
use storm_cluster::messages::RankEnd;
use storm_pmix::wire::{EnvVar, Event, JobInfo, Request, WireError, read_frame, write_frame};

/// What the helper said a job's clients did, for the PMI thread. Each carries what answers
/// the client's waiting call, once the PMI thread has taken it.
pub enum PmixEvent {
    /// A client of job `nspace` connected.
    Connected {
        nspace: String,
        rank: u32,
        done: OpDone,
    },
    /// It finalized.
    Finalized {
        nspace: String,
        rank: u32,
        done: OpDone,
    },
    /// It called `PMIx_Abort`.
    Abort {
        nspace: String,
        rank: u32,
        status: i32,
        message: String,
        done: OpDone,
    },
    /// Every local client of job `nspace` is in a fence: this node's collected data; the
    /// fence's result goes to `done`.
    Fence {
        nspace: String,
        data: Vec<u8>,
        done: FenceDone,
    },
    /// The same, with more data than one node may give a fence (`bytes`).
    FenceTooLarge {
        nspace: String,
        bytes: u64,
        done: FenceDone,
    },
    /// The helper runs: what the PMI thread sends it of its own accord goes through `tx`
    /// (the first event).
    Started { tx: HelperTx },
    /// A client of job `nspace` wants the data of rank `rank`, which runs on another node
    /// (a direct modex); the data goes to `done`.
    DirectModex {
        nspace: String,
        rank: u32,
        done: ModexDone,
    },
    /// The data of local rank `rank` asked for with [`HelperTx::serve_modex`].
    ModexData {
        nspace: String,
        rank: u32,
        result: Result<Vec<u8>, String>,
    },
}

/// The PMI thread's way to the helper.
#[derive(Clone)]
pub struct HelperTx {
    link: Arc<Mutex<UnixStream>>,
}

impl HelperTx {
    /// Asks for the data local rank `rank` of job `nspace` commits
    /// ([`PmixEvent::ModexData`]).
    pub fn serve_modex(&self, nspace: &str, rank: u32) {
        send(
            &self.link,
            &Request::ServeModex {
                nspace: nspace.to_string(),
                rank,
            },
        );
    }

    /// Tells job `nspace`'s local clients that its rank `end.rank` ended.
    pub fn notify(&self, nspace: &str, end: RankEnd) {
        send(
            &self.link,
            &Request::Notify {
                nspace: nspace.to_string(),
                rank: end.rank,
                status: end.status,
                exit_code: end.exit_code,
            },
        );
    }
}

/// A direct modex the helper waits on: completed once, with the remote rank's data.
pub struct ModexDone {
    id: u64,
    link: Arc<Mutex<UnixStream>>,
}

impl ModexDone {
    pub fn complete(self, result: Result<Vec<u8>, String>) {
        send(
            &self.link,
            &Request::ModexResult {
                id: self.id,
                result,
            },
        );
    }
}

/// A fence the helper waits on: completed once, with the fence's result.
pub struct FenceDone {
    id: u64,
    link: Arc<Mutex<UnixStream>>,
}

impl FenceDone {
    /// Sends the fence's result (every node's data in node order, or why it failed).
    pub fn complete(self, result: Result<Vec<u8>, String>) {
        send(
            &self.link,
            &Request::FenceResult {
                id: self.id,
                result,
            },
        );
    }
}

/// A client's call (connect, finalize, abort) the helper holds until the NM has taken it.
pub struct OpDone {
    id: u64,
    link: Arc<Mutex<UnixStream>>,
}

impl OpDone {
    /// Lets the client's call return.
    pub fn complete(self) {
        if self.id != 0 {
            send(&self.link, &Request::Done { id: self.id });
        }
    }
}

fn send(link: &Mutex<UnixStream>, request: &Request) {
    let mut w = link.lock().unwrap_or_else(|p| p.into_inner());
    if let Err(e) = write_frame(&mut *w, request) {
        tracing::warn!("the PMIx helper did not take an answer: {e}");
    }
}

/// How long the helper has to start, to register a job, or to take a message.
const HELPER_WAIT: Duration = Duration::from_secs(10);

/// What the NM starts its helper with.
pub struct PmixSettings {
    /// The `storm-pmix` binary.
    pub helper: PathBuf,
    pub security: PmixSecurity,
    /// The account the helper runs as when the NM is root (`[cluster] pmix_user`).
    pub user: String,
    /// The node's name.
    pub node: String,
    /// The jobs' scratch root: the helper's directory (`pmix`) is made in it.
    pub root: DaemonDir,
    /// The bytes of one node's PMI puts to one fence, and of a job's whole key space
    /// (`[cluster] pmi_node_bytes`, `pmi_job_bytes`): they bound the messages either way.
    pub node_bytes: usize,
    pub job_bytes: usize,
}

/// The helper's answer to a registration: the job's namespace, and each rank's variables or
/// why not.
type Registered = (String, Result<Vec<Vec<EnvVar>>, String>);

/// The helper's directory in the scratch root.
const HELPER_DIR: &str = "pmix";

/// A running helper.
pub struct PmixLink {
    writer: Arc<Mutex<UnixStream>>,
    replies: Receiver<Registered>,
    child: Child,
    /// The account the helper runs as, when the NM is root: no job of it is served.
    helper_account: Option<u32>,
    root: DaemonDir,
    version: String,
}

impl PmixLink {
    /// Starts the helper and waits until its server runs; its events go to `events`, each
    /// waking the PMI thread through `wake`.
    pub fn start(
        settings: PmixSettings,
        events: Sender<PmixEvent>,
        wake: Arc<OwnedFd>,
    ) -> Result<Self, String> {
        let PmixSettings {
            helper,
            security,
            user,
            node,
            root,
            node_bytes,
            job_bytes,
        } = settings;
        let security = match security {
            PmixSecurity::Off => return Err("[cluster] pmix = \"off\"".into()),
            PmixSecurity::Munge => "munge",
            PmixSecurity::Native => "native",
        };
        if !helper.is_file() {
            return Err(format!("{} is not installed", helper.display()));
        }
        let account = if nix::unistd::geteuid().is_root() {
            Some(helper_account(&user)?)
        } else {
            None
        };
        let dir = root
            .subdir(HELPER_DIR, 0o700)
            .map_err(|e| format!("the helper's directory: {e}"))?;
        if let Some((uid, gid)) = account {
            dir.give_to(uid, gid, 0o700)
                .map_err(|e| format!("giving {} to the helper: {e}", dir.path().display()))?;
        }
        let (ours, theirs) = UnixStream::pair().map_err(|e| format!("a socket pair: {e}"))?;
        let mut cmd = Command::new(&helper);
        cmd.arg("--tmpdir")
            .arg(dir.path())
            .args(["--node", &node, "--security", security])
            .arg("--max-request")
            .arg((job_bytes + (1 << 20)).to_string())
            .arg("--max-fence-bytes")
            .arg(node_bytes.to_string())
            .env_clear()
            .stdin(Stdio::from(OwnedFd::from(theirs)))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        for var in ["RUST_LOG", "PATH"] {
            if let Some(v) = std::env::var_os(var) {
                cmd.env(var, v);
            }
        }
        if let Some((uid, gid)) = account {
            // std drops the supplementary groups when root sets a uid.
            cmd.uid(uid).gid(gid);
        }
        // SAFETY: prctl only, between fork and exec: the helper dies with the NM.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .map_err(|e| format!("starting {}: {e}", helper.display()))?;
        let mut reader = ours.try_clone().map_err(|e| e.to_string())?;
        let _ = ours.set_write_timeout(Some(HELPER_WAIT));
        let mut link = Self {
            writer: Arc::new(Mutex::new(ours)),
            replies: crossbeam_channel::never(),
            child,
            helper_account: account.map(|(uid, _)| uid),
            root,
            version: String::new(),
        };
        // Its first word: whether the server runs.
        let _ = reader.set_read_timeout(Some(HELPER_WAIT));
        let max_event = node_bytes + (1 << 20);
        match read_frame::<Event>(&mut reader, max_event) {
            Ok(Event::Ready { version }) => link.version = version,
            Ok(Event::Failed { why }) => return Err(why),
            Ok(other) => return Err(format!("the helper began with {other:?}")),
            Err(e) => return Err(format!("the helper did not start: {e}")),
        }
        let _ = reader.set_read_timeout(None);
        let (reply_tx, reply_rx) = crossbeam_channel::bounded(4);
        link.replies = reply_rx;
        let writer = link.writer.clone();
        std::thread::Builder::new()
            .name(format!("storm-pmix-{node}"))
            .spawn(move || read_events(reader, max_event, events, reply_tx, wake, writer))
            .map_err(|e| format!("the PMIx reader thread: {e}"))?;
        Ok(link)
    }

    /// The helper's library's version.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// Registers `job` and its local `ranks` with the helper; gives each rank's additions to
    /// its environment, in `ranks`' order.
    pub fn register(
        &self,
        job: JobInfo,
        ranks: &[u32],
    ) -> Result<Vec<Vec<(OsString, OsString)>>, String> {
        if self.helper_account == Some(job.uid) {
            return Err(format!(
                "the job runs as uid {}, the PMIx helper's own account",
                job.uid
            ));
        }
        let nspace = job.nspace.clone();
        {
            let mut w = self.writer.lock().unwrap_or_else(|p| p.into_inner());
            write_frame(
                &mut *w,
                &Request::Register {
                    job,
                    ranks: ranks.to_vec(),
                },
            )
            .map_err(|e| format!("the PMIx helper: {e}"))?;
        }
        loop {
            match self.replies.recv_timeout(HELPER_WAIT) {
                Ok((n, result)) if n == nspace => {
                    let envs = result?;
                    if envs.len() != ranks.len() {
                        return Err(format!(
                            "the PMIx helper answered for {} ranks, not {}",
                            envs.len(),
                            ranks.len()
                        ));
                    }
                    return Ok(envs
                        .into_iter()
                        .map(|vars| {
                            vars.into_iter()
                                .map(|(k, v)| (OsString::from_vec(k), OsString::from_vec(v)))
                                .collect()
                        })
                        .collect());
                }
                // An answer to an earlier registration that timed out.
                Ok(_) => continue,
                Err(_) => return Err("the PMIx helper did not answer".into()),
            }
        }
    }

    /// Forgets job `nspace`.
    pub fn deregister(&self, nspace: &str) {
        let mut w = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = write_frame(
            &mut *w,
            &Request::Deregister {
                nspace: nspace.to_string(),
            },
        ) {
            tracing::warn!("the PMIx helper: {e}");
        }
    }
}

/// The helper stops with its NM, and its directory goes.
impl Drop for PmixLink {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Err(e) = self.root.remove_tree(HELPER_DIR) {
            tracing::warn!("removing the PMIx helper's directory: {e}");
        }
    }
}

/// Account `name`'s user and group; never root's.
fn helper_account(name: &str) -> Result<(u32, u32), String> {
    match nix::unistd::User::from_name(name) {
        Ok(Some(u)) if u.uid.is_root() || u.gid.as_raw() == 0 => Err(format!(
            "[cluster] pmix_user {name:?} is root's account or group: the helper never runs so"
        )),
        Ok(Some(u)) => Ok((u.uid.as_raw(), u.gid.as_raw())),
        Ok(None) => Err(format!(
            "[cluster] pmix_user {name:?}: no such account on this node"
        )),
        Err(e) => Err(format!("[cluster] pmix_user {name:?}: {e}")),
    }
}

/// The reader thread: what the helper says, until it stops.
fn read_events(
    mut reader: UnixStream,
    max: usize,
    events: Sender<PmixEvent>,
    replies: Sender<Registered>,
    wake: Arc<OwnedFd>,
    writer: Arc<Mutex<UnixStream>>,
) {
    let op = |id| OpDone {
        id,
        link: writer.clone(),
    };
    let fence = |id| FenceDone {
        id,
        link: writer.clone(),
    };
    let started = PmixEvent::Started {
        tx: HelperTx {
            link: writer.clone(),
        },
    };
    if events.send(started).is_err() {
        return;
    }
    loop {
        let event = match read_frame::<Event>(&mut reader, max) {
            Ok(e) => e,
            Err(WireError::Closed) => {
                tracing::warn!("the PMIx helper stopped: PMIx is no longer served here");
                return;
            }
            Err(e) => {
                tracing::error!("the PMIx helper's link: {e}; PMIx is no longer served here");
                return;
            }
        };
        let event = match event {
            Event::Registered { nspace, result } => {
                let _ = replies.try_send((nspace, result));
                continue;
            }
            Event::Ready { .. } | Event::Failed { .. } => continue,
            Event::Connected { nspace, rank, id } => PmixEvent::Connected {
                nspace,
                rank,
                done: op(id),
            },
            Event::Finalized { nspace, rank, id } => PmixEvent::Finalized {
                nspace,
                rank,
                done: op(id),
            },
            Event::Abort {
                nspace,
                rank,
                status,
                message,
                id,
            } => PmixEvent::Abort {
                nspace,
                rank,
                status,
                message,
                done: op(id),
            },
            Event::Fence { id, nspace, data } => PmixEvent::Fence {
                nspace,
                data,
                done: fence(id),
            },
            Event::FenceTooLarge { id, nspace, bytes } => PmixEvent::FenceTooLarge {
                nspace,
                bytes,
                done: fence(id),
            },
            Event::DirectModex { id, nspace, rank } => PmixEvent::DirectModex {
                nspace,
                rank,
                done: ModexDone {
                    id,
                    link: writer.clone(),
                },
            },
            Event::ModexData {
                nspace,
                rank,
                result,
            } => PmixEvent::ModexData {
                nspace,
                rank,
                result,
            },
        };
        if events.send(event).is_err() {
            return;
        }
        let _ = nix::unistd::write(&*wake, &[1]);
    }
}
