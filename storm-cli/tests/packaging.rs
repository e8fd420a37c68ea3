//! What an installation ships besides the binaries (issue 33, "Packaging"): a man page per
//! tool and per `storm` subcommand, and bash, zsh and fish completions, all generated from the
//! tools' own definitions (so they say what `--help` says), and systemd units that start the
//! daemons we build with options they take. `make install` and the Debian package are built
//! and installed by CI (.ci/run), which needs a release build.

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use support::{bin_dir, ensure_all_binaries, text};

const TOOLS: [&str; 9] = [
    "storm-submit",
    "storm",
    "storm-relay",
    "storm-peer",
    "storm-testbed",
    "storm-local",
    "storm-mm",
    "storm-nm",
    "storm-bench",
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The long options `TOOL [SUB] --help` lists.
fn long_options(tool: &str, sub: Option<&str>) -> BTreeSet<String> {
    let out = Command::new(bin_dir().join(tool))
        .args(sub)
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success(), "{tool} {sub:?} --help");
    text(&out.stdout)
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("--"))
        .map(|w| {
            w.trim_end_matches(|c: char| !c.is_ascii_alphanumeric())
                .split(['=', '<', ','])
                .next()
                .unwrap()
                .to_string()
        })
        .filter(|w| w.len() > 1)
        .collect()
}

/// The subcommands `storm --help` lists.
fn storm_subcommands() -> Vec<String> {
    let out = Command::new(bin_dir().join("storm"))
        .arg("--help")
        .output()
        .unwrap();
    text(&out.stdout)
        .split("Commands:")
        .nth(1)
        .unwrap()
        .split("Options:")
        .next()
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| *w != "help")
        .map(str::to_string)
        .collect()
}

#[test]
fn every_tool_has_man_pages_and_completions_that_say_what_its_help_says() {
    ensure_all_binaries();
    let out_dir = tempfile::tempdir().unwrap();
    let generated = Command::new(repo().join("dist/generate-docs"))
        .arg(bin_dir())
        .arg(out_dir.path())
        .output()
        .unwrap();
    assert!(generated.status.success(), "{}", text(&generated.stderr));
    let read = |rel: &str| {
        std::fs::read_to_string(out_dir.path().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
    };
    let submit_options = long_options("storm-submit", None);
    assert!(
        submit_options.contains("no-bcast") && submit_options.contains("ntasks-per-node"),
        "{submit_options:?}"
    );
    for tool in TOOLS {
        let page = read(&format!("man1/{tool}.1"));
        // The page's title, and every option of `--help` (roff escapes a dash as `\-`).
        assert!(page.contains(&format!(".TH {tool} 1")), "{tool}: {page}");
        for opt in long_options(tool, None) {
            assert!(
                page.contains(&format!("\\-\\-{}", opt.replace('-', "\\-"))),
                "{tool}.1 lacks --{opt}"
            );
        }
        let bash = format!("bash-completion/{tool}");
        let syntax = Command::new("bash")
            .arg("-n")
            .arg(out_dir.path().join(&bash))
            .output()
            .unwrap();
        assert!(syntax.status.success(), "{bash}: {}", text(&syntax.stderr));
        assert!(read(&bash).contains("--version"), "{bash}");
        assert!(read(&format!("zsh/_{tool}")).contains("--version"));
        assert!(read(&format!("fish/{tool}.fish")).contains("version"));
    }
    // `man storm-queue` and the rest: a page for each subcommand, with its own options.
    let subs = storm_subcommands();
    assert!(subs.len() >= 10, "{subs:?}");
    for sub in subs {
        let page = read(&format!("man1/storm-{sub}.1"));
        for opt in long_options("storm", Some(&sub)) {
            assert!(
                page.contains(&format!("\\-\\-{}", opt.replace('-', "\\-"))),
                "storm-{sub}.1 lacks --{opt}"
            );
        }
    }
    // The option storm-submit's users will look for first is explained, not only listed.
    let submit = read("man1/storm-submit.1");
    assert!(submit.contains("shared file system"), "{submit}");
}

/// The shipped units start binaries we build, with options those binaries take: each daemon,
/// run with its unit's command line (from this build, against a cluster file that is not
/// there), fails on the missing file and not on its arguments.
#[test]
fn the_systemd_units_start_our_daemons_with_options_they_take() {
    support::ensure_daemons();
    for (unit, binary) in [
        ("storm-mm", "storm-mm"),
        ("storm-nm", "storm-nm"),
        ("storm-relay", "storm-relay"),
        ("storm-relay-manager", "storm-relay"),
        ("storm-peer", "storm-peer"),
    ] {
        let path = repo().join(format!("dist/systemd/{unit}.service"));
        let body = std::fs::read_to_string(&path).unwrap();
        assert!(body.contains("Type=notify"), "{unit}: readiness");
        let exec = body
            .lines()
            .find_map(|l| l.strip_prefix("ExecStart="))
            .unwrap_or_else(|| panic!("{unit}: no ExecStart"));
        let mut words = exec.split_whitespace();
        let bin = words.next().unwrap();
        assert_eq!(bin, format!("/usr/bin/{binary}"));
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("cluster.toml");
        let args: Vec<String> = words
            // $STORM_MM_OPTIONS from /etc/default: empty unless the site sets it.
            .filter(|w| !w.starts_with('$'))
            .map(|w| w.replace("/etc/storm/cluster.toml", missing.to_str().unwrap()))
            .collect();
        let out = Command::new(bin_dir().join(binary))
            .args(&args)
            .output()
            .unwrap();
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{unit} {args:?}: {err}");
        assert!(err.contains("cluster.toml"), "{unit} {args:?}: {err}");
    }
}
