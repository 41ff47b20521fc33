//! When the self-signed certificates change: plain functions over what a Secret holds, so that
//! every rule is tested without a cluster ([`decide`], [`inspect`], [`apply`]); the I/O around
//! them is [`super::cluster`].
//!
//! The Secret holds the CA that signs (`ca.crt`, `ca.key`), the serving pair (`tls.crt`,
//! `tls.key`) and, during a rotation, one more CA: the next one (`ca-next.crt`, `ca-next.key`)
//! before it signs, or the previous one (`ca-previous.crt`) after. The webhook configurations'
//! `caBundle` is every CA the Secret holds ([`trusted_bundle`]). One rotation:
//!
//! ```text
//! signing CA at 2/3 of its life ─▶ next CA made; caBundle = signing + next      (StartRotation)
//!   ... overlap: every API server learns the next CA; serving still from the old one ...
//! overlap passed, caBundle holds next ─▶ next signs a new serving certificate;   (SwitchCa)
//!                                      caBundle = new signing + previous
//!   ... overlap: every replica loads the new serving certificate ...
//! overlap passed ─▶ previous dropped; caBundle = signing                          (DropPrevious)
//! ```
//!
//! A serving certificate is re-issued once 2/3 of its lifetime has passed, or at once when it
//! does not chain to the signing CA, does not cover the Service's names, or does not match its
//! key. When the two phases start is kept in the Secret's annotations ([`NEXT_SINCE`],
//! [`PREVIOUS_SINCE`]). Every replica decides alone from what it reads; writes carry the
//! `resourceVersion` read, so two replicas deciding the same step write it once.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use rustls::pki_types::CertificateDer;

use super::{
    CA_CERT_FILE, CA_KEY_FILE, Error, PemPair, TLS_CERT_FILE, TLS_KEY_FILE, generate_distinct_ca,
    issue_serving_at, parse_certs, verify_chain,
};

/// The next CA's certificate, in the Secret during the first phase of a rotation.
pub const NEXT_CA_CERT_FILE: &str = "ca-next.crt";
/// The next CA's key.
pub const NEXT_CA_KEY_FILE: &str = "ca-next.key";
/// The previous CA's certificate, in the Secret during the second phase (its key is not kept).
pub const PREVIOUS_CA_CERT_FILE: &str = "ca-previous.crt";
/// Annotation of the Secret: when the next CA was made (RFC 3339).
pub const NEXT_SINCE: &str = "jobset-inplace.dev/ca-next-since";
/// Annotation of the Secret: when the previous CA stopped signing (RFC 3339).
pub const PREVIOUS_SINCE: &str = "jobset-inplace.dev/ca-previous-since";

/// Every data key the rotation reads or writes.
pub const FILES: [&str; 7] = [
    CA_CERT_FILE,
    CA_KEY_FILE,
    TLS_CERT_FILE,
    TLS_KEY_FILE,
    NEXT_CA_CERT_FILE,
    NEXT_CA_KEY_FILE,
    PREVIOUS_CA_CERT_FILE,
];

/// Unix seconds of a time (0 before 1970, saturated far ahead).
pub fn unix(at: SystemTime) -> i64 {
    match at.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(_) => 0,
    }
}

fn system_time(secs: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(u64::try_from(secs).unwrap_or(0))
}

/// Whole seconds, rounded up (certificate times are whole seconds).
fn secs(d: Duration) -> i64 {
    let whole = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    i64::try_from(whole).unwrap_or(i64::MAX)
}

/// When a certificate is valid, Unix seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Validity {
    pub not_before: i64,
    pub not_after: i64,
}

impl Validity {
    /// Two thirds of the way from `not_before` to `not_after`: when it is replaced.
    pub fn renew_at(self) -> i64 {
        let span = (i128::from(self.not_after) - i128::from(self.not_before)).max(0);
        i64::try_from(i128::from(self.not_before) + span * 2 / 3).unwrap_or(i64::MAX)
    }

    pub fn expired(self, now: i64) -> bool {
        now >= self.not_after
    }
}

/// A CA in one phase of a rotation: its validity, and since when it is in that phase (`None`
/// when the annotation is missing or unreadable).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Staged {
    pub validity: Validity,
    pub since: Option<i64>,
}

