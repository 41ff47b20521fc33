//! The serving certificate, reloaded without a restart.
//!
//! [`ReloadingCert`] is a rustls [`ResolvesServerCert`] that hands out the current
//! [`CertifiedKey`]; [`ReloadingCert::watch`] polls the two files and swaps in a new pair when
//! their contents change and parse. Polling contents (not inotify) also catches Kubernetes Secret
//! volumes, which swap a `..data` symlink rather than write the files.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use rustls::ServerConfig;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use super::Error;
use super::metrics::Metrics;

/// Builds a [`CertifiedKey`] from a PEM certificate chain and a PEM private key (PKCS#8, SEC1 or
/// PKCS#1), checking that the key belongs to the certificate. Errors name the file at fault.
pub fn certified_key(
    cert_pem: &[u8],
    cert_path: &Path,
    key_pem: &[u8],
    key_path: &Path,
) -> Result<CertifiedKey, Error> {
    let tls_error = |path: &Path, reason: String| Error::Tls {
        path: path.to_owned(),
        reason,
    };
    let chain = crate::certs::parse_certs(cert_pem, cert_path).map_err(|e| match e {
        crate::certs::Error::BadCertificate { reason, .. } => tls_error(cert_path, reason),
        _ => tls_error(cert_path, "no PEM certificate in the file".into()),
    })?;
    let key = match crate::certs::parse_private_key(key_pem) {
        Ok(Some(key)) => key,
        Ok(None) => return Err(tls_error(key_path, "no PEM private key in the file".into())),
        Err(e) => return Err(tls_error(key_path, format!("not a PEM private key: {e}"))),
    };
    let provider = rustls::crypto::ring::default_provider();
    CertifiedKey::from_der(chain, key, &provider).map_err(|e| {
        tls_error(
            key_path,
            format!("not a usable key for {}: {e}", cert_path.display()),
        )
    })
}

/// The TLS server config of the webhook: ring, TLS 1.3 and 1.2, ALPN `http/1.1`, no client
/// certificates, certificates from `resolver`.
pub fn server_config(resolver: Arc<dyn ResolvesServerCert>) -> Result<ServerConfig, Error> {
    let mut config =
        ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(Error::TlsConfig)?
            .with_no_client_auth()
            .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// What the poller last saw on disk.
#[derive(Default)]
struct Seen {
    files: Option<(Vec<u8>, Vec<u8>)>,
    error: Option<String>,
    /// New contents that could not be used, seen once: the two files may have been caught
    /// between their writes (the key written, the certificate not yet), so they are read again
    /// at the next poll before being called unusable.
    pending: Option<(Vec<u8>, Vec<u8>)>,
}

/// A certificate resolver over a certificate file and a key file, reloaded by [`Self::watch`].
pub struct ReloadingCert {
    cert_path: PathBuf,
    key_path: PathBuf,
    current: RwLock<Arc<CertifiedKey>>,
    seen: Mutex<Seen>,
}

impl fmt::Debug for ReloadingCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReloadingCert")
            .field("cert_path", &self.cert_path)
            .field("key_path", &self.key_path)
            .finish_non_exhaustive()
    }
}

fn read(path: &Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|source| Error::Read {
        path: path.to_owned(),
        source,
    })
}

impl ReloadingCert {
    /// Loads the pair; an error names the file that cannot be read or used.
    pub fn load(cert_path: &Path, key_path: &Path) -> Result<Self, Error> {
        let cert = read(cert_path)?;
        let key = read(key_path)?;
        let certified = certified_key(&cert, cert_path, &key, key_path)?;
        Ok(ReloadingCert {
            cert_path: cert_path.to_owned(),
            key_path: key_path.to_owned(),
            current: RwLock::new(Arc::new(certified)),
            seen: Mutex::new(Seen {
                files: Some((cert, key)),
                error: None,
                pending: None,
            }),
        })
    }

    pub fn cert_path(&self) -> &Path {
        &self.cert_path
    }

    pub fn key_path(&self) -> &Path {
        &self.key_path
    }

