//! `keel cert`: a certificate authority and the certificates a TLS cluster
//! needs, in a few commands (as `cockroach cert` does): the CA, one
//! certificate per broker (naming its hosts and its id, see
//! `keel_server::tls`), and client certificates. Files are PEM; keys are
//! written readable by their owner only, and nothing is overwritten.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

// The subcommands read as `cockroach cert`'s do: create-ca, create-broker...
#[allow(clippy::enum_variant_names)]
#[derive(Subcommand)]
pub enum CertCommand {
    /// Create a certificate authority: DIR/ca.pem (give it to every broker
    /// and client as --tls-ca) and DIR/ca.key (keep it safe; it signs the
    /// rest).
    CreateCa {
        #[command(flatten)]
        common: Common,
    },
    /// Create broker ID's certificate, signed by DIR/ca.pem: DIR/broker-ID.pem
    /// and .key, naming the hosts it is reached at and keel-broker-ID.
    CreateBroker {
        /// The broker's id (as its --id).
        id: u64,
        /// Host names and IP addresses clients and brokers reach it at
        /// (comma-separated).
        #[arg(long, value_delimiter = ',', required = true)]
        host: Vec<String>,
        #[command(flatten)]
        common: Common,
    },
    /// Create a client certificate for NAME, signed by DIR/ca.pem:
    /// DIR/client-NAME.pem and .key (for --tls-cert and --tls-key).
    CreateClient {
        /// Who the client is (the certificate's common name).
        name: String,
        #[command(flatten)]
        common: Common,
    },
}

#[derive(Args)]
pub struct Common {
    /// Where the files go (and where the CA is).
    #[arg(long, default_value = "certs")]
    dir: PathBuf,
    /// How many days the certificate is valid.
    #[arg(long, default_value_t = 365)]
    days: u32,
}

pub fn run(command: CertCommand) -> anyhow::Result<()> {
    match command {
        CertCommand::CreateCa { common } => {
            std::fs::create_dir_all(&common.dir).with_context(|| format!("creating {}", common.dir.display()))?;
            let mut params = CertificateParams::new(Vec::<String>::new())?;
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
            params.distinguished_name = distinguished_name(&format!("keel CA {}", unique_suffix()));
            validity(&mut params, common.days);
            let key = KeyPair::generate()?;
            let cert = params.self_signed(&key)?;
            write_pair(&common.dir, "ca", &cert.pem(), &key.serialize_pem())
        }
        CertCommand::CreateBroker { id, host, common } => {
            let mut names = host;
            names.push(keel_server::tls::broker_name(id));
            let mut params = CertificateParams::new(names)?;
            params.distinguished_name = distinguished_name(&keel_server::tls::broker_name(id));
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
            sign(&common, params, &format!("broker-{id}"))
        }
        CertCommand::CreateClient { name, common } => {
            if name.is_empty() || name.contains(['/', '\\']) {
                bail!("{name:?} is not a usable client name: give a name without slashes");
            }
            let mut params = CertificateParams::new(Vec::<String>::new())?;
            params.distinguished_name = distinguished_name(&name);
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
            sign(&common, params, &format!("client-{name}"))
        }
    }
}

fn distinguished_name(common_name: &str) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::OrganizationName, "keel");
    name.push(DnType::CommonName, common_name);
    name
}

/// Something no other CA made by `keel cert` has in its name, so that two
/// clusters' CAs never share a subject.
fn unique_suffix() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
    format!("{:x}", nanos ^ u128::from(std::process::id()) << 64)
}

fn validity(params: &mut CertificateParams, days: u32) {
    let now = time::OffsetDateTime::now_utc();
    // A little slack for clocks slightly behind this one.
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(i64::from(days));
}

/// Sign `params` with DIR/ca.pem and DIR/ca.key; write NAME.pem and .key.
fn sign(common: &Common, mut params: CertificateParams, name: &str) -> anyhow::Result<()> {
    let read = |file: &str| {
        let path = common.dir.join(file);
        std::fs::read_to_string(&path).with_context(|| {
            format!(
                "reading {} (create the CA first: keel cert create-ca --dir {})",
                path.display(),
                common.dir.display()
            )
        })
    };
    let ca_key = KeyPair::from_pem(&read("ca.key")?).context("ca.key holds no usable private key")?;
    let issuer = Issuer::from_ca_cert_pem(&read("ca.pem")?, ca_key).context("ca.pem holds no usable certificate")?;
    validity(&mut params, common.days);
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    write_pair(&common.dir, name, &cert.pem(), &key.serialize_pem())
}

/// Write NAME.pem and NAME.key (owner-only) in `dir`, refusing to overwrite.
fn write_pair(dir: &Path, name: &str, cert: &str, key: &str) -> anyhow::Result<()> {
    let (cert_path, key_path) = (dir.join(format!("{name}.pem")), dir.join(format!("{name}.key")));
    for path in [&cert_path, &key_path] {
        if path.exists() {
            bail!("{} exists: remove it first to replace it", path.display());
        }
    }
    write_new(&key_path, key, 0o600)?;
    write_new(&cert_path, cert, 0o644)?;
    say!("wrote {} and {}", cert_path.display(), key_path.display());
    Ok(())
}

fn write_new(path: &Path, text: &str, mode: u32) -> anyhow::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, mode);
    #[cfg(not(unix))]
    let _ = mode;
    let mut file = options.open(path).with_context(|| format!("creating {}", path.display()))?;
    file.write_all(text.as_bytes()).with_context(|| format!("writing {}", path.display()))?;
    file.sync_all().with_context(|| format!("writing {}", path.display()))
}
