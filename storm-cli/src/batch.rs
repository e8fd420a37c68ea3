//! `storm batch SCRIPT [ARGS]`, shaped like `sbatch`: the script is sent with the job, the
//! command returns the job id at once, and the job runs without its submitter.
//!
//! Options come from three places, the later ones overriding the earlier: the script's
//! `#SBATCH` and `#STORM` lines (read up to the first command, in order), then the command
//! line. `#STORM` lines take storm's option names; `#SBATCH` lines are read for the options
//! storm shares with Slurm, and any other option on such a line is reported and ignored
//! (a script written for Slurm still runs).
//!
//! Output patterns: `%u` (user) and `%x` (job name) are replaced here; the node replaces the
//! rest (`storm_cluster::messages::BatchOutput`).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::Parser;
use storm_cluster::control::JobRequest;
use storm_cluster::messages::{BatchOutput, MpiMode};

use crate::job_options::JobShape;
use crate::submit;

/// `storm batch`'s own options.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "storm batch",
    about = "Submit a batch script: it runs on the first node of its allocation, its output \
             goes to a file, and the job goes on after you log out",
    after_help = "The script's #STORM lines take these options; its #SBATCH lines are read for \
                  the ones storm shares with Slurm. The command line overrides both."
)]
pub struct BatchArgs {
    #[command(flatten)]
    pub shape: JobShape,
    /// The script's standard output (and error, without -e): a file, relative to the working
    /// directory, in which %j is the job id, %u your user name, %x the job name, %N the node,
    /// %t the rank, %A/%a the array job and index (default: storm-%j.out).
    #[arg(short = 'o', long, value_name = "PATTERN")]
    pub output: Option<String>,
    /// The script's standard error, if not with its output.
    #[arg(short = 'e', long, value_name = "PATTERN")]
    pub error: Option<String>,
    /// A job array: one job per index (`0-99`, `1,3,5-9`, `0-15:4`), at most N running at
    /// once with `%N` (`0-99%10`); each gets STORM_ARRAY_JOB_ID and STORM_ARRAY_TASK_ID.
    #[arg(short = 'a', long, value_name = "INDICES[%N]")]
    pub array: Option<storm_cluster::control::ArraySpec>,
    /// Print only the job id.
    #[arg(long)]
    pub parsable: bool,
    /// Wait for the job to end, and exit with its exit code (as sbatch --wait). Interrupted,
    /// storm batch leaves and the job goes on.
    #[arg(short = 'W', long)]
    pub wait: bool,
    /// With --wait: if the connection to the machine manager is lost (it restarted), wait
    /// this many seconds for it to come back and follow the job on (0: give up at once).
    #[arg(long, value_name = "SECONDS", default_value_t = 60, requires = "wait")]
    pub reconnect: u64,
    /// Run this command line as the script (`#!/bin/sh` and the line, as sbatch --wrap).
    #[arg(long, value_name = "COMMAND", conflicts_with = "command")]
    pub wrap: Option<String>,
    /// The script and its arguments.
    #[arg(required_unless_present = "wrap", trailing_var_arg = true)]
    pub command: Vec<OsString>,
}

/// The script of a batch job: a file, or a command line wrapped in one (`--wrap`).
pub enum Script {
    File(PathBuf),
    Text(String),
}

/// What a script's `#STORM` and `#SBATCH` lines say.
#[derive(Debug, Default)]
pub struct Directives {
    pub shape: JobShape,
    pub output: Option<String>,
    pub error: Option<String>,
    pub array: Option<storm_cluster::control::ArraySpec>,
    /// `#SBATCH` options storm does not have, as written (reported, then ignored).
    pub ignored: Vec<String>,
}