/// The serving pair of the Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Serving {
    /// Neither `tls.crt` nor `tls.key`.
    Missing,
    /// Not a certificate and its key (the reason says what is wrong).
    Unusable(String),
    /// A certificate and its key; `problem` when it does not chain to the signing CA or does
    /// not cover the names.
    Issued {
        validity: Validity,
        problem: Option<String>,
    },
}

/// What a Secret holds, as far as the rotation cares ([`inspect`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Facts {
    /// The signing CA, or why there is no usable one.
    pub signing: Result<Validity, String>,
    /// The next CA, if the Secret has one (`Err` when unusable).
    pub next: Option<Result<Staged, String>>,
    /// The previous CA, if the Secret has one (`Err` when unusable).
    pub previous: Option<Result<Staged, String>>,
    pub serving: Serving,
    /// Every webhook's `caBundle` holds the next CA (true when there is none, or no webhook
    /// configuration is managed).
    pub bundle_trusts_next: bool,
    /// The certificates the webhooks' `caBundle`s hold now, each once (empty when no webhook
    /// configuration is managed): what the API server trusts, whatever the Secret holds. A new
    /// CA made because the Secret has none keeps them trusted for the overlap ([`apply`]).
    pub trusted: Vec<CertificateDer<'static>>,
}

/// The lifetimes of what is generated, and the overlap of each rotation phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    pub ca_validity: Duration,
    pub serving_validity: Duration,
    pub overlap: Duration,
}

impl Policy {
    /// The defaults of `webhook --self-signed`: CA 3 years, serving 90 days, overlap 7 days.
    pub const DEFAULT: Policy = Policy {
        ca_validity: Duration::from_secs(1095 * 86_400),
        serving_validity: Duration::from_secs(90 * 86_400),
        overlap: Duration::from_secs(7 * 86_400),
    };

    /// Whether these lifetimes work with a Secret read every `interval`: a renewed serving
    /// certificate's last third leaves every replica two reads; each overlap leaves them two;
    /// a rotation (2/3 of the CA's life, then two overlaps) ends with a sixth of the CA's life
    /// to spare. The error names the flags.
    pub fn check(&self, interval: Duration) -> Result<(), String> {
        let fmt = |d: Duration| format!("{}s", d.as_secs_f64());
        if self.serving_validity < interval * 6 {
            return Err(format!(
                "--serving-cert-validity ({}) must be at least 6 x --cert-renew-interval ({}): \
                 renewed at 2/3 of its lifetime, the last third must leave every replica two reads",
                fmt(self.serving_validity),
                fmt(interval)
            ));
        }
        if self.overlap < interval * 2 {
            return Err(format!(
                "--ca-overlap ({}) must be at least 2 x --cert-renew-interval ({}): every replica \
                 must read the Secret during it",
                fmt(self.overlap),
                fmt(interval)
            ));
        }
        if self.overlap * 12 > self.ca_validity {
            return Err(format!(
                "--ca-overlap ({}) must be at most 1/12 of --ca-validity ({}): a rotation starts \
                 at 2/3 of the CA's life and takes two overlaps",
                fmt(self.overlap),
                fmt(self.ca_validity)
            ));
        }
        Ok(())
    }
}

/// The next thing to do to a Secret ([`decide`]); the text says why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// No usable CA: a new one signs a new serving certificate, the only CA trusted.
    NewCa(String),
    /// The next CA signs from now on (with a new serving certificate); the old signing CA, if
    /// still valid, stays trusted as the previous one.
    SwitchCa(String),
    /// A new serving certificate from the signing CA.
    IssueServing(String),
    /// A new next CA, trusted beside the signing one (replacing an unusable next CA).
    StartRotation(String),
    /// The previous CA is no longer trusted.
    DropPrevious(String),
    /// Nothing to do before `until` (Unix seconds; `now` when waiting for the `caBundle`).
    Wait { until: i64 },
}

