//! The checks: what each answer must hold (well formed, only adds, preserves, schema-valid),
//! for creates, updates, other requests and any body.

use super::*;

pub(super) type Check = Result<(), TestCaseError>;

/// A response as the API server expects it: 200, the review framing, the uid echoed, `allowed`,
/// a base64 JSON Patch only with `patchType: JSONPatch`, a `Status` when denied, warnings as
/// strings, nothing else. Returns `response` and the decoded patch.
pub(super) fn well_formed(
    reply: &admission::Reply,
    uid: &str,
) -> Result<(Value, Option<json_patch::Patch>), TestCaseError> {
    prop_assert_eq!(
        reply.http_status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    let review: Value = serde_json::from_slice(&reply.body)
        .map_err(|e| TestCaseError::fail(format!("response is not JSON: {e}")))?;
    prop_assert_eq!(&review["apiVersion"], "admission.k8s.io/v1");
    prop_assert_eq!(&review["kind"], "AdmissionReview");
    let response = review["response"].clone();
    prop_assert_eq!(&response["uid"], uid, "uid echoed");
    let Some(allowed) = response["allowed"].as_bool() else {
        return Err(TestCaseError::fail(format!("no allowed: {response}")));
    };
    for key in response.as_object().into_iter().flat_map(|o| o.keys()) {
        prop_assert!(
            ["uid", "allowed", "status", "patchType", "patch", "warnings"].contains(&key.as_str()),
            "unexpected response key {}",
            key
        );
    }
    let patch = match response.get("patch") {
        None => {
            prop_assert!(response.get("patchType").is_none());
            None
        }
        Some(patch) => {
            prop_assert!(allowed, "a denial carries a patch");
            prop_assert_eq!(&response["patchType"], "JSONPatch");
            let bytes = patch
                .as_str()
                .and_then(|p| base64::engine::general_purpose::STANDARD.decode(p).ok())
                .ok_or_else(|| TestCaseError::fail("patch is not base64"))?;
            let patch: json_patch::Patch = serde_json::from_slice(&bytes)
                .map_err(|e| TestCaseError::fail(format!("not a JSON Patch: {e}")))?;
            prop_assert!(!patch.0.is_empty(), "an empty patch is sent");
            Some(patch)
        }
    };
    if allowed {
        prop_assert!(response.get("status").is_none(), "{}", response);
    } else {
        let code = response["status"]["code"].as_i64();
        prop_assert!(matches!(code, Some(400 | 422)), "{}", response);
        prop_assert_eq!(&response["status"]["status"], "Failure");
    }
    if let Some(w) = response.get("warnings") {
        let all_strings = w
            .as_array()
            .is_some_and(|w| !w.is_empty() && w.iter().all(Value::is_string));
        prop_assert!(all_strings, "warnings: {}", w);
    }
    Ok((response, patch))
}

pub(super) fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

/// The JSON Pointer token of a key.
pub(super) fn token(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// Every operation adds at an absent key or appends to an array, or rewrites a `RestartPod`
/// action, or restamps the injected annotation, or names a service account where the template
/// names an empty one: nothing the user wrote is removed or overwritten.
pub(super) fn only_adds(object: &Value, patch: &json_patch::Patch) -> Check {
    for op in &patch.0 {
        match op {
            json_patch::PatchOperation::Add(add) => {
                let path = add.path.as_str();
                let ok = path.ends_with("/-")
                    || match object.pointer(path) {
                        None => true,
                        Some(old) => {
                            (path.ends_with(&format!("/{}", token(INJECTED)))
                                && old != &json!(env!("CARGO_PKG_VERSION")))
                                || (path.ends_with("/serviceAccountName") && old == "")
                        }
                    };
                prop_assert!(ok, "add overwrites {}", path);
            }
            json_patch::PatchOperation::Replace(replace) => {
                let path = replace.path.as_str();
                prop_assert!(path.ends_with("/action"), "replaces {}", path);
                prop_assert_eq!(object.pointer(path), Some(&json!(RESTART_POD)));
                prop_assert_eq!(&replace.value, &json!(RAC));
            }
            other => return Err(TestCaseError::fail(format!("operation {other:?}"))),
        }
    }
    Ok(())
}

/// Every scalar of `before` is in `after` at the same place, unchanged (but for the exceptions
/// [`only_adds`] allows); every object and array is still one.
pub(super) fn preserved(before: &Value, after: &Value, at: &str) -> Check {
    match (before, after) {
        (Value::Object(b), Value::Object(a)) => {
            for (key, value) in b {
                let path = format!("{at}/{}", token(key));
                match a.get(key) {
                    Some(after) => preserved(value, after, &path)?,
                    None => return Err(TestCaseError::fail(format!("{path} is gone"))),
                }
            }
            Ok(())
        }
        (Value::Array(b), Value::Array(a)) => {
            prop_assert!(a.len() >= b.len(), "{} shrank", at);
            for (i, (value, after)) in b.iter().zip(a).enumerate() {
                preserved(value, after, &format!("{at}/{i}"))?;
            }
            Ok(())
        }
        (b, a) if b == a => Ok(()),
        (b, a) => {
            let allowed = (at.ends_with("/action") && b == RESTART_POD && a == RAC)
                || at.ends_with(&format!("/{}", token(INJECTED)))
                || (at.ends_with("/serviceAccountName") && b == "");
            prop_assert!(allowed, "{} changed from {} to {}", at, b, a);
            Ok(())
        }
    }
}

pub(super) fn schema_valid(object: &Value, what: &str) -> Check {
    let errors = fixtures::schema_errors(schema(), object);
    prop_assert!(
        errors.is_empty(),
        "{}: the CRD schema rejects it: {:#?}",
        what,
        errors
    );
    Ok(())
}

/// CREATE through the mutating then the validating webhook, as the API server chains them.
pub(super) fn create(model: &Model, uid: &str, which: usize, dry_run: Option<bool>) -> Check {
    let config = injection_config(which);
    let object = model.json();
    schema_valid(&object, "the generated JobSet")?;
    let request = review(
        uid,
        "CREATE",
        ("jobset.x-k8s.io", "JobSet"),
        Some(&object),
        None,
        dry_run,
    );
    let body = serde_json::to_vec(&request).expect("JSON");

    // Mutation.
    let reply = admission::review(Endpoint::Mutate, &body, &config);
    let (response, patch) = well_formed(&reply, uid)?;
    prop_assert_eq!(&response["allowed"], &json!(true));
    // Dry-run or not, the same answer.
    let mut flipped = request.clone();
    flipped["request"]["dryRun"] = json!(!dry_run.unwrap_or(false));
    let flipped = admission::review(
        Endpoint::Mutate,
        &serde_json::to_vec(&flipped).expect("JSON"),
        &config,
    );
    prop_assert_eq!(&flipped, &reply, "dryRun changes the answer");

    let mut mutated = object.clone();
    match &patch {
        None => {
            // Only a JobSet that already has everything the mutation adds gets no patch.
            if model.mutates() {
                prop_assert_eq!(
                    model.violations(false, &config),
                    model.violations(true, &config)
                );
            }
        }
        Some(patch) => {
            prop_assert!(model.mutates(), "patches a JobSet it must leave alone");
            only_adds(&object, patch)?;
            json_patch::patch(&mut mutated, patch)
                .map_err(|e| TestCaseError::fail(format!("the patch does not apply: {e}")))?;
            preserved(&object, &mutated, "")?;
            schema_valid(&mutated, "the mutated JobSet")?;
            prop_assert_eq!(reply.decision.outcome, admission::ReviewOutcome::Patched);
        }
    }
    if model.mutates() {
        let rewrites = warnings(&response)
            .iter()
            .filter(|w| w.contains("RestartPod rewritten"))
            .count();
        prop_assert_eq!(
            rewrites,
            model
                .restart_pod_rules()
                .min(admission::validate::MAX_WARNINGS)
        );
    }

    // Idempotence: the mutated object gets no patch.
    let request2 = review(
        uid,
        "CREATE",
        ("jobset.x-k8s.io", "JobSet"),
        Some(&mutated),
        None,
        dry_run,
    );
    let body2 = serde_json::to_vec(&request2).expect("JSON");
    let again = admission::review(Endpoint::Mutate, &body2, &config);
    let (_, patch) = well_formed(&again, uid)?;
    prop_assert!(patch.is_none(), "second mutation patches: {:?}", patch);

    if model.mutates() {
        // Every pod template the webhook injected the agent into can pull its image.
        for (i, job) in model.jobs.iter().enumerate() {
            if !job.pod.agents().is_empty() {
                continue;
            }
            let pod = &mutated["spec"]["replicatedJobs"][i]["template"]["spec"]["template"]["spec"];
            let names: Vec<&Value> = pod["imagePullSecrets"]
                .as_array()
                .map(|l| l.iter().map(|e| &e["name"]).collect())
                .unwrap_or_default();
            for secret in &config.image_pull_secrets {
                let count = names.iter().filter(|n| **n == secret).count();
                prop_assert_eq!(count, 1, "{}: {:?}", secret, names);
            }
        }
        // A client that writes the JobSet again as it built it (Kubeflow Trainer's apply), or
        // without the agents alone, changes nothing once the UPDATE is mutated.
        written_again(uid, &object, &mutated, &config)?;
        let mut stripped = mutated.clone();
        for (i, job) in model.jobs.iter().enumerate() {
            if !job.pod.agents().is_empty() {
                continue;
            }
            let pod =
                &mut stripped["spec"]["replicatedJobs"][i]["template"]["spec"]["template"]["spec"];
            if job.pod.init.is_none() {
                if let Some(p) = pod.as_object_mut() {
                    p.remove("initContainers");
                }
            } else if let Some(init) = pod["initContainers"].as_array_mut() {
                init.retain(|c| c["name"] != AGENT_NAME);
            }
        }
        written_again(uid, &stripped, &mutated, &config)?;
    }

    // Validation of the mutated object: denied exactly for the explicit conflicts.
    let reply = admission::review(Endpoint::Validate, &body2, &config);
    let (response, patch) = well_formed(&reply, uid)?;
    prop_assert!(patch.is_none(), "validation patches");
    let expected = sorted(
        model
            .violations(model.mutates(), &config)
            .into_iter()
            .map(|(_, p)| p)
            .collect(),
    );
    let got = sorted(violation_fields(&response));
    capped_eq(&got, &expected, &response)?;
    prop_assert_eq!(&response["allowed"], &json!(expected.is_empty()));
    if !expected.is_empty() {
        prop_assert_eq!(&response["status"]["code"], &json!(422));
        prop_assert_eq!(reply.decision.outcome, admission::ReviewOutcome::Denied);
    }
    // The value path (the offline commands') agrees.
    prop_assert_eq!(
        oracle::review_through_value(Endpoint::Validate, &body2, &config),
        Some(reply.body)
    );
    Ok(())
}

/// An UPDATE of the stored JobSet `stored` to `written` (which lacks some of what the webhook
/// injected) is patched back to `stored` exactly, and the patched object is not patched again.
pub(super) fn written_again(
    uid: &str,
    written: &Value,
    stored: &Value,
    config: &InjectionConfig,
) -> Check {
    let request = review(
        uid,
        "UPDATE",
        ("jobset.x-k8s.io", "JobSet"),
        Some(written),
        Some(stored),
        None,
    );
    let reply = admission::review(
        Endpoint::Mutate,
        &serde_json::to_vec(&request).expect("JSON"),
        config,
    );
    let (_, patch) = well_formed(&reply, uid)?;
    let mut result = written.clone();
    if let Some(patch) = &patch {
        only_adds(written, patch)?;
        json_patch::patch(&mut result, patch)
            .map_err(|e| TestCaseError::fail(format!("the patch does not apply: {e}")))?;
    }
    prop_assert_eq!(
        &result,
        stored,
        "the UPDATE patch does not restore the stored JobSet"
    );
    let again = review(
        uid,
        "UPDATE",
        ("jobset.x-k8s.io", "JobSet"),
        Some(&result),
        Some(stored),
        None,
    );
    let again = admission::review(
        Endpoint::Mutate,
        &serde_json::to_vec(&again).expect("JSON"),
        config,
    );
    let (_, patch) = well_formed(&again, uid)?;
    prop_assert!(
        patch.is_none(),
        "an UPDATE to the stored JobSet is patched: {:?}",
        patch
    );
    Ok(())
}

/// The replicatedJob index of a patch operation's path (`/spec/replicatedJobs/N/...`).
pub(super) fn job_of(op: &json_patch::PatchOperation) -> Option<usize> {
    op.path()
        .as_str()
        .strip_prefix("/spec/replicatedJobs/")?
        .split('/')
        .next()?
        .parse()
        .ok()
}

/// How an UPDATE's old object differs from the new one.
#[derive(Clone, Debug)]
pub(super) enum Old {
    Absent,
    Same,
    /// One replicatedJob (index modulo their count) has another replica count.
    JobChanged(Index),
    /// The old JobSet was not InPlaceRestart.
    WasRecreate,
}

pub(super) fn update(model: &Model, uid: &str, old: &Old, which: usize) -> Check {
    let config = injection_config(which);
    let object = model.json();
    let mut changed = None;
    let old_object = match old {
        Old::Absent => None,
        Old::Same => Some(object.clone()),
        Old::JobChanged(at) => {
            let i = at.index(model.jobs.len());
            changed = Some(i);
            let mut old = model.clone();
            old.jobs[i].replicas += 1;
            Some(old.json())
        }
        Old::WasRecreate => {
            let mut old = model.clone();
            old.strategy = Some("Recreate");
            Some(old.json())
        }
    };
    let body = serde_json::to_vec(&review(
        uid,
        "UPDATE",
        ("jobset.x-k8s.io", "JobSet"),
        Some(&object),
        old_object.as_ref(),
        None,
    ))
    .expect("JSON");
    // The mutation of an UPDATE puts back into the replicatedJobs the stored JobSet shows
    // injected what the stored one carries (here all of it: nothing is missing), and rewrites
    // their `RestartPod` actions as CREATE does; it adds nothing of this version's injection, and
    // nothing to the others.
    let reinjected: Vec<usize> = match old {
        Old::Same | Old::JobChanged(_) if model.mutates() => (0..model.jobs.len())
            .filter(|i| model.jobs[*i].pod.injected())
            .collect(),
        _ => vec![],
    };
    let (response, patch) = well_formed(&admission::review(Endpoint::Mutate, &body, &config), uid)?;
    prop_assert_eq!(&response["allowed"], &json!(true));
    let create = admission::mutate(&object, &config);
    let expected: Vec<_> = create
        .patch
        .0
        .into_iter()
        .filter(|op| job_of(op).is_some_and(|i| reinjected.contains(&i)))
        .filter(|op| matches!(op, json_patch::PatchOperation::Replace(_)))
        .collect();
    prop_assert_eq!(patch.map(|p| p.0).unwrap_or_default(), expected);
    if create.warnings.len() <= admission::validate::MAX_WARNINGS {
        let expected: Vec<String> = create
            .warnings
            .into_iter()
            .filter(|w| {
                w.contains("RestartPod rewritten")
                    && reinjected
                        .iter()
                        .any(|i| w.starts_with(&format!("spec.replicatedJobs[{i}]:")))
            })
            .collect();
        prop_assert_eq!(warnings(&response), expected);
    }

    let all = model.violations(false, &config);
    let ratchets = matches!(old, Old::Same | Old::JobChanged(_));
    let (kept, ratcheted): (Vec<_>, Vec<_>) = all
        .into_iter()
        .partition(|(i, _)| !ratchets || Some(*i) == changed);
    let reply = admission::review(Endpoint::Validate, &body, &config);
    let (response, _) = well_formed(&reply, uid)?;
    let expected = sorted(kept.into_iter().map(|(_, p)| p).collect());
    capped_eq(&sorted(violation_fields(&response)), &expected, &response)?;
    prop_assert_eq!(&response["allowed"], &json!(expected.is_empty()));
    let left = warnings(&response)
        .iter()
        .filter(|w| w.contains("left as it was"))
        .count();
    if warnings(&response).len() <= admission::validate::MAX_WARNINGS {
        prop_assert_eq!(left, ratcheted.len());
    } else {
        // Past the cap the rest is counted in a last warning.
        prop_assert!(left <= ratcheted.len());
        prop_assert!(
            warnings(&response)
                .last()
                .is_some_and(|w| w.contains("more warnings"))
        );
    }
    prop_assert_eq!(
        oracle::review_through_value(Endpoint::Validate, &body, &config),
        Some(reply.body)
    );
    Ok(())
}

/// DELETE and CONNECT are allowed as they are; other kinds too; an unknown operation is answered
/// with a denial naming it.
pub(super) fn other_requests(
    model: &Model,
    uid: &str,
    operation: &str,
    kind: (&str, &str),
) -> Check {
    let config = injection_config(0);
    let object = model.json();
    let body = serde_json::to_vec(&review(
        uid,
        operation,
        kind,
        Some(&object),
        Some(&object),
        Some(true),
    ))
    .expect("JSON");
    let is_jobset = kind == ("jobset.x-k8s.io", "JobSet");
    for endpoint in [Endpoint::Mutate, Endpoint::Validate] {
        let reply = admission::review(endpoint, &body, &config);
        let (response, patch) = well_formed(&reply, uid)?;
        match operation {
            "DELETE" | "CONNECT" => {
                prop_assert_eq!(&response, &json!({"uid": uid, "allowed": true}));
            }
            "CREATE" | "UPDATE" if !is_jobset => {
                prop_assert_eq!(&response, &json!({"uid": uid, "allowed": true}));
            }
            "CREATE" | "UPDATE" => {
                prop_assert!(patch.is_none() || endpoint == Endpoint::Mutate);
            }
            _ => {
                prop_assert_eq!(&response["allowed"], &json!(false));
                prop_assert_eq!(&response["status"]["code"], &json!(400));
                let message = response["status"]["message"].as_str().unwrap_or("");
                prop_assert!(message.contains("request.operation"), "{}", message);
            }
        }
        prop_assert_eq!(
            oracle::review_through_value(endpoint, &body, &config),
            Some(reply.body)
        );
    }
    Ok(())
}

/// Any body: never a panic; 200 with the uid echoed exactly when a `Value` reading finds a
/// non-empty string uid, else 400 with a `Status`; the same bytes as the value path.
pub(super) fn any_body(body: &[u8], which: usize) -> Check {
    let config = injection_config(which);
    let value = serde_json::from_slice::<Value>(body).ok();
    let uid = value
        .as_ref()
        .and_then(|v| v.pointer("/request/uid"))
        .and_then(Value::as_str)
        .filter(|u| !u.is_empty());
    for endpoint in [Endpoint::Mutate, Endpoint::Validate] {
        let reply = admission::review(endpoint, body, &config);
        match uid {
            Some(uid) => {
                well_formed(&reply, uid)?;
                if let Some(expected) = oracle::review_through_value(endpoint, body, &config) {
                    prop_assert_eq!(
                        String::from_utf8_lossy(&reply.body),
                        String::from_utf8_lossy(&expected)
                    );
                }
            }
            None => {
                prop_assert_eq!(reply.http_status, 400);
                let status: Value = serde_json::from_slice(&reply.body)
                    .map_err(|e| TestCaseError::fail(format!("status is not JSON: {e}")))?;
                prop_assert_eq!(&status["kind"], "Status");
                prop_assert_eq!(&status["code"], &json!(400));
                prop_assert_eq!(reply.decision.outcome, admission::ReviewOutcome::Error);
            }
        }
    }
    Ok(())
}

/// Places in a review where an odd value goes.
pub(super) const ODD_PLACES: &[&str] = &[
    "",
    "/apiVersion",
    "/kind",
    "/request",
    "/request/uid",
    "/request/operation",
    "/request/kind",
    "/request/kind/group",
    "/request/kind/kind",
    "/request/dryRun",
    "/request/object",
    "/request/oldObject",
    "/request/object/metadata",
    "/request/object/metadata/annotations",
    "/request/object/spec",
    "/request/object/spec/failurePolicy",
    "/request/object/spec/failurePolicy/restartStrategy",
    "/request/object/spec/replicatedJobs",
    "/request/object/spec/replicatedJobs/0",
    "/request/object/spec/replicatedJobs/0/template/spec",
    "/request/object/spec/replicatedJobs/0/template/spec/backoffLimit",
    "/request/object/spec/replicatedJobs/0/template/spec/completions",
    "/request/object/spec/replicatedJobs/0/template/spec/template",
    "/request/object/spec/replicatedJobs/0/template/spec/template/metadata",
    "/request/object/spec/replicatedJobs/0/template/spec/template/spec",
    "/request/object/spec/replicatedJobs/0/template/spec/template/spec/initContainers",
    "/request/object/spec/replicatedJobs/0/template/spec/template/spec/initContainers/0",
    "/request/object/spec/replicatedJobs/0/template/spec/template/spec/containers/0",
    "/request/object/spec/replicatedJobs/0/template/spec/template/spec/containers/0/env",
    "/request/object/spec/replicatedJobs/0/template/spec/template/spec/containers/0/env/0",
    "/request/object/spec/replicatedJobs/0/template/spec/template/spec/containers/0/restartPolicyRules",
    "/request/object/spec/replicatedJobs/0/template/spec/template/spec/initContainers/0/startupProbe",
    "/request/object/spec/replicatedJobs/0/template/spec/template/spec/initContainers/0/ports",
    "/request/object/spec/replicatedJobs/0/template/spec/template/spec/automountServiceAccountToken",
    "/request/object/spec/replicatedJobs/0/template/spec/template/spec/volumes",
    "/request/object/spec/replicatedJobs/0/template/spec/template/spec/volumes/0",
    "/request/object/spec/replicatedJobs/0/template/spec/template/spec/volumes/0/projected",
];

/// Sets (or removes, for `None`) the value at a pointer whose parent exists.
pub(super) fn set(root: &mut Value, pointer: &str, value: Option<Value>) {
    let Some((parent, key)) = pointer.rsplit_once('/') else {
        if let Some(v) = value {
            *root = v;
        }
        return;
    };
    match root.pointer_mut(parent) {
        Some(Value::Object(map)) => match value {
            Some(v) => {
                map.insert(key.to_owned(), v);
            }
            None => {
                map.remove(key);
            }
        },
        Some(Value::Array(items)) => {
            if let Ok(i) = key.parse::<usize>()
                && i < items.len()
            {
                match value {
                    Some(v) => items[i] = v,
                    None => {
                        items.remove(i);
                    }
                }
            }
        }
        _ => {}
    }
}

/// An odd value: any JSON, one wrapped as serde_json's raw value, a broken raw value, or absence.
pub(super) fn odd_value() -> impl Strategy<Value = Option<Value>> {
    prop_oneof![
        1 => Just(None),
        4 => json_value(3, true).prop_map(Some),
        1 => json_value(2, true).prop_map(|v| Some(json!({"$serde_json::private::RawValue": v.to_string()}))),
        1 => token_volume_variant().prop_map(Some),
        1 => select(vec![json!({"$serde_json::private::RawValue": 5}),
                         json!({"$serde_json::private::RawValue": "{"}),
                         json!({"$serde_json::private::RawValue": "1", "b": 2})]).prop_map(Some),
    ]
}

/// The injected agent's token volume (issue 21 item 4: recognised only as written exactly), as a
/// volume, as the volumes list, or with one part replaced by an odd value or by a raw value of
/// itself.
pub(super) fn token_volume_variant() -> impl Strategy<Value = Value> {
    let volume = admission::sidecar::token_volume();
    let parts = [
        "/name",
        "/projected",
        "/projected/defaultMode",
        "/projected/sources",
        "/projected/sources/0",
        "/projected/sources/0/serviceAccountToken/expirationSeconds",
        "/projected/sources/1/configMap/items",
        "/projected/sources/2/downwardAPI/items/0/fieldRef",
    ];
    (
        select(parts.to_vec()),
        prop_oneof![json_value(2, true).prop_map(Some), Just(None)],
        0..4u8,
    )
        .prop_map(move |(part, odd, how)| {
            let mut v = volume.clone();
            match how {
                0 => {}
                1 => {
                    if let Some(x) = v.pointer_mut(part) {
                        *x = json!({"$serde_json::private::RawValue": x.to_string()});
                    }
                }
                _ => set(&mut v, part, odd),
            }
            if how == 3 { json!([v]) } else { v }
        })
}

/// An edit of a body's bytes.
#[derive(Clone, Debug)]
pub(super) enum ByteEdit {
    Flip(Index, u8),
    Insert(Index, u8),
    Delete(Index),
    Truncate(Index),
}

pub(super) fn byte_edit() -> impl Strategy<Value = ByteEdit> {
    let interesting = prop_oneof![
        any::<u8>(),
        select(b"{}[]\",:\\0123456789-+.eEtrufalsn \xff\xc3".to_vec()),
    ];
    prop_oneof![
        (any::<Index>(), interesting.clone()).prop_map(|(i, b)| ByteEdit::Flip(i, b)),
        (any::<Index>(), interesting).prop_map(|(i, b)| ByteEdit::Insert(i, b)),
        any::<Index>().prop_map(ByteEdit::Delete),
        any::<Index>().prop_map(ByteEdit::Truncate),
    ]
}

pub(super) fn apply_byte_edit(body: &mut Vec<u8>, edit: &ByteEdit) {
    if body.is_empty() {
        return;
    }
    match edit {
        ByteEdit::Flip(i, b) => {
            let i = i.index(body.len());
            body[i] = *b;
        }
        ByteEdit::Insert(i, b) => {
            let i = i.index(body.len() + 1);
            body.insert(i, *b);
        }
        ByteEdit::Delete(i) => {
            let i = i.index(body.len());
            body.remove(i);
        }
        ByteEdit::Truncate(i) => {
            let i = i.index(body.len());
            body.truncate(i);
        }
    }
}

/// The violations reported are the expected ones, or, past the cap, the first
/// [`admission::validate::MAX_VIOLATIONS`] of them with a count of the rest.
pub(super) fn capped_eq(
    got: &[String],
    expected: &[String],
    response: &Value,
) -> Result<(), TestCaseError> {
    if expected.len() <= admission::validate::MAX_VIOLATIONS {
        prop_assert_eq!(got, expected, "violations of {:#}", response);
    } else {
        prop_assert_eq!(got.len(), admission::validate::MAX_VIOLATIONS);
        prop_assert!(got.iter().all(|g| expected.contains(g)), "{:#}", response);
        let message = response["status"]["message"].as_str().unwrap_or("");
        prop_assert!(message.contains("more violations"), "{}", message);
    }
    Ok(())
}
