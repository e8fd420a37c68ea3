//! Man pages and shell completions, generated from each tool's own clap definition, so that
//! they never disagree with `--help`.
//!
//! Every storm binary with a command line calls [`generate_if_asked`] first thing in `main`:
//! `storm-submit --generate-docs DIR` writes `DIR/man1/storm-submit.1` (and a page per
//! subcommand, `storm-queue.1` for `storm queue`), and the bash, zsh and fish completions
//! (`DIR/bash-completion/storm-submit`, `DIR/zsh/_storm-submit`, `DIR/fish/storm-submit.fish`).
//! `dist/generate-docs` runs it for every binary; `make install` and the Debian package install
//! what it writes. The option is not in `--help`: it is for packaging, not for users.

use std::path::Path;

/// The option that asks for the documents.
pub const GENERATE_DOCS: &str = "--generate-docs";

/// Call first thing in `main`: if the command line is `NAME --generate-docs DIR`, writes the
/// documents of the tool `P` describes and exits (1, saying why, if they cannot be written).
pub fn exit_if_asked<P: clap::CommandFactory>() {
    match generate_if_asked(P::command) {
        Ok(false) => {}
        Ok(true) => std::process::exit(0),
        Err(e) => {
            eprintln!("{GENERATE_DOCS}: {e}");
            std::process::exit(1);
        }
    }
}

/// If the command line is `NAME --generate-docs DIR`, writes the man pages and completions of
/// `command` into DIR and returns true (the caller then exits); otherwise false.
pub fn generate_if_asked(command: impl FnOnce() -> clap::Command) -> std::io::Result<bool> {
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() != Some(std::ffi::OsStr::new(GENERATE_DOCS)) {
        return Ok(false);
    }
    let dir = args.next().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{GENERATE_DOCS} needs a directory"),
        )
    })?;
    write_docs(command(), Path::new(&dir))?;
    Ok(true)
}

/// Writes the man pages of `command` and its subcommands, and its completions, under `dir`.
pub fn write_docs(mut command: clap::Command, dir: &Path) -> std::io::Result<()> {
    command.build();
    let man = dir.join("man1");
    std::fs::create_dir_all(&man)?;
    write_man_pages(&command, command.get_name(), &man)?;
    let name = command.get_name().to_string();
    for (shell, sub, file) in [
        (clap_complete::Shell::Bash, "bash-completion", name.clone()),
        (clap_complete::Shell::Zsh, "zsh", format!("_{name}")),
        (clap_complete::Shell::Fish, "fish", format!("{name}.fish")),
    ] {
        let d = dir.join(sub);
        std::fs::create_dir_all(&d)?;
        let mut out = std::fs::File::create(d.join(file))?;
        clap_complete::generate(shell, &mut command, name.clone(), &mut out);
    }
    Ok(())
}

/// `page` names the page (`storm-queue` for `storm queue`).
fn write_man_pages(command: &clap::Command, page: &str, dir: &Path) -> std::io::Result<()> {
    let named = command.clone().name(page.to_string());
    let mut out = std::fs::File::create(dir.join(format!("{page}.1")))?;
    clap_mangen::Man::new(named).render(&mut out)?;
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        if sub.get_name() == "help" {
            continue;
        }
        write_man_pages(sub, &format!("{page}-{}", sub.get_name()), dir)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool() -> clap::Command {
        clap::Command::new("storm-demo")
            .version("1.0")
            .about("A demonstration")
            .arg(
                clap::Arg::new("nodes")
                    .long("nodes")
                    .short('N')
                    .help("How many nodes"),
            )
            .subcommand(
                clap::Command::new("queue")
                    .about("List the jobs")
                    .arg(clap::Arg::new("json").long("json").num_args(0)),
            )
    }

    #[test]
    fn every_option_and_subcommand_has_its_page_and_completions() {
        let dir = tempfile::tempdir().unwrap();
        write_docs(tool(), dir.path()).unwrap();
        let page = std::fs::read_to_string(dir.path().join("man1/storm-demo.1")).unwrap();
        assert!(page.starts_with(".ie") || page.contains(".TH"), "{page}");
        assert!(
            page.contains("nodes") && page.contains("How many nodes"),
            "{page}"
        );
        let sub = std::fs::read_to_string(dir.path().join("man1/storm-demo-queue.1")).unwrap();
        assert!(
            sub.contains("json") && sub.contains("List the jobs"),
            "{sub}"
        );
        let bash = std::fs::read_to_string(dir.path().join("bash-completion/storm-demo")).unwrap();
        assert!(bash.contains("--nodes") && bash.contains("queue"), "{bash}");
        let zsh = std::fs::read_to_string(dir.path().join("zsh/_storm-demo")).unwrap();
        assert!(zsh.contains("--nodes"), "{zsh}");
        let fish = std::fs::read_to_string(dir.path().join("fish/storm-demo.fish")).unwrap();
        assert!(fish.contains("nodes"), "{fish}");
    }
}
