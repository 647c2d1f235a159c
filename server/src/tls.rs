//! TLS on a broker's listeners and on its calls to other brokers (real
//! builds only: madsim's tonic has no TLS; the simulation runs plaintext).
//!
//! One certificate and key serve all three listeners (clients, brokers,
//! metrics) and prove this broker to its peers. Brokers verify each other
//! against the cluster CA, both ways: the internal listener asks every
//! caller for a certificate, and a broker's certificate must name its id as
//! the DNS name `keel-broker-<id>` (checked against the id each Raft and
//! admin message claims, see [`cert_names_broker`]). The client listener
//! asks clients for a certificate only when a client CA is configured.
//!
//! The files are read again on [`Tls::reload`] (`keel serve` calls it on
//! SIGHUP): new connections use the new certificates, open ones keep theirs.
//! Handshakes run in their own tasks, at most [`HANDSHAKES_MAX`] at once and
//! each within [`HANDSHAKE_TIMEOUT`], so a slow client never holds up the
//! accept loop.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use crate::raft::types::NodeId;

/// Longest a TLS handshake may take before its connection is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes under way at once per listener; further connections wait in
/// the kernel's accept queue.
pub const HANDSHAKES_MAX: usize = 256;
/// Handshaken connections waiting for the server to take them.
const ACCEPTED_QUEUE_MAX: usize = 64;

/// Where a broker's TLS files are (PEM).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// This broker's certificate chain, leaf first.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
    /// The cluster CA bundle: signs every broker's certificate.
    pub ca: PathBuf,
    /// The CA bundle that signs client certificates; without it, clients
    /// are not asked for one.
    pub client_ca: Option<PathBuf>,
    /// With a client CA: a client may connect without a certificate (and
    /// then authenticate with a user's secret, or be anonymous). A broker
    /// that authorises requests asks for certificates this way.
    pub client_certificate_optional: bool,
}

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {path}: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("{path} holds no PEM {what}")]
    Empty { path: PathBuf, what: &'static str },
    #[error("the TLS settings are unusable: {0}")]
    Config(String),
}

/// The configurations built from the files, swapped whole on reload.
struct Loaded {
    /// The internal listener: peers must show a certificate the cluster CA
    /// signed.
    internal: Arc<ServerConfig>,
    /// The client listener: a certificate is asked for only with a client CA.
    client: Arc<ServerConfig>,
    /// The metrics endpoint: no client certificates (scrapers seldom have one).
    metrics: Arc<ServerConfig>,
    /// Calls to other brokers.
    outgoing: tonic::transport::ClientTlsConfig,
}

/// Which listener a connection arrived on.
#[derive(Debug, Clone, Copy)]
pub enum Listener {
    Client,
    Internal,
    Metrics,
}

/// A broker's TLS settings, reloadable.
pub struct Tls {
    files: TlsFiles,
    loaded: RwLock<Arc<Loaded>>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").field("files", &self.files).finish_non_exhaustive()
    }
}

impl Tls {
    /// Read the files and build every configuration.
    pub fn load(files: TlsFiles) -> Result<Arc<Tls>, TlsError> {
        let loaded = RwLock::new(Arc::new(build(&files)?));
        Ok(Arc::new(Tls { files, loaded }))
    }

    /// Read the files again; on an error the configuration in use stays.
    pub fn reload(&self) -> Result<(), TlsError> {
        let fresh = Arc::new(build(&self.files)?);
        *self.loaded.write().expect("tls configuration") = fresh;
        Ok(())
    }

    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    fn current(&self) -> Arc<Loaded> {
        self.loaded.read().expect("tls configuration").clone()
    }

    /// The server configuration for new connections to `listener`.
    pub fn server_config(&self, listener: Listener) -> Arc<ServerConfig> {
        let loaded = self.current();
        match listener {
            Listener::Client => loaded.client.clone(),
            Listener::Internal => loaded.internal.clone(),
            Listener::Metrics => loaded.metrics.clone(),
        }
    }

    /// The client configuration for new calls to other brokers.
    pub fn outgoing(&self) -> tonic::transport::ClientTlsConfig {
        self.current().outgoing.clone()
    }

