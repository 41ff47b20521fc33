//! PATCH bodies (merge, JSON, strategic-as-merge, server-side apply) and the simplified field
//! ownership that lets server-side apply report conflicts.

use std::collections::BTreeMap;

use serde_json::Value;

use super::error::ApiError;

/// The patch types of the `Content-Type` header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchType {
    /// `application/merge-patch+json` (RFC 7386).
    Merge,
    /// `application/json-patch+json` (RFC 6902).
    Json,
    /// `application/strategic-merge-patch+json`, applied as a merge patch (lists are replaced,
    /// `$patch`-style directives are dropped).
    Strategic,
    /// `application/apply-patch+yaml`: server-side apply, approximated as a merge of the applied
    /// configuration plus conflict detection on fields another manager applied.
    Apply,
}

impl PatchType {
    /// From a `Content-Type` header value (parameters ignored).
    pub fn from_content_type(ct: &str) -> Option<Self> {
        let media = ct.split(';').next().unwrap_or_default().trim();
        match media.to_ascii_lowercase().as_str() {
            "application/merge-patch+json" => Some(PatchType::Merge),
            "application/json-patch+json" => Some(PatchType::Json),
            "application/strategic-merge-patch+json" => Some(PatchType::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+json" => {
                Some(PatchType::Apply)
            }
            _ => None,
        }
    }
}

/// Parses a patch body that must be a JSON object.
fn parse_object(body: &[u8]) -> Result<Value, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
    if v.is_object() {
        Ok(v)
    } else {
        Err(ApiError::bad_request("the patch must be a JSON object"))
    }
}

/// Parses a server-side apply body (YAML or JSON), which must be an object.
pub fn parse_apply(body: &[u8]) -> Result<Value, ApiError> {
    let v: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(_) => serde_saphyr::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?,
    };
    if v.is_object() {
        Ok(v)
    } else {
        Err(ApiError::bad_request(
            "the applied configuration must be an object",
        ))
    }
}

/// Drops strategic-merge directives (`$patch`, `$retainKeys`, `$setElementOrder/...`,
/// `$deleteFromPrimitiveList/...`) so the rest applies as a merge patch.
fn strip_directives(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|k, _| !k.starts_with('$'));
            m.values_mut().for_each(strip_directives);
        }
        Value::Array(a) => a.iter_mut().for_each(strip_directives),
        _ => {}
    }
}

/// Applies a merge, JSON or strategic patch to a copy of `doc`. (Apply is handled by the store,
/// which needs the ownership too.) A failed JSON-patch operation (a `test` that does not hold,
/// a missing path) is a 422 `Invalid` with upstream's generic message and empty details; an
/// undecodable body a 400.
pub fn apply_patch(ty: PatchType, doc: &Value, body: &[u8]) -> Result<Value, ApiError> {
    let mut out = doc.clone();
    match ty {
        PatchType::Merge => json_patch::merge(&mut out, &parse_object(body)?),
        PatchType::Strategic => {
            let mut p = parse_object(body)?;
            strip_directives(&mut p);
            json_patch::merge(&mut out, &p);
        }
        PatchType::Apply => json_patch::merge(&mut out, &parse_apply(body)?),
        PatchType::Json => {
            let p: json_patch::Patch = serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding JSON patch: {e}")))?;
            // Upstream answers every failed operation with the generic 422 and empty details.
            json_patch::patch(&mut out, &p.0)
                .map_err(|_| ApiError::from_code(422).with_details(serde_json::json!({})))?;
        }
    }
    Ok(out)
}

/// Field ownership: leaf path (`/spec/holderIdentity`) to field manager.
pub type Owners = BTreeMap<String, String>;

/// Paths no manager owns.
fn unowned(path: &str) -> bool {
    matches!(
        path,
        "/apiVersion"
            | "/kind"
            | "/metadata/name"
            | "/metadata/namespace"
            | "/metadata/resourceVersion"
            | "/metadata/uid"
            | "/metadata/generation"
            | "/metadata/creationTimestamp"
            | "/metadata/deletionTimestamp"
            | "/metadata/deletionGracePeriodSeconds"
    ) || path.starts_with("/metadata/managedFields")
}

fn escape(seg: &str) -> String {
    seg.replace('~', "~0").replace('/', "~1")
}

/// Leaves of an object (non-empty objects are descended, arrays and scalars are leaves).
pub fn leaves<'a>(v: &'a Value, prefix: &mut String, out: &mut BTreeMap<String, &'a Value>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, child) in m {
                let len = prefix.len();
                prefix.push('/');
                prefix.push_str(&escape(k));
                leaves(child, prefix, out);
                prefix.truncate(len);
            }
        }
        _ => {
            if !prefix.is_empty() && !unowned(prefix) {
                out.insert(prefix.clone(), v);
            }
        }
    }
}

fn leaf_map(v: &Value) -> BTreeMap<String, &Value> {
    let mut out = BTreeMap::new();
    leaves(v, &mut String::new(), &mut out);
    out
}

/// Fields of `config` owned by another manager whose value in `current` differs: a non-forced
/// apply by `manager` conflicts on these.
pub fn apply_conflicts(
    owners: &Owners,
    manager: &str,
    config: &Value,
    current: &Value,
) -> Vec<(String, String)> {
    if owners.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for (path, value) in leaf_map(config) {
        if let Some(owner) = owners.get(&path)
            && owner != manager
            && current.pointer(&path) != Some(value)
        {
            out.push((owner.clone(), path));
        }
    }
    out
}

