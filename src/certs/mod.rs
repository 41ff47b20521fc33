//! CA and serving certificates for the webhook (rcgen, ring).
//!
//! A certificate directory holds four PEM files: [`CA_CERT_FILE`], [`CA_KEY_FILE`],
//! [`TLS_CERT_FILE`], [`TLS_KEY_FILE`] (the key files with mode 0600). [`ensure`] fills such a
//! directory: an existing CA is always reused (its certificate is what the API server trusts, the
//! `caBundle`), and an existing serving certificate is reused while it chains to that CA, covers
//! the requested names and stays valid for more than [`RENEW_BEFORE`]; anything else is
//! generated. Files are replaced atomically (written beside, then renamed), so a server polling
//! them never reads half a file.
//!
//! The `certs` subcommand ([`Args`]) fills a directory for a Kubernetes Service, and with
//! `--secret` / `--patch-webhooks` keeps them in a Secret and the webhook configurations'
//! `caBundle` ([`cluster`]).

pub mod cluster;
pub mod rotation;

use std::fs;
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier as _;
use rustls::pki_types::pem::{self, PemObject as _};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};

use crate::settings::Global;

/// The CA certificate (what the API server trusts: the webhook configuration's `caBundle`).
pub const CA_CERT_FILE: &str = "ca.crt";
/// The CA private key.
pub const CA_KEY_FILE: &str = "ca.key";
/// The serving certificate.
pub const TLS_CERT_FILE: &str = "tls.crt";
/// The serving certificate's private key.
pub const TLS_KEY_FILE: &str = "tls.key";

const DAY: Duration = Duration::from_secs(24 * 60 * 60);
/// Validity of a generated CA.
pub const CA_VALIDITY: Duration = Duration::from_secs(3650 * 24 * 60 * 60);
/// Validity of a generated serving certificate.
pub const SERVING_VALIDITY: Duration = Duration::from_secs(365 * 24 * 60 * 60);
/// A serving certificate that expires sooner than this is renewed.
pub const RENEW_BEFORE: Duration = Duration::from_secs(30 * 24 * 60 * 60);
/// Certificates start this long before "now", to tolerate clock skew between machines (a tenth
/// of the validity when that is shorter, so that lifetimes of seconds, as in tests, stay mostly
/// ahead).
const BACKDATE: Duration = Duration::from_secs(60 * 60);

/// Longest wait for one Kubernetes API request of `certs`.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Common name of a CA generated here.
pub const CA_COMMON_NAME: &str = "jobset-inplace webhook CA";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: no PEM certificate in the file")]
    NoCertificate { path: PathBuf },
    #[error("{path}: not a usable certificate: {reason}")]
    BadCertificate { path: PathBuf, reason: String },
    #[error("{path}: not a usable private key: {reason}")]
    BadKey { path: PathBuf, reason: String },
    #[error("{present} exists but {missing} does not: provide both or remove both")]
    Incomplete { present: PathBuf, missing: PathBuf },
    #[error("{ca_key} does not sign for {ca_cert}: {reason}")]
    CaMismatch {
        ca_cert: PathBuf,
        ca_key: PathBuf,
        reason: String,
    },
    #[error("invalid certificate name {name:?}: {reason}")]
    InvalidName { name: String, reason: String },
    #[error("no names given for the serving certificate")]
    NoNames,
    #[error("cannot generate a certificate: {0}")]
    Generate(#[source] rcgen::Error),
    /// The blocking task that generates certificates panicked or was cancelled.
    #[error("cannot generate a certificate: {0}")]
    GenerateTask(#[source] tokio::task::JoinError),
    #[error("{what}: {source}")]
    Kubernetes {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("{what}: no answer within {after:?}")]
    Timeout { what: String, after: Duration },
    #[error("{what}: kept changing while being written; another replica keeps replacing it")]
    Contended { what: String },
    #[error("cannot build the caBundle patch: {0}")]
    Patch(#[source] serde_json::Error),
    #[error("{flag} (or env {env}) is required")]
    Required {
        flag: &'static str,
        env: &'static str,
    },
}

/// A certificate and its private key, both PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct PemPair {
    pub cert: String,
    pub key: String,
}

impl std::fmt::Debug for PemPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PemPair")
            .field("cert", &self.cert)
            .field("key", &"[elided]")
            .finish()
    }
}

/// What [`ensure`] did with one pair of files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// The files were there and are kept.
    Reused,
    /// There were no files; new ones were written.
    Generated,
    /// The files were there but not good enough (the reason says why); new ones were written.
    Renewed(String),
}