/// Reads the directives of `script` (its text; `name` for messages): the `#STORM` and
/// `#SBATCH` lines before its first command.
pub fn read_directives(name: &str, script: &str) -> Result<Directives, String> {
    let mut out = Directives::default();
    for (i, line) in script.lines().enumerate() {
        let line = line.trim();
        if i == 0 && line.starts_with("#!") {
            continue;
        }
        let (tag, rest) = match line.split_once(char::is_whitespace) {
            Some((tag @ ("#STORM" | "#SBATCH"), rest)) => (tag, rest.trim()),
            _ if line.is_empty() || line.starts_with('#') => continue,
            // The first command ends the directives, as in sbatch.
            _ => break,
        };
        let at = || format!("{name}:{}: {tag} {rest}", i + 1);
        let words = shlex::split(rest).ok_or_else(|| format!("{}: unbalanced quotes", at()))?;
        let argv = std::iter::once("storm batch".to_string())
            .chain(words)
            .chain(["--".to_string(), "SCRIPT".to_string()]);
        match BatchArgs::try_parse_from(argv) {
            Ok(line) => {
                out.shape = line.shape.or(std::mem::take(&mut out.shape));
                out.output = line.output.or(out.output.take());
                out.error = line.error.or(out.error.take());
                out.array = line.array.or(out.array.take());
            }
            Err(e) if tag == "#SBATCH" && e.kind() == clap::error::ErrorKind::UnknownArgument => {
                out.ignored.push(format!("{tag} {rest}"));
            }
            Err(e) => {
                let first = e.to_string();
                let first = first
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .trim_start_matches("error: ");
                return Err(format!("{}: {first}", at()));
            }
        }
    }
    Ok(out)
}

/// Replaces the submitter's fields of an output pattern: `%u` (user) and `%x` (job name);
/// `%%` stays for the node to make `%`.
pub fn expand_submitter_fields(pattern: &str, user: &str, job_name: &str) -> String {
    storm_cluster::messages::expand_pattern_fields(pattern, |field| match field {
        'u' => Some(user.to_string()),
        'x' => Some(job_name.to_string()),
        _ => None,
    })
}

/// The job request for `args` run from `here`, with the script's directives applied, and
/// the script to send. `env` is the submitter's environment; `user` its user name.
pub fn request(
    args: BatchArgs,
    here: &Path,
    env: impl Iterator<Item = (OsString, OsString)>,
    user: &str,
) -> Result<(JobRequest, Script), String> {
    // A wrapped command line is named `wrap`, as sbatch names it.
    let (script, text, source) = match &args.wrap {
        Some(line) => {
            let text = format!("#!/bin/sh\n{line}\n");
            (
                here.join("wrap"),
                text.clone().into_bytes(),
                Script::Text(text),
            )
        }
        None => {
            let script = here.join(&args.command[0]);
            let text = std::fs::read(&script)
                .map_err(|e| format!("cannot read the script {}: {e}", script.display()))?;
            (script.clone(), text, Script::File(script))
        }
    };
    if !text.starts_with(b"#!") {
        return Err(format!(
            "{} does not start with #! and an interpreter (for example #!/bin/sh); storm batch \
             runs scripts",
            script.display()
        ));
    }
    let name = script.display().to_string();
    let directives = read_directives(&name, &String::from_utf8_lossy(&text))?;
    for line in &directives.ignored {
        eprintln!("storm batch: ignoring `{line}` (an option storm does not have)");
    }
    let shape = args.shape.or(directives.shape);
    let job_name = shape.job_name.clone().unwrap_or_else(|| {
        script
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    });
    let cwd = match &shape.chdir {
        Some(d) => here.join(d),
        None => here.to_path_buf(),
    };
    if !cwd.is_dir() {
        return Err(format!(
            "working directory {} does not exist",
            cwd.display()
        ));
    }
    let output = args
        .output
        .or(directives.output)
        .unwrap_or_else(|| BatchOutput::default_files().output);
    let error = args.error.or(directives.error);
    let array = args.array.or(directives.array);
    let files = BatchOutput {
        output: expand_submitter_fields(&output, user, &job_name),
        error: error.map(|e| expand_submitter_fields(&e, user, &job_name)),
    };
    let req = JobRequest {
        name: job_name,
        program: script,
        args: args.command.iter().skip(1).cloned().collect(),
        env: submit::with_umask(submit::export_env(shape.export.as_deref(), env)?),
        cwd,
        tasks: shape.tasks(),
        // sbatch copies the script at submission: later edits do not change the job.
        delivery: storm_cluster::control::Delivery::Broadcast,
        time_limit_ms: shape.time_limit_ms,
        requeue: shape.requeue,
        mpi: MpiMode::None,
        input: Default::default(),
        dependency: shape.dependency.clone(),
        batch: Some(files),
        step_of: None,
        array,
        element: None,
        token: None,
        mem: shape.mem(),
        constraint: shape.constraint()?,
        flock: shape.flock()?,
        borrow: shape.borrow,
        less: shape.less,
        one_cluster: shape.one_cluster,
        kill_on_bad_exit: false,
        exit_wait_s: 0,
        cpu_bind: None,
    };
    Ok((req, source))
}