    /// Accept TLS connections on `listener` until the receiver is dropped.
    /// Failed handshakes are logged at debug level and dropped.
    pub fn accept(self: &Arc<Self>, listener: TcpListener, kind: Listener) -> mpsc::Receiver<TlsStream<TcpStream>> {
        let (accepted, incoming) = mpsc::channel(ACCEPTED_QUEUE_MAX);
        let tls = self.clone();
        let handshakes = Arc::new(tokio::sync::Semaphore::new(HANDSHAKES_MAX));
        tokio::spawn(async move {
            loop {
                let Ok(permit) = handshakes.clone().acquire_owned().await else { return };
                let (stream, peer) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        // Out of file descriptors, say: wait rather than spin.
                        tracing::warn!(%error, "accepting a connection failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                if accepted.is_closed() {
                    return;
                }
                let _ = stream.set_nodelay(true);
                let acceptor = TlsAcceptor::from(tls.server_config(kind));
                let accepted = accepted.clone();
                tokio::spawn(async move {
                    let _permit = permit;
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream).into_fallible()).await {
                        Ok(Ok(stream)) => {
                            let _ = accepted.send(stream).await;
                        }
                        Ok(Err((error, stream))) => {
                            tracing::debug!(%peer, %error, "a TLS handshake failed");
                            close_after_alert(stream).await;
                        }
                        Err(_) => tracing::debug!(%peer, "a TLS handshake timed out"),
                    }
                });
            }
        });
        incoming
    }
}

/// Longest a refused connection is kept open so that the client reads the
/// TLS alert that says why.
const REFUSED_LINGER: Duration = Duration::from_secs(1);
/// Bytes of a refused client's data read and thrown away while it lingers.
const REFUSED_DRAIN_BYTES_MAX: usize = 64 * 1024;

/// Closes a connection whose handshake failed without losing the alert
/// rustls wrote to it. Under TLS 1.3 a client sends its first request
/// before the broker has checked its certificate; closing a socket with
/// that request unread sends a reset, and a reset makes the client's kernel
/// drop the alert before the client reads it, so the client sees a bare
/// transport error and retries instead of reporting the refused
/// certificate. So: end our side, read what the client sent until it
/// closes (bounded in time and bytes), then drop.
async fn close_after_alert(mut stream: TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    if stream.shutdown().await.is_err() {
        return;
    }
    let drain = async {
        let mut buffer = [0u8; 4096];
        let mut drained = 0;
        while drained < REFUSED_DRAIN_BYTES_MAX {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(n) => drained += n,
            }
        }
    };
    let _ = tokio::time::timeout(REFUSED_LINGER, drain).await;
}

/// The DNS name a broker's certificate carries to prove its id.
pub fn broker_name(id: NodeId) -> String {
    format!("keel-broker-{id}")
}

/// Whether the leaf of `certs` names broker `id` ([`broker_name`]).
pub fn cert_names_broker(certs: &[CertificateDer<'static>], id: NodeId) -> bool {
    let Some(leaf) = certs.first() else { return false };
    let Ok(cert) = webpki::EndEntityCert::try_from(leaf) else { return false };
    let Ok(name) = ServerName::try_from(broker_name(id)) else { return false };
    cert.verify_is_valid_for_subject_name(&name).is_ok()
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| TlsError::Read { path: path.to_path_buf(), reason: e.to_string() })
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = read(path)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Read { path: path.to_path_buf(), reason: e.to_string() })?;
    if certs.is_empty() {
        return Err(TlsError::Empty { path: path.to_path_buf(), what: "certificate" });
    }
    Ok(certs)
}

fn roots(path: &Path) -> Result<Arc<RootCertStore>, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(path)? {
        roots.add(cert).map_err(|e| TlsError::Config(format!("{}: {e}", path.display())))?;
    }
    Ok(Arc::new(roots))
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn build(files: &TlsFiles) -> Result<Loaded, TlsError> {
    let chain = certificates(&files.cert)?;
    let key_pem = read(&files.key)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|e| TlsError::Read { path: files.key.clone(), reason: format!("no usable private key: {e}") })?;
    let config = |verifier: Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>| {
        let builder = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let builder = match verifier {
            Some(verifier) => builder.with_client_cert_verifier(verifier),
            None => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(|e| TlsError::Config(format!("{} and {}: {e}", files.cert.display(), files.key.display())))?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok::<_, TlsError>(Arc::new(config))
    };
    let verifier =
        |path: &Path, optional: bool| -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, TlsError> {
            let builder = WebPkiClientVerifier::builder_with_provider(roots(path)?, provider());
            let builder = if optional { builder.allow_unauthenticated() } else { builder };
            builder.build().map_err(|e| TlsError::Config(format!("{}: {e}", path.display())))
        };
    let internal = config(Some(verifier(&files.ca, false)?))?;
    let client = match &files.client_ca {
        Some(path) => config(Some(verifier(path, files.client_certificate_optional)?))?,
        None => config(None)?,
    };
    let mut metrics = (*config(None)?).clone();
    metrics.alpn_protocols = vec![b"http/1.1".to_vec()];
    let ca_pem = read(&files.ca)?;
    let outgoing = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(ca_pem))
        .identity(tonic::transport::Identity::from_pem(read(&files.cert)?, key_pem));
    Ok(Loaded { internal, client, metrics: Arc::new(metrics), outgoing })
}
