//! storm-submit's progress bar: shown on a terminal for a program transfer that lasts over a
//! second, and never when standard error is not a terminal.

mod support;

use std::io::Read;
use std::process::{Command, Stdio};

use storm_cli::local::LocalOptions;
use support::{TestCluster, script, text};

/// A cluster whose program transfers are slow: 4 KiB chunks, one slot.
fn slow_transfers() -> TestCluster {
    TestCluster::with(LocalOptions {
        transfer_chunk_bytes: Some(4096),
        transfer_slots: Some(1),
        ..LocalOptions::new(2)
    })
}

/// A program of about `mb` MB that prints "done".
fn padded_program(dir: &std::path::Path, mb: usize) -> std::path::PathBuf {
    let mut body = String::from("echo done\nexit 0\n");
    body.push_str(&"#".repeat(mb << 20));
    script(dir, "padded.sh", &body)
}

/// Runs storm-submit with standard error on a terminal; returns what the terminal showed.
fn on_a_terminal(c: &TestCluster, args: &[&str]) -> (String, std::process::ExitStatus) {
    let winsize = nix::pty::Winsize {
        ws_row: 24,
        ws_col: 100,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let pty = nix::pty::openpty(Some(&winsize), None).expect("openpty");
    let mut child = Command::new(env!("CARGO_BIN_EXE_storm-submit"))
        .arg("--socket")
        .arg(&c.socket)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::from(pty.slave))
        .spawn()
        .expect("spawn storm-submit");
    let mut master = std::fs::File::from(pty.master);
    let reader = std::thread::spawn(move || {
        let mut seen = Vec::new();
        // Ends with EIO once the last holder of the terminal's other side exits.
        let _ = master.read_to_end(&mut seen);
        seen
    });
    let status = child.wait().expect("wait for storm-submit");
    (text(&reader.join().unwrap()), status)
}

/// The send time `--timing` printed.
fn send_ms(shown: &str) -> f64 {
    shown
        .split("send ")
        .nth(1)
        .and_then(|t| t.split(" ms").next())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no send time in {shown:?}"))
}

#[test]
fn a_long_transfer_shows_its_progress_on_a_terminal_only() {
    let c = slow_transfers();
    let work = tempfile::tempdir().unwrap();
    // Big enough that the transfer outlasts the one-second threshold with a margin, however
    // fast this machine is.
    let mut mb = 8;
    let (prog, shown) = loop {
        let prog = padded_program(work.path(), mb);
        let (shown, status) = on_a_terminal(
            &c,
            &["-N", "2", "--bcast", "--timing", prog.to_str().unwrap()],
        );
        assert!(status.success(), "{shown}");
        if send_ms(&shown) > 1500.0 {
            break (prog, shown);
        }
        mb *= 2;
        assert!(
            mb <= 512,
            "transfers stay too fast to test the progress bar: {shown:?}"
        );
    };
    assert!(
        shown.contains("sending the program") && shown.contains("MiB"),
        "a progress bar with its byte counts: {shown:?}"
    );
    // Not a terminal: nothing but the timing line.
    let out = c.submit(&["-N", "2", "--bcast", "--timing", prog.to_str().unwrap()]);
    assert!(out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("timing: queued"), "{err}");
    assert!(!err.contains("sending the program"), "{err}");
    assert!(
        !err.contains('\u{1b}'),
        "no escape codes off a terminal: {err:?}"
    );
}

#[test]
fn a_short_transfer_shows_no_bar_even_on_a_terminal() {
    let c = TestCluster::start(2);
    let work = tempfile::tempdir().unwrap();
    let prog = padded_program(work.path(), 1);
    let (shown, status) = on_a_terminal(&c, &["-N", "2", "--bcast", prog.to_str().unwrap()]);
    assert!(status.success(), "{shown}");
    assert!(!shown.contains("sending the program"), "{shown:?}");
}