/// The submitting user's name (its uid if it has none).
pub fn user_name() -> String {
    let uid = nix::unistd::getuid();
    nix::unistd::User::from_uid(uid)
        .ok()
        .flatten()
        .map_or_else(|| uid.to_string(), |u| u.name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storm_and_sbatch_lines_are_read_until_the_first_command_later_ones_winning() {
        let script = "#!/bin/sh\n\
            # a comment\n\
            #SBATCH -N 2 --time=5\n\
            #SBATCH --mem=1G\n\
            #SBATCH -p debug\n\
            \n\
            #STORM -N 3 -o 'out %j.txt' --job-name nightly --array 1-3%2\n\
            #SBATCH -d afterok:7\n\
            echo hi\n\
            #STORM -N 9\n";
        let d = read_directives("s.sh", script).unwrap();
        assert_eq!(d.shape.nodes, Some(3), "the later line wins");
        assert_eq!(d.shape.time_limit_ms, Some(5 * 60_000));
        assert_eq!(d.shape.job_name.as_deref(), Some("nightly"));
        assert_eq!(d.output.as_deref(), Some("out %j.txt"));
        assert_eq!(d.shape.dependency.unwrap().to_string(), "afterok:7");
        assert_eq!(d.shape.mem, Some(1 << 30), "#SBATCH --mem is storm's too");
        assert_eq!(d.ignored, ["#SBATCH -p debug"]);
        let array = d.array.unwrap();
        assert_eq!((array.indices, array.throttle), (vec![1, 2, 3], Some(2)));
    }

    #[test]
    fn bad_lines_are_refused_with_their_place() {
        for (script, says) in [
            (
                "#!/bin/sh\n#STORM --partition=debug\n",
                "s.sh:2: #STORM --partition=debug: unexpected argument",
            ),
            (
                "#!/bin/sh\n#SBATCH -N many\n",
                "s.sh:2: #SBATCH -N many: invalid value",
            ),
            (
                "#!/bin/sh\n#STORM -J 'open\n",
                "s.sh:2: #STORM -J 'open: unbalanced quotes",
            ),
        ] {
            let e = read_directives("s.sh", script).unwrap_err();
            assert!(e.starts_with(says), "{e}");
        }
    }

    #[test]
    fn the_submitter_fills_user_and_name_and_leaves_the_rest_to_the_node() {
        assert_eq!(
            expand_submitter_fields("%x-%u-%j-%N-%t-%%-%", "alice", "sim"),
            "sim-alice-%j-%N-%t-%%-%"
        );
        assert_eq!(
            storm_cluster::messages::expand_output_pattern(
                &expand_submitter_fields("%x-%j_%a.%N.%t.%%", "alice", "sim"),
                12,
                None,
                "node3",
                0
            ),
            "sim-12_0.node3.0.%"
        );
        assert_eq!(
            storm_cluster::messages::expand_output_pattern("%A_%a-%j", 15, Some((12, 7)), "n", 0),
            "12_7-15",
            "an element of array 12"
        );
    }

    #[test]
    fn the_command_line_overrides_the_script() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("job.sh"),
            "#!/bin/sh\n#STORM -N 2 -n 4 -o from-script\n#SBATCH -J script-name\nhostname\n",
        )
        .unwrap();
        let args = BatchArgs::try_parse_from(["storm batch", "-N", "1", "job.sh", "x"]).unwrap();
        let (req, script) = request(args, dir.path(), std::iter::empty(), "bob").unwrap();
        assert!(matches!(script, Script::File(p) if p == dir.path().join("job.sh")));
        assert_eq!(req.tasks.nodes, Some(1));
        assert_eq!(req.tasks.ntasks, Some(4));
        assert_eq!(req.name, "script-name");
        assert_eq!(req.args, ["x"]);
        assert_eq!(req.batch.unwrap().output, "from-script");
        let args =
            BatchArgs::try_parse_from(["storm batch", "-N", "2", "--wrap", "hostname -s"]).unwrap();
        let (req, script) = request(args, dir.path(), std::iter::empty(), "bob").unwrap();
        assert!(matches!(script, Script::Text(t) if t == "#!/bin/sh\nhostname -s\n"));
        assert_eq!((req.name.as_str(), req.tasks.nodes), ("wrap", Some(2)));
    }
}