impl Step {
    /// A short name of the step's kind (`new`, `switch`, `renew`, `start`, `drop`, `wait`).
    pub fn kind(&self) -> &'static str {
        match self {
            Step::NewCa(_) => "new",
            Step::SwitchCa(_) => "switch",
            Step::IssueServing(_) => "renew",
            Step::StartRotation(_) => "start",
            Step::DropPrevious(_) => "drop",
            Step::Wait { .. } => "wait",
        }
    }
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Step::NewCa(why) => write!(f, "new CA ({why})"),
            Step::SwitchCa(why) => write!(f, "switch to the next CA ({why})"),
            Step::IssueServing(why) => write!(f, "new serving certificate ({why})"),
            Step::StartRotation(why) => write!(f, "new next CA ({why})"),
            Step::DropPrevious(why) => write!(f, "drop the previous CA ({why})"),
            Step::Wait { until } => write!(f, "nothing to do until {until}"),
        }
    }
}

/// The next step for a Secret described by `facts` at `now` (Unix seconds). Pure.
pub fn decide(facts: &Facts, policy: &Policy, now: i64) -> Step {
    let overlap = secs(policy.overlap);
    let next_usable = match &facts.next {
        Some(Ok(next)) if !next.validity.expired(now) => Some(next),
        _ => None,
    };
    // 1. A CA that cannot sign: the next one takes over if there is one, else a new CA.
    let signing = match facts.signing {
        Err(ref why) => {
            return match next_usable {
                Some(_) => Step::SwitchCa(format!("{why}; the next CA takes over")),
                None => Step::NewCa(why.clone()),
            };
        }
        Ok(v) if v.expired(now) => {
            let why = format!("the CA expired at {}", v.not_after);
            return match next_usable {
                Some(_) => Step::SwitchCa(format!("{why}; the next CA takes over")),
                None => Step::NewCa(why),
            };
        }
        Ok(v) => v,
    };
    // 2. A rotation under way: an unusable next CA is replaced; a trusted one takes over once
    //    the overlap has passed.
    if let Some(next) = &facts.next {
        match next {
            Err(why) => return Step::StartRotation(format!("the next CA is unusable: {why}")),
            Ok(n) if n.validity.expired(now) => {
                return Step::StartRotation("the next CA expired".to_owned());
            }
            Ok(Staged { since: None, .. }) => {
                return Step::StartRotation(format!(
                    "the next CA has no readable {NEXT_SINCE} annotation"
                ));
            }
            Ok(Staged {
                since: Some(since), ..
            }) if facts.bundle_trusts_next && now >= since.saturating_add(overlap) => {
                return Step::SwitchCa("the next CA has been trusted for the overlap".to_owned());
            }
            Ok(_) => {}
        }
    }
    // 3. The serving certificate.
    let serving_renew_at = match &facts.serving {
        Serving::Missing => return Step::IssueServing("no serving certificate".to_owned()),
        Serving::Unusable(why) => return Step::IssueServing(why.clone()),
        Serving::Issued {
            problem: Some(why), ..
        } => return Step::IssueServing(why.clone()),
        Serving::Issued { validity, .. } if now >= validity.renew_at() => {
            return Step::IssueServing(format!(
                "2/3 of its lifetime passed; it expires at {}",
                validity.not_after
            ));
        }
        Serving::Issued { validity, .. } => validity.renew_at(),
    };
    // 4. The previous CA, once every replica had the overlap to load the new serving pair.
    let previous_due = match &facts.previous {
        None => None,
        Some(Err(why)) => return Step::DropPrevious(format!("unusable: {why}")),
        Some(Ok(p)) => {
            // Without a readable start, it stays until it expires: trusting it longer is safe.
            let due = match p.since {
                Some(since) => since.saturating_add(overlap).min(p.validity.not_after),
                None => p.validity.not_after,
            };
            if now >= due {
                return Step::DropPrevious("the overlap passed".to_owned());
            }
            Some(due)
        }
    };
    // 5. A new rotation once 2/3 of the CA's life has passed (after the last one ended).
    let idle = facts.next.is_none() && facts.previous.is_none();
    if idle && now >= signing.renew_at() {
        return Step::StartRotation(format!(
            "2/3 of the CA's lifetime passed; it expires at {}",
            signing.not_after
        ));
    }
    // Nothing to do: when something next falls due.
    let mut until = signing.not_after.min(serving_renew_at);
    if idle {
        until = until.min(signing.renew_at());
    }
    if let Some(due) = previous_due {
        until = until.min(due);
    }
    if let Some(next) = next_usable {
        until = until.min(next.validity.not_after);
        if let Some(since) = next.since {
            // Overlap passed but the caBundle does not hold it yet: as soon as it does.
            until = until.min(since.saturating_add(overlap).max(now));
        }
    }
    Step::Wait { until }
}