/// The four files of a certificate directory, and what [`ensure`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ensured {
    pub ca_cert: PathBuf,
    pub ca_key: PathBuf,
    pub tls_cert: PathBuf,
    pub tls_key: PathBuf,
    pub ca: Action,
    pub serving: Action,
}

/// The paths of the four files in `dir`: (ca.crt, ca.key, tls.crt, tls.key).
pub fn paths(dir: &Path) -> (PathBuf, PathBuf, PathBuf, PathBuf) {
    (
        dir.join(CA_CERT_FILE),
        dir.join(CA_KEY_FILE),
        dir.join(TLS_CERT_FILE),
        dir.join(TLS_KEY_FILE),
    )
}

/// The names of a webhook serving on this machine: `localhost`, `127.0.0.1`, `::1`.
pub fn local_names() -> Vec<String> {
    vec!["localhost".into(), "127.0.0.1".into(), "::1".into()]
}

/// The DNS names of a Kubernetes Service: `<svc>`, `<svc>.<ns>`, `<svc>.<ns>.svc`,
/// `<svc>.<ns>.svc.cluster.local`.
pub fn service_names(service: &str, namespace: &str) -> Vec<String> {
    vec![
        service.to_owned(),
        format!("{service}.{namespace}"),
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
    ]
}

/// Checks every name is a DNS name or an IP address a certificate can carry.
pub fn check_names(names: &[String]) -> Result<(), Error> {
    if names.is_empty() {
        return Err(Error::NoNames);
    }
    for name in names {
        ServerName::try_from(name.as_str()).map_err(|e| Error::InvalidName {
            name: name.clone(),
            reason: e.to_string(),
        })?;
    }
    Ok(())
}

fn generate_error(e: rcgen::Error) -> Error {
    Error::Generate(e)
}

/// Sets `not_before` a little before `now` and `not_after` `validity` after it.
fn set_validity(params: &mut CertificateParams, now: SystemTime, validity: Duration) {
    let since_epoch = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let epoch = rcgen::date_time_ymd(1970, 1, 1);
    let backdate = BACKDATE.min(validity / 10);
    params.not_before = epoch + since_epoch.saturating_sub(backdate);
    params.not_after = epoch + since_epoch + validity;
}

/// Generates a self-signed CA (ECDSA P-256) valid for `validity` from now, named
/// [`CA_COMMON_NAME`].
pub fn generate_ca(validity: Duration) -> Result<PemPair, Error> {
    generate_ca_named(validity, SystemTime::now(), |_| CA_COMMON_NAME.to_owned())
}

/// Generates a CA as [`generate_ca`] does, its common name [`CA_COMMON_NAME`] followed by eight
/// hex digits of its public key: two CAs trusted together during a rotation then have different
/// subjects, so no client has to tell them apart by key alone.
pub fn generate_distinct_ca(validity: Duration, now: SystemTime) -> Result<PemPair, Error> {
    generate_ca_named(validity, now, |key| {
        use rcgen::PublicKeyData as _;
        // An uncompressed P-256 point: 0x04, then X; four bytes of X are random enough.
        let id: String = key
            .der_bytes()
            .iter()
            .skip(1)
            .take(4)
            .map(|b| format!("{b:02x}"))
            .collect();
        format!("{CA_COMMON_NAME} {id}")
    })
}

