//! The `keel` command line as an operator meets it: flags checked when
//! parsed and accepted before or after the subcommand, failures that say
//! what is wrong at once, Ctrl-C during `keel consume` leaving the group,
//! and logs fit for files (issue #15).

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use keel_tests::{cli, cli_ok, free_port, keel_binary, one_broker, signal, Broker};
use rustix::process::Signal;

fn keel(args: &[&str]) -> Output {
    Command::new(keel_binary()).args(args).stdin(Stdio::null()).output().expect("run keel")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).to_string()
}

#[test]
fn a_broker_that_is_not_running_is_reported_at_once() {
    // Nothing listens here (free_port checked it is bindable). With a long
    // timeout, only the fast path can end this command soon: the test
    // asserts the message, and would hang for a minute without it.
    let address = format!("127.0.0.1:{}", free_port());
    let output = keel(&["topic", "list", "--broker", &address, "--timeout", "60s"]);
    assert!(!output.status.success());
    let message = stderr(&output);
    assert!(message.contains("connection refused"), "{message}");
    assert!(message.contains(&address), "{message}");
    assert!(!message.contains("gave up"), "{message}");
}

#[test]
fn broker_addresses_are_checked_when_the_flags_are_parsed() {
    for (address, expected) in [
        ("http://127.0.0.1:7070", "without the http:// scheme"),
        ("nonsense", "expected host:port"),
        ("127.0.0.1:99999", "is not a port number"),
        ("127.0.0.1:0", "is not a port number"),
        (":7070", "is not a host name"),
    ] {
        let output = keel(&["topic", "list", "--broker", address]);
        // clap's usage error: exit code 2, before any connection is tried.
        assert_eq!(output.status.code(), Some(2), "{address}: {}", stderr(&output));
        assert!(stderr(&output).contains(expected), "{address}: {}", stderr(&output));
    }
}

#[tokio::test]
async fn global_flags_go_before_or_after_the_subcommand() {
    let (_dir, _broker, address) = one_broker().await;
    cli_ok(&address, &["topic", "create", "orders", "--partitions", "2"], "");
    for args in [
        vec!["--json", "--broker", address.as_str(), "topic", "list"],
        vec!["topic", "--json", "list", "--broker", address.as_str()],
        vec!["--broker", address.as_str(), "topic", "list", "--json"],
        vec!["--timeout", "5s", "--json", "topic", "describe", "orders", "--broker", address.as_str()],
    ] {
        let output = keel(&args);
        assert!(output.status.success(), "{args:?}: {}", stderr(&output));
        let topics: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
        let topic = if args.contains(&"describe") { topics.clone() } else { topics["topics"][0].clone() };
        assert_eq!(topic["name"], "orders", "{args:?}");
        assert_eq!(topic["partitions"].as_array().map(Vec::len), Some(2), "{args:?}");
    }
    let output = keel(&["--timeout", "soon", "topic", "list", "--broker", &address]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
}

#[test]
fn a_port_that_is_not_a_keel_client_api_is_named_as_such() {
    let dir = tempfile::TempDir::new().unwrap();
    let port = free_port();
    let address = format!("127.0.0.1:{port}");
    let metrics = format!("127.0.0.1:{}", free_port());
    let _broker = Broker::start(dir.path(), &address, &["--metrics-listen", &metrics]);

    let output = keel(&["topic", "list", "--broker", &metrics]);
    assert!(!output.status.success());
    assert!(stderr(&output).contains("is not a keel broker"), "{}", stderr(&output));

    // The internal (broker-to-broker) listener, client port + 100.
    let internal = format!("127.0.0.1:{}", port + 100);
    let output = keel(&["topic", "list", "--broker", &internal]);
    assert!(!output.status.success());
    assert!(stderr(&output).contains("internal (broker-to-broker) address"), "{}", stderr(&output));

    // Something that is not a broker among several addresses is skipped,
    // not taken for the answer of the whole cluster.
    let output = keel(&["topic", "list", "--broker", &format!("{metrics},{address}")]);
    assert!(output.status.success(), "{}", stderr(&output));

    // A connection that meets itself (a TCP self-connect, possible when a
    // dead broker's port is in the ephemeral range) reads back its own
    // HTTP/2 preface. An echo server gives the same bytes. This is how a
    // produce to three brokers once failed in CI while a leader was down.
    let echo = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let echoed = echo.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for stream in echo.incoming().map_while(Result::ok) {
            std::thread::spawn(move || {
                let mut reader = stream.try_clone().unwrap();
                let mut writer = stream;
                let _ = std::io::copy(&mut reader, &mut writer);
            });
        }
    });
    let output = keel(&["topic", "list", "--broker", &echoed]);
    assert!(!output.status.success());
    assert!(stderr(&output).contains("is not a keel broker"), "{}", stderr(&output));
    let output = keel(&["topic", "list", "--broker", &format!("{echoed},{address}")]);
    assert!(output.status.success(), "{}", stderr(&output));
    // With the other address refusing, the cluster may be down: both are
    // named, not only the one that is not a broker.
    let dead = format!("127.0.0.1:{}", free_port());
    let output = keel(&["topic", "list", "--broker", &format!("{echoed},{dead}")]);
    assert!(!output.status.success());
    let said = stderr(&output);
    assert!(said.contains("cannot connect to") && said.contains(&echoed) && said.contains(&dead), "{said}");
}