/// The certificates and keys of a Secret (PEM, by data key) and its two rotation annotations.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Material {
    pub files: BTreeMap<String, Vec<u8>>,
    pub next_since: Option<i64>,
    pub previous_since: Option<i64>,
}

impl std::fmt::Debug for Material {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Material")
            .field("files", &self.files.keys().collect::<Vec<_>>())
            .field("next_since", &self.next_since)
            .field("previous_since", &self.previous_since)
            .finish()
    }
}

impl Material {
    fn text(&self, key: &str) -> Option<&str> {
        self.files
            .get(key)
            .and_then(|b| std::str::from_utf8(b).ok())
    }

    fn set(&mut self, key: &str, pem: &str) {
        self.files.insert(key.to_owned(), pem.as_bytes().to_vec());
    }

    /// The CA that signs, as a pair; an error naming what is missing.
    fn pair(&self, cert: &str, key: &str) -> Result<PemPair, Error> {
        let get = |k: &str| {
            self.text(k)
                .map(str::to_owned)
                .ok_or_else(|| Error::BadCertificate {
                    path: k.into(),
                    reason: "missing or not text".into(),
                })
        };
        Ok(PemPair {
            cert: get(cert)?,
            key: get(key)?,
        })
    }
}

/// The leaf of a PEM text and its validity.
fn leaf(pem: &[u8], name: &str) -> Result<(CertificateDer<'static>, Validity), String> {
    let der = parse_certs(pem, Path::new(name))
        .map_err(|e| e.to_string())?
        .swap_remove(0);
    let (not_before, not_after) =
        super::validity(&der).ok_or_else(|| format!("{name}: not an X.509 certificate"))?;
    Ok((
        der,
        Validity {
            not_before,
            not_after,
        },
    ))
}

/// A CA certificate and its key: a CA, and the key is the certificate's.
fn ca_of(
    material: &Material,
    cert_file: &str,
    key_file: &str,
) -> Result<(CertificateDer<'static>, Validity), String> {
    use rcgen::PublicKeyData as _;
    let cert = material
        .files
        .get(cert_file)
        .ok_or_else(|| format!("no {cert_file}"))?;
    let key = material
        .text(key_file)
        .ok_or_else(|| format!("no {key_file}"))?;
    let (der, validity) = leaf(cert, cert_file)?;
    let (_, x509) = x509_parser::parse_x509_certificate(&der)
        .map_err(|e| format!("{cert_file}: not an X.509 certificate: {e}"))?;
    if !x509.is_ca() {
        return Err(format!("{cert_file} is not a CA certificate"));
    }
    let key = rcgen::KeyPair::from_pem(key).map_err(|e| format!("{key_file}: {e}"))?;
    if key.der_bytes() != x509.public_key().subject_public_key.data.as_ref() {
        return Err(format!("{key_file} is not the key of {cert_file}"));
    }
    Ok((der, validity))
}

