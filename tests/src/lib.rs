//! keel-tests: integration tests that start real `keel` processes on
//! loopback, with real disks and real sockets. The scenarios live in
//! `tests/tests/`; this library is the process harness: find (or build) the
//! `keel` binary, start brokers, run CLI commands.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// The `keel` binary of this workspace, built if missing.
pub fn keel_binary() -> PathBuf {
    // Test executables live in target/<profile>/deps/; binaries one up.
    let exe = std::env::current_exe().expect("test executable path");
    let profile_dir = exe.parent().and_then(Path::parent).expect("target profile dir").to_path_buf();
    let binary = profile_dir.join(format!("keel{}", std::env::consts::EXE_SUFFIX));
    // Build it once per test process, so a stale binary is never tested.
    static BUILT: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    BUILT.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut build = Command::new(cargo);
        build.args(["build", "-p", "keel-server", "--bin", "keel"]);
        // Without what cargo set for this test crate: a build script that
        // watches one of these (ring's watches CARGO_MANIFEST_DIR) would
        // otherwise see it change between this build and a build from the
        // shell, and half the workspace would be compiled again each time.
        for (name, _) in std::env::vars_os() {
            let name = name.to_string_lossy();
            let set_for_the_test = ["CARGO_PKG_", "CARGO_BIN_"].iter().any(|prefix| name.starts_with(prefix))
                || ["CARGO_MANIFEST_DIR", "CARGO_MANIFEST_PATH", "CARGO_CRATE_NAME", "CARGO_PRIMARY_PACKAGE"]
                    .contains(&name.as_ref())
                || ["CARGO_TARGET_TMPDIR", "OUT_DIR"].contains(&name.as_ref());
            if set_for_the_test {
                build.env_remove(name.as_ref());
            }
        }
        if profile_dir.file_name().is_some_and(|name| name == "release") {
            build.arg("--release");
        }
        let status = build.status().expect("run cargo build");
        assert!(status.success(), "building the keel binary failed");
    });
    binary
}

/// A free loopback port for a broker's client listener that no other test
/// of this process was given, whose internal listener's default port (this
/// one + 100, see [`internal_address`]) is free too. Ports from `bind(0)`
/// are released before the broker binds them, so two tests running at once
/// could be handed the same one and their brokers would talk across
/// clusters; a process-wide counter rules that out. Client ports come in
/// blocks of 100 with a block left free above each, for the internal ports.
/// They stay below Linux's ephemeral range (32768 and up by default), so
/// that no outgoing connection takes one between the check and the bind,
/// and a client retrying a killed broker's port cannot connect to itself.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let start = 10_000 + (std::process::id() % 100) as u16 * 200;
    let _ = NEXT.compare_exchange(0, start, Ordering::SeqCst, Ordering::SeqCst);
    loop {
        let port = NEXT.fetch_add(1, Ordering::SeqCst);
        assert!((10_000..32_000).contains(&port), "ran out of test ports");
        if (port - 10_000) / 100 % 2 == 1 {
            continue;
        }
        let bindable = |port: u16| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok();
        if bindable(port) && bindable(port + 100) {
            return port;
        }
    }
}

/// The internal (broker-to-broker) address a broker listening for clients
/// on `address` gets by default: the same host, port + 100.
pub fn internal_address(address: &str) -> String {
    let (host, port) = address.rsplit_once(':').expect("host:port");
    format!("{host}:{}", port.parse::<u16>().expect("port") + 100)
}

/// `--peers` for brokers 1, 2, ... listening for clients on `addresses`.
pub fn peers(addresses: &[String]) -> String {
    addresses
        .iter()
        .enumerate()
        .map(|(i, a)| format!("{}={}", i + 1, internal_address(a)))
        .collect::<Vec<_>>()
        .join(",")
}

/// The cluster secret the multi-broker tests give their brokers.
pub const TEST_SECRET: &str = "keel-test-secret";

/// A running `keel serve` process, killed when dropped.
pub struct Broker {
    child: Child,
    pub address: String,
}

