//! The README's commands run as written (issue #15): its quick start
//! against a broker on embedded defaults, and its three-broker walkthrough
//! (start three brokers, kill one, add a fourth, move, drain and remove),
//! each line typed into one bash session with `keel` on the PATH, in a
//! fresh directory. The only thing added is pacing: after a line that
//! starts a broker in the background, wait until it says it is listening,
//! as a person would before typing the next command.
//!
//! The README's addresses are fixed (7070-7074, 7170-7174); the other tests
//! take ephemeral ports, so they do not meet.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use keel_tests::{cli_ok, keel_binary, number};

/// Longest a README line may take (a drain waits for moves).
const LINE_TIMEOUT: Duration = Duration::from_secs(180);
/// Marks the end of a line's output and carries its exit status.
const DONE: &str = "__keel_readme_line_done__";

/// The lines of the first ```sh block after `marker` in the README.
fn sh_block_after(marker: &str) -> Vec<String> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).expect("README.md");
    let after = &readme[readme.find(marker).unwrap_or_else(|| panic!("README has no {marker:?}"))..];
    let block = &after[after.find("```sh\n").expect("a sh block") + "```sh\n".len()..];
    let block = &block[..block.find("```").expect("the block's end")];
    block.lines().filter(|l| !l.trim().is_empty()).map(str::to_string).collect()
}

/// One bash session; background brokers write into the same output.
struct Shell {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    seen: Vec<String>,
}

impl Shell {
    fn start(dir: &std::path::Path) -> Shell {
        let bin = keel_binary().parent().expect("the binary's directory").to_path_buf();
        let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
        let mut child = Command::new("bash")
            .args(["--noprofile", "--norc", "-s"])
            .current_dir(dir)
            .env("PATH", path)
            .env_remove("KEEL_BROKER")
            .env_remove("KEEL_LOG")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start bash");
        let mut stdin = child.stdin.take().expect("stdin");
        // Errors go with the output, into the failure message.
        writeln!(stdin, "exec 2>&1").expect("write to bash");
        let stdout = child.stdout.take().expect("stdout");
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    return;
                }
            }
        });
        Shell { child, stdin, lines, seen: Vec::new() }
    }

    /// Type `line`; returns its exit status and what it printed.
    fn run(&mut self, line: &str) -> (i32, String) {
        writeln!(self.stdin, "{line}\necho {DONE} $?").expect("write to bash");
        self.stdin.flush().expect("flush");
        let mut output = String::new();
        let deadline = Instant::now() + LINE_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(next) = self.lines.recv_timeout(left) else {
                panic!("README line `{line}` did not finish in {LINE_TIMEOUT:?}; printed:\n{output}");
            };
            if let Some(status) = next.strip_prefix(DONE) {
                return (status.trim().parse().expect("an exit status"), output);
            }
            output.push_str(&next);
            output.push('\n');
            self.seen.push(next);
        }
    }

    /// Wait until some output line contains `text` (a background broker
    /// saying it listens).
    fn wait_for(&mut self, text: &str) {
        let deadline = Instant::now() + LINE_TIMEOUT;
        while !self.seen.iter().any(|l| l.contains(text)) {
            let left = deadline.saturating_duration_since(Instant::now());
            let next = self.lines.recv_timeout(left).unwrap_or_else(|_| panic!("nothing said {text:?}"));
            self.seen.push(next);
        }
    }

    /// Run every line of a README block and check it succeeded; after a
    /// line that starts a broker in the background, wait for it to listen.
    fn run_block(&mut self, block: &[String]) -> Vec<(String, String)> {
        let mut outputs = Vec::new();
        for line in block {
            let (status, output) = self.run(line);
            assert_eq!(status, 0, "README line `{line}` failed:\n{output}");
            let command = line.split('#').next().unwrap_or_default().trim();
            if command.starts_with("keel serve") && command.ends_with('&') {
                let listen = command
                    .split_whitespace()
                    .skip_while(|w| *w != "--listen")
                    .nth(1)
                    .unwrap_or("127.0.0.1:7070")
                    .to_string();
                self.wait_for(&format!("listening on {listen}"));
            }
            outputs.push((line.clone(), output));
        }
        outputs
    }
}

impl Drop for Shell {
    fn drop(&mut self) {
        // Stop every broker this session started, whatever happened.
        let _ = writeln!(self.stdin, "kill -9 $(jobs -p) 2>/dev/null; wait; exit");
        let _ = self.stdin.flush();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
    }
}

fn output_of<'a>(outputs: &'a [(String, String)], starts: &str) -> &'a str {
    outputs.iter().find(|(line, _)| line.starts_with(starts)).map(|(_, o)| o.as_str()).expect("the line ran")
}