/// The serving pair against the signing CA (`None`: no usable one, the chain is not checked).
fn serving_of(
    material: &Material,
    signing: Option<(&CertificateDer<'static>, Validity)>,
    names: &[String],
    now: i64,
) -> Serving {
    let (cert, key) = match (
        material.files.get(TLS_CERT_FILE),
        material.files.get(TLS_KEY_FILE),
    ) {
        (None, None) => return Serving::Missing,
        (Some(_), None) => return Serving::Unusable(format!("no {TLS_KEY_FILE}")),
        (None, Some(_)) => return Serving::Unusable(format!("no {TLS_CERT_FILE}")),
        (Some(c), Some(k)) => (c, k),
    };
    let chain = match parse_certs(cert, Path::new(TLS_CERT_FILE)) {
        Ok(chain) => chain,
        Err(e) => return Serving::Unusable(e.to_string()),
    };
    let key = match super::parse_private_key(key) {
        Ok(Some(key)) => key,
        Ok(None) => return Serving::Unusable(format!("no private key in {TLS_KEY_FILE}")),
        Err(e) => return Serving::Unusable(format!("{TLS_KEY_FILE}: {e}")),
    };
    let provider = rustls::crypto::ring::default_provider();
    if let Err(e) = rustls::sign::CertifiedKey::from_der(chain.clone(), key, &provider) {
        return Serving::Unusable(format!(
            "{TLS_KEY_FILE} does not belong to {TLS_CERT_FILE}: {e}"
        ));
    }
    let Some((not_before, not_after)) = chain.first().and_then(|leaf| super::validity(leaf)) else {
        return Serving::Unusable(format!("{TLS_CERT_FILE}: not an X.509 certificate"));
    };
    let validity = Validity {
        not_before,
        not_after,
    };
    // Chain and names are checked at a moment both certificates are valid (expiry is the
    // lifetime rule's business), as close to now as that allows.
    let problem = signing.and_then(|(ca, ca_validity)| {
        let lo = validity.not_before.max(ca_validity.not_before);
        let hi = validity.not_after.min(ca_validity.not_after) - 1;
        if lo > hi {
            return Some("it is never valid while the CA is".to_owned());
        }
        verify_chain(
            std::slice::from_ref(ca),
            &chain,
            names,
            system_time(now.clamp(lo, hi)),
        )
        .err()
        .map(|e| format!("it does not chain to the CA for the Service's names: {e}"))
    });
    Serving::Issued { validity, problem }
}

/// What `material` holds at `now`, for the webhook's `names`. `bundles` is the trust anchors of
/// every webhook's `caBundle` (`None` when no webhook configuration is managed).
pub fn inspect(
    material: &Material,
    names: &[String],
    now: i64,
    bundles: Option<&[Vec<CertificateDer<'static>>]>,
) -> Facts {
    let signing = ca_of(material, CA_CERT_FILE, CA_KEY_FILE);
    let next = material.files.contains_key(NEXT_CA_CERT_FILE).then(|| {
        ca_of(material, NEXT_CA_CERT_FILE, NEXT_CA_KEY_FILE).map(|(der, validity)| {
            (
                der,
                Staged {
                    validity,
                    since: material.next_since,
                },
            )
        })
    });
    let previous = material.files.get(PREVIOUS_CA_CERT_FILE).map(|pem| {
        leaf(pem, PREVIOUS_CA_CERT_FILE).map(|(_, validity)| Staged {
            validity,
            since: material.previous_since,
        })
    });
    let mut trusted: Vec<CertificateDer<'static>> = Vec::new();
    for cert in bundles.into_iter().flatten().flatten() {
        if !trusted.contains(cert) {
            trusted.push(cert.clone());
        }
    }
    let bundle_trusts_next = match (&next, bundles) {
        (Some(Ok((der, _))), Some(bundles)) => bundles.iter().all(|roots| roots.contains(der)),
        _ => true,
    };
    let serving = serving_of(
        material,
        signing.as_ref().ok().map(|(der, v)| (der, *v)),
        names,
        now,
    );
    Facts {
        signing: signing.map(|(_, v)| v),
        next: next.map(|n| n.map(|(_, staged)| staged)),
        previous,
        serving,
        bundle_trusts_next,
        trusted,
    }
}

/// The certificates of `trusted` still valid at `now`, as PEM, the one that stays valid longest
/// first (it bounds how long they are kept as the previous CA, [`decide`]); empty when none is.
pub fn still_trusted(trusted: &[CertificateDer<'static>], now: i64) -> String {
    let mut valid: Vec<(i64, &CertificateDer<'static>)> = trusted
        .iter()
        .filter_map(|der| {
            let (_, not_after) = super::validity(der)?;
            (now < not_after).then_some((not_after, der))
        })
        .collect();
    valid.sort_by_key(|(not_after, _)| std::cmp::Reverse(*not_after));
    let mut pem = String::new();
    for (_, der) in valid {
        pem.push_str("-----BEGIN CERTIFICATE-----\n");
        let encoded = base64::engine::general_purpose::STANDARD.encode(der.as_ref());
        for line in encoded.as_bytes().chunks(64) {
            pem.push_str(&String::from_utf8_lossy(line));
            pem.push('\n');
        }
        pem.push_str("-----END CERTIFICATE-----\n");
    }
    pem
}

/// What the webhook configurations' `caBundle` must be for `material`: the signing CA, then the
/// next and the previous one when present (each that is a certificate), PEM.
pub fn trusted_bundle(material: &Material) -> Vec<u8> {
    let mut out = Vec::new();
    for file in [CA_CERT_FILE, NEXT_CA_CERT_FILE, PREVIOUS_CA_CERT_FILE] {
        let Some(pem) = material.files.get(file) else {
            continue;
        };
        if parse_certs(pem, Path::new(file)).is_err() {
            continue;
        }
        out.extend_from_slice(pem);
        if !pem.ends_with(b"\n") {
            out.push(b'\n');
        }
    }
    out
}

/// `material` after `step` (decided on `facts`), new certificates valid from `now`. Generates
/// keys: run it off the async runtime.
pub fn apply(
    step: &Step,
    material: &Material,
    facts: &Facts,
    policy: &Policy,
    names: &[String],
    now: SystemTime,
) -> Result<Material, Error> {
    let mut out = material.clone();
    let issue = |out: &mut Material| -> Result<(), Error> {
        let ca = out.pair(CA_CERT_FILE, CA_KEY_FILE)?;
        let serving = issue_serving_at(&ca, names, policy.serving_validity, now)?;
        // Key first: a reader that sees only one of the two new files sees a mismatch and
        // reads again, never an old key with a new certificate it would accept.
        out.set(TLS_KEY_FILE, &serving.key);
        out.set(TLS_CERT_FILE, &serving.cert);
        Ok(())
    };
    let drop_next = |out: &mut Material| {
        out.files.remove(NEXT_CA_CERT_FILE);
        out.files.remove(NEXT_CA_KEY_FILE);
        out.next_since = None;
    };
    let drop_previous = |out: &mut Material| {
        out.files.remove(PREVIOUS_CA_CERT_FILE);
        out.previous_since = None;
    };
    match step {
        Step::Wait { .. } => {}
        Step::NewCa(_) => {
            let ca = generate_distinct_ca(policy.ca_validity, now)?;
            out.set(CA_KEY_FILE, &ca.key);
            out.set(CA_CERT_FILE, &ca.cert);
            drop_next(&mut out);
            drop_previous(&mut out);
            // What the API server trusts now (the Secret deleted or corrupted: other replicas
            // still serve certificates of the CA it held) stays trusted as the previous CA, for
            // the overlap, as after a switch: until every replica has read the new pair.
            let kept = still_trusted(&facts.trusted, unix(now));
            if !kept.is_empty() {
                out.set(PREVIOUS_CA_CERT_FILE, &kept);
                out.previous_since = Some(unix(now));
            }
            issue(&mut out)?;
        }
        Step::SwitchCa(_) => {
            let next = out.pair(NEXT_CA_CERT_FILE, NEXT_CA_KEY_FILE)?;
            let retired = match facts.signing {
                Ok(v) if !v.expired(unix(now)) => out.text(CA_CERT_FILE).map(str::to_owned),
                _ => None,
            };
            out.set(CA_KEY_FILE, &next.key);
            out.set(CA_CERT_FILE, &next.cert);
            drop_next(&mut out);
            match retired {
                Some(pem) => {
                    out.set(PREVIOUS_CA_CERT_FILE, &pem);
                    out.previous_since = Some(unix(now));
                }
                None => drop_previous(&mut out),
            }
            issue(&mut out)?;
        }
        Step::IssueServing(_) => issue(&mut out)?,
        Step::StartRotation(_) => {
            let ca = generate_distinct_ca(policy.ca_validity, now)?;
            out.set(NEXT_CA_KEY_FILE, &ca.key);
            out.set(NEXT_CA_CERT_FILE, &ca.cert);
            out.next_since = Some(unix(now));
        }
        Step::DropPrevious(_) => drop_previous(&mut out),
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
