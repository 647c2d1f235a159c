//! TLS, users and access rules on real `keel serve` processes, with
//! certificates made at test time:
//! clients without a certificate, with one from another CA or with an
//! expired one are refused; the right one works; a certificate rotated on
//! disk is used after SIGHUP; brokers reach each other over mutual TLS, and
//! a Raft message is refused unless the caller's certificate names the
//! broker it claims to come from; every RPC needs its permission, and
//! users prove themselves with secrets.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;
use std::time::Duration;

use keel_client::pb;
use keel_proto::raft::raft_transport_client::RaftTransportClient;
use keel_proto::raft::RaftRequest;
use keel_tests::{free_port, Broker};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
use tonic::Code;

/// A certificate authority made for one test.
struct Authority {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

impl Authority {
    fn new(name: &str) -> Authority {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        let pem = params.self_signed(&key).unwrap().pem();
        Authority { issuer: Issuer::new(params, key), pem }
    }

    /// A certificate for `names` (DNS names and IP addresses) and its key,
    /// in PEM; `expired`: its validity ended in 2020.
    fn issue(&self, names: &[&str], expired: bool) -> (String, String) {
        let mut params = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, names.first().copied().unwrap_or("client"));
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        if expired {
            params.not_before = rcgen::date_time_ymd(2019, 1, 1);
            params.not_after = rcgen::date_time_ymd(2020, 1, 1);
        }
        let key = KeyPair::generate().unwrap();
        (params.signed_by(&key, &self.issuer).unwrap().pem(), key.serialize_pem())
    }
}

/// A fresh directory for a test's broker, with `pki/` in it for its files.
fn test_dir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::TempDir::new().unwrap();
    let pki = dir.path().join("pki");
    std::fs::create_dir(&pki).unwrap();
    (dir, pki)
}