#[test]
fn the_quick_start_runs_as_written() {
    let dir = tempfile::TempDir::new().unwrap();
    let mut shell = Shell::start(dir.path());
    // The README's first set-up command, as the binary it builds.
    shell.run_block(&["keel serve &".to_string()]);
    let outputs = shell.run_block(&sh_block_after("## Quick start"));
    let read = output_of(&outputs, "keel read orders --partition 2");
    assert!(read.contains("hello") && read.contains("world"), "{read}");
    let consumed = output_of(&outputs, "keel consume orders --group readers");
    assert_eq!(consumed.lines().filter(|l| l.starts_with("orders/")).count(), 2, "{consumed}");
    let altered = output_of(&outputs, "keel topic alter orders");
    assert!(altered.contains("orders"), "{altered}");
    let deleted = output_of(&outputs, "keel group delete audit");
    assert!(deleted.contains("deleted group audit"), "{deleted}");
}

#[test]
fn the_three_broker_walkthrough_runs_as_written() {
    let dir = tempfile::TempDir::new().unwrap();
    let mut shell = Shell::start(dir.path());
    shell.run_block(&sh_block_after("KEEL_CLUSTER_SECRET`)."));
    let outputs = shell.run_block(&sh_block_after("Add a fourth broker"));
    // The joining broker said what it waits for before it listened.
    assert!(
        shell.seen.iter().any(|l| l.contains("joining the cluster through")),
        "the joining broker showed no progress: {:?}",
        shell.seen
    );
    // `--wait` returned once the move was done: the next describe, asked of
    // the new broker, already shows partition 0's voters as 2,3,4.
    let moved = output_of(&outputs, "keel topic move orders");
    assert!(moved.contains("orders/0 moved: its voters are 2,3,4"), "{moved}");
    let described = output_of(&outputs, "keel topic describe orders --broker 127.0.0.1:7074");
    let row = described
        .lines()
        .find(|l| l.split_whitespace().take(2).eq(["orders", "0"]))
        .unwrap_or_else(|| panic!("{described}"));
    // Its replicas and its voters.
    assert_eq!(row.matches("2,3,4").count(), 2, "partition 0 right after the move: {row}\n{described}");
    // Every record of both produces is there; broker 1 is gone and holds
    // nothing; the cluster goes on with brokers 2, 3 and 4.
    let b4 = "127.0.0.1:7074";
    let described: serde_json::Value =
        serde_json::from_str(&cli_ok(b4, &["topic", "describe", "orders", "--json"], "")).unwrap();
    let partitions = described["partitions"].as_array().unwrap();
    let total: u64 = partitions.iter().map(|p| number(&p["high_watermark"])).sum();
    assert_eq!(total, 200, "{described}");
    for partition in partitions {
        let replicas: Vec<u64> = partition["replicas"].as_array().unwrap().iter().map(number).collect();
        assert!(!replicas.contains(&1), "{partition}");
    }
    let status: serde_json::Value = serde_json::from_str(&cli_ok(b4, &["cluster", "status", "--json"], "")).unwrap();
    let mut brokers: Vec<u64> = status["brokers"].as_array().unwrap().iter().map(|b| number(&b["id"])).collect();
    brokers.sort();
    assert_eq!(brokers, [2, 3, 4], "{status}");
}

#[test]
fn the_tls_walkthrough_runs_as_written() {
    let dir = tempfile::TempDir::new().unwrap();
    let mut shell = Shell::start(dir.path());
    let outputs = shell.run_block(&sh_block_after("### TLS"));
    let described = output_of(&outputs, "keel topic describe payments");
    assert!(described.contains("payments"), "{described}");
    // Over TLS, all three replicas took the record.
    let (status, read) = shell.run("keel read payments --partition 0 --max-records 1 --json --broker 127.0.0.1:7273");
    let (status1, read1) = shell.run("keel read payments --partition 1 --max-records 1 --json --broker 127.0.0.1:7273");
    let (status2, read2) = shell.run("keel read payments --partition 2 --max-records 1 --json --broker 127.0.0.1:7273");
    assert_eq!((status, status1, status2), (0, 0, 0), "{read}{read1}{read2}");
    assert!(format!("{read}{read1}{read2}").contains("paid"), "{read}{read1}{read2}");
    // Without its certificate, the same client is refused, saying why.
    let (status, refused) =
        shell.run("env -u KEEL_TLS_CERT -u KEEL_TLS_KEY keel topic list --broker 127.0.0.1:7271 --timeout 5s");
    assert_ne!(status, 0, "{refused}");
    assert!(refused.contains("authenticated callers only"), "{refused}");
    // Alice may produce to payments (and so describe it), nothing more.
    let alice = "KEEL_USER=alice KEEL_SECRET=$ALICE_SECRET";
    let (status, described) = shell.run(&format!("{alice} keel topic describe payments --broker 127.0.0.1:7271"));
    assert_eq!(status, 0, "{described}");
    let (status, refused) =
        shell.run(&format!("{alice} keel read payments --partition 0 --max-records 1 --broker 127.0.0.1:7271"));
    assert_ne!(status, 0, "{refused}");
    assert!(refused.contains("alice lacks consume on topic payments"), "{refused}");
    let (status, refused) = shell.run("KEEL_USER=alice KEEL_SECRET=wrong keel topic list --broker 127.0.0.1:7271");
    assert_ne!(status, 0, "{refused}");
    assert!(refused.contains("secret is wrong"), "{refused}");
}