impl Broker {
    /// Start `keel serve` with `args`, in `dir`, and wait until it says it
    /// is listening.
    pub fn start(dir: &Path, address: &str, args: &[&str]) -> Broker {
        let mut child = Command::new(keel_binary())
            .arg("serve")
            .args(["--listen", address])
            .args(args)
            .current_dir(dir)
            // The default log filter, whatever the test's environment says.
            .env_remove("KEEL_LOG")
            .stdout(Stdio::piped())
            // Broker logs go to keel.log in its directory, not the test output.
            .stderr(std::fs::File::create(dir.join("keel.log")).map(Stdio::from).unwrap_or_else(|_| Stdio::null()))
            .spawn()
            .expect("start keel serve");
        let stdout = child.stdout.take().expect("stdout");
        let (lines, received) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = lines.send(line);
            }
        });
        let first = received.recv_timeout(Duration::from_secs(30)).expect("keel serve printed nothing within 30 s");
        assert!(first.contains("listening on"), "unexpected first line: {first}");
        Broker { child, address: address.to_string() }
    }

    /// Stop with SIGKILL (a crash) and wait for the process to go.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Wait up to `timeout` for the broker to stop by itself; its exit
    /// status, or `None` if it still runs.
    pub fn wait_for_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("check on keel serve") {
                return Some(status);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Send SIGHUP (read the TLS files again).
    pub fn hangup(&self) {
        signal(&self.child, rustix::process::Signal::HUP);
    }

    /// Stop with SIGTERM (a graceful shutdown) and return its exit status.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        signal(&self.child, rustix::process::Signal::TERM);
        self.child.wait().expect("wait for keel serve")
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `GET path` from an HTTP endpoint (a broker's metrics); the body of a
/// 200 answer.
pub fn http_get(address: &str, path: &str) -> String {
    http_get_accepting(address, path, None).1
}

/// `GET path` with an `Accept` header if given: the headers (lower-cased)
/// and the body of a 200 answer.
pub fn http_get_accepting(address: &str, path: &str, accept: Option<&str>) -> (String, String) {
    use std::io::Read;
    let mut stream = std::net::TcpStream::connect(address).expect("connect to the metrics endpoint");
    let accept = accept.map(|a| format!("Accept: {a}\r\n")).unwrap_or_default();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {address}\r\n{accept}\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.0 200") || response.starts_with("HTTP/1.1 200"), "{response}");
    let (headers, body) = response.split_once("\r\n\r\n").unwrap_or((response.as_str(), ""));
    (headers.to_lowercase(), body.to_string())
}

/// The value of the sample whose name and labels start with `prefix`.
pub fn sample(metrics: &str, prefix: &str) -> f64 {
    metrics
        .lines()
        .find(|line| line.starts_with(prefix))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no sample {prefix} in\n{metrics}"))
}

/// A number from `--json` output: 64-bit integers come as strings (the
/// proto3 JSON mapping), smaller ones as numbers.
pub fn number(value: &serde_json::Value) -> u64 {
    match value {
        serde_json::Value::String(text) => text.parse().unwrap_or_else(|_| panic!("not a number: {value}")),
        other => other.as_u64().unwrap_or_else(|| panic!("not a number: {other}")),
    }
}

/// Send `signal` to a child process (no `kill` binary needed).
pub fn signal(child: &Child, signal: rustix::process::Signal) {
    let pid = rustix::process::Pid::from_raw(child.id() as i32).expect("a child's pid is positive");
    // The process may have exited already; then there is nothing to stop.
    let _ = rustix::process::kill_process(pid, signal);
}

/// A one-broker cluster on embedded defaults in a fresh directory, started
/// from async tests: the directory (dropped: removed), the broker (dropped:
/// killed) and its client address.
pub async fn one_broker() -> (tempfile::TempDir, Broker, String) {
    let dir = tempfile::TempDir::new().expect("temporary directory");
    let address = format!("127.0.0.1:{}", free_port());
    let broker = tokio::task::spawn_blocking({
        let (dir, address) = (dir.path().to_path_buf(), address.clone());
        move || Broker::start(&dir, &address, &[])
    })
    .await
    .expect("start the broker");
    (dir, broker, address)
}

/// Run a `keel` client command against `broker`, feeding `stdin`.
pub fn cli(broker: &str, args: &[&str], stdin: &str) -> Output {
    cli_fed(broker, args, stdin).wait_with_output().expect("keel output")
}

/// Start a `keel` client command against `broker` with every stream piped,
/// and feed it `stdin` (then end its input).
pub fn cli_fed(broker: &str, args: &[&str], stdin: &str) -> Child {
    let mut child = Command::new(keel_binary())
        .args(args)
        .args(["--broker", broker])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run keel");
    // A command refused at once may exit before it reads its input.
    match child.stdin.take().expect("stdin").write_all(stdin.as_bytes()) {
        Err(error) if error.kind() != std::io::ErrorKind::BrokenPipe => panic!("write stdin: {error}"),
        _ => {}
    }
    child
}

/// Run a command that must succeed; return its standard output.
pub fn cli_ok(broker: &str, args: &[&str], stdin: &str) -> String {
    let output = cli(broker, args, stdin);
    assert!(output.status.success(), "keel {args:?} failed: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).expect("utf-8 output")
}

/// Start a `keel` client command in the background with its standard
/// output captured (collect it with `wait_with_output`).
pub fn spawn_cli(broker: &str, args: &[&str]) -> Child {
    Command::new(keel_binary())
        .args(args)
        .args(["--broker", broker])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("run keel")
}

/// Run `keel ARGS --broker BROKER` with `stdin` piped in and its standard
/// error on a pseudo-terminal (80 columns), as a user at a terminal sees
/// it; returns its exit status and every byte written to that terminal.
pub fn cli_on_terminal(broker: &str, args: &[&str], stdin: &str) -> (std::process::ExitStatus, String) {
    use rustix::pty::{grantpt, openpt, ptsname, unlockpt, OpenptFlags};
    use std::io::Read;
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY).expect("open a pseudo-terminal");
    grantpt(&master).expect("grantpt");
    unlockpt(&master).expect("unlockpt");
    let name = ptsname(&master, Vec::new()).expect("ptsname");
    let size = rustix::termios::Winsize { ws_row: 24, ws_col: 80, ws_xpixel: 0, ws_ypixel: 0 };
    rustix::termios::tcsetwinsize(&master, size).expect("set the terminal's size");
    let terminal = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(name.to_str().expect("a UTF-8 terminal name"))
        .expect("open the terminal");
    let mut child = Command::new(keel_binary())
        .args(args)
        .args(["--broker", broker])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::from(terminal))
        .spawn()
        .expect("run keel");
    // The terminal's other end is read while the command runs (a full
    // terminal buffer would block it); it reads EIO once the command,
    // its only holder, has exited.
    let mut master = std::fs::File::from(master);
    let reader = std::thread::spawn(move || {
        let mut seen = Vec::new();
        let mut buffer = [0u8; 4096];
        while let Ok(read @ 1..) = master.read(&mut buffer) {
            seen.extend_from_slice(&buffer[..read]);
        }
        String::from_utf8_lossy(&seen).into_owned()
    });
    match child.stdin.take().expect("stdin").write_all(stdin.as_bytes()) {
        Err(error) if error.kind() != std::io::ErrorKind::BrokenPipe => panic!("write stdin: {error}"),
        _ => {}
    }
    let status = child.wait().expect("keel ran");
    (status, reader.join().expect("the terminal reader"))
}