/// `keel consume | head`: records that could not be written out are not
/// acknowledged (the group's next reader gets them), and the consumer
/// leaves its group and exits without a panic. `keel read` stops too.
#[tokio::test]
async fn a_closed_output_acknowledges_nothing_it_could_not_write() {
    let (_dir, _broker, address) = one_broker().await;
    cli_ok(&address, &["topic", "create", "jobs", "--partitions", "2"], "");
    cli_ok(&address, &["produce", "jobs"], &(0..10).map(|i| format!("job {i}\n")).collect::<String>());

    for json in [false, true] {
        let mut args = vec!["consume", "jobs", "--group", "workers"];
        if json {
            args.push("--json");
        }
        let output = with_output_closed(&address, &args, "").await;
        assert!(output.status.success(), "json {json}: {}", stderr(&output));
        let said = stderr(&output);
        assert!(said.contains("standard output was closed") && said.contains("left group workers"), "{said}");
        let described = describe_group(&address, "workers");
        assert_eq!(described["members"].as_array().map(Vec::len), Some(0), "{described}");
    }
    let printed = cli_ok(
        &address,
        &["consume", "jobs", "--group", "workers", "--max-records", "10", "--idle-timeout-ms", "5000"],
        "",
    );
    assert_eq!(printed.lines().count(), 10, "every record is still the group's to read: {printed}");

    for json in [false, true] {
        let mut args = vec!["read", "jobs", "--partition", "0", "--offset", "0", "--follow"];
        if json {
            args.push("--json");
        }
        let output = with_output_closed(&address, &args, "").await;
        assert!(output.status.success(), "json {json}: {}", stderr(&output));
    }

    // `keel produce --json | head -1`: the printing stops, not the
    // producing; every line read is sent and answered.
    let lines = (10..15).map(|i| format!("job {i}\n")).collect::<String>();
    let output = with_output_closed(&address, &["produce", "jobs", "--json"], &lines).await;
    assert!(output.status.success(), "{}", stderr(&output));
    let described: serde_json::Value =
        serde_json::from_str(&cli_ok(&address, &["topic", "describe", "jobs", "--json"], "")).unwrap();
    let stored: u64 =
        described["partitions"].as_array().unwrap().iter().map(|p| keel_tests::number(&p["high_watermark"])).sum();
    assert_eq!(stored, 15, "{described}");

    // A one-shot command (`keel topic list | head -1`) ends quietly, with
    // the status a shell shows for a tool SIGPIPE ended (128 + 13).
    for args in [&["topic", "list"][..], &["topic", "list", "--json"], &["group", "describe", "workers"]] {
        let output = with_output_closed(&address, args, "").await;
        assert!(output.status.code() == Some(141) && stderr(&output).is_empty(), "{args:?}: {}", stderr(&output));
    }
}

/// Run `keel ARGS --broker BROKER` with `stdin` fed in and its standard
/// output closed before it writes anything (`| head -0`); its output once
/// it exits (within a minute, else the test fails).
async fn with_output_closed(broker: &str, args: &[&str], stdin: &str) -> Output {
    let mut child = keel_tests::cli_fed(broker, args, stdin);
    // Long before the command's first answer comes back from the broker.
    drop(child.stdout.take());
    exits_within(child, Duration::from_secs(60)).await
}

