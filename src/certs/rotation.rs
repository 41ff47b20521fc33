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
    let key = match rustls_pemfile::private_key(&mut key.as_slice()) {
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
mod tests {
    use super::*;

    const DAY: i64 = 86_400;
    const NOW: i64 = 1_800_000_000;

    fn policy() -> Policy {
        Policy::DEFAULT
    }

    fn valid(from: i64, to: i64) -> Validity {
        Validity {
            not_before: from,
            not_after: to,
        }
    }

    /// A CA or serving certificate `age` days into a life of `life` days, at NOW.
    fn aged(age: i64, life: i64) -> Validity {
        valid(NOW - age * DAY, NOW - age * DAY + life * DAY)
    }

    fn healthy() -> Facts {
        Facts {
            signing: Ok(aged(100, 1095)),
            next: None,
            previous: None,
            serving: Serving::Issued {
                validity: aged(10, 90),
                problem: None,
            },
            bundle_trusts_next: true,
            trusted: Vec::new(),
        }
    }

    #[test]
    fn renew_at_is_two_thirds_of_the_way() {
        assert_eq!(valid(0, 90).renew_at(), 60);
        assert_eq!(valid(100, 100).renew_at(), 100);
        assert_eq!(
            valid(100, 50).renew_at(),
            100,
            "a reversed window renews at once"
        );
        assert_eq!(valid(i64::MIN, i64::MAX).renew_at(), i64::MAX / 3);
        assert!(valid(0, 10).expired(10));
        assert!(!valid(0, 10).expired(9));
    }

    #[test]
    fn a_healthy_secret_waits_for_the_serving_renewal() {
        let step = decide(&healthy(), &policy(), NOW);
        // Serving: 10 days into 90, renewed at day 60.
        assert_eq!(
            step,
            Step::Wait {
                until: NOW + 50 * DAY
            }
        );
    }

    #[test]
    fn the_serving_certificate_is_renewed_at_two_thirds_and_when_wrong() {
        let mut f = healthy();
        f.serving = Serving::Issued {
            validity: aged(60, 90),
            problem: None,
        };
        assert!(matches!(decide(&f, &policy(), NOW), Step::IssueServing(w) if w.contains("2/3")));
        f.serving = Serving::Issued {
            validity: aged(59, 90),
            problem: None,
        };
        assert_eq!(decide(&f, &policy(), NOW), Step::Wait { until: NOW + DAY });
        for serving in [
            Serving::Missing,
            Serving::Unusable("no tls.key".into()),
            Serving::Issued {
                validity: aged(1, 90),
                problem: Some("names".into()),
            },
            Serving::Issued {
                validity: aged(100, 90),
                problem: None,
            },
        ] {
            f.serving = serving.clone();
            assert!(
                matches!(decide(&f, &policy(), NOW), Step::IssueServing(_)),
                "{serving:?}"
            );
        }
    }

    #[test]
    fn no_usable_ca_means_a_new_one_unless_a_next_one_can_take_over() {
        let next = Staged {
            validity: aged(1, 1095),
            since: Some(NOW - DAY),
        };
        for signing in [Err("no ca.crt".to_owned()), Ok(aged(1095, 1095))] {
            let mut f = healthy();
            f.signing = signing.clone();
            assert!(
                matches!(decide(&f, &policy(), NOW), Step::NewCa(_)),
                "{signing:?}"
            );
            f.next = Some(Ok(next));
            f.bundle_trusts_next = false;
            assert!(
                matches!(decide(&f, &policy(), NOW), Step::SwitchCa(w) if w.contains("takes over")),
                "{signing:?}: even before the overlap, an unusable CA is worse"
            );
            f.next = Some(Err("garbage".into()));
            assert!(matches!(decide(&f, &policy(), NOW), Step::NewCa(_)));
        }
    }

    #[test]
    fn a_rotation_starts_at_two_thirds_of_the_ca_life() {
        let mut f = healthy();
        f.signing = Ok(aged(730, 1095));
        assert!(matches!(decide(&f, &policy(), NOW), Step::StartRotation(w) if w.contains("2/3")));
        f.signing = Ok(aged(729, 1095));
        assert_eq!(decide(&f, &policy(), NOW), Step::Wait { until: NOW + DAY });
        // Not while the previous rotation's old CA is still trusted.
        f.signing = Ok(aged(730, 1095));
        f.previous = Some(Ok(Staged {
            validity: aged(1000, 1095),
            since: Some(NOW - DAY),
        }));
        assert_eq!(
            decide(&f, &policy(), NOW),
            Step::Wait {
                until: NOW + 6 * DAY
            }
        );
    }

    #[test]
    fn the_next_ca_signs_only_after_the_overlap_and_once_trusted() {
        let mut f = healthy();
        f.signing = Ok(aged(735, 1095));
        f.next = Some(Ok(Staged {
            validity: aged(5, 1095),
            since: Some(NOW - 5 * DAY),
        }));
        assert_eq!(
            decide(&f, &policy(), NOW),
            Step::Wait {
                until: NOW + 2 * DAY
            }
        );
        f.next = Some(Ok(Staged {
            validity: aged(7, 1095),
            since: Some(NOW - 7 * DAY),
        }));
        assert!(matches!(decide(&f, &policy(), NOW), Step::SwitchCa(_)));
        // The caBundle does not hold it yet: wait, and look again as soon as it does.
        f.bundle_trusts_next = false;
        assert_eq!(decide(&f, &policy(), NOW), Step::Wait { until: NOW });
        // Unusable, expired or without its start: replaced by a new one.
        for next in [
            Err("garbage".to_owned()),
            Ok(Staged {
                validity: aged(1095, 1095),
                since: Some(NOW - DAY),
            }),
            Ok(Staged {
                validity: aged(1, 1095),
                since: None,
            }),
        ] {
            f.next = Some(next.clone());
            assert!(
                matches!(decide(&f, &policy(), NOW), Step::StartRotation(_)),
                "{next:?}"
            );
        }
    }

    #[test]
    fn the_previous_ca_is_dropped_after_the_overlap_or_when_it_cannot_matter() {
        let mut f = healthy();
        let previous =
            |since: Option<i64>, validity: Validity| Some(Ok(Staged { validity, since }));
        f.previous = previous(Some(NOW - 7 * DAY), aged(800, 1095));
        assert!(matches!(decide(&f, &policy(), NOW), Step::DropPrevious(_)));
        f.previous = previous(Some(NOW - 6 * DAY), aged(800, 1095));
        assert_eq!(decide(&f, &policy(), NOW), Step::Wait { until: NOW + DAY });
        // Without a readable start: kept until it expires.
        f.previous = previous(None, aged(800, 1095));
        assert_eq!(
            decide(&f, &policy(), NOW),
            Step::Wait {
                until: NOW + 50 * DAY
            }
        );
        f.previous = previous(None, aged(1095, 1095));
        assert!(matches!(decide(&f, &policy(), NOW), Step::DropPrevious(_)));
        f.previous = Some(Err("garbage".into()));
        assert!(matches!(decide(&f, &policy(), NOW), Step::DropPrevious(_)));
    }

    /// Every combination of the five inputs, each step checked against the rules it may follow.
    #[test]
    fn every_combination_gets_an_allowed_step() {
        let p = policy();
        let signings = [
            ("missing", Err("no ca.crt".to_owned())),
            ("expired", Ok(aged(1096, 1095))),
            ("young", Ok(aged(10, 1095))),
            ("due", Ok(aged(800, 1095))),
        ];
        let staged = |age: i64, since: Option<i64>| {
            Some(Ok(Staged {
                validity: aged(age, 1095),
                since,
            }))
        };
        let nexts = [
            ("none", None),
            ("garbled", Some(Err("garbage".to_owned()))),
            ("no-since", staged(1, None)),
            ("in-overlap", staged(1, Some(NOW - DAY))),
            ("overlap-passed", staged(8, Some(NOW - 8 * DAY))),
            ("expired", staged(1096, Some(NOW - 8 * DAY))),
        ];
        let previouses = [
            ("none", None),
            ("garbled", Some(Err("garbage".to_owned()))),
            ("in-overlap", staged(900, Some(NOW - DAY))),
            ("overlap-passed", staged(900, Some(NOW - 8 * DAY))),
            ("no-since", staged(900, None)),
            ("expired", staged(1096, Some(NOW - DAY))),
        ];
        let servings = [
            ("missing", Serving::Missing),
            ("unusable", Serving::Unusable("x".into())),
            (
                "wrong",
                Serving::Issued {
                    validity: aged(1, 90),
                    problem: Some("names".into()),
                },
            ),
            (
                "young",
                Serving::Issued {
                    validity: aged(1, 90),
                    problem: None,
                },
            ),
            (
                "due",
                Serving::Issued {
                    validity: aged(61, 90),
                    problem: None,
                },
            ),
        ];
        let mut seen = BTreeMap::<&str, usize>::new();
        let mut combinations = 0;
        for (sn, signing) in &signings {
            for (nn, next) in &nexts {
                for (pn, previous) in &previouses {
                    for (vn, serving) in &servings {
                        for trusted in [true, false] {
                            combinations += 1;
                            let f = Facts {
                                signing: signing.clone(),
                                next: next.clone(),
                                previous: previous.clone(),
                                serving: serving.clone(),
                                bundle_trusts_next: trusted,
                                trusted: Vec::new(),
                            };
                            let case = format!(
                                "signing {sn}, next {nn}, previous {pn}, serving {vn}, trusted {trusted}"
                            );
                            let step = decide(&f, &p, NOW);
                            let signing_bad = matches!(*sn, "missing" | "expired");
                            let next_live =
                                matches!(*nn, "no-since" | "in-overlap" | "overlap-passed");
                            let serving_bad = *vn != "young";
                            let kind = step.kind();
                            *seen.entry(kind).or_default() += 1;
                            match &step {
                                Step::NewCa(_) => {
                                    assert!(signing_bad && !next_live, "{case}: {step}");
                                }
                                Step::SwitchCa(_) => assert!(
                                    next_live
                                        && (signing_bad || (*nn == "overlap-passed" && trusted)),
                                    "{case}: {step}"
                                ),
                                Step::IssueServing(_) => assert!(
                                    !signing_bad
                                        && serving_bad
                                        && !(*nn == "overlap-passed" && trusted),
                                    "{case}: {step}"
                                ),
                                Step::StartRotation(_) => assert!(
                                    !signing_bad
                                        && (matches!(*nn, "garbled" | "expired" | "no-since")
                                            || (*nn == "none" && *pn == "none" && *sn == "due")),
                                    "{case}: {step}"
                                ),
                                Step::DropPrevious(_) => assert!(
                                    !signing_bad
                                        && !serving_bad
                                        && matches!(*pn, "garbled" | "overlap-passed" | "expired"),
                                    "{case}: {step}"
                                ),
                                Step::Wait { until } => {
                                    assert!(!signing_bad && !serving_bad, "{case}: {step}");
                                    assert!(
                                        matches!(*pn, "none" | "in-overlap" | "no-since"),
                                        "{case}: {step}"
                                    );
                                    assert!(
                                        matches!(*nn, "none" | "in-overlap")
                                            || (*nn == "overlap-passed" && !trusted),
                                        "{case}: {step}"
                                    );
                                    assert!(*until >= NOW, "{case}: {step}");
                                    if *until == NOW {
                                        assert!(*nn == "overlap-passed" && !trusted, "{case}");
                                    }
                                    assert!(
                                        !(*sn == "due" && *nn == "none" && *pn == "none"),
                                        "{case}"
                                    );
                                }
                            }
                            // Each step is what the rules say, whatever came before: a second
                            // look at the same facts decides the same.
                            assert_eq!(decide(&f, &p, NOW), step, "{case}");
                        }
                    }
                }
            }
        }
        assert_eq!(combinations, 4 * 6 * 6 * 5 * 2);
        assert_eq!(seen.len(), 6, "every kind of step is reached: {seen:?}");
    }

    #[test]
    fn policies_are_checked_against_the_read_interval() {
        let minute = Duration::from_secs(60);
        assert_eq!(Policy::DEFAULT.check(minute), Ok(()));
        let short = Policy {
            ca_validity: Duration::from_secs(24),
            serving_validity: Duration::from_secs(6),
            overlap: Duration::from_secs(2),
        };
        assert_eq!(short.check(Duration::from_millis(500)), Ok(()));
        let e = short.check(Duration::from_secs(2)).expect_err("serving");
        assert!(e.starts_with("--serving-cert-validity"), "{e}");
        let e = Policy {
            overlap: Duration::from_millis(500),
            ..short
        }
        .check(Duration::from_millis(500))
        .expect_err("overlap");
        assert!(e.starts_with("--ca-overlap") && e.contains("2 x"), "{e}");
        let e = Policy {
            overlap: Duration::from_secs(3),
            ..short
        }
        .check(Duration::from_millis(500))
        .expect_err("ca");
        assert!(e.contains("1/12 of --ca-validity"), "{e}");
    }

    // -----------------------------------------------------------------------------------------
    // inspect, apply and trusted_bundle on real certificates
    // -----------------------------------------------------------------------------------------

    fn names() -> Vec<String> {
        super::super::service_names("hook", "ns")
    }

    fn roots(pem: &[u8]) -> Vec<CertificateDer<'static>> {
        parse_certs(pem, Path::new("caBundle")).expect("bundle")
    }

    /// Applies steps until nothing is left to do at `now`, the caBundle following each write as
    /// the I/O layer makes it; returns the steps.
    fn settle(
        material: &mut Material,
        bundle: &mut Vec<u8>,
        policy: &Policy,
        now: SystemTime,
    ) -> Vec<Step> {
        let mut steps = Vec::new();
        loop {
            let bundles = if bundle.is_empty() {
                Vec::new()
            } else {
                vec![roots(bundle)]
            };
            let with = (!bundles.is_empty()).then_some(bundles.as_slice());
            let facts = inspect(material, &names(), unix(now), with);
            let step = decide(&facts, policy, unix(now));
            if let Step::Wait { .. } = step {
                *bundle = trusted_bundle(material);
                return steps;
            }
            *material = apply(&step, material, &facts, policy, &names(), now).expect("apply");
            steps.push(step);
            assert!(steps.len() <= 3, "settles in a few steps: {steps:?}");
        }
    }

    #[test]
    fn inspect_reads_what_apply_writes() {
        let p = policy();
        let now = system_time(NOW);
        let mut m = Material::default();
        let mut bundle = Vec::new();
        let steps = settle(&mut m, &mut bundle, &p, now);
        assert!(matches!(steps.as_slice(), [Step::NewCa(_)]), "{steps:?}");
        let f = inspect(&m, &names(), NOW, Some(&[roots(&bundle)]));
        let Ok(ca) = f.signing else { panic!("{f:?}") };
        assert_eq!(ca.not_after, NOW + 1095 * DAY);
        assert!(
            matches!(f.serving, Serving::Issued { problem: None, validity } if validity.not_after == NOW + 90 * DAY)
        );
        assert_eq!(
            decide(&f, &p, NOW),
            Step::Wait {
                until: (NOW - 3600) + (90 * DAY + 3600) * 2 / 3
            }
        );

        // Other names: the serving certificate no longer fits.
        let other = inspect(&m, &["else.example".to_owned()], NOW, None);
        assert!(
            matches!(other.serving, Serving::Issued { problem: Some(ref w), .. } if w.contains("else.example")),
            "{other:?}"
        );

        // A key of another CA, a serving key of another certificate, garbage: each named.
        let mut broken = m.clone();
        let foreign = super::super::generate_ca(p.ca_validity).expect("ca");
        broken
            .files
            .insert(CA_KEY_FILE.into(), foreign.key.into_bytes());
        let f = inspect(&broken, &names(), NOW, None);
        assert_eq!(f.signing, Err("ca.key is not the key of ca.crt".to_owned()));
        assert!(matches!(decide(&f, &p, NOW), Step::NewCa(_)));
        let mut broken = m.clone();
        let serving = super::super::issue_serving(
            &m.pair(CA_CERT_FILE, CA_KEY_FILE).expect("ca"),
            &names(),
            p.serving_validity,
        )
        .expect("serving");
        broken
            .files
            .insert(TLS_KEY_FILE.into(), serving.key.into_bytes());
        assert!(
            matches!(inspect(&broken, &names(), NOW, None).serving, Serving::Unusable(w) if w.contains("does not belong"))
        );
        broken
            .files
            .insert(TLS_CERT_FILE.into(), b"garbage".to_vec());
        assert!(matches!(
            inspect(&broken, &names(), NOW, None).serving,
            Serving::Unusable(_)
        ));
        broken.files.remove(TLS_CERT_FILE);
        assert!(
            matches!(inspect(&broken, &names(), NOW, None).serving, Serving::Unusable(w) if w == "no tls.crt")
        );
        // A serving certificate is not a CA.
        let mut broken = m.clone();
        broken
            .files
            .insert(CA_CERT_FILE.into(), m.files[TLS_CERT_FILE].clone());
        broken
            .files
            .insert(CA_KEY_FILE.into(), m.files[TLS_KEY_FILE].clone());
        assert_eq!(
            inspect(&broken, &names(), NOW, None).signing,
            Err("ca.crt is not a CA certificate".to_owned())
        );
    }

    #[test]
    fn a_rotation_keeps_every_served_certificate_trusted() {
        // Lifetimes of hours, checked every 10 minutes across three CA lifetimes: a replica
        // serves what the Secret held at the previous check (it reads every interval), and
        // what it serves always verifies against the caBundle of that moment.
        let hour = 3600;
        let p = Policy {
            ca_validity: Duration::from_secs(36 * hour as u64),
            serving_validity: Duration::from_secs(6 * hour as u64),
            overlap: Duration::from_secs(3 * hour as u64),
        };
        let interval = 600;
        assert_eq!(p.check(Duration::from_secs(interval as u64)), Ok(()));
        let start = NOW;
        let mut m = Material::default();
        let mut bundle = Vec::new();
        let mut served: Option<Vec<u8>> = None;
        let mut all = Vec::new();
        let mut t = start;
        while t < start + 3 * 36 * hour {
            let now = system_time(t);
            let steps = settle(&mut m, &mut bundle, &p, now);
            let trusted = roots(&bundle);
            for (who, pem) in [
                ("a replica that just read", Some(&m.files[TLS_CERT_FILE])),
                ("a replica a read behind", served.as_ref()),
            ] {
                let Some(pem) = pem else { continue };
                let chain = parse_certs(pem, Path::new("tls.crt")).expect("chain");
                if let Err(e) = verify_chain(&trusted, &chain, &names(), now) {
                    panic!("at +{}s, {who}: {e}; steps {all:?}", t - start);
                }
            }
            // Never more than two CAs trusted, and a switch only after the overlap.
            assert!(
                trusted.len() <= 2,
                "at +{}s: {} CAs",
                t - start,
                trusted.len()
            );
            for step in &steps {
                all.push((t - start, step.clone()));
            }
            served = Some(m.files[TLS_CERT_FILE].clone());
            t += interval;
        }
        let kinds = |f: fn(&Step) -> bool| {
            all.iter()
                .filter(|(_, s)| f(s))
                .map(|(t, _)| *t)
                .collect::<Vec<_>>()
        };
        let new_ca = kinds(|s| matches!(s, Step::NewCa(_)));
        let starts = kinds(|s| matches!(s, Step::StartRotation(_)));
        let switches = kinds(|s| matches!(s, Step::SwitchCa(_)));
        let drops = kinds(|s| matches!(s, Step::DropPrevious(_)));
        let renewals = kinds(|s| matches!(s, Step::IssueServing(_)));
        assert_eq!(
            new_ca,
            [0],
            "one CA made from nothing, then only rotations: {all:?}"
        );
        assert!(starts.len() >= 3, "{all:?}");
        assert_eq!(starts.len(), switches.len(), "{all:?}");
        for (i, start) in starts.iter().enumerate() {
            let switch = switches[i];
            assert!(
                switch - start >= 3 * hour && switch - start <= 3 * hour + interval,
                "{all:?}"
            );
            let drop = drops[i];
            assert!(
                drop - switch >= 3 * hour && drop - switch <= 3 * hour + interval,
                "{all:?}"
            );
        }
        // Serving certificates renewed at 2/3 of 6 h (plus the check interval), or at a switch.
        assert!(renewals.len() >= 20, "{renewals:?}");
    }

    /// Issue 21 item 5: the Secret deleted, or its CA corrupted, while replicas serve its
    /// certificates: the new CA comes with the CAs the caBundle held kept as the previous one,
    /// so a replica a read behind is still trusted, and they are dropped after the overlap as
    /// after a switch. An expired CA is not kept.
    #[test]
    fn a_lost_secret_keeps_what_the_replicas_serve_trusted_for_the_overlap() {
        let hour = 3600;
        let p = Policy {
            ca_validity: Duration::from_secs(36 * hour as u64),
            serving_validity: Duration::from_secs(6 * hour as u64),
            overlap: Duration::from_secs(3 * hour as u64),
        };
        let corrupt = |m: &mut Material| {
            m.files.insert(
                CA_KEY_FILE.into(),
                b"-----BEGIN PRIVATE KEY-----\n".to_vec(),
            );
        };
        let lose = |m: &mut Material| *m = Material::default();
        for (how, damage) in [
            ("deleted", &lose as &dyn Fn(&mut Material)),
            ("corrupted", &corrupt),
        ] {
            let mut m = Material::default();
            let mut bundle = Vec::new();
            settle(&mut m, &mut bundle, &p, system_time(NOW));
            let served = m.files[TLS_CERT_FILE].clone();
            let old_ca = roots(&m.files[CA_CERT_FILE]);
            damage(&mut m);
            let t = NOW + hour;
            let steps = settle(&mut m, &mut bundle, &p, system_time(t));
            assert!(
                matches!(steps.as_slice(), [Step::NewCa(_)]),
                "{how}: {steps:?}"
            );
            let trusted = roots(&bundle);
            for (who, pem) in [
                ("a replica a read behind", &served),
                ("the replica that made the CA", &m.files[TLS_CERT_FILE]),
            ] {
                let chain = parse_certs(pem, Path::new("tls.crt")).expect("chain");
                if let Err(e) = verify_chain(&trusted, &chain, &names(), system_time(t)) {
                    panic!("{how}: {who} is not trusted: {e}");
                }
            }
            assert_eq!(m.previous_since, Some(t), "{how}");
            assert_eq!(roots(&m.files[PREVIOUS_CA_CERT_FILE]), old_ca, "{how}");
            // Kept for the overlap, then dropped as after a switch.
            let f = inspect(&m, &names(), t, Some(&[trusted]));
            assert_eq!(
                decide(&f, &p, t),
                Step::Wait {
                    until: t + 3 * hour
                }
            );
            let later = t + 3 * hour;
            let steps = settle(&mut m, &mut bundle, &p, system_time(later));
            assert!(
                matches!(steps.as_slice(), [Step::DropPrevious(_)]),
                "{how}: {steps:?}"
            );
            assert_eq!(roots(&bundle), roots(&m.files[CA_CERT_FILE]), "{how}");
        }

        // A CA that has expired is trusted by nobody: nothing is kept.
        let mut m = Material::default();
        let mut bundle = Vec::new();
        settle(&mut m, &mut bundle, &p, system_time(NOW));
        let t = NOW + 37 * hour;
        let steps = settle(&mut m, &mut bundle, &p, system_time(t));
        assert!(matches!(steps.as_slice(), [Step::NewCa(_)]), "{steps:?}");
        assert!(!m.files.contains_key(PREVIOUS_CA_CERT_FILE));
        assert_eq!(roots(&bundle).len(), 1);
        // Several trusted CAs: all kept, the longest-lived first.
        let (a, b) = (
            generate_distinct_ca(p.ca_validity, system_time(NOW)).expect("ca"),
            generate_distinct_ca(Duration::from_secs(72 * hour as u64), system_time(NOW))
                .expect("ca"),
        );
        let (a, b) = (roots(a.cert.as_bytes()), roots(b.cert.as_bytes()));
        let kept = still_trusted(&[a[0].clone(), b[0].clone()], NOW + hour);
        assert_eq!(roots(kept.as_bytes()), [b[0].clone(), a[0].clone()]);
        assert_eq!(still_trusted(&[a[0].clone()], NOW + 36 * hour), "");
    }

    #[test]
    fn apply_switch_and_drop_move_the_cas_through_the_secret() {
        let p = policy();
        let now = system_time(NOW);
        let mut m = Material::default();
        let mut bundle = Vec::new();
        settle(&mut m, &mut bundle, &p, now);
        let first_ca = m.files[CA_CERT_FILE].clone();
        let f = inspect(&m, &names(), NOW, None);
        let m1 = apply(
            &Step::StartRotation("test".into()),
            &m,
            &f,
            &p,
            &names(),
            now,
        )
        .expect("start");
        assert_eq!(m1.next_since, Some(NOW));
        assert_eq!(m1.files[CA_CERT_FILE], first_ca);
        assert_eq!(roots(&trusted_bundle(&m1)).len(), 2);
        let f1 = inspect(&m1, &names(), NOW, Some(&[roots(&trusted_bundle(&m))]));
        assert!(!f1.bundle_trusts_next, "the old caBundle lacks the next CA");
        let later = NOW + 8 * DAY;
        let f1 = inspect(&m1, &names(), later, Some(&[roots(&trusted_bundle(&m1))]));
        assert!(f1.bundle_trusts_next);
        let step = decide(&f1, &p, later);
        assert!(matches!(step, Step::SwitchCa(_)), "{step}");
        let m2 = apply(&step, &m1, &f1, &p, &names(), system_time(later)).expect("switch");
        assert_eq!(m2.files[CA_CERT_FILE], m1.files[NEXT_CA_CERT_FILE]);
        assert_eq!(m2.files[PREVIOUS_CA_CERT_FILE], first_ca);
        assert_eq!((m2.next_since, m2.previous_since), (None, Some(later)));
        assert!(!m2.files.contains_key(NEXT_CA_KEY_FILE));
        let f2 = inspect(&m2, &names(), later, None);
        assert!(
            matches!(f2.serving, Serving::Issued { problem: None, .. }),
            "{f2:?}"
        );
        let bundle2 = trusted_bundle(&m2);
        assert_eq!(
            roots(&bundle2)[0],
            roots(&m2.files[CA_CERT_FILE])[0],
            "the signing CA first"
        );
        let m3 = apply(
            &Step::DropPrevious("test".into()),
            &m2,
            &f2,
            &p,
            &names(),
            system_time(later),
        )
        .expect("drop");
        assert_eq!(roots(&trusted_bundle(&m3)).len(), 1);
        assert_eq!(m3.previous_since, None);
        // The two CAs have different names.
        let subject = |pem: &[u8]| {
            let der = roots(pem).swap_remove(0);
            let (_, c) = x509_parser::parse_x509_certificate(&der).expect("x509");
            c.subject().to_string()
        };
        assert_ne!(subject(&first_ca), subject(&m2.files[CA_CERT_FILE]));
        // Garbage is left out of the caBundle.
        let mut junk = m3.clone();
        junk.files
            .insert(PREVIOUS_CA_CERT_FILE.into(), b"junk".to_vec());
        assert_eq!(trusted_bundle(&junk), trusted_bundle(&m3));
        // A switch without a next CA is an error, not a panic.
        assert!(apply(&Step::SwitchCa("x".into()), &m3, &f2, &p, &names(), now).is_err());
    }
}