fn generate_ca_named(
    validity: Duration,
    now: SystemTime,
    common_name: impl FnOnce(&KeyPair) -> String,
) -> Result<PemPair, Error> {
    let key = KeyPair::generate().map_err(generate_error)?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name(&key));
    dn.push(DnType::OrganizationName, "jobset-inplace");
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    set_validity(&mut params, now, validity);
    let cert = params.self_signed(&key).map_err(generate_error)?;
    Ok(PemPair {
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

/// Generates a serving certificate (ECDSA P-256, `serverAuth`) for `names` (DNS names or IP
/// addresses), signed by `ca`, valid for `validity` from now.
pub fn issue_serving(ca: &PemPair, names: &[String], validity: Duration) -> Result<PemPair, Error> {
    issue_serving_at(ca, names, validity, SystemTime::now())
}

/// [`issue_serving`], valid for `validity` from `now`.
pub fn issue_serving_at(
    ca: &PemPair,
    names: &[String],
    validity: Duration,
    now: SystemTime,
) -> Result<PemPair, Error> {
    check_names(names)?;
    let ca_key = KeyPair::from_pem(&ca.key).map_err(|e| Error::BadKey {
        path: PathBuf::from(CA_KEY_FILE),
        reason: e.to_string(),
    })?;
    let issuer = Issuer::from_ca_cert_pem(&ca.cert, ca_key).map_err(|e| Error::BadCertificate {
        path: PathBuf::from(CA_CERT_FILE),
        reason: e.to_string(),
    })?;
    issue_with(&issuer, names, validity, now)
}

fn issue_with(
    issuer: &Issuer<'_, KeyPair>,
    names: &[String],
    validity: Duration,
    now: SystemTime,
) -> Result<PemPair, Error> {
    let key = KeyPair::generate().map_err(generate_error)?;
    let mut params = CertificateParams::new(names.to_vec()).map_err(|e| Error::InvalidName {
        name: names.join(","),
        reason: e.to_string(),
    })?;
    let mut dn = DistinguishedName::new();
    if let Some(first) = names.first() {
        dn.push(DnType::CommonName, first.as_str());
    }
    params.distinguished_name = dn;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    set_validity(&mut params, now, validity);
    let cert = params.signed_by(&key, issuer).map_err(generate_error)?;
    Ok(PemPair {
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

/// All certificates of a PEM text, in order; an error when there is none or the PEM is broken.
pub fn parse_certs(pem: &[u8], path: &Path) -> Result<Vec<CertificateDer<'static>>, Error> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Error::BadCertificate {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(Error::NoCertificate {
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

/// The first private key (PKCS#8, PKCS#1 or SEC1) of a PEM text: `Ok(None)` when the text has
/// none, the reason when its PEM is broken. rustls' own PEM reader (rustls-pki-types), which
/// replaced the unmaintained rustls-pemfile (RUSTSEC-2025-0134).
pub fn parse_private_key(pem: &[u8]) -> Result<Option<PrivateKeyDer<'static>>, String> {
    match PrivateKeyDer::from_pem_slice(pem) {
        Ok(key) => Ok(Some(key)),
        Err(pem::Error::NoItemsFound) => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

/// The `notAfter` of a DER X.509 certificate as Unix time; `None` when it cannot be read.
pub fn not_after(der: &[u8]) -> Option<i64> {
    validity(der).map(|(_, not_after)| not_after)
}

/// The `notBefore` and `notAfter` of a DER X.509 certificate as Unix time; `None` when it
/// cannot be read.
pub fn validity(der: &[u8]) -> Option<(i64, i64)> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let v = cert.validity();
    Some((v.not_before.timestamp(), v.not_after.timestamp()))
}

/// Why the serving certificate `new` (DER, the leaf) must not replace `old`: it is not valid at
/// `at` (expired, or not yet valid), or it does not cover every DNS name and IP address `old`
/// covers (clients that reach the server by one of them would fail). `None` when it may.
pub fn replacement_problem(old: &[u8], new: &[u8], at: SystemTime) -> Option<String> {
    use x509_parser::extensions::GeneralName;
    let (_, new_cert) = match x509_parser::parse_x509_certificate(new) {
        Ok(c) => c,
        Err(e) => return Some(format!("not an X.509 certificate: {e}")),
    };
    let secs = at
        .duration_since(UNIX_EPOCH)
        .ok()
        .and_then(|d| i64::try_from(d.as_secs()).ok())
        .unwrap_or(0);
    let validity = new_cert.validity();
    if secs < validity.not_before.timestamp() {
        return Some(format!("not valid before {}", validity.not_before));
    }
    if secs > validity.not_after.timestamp() {
        return Some(format!("expired on {}", validity.not_after));
    }
    let names = |cert: &x509_parser::certificate::X509Certificate<'_>| -> Vec<String> {
        cert.subject_alternative_name()
            .ok()
            .flatten()
            .map(|san| {
                san.value
                    .general_names
                    .iter()
                    .filter_map(|n| match n {
                        GeneralName::DNSName(d) => Some(d.to_ascii_lowercase()),
                        GeneralName::IPAddress(ip) => Some(format!("{ip:?}")),
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let Ok((_, old_cert)) = x509_parser::parse_x509_certificate(old) else {
        return None;
    };
    let new_names = names(&new_cert);
    let missing: Vec<String> = names(&old_cert)
        .into_iter()
        .filter(|n| !new_names.contains(n))
        .collect();
    if missing.is_empty() {
        None
    } else {
        Some(format!(
            "does not cover names the current certificate serves: {}",
            missing.join(", ")
        ))
    }
}

/// Why `cert_pem` is not a serving certificate to keep: it must chain to `ca_cert_pem`, be valid
/// for every name in `names` at `at` (so pass "now + margin"), and match `key_pem`.
/// `None` when it is good.
pub fn serving_cert_problem(
    ca_cert_pem: &str,
    cert_pem: &str,
    key_pem: &str,
    names: &[String],
    at: SystemTime,
) -> Option<String> {
    let ca = match parse_certs(ca_cert_pem.as_bytes(), Path::new(CA_CERT_FILE)) {
        Ok(certs) => certs,
        Err(e) => return Some(e.to_string()),
    };
    let chain = match parse_certs(cert_pem.as_bytes(), Path::new(TLS_CERT_FILE)) {
        Ok(certs) => certs,
        Err(e) => return Some(e.to_string()),
    };
    let key = match parse_private_key(key_pem.as_bytes()) {
        Ok(Some(key)) => key,
        Ok(None) => return Some("no private key in tls.key".into()),
        Err(e) => return Some(format!("tls.key: {e}")),
    };
    let provider = rustls::crypto::ring::default_provider();
    if let Err(e) = rustls::sign::CertifiedKey::from_der(chain.clone(), key, &provider) {
        return Some(format!("tls.key does not belong to tls.crt: {e}"));
    }
    verify_chain(&ca, &chain, names, at).err()
}

/// Checks `chain` (leaf first) chains to one of `roots` and is valid for every name at `at`.
pub fn verify_chain(
    roots: &[CertificateDer<'static>],
    chain: &[CertificateDer<'static>],
    names: &[String],
    at: SystemTime,
) -> Result<(), String> {
    let mut store = rustls::RootCertStore::empty();
    for root in roots {
        store
            .add(root.clone())
            .map_err(|e| format!("ca.crt is not a usable trust anchor: {e}"))?;
    }
    let verifier = WebPkiServerVerifier::builder_with_provider(
        Arc::new(store),
        Arc::new(rustls::crypto::ring::default_provider()),
    )
    .build()
    .map_err(|e| e.to_string())?;
    let (leaf, intermediates) = chain.split_first().ok_or("no certificate")?;
    let since_epoch = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    for name in names {
        let server_name = ServerName::try_from(name.as_str())
            .map_err(|e| format!("invalid name {name:?}: {e}"))?;
        verifier
            .verify_server_cert(
                leaf,
                intermediates,
                &server_name,
                &[],
                UnixTime::since_unix_epoch(since_epoch),
            )
            .map_err(|e| format!("not valid for {name} then: {e}"))?;
    }
    Ok(())
}

fn read_optional(path: &Path) -> Result<Option<String>, Error> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(Error::Read {
            path: path.to_owned(),
            source,
        }),
    }
}

/// Writes `contents` to `path` atomically (a temporary file beside it, then a rename), with
/// `mode` permissions.
pub fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> Result<(), Error> {
    let write_error = |source: std::io::Error| Error::Write {
        path: path.to_owned(),
        source,
    };
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{file_name}.{}.tmp", std::process::id()));
    let result = (|| {
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)?;
        // The mode of `open` is filtered by the umask and ignored for an existing file.
        file.set_permissions(fs::Permissions::from_mode(mode))?;
        file.write_all(contents)?;
        file.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map_err(write_error)
}

fn write_pair(cert_path: &Path, key_path: &Path, pair: &PemPair) -> Result<(), Error> {
    // Key first: a poller that sees the new certificate with the old key rejects the pair and
    // retries; it then finds both new.
    write_atomic(key_path, pair.key.as_bytes(), 0o600)?;
    write_atomic(cert_path, pair.cert.as_bytes(), 0o644)
}

/// Loads the CA of a directory, checking the key signs for the certificate.
fn load_ca(ca_cert: &Path, ca_key: &Path, cert_pem: &str, key_pem: &str) -> Result<(), Error> {
    parse_certs(cert_pem.as_bytes(), ca_cert)?;
    let key = KeyPair::from_pem(key_pem).map_err(|e| Error::BadKey {
        path: ca_key.to_owned(),
        reason: e.to_string(),
    })?;
    Issuer::from_ca_cert_pem(cert_pem, key).map_err(|e| Error::BadCertificate {
        path: ca_cert.to_owned(),
        reason: e.to_string(),
    })?;
    Ok(())
}

/// Fills `dir` (created when missing, mode 0700) with a CA and a serving certificate for
/// `names`, reusing what is there and still good (see the module documentation).
pub fn ensure(dir: &Path, names: &[String]) -> Result<Ensured, Error> {
    check_names(names)?;
    if !dir.exists() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|source| Error::Write {
                path: dir.to_owned(),
                source,
            })?;
    }
    let (ca_cert, ca_key, tls_cert, tls_key) = paths(dir);

    let (ca, ca_action) = match (read_optional(&ca_cert)?, read_optional(&ca_key)?) {
        (Some(cert), Some(key)) => {
            load_ca(&ca_cert, &ca_key, &cert, &key)?;
            (PemPair { cert, key }, Action::Reused)
        }
        (None, None) => {
            let ca = generate_ca(CA_VALIDITY)?;
            write_pair(&ca_cert, &ca_key, &ca)?;
            (ca, Action::Generated)
        }
        (Some(_), None) => {
            return Err(Error::Incomplete {
                present: ca_cert,
                missing: ca_key,
            });
        }
        (None, Some(_)) => {
            return Err(Error::Incomplete {
                present: ca_key,
                missing: ca_cert,
            });
        }
    };

    let serving_action = match (read_optional(&tls_cert)?, read_optional(&tls_key)?) {
        (Some(cert), Some(key)) => {
            // Unreadable files are the user's to look at, not ours to overwrite silently.
            parse_certs(cert.as_bytes(), &tls_cert)?;
            match parse_private_key(key.as_bytes()) {
                Ok(Some(_)) => {}
                Ok(None) => {
                    return Err(Error::BadKey {
                        path: tls_key,
                        reason: "no PEM private key in the file".into(),
                    });
                }
                Err(e) => {
                    return Err(Error::BadKey {
                        path: tls_key,
                        reason: e.to_string(),
                    });
                }
            }
            let at = SystemTime::now() + RENEW_BEFORE;
            match serving_cert_problem(&ca.cert, &cert, &key, names, at) {
                None => Action::Reused,
                Some(problem) => Action::Renewed(problem),
            }
        }
        (None, None) => Action::Generated,
        (Some(_), None) => Action::Renewed(format!("{} is missing", tls_key.display())),
        (None, Some(_)) => Action::Renewed(format!("{} is missing", tls_cert.display())),
    };

    if serving_action != Action::Reused {
        let serving = issue_serving(&ca, names, SERVING_VALIDITY).map_err(|e| match e {
            Error::BadKey { reason, .. } => Error::BadKey {
                path: ca_key.clone(),
                reason,
            },
            Error::BadCertificate { reason, .. } => Error::BadCertificate {
                path: ca_cert.clone(),
                reason,
            },
            other => other,
        })?;
        // The new certificate must verify against ca.crt: it does not when ca.key is another CA's.
        let ca_certs = parse_certs(ca.cert.as_bytes(), &ca_cert)?;
        let chain = parse_certs(serving.cert.as_bytes(), &tls_cert)?;
        verify_chain(&ca_certs, &chain, names, SystemTime::now()).map_err(|reason| {
            Error::CaMismatch {
                ca_cert: ca_cert.clone(),
                ca_key: ca_key.clone(),
                reason,
            }
        })?;
        if let Err(reason) = verify_chain(&ca_certs, &chain, names, SystemTime::now() + DAY * 30) {
            tracing::warn!(
                ca = %ca_cert.display(),
                %reason,
                "the CA expires within 30 days; remove ca.crt and ca.key to generate a new one \
                 (and update the caBundle)"
            );
        }
        write_pair(&tls_cert, &tls_key, &serving)?;
    }

    Ok(Ensured {
        ca_cert,
        ca_key,
        tls_cert,
        tls_key,
        ca: ca_action,
        serving: serving_action,
    })
}

/// Flags of `jobset-inplace certs`.
#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// Name of the webhook's Kubernetes Service; the certificate covers `<svc>`, `<svc>.<ns>`,
    /// `<svc>.<ns>.svc` and `<svc>.<ns>.svc.cluster.local`.
    /// Required.
    #[arg(long, env = "JOBSET_INPLACE_WEBHOOK_SERVICE", value_name = "NAME")]
    pub service: Option<String>,

    /// Namespace of the webhook's Service. Required.
    #[arg(long, env = "POD_NAMESPACE", value_name = "NS")]
    pub namespace: Option<String>,

    /// Directory for ca.crt, ca.key, tls.crt, tls.key (created when missing). An existing CA is
    /// reused; an existing serving certificate is kept while valid for more than 30 days. With
    /// --secret, a copy of what the Secret holds (ca.crt: every CA trusted).
    #[arg(
        long,
        env = "JOBSET_INPLACE_CERT_DIR",
        default_value = "certs",
        value_name = "DIR"
    )]
    pub out: PathBuf,

    /// More names (DNS names or IP addresses) for the serving certificate; repeatable.
    #[arg(long = "extra-name", value_name = "NAME")]
    pub extra_names: Vec<String>,

    /// Keep the certificates in this Kubernetes Secret (kubernetes.io/tls plus ca.crt and
    /// ca.key): created when absent, its CA reused, its serving certificate renewed once 2/3 of
    /// its lifetime has passed, and its CA rotated as `webhook --self-signed` does (a run
    /// starts a rotation, a run after the 7-day overlap switches, one after another overlap
    /// ends it).
    #[arg(long, env = "JOBSET_INPLACE_CERT_SECRET", value_name = "NAME")]
    pub secret: Option<String>,

    /// Set the CA as caBundle of the Mutating and Validating webhook configurations named by
    /// --webhook-config.
    #[arg(long, env = "JOBSET_INPLACE_PATCH_WEBHOOKS")]
    pub patch_webhooks: bool,

    /// Name of the MutatingWebhookConfiguration and ValidatingWebhookConfiguration.
    #[arg(
        long,
        env = "JOBSET_INPLACE_WEBHOOK_CONFIG",
        default_value = "jobset-inplace",
        value_name = "NAME"
    )]
    pub webhook_config: String,
}

impl Args {
    pub async fn run(self, _global: Global) -> Result<ExitCode, Error> {
        let service = self.service.clone().ok_or(Error::Required {
            flag: "--service",
            env: "JOBSET_INPLACE_WEBHOOK_SERVICE",
        })?;
        let namespace = self.namespace.clone().ok_or(Error::Required {
            flag: "--namespace",
            env: "POD_NAMESPACE",
        })?;
        let mut names = service_names(&service, &namespace);
        names.extend(self.extra_names.iter().cloned());
        if self.secret.is_some() || self.patch_webhooks {
            let client = kube::Client::try_default()
                .await
                .map_err(|source| Error::Kubernetes {
                    what: "the Kubernetes API".into(),
                    source,
                })?;
            let config = self.patch_webhooks.then_some(self.webhook_config.as_str());
            match &self.secret {
                Some(secret) => {
                    let target = cluster::Target {
                        namespace: namespace.clone(),
                        secret: secret.clone(),
                        webhook_config: config.map(str::to_owned),
                        names,
                        dir: self.out.clone(),
                        install_ca_key: true,
                    };
                    let policy = rotation::Policy {
                        ca_validity: CA_VALIDITY,
                        serving_validity: SERVING_VALIDITY,
                        overlap: rotation::Policy::DEFAULT.overlap,
                    };
                    let report = cluster::Renewer::new(client, target, policy, REQUEST_TIMEOUT)
                        .step()
                        .await?;
                    for step in &report.steps {
                        println!("{step}");
                    }
                    println!(
                        "certificates in secret {namespace}/{secret} and {}",
                        self.out.display()
                    );
                }
                None => {
                    let out = self.out.clone();
                    let ensured = tokio::task::spawn_blocking(move || ensure(&out, &names))
                        .await
                        .map_err(Error::GenerateTask)??;
                    let ca = std::fs::read(&ensured.ca_cert).map_err(|source| Error::Read {
                        path: ensured.ca_cert.clone(),
                        source,
                    })?;
                    if let Some(config) = config {
                        cluster::patch_ca_bundle(&client, config, &ca, REQUEST_TIMEOUT).await?;
                    }
                }
            }
            if let Some(config) = config {
                println!("caBundle of webhook configurations {config} set");
            }
            return Ok(ExitCode::SUCCESS);
        }
        let out = self.out.clone();
        let ensured = tokio::task::spawn_blocking(move || ensure(&out, &names))
            .await
            .map_err(Error::GenerateTask)??;
        let describe = |action: &Action| match action {
            Action::Reused => "reused".to_owned(),
            Action::Generated => "generated".to_owned(),
            Action::Renewed(why) => format!("renewed ({why})"),
        };
        println!(
            "CA: {} {} ({})",
            describe(&ensured.ca),
            ensured.ca_cert.display(),
            ensured.ca_key.display()
        );
        println!(
            "serving certificate: {} {} ({}) for {}",
            describe(&ensured.serving),
            ensured.tls_cert.display(),
            ensured.tls_key.display(),
            service_names(&service, &namespace)
                .into_iter()
                .chain(self.extra_names)
                .collect::<Vec<_>>()
                .join(", ")
        );
        Ok(ExitCode::SUCCESS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        service_names("hook", "ns")
    }

    #[test]
    fn service_names_cover_the_four_forms() {
        assert_eq!(
            names(),
            [
                "hook",
                "hook.ns",
                "hook.ns.svc",
                "hook.ns.svc.cluster.local"
            ]
        );
    }

    #[test]
    fn generates_then_reuses_ca_and_serving_cert() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = ensure(dir.path(), &names()).expect("first");
        assert_eq!(first.ca, Action::Generated);
        assert_eq!(first.serving, Action::Generated);
        let ca1 = fs::read(&first.ca_cert).expect("ca");
        let tls1 = fs::read(&first.tls_cert).expect("tls");
        for key in [&first.ca_key, &first.tls_key] {
            let mode = fs::metadata(key).expect("meta").permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", key.display());
        }

        let second = ensure(dir.path(), &names()).expect("second");
        assert_eq!(second.ca, Action::Reused);
        assert_eq!(second.serving, Action::Reused);
        assert_eq!(fs::read(&second.ca_cert).expect("ca"), ca1);
        assert_eq!(fs::read(&second.tls_cert).expect("tls"), tls1);

        // Other names: the CA stays, the serving certificate is renewed by it.
        let third = ensure(dir.path(), &local_names()).expect("third");
        assert_eq!(third.ca, Action::Reused);
        assert!(matches!(third.serving, Action::Renewed(_)), "{third:?}");
        assert_eq!(fs::read(&third.ca_cert).expect("ca"), ca1);
        let tls3 = fs::read_to_string(&third.tls_cert).expect("tls");
        let key3 = fs::read_to_string(&third.tls_key).expect("key");
        let ca = String::from_utf8(ca1).expect("utf8");
        assert_eq!(
            serving_cert_problem(&ca, &tls3, &key3, &local_names(), SystemTime::now()),
            None
        );
    }

    #[test]
    fn replacements_must_be_valid_and_cover_the_served_names() {
        let day = Duration::from_secs(86_400);
        let ca = generate_ca(day * 30).expect("ca");
        let der = |pair: &PemPair| {
            parse_certs(pair.cert.as_bytes(), Path::new("tls.crt")).expect("parses")[0].to_vec()
        };
        let served = der(&issue_serving(&ca, &names(), day * 10).expect("served"));
        let renewed = der(&issue_serving(&ca, &names(), day * 10).expect("renewed"));
        let now = SystemTime::now();
        assert_eq!(replacement_problem(&served, &renewed, now), None);
        let expired = replacement_problem(&served, &renewed, now + day * 11).expect("expired");
        assert!(expired.starts_with("expired on"), "{expired}");
        let early = replacement_problem(&served, &renewed, now - day).expect("not yet");
        assert!(early.starts_with("not valid before"), "{early}");
        let other =
            der(&issue_serving(&ca, &["elsewhere.example".to_owned()], day).expect("other"));
        let wrong = replacement_problem(&served, &other, now).expect("wrong names");
        assert!(wrong.contains("hook.ns.svc"), "{wrong}");
        // More names than before is fine.
        let mut more = names();
        more.push("extra.example".to_owned());
        let wider = der(&issue_serving(&ca, &more, day).expect("wider"));
        assert_eq!(replacement_problem(&served, &wider, now), None);
        assert!(replacement_problem(&served, b"garbage", now).is_some());
    }

    #[test]
    fn serving_cert_covers_exactly_its_names() {
        let ca = generate_ca(CA_VALIDITY).expect("ca");
        let serving = issue_serving(&ca, &names(), SERVING_VALIDITY).expect("serving");
        let now = SystemTime::now();
        assert_eq!(
            serving_cert_problem(&ca.cert, &serving.cert, &serving.key, &names(), now),
            None
        );
        for other in ["other.ns.svc", "hook.other", "localhost", "127.0.0.1"] {
            let problem = serving_cert_problem(
                &ca.cert,
                &serving.cert,
                &serving.key,
                &[other.to_owned()],
                now,
            );
            assert!(problem.is_some(), "{other} must not be covered");
        }
        // IP addresses are IP SANs.
        let local = issue_serving(&ca, &local_names(), SERVING_VALIDITY).expect("local");
        assert_eq!(
            serving_cert_problem(&ca.cert, &local.cert, &local.key, &local_names(), now),
            None
        );
        // Another CA does not vouch for it; another key does not belong to it.
        let other_ca = generate_ca(CA_VALIDITY).expect("ca");
        assert!(
            serving_cert_problem(&other_ca.cert, &serving.cert, &serving.key, &names(), now)
                .is_some()
        );
        assert!(serving_cert_problem(&ca.cert, &serving.cert, &local.key, &names(), now).is_some());
    }

    #[test]
    fn serving_cert_near_expiry_is_renewed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = ensure(dir.path(), &names()).expect("first");
        let ca = PemPair {
            cert: fs::read_to_string(&first.ca_cert).expect("ca"),
            key: fs::read_to_string(&first.ca_key).expect("key"),
        };
        let short = issue_serving(&ca, &names(), DAY * 10).expect("short");
        write_pair(&first.tls_cert, &first.tls_key, &short).expect("write");

        let second = ensure(dir.path(), &names()).expect("second");
        assert_eq!(second.ca, Action::Reused);
        assert!(
            matches!(&second.serving, Action::Renewed(why) if why.contains("not valid")),
            "{second:?}"
        );
        let renewed = fs::read_to_string(&second.tls_cert).expect("tls");
        assert_ne!(renewed, short.cert);
        let key = fs::read_to_string(&second.tls_key).expect("key");
        let in_300_days = SystemTime::now() + DAY * 300;
        assert_eq!(
            serving_cert_problem(&ca.cert, &renewed, &key, &names(), in_300_days),
            None
        );
    }

    #[test]
    fn garbage_pem_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = ensure(dir.path(), &names()).expect("first");

        for victim in [
            &first.ca_cert,
            &first.ca_key,
            &first.tls_cert,
            &first.tls_key,
        ] {
            let saved = fs::read(victim).expect("read");
            fs::write(victim, "-----BEGIN GARBAGE-----\nnot base64\n").expect("write");
            let err = ensure(dir.path(), &names()).expect_err("garbage");
            let message = err.to_string();
            assert!(
                message.contains(&victim.display().to_string()),
                "{message} names {}",
                victim.display()
            );
            assert!(!message.contains('\n'), "{message}");
            fs::write(victim, saved).expect("restore");
        }
        assert_eq!(
            ensure(dir.path(), &names()).expect("restored").serving,
            Action::Reused
        );
    }

    #[test]
    fn a_ca_missing_its_key_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = ensure(dir.path(), &names()).expect("first");
        fs::remove_file(&first.ca_key).expect("rm");
        let message = ensure(dir.path(), &names())
            .expect_err("incomplete")
            .to_string();
        assert!(message.contains("ca.key"), "{message}");
    }

    #[test]
    fn a_ca_key_of_another_ca_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = ensure(dir.path(), &names()).expect("first");
        let other = generate_ca(CA_VALIDITY).expect("other");
        fs::write(&first.ca_key, other.key).expect("write");
        fs::remove_file(&first.tls_cert).expect("rm");
        let message = ensure(dir.path(), &names())
            .expect_err("mismatch")
            .to_string();
        assert!(message.contains("ca.key"), "{message}");
    }

    #[test]
    fn bad_names_are_rejected() {
        let err = check_names(&["bad name".to_owned()]).expect_err("bad");
        assert!(err.to_string().contains("bad name"), "{err}");
        assert!(matches!(check_names(&[]), Err(Error::NoNames)));
    }

    /// The `certs` subcommand's flags alone (`cli.rs` composes the full command line).
    #[derive(Debug, clap::Parser)]
    #[command(name = "certs")]
    struct Certs {
        #[command(flatten)]
        args: Args,
    }

    fn certs_args(args: &[&str]) -> Args {
        use clap::Parser as _;
        Certs::try_parse_from(["certs"].iter().chain(args))
            .expect("parses")
            .args
    }

    #[tokio::test]
    async fn the_subcommand_fills_a_directory() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("out");
        let out_arg = out.to_string_lossy().into_owned();
        let global = Global::default();
        let base = [
            "--service",
            "hook",
            "--namespace",
            "ns",
            "--out",
            out_arg.as_str(),
        ];

        // The in-cluster forms need the API: without one, a one-line error and nothing written.
        for extra in [&["--secret", "s"][..], &["--patch-webhooks"][..]] {
            let args: Vec<&str> = base.iter().chain(extra).copied().collect();
            let Err(e) = certs_args(&args).run(global).await else {
                continue; // a cluster is configured on this machine
            };
            let message = e.to_string();
            assert!(message.contains("Kubernetes API"), "{message}");
            assert!(!message.contains('\n'), "{message}");
            assert!(!out.exists(), "nothing written without a cluster");
        }

        let message = certs_args(&["--out", out_arg.as_str()])
            .run(global)
            .await
            .expect_err("no service")
            .to_string();
        assert!(message.contains("--service"), "{message}");

        let code = certs_args(&base).run(global).await.expect("generates");
        assert_eq!(code, ExitCode::SUCCESS);
        let (ca_cert, ca_key, tls_cert, tls_key) = paths(&out);
        let ca = fs::read_to_string(&ca_cert).expect("ca");
        let cert = fs::read_to_string(&tls_cert).expect("tls");
        let key = fs::read_to_string(&tls_key).expect("key");
        assert!(ca_key.exists());
        assert_eq!(
            serving_cert_problem(&ca, &cert, &key, &names(), SystemTime::now()),
            None
        );
    }
}