/// Write `(cert, key)` as `NAME.pem` and `NAME.key` in `dir`.
fn write_pair(dir: &Path, name: &str, (cert, key): &(String, String)) -> (PathBuf, PathBuf) {
    let (cert_path, key_path) = (dir.join(format!("{name}.pem")), dir.join(format!("{name}.key")));
    std::fs::write(&cert_path, cert).unwrap();
    std::fs::write(&key_path, key).unwrap();
    (cert_path, key_path)
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// The names a broker's certificate carries: its host, and its id.
fn broker_names(id: u64) -> Vec<String> {
    vec!["127.0.0.1".into(), "localhost".into(), format!("keel-broker-{id}")]
}

fn issue_broker(ca: &Authority, id: u64) -> (String, String) {
    let names = broker_names(id);
    ca.issue(&names.iter().map(String::as_str).collect::<Vec<_>>(), false)
}

/// Times each refused client is tried in
/// `a_tls_broker_serves_the_clients_it_trusts_and_refuses_the_rest`.
const REFUSALS_PER_CASE: usize = 5;

/// `keel ARGS --broker BROKER --timeout 5s`.
fn keel(broker: &str, args: &[&str]) -> Output {
    std::process::Command::new(keel_tests::keel_binary())
        .args(args)
        .args(["--broker", broker, "--timeout", "5s"])
        .env_remove("KEEL_TLS_CA")
        .env_remove("KEEL_TLS_CERT")
        .env_remove("KEEL_TLS_KEY")
        .output()
        .unwrap()
}

fn succeeded(output: &Output) -> bool {
    output.status.success()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// `GET /metrics` over TLS, trusting `ca`: the status line.
fn https_metrics(address: &str, ca: &str) -> Result<String, String> {
    let answer = https_metrics_answer(address, ca)?;
    answer.lines().next().map(str::to_string).ok_or_else(|| "no answer".to_string())
}

/// `GET /metrics` over TLS, trusting `ca`: the whole answer.
fn https_metrics_answer(address: &str, ca: &str) -> Result<String, String> {
    use std::io::{Read, Write};
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::pem::PemObject::pem_slice_iter(ca.as_bytes()) {
        roots.add(cert.map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let connection = rustls::ClientConnection::new(Arc::new(config), name).map_err(|e| e.to_string())?;
    let socket = std::net::TcpStream::connect(address).map_err(|e| e.to_string())?;
    let mut stream = rustls::StreamOwned::new(connection, socket);
    write!(stream, "GET /metrics HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut response = String::new();
    // The server may close without close_notify once it has answered.
    let _ = stream.read_to_string(&mut response);
    Ok(response)
}

#[test]
fn a_tls_broker_serves_the_clients_it_trusts_and_refuses_the_rest() {
    let (dir, pki) = test_dir();
    let cluster_ca = Authority::new("keel cluster CA");
    let client_ca = Authority::new("keel client CA");
    let other_ca = Authority::new("someone else's CA");
    let ca = write(&pki, "ca.pem", &cluster_ca.pem);
    let clients = write(&pki, "clients.pem", &client_ca.pem);
    let (cert, key) = write_pair(&pki, "broker", &issue_broker(&cluster_ca, 1));
    let (good_cert, good_key) = write_pair(&pki, "good", &client_ca.issue(&["alice"], false));
    let (foreign_cert, foreign_key) = write_pair(&pki, "foreign", &other_ca.issue(&["mallory"], false));
    let (expired_cert, expired_key) = write_pair(&pki, "expired", &client_ca.issue(&["bob"], true));

    let address = format!("127.0.0.1:{}", free_port());
    let metrics = format!("127.0.0.1:{}", free_port());
    let _broker = Broker::start(
        dir.path(),
        &address,
        &[
            "--tls-cert",
            s(&cert),
            "--tls-key",
            s(&key),
            "--tls-ca",
            s(&ca),
            "--tls-client-ca",
            s(&clients),
            "--metrics-listen",
            &metrics,
        ],
    );
    let with = |cert: &Path, key: &Path, args: &[&str]| {
        let mut all = vec!["--tls-ca", s(&ca), "--tls-cert", s(cert), "--tls-key", s(key)];
        all.extend_from_slice(args);
        keel(&address, &all)
    };

    // The right certificate works end to end.
    let created = with(&good_cert, &good_key, &["topic", "create", "secure", "--partitions", "1"]);
    assert!(succeeded(&created), "{}", stderr(&created));
    let produced = std::process::Command::new(keel_tests::keel_binary())
        .args(["produce", "secure", "--broker", &address, "--tls-ca", s(&ca)])
        .args(["--tls-cert", s(&good_cert), "--tls-key", s(&good_key)])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(b"over tls\n")?;
            child.wait_with_output()
        })
        .unwrap();
    assert!(succeeded(&produced), "{}", stderr(&produced));
    let read = with(&good_cert, &good_key, &["read", "secure", "--partition", "0", "--max-records", "1"]);
    assert!(succeeded(&read) && String::from_utf8_lossy(&read.stdout).contains("over tls"), "{}", stderr(&read));

    // No certificate, another CA's, an expired one, and plaintext: refused.
    // Each says why, at once (a refused certificate is not retried). Under
    // TLS 1.3 the client sends its request before the broker has checked
    // its certificate; the broker must still deliver the alert that says
    // why (it lingers to read that request rather than reset the
    // connection), so each case runs several times: 3% of calls under load
    // lost the alert to a reset and retried until they gave up.
    for _ in 0..REFUSALS_PER_CASE {
        let refused = [
            ("no certificate", keel(&address, &["--tls-ca", s(&ca), "topic", "list"]), "CertificateRequired"),
            ("another CA's certificate", with(&foreign_cert, &foreign_key, &["topic", "list"]), "UnknownCA"),
            ("an expired certificate", with(&expired_cert, &expired_key, &["topic", "list"]), "CertificateExpired"),
            ("plaintext", keel(&address, &["topic", "list"]), "--tls-ca if the brokers use TLS"),
        ];
        for (case, output, why) in refused {
            assert!(!succeeded(&output), "{case}: served");
            assert!(!String::from_utf8_lossy(&output.stdout).contains("secure"), "{case}: listed the topic");
            assert!(stderr(&output).contains(why), "{case}: {}", stderr(&output));
        }
    }
    // A client that does not trust the broker's CA refuses the broker.
    let distrusting = keel(
        &address,
        &["--tls-ca", s(&clients), "--tls-cert", s(&good_cert), "--tls-key", s(&good_key), "topic", "list"],
    );
    assert!(!succeeded(&distrusting), "a broker from an untrusted CA was accepted");

    // Metrics over TLS too.
    let status = https_metrics(&metrics, &cluster_ca.pem).unwrap();
    assert!(status.contains("200"), "{status}");
    assert!(https_metrics(&metrics, &other_ca.pem).is_err(), "metrics served under an untrusted CA");
}

#[test]
fn a_certificate_rotated_on_disk_is_used_after_sighup() {
    let (dir, pki) = test_dir();
    let old_ca = Authority::new("old CA");
    let new_ca = Authority::new("new CA");
    let ca = write(&pki, "ca.pem", &old_ca.pem);
    let (cert, key) = write_pair(&pki, "broker", &issue_broker(&old_ca, 1));
    let old_trust = write(&pki, "old-trust.pem", &old_ca.pem);
    let new_trust = write(&pki, "new-trust.pem", &new_ca.pem);
    let address = format!("127.0.0.1:{}", free_port());
    let broker =
        Broker::start(dir.path(), &address, &["--tls-cert", s(&cert), "--tls-key", s(&key), "--tls-ca", s(&ca)]);
    let list = |trust: &Path| keel(&address, &["--tls-ca", s(trust), "topic", "list"]);
    assert!(succeeded(&list(&old_trust)), "{}", stderr(&list(&old_trust)));
    assert!(!succeeded(&list(&new_trust)));

    // New files on disk change nothing until SIGHUP...
    write_pair(&pki, "broker", &issue_broker(&new_ca, 1));
    write(&pki, "ca.pem", &new_ca.pem);
    assert!(succeeded(&list(&old_trust)), "the certificate changed before SIGHUP");
    // ... after it, new connections get the new certificate.
    broker.hangup();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !succeeded(&list(&new_trust)) {
        assert!(std::time::Instant::now() < deadline, "the rotated certificate was not served after SIGHUP");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(!succeeded(&list(&old_trust)), "the old certificate is still served");

    // Unusable files on SIGHUP keep the certificate in use.
    std::fs::write(&cert, "not a certificate").unwrap();
    broker.hangup();
    std::thread::sleep(Duration::from_millis(500));
    assert!(succeeded(&list(&new_trust)), "a bad reload broke the listener");
}

/// A TLS channel to `address` with `identity` (cert, key PEM), trusting `ca`.
async fn tls_channel(address: &str, ca: &str, identity: Option<&(String, String)>) -> Result<Channel, String> {
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Channel::from_shared(format!("https://{address}"))
        .unwrap()
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_brokers_speak_mutual_tls_and_check_the_id_a_message_claims() {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::TempDir::new().unwrap()).collect();
    let pki = tempfile::TempDir::new().unwrap();
    let cluster_ca = Authority::new("keel cluster CA");
    let ca = write(pki.path(), "ca.pem", &cluster_ca.pem);
    let addresses: Vec<String> = (0..3).map(|_| format!("127.0.0.1:{}", free_port())).collect();
    let peers = keel_tests::peers(&addresses);
    let pairs: Vec<(String, String)> = (1..=3).map(|id| issue_broker(&cluster_ca, id)).collect();
    let mut starts = Vec::new();
    for (i, dir) in dirs.iter().enumerate() {
        let (cert, key) = write_pair(pki.path(), &format!("broker-{}", i + 1), &pairs[i]);
        let (dir, address, peers, ca) = (dir.path().to_path_buf(), addresses[i].clone(), peers.clone(), ca.clone());
        starts.push(std::thread::spawn(move || {
            let id = (i + 1).to_string();
            Broker::start(
                &dir,
                &address,
                &[
                    "--id",
                    &id,
                    "--peers",
                    &peers,
                    "--cluster-secret",
                    keel_tests::TEST_SECRET,
                    "--tls-cert",
                    s(&cert),
                    "--tls-key",
                    s(&key),
                    "--tls-ca",
                    s(&ca),
                ],
            )
        }));
    }
    let _brokers: Vec<Broker> = starts.into_iter().map(|start| start.join().unwrap()).collect();

    // Replication works over mutual TLS: a topic on all three takes writes.
    let tls = keel_client::ClientTls::from_files(&ca, None).unwrap();
    let client = keel_client::Client::with_tls(addresses.clone(), keel_client::RetryPolicy::default(), &tls).unwrap();
    // A broker answers once it serves, which can be before it has registered:
    // wait until all three are members, or a factor-3 topic is refused.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while client.describe_cluster().await.map_or(0, |c| c.brokers.len()) < 3 {
        assert!(std::time::Instant::now() < deadline, "three brokers never registered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let topic = pb::CreateTopicRequest {
        topic: "replicated".into(),
        partitions: 1,
        replication_factor: 3,
        ..Default::default()
    };
    client.create_topic(topic).await.unwrap();
    let records = ["one", "two"].map(|v| pb::Record { value: v.as_bytes().to_vec(), ..Default::default() }).to_vec();
    let request = pb::ProduceRequest { topic: "replicated".into(), records, ..Default::default() };
    let sent = client.produce(request).await.unwrap();
    assert_eq!(sent.base_offset, 0, "{sent:?}");

    // The internal listener: no certificate, no connection...
    let internal = keel_tests::internal_address(&addresses[0]);
    let no_cert = match tls_channel(&internal, &cluster_ca.pem, None).await {
        Err(error) => error,
        Ok(channel) => RaftTransportClient::new(channel)
            .vote(RaftRequest::default())
            .await
            .map(|_| "answered".to_string())
            .unwrap_or_else(|status| status.to_string()),
    };
    assert_ne!(no_cert, "answered");
    // ... and a message is refused unless the caller's certificate names
    // the broker it claims to be from.
    let cluster_id = client.describe_cluster().await.unwrap().cluster_id;
    let vote = openraft::raft::VoteRequest::new(openraft::Vote::new(u64::MAX, 2u64), None);
    let request = || RaftRequest {
        group: "metadata".into(),
        payload: postcard::to_stdvec(&vote).unwrap(),
        cluster_id,
        secret: keel_tests::TEST_SECRET.into(),
    };
    let as_broker_3 = tls_channel(&internal, &cluster_ca.pem, Some(&pairs[2])).await.unwrap();
    let refused = RaftTransportClient::new(as_broker_3).vote(request()).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(refused.message().contains("keel-broker-2"), "{refused:?}");
    // Broker 2's own certificate gets past the check (to the sanity check
    // that refuses the impossible term).
    let as_broker_2 = tls_channel(&internal, &cluster_ca.pem, Some(&pairs[1])).await.unwrap();
    let checked = RaftTransportClient::new(as_broker_2).vote(request()).await.unwrap_err();
    assert_eq!(checked.code(), Code::InvalidArgument, "{checked:?}");
}

#[test]
fn keel_cert_makes_what_a_cluster_needs_and_overwrites_nothing() {
    let dir = tempfile::TempDir::new().unwrap();
    let run = |args: &[&str]| {
        std::process::Command::new(keel_tests::keel_binary())
            .arg("cert")
            .args(args)
            .current_dir(dir.path())
            .output()
            .unwrap()
    };
    let no_ca = run(&["create-broker", "1", "--host", "127.0.0.1"]);
    assert!(!succeeded(&no_ca) && stderr(&no_ca).contains("keel cert create-ca"), "{}", stderr(&no_ca));
    assert!(succeeded(&run(&["create-ca"])));
    let again = run(&["create-ca"]);
    assert!(!succeeded(&again) && stderr(&again).contains("exists"), "{}", stderr(&again));
    assert!(succeeded(&run(&["create-broker", "1", "--host", "127.0.0.1,localhost"])));
    assert!(succeeded(&run(&["create-client", "alice"])));
    let certs = dir.path().join("certs");
    #[cfg(unix)]
    for key in ["ca.key", "broker-1.key", "client-alice.key"] {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(certs.join(key)).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "{key} is readable by others: {mode:o}");
    }
    // A broker started on them serves a client holding the client's.
    let address = format!("127.0.0.1:{}", free_port());
    let (cert, key, ca) = (certs.join("broker-1.pem"), certs.join("broker-1.key"), certs.join("ca.pem"));
    let _broker = Broker::start(
        dir.path(),
        &address,
        &["--tls-cert", s(&cert), "--tls-key", s(&key), "--tls-ca", s(&ca), "--tls-client-ca", s(&ca)],
    );
    let (client_cert, client_key) = (certs.join("client-alice.pem"), certs.join("client-alice.key"));
    let listed = keel(
        &address,
        &["--tls-ca", s(&ca), "--tls-cert", s(&client_cert), "--tls-key", s(&client_key), "topic", "list"],
    );
    assert!(succeeded(&listed), "{}", stderr(&listed));
}

/// `keel profile`: TLS settings and brokers given once, used by every
/// later command; flags still win.
#[test]
fn a_profile_carries_the_brokers_and_tls_files_to_every_command() {
    let (dir, pki) = test_dir();
    let ca_authority = Authority::new("keel cluster CA");
    let ca = write(&pki, "ca.pem", &ca_authority.pem);
    let (cert, key) = write_pair(&pki, "broker", &issue_broker(&ca_authority, 1));
    let (client_cert, client_key) = write_pair(&pki, "alice", &ca_authority.issue(&["alice"], false));
    let address = format!("127.0.0.1:{}", free_port());
    let _broker = Broker::start(
        dir.path(),
        &address,
        &["--tls-cert", s(&cert), "--tls-key", s(&key), "--tls-ca", s(&ca), "--tls-client-ca", s(&ca)],
    );
    let profiles = dir.path().join("profiles.toml");
    let keel = |args: &[&str]| {
        std::process::Command::new(keel_tests::keel_binary())
            .args(args)
            .env("KEEL_PROFILES", &profiles)
            .env_remove("KEEL_BROKER")
            .env_remove("KEEL_TLS_CA")
            .env_remove("KEEL_TLS_CERT")
            .env_remove("KEEL_TLS_KEY")
            .output()
            .unwrap()
    };
    // Without a profile, the default broker and no TLS: nothing there.
    assert!(!succeeded(&keel(&["topic", "list", "--timeout", "2s"])));
    let created = keel(&[
        "profile",
        "create",
        "secure",
        "--broker",
        &address,
        "--tls-ca",
        s(&ca),
        "--tls-cert",
        s(&client_cert),
        "--tls-key",
        s(&client_key),
        "--timeout",
        "5s",
    ]);
    assert!(succeeded(&created), "{}", stderr(&created));
    // Every command now uses it, from any directory.
    let made = keel(&["topic", "create", "profiled", "--partitions", "1"]);
    assert!(succeeded(&made), "{}", stderr(&made));
    let listed = keel(&["topic", "list"]);
    assert!(String::from_utf8_lossy(&listed.stdout).contains("profiled"), "{}", stderr(&listed));
    let shown = keel(&["profile", "list"]);
    let shown = String::from_utf8_lossy(&shown.stdout).into_owned();
    assert!(shown.lines().any(|l| l.starts_with('*') && l.contains("secure") && l.contains(&address)), "{shown}");
    // A flag wins over the profile: here, a broker that is not there.
    let elsewhere = format!("127.0.0.1:{}", free_port());
    assert!(!succeeded(&keel(&["topic", "list", "--broker", &elsewhere, "--timeout", "2s"])));
    // Naming a profile that does not exist says so.
    let unknown = keel(&["topic", "list", "--profile", "nope"]);
    assert!(!succeeded(&unknown) && stderr(&unknown).contains("no profile \"nope\""), "{}", stderr(&unknown));
    // Deleted, it is no longer used.
    assert!(succeeded(&keel(&["profile", "delete", "secure"])));
    assert!(!succeeded(&keel(&["topic", "list", "--broker", &address, "--timeout", "2s"])));
}

/// A client of `address` over TLS trusting `ca`, with a certificate or a
/// user's secret (or neither).
fn client_as(
    address: &str,
    ca: &str,
    identity: Option<&(String, String)>,
    user: Option<(&str, &str)>,
) -> keel_client::Client {
    let tls = keel_client::ClientTls {
        ca: ca.as_bytes().to_vec(),
        identity: identity.map(|(cert, key)| (cert.as_bytes().to_vec(), key.as_bytes().to_vec())),
    };
    let policy = keel_client::RetryPolicy { deadline: Duration::from_secs(10), ..Default::default() };
    let client = keel_client::Client::with_tls(vec![address.to_string()], policy, &tls).unwrap();
    match user {
        Some((name, secret)) => client.with_credentials(keel_client::Credentials::user(name, secret).unwrap()).unwrap(),
        None => client,
    }
}

/// One RPC of `client` through its routing and retries, with `request`.
macro_rules! raw {
    ($client:expr, $route:ident, $method:ident, $request:expr) => {
        $client
            .call(keel_client::Route::$route, |mut c| {
                let r = $request.clone();
                async move { c.$method(r).await }
            })
            .await
    };
}

fn code<T: std::fmt::Debug>(result: &Result<T, keel_client::ClientError>) -> Code {
    match result {
        Ok(_) => Code::Ok,
        Err(keel_client::ClientError::Refused(status)) => status.code(),
        Err(other) => panic!("not an answer from the broker: {other}"),
    }
}

fn rule(principal: &str, operation: &str, resource: &str, name: &str) -> pb::Acl {
    pb::Acl {
        principal: principal.into(),
        resource: resource.into(),
        name: name.into(),
        prefix: false,
        operation: operation.into(),
    }
}

fn credential(secret: &str) -> keel_core::access::Credential {
    keel_core::access::Credential::derive(secret.as_bytes(), b"a test salt, 16+".to_vec(), 64)
}

/// Every RPC refuses a principal without the permission it needs, changing
/// nothing, and serves it once an administrator grants the rule; a rule
/// taken back, or a user deleted, stops working on the next request of an
/// open client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rpc_needs_its_permission_and_users_prove_themselves_with_secrets() {
    let (dir, pki) = test_dir();
    let cluster_ca = Authority::new("keel cluster CA");
    let ca = write(&pki, "ca.pem", &cluster_ca.pem);
    let (cert, key) = write_pair(&pki, "broker", &issue_broker(&cluster_ca, 1));
    let admin_pair = cluster_ca.issue(&["admin"], false);
    let eve_pair = cluster_ca.issue(&["eve"], false);
    let address = format!("127.0.0.1:{}", free_port());
    let metrics = format!("127.0.0.1:{}", free_port());
    let _broker = Broker::start(
        dir.path(),
        &address,
        &[
            "--tls-cert",
            s(&cert),
            "--tls-key",
            s(&key),
            "--tls-ca",
            s(&ca),
            "--tls-client-ca",
            s(&ca),
            "--authorize",
            "--super-user",
            "admin",
            "--metrics-listen",
            &metrics,
        ],
    );
    let admin = client_as(&address, &cluster_ca.pem, Some(&admin_pair), None);
    let me = admin.who_am_i().await.unwrap();
    assert_eq!((me.principal.as_str(), me.authenticated_by.as_str(), me.super_user), ("admin", "certificate", true));
    admin.set_user("alice", &credential("alices-secret"), false).await.unwrap();
    let topic = |name: &str, partitions: u32| pb::CreateTopicRequest {
        topic: name.into(),
        partitions,
        replication_factor: 1,
        ..Default::default()
    };
    admin.create_topic(topic("other", 1)).await.unwrap();

    // Anonymous callers and wrong secrets are not served at all.
    let anonymous = client_as(&address, &cluster_ca.pem, None, None);
    assert_eq!(code(&anonymous.list_topics().await), Code::Unauthenticated);
    // Looking the cluster up is open to all (clients route, brokers join by it).
    assert_eq!(anonymous.describe_cluster().await.unwrap().brokers.len(), 1);
    let wrong = client_as(&address, &cluster_ca.pem, None, Some(("alice", "not-it")));
    assert_eq!(code(&wrong.list_topics().await), Code::Unauthenticated);
    let nobody = client_as(&address, &cluster_ca.pem, None, Some(("nobody", "x")));
    assert_eq!(code(&nobody.list_topics().await), Code::Unauthenticated);
    // A certificate's common name is a principal too; with no rules it sees nothing.
    let eve = client_as(&address, &cluster_ca.pem, Some(&eve_pair), None);
    assert_eq!(code(&eve.create_topic(topic("eve.t", 1)).await), Code::PermissionDenied);
    assert!(eve.list_topics().await.unwrap().is_empty(), "listed topics it may not describe");

    let alice = client_as(&address, &cluster_ca.pem, None, Some(("alice", "alices-secret")));
    let me = alice.who_am_i().await.unwrap();
    assert_eq!((me.principal.as_str(), me.authenticated_by.as_str(), me.super_user), ("alice", "secret", false));
    // Refused without the rule, served with it: check `call` is refused
    // (and `unchanged` still holds), grant `acl`, and check it is served.
    macro_rules! needs {
        ($acl:expr, $call:expr, $unchanged:expr) => {{
            let refused = $call;
            assert_eq!(code(&refused), Code::PermissionDenied, "{:?} was not needed", $acl);
            assert!($unchanged, "a refused call for {:?} changed something", $acl);
            assert!(admin.add_acl($acl).await.unwrap());
            let served = $call;
            assert!(served.is_ok(), "{:?} granted, but: {:?}", $acl, served.err());
            served.unwrap()
        }};
    }
    let exists = |name: &'static str| {
        let admin = admin.clone();
        async move { admin.describe_topic(name).await.is_ok() }
    };

    needs!(rule("alice", "create", "topic", "a.t"), alice.create_topic(topic("a.t", 1)).await, !exists("a.t").await);
    needs!(rule("alice", "describe", "topic", "a.t"), alice.describe_topic("a.t").await, true);
    assert_eq!(alice.list_topics().await.unwrap().len(), 1, "lists only what it may describe");
    needs!(
        rule("alice", "alter", "topic", "a.t"),
        alice
            .alter_topic(pb::AlterTopicRequest { topic: "a.t".into(), partitions: Some(2), ..Default::default() })
            .await,
        admin.describe_topic("a.t").await.unwrap().partitions.len() == 1
    );
    let high_watermark = || {
        let admin = admin.clone();
        async move {
            let position = admin.group_position("keel.offset-lookup", "a.t", 0).await.unwrap();
            position.high_watermark
        }
    };
    let produce = pb::ProduceRequest {
        topic: "a.t".into(),
        partition: 0,
        records: vec![pb::Record { value: b"hello".to_vec(), ..Default::default() }],
        ..Default::default()
    };
    // A producer id goes to principals that may produce somewhere.
    assert_eq!(code(&alice.allocate_producer_id().await), Code::PermissionDenied);
    needs!(rule("alice", "produce", "topic", "a.t"), alice.produce(produce.clone()).await, high_watermark().await == 0);
    assert!(alice.allocate_producer_id().await.is_ok());
    let read = pb::ReadRequest { topic: "a.t".into(), partition: 0, max_records: 10, ..Default::default() };
    let records = needs!(rule("alice", "consume", "topic", "a.t"), alice.read(read.clone()).await, true).records;
    assert_eq!(records.len(), 1);

    let join = pb::JoinGroupRequest {
        group: "a.g".into(),
        member: "m1".into(),
        topics: vec!["a.t".into()],
        session_timeout_ms: 10_000,
        ..Default::default()
    };
    let no_group = || {
        let admin = admin.clone();
        async move { admin.list_groups().await.unwrap().is_empty() }
    };
    // Describing a group needs its own rule, or one to use the group.
    assert_eq!(code(&alice.describe_group("a.g").await), Code::PermissionDenied);
    let joined =
        needs!(rule("alice", "join", "group", "a.g"), raw!(alice, Metadata, join_group, join), no_group().await);
    assert!(alice.describe_group("a.g").await.is_ok(), "a member may not describe its group");
    let poll = pb::PollRequest {
        group: "a.g".into(),
        member: "m1".into(),
        generation: joined.generation,
        member_epoch: joined.member_epoch,
        topic: "a.t".into(),
        partition: 0,
        max_records: 10,
        ..Default::default()
    };
    let polled = raw!(alice, Any, poll, poll);
    assert!(polled.is_ok(), "a member with join and consume could not poll: {:?}", polled.err());
    let heartbeat = pb::HeartbeatRequest {
        group: "a.g".into(),
        member: "m1".into(),
        generation: joined.generation,
        member_epoch: joined.member_epoch,
    };
    let beat = raw!(alice, Metadata, heartbeat, heartbeat);
    assert!(beat.is_ok(), "a member could not heartbeat: {:?}", beat.err());
    let leave = pb::LeaveGroupRequest { group: "a.g".into(), member: "m1".into(), member_epoch: joined.member_epoch };
    let left = raw!(alice, Metadata, leave_group, leave);
    assert!(left.is_ok(), "a member could not leave: {:?}", left.err());
    needs!(
        rule("alice", "reset", "group", "a.g"),
        alice
            .reset_group_position(pb::ResetGroupPositionRequest {
                group: "a.g".into(),
                topic: "a.t".into(),
                partition: 0,
                to: Some(pb::reset_group_position_request::To::Latest(true)),
            })
            .await,
        true
    );

    needs!(rule("alice", "delete", "group", "a.g"), alice.delete_group("a.g").await, !no_group().await);

    // A rule taken back stops working on the next request of an open client.
    admin.remove_acl(rule("alice", "consume", "topic", "a.t")).await.unwrap();
    assert_eq!(code(&raw!(alice, Any, poll, poll)), Code::PermissionDenied);
    assert_eq!(code(&alice.read(read.clone()).await), Code::PermissionDenied);

    needs!(rule("alice", "delete", "topic", "a.t"), alice.delete_topic("a.t").await, exists("a.t").await);
    needs!(
        rule("alice", "brokers", "cluster", ""),
        alice.drain_broker(1).await.map(drop).or_else(|e| match e {
            keel_client::ClientError::Refused(s) if s.code() != Code::PermissionDenied => Ok(()),
            e => Err(e),
        }),
        true
    );
    needs!(
        rule("alice", "users", "cluster", ""),
        alice.set_user("bob", &credential("bobs-secret"), false).await,
        admin.list_users().await.unwrap() == ["alice"]
    );
    needs!(rule("alice", "acls", "cluster", ""), alice.list_acls("").await, true);
    needs!(
        rule("alice", "configure", "cluster", ""),
        alice.set_cluster_config("topics_max", 9_999).await,
        admin.describe_cluster_config().await.unwrap().iter().any(|s| s.name == "topics_max" && s.value == 10_000)
    );
    // Who may manage users still may not take over a super user.
    assert_eq!(code(&alice.set_user("admin", &credential("mine-now"), true).await), Code::PermissionDenied);

    // A principal with no rules is refused by every RPC that needs one.
    let bob = client_as(&address, &cluster_ca.pem, None, Some(("bob", "bobs-secret")));
    let ack = pb::AckRequest {
        group: "a.g".into(),
        member: "m1".into(),
        generation: joined.generation,
        topic: "a.t".into(),
        partition: 0,
        offset: 0,
        member_epoch: joined.member_epoch,
        topic_id: None,
    };
    let poll_partitions = pb::PollPartitionsRequest {
        group: "a.g".into(),
        member: "m1".into(),
        generation: joined.generation,
        member_epoch: joined.member_epoch,
        partitions: vec![pb::PollPartition { topic: "a.t".into(), partition: 0, offset: None, topic_id: None }],
        ..Default::default()
    };
    let refusals: Vec<(&str, Code)> = vec![
        ("Produce", code(&raw!(bob, Any, produce, produce))),
        ("ProduceStream", code(&bob.produce(produce.clone()).await)),
        ("AllocateProducerId", code(&bob.allocate_producer_id().await)),
        ("Read", code(&bob.read(read.clone()).await)),
        ("CreateTopic", code(&bob.create_topic(topic("b.t", 1)).await)),
        ("DeleteTopic", code(&bob.delete_topic("other").await)),
        (
            "AlterTopic",
            code(
                &bob.alter_topic(pb::AlterTopicRequest {
                    topic: "other".into(),
                    partitions: Some(3),
                    ..Default::default()
                })
                .await,
            ),
        ),
        ("DescribeTopic", code(&bob.describe_topic("other").await)),
        ("DrainBroker", code(&bob.drain_broker(1).await)),
        ("RemoveBroker", code(&bob.remove_broker(1).await)),
        ("MovePartition", code(&bob.move_partition("other", 0, vec![1]).await)),
        ("JoinGroup", code(&raw!(bob, Metadata, join_group, join))),
        ("Heartbeat", code(&raw!(bob, Metadata, heartbeat, heartbeat))),
        ("LeaveGroup", code(&raw!(bob, Metadata, leave_group, leave))),
        ("Poll", code(&raw!(bob, Any, poll, poll))),
        ("PollPartitions", code(&raw!(bob, Any, poll_partitions, poll_partitions))),
        ("Ack", code(&raw!(bob, Any, ack, ack))),
        ("DescribeGroup", code(&bob.describe_group("a.g").await)),
        ("GroupPosition", code(&bob.group_position("a.g", "other", 0).await)),
        (
            "ResetGroupPosition",
            code(
                &bob.reset_group_position(pb::ResetGroupPositionRequest {
                    group: "a.g".into(),
                    topic: "other".into(),
                    partition: 0,
                    to: Some(pb::reset_group_position_request::To::Earliest(true)),
                })
                .await,
            ),
        ),
        ("DeleteGroup", code(&bob.delete_group("a.g").await)),
        ("SetUser", code(&bob.set_user("carol", &credential("carols-secret"), false).await)),
        ("DeleteUser", code(&bob.delete_user("alice").await)),
        ("ListUsers", code(&bob.list_users().await)),
        ("AddAcl", code(&bob.add_acl(rule("bob", "produce", "topic", "other")).await)),
        ("RemoveAcl", code(&bob.remove_acl(rule("alice", "users", "cluster", "")).await)),
        ("ListAcls", code(&bob.list_acls("").await)),
        ("SetClusterConfig", code(&bob.set_cluster_config("topics_max", 5).await)),
    ];
    for (rpc, answer) in refusals {
        assert_eq!(answer, Code::PermissionDenied, "{rpc} served a principal with no rules");
    }
    assert!(bob.list_topics().await.unwrap().is_empty() && bob.list_groups().await.unwrap().is_empty());
    assert_eq!(admin.list_users().await.unwrap(), ["alice", "bob"], "a refused call changed the users");
    assert_eq!(admin.describe_topic("other").await.unwrap().partitions.len(), 1, "a refused call altered a topic");

    // Refusals are counted: Alice's produce, and Bob's unary and streamed ones.
    let scraped = https_metrics_answer(&metrics, &cluster_ca.pem).unwrap();
    assert!(
        scraped.contains("keel_requests_refused_total{rpc=\"Produce\",lacked=\"produce on topic\"} 3"),
        "{scraped}"
    );
    assert!(scraped.contains("lacked=\"authentication\""), "{scraped}");

    // A deleted user's secret stops working at once, on its open produce
    // stream too.
    admin.delete_user("alice").await.unwrap();
    assert_eq!(code(&alice.list_topics().await), Code::Unauthenticated);
    assert_eq!(code(&alice.produce(produce.clone()).await), Code::Unauthenticated);
}