/// The output of `child` once it exits by itself within `limit`; else
/// it is killed and the test fails.
async fn exits_within(mut child: std::process::Child, limit: Duration) -> Output {
    let started = std::time::Instant::now();
    while child.try_wait().expect("check on keel").is_none() {
        if started.elapsed() > limit {
            let _ = child.kill();
            let output = child.wait_with_output().expect("keel output");
            panic!("keel still ran after {limit:?}: {}", stderr(&output));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    child.wait_with_output().expect("keel output")
}

/// The group as `keel group describe --json` shows it.
fn describe_group(address: &str, group: &str) -> serde_json::Value {
    let output = cli(address, &["group", "describe", group, "--json"], "");
    assert!(output.status.success(), "{}", stderr(&output));
    serde_json::from_slice(&output.stdout).expect("JSON")
}

#[tokio::test]
async fn ctrl_c_during_consume_leaves_the_group() {
    let (_dir, _broker, address) = one_broker().await;
    cli_ok(&address, &["topic", "create", "jobs", "--partitions", "2"], "");
    cli_ok(&address, &["produce", "jobs"], &(0..10).map(|i| format!("job {i}\n")).collect::<String>());

    for interrupt in [Signal::INT, Signal::TERM] {
        // A long session: without leaving, the member would stay for a minute.
        let mut consumer = Command::new(keel_binary())
            .args(["consume", "jobs", "--group", "workers", "--session-timeout-ms", "60000"])
            .args(["--broker", &address])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run keel consume");
        let mut lines = BufReader::new(consumer.stdout.take().expect("stdout")).lines();
        if interrupt == Signal::INT {
            // The first run reads what was produced before it is stopped.
            let first = lines.next().expect("a record").expect("a line");
            assert!(first.contains("job"), "{first}");
        }
        // The second finds nothing new: it is stopped while it waits.
        let mut members = 0;
        for _ in 0..300 {
            members = describe_group(&address, "workers")["members"].as_array().map_or(0, Vec::len);
            if members == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(members, 1, "the consumer is a member while it runs");

        signal(&consumer, interrupt);
        let output = tokio::task::spawn_blocking(move || consumer.wait_with_output()).await.unwrap().unwrap();
        assert!(output.status.success(), "{interrupt:?}: {}", stderr(&output));
        let summary = stderr(&output);
        assert!(summary.contains("left group workers"), "{summary}");
        assert!(summary.contains(" records from "), "{summary}");

        let described = describe_group(&address, "workers");
        assert_eq!(described["members"].as_array().map(Vec::len), Some(0), "{described}");
    }
    // With no member left, the group can be reset at once.
    cli_ok(&address, &["group", "reset", "workers", "--topic", "jobs", "--to", "earliest"], "");
}

#[test]
fn an_invalid_log_filter_is_refused_at_start_up() {
    let dir = tempfile::TempDir::new().unwrap();
    let output = Command::new(keel_binary())
        .args(["serve", "--data-dir"])
        .arg(dir.path())
        .env("KEEL_LOG", "keel=loud=yes")
        .stdin(Stdio::null())
        .output()
        .expect("run keel serve");
    assert!(!output.status.success());
    assert!(stderr(&output).contains("KEEL_LOG"), "{}", stderr(&output));
    assert!(stderr(&output).contains("is not a log filter"), "{}", stderr(&output));
}

/// Start `keel serve` logging at info to a file in `dir` with `args`, wait
/// until it listens, stop it, and return what it logged.
fn broker_log(dir: &std::path::Path, args: &[&str]) -> String {
    let address = format!("127.0.0.1:{}", free_port());
    std::fs::create_dir_all(dir).unwrap();
    let log = dir.join("broker.log");
    let mut child = Command::new(keel_binary())
        .args(["serve", "--listen", &address, "--data-dir"])
        .arg(dir.join("data"))
        .args(args)
        .env("KEEL_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("run keel serve");
    // Keep its standard output open: it says goodbye there.
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    assert!(first.contains("listening on"), "{first}");
    signal(&child, Signal::TERM);
    assert!(child.wait().unwrap().success());
    std::fs::read_to_string(log).unwrap()
}

#[test]
fn logs_written_to_a_file_have_no_colour_codes_and_json_is_one_object_a_line() {
    let dir = tempfile::TempDir::new().unwrap();
    let text = broker_log(&dir.path().join("text"), &[]);
    assert!(!text.is_empty());
    assert!(!text.contains('\u{1b}'), "colour codes in a file: {text}");

    let json = broker_log(&dir.path().join("json"), &["--log-format", "json"]);
    let lines: Vec<&str> = json.lines().collect();
    assert!(!lines.is_empty());
    for line in lines {
        let object: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(object["level"].is_string() && object["timestamp"].is_string(), "{line}");
    }
}

#[tokio::test]
async fn group_describe_shows_positions_and_lag_when_no_member_is_left() {
    let (_dir, _broker, address) = one_broker().await;
    cli_ok(&address, &["topic", "create", "events", "--partitions", "2"], "");
    cli_ok(&address, &["topic", "create", "other", "--partitions", "1"], "");
    cli_ok(&address, &["produce", "events"], &(0..10).map(|i| format!("e{i}\n")).collect::<String>());
    cli_ok(&address, &["consume", "events", "--group", "readers", "--max-records", "10"], "");
    cli_ok(&address, &["produce", "events"], "late 1\nlate 2\nlate 3\n");

    let described = describe_group(&address, "readers");
    assert_eq!(described["members"].as_array().map(Vec::len), Some(0), "{described}");
    let rows = described["partitions"].as_array().expect("partitions");
    // Only the partitions the group has a position on: not topic `other`.
    assert!(rows.iter().all(|r| r["topic"] == "events" && r["member"].is_null()), "{described}");
    let sum = |field: &str| rows.iter().map(|r| keel_tests::number(&r[field])).sum::<u64>();
    assert_eq!(sum("position"), 10, "{described}");
    assert_eq!(sum("lag"), 3, "{described}");

    let text = cli_ok(&address, &["group", "describe", "readers"], "");
    assert!(text.contains("members 0") && text.contains("assignor sticky"), "{text}");

    // A group made with another assignor keeps it; a member asking for
    // another one while the group has members is told which to use.
    cli_ok(&address, &["consume", "events", "--group", "ranged", "--assignor", "range", "--max-records", "1"], "");
    assert_eq!(describe_group(&address, "ranged")["assignor"], "ASSIGNOR_RANGE");
    assert!(cli_ok(&address, &["group", "describe", "ranged"], "").contains("assignor range"));
    assert!(text.lines().filter(|line| line.starts_with("events")).count() >= 1, "{text}");
}

#[test]
fn help_describes_every_command_with_defaults_and_examples() {
    let help = |args: &[&str]| {
        let output = keel(args);
        assert!(output.status.success(), "{args:?}: {}", stderr(&output));
        String::from_utf8(output.stdout).unwrap()
    };
    let topic = help(&["topic", "--help"]);
    for line in ["create ", "list ", "describe ", "delete ", "move "] {
        let described = topic.lines().find(|l| l.trim_start().starts_with(line)).unwrap_or_else(|| panic!("{topic}"));
        assert!(described.split_whitespace().count() > 2, "{line} has no description: {topic}");
    }
    let serve = help(&["serve", "--help"]);
    assert!(serve.contains("KEEL_LOG"), "{serve}");
    assert!(serve.contains("[default: 127.0.0.1:7070]"), "{serve}");
    assert!(serve.contains("Examples:"), "{serve}");
    assert!(help(&["cluster", "--help"]).contains("Show the brokers"));
    assert!(help(&["topic", "create", "--help"]).contains("Example: keel topic create"));
}

#[test]
fn shell_completions_and_a_manual_page() {
    for shell in ["bash", "zsh", "fish"] {
        let output = keel(&["completions", shell]);
        assert!(output.status.success(), "{shell}: {}", stderr(&output));
        let script = String::from_utf8(output.stdout).unwrap();
        for word in ["topic", "consume", "broker", "timeout"] {
            assert!(script.contains(word), "{shell} completions lack {word}");
        }
    }
    let output = keel(&["completions", "tcsh"]);
    assert_eq!(output.status.code(), Some(2));
    let output = keel(&["man"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let page = String::from_utf8(output.stdout).unwrap();
    assert!(page.contains(".TH keel 1"), "{page}");
    assert!(page.contains("serve"), "{page}");
}

#[test]
fn metrics_speak_prometheus_text_or_openmetrics_with_canonical_codes_and_build_info() {
    let dir = tempfile::TempDir::new().unwrap();
    let address = format!("127.0.0.1:{}", free_port());
    let metrics = format!("127.0.0.1:{}", free_port());
    let _broker = Broker::start(dir.path(), &address, &["--metrics-listen", &metrics]);
    cli_ok(&address, &["topic", "list"], "");
    let _ = cli(&address, &["topic", "describe", "missing"], "");

    let (headers, text) = keel_tests::http_get_accepting(&metrics, "/metrics", None);
    assert!(headers.contains("content-type: text/plain; version=0.0.4"), "{headers}");
    assert!(!text.contains("# EOF"), "{text}");
    assert!(text.contains("# TYPE keel_requests_total counter"), "{text}");
    assert!(keel_tests::sample(&text, r#"keel_requests_total{rpc="ListTopics",code="OK"}"#) >= 1.0);
    assert!(keel_tests::sample(&text, r#"keel_requests_total{rpc="DescribeTopic",code="NOT_FOUND"}"#) >= 1.0);
    assert_eq!(keel_tests::sample(&text, "keel_build_info{version="), 1.0);
    // The segment log: its first segment, and the syncs that registered
    // the broker.
    assert!(keel_tests::sample(&text, "keel_log_segments") >= 1.0, "{text}");
    assert!(keel_tests::sample(&text, "keel_log_bytes") >= 1e6, "{text}");
    assert!(keel_tests::sample(&text, "keel_log_syncs_total") >= 1.0, "{text}");
    assert!(keel_tests::sample(&text, "keel_log_checkpoints_total") >= 0.0, "{text}");
    // Registering the broker wrote rows: at least one writer transaction.
    assert!(keel_tests::sample(&text, "keel_log_transactions_total") >= 1.0, "{text}");
    let live = keel_tests::sample(&text, "keel_log_live_bytes");
    assert!(live > 0.0 && live <= keel_tests::sample(&text, "keel_log_bytes"), "{text}");
    assert!(keel_tests::sample(&text, "keel_log_compacted_bytes_total") >= 0.0, "{text}");
    assert!(keel_tests::sample(&text, "keel_log_spare_segments") >= 0.0, "{text}");
    assert!(keel_tests::sample(&text, "keel_log_recycled_segments_total") >= 0.0, "{text}");
    assert!(keel_tests::sample(&text, "keel_log_side_applies_total") >= 0.0, "{text}");
    // The process's own figures, under the standard unprefixed names.
    // A broker a second old may not have used a clock tick of CPU yet.
    assert!(keel_tests::sample(&text, "process_cpu_seconds_total") >= 0.0, "{text}");
    assert!(keel_tests::sample(&text, "process_resident_memory_bytes") > 1e6, "{text}");
    assert!(keel_tests::sample(&text, "process_open_fds") >= 3.0, "{text}");
    assert!(keel_tests::sample(&text, "process_max_fds") >= keel_tests::sample(&text, "process_open_fds"));
    assert!(keel_tests::sample(&text, "process_threads") >= 2.0, "{text}");
    let started = keel_tests::sample(&text, "process_start_time_seconds");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    assert!(started > now - 600.0 && started <= now + 1.0, "started {started}, now {now}");

    // One broker leads its metadata group; `/metrics/node` says so without
    // a series per group, and keeps the broker's own series.
    assert_eq!(keel_tests::sample(&text, "keel_raft_leader{"), 1.0, "{text}");
    assert_eq!(keel_tests::sample(&text, "keel_raft_groups_led"), 1.0, "{text}");
    let (headers, node) = keel_tests::http_get_accepting(&metrics, "/metrics/node", None);
    assert!(headers.contains("content-type: text/plain; version=0.0.4"), "{headers}");
    assert_eq!(keel_tests::sample(&node, "keel_raft_groups_led"), 1.0, "{node}");
    assert!(keel_tests::sample(&node, "keel_log_syncs_total") >= 1.0, "{node}");
    assert!(keel_tests::sample(&node, "process_resident_memory_bytes") > 1e6, "{node}");
    assert!(!node.contains("keel_raft_leader{") && !node.contains("keel_raft_term{"), "{node}");

    let accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5";
    let (headers, open) = keel_tests::http_get_accepting(&metrics, "/metrics", Some(accept));
    assert!(headers.contains("content-type: application/openmetrics-text"), "{headers}");
    assert!(open.trim_end().ends_with("# EOF"), "{open}");
    assert!(open.contains("# TYPE keel_requests counter"), "{open}");
}

#[tokio::test]
async fn reflection_lists_the_api_and_health_in_v1_and_v1alpha() {
    use tonic_reflection::pb::{v1, v1alpha};
    let (_dir, _broker, address) = one_broker().await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{address}")).unwrap().connect().await.unwrap();

    let request = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1alpha::server_reflection_request::MessageRequest::ListServices(String::new())),
    };
    let mut client = v1alpha::server_reflection_client::ServerReflectionClient::new(channel.clone());
    let mut answers = client.server_reflection_info(futures_util::stream::iter([request])).await.unwrap().into_inner();
    let Some(v1alpha::server_reflection_response::MessageResponse::ListServicesResponse(listed)) =
        answers.message().await.unwrap().unwrap().message_response
    else {
        panic!("not a service list");
    };
    let alpha: Vec<String> = listed.service.into_iter().map(|s| s.name).collect();

    let request = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(String::new())),
    };
    let mut client = v1::server_reflection_client::ServerReflectionClient::new(channel);
    let mut answers = client.server_reflection_info(futures_util::stream::iter([request])).await.unwrap().into_inner();
    let Some(v1::server_reflection_response::MessageResponse::ListServicesResponse(listed)) =
        answers.message().await.unwrap().unwrap().message_response
    else {
        panic!("not a service list");
    };
    let one: Vec<String> = listed.service.into_iter().map(|s| s.name).collect();

    for services in [&alpha, &one] {
        assert!(services.iter().any(|s| s == "grpc.health.v1.Health"), "{services:?}");
        assert!(services.iter().any(|s| s.starts_with("keel.") && s.ends_with(".Keel")), "{services:?}");
    }
}

#[test]
fn the_readme_config_file_example_uses_only_settings_serve_has() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let block = readme.split("```toml\n").nth(1).and_then(|rest| rest.split("```").next()).expect("a toml block");
    let settings: toml::Table = toml::from_str(block).expect("the README's TOML parses");
    let help = String::from_utf8(keel(&["serve", "--help"]).stdout).unwrap();
    for key in settings.keys() {
        assert!(help.contains(&format!("--{key} ")), "README setting {key} is not a serve flag");
    }
    assert!(settings["peers"].is_array(), "peers is an array");

    // And serve accepts it: the same file with loopback addresses.
    let dir = tempfile::TempDir::new().unwrap();
    let (port, metrics) = (free_port(), free_port());
    let local = block
        .replace("10.0.0.1:7070", &format!("127.0.0.1:{port}"))
        .replace("10.0.0.1:7170", &format!("127.0.0.1:{}", port + 100))
        .replace("10.0.0.1:9464", &format!("127.0.0.1:{metrics}"))
        .replace(r#", "2=10.0.0.2:7170", "3=10.0.0.3:7170""#, "")
        .replace("/var/lib/keel", &dir.path().join("data").display().to_string());
    let config = dir.path().join("keel.toml");
    std::fs::write(&config, local).unwrap();
    let config = config.display().to_string();
    let _broker = Broker::start(dir.path(), &format!("127.0.0.1:{port}"), &["--config", &config]);
    assert!(keel_tests::http_get(&format!("127.0.0.1:{metrics}"), "/metrics").contains("keel_build_info"));
}

/// The JSON documents a command printed, one a line.
fn json_lines(address: &str, args: &[&str], stdin: &str) -> Vec<serde_json::Value> {
    let mut args = args.to_vec();
    args.push("--json");
    let out = cli_ok(address, &args, stdin);
    out.lines().map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{args:?}: {e}: {line}"))).collect()
}

#[tokio::test]
async fn every_command_prints_one_documented_json_shape_with_64_bit_integers_as_strings() {
    let (_dir, _broker, address) = one_broker().await;
    let one = |args: &[&str], stdin: &str| {
        let mut documents = json_lines(&address, args, stdin);
        assert_eq!(documents.len(), 1, "{args:?} printed {documents:?}");
        documents.remove(0)
    };
    // topic create and describe: a TopicDescription.
    let created = one(&["topic", "create", "shapes", "--partitions", "2", "--retention-bytes", "1MiB"], "");
    assert_eq!(created["name"], "shapes");
    assert!(created["id"].is_string() && created["retention_bytes"] == "1048576", "{created}");
    let described = one(&["topic", "describe", "shapes"], "");
    assert_eq!(described["partitions"].as_array().map(Vec::len), Some(2), "{described}");
    assert!(described["partitions"][0]["high_watermark"].is_string(), "{described}");
    // topic list: a ListTopicsResponse.
    let listed = one(&["topic", "list"], "");
    assert_eq!(listed["topics"][0]["name"], "shapes", "{listed}");
    // produce: a line per record with its partition and offset.
    let produced = json_lines(&address, &["produce", "shapes", "--key-separator", ":"], "k:v1\nk:v2\n");
    assert_eq!(produced.len(), 2);
    assert!(produced.iter().all(|p| p["offset"].is_string() && p["partition"].is_u64()), "{produced:?}");
    let partition = produced[0]["partition"].as_u64().unwrap().to_string();
    // read: a line per record; text values as text, others as base64.
    let read = json_lines(&address, &["read", "shapes", "--partition", &partition], "");
    assert_eq!(read.len(), 2);
    assert_eq!(
        (read[0]["key"].as_str(), read[0]["value"].as_str(), read[0]["offset"].as_str()),
        (Some("k"), Some("v1"), Some("0"))
    );
    assert!(read[0]["append_time_ms"].is_string());
    // consume: a line per record, with its topic and partition.
    let consumed = json_lines(&address, &["consume", "shapes", "--group", "g", "--max-records", "2"], "");
    assert!(consumed.iter().all(|r| r["topic"] == "shapes" && r["offset"].is_string()), "{consumed:?}");
    // group describe: the DescribeGroupResponse with the group's positions.
    let group = one(&["group", "describe", "g"], "");
    assert!(group["generation"].is_string() && group["members"].is_array(), "{group}");
    assert!(group["partitions"].as_array().unwrap().iter().all(|p| p["position"].is_string() && p["lag"].is_string()));
    // group reset: the positions set.
    let reset = one(&["group", "reset", "g", "--topic", "shapes", "--to", "latest"], "");
    assert_eq!(reset["partitions"].as_array().map(Vec::len), Some(2), "{reset}");
    // cluster status: a DescribeClusterResponse; a cluster id is usually
    // above 2^53, where JSON numbers lose digits.
    let status = one(&["cluster", "status"], "");
    let cluster_id = status["cluster_id"].as_str().expect("cluster_id as a string");
    assert!(cluster_id.parse::<u64>().is_ok(), "{status}");
    assert!(status["brokers"][0]["id"].is_string(), "{status}");
    // topic delete: the topic deleted.
    let deleted = one(&["topic", "delete", "shapes"], "");
    assert_eq!(deleted["topic"], "shapes");
}

#[tokio::test]
async fn consume_and_read_show_keys_and_take_a_format_and_an_encoding() {
    let (_dir, _broker, address) = one_broker().await;
    cli_ok(&address, &["topic", "create", "keyed", "--partitions", "1"], "");
    cli_ok(&address, &["produce", "keyed", "--key-separator", ":"], "user-1:hello\nuser-2:wörld\n");

    // The default line: where, offset, key, value.
    let read = cli_ok(&address, &["read", "keyed"], "");
    assert_eq!(read, "keyed/0\t0\tuser-1\thello\nkeyed/0\t1\tuser-2\twörld\n");
    let consumed = cli_ok(&address, &["consume", "keyed", "--group", "g", "--max-records", "2"], "");
    assert_eq!(consumed, read);

    let formatted = cli_ok(&address, &["read", "keyed", "--format", r"%k=%v@%o %T\n"], "");
    let first = formatted.lines().next().unwrap();
    assert!(first.starts_with("user-1=hello@0 ") && first.split(' ').nth(1).unwrap().parse::<u64>().is_ok(), "{first}");
    let hex = cli_ok(&address, &["read", "keyed", "--format", r"%v\n", "--encoding", "hex", "--offset", "1"], "");
    assert_eq!(hex, "77c3b6726c64\n");
    let base64 =
        cli_ok(&address, &["read", "keyed", "--format", r"%v\n", "--encoding", "base64", "--max-records", "1"], "");
    assert_eq!(base64, "aGVsbG8=\n");

    let output = cli(&address, &["read", "keyed", "--format", "%q"], "");
    assert_eq!(output.status.code(), Some(2));
    assert!(stderr(&output).contains("unknown field %q"), "{}", stderr(&output));
}

#[tokio::test]
async fn read_follow_prints_new_records_until_ctrl_c() {
    let (_dir, _broker, address) = one_broker().await;
    cli_ok(&address, &["topic", "create", "tail", "--partitions", "1"], "");
    cli_ok(&address, &["produce", "tail"], "first\n");
    let mut follower = Command::new(keel_binary())
        .args(["read", "tail", "--follow", "--format", r"%v\n", "--broker", &address])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run keel read --follow");
    let mut lines = BufReader::new(follower.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "first");
    cli_ok(&address, &["produce", "tail"], "second\nthird\n");
    assert_eq!(lines.next().unwrap().unwrap(), "second");
    assert_eq!(lines.next().unwrap().unwrap(), "third");
    signal(&follower, Signal::INT);
    let output = tokio::task::spawn_blocking(move || follower.wait_with_output()).await.unwrap().unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
}

#[tokio::test]
async fn durations_are_written_the_human_way_and_the_older_flags_still_work() {
    let (_dir, _broker, address) = one_broker().await;
    cli_ok(&address, &["topic", "create", "waits", "--partitions", "1"], "");
    cli_ok(&address, &["produce", "waits"], "one\n");
    let human = ["consume", "waits", "--group", "a", "--session-timeout", "30s", "--idle-timeout", "500ms"];
    assert_eq!(cli_ok(&address, &human, "").lines().count(), 1);
    let older = ["consume", "waits", "--group", "b", "--session-timeout-ms", "30000", "--idle-timeout-ms", "500"];
    assert_eq!(cli_ok(&address, &older, "").lines().count(), 1);
    let output = cli(&address, &["consume", "waits", "--group", "c", "--idle-timeout", "soon"], "");
    assert_eq!(output.status.code(), Some(2));
    assert!(stderr(&output).contains("write e.g. 500ms"), "{}", stderr(&output));
    let help = String::from_utf8(keel(&["cluster", "drain", "--help"]).stdout).unwrap();
    assert!(help.contains("--wait") && help.contains("[default: 10m]"), "{help}");
}

#[tokio::test]
async fn group_list_shows_every_group() {
    let (_dir, _broker, address) = one_broker().await;
    assert_eq!(json_lines(&address, &["group", "list"], "")[0]["groups"], serde_json::json!([]));
    cli_ok(&address, &["topic", "create", "a", "--partitions", "1"], "");
    cli_ok(&address, &["topic", "create", "b", "--partitions", "1"], "");
    cli_ok(&address, &["produce", "a"], "x\n");
    cli_ok(&address, &["produce", "b"], "y\n");
    cli_ok(&address, &["consume", "a", "b", "--group", "both", "--max-records", "2"], "");
    cli_ok(&address, &["consume", "a", "--group", "only-a", "--max-records", "1"], "");

    let listed = json_lines(&address, &["group", "list"], "").remove(0);
    let groups = listed["groups"].as_array().unwrap();
    let names: Vec<&str> = groups.iter().map(|g| g["group"].as_str().unwrap()).collect();
    assert_eq!(names, ["both", "only-a"], "{listed}");
    assert!(groups.iter().all(|g| g["members"] == 0 && g["generation"].is_string()), "{listed}");
    let text = cli_ok(&address, &["group", "list"], "");
    assert!(text.starts_with("GROUP") && text.lines().count() == 3, "{text}");
}

#[tokio::test]
async fn produce_to_a_chosen_partition_with_headers() {
    let (_dir, _broker, address) = one_broker().await;
    cli_ok(&address, &["topic", "create", "placed", "--partitions", "3"], "");
    let produced = json_lines(
        &address,
        &[
            "produce",
            "placed",
            "--key-separator",
            ":",
            "--partition",
            "1",
            "--header",
            "source=test",
            "--header",
            "n=1",
        ],
        "user-1:a\nuser-2:b\nc\n",
    );
    assert!(produced.iter().all(|p| p["partition"] == 1), "{produced:?}");
    let read = cli_ok(&address, &["read", "placed", "--partition", "1", "--format", r"%k %v %h\n"], "");
    assert_eq!(read, "user-1 a source=test,n=1\nuser-2 b source=test,n=1\n c source=test,n=1\n");

    let output = cli(&address, &["produce", "placed", "--partition", "3"], "x\n");
    assert!(!output.status.success());
    assert!(stderr(&output).contains("has partitions 0..3, not 3"), "{}", stderr(&output));
    let output = cli(&address, &["produce", "placed", "--header", "novalue"], "x\n");
    assert_eq!(output.status.code(), Some(2));
}

#[tokio::test]
async fn group_reset_takes_partitions_a_time_and_a_dry_run() {
    let (_dir, _broker, address) = one_broker().await;
    let json = |args: &[&str]| {
        let mut args = args.to_vec();
        args.push("--json");
        serde_json::from_str::<serde_json::Value>(&cli_ok(&address, &args, "")).expect("one JSON document")
    };
    cli_ok(&address, &["topic", "create", "events", "--partitions", "2"], "");
    cli_ok(&address, &["produce", "events", "--partition", "0"], "a\nb\nc\n");
    // Append times are in ms: the second batch is appended later.
    tokio::time::sleep(Duration::from_millis(20)).await;
    cli_ok(&address, &["produce", "events", "--partition", "0"], "d\ne\n");
    let read = json_lines(&address, &["read", "events", "--partition", "0"], "");
    let appended = |offset: usize| -> u64 { read[offset]["append_time_ms"].as_str().unwrap().parse().unwrap() };
    assert!(appended(2) < appended(3), "{read:?}");
    let rfc3339 =
        |ms: u64| humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + Duration::from_millis(ms)).to_string();

    // To a time: the first record appended at or after it.
    let reset =
        json(&["group", "reset", "g", "--topic", "events", "--partition", "0", "--to-time", &rfc3339(appended(3))]);
    assert_eq!(reset["partitions"].as_array().map(Vec::len), Some(1), "{reset}");
    assert_eq!(reset["partitions"][0]["position"], "3", "{reset}");
    let reset =
        json(&["group", "reset", "g", "--topic", "events", "--partition", "0", "--to-time", &rfc3339(appended(0))]);
    assert_eq!(reset["partitions"][0]["position"], "0", "{reset}");
    // After the last record: the high watermark.
    let reset =
        json(&["group", "reset", "g", "--topic", "events", "--partition", "0", "--to-time", &rfc3339(appended(4) + 1)]);
    assert_eq!(reset["partitions"][0]["position"], "5", "{reset}");

    // A dry run shows both positions of every partition and changes none.
    cli_ok(&address, &["group", "reset", "g", "--topic", "events", "--partition", "0", "--to", "1"], "");
    let dry = json(&["group", "reset", "g", "--topic", "events", "--to", "latest", "--dry-run"]);
    assert_eq!(dry["dry_run"], true, "{dry}");
    let partitions: Vec<(String, String)> = dry["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["position"].as_str().unwrap().to_string(), p["new_position"].as_str().unwrap().to_string()))
        .collect();
    assert_eq!(partitions, [("1".to_string(), "5".to_string()), ("0".to_string(), "0".to_string())], "{dry}");
    let text = cli_ok(
        &address,
        &["group", "reset", "g", "--topic", "events", "--partition", "0", "--to", "earliest", "--dry-run"],
        "",
    );
    assert_eq!(text, "events/0: position 1 -> 0 (dry run)\n");
    let again = json(&["group", "reset", "g", "--topic", "events", "--partition", "0", "--to", "latest", "--dry-run"]);
    assert_eq!(again["partitions"][0]["position"], "1", "the dry runs changed nothing: {again}");

    // A partition the topic does not have, and a time that is not one.
    let output = cli(&address, &["group", "reset", "g", "--topic", "events", "--partition", "7"], "");
    assert!(!output.status.success());
    assert!(stderr(&output).contains("events has no partition 7: it has 2 (0 to 1)"), "{}", stderr(&output));
    let output = cli(&address, &["group", "reset", "g", "--topic", "events", "--to-time", "yesterday"], "");
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(stderr(&output).contains("RFC 3339"), "{}", stderr(&output));
}

#[tokio::test]
async fn consume_from_earliest_latest_an_offset_or_a_time() {
    let (_dir, _broker, address) = one_broker().await;
    cli_ok(&address, &["topic", "create", "log", "--partitions", "1"], "");
    cli_ok(&address, &["produce", "log"], "a\nb\nc\n");
    tokio::time::sleep(Duration::from_millis(20)).await;
    cli_ok(&address, &["produce", "log"], "d\ne\n");
    let read = json_lines(&address, &["read", "log"], "");
    let appended: u64 = read[3]["append_time_ms"].as_str().unwrap().parse().unwrap();
    let at = humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + Duration::from_millis(appended)).to_string();
    // Each run consumes to the end and leaves; the next --from moves the
    // group's position again before it joins.
    let consumed = |from: &str| -> Vec<String> {
        let args = ["consume", "log", "--group", "g", "--idle-timeout", "1s", "--format", "%v\\n", "--from", from];
        cli_ok(&address, &args, "").lines().map(str::to_string).collect()
    };
    assert_eq!(consumed("earliest"), ["a", "b", "c", "d", "e"]);
    assert_eq!(consumed("3"), ["d", "e"]);
    assert_eq!(consumed(&at), ["d", "e"]);
    assert_eq!(consumed("latest"), Vec::<String>::new());
    // Without --from the group goes on where it stopped.
    cli_ok(&address, &["produce", "log"], "f\n");
    let args = ["consume", "log", "--group", "g", "--idle-timeout", "1s", "--format", "%v\\n"];
    assert_eq!(cli_ok(&address, &args, ""), "f\n");
    // Not a place to start from: refused when the flags are parsed.
    let output = cli(&address, &["consume", "log", "--group", "g", "--from", "soon"], "");
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(stderr(&output).contains("not earliest, latest, an offset or a time"), "{}", stderr(&output));
}

#[tokio::test]
async fn topic_alter_adds_partitions_and_changes_retention() {
    let (_dir, _broker, address) = one_broker().await;
    let one = |args: &[&str]| -> serde_json::Value {
        let mut documents = json_lines(&address, args, "");
        assert_eq!(documents.len(), 1, "{args:?} printed {documents:?}");
        documents.remove(0)
    };
    cli_ok(&address, &["topic", "create", "growing", "--partitions", "1", "--retention", "7d"], "");
    cli_ok(&address, &["produce", "growing"], "before\n");
    let altered = one(&["topic", "alter", "growing", "--partitions", "3", "--retention-bytes", "1MiB"]);
    assert_eq!(altered["partitions"].as_array().map(Vec::len), Some(3), "{altered}");
    // The age limit given at creation stays; the size limit is added.
    assert_eq!(altered["retention_ms"], (7 * 24 * 3600 * 1000u64).to_string(), "{altered}");
    assert_eq!(altered["retention_bytes"], "1048576", "{altered}");
    // The new partitions start and take records; the old one keeps its own.
    let produced = json_lines(&address, &["produce", "growing", "--partition", "2"], "after\n");
    assert_eq!(produced[0]["partition"], 2, "{produced:?}");
    let read = json_lines(&address, &["read", "growing", "--partition", "0"], "");
    assert_eq!(read.len(), 1);
    assert_eq!(read[0]["value"], "before");
    // `forever` and `unlimited` remove the limits.
    let kept = one(&["topic", "alter", "growing", "--retention", "forever", "--retention-bytes", "unlimited"]);
    assert!(kept["retention_ms"].is_null() && kept["retention_bytes"].is_null(), "{kept}");
    let described = one(&["topic", "describe", "growing"]);
    assert_eq!(described["partitions"].as_array().map(Vec::len), Some(3), "{described}");

    // Shrinking, nothing to change, and an unknown topic: clear errors.
    let output = cli(&address, &["topic", "alter", "growing", "--partitions", "2"], "");
    assert!(!output.status.success());
    assert!(stderr(&output).contains("partitions can only be added"), "{}", stderr(&output));
    let output = cli(&address, &["topic", "alter", "growing"], "");
    assert!(!output.status.success());
    assert!(stderr(&output).contains("say what to change"), "{}", stderr(&output));
    let output = cli(&address, &["topic", "alter", "nowhere", "--partitions", "2"], "");
    assert!(!output.status.success());
    assert!(stderr(&output).contains("topic nowhere does not exist"), "{}", stderr(&output));
    let output = cli(&address, &["topic", "alter", "growing", "--retention", "0s"], "");
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
}

#[tokio::test]
async fn group_delete_forgets_the_group_and_its_positions() {
    let (_dir, _broker, address) = one_broker().await;
    cli_ok(&address, &["topic", "create", "work", "--partitions", "2"], "");
    cli_ok(&address, &["produce", "work"], "a\nb\nc\n");
    let consume = ["consume", "work", "--group", "done", "--idle-timeout", "1s", "--format", "%v\\n"];
    let mut first: Vec<String> = cli_ok(&address, &consume, "").lines().map(str::to_string).collect();
    first.sort();
    assert_eq!(first, ["a", "b", "c"]);
    assert_eq!(cli_ok(&address, &consume, ""), "", "the group goes on from its positions");

    // Refused while a member is in the group.
    let client = keel_client::Client::new(vec![address.clone()], keel_client::RetryPolicy::default()).unwrap();
    let member = keel_client::Consumer::join(client, "done", "holder", vec!["work".to_string()], 30_000).await.unwrap();
    let output = cli(&address, &["group", "delete", "done"], "");
    assert!(!output.status.success());
    assert!(stderr(&output).contains("has members"), "{}", stderr(&output));
    member.leave().await.unwrap();

    let deleted = json_lines(&address, &["group", "delete", "done"], "");
    assert_eq!(deleted.len(), 1, "{deleted:?}");
    assert_eq!(deleted[0]["group"], "done");
    assert!(deleted[0]["positions_removed"].as_u64().is_some_and(|n| n >= 1), "{deleted:?}");
    let listed = json_lines(&address, &["group", "list"], "");
    assert!(listed[0]["groups"].as_array().unwrap().iter().all(|g| g["group"] != "done"), "{listed:?}");
    let output = cli(&address, &["group", "describe", "done"], "");
    assert!(!output.status.success());
    assert!(stderr(&output).contains("does not exist"), "{}", stderr(&output));

    // Joined again, the group starts from the log start.
    let mut again: Vec<String> = cli_ok(&address, &consume, "").lines().map(str::to_string).collect();
    again.sort();
    assert_eq!(again, ["a", "b", "c"]);
    // A group that never was.
    let output = cli(&address, &["group", "delete", "never"], "");
    assert!(!output.status.success());
    assert!(stderr(&output).contains("does not exist"), "{}", stderr(&output));
}

#[tokio::test]
async fn tables_fit_their_contents_however_long_the_names() {
    let (_dir, _broker, address) = one_broker().await;
    let long = "a-topic-whose-name-is-much-longer-than-twenty-four-characters";
    cli_ok(&address, &["topic", "create", long, "--partitions", "2"], "");
    let listed = cli_ok(&address, &["topic", "list"], "");
    let mut lines = listed.lines();
    let header = lines.next().unwrap();
    assert!(header.starts_with("TOPIC "), "{listed}");
    // Numbers end under the end of their (right-aligned) column's header.
    let end = header.find("PARTITION").unwrap() + "PARTITION".len();
    let rows: Vec<&str> = lines.collect();
    assert_eq!(rows.len(), 2, "{listed}");
    for (partition, row) in rows.iter().enumerate() {
        assert!(row.starts_with(long), "the name is whole: {row}");
        assert_eq!(row[..end].trim_start_matches(long).trim(), partition.to_string(), "{listed}");
        assert_eq!(row.trim_end(), *row, "no trailing spaces: {row:?}");
    }
}

/// On a terminal `keel produce` draws a live count on standard error and
/// clears it at the end; into a pipe it writes no progress at all.
#[tokio::test]
async fn progress_lines_show_on_a_terminal_and_not_in_a_pipe() {
    let (_dir, _broker, address) = one_broker().await;
    cli_ok(&address, &["topic", "create", "lots", "--partitions", "2"], "");
    let input: String = (0..5_000).map(|i| format!("record-{i}\n")).collect();

    let (status, terminal) = keel_tests::cli_on_terminal(&address, &["produce", "lots"], &input);
    assert!(status.success(), "{terminal}");
    assert!(terminal.contains("records acknowledged"), "no progress line on the terminal: {terminal:?}");
    // indicatif redraws in place and clears the line when done.
    assert!(terminal.contains("\u{1b}["), "no terminal control sequences: {terminal:?}");
    assert!(terminal.contains("produced 5000 records"), "{terminal:?}");

    let piped = keel_tests::cli(&address, &["produce", "lots"], &input);
    assert!(piped.status.success());
    let stderr = String::from_utf8_lossy(&piped.stderr);
    assert!(!stderr.contains("acknowledged") && !stderr.contains('\u{1b}'), "progress in a pipe: {stderr:?}");
    let described: serde_json::Value =
        serde_json::from_str(&cli_ok(&address, &["topic", "describe", "lots", "--json"], "")).unwrap();
    let total: u64 =
        described["partitions"].as_array().unwrap().iter().map(|p| keel_tests::number(&p["high_watermark"])).sum();
    assert_eq!(total, 10_000, "{described}");
}

#[tokio::test]
async fn cluster_settings_change_by_command_and_empty_groups_are_forgotten_past_their_retention() {
    let (_dir, _broker, address) = one_broker().await;
    let settings = json_lines(&address, &["cluster", "config"], "").remove(0);
    let setting = |name: &str| {
        let all = settings["settings"].as_array().expect("settings");
        all.iter().find(|s| s["name"] == name).cloned().unwrap_or_else(|| panic!("no {name} in {settings}"))
    };
    assert_eq!(
        (setting("groups_max")["value"].as_str(), setting("groups_max")["scope"].as_str()),
        (Some("10000"), Some("cluster"))
    );
    assert_eq!(setting("group_retention_ms")["value"], "604800000", "7 days, as Kafka's offsets.retention.minutes");
    assert_eq!(setting("batch_bytes_max")["scope"], "partition");

    // Refused with a reason, and nothing changes.
    for (args, says) in [
        (["cluster", "config", "set", "batch_bytes_max", "5"], "fixed in each partition"),
        (["cluster", "config", "set", "groups_max", "0"], "it must be 1 to"),
        (["cluster", "config", "set", "no_such_setting", "5"], "keel cluster config"),
    ] {
        let refused = cli(&address, &args, "");
        assert!(!refused.status.success() && stderr(&refused).contains(says), "{args:?}: {}", stderr(&refused));
    }
    let said = cli_ok(&address, &["cluster", "config", "set", "groups_max", "1"], "");
    assert_eq!(said.trim(), "groups_max = 1 (was 10000)");
    assert!(cli_ok(&address, &["cluster", "config"], "")
        .lines()
        .any(|l| l.starts_with("groups_max") && l.contains(" 1 ")));

    // One group (empty once its consumer leaves) fills the cluster.
    cli_ok(&address, &["topic", "create", "events"], "");
    cli_ok(&address, &["produce", "events"], "one\n");
    cli_ok(&address, &["consume", "events", "--group", "first", "--max-records", "1"], "");
    let client = keel_client::Client::new(vec![address.clone()], keel_client::RetryPolicy::default()).unwrap();
    assert!(client.group_position("first", "events", 0).await.unwrap().committed);
    let refused = cli(&address, &["consume", "events", "--group", "second", "--max-records", "1"], "");
    assert!(!refused.status.success() && stderr(&refused).contains("groups_max"), "{}", stderr(&refused));
    let shrink = cli(&address, &["cluster", "config", "set", "groups_max", "0"], "");
    assert!(!shrink.status.success());

    // Once it has been empty for group_retention_ms the cluster forgets
    // it, and a new group joins.
    cli_ok(&address, &["cluster", "config", "set", "group_retention_ms", "1000"], "");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while cli_ok(&address, &["group", "list"], "").contains("first") {
        assert!(std::time::Instant::now() < deadline, "group first was never forgotten");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Its position stays on the partition (nothing forgets positions of
    // forgotten groups yet), and a new group joins.
    assert!(client.group_position("first", "events", 0).await.unwrap().committed);
    let read = cli_ok(&address, &["consume", "events", "--group", "second", "--max-records", "1"], "");
    assert!(read.contains("one"), "{read}");
    assert!(client.group_position("second", "events", 0).await.unwrap().committed);
}