    /// The pair in use.
    pub fn current(&self) -> Arc<CertifiedKey> {
        match self.current.read() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// A new pair replaces the one in use only if it is valid now and covers every name the one
    /// in use covers: an expired, not-yet-valid or wrong-name pair would fail every client.
    fn check_replacement(&self, certified: CertifiedKey) -> Result<CertifiedKey, Error> {
        let current = self.current();
        let (Some(old), Some(new)) = (current.cert.first(), certified.cert.first()) else {
            return Ok(certified);
        };
        match crate::certs::replacement_problem(old, new, std::time::SystemTime::now()) {
            None => Ok(certified),
            Some(reason) => Err(Error::Tls {
                path: self.cert_path.clone(),
                reason: format!("not used: {reason}"),
            }),
        }
    }

    fn swap(&self, certified: CertifiedKey) {
        let certified = Arc::new(certified);
        match self.current.write() {
            Ok(mut guard) => *guard = certified,
            Err(poisoned) => *poisoned.into_inner() = certified,
        }
    }

    /// Reads both files; when their contents differ from what was last seen, parses them and
    /// swaps the pair in. `Ok(true)`: a new pair is in use; `Ok(false)`: nothing changed (or the
    /// same broken contents as last time, or new unusable contents seen for the first time,
    /// which may be a pair caught between its two writes); `Err`: the files changed and the
    /// same unusable contents were read twice in a row, the previous pair stays in use.
    pub fn reload_if_changed(&self) -> Result<bool, Error> {
        let mut seen = match self.seen.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        let files = read(&self.cert_path).and_then(|cert| Ok((cert, read(&self.key_path)?)));
        let result = match files {
            Ok(files) if seen.files.as_ref() == Some(&files) => return Ok(false),
            Ok((cert, key)) => {
                let parsed = certified_key(&cert, &self.cert_path, &key, &self.key_path)
                    .and_then(|certified| self.check_replacement(certified));
                let files = (cert, key);
                if parsed.is_err() && seen.pending.as_ref() != Some(&files) {
                    seen.pending = Some(files);
                    return Ok(false);
                }
                seen.pending = None;
                seen.files = Some(files);
                parsed.map(|certified| self.swap(certified))
            }
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => {
                seen.error = None;
                Ok(true)
            }
            Err(e) => {
                let message = e.to_string();
                if seen.error.as_deref() == Some(message.as_str()) {
                    // Already reported.
                    return Ok(false);
                }
                seen.error = Some(message);
                Err(e)
            }
        }
    }

    /// Polls the files every `interval` until `shutdown` resolves, swapping in new pairs and
    /// logging (once per change) pairs that cannot be used.
    pub async fn watch(
        self: Arc<Self>,
        interval: Duration,
        metrics: Arc<Metrics>,
        shutdown: impl Future<Output = ()>,
    ) {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => return,
                _ = ticker.tick() => {}
            }
            let this = self.clone();
            let result = tokio::task::spawn_blocking(move || this.reload_if_changed()).await;
            match result {
                Ok(Ok(true)) => {
                    metrics.certificate_loaded(false, &self.current().cert);
                    tracing::info!(
                        cert = %self.cert_path.display(),
                        key = %self.key_path.display(),
                        "reloaded the serving certificate"
                    );
                }
                Ok(Ok(false)) => {}
                Ok(Err(e)) => {
                    metrics.certificate_reload_failed();
                    tracing::warn!(error = %e, "keeping the previous serving certificate");
                }
                Err(e) => tracing::warn!(error = %e, "certificate reload task failed"),
            }
        }
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certs;

    fn pair(dir: &Path) -> (PathBuf, PathBuf) {
        let ensured = certs::ensure(dir, &certs::local_names()).expect("certs");
        (ensured.tls_cert, ensured.tls_key)
    }

    #[test]
    fn reloads_only_changed_usable_pairs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (cert, key) = pair(dir.path());
        let resolver = ReloadingCert::load(&cert, &key).expect("load");
        let first = resolver.current();
        assert!(!resolver.reload_if_changed().expect("unchanged"));

        // A broken certificate: reported once, the old pair stays.
        let good_cert = std::fs::read(&cert).expect("read");
        std::fs::write(&cert, "garbage").expect("write");
        assert!(
            !resolver
                .reload_if_changed()
                .expect("first sight: maybe mid-write")
        );
        let err = resolver.reload_if_changed().expect_err("broken");
        assert_eq!(
            err.to_string(),
            format!("{}: no PEM certificate in the file", cert.display())
        );
        assert!(!resolver.reload_if_changed().expect("reported once"));
        assert_eq!(resolver.current().cert, first.cert);

