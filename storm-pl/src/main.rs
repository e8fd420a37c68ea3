//! `storm-pl`: runs one task of a job and reports how it ended (see the crate docs).
//!
//! Input: the task's [`PlSpec`] (bincode) on standard input, the NM's table on descriptor 3.
//! Standard output and error are the NM's pipes; the task inherits them. A task that cannot
//! be started gets a message on its standard error naming the node and the reason, and exit
//! code 127 (not found) or 126 (not executable), as a shell would report it.

use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitCode, Stdio};

use anyhow::{Context, Result};
use storm_cluster::messages::RankStatus;
use storm_pl::{PlSpec, PlTable, TABLE_FD};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("storm-pl: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    // Started by posix_spawn, with nothing run between fork and exec: this launcher makes
    // itself die with the NM, whose pid is its argument.
    let nm: libc::pid_t = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .context("storm-pl is started by storm-nm, with the NM's pid as its argument")?;
    storm_pl::die_with_parent(nm).context("dying with the NM (prctl)")?;
    let mut input = Vec::new();
    std::io::stdin()
        .read_to_end(&mut input)
        .context("reading the task description")?;
    let spec = PlSpec::decode(&input).map_err(anyhow::Error::msg)?;
    // SAFETY: the NM put the table on this descriptor for us, and nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(TABLE_FD) };
    nix::fcntl::fcntl(
        &fd,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    )
    .context("table descriptor")?;
    let table = PlTable::open(fd).context("opening the NM's table")?;
    let status = launch(&spec, &table);
    table.set_exited(spec.slot as usize, status)?;
    Ok(())
}

/// Makes this launcher the task's user (groups, gid, uid, in that order) when it runs as
/// root, before it looks at any path of the job: the working directory and the program are
/// then reached with the user's rights, and errors tell the user only what they could see
/// for themselves. Dying with the NM is set again, as a change of credentials clears it.
fn become_user(spec: &PlSpec) -> Result<(), (String, i32)> {
    if !nix::unistd::geteuid().is_root() || spec.uid == 0 {
        return Ok(());
    }
    let nm = nix::unistd::getppid().as_raw();
    let groups = supplementary_groups(spec.uid, spec.gid);
    let dropped = nix::unistd::setgroups(&groups)
        .and_then(|()| nix::unistd::setgid(nix::unistd::Gid::from_raw(spec.gid)))
        .and_then(|()| nix::unistd::setuid(nix::unistd::Uid::from_raw(spec.uid)));
    if let Err(e) = dropped {
        return Err((
            format!("cannot become uid {} on node {}: {e}", spec.uid, spec.node),
            126,
        ));
    }
    // The user may signal this launcher but must not trace it: it maps the NM's table of
    // every job's tasks. (The kernel already does this after setuid unless
    // fs.suid_dumpable says otherwise.) The task itself, after exec, is the user's to trace.
    // SAFETY: prctl with plain integer arguments, affecting only this process.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        return Err((format!("prctl: {}", std::io::Error::last_os_error()), 126));
    }
    storm_pl::die_with_parent(nm).map_err(|e| (format!("prctl: {e}"), 126))
}

/// Why a task could not start, as (message, exit code).
fn preflight(spec: &PlSpec) -> Result<(), (String, i32)> {
    let node = spec.node;
    match std::fs::metadata(&spec.cwd) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err((
                format!(
                    "working directory {} on node {node} is not a directory",
                    spec.cwd.display()
                ),
                127,
            ));
        }
        Err(e) => {
            return Err((
                format!(
                    "cannot use working directory {} on node {node}: {e}",
                    spec.cwd.display()
                ),
                127,
            ));
        }
    }
    let meta = std::fs::metadata(&spec.program).map_err(|e| {
        (
            format!(
                "cannot execute {} on node {node}: {e}",
                spec.program.display()
            ),
            127,
        )
    })?;
    if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
        return Err((
            format!(
                "cannot execute {} on node {node}: not an executable file",
                spec.program.display()
            ),
            126,
        ));
    }
    let me = nix::unistd::geteuid().as_raw();
    if me != 0 && me != spec.uid {
        return Err((
            format!(
                "storm-nm on node {node} runs as uid {me} and cannot start a task as uid {}",
                spec.uid
            ),
            126,
        ));
    }
    Ok(())
}

fn launch(spec: &PlSpec, table: &PlTable) -> RankStatus {
    if let Err((message, code)) = become_user(spec).and_then(|()| preflight(spec)) {
        eprintln!("storm-pl: rank {}: {message}", spec.rank);
        return RankStatus::Exited(code);
    }
    let mut cmd = Command::new(&spec.program);
    cmd.args(&spec.args)
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&spec.cwd)
        .stdin(Stdio::null())
        .process_group(0);
    let me = std::process::id() as libc::pid_t;
    // SAFETY: die_with_parent is async-signal-safe.
    unsafe {
        cmd.pre_exec(move || storm_pl::die_with_parent(me));
    }
    // A gang switch may have stopped this job before its task exists: wait until the NM
    // lets it run, so the task never runs beside another time slot's.
    if let Err(e) = table.begin_spawn(spec.slot as usize) {
        eprintln!("storm-pl: rank {}: {e}", spec.rank);
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!(
                "storm-pl: rank {}: cannot execute {} on node {}: {e}",
                spec.rank,
                spec.program.display(),
                spec.node
            );
            return RankStatus::Exited(if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            });
        }
    };
    // The task has its PMI socket now; the NM must see it close when the task ends, not when
    // this launcher does.
    if let Some(fd) = pmi_fd(spec) {
        // SAFETY: the descriptor was put there for the task by the NM; nothing here uses it.
        unsafe { libc::close(fd) };
    }
    if let Err(e) = table.set_running(spec.slot as usize, child.id() as i32) {
        eprintln!("storm-pl: rank {}: {e}", spec.rank);
    }
    match child.wait() {
        Ok(status) => match (status.code(), status.signal()) {
            (Some(code), _) => RankStatus::Exited(code),
            (None, Some(sig)) => RankStatus::Signaled(sig),
            (None, None) => RankStatus::Exited(1),
        },
        Err(e) => {
            eprintln!("storm-pl: rank {}: lost track of the task: {e}", spec.rank);
            RankStatus::Exited(1)
        }
    }
}

/// The task's PMI socket, if the NM gave it one (`PMI_FD` in its environment).
fn pmi_fd(spec: &PlSpec) -> Option<i32> {
    spec.env
        .iter()
        .find(|(k, _)| k == "PMI_FD")
        .and_then(|(_, v)| v.parse().ok())
        .filter(|&fd| fd > 2 && fd != TABLE_FD)
}

/// The groups of user `uid` (with `gid` as primary), as `initgroups` would set them.
fn supplementary_groups(uid: u32, gid: u32) -> Vec<nix::unistd::Gid> {
    let gid = nix::unistd::Gid::from_raw(gid);
    let user = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten();
    match user.and_then(|u| std::ffi::CString::new(u.name).ok()) {
        Some(name) => nix::unistd::getgrouplist(&name, gid).unwrap_or_else(|_| vec![gid]),
        None => vec![gid],
    }
}
