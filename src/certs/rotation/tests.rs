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
    let previous = |since: Option<i64>, validity: Validity| Some(Ok(Staged { validity, since }));
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
                        let next_live = matches!(*nn, "no-since" | "in-overlap" | "overlap-passed");
                        let serving_bad = *vn != "young";
                        let kind = step.kind();
                        *seen.entry(kind).or_default() += 1;
                        match &step {
                            Step::NewCa(_) => {
                                assert!(signing_bad && !next_live, "{case}: {step}");
                            }
                            Step::SwitchCa(_) => assert!(
                                next_live && (signing_bad || (*nn == "overlap-passed" && trusted)),
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
        generate_distinct_ca(Duration::from_secs(72 * hour as u64), system_time(NOW)).expect("ca"),
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