/// Ownership after a write from `old` to `new`. An apply by `manager` takes the leaves of its
/// `applied` configuration; another write takes the leaves it changes (for its `manager`, or for
/// nobody when it names none). Leaves that disappear lose their owner. Cheap when nothing is owned
/// and nothing is applied.
pub fn update_owners(
    owners: &Owners,
    manager: Option<&str>,
    applied: Option<&Value>,
    old: Option<&Value>,
    new: &Value,
) -> Owners {
    if owners.is_empty() && applied.is_none() {
        return Owners::new();
    }
    let new_leaves = leaf_map(new);
    let mut out: Owners = owners
        .iter()
        .filter(|(p, _)| new_leaves.contains_key(p.as_str()))
        .map(|(p, m)| (p.clone(), m.clone()))
        .collect();
    match (applied, manager) {
        (Some(cfg), Some(m)) => {
            for path in leaf_map(cfg).into_keys() {
                if new_leaves.contains_key(&path) {
                    out.insert(path, m.to_owned());
                }
            }
        }
        _ => {
            let old_leaves = old.map(leaf_map).unwrap_or_default();
            for (path, v) in &new_leaves {
                if old_leaves.get(path) != Some(v) {
                    match manager {
                        Some(m) => {
                            out.insert(path.clone(), m.to_owned());
                        }
                        None => {
                            out.remove(path);
                        }
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn content_types() {
        assert_eq!(
            PatchType::from_content_type("application/merge-patch+json; charset=utf-8"),
            Some(PatchType::Merge)
        );
        assert_eq!(
            PatchType::from_content_type("application/apply-patch+yaml"),
            Some(PatchType::Apply)
        );
        assert_eq!(PatchType::from_content_type("application/json"), None);
    }

    #[test]
    fn merge_json_and_strategic() {
        let doc = json!({"a": {"b": 1, "c": [1, 2]}, "d": "x"});
        let m = apply_patch(
            PatchType::Merge,
            &doc,
            br#"{"a":{"b":null,"c":[3]},"e":true}"#,
        )
        .expect("merge");
        assert_eq!(m, json!({"a": {"c": [3]}, "d": "x", "e": true}));
        let s = apply_patch(
            PatchType::Strategic,
            &doc,
            br#"{"a":{"$retainKeys":["b"],"b":2},"$setElementOrder/x":[]}"#,
        )
        .expect("strategic");
        assert_eq!(s, json!({"a": {"b": 2, "c": [1, 2]}, "d": "x"}));
        let j = apply_patch(
            PatchType::Json,
            &doc,
            br#"[{"op":"test","path":"/d","value":"x"},{"op":"add","path":"/a/c/-","value":3}]"#,
        )
        .expect("json");
        assert_eq!(j["a"]["c"], json!([1, 2, 3]));
        let e = apply_patch(
            PatchType::Json,
            &doc,
            br#"[{"op":"test","path":"/d","value":"y"}]"#,
        )
        .expect_err("test op fails");
        assert_eq!(e.code, 422);
        // As the real server: the generic message, details present and empty.
        assert_eq!(e.reason, "Invalid");
        assert_eq!(
            e.message,
            "the server rejected our request due to an error in our request"
        );
        assert_eq!(e.status()["details"], json!({}));
        let e = apply_patch(PatchType::Json, &doc, br#"{"op":"add"}"#).expect_err("not a list");
        assert_eq!(e.code, 400);
        let e = apply_patch(PatchType::Merge, &doc, b"[1]").expect_err("not an object");
        assert_eq!(e.code, 400);
        let e = apply_patch(PatchType::Merge, &doc, b"{").expect_err("not json");
        assert_eq!(e.code, 400);
        let y = apply_patch(PatchType::Apply, &doc, b"d: z\nf: [1]\n").expect("yaml apply");
        assert_eq!(y["d"], "z");
        assert_eq!(y["f"], json!([1]));
    }

    #[test]
    fn ownership_and_conflicts() {
        let a_cfg = json!({"apiVersion": "v1", "kind": "Lease", "metadata": {"name": "l"},
                           "spec": {"holderIdentity": "a", "leaseDurationSeconds": 10}});
        let obj = a_cfg.clone();
        let owners = update_owners(&Owners::new(), Some("mgr-a"), Some(&a_cfg), None, &obj);
        assert_eq!(
            owners.keys().collect::<Vec<_>>(),
            ["/spec/holderIdentity", "/spec/leaseDurationSeconds"]
        );
        let b_cfg = json!({"spec": {"holderIdentity": "b", "leaseDurationSeconds": 10}});
        let conflicts = apply_conflicts(&owners, "mgr-b", &b_cfg, &obj);
        assert_eq!(
            conflicts,
            [("mgr-a".to_owned(), "/spec/holderIdentity".to_owned())]
        );
        assert!(apply_conflicts(&owners, "mgr-a", &b_cfg, &obj).is_empty());
        // A merge patch that nulls the holder frees it.
        let released = apply_patch(
            PatchType::Merge,
            &obj,
            br#"{"spec":{"holderIdentity":null}}"#,
        )
        .expect("patch");
        let owners = update_owners(&owners, Some("mgr-b"), None, Some(&obj), &released);
        assert_eq!(
            owners.keys().collect::<Vec<_>>(),
            ["/spec/leaseDurationSeconds"]
        );
        assert!(apply_conflicts(&owners, "mgr-b", &b_cfg, &released).is_empty());
        // Nothing owned, nothing applied: nothing tracked.
        assert!(update_owners(&Owners::new(), None, None, None, &obj).is_empty());
    }
}