        // A certificate with someone else's key: rejected, naming the key file.
        std::fs::write(&cert, &good_cert).expect("write");
        let other = certs::generate_ca(certs::CA_VALIDITY).expect("other");
        let good_key = std::fs::read(&key).expect("read");
        std::fs::write(&key, other.key).expect("write");
        assert!(
            !resolver
                .reload_if_changed()
                .expect("first sight: maybe mid-write")
        );
        let err = resolver.reload_if_changed().expect_err("mismatch");
        assert!(err.to_string().contains("tls.key"), "{err}");
        assert_eq!(resolver.current().cert, first.cert);

        // Back to the original: a reload (contents changed since last seen), same certificate.
        std::fs::write(&key, &good_key).expect("write");
        assert!(resolver.reload_if_changed().expect("restored"));
        assert_eq!(resolver.current().cert, first.cert);

        // A valid pair for other names: refused, the old pair stays.
        let ca = certs::generate_ca(certs::CA_VALIDITY).expect("ca");
        let elsewhere =
            certs::issue_serving(&ca, &["elsewhere.example".to_owned()], certs::CA_VALIDITY)
                .expect("elsewhere");
        std::fs::write(&cert, &elsewhere.cert).expect("write");
        std::fs::write(&key, &elsewhere.key).expect("write");
        assert!(!resolver.reload_if_changed().expect("first sight"));
        let err = resolver.reload_if_changed().expect_err("wrong names");
        assert!(
            err.to_string().contains("not used: does not cover names"),
            "{err}"
        );
        assert!(err.to_string().contains("localhost"), "{err}");
        assert_eq!(resolver.current().cert, first.cert);
        std::fs::write(&key, &good_key).expect("write");

        // A new pair from the same CA.
        std::fs::remove_file(&cert).expect("rm");
        let (cert, _) = pair(dir.path());
        assert!(resolver.reload_if_changed().expect("new"));
        assert_ne!(resolver.current().cert, first.cert);
        assert_eq!(
            resolver.current().cert[0].as_ref(),
            certs::parse_certs(&std::fs::read(&cert).expect("read"), &cert).expect("parse")[0]
                .as_ref()
        );
    }

    #[test]
    fn a_pair_caught_between_its_writes_is_not_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (cert, key) = pair(dir.path());
        let resolver = ReloadingCert::load(&cert, &key).expect("load");
        let first = resolver.current();
        let ca = certs::PemPair {
            cert: std::fs::read_to_string(dir.path().join("ca.crt")).expect("ca"),
            key: std::fs::read_to_string(dir.path().join("ca.key")).expect("key"),
        };
        let new =
            certs::issue_serving(&ca, &certs::local_names(), certs::SERVING_VALIDITY).expect("new");
        // The key is written first: the old certificate with the new key does not match.
        certs::write_atomic(&key, new.key.as_bytes(), 0o600).expect("key");
        assert!(!resolver.reload_if_changed().expect("not reported yet"));
        assert_eq!(resolver.current().cert, first.cert);
        certs::write_atomic(&cert, new.cert.as_bytes(), 0o644).expect("cert");
        assert!(resolver.reload_if_changed().expect("the new pair"));
        assert_ne!(resolver.current().cert, first.cert);
    }

    #[test]
    fn expired_and_not_yet_valid_pairs_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (cert, key) = pair(dir.path());
        let resolver = ReloadingCert::load(&cert, &key).expect("load");
        let first = resolver.current();
        let ca = certs::PemPair {
            cert: std::fs::read_to_string(dir.path().join("ca.crt")).expect("ca"),
            key: std::fs::read_to_string(dir.path().join("ca.key")).expect("key"),
        };
        let day = Duration::from_secs(86_400);
        let now = std::time::SystemTime::now();
        for (what, issued, expected) in [
            ("expired", now - day * 3, "expired on"),
            ("not yet valid", now + day * 3, "not valid before"),
        ] {
            let bad =
                certs::issue_serving_at(&ca, &certs::local_names(), day, issued).expect("issue");
            std::fs::write(&key, &bad.key).expect("write");
            std::fs::write(&cert, &bad.cert).expect("write");
            assert!(
                !resolver.reload_if_changed().expect("first sight"),
                "{what}"
            );
            let err = resolver.reload_if_changed().expect_err(what);
            assert!(err.to_string().contains(expected), "{what}: {err}");
            assert_eq!(
                resolver.current().cert,
                first.cert,
                "{what}: the old pair stays"
            );
        }
    }

    #[test]
    fn load_errors_name_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("nope.crt");
        let err = ReloadingCert::load(&missing, &missing).expect_err("missing");
        assert!(err.to_string().contains("nope.crt"), "{err}");
    }
}
