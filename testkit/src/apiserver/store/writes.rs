//! The store's writes: create, update, patch, delete and put, with what the real server does
//! to a written object (a pod's defaults, a custom resource's pruning) and the errors it answers.

use super::*;

impl Store {
    /// CREATE into namespace `ns` (ignored for cluster-scoped resources).
    pub fn create(
        &mut self,
        res: ResId,
        ns: &str,
        obj: Value,
        wo: &WriteOpts,
    ) -> Result<Arc<Entry>, ApiError> {
        self.create_inner(res, ns, obj, wo, None)
    }

    pub(super) fn create_inner(
        &mut self,
        res: ResId,
        ns: &str,
        mut obj: Value,
        wo: &WriteOpts,
        applied: Option<&Value>,
    ) -> Result<Arc<Entry>, ApiError> {
        let registry = self.registry.clone();
        let rt = registry.get(res);
        normalize_type(rt, &mut obj)?;
        if rt.namespaced && ns.is_empty() {
            return Err(ApiError::bad_request("a namespace is required"));
        }
        let (given, generate) = with_meta(&mut obj, |m| {
            if rt.namespaced {
                if m.get("namespace")
                    .and_then(Value::as_str)
                    .is_some_and(|given| !given.is_empty() && given != ns)
                {
                    return Err(ns_mismatch());
                }
                m.insert("namespace".into(), json!(ns));
            } else {
                m.remove("namespace");
            }
            let text = |f: &str| {
                m.get(f)
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
            };
            Ok((text("name"), text("generateName")))
        })?;
        let name = match (given, generate) {
            (Some(n), _) => n,
            (None, Some(prefix)) => {
                let base: String = prefix.chars().take(58).collect();
                let mut name = format!("{base}{}", self.random_suffix());
                for _ in 0..16 {
                    if !self.objects[res].contains_key(&self.key(res, ns, &name)) {
                        break;
                    }
                    name = format!("{base}{}", self.random_suffix());
                }
                name
            }
            (None, None) => {
                return Err(ApiError::invalid(
                    rt,
                    "",
                    "metadata.name",
                    "Required value: name or generateName is required",
                ));
            }
        };
        validate_name(rt, &name)
            .map_err(|msg| ApiError::invalid(rt, &name, "metadata.name", &msg))?;
        let key = self.key(res, ns, &name);
        if self.objects[res].contains_key(&key) {
            return Err(ApiError::already_exists(rt, &name));
        }
        let uid = self.uid();
        with_meta(&mut obj, |m| {
            m.insert("name".into(), json!(name));
            m.insert("uid".into(), json!(uid));
            m.insert("creationTimestamp".into(), json!(timestamp_in(0)));
            m.insert("generation".into(), json!(1));
            for f in [
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "managedFields",
                "selfLink",
                "resourceVersion",
            ] {
                m.remove(f);
            }
        });
        if rt.status_subresource
            && !wo.keep_status
            && let Some(o) = obj.as_object_mut()
        {
            match rt.initial_status() {
                Some(s) => {
                    o.insert("status".into(), s);
                }
                None => {
                    o.remove("status");
                }
            }
        }
        admit(rt, &mut obj, None)?;
        let owners = patch::update_owners(
            &Owners::new(),
            wo.field_manager.as_deref(),
            applied,
            None,
            &obj,
        );
        if wo.dry_run {
            set_rv(&mut obj, self.rv);
            return Ok(Entry::new(obj, self.rv, Arc::new(owners)));
        }
        Ok(self.put_entry(res, key, obj, owners, None))
    }

    /// UPDATE (PUT) of the object or its status. Returns the result and whether it was created
    /// (only for resources that create on update).
    pub fn update(
        &mut self,
        res: ResId,
        ns: &str,
        name: &str,
        mut obj: Value,
        part: Part,
        wo: &WriteOpts,
    ) -> Result<(Arc<Entry>, bool), ApiError> {
        if let Some(cur) = self.get(res, ns, name) {
            return Ok((self.update_inner(res, cur, obj, part, wo, None)?, false));
        }
        let registry = self.registry.clone();
        let rt = registry.get(res);
        if !(rt.create_on_update && part == Part::Main) {
            return Err(ApiError::not_found(rt, name));
        }
        normalize_type(rt, &mut obj)?;
        set_name(&mut obj, name)?;
        Ok((self.create_inner(res, ns, obj, wo, None)?, true))
    }

    pub(super) fn update_inner(
        &mut self,
        res: ResId,
        cur: Arc<Entry>,
        mut body: Value,
        part: Part,
        wo: &WriteOpts,
        applied: Option<&Value>,
    ) -> Result<Arc<Entry>, ApiError> {
        let registry = self.registry.clone();
        let rt = registry.get(res);
        normalize_type(rt, &mut body)?;
        let cur_meta = meta(&cur.value).cloned().unwrap_or_default();
        let cur_text = |f: &str| {
            cur_meta
                .get(f)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let (name, ns, cur_uid) = (cur_text("name"), cur_text("namespace"), cur_text("uid"));
        let given = |m: &Map<String, Value>, f: &str| {
            m.get(f)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
        };
        with_meta(&mut body, |m| {
            if given(m, "name").is_some_and(|n| n != name) {
                return Err(name_mismatch(m, &name));
            }
            if rt.namespaced && given(m, "namespace").is_some_and(|n| n != ns) {
                return Err(ns_mismatch());
            }
            if given(m, "resourceVersion").is_some_and(|rv| rv != cur.rv.to_string()) {
                return Err(ApiError::stale(rt, &name));
            }
            if let Some(uid) = given(m, "uid").filter(|u| *u != cur_uid) {
                return Err(ApiError::conflict(
                    rt,
                    &name,
                    &format!(
                        "Precondition failed: UID in precondition: {uid}, UID in object meta: {cur_uid}"
                    ),
                ));
            }
            Ok(())
        })?;
        let mut new = match part {
            Part::Main => {
                if rt.status_subresource && !wo.keep_status {
                    copy_field(&cur.value, &mut body, "status");
                }
                body
            }
            Part::Status => {
                let mut n = cur.value.clone();
                copy_field(&body, &mut n, "status");
                n
            }
        };
        // Server-managed metadata comes from the stored object.
        let generation = cur_meta
            .get("generation")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        let bump = part == Part::Main && spec_changed(&cur.value, &new);
        with_meta(&mut new, |m| {
            m.insert("name".into(), json!(name));
            if rt.namespaced {
                m.insert("namespace".into(), json!(ns));
            }
            for f in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
            ] {
                match cur_meta.get(f) {
                    Some(v) => {
                        m.insert(f.into(), v.clone());
                    }
                    None => {
                        m.remove(f);
                    }
                }
            }
            m.remove("managedFields");
            m.remove("selfLink");
            m.insert(
                "generation".into(),
                json!(if bump { generation + 1 } else { generation }),
            );
            m.insert("resourceVersion".into(), json!(cur.rv.to_string()));
        });
        admit(rt, &mut new, Some(&cur.value))?;
        let owners = patch::update_owners(
            &cur.owners,
            wo.field_manager.as_deref(),
            applied,
            Some(&cur.value),
            &new,
        );
        let key = self.key(res, &ns, &name);
        if new == cur.value {
            // A no-op: no new resourceVersion and no event, as upstream.
            if owners != *cur.owners && !wo.dry_run {
                let e = Entry::new(new, cur.rv, Arc::new(owners));
                self.objects[res].insert(key, e.clone());
                return Ok(e);
            }
            return Ok(cur);
        }
        if wo.dry_run {
            return Ok(Entry::new(new, cur.rv, Arc::new(owners)));
        }
        if meta_str(&new, "deletionTimestamp").is_some() && !has_finalizers(&new) {
            return Ok(self.remove_entry(res, key, cur, new));
        }
        Ok(self.put_entry(res, key, new, owners, Some(cur)))
    }

    /// PATCH of the object or its status. Server-side apply creates an absent object; the
    /// other patch types answer 404 for it.
    #[allow(clippy::too_many_arguments)]
    pub fn patch(
        &mut self,
        res: ResId,
        ns: &str,
        name: &str,
        ty: PatchType,
        body: &[u8],
        part: Part,
        wo: &WriteOpts,
    ) -> Result<(Arc<Entry>, bool), ApiError> {
        let registry = self.registry.clone();
        let rt = registry.get(res);
        let cur = self.get(res, ns, name);
        if ty != PatchType::Apply {
            let cur = cur.ok_or_else(|| ApiError::not_found(rt, name))?;
            // A merge patch of the status subresource keeps only the patched status (and reads
            // the metadata for preconditions): patch a copy without the spec, often most of the
            // object, which `update_inner` takes from the stored object anyway.
            let patched =
                if part == Part::Status && matches!(ty, PatchType::Merge | PatchType::Strategic) {
                    patch::apply_patch(ty, &without_spec(&cur.value), body)?
                } else {
                    patch::apply_patch(ty, &cur.value, body)?
                };
            return Ok((self.update_inner(res, cur, patched, part, wo, None)?, false));
        }
        let manager = wo
            .field_manager
            .clone()
            .filter(|m| !m.is_empty())
            .ok_or_else(|| {
                ApiError::bad_request("PATCH requests with apply must have a fieldManager")
            })?;
        let mut cfg = patch::parse_apply(body)?;
        for f in ["apiVersion", "kind"] {
            if cfg.get(f).and_then(Value::as_str).is_none_or(str::is_empty) {
                return Err(ApiError::bad_request(format!(
                    "{f} must be set in an applied configuration"
                )));
            }
        }
        normalize_type(rt, &mut cfg)?;
        set_name(&mut cfg, name)?;
        match cur {
            None if part == Part::Status => Err(ApiError::not_found(rt, name)),
            None => Ok((
                self.create_inner(res, ns, cfg.clone(), wo, Some(&cfg))?,
                true,
            )),
            Some(cur) => {
                if !wo.force {
                    let conflicts = patch::apply_conflicts(&cur.owners, &manager, &cfg, &cur.value);
                    if !conflicts.is_empty() {
                        return Err(apply_conflict(rt, name, &conflicts));
                    }
                }
                let mut merged = cur.value.clone();
                json_patch::merge(&mut merged, &cfg);
                Ok((
                    self.update_inner(res, cur, merged, part, wo, Some(&cfg))?,
                    false,
                ))
            }
        }
    }

    /// DELETE. With finalizers (or a graceful pod deletion) the object only gets
    /// `deletionTimestamp`; the returned flag says whether it is gone.
    pub fn delete(
        &mut self,
        res: ResId,
        ns: &str,
        name: &str,
        d: &DeleteOpts,
    ) -> Result<(Arc<Entry>, bool), ApiError> {
        let registry = self.registry.clone();
        let rt = registry.get(res);
        let cur = self.get_or_404(res, ns, name)?;
        let cur_uid = meta_str(&cur.value, "uid").unwrap_or_default();
        if let Some(uid) = &d.precondition_uid
            && uid != cur_uid
        {
            return Err(ApiError::conflict(
                rt,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {cur_uid}"
                ),
            ));
        }
        if let Some(rv) = &d.precondition_rv
            && *rv != cur.rv.to_string()
        {
            return Err(ApiError::conflict(
                rt,
                name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    cur.rv
                ),
            ));
        }
        let deleting = meta_str(&cur.value, "deletionTimestamp").is_some();
        let foreground = d.foreground && !deleting;
        let finalizers = has_finalizers(&cur.value) || foreground;
        let scheduled_pod = self.opts.graceful_pod_deletion
            && rt.group.is_empty()
            && rt.plural == "pods"
            && cur
                .value
                .pointer("/spec/nodeName")
                .and_then(Value::as_str)
                .is_some_and(|n| !n.is_empty());
        let grace = if scheduled_pod {
            d.grace_period_seconds
                .or_else(|| {
                    cur.value
                        .pointer("/spec/terminationGracePeriodSeconds")
                        .and_then(Value::as_i64)
                })
                .unwrap_or(30)
                .max(0)
        } else {
            0
        };
        if finalizers || grace > 0 {
            if deleting {
                return Ok((cur, false));
            }
            let mut new = cur.value.clone();
            let generation = meta(&new)
                .and_then(|m| m.get("generation"))
                .and_then(Value::as_i64)
                .unwrap_or(1);
            if let Some(m) = new.get_mut("metadata").and_then(Value::as_object_mut) {
                m.insert("deletionTimestamp".into(), json!(timestamp_in(grace)));
                m.insert("deletionGracePeriodSeconds".into(), json!(grace));
                m.insert("generation".into(), json!(generation + 1));
                if foreground {
                    let list = m.entry("finalizers").or_insert_with(|| json!([]));
                    if let Some(list) = list.as_array_mut()
                        && !list.iter().any(|f| f == FOREGROUND_FINALIZER)
                    {
                        list.push(json!(FOREGROUND_FINALIZER));
                    }
                }
            }
            if d.dry_run {
                return Ok((Entry::new(new, cur.rv, cur.owners.clone()), false));
            }
            let owners = (*cur.owners).clone();
            let key = self.key(res, ns, name);
            return Ok((self.put_entry(res, key, new, owners, Some(cur)), false));
        }
        if d.dry_run {
            return Ok((cur, true));
        }
        let last = cur.value.clone();
        let key = self.key(res, ns, name);
        Ok((self.remove_entry(res, key, cur, last), true))
    }

    /// Upsert for seeding: creates, or replaces the whole object (status included).
    pub fn put(&mut self, res: ResId, mut obj: Value) -> Result<Arc<Entry>, ApiError> {
        let rt = self.registry.get(res);
        let ns = if rt.namespaced {
            meta_str(&obj, "namespace").unwrap_or("default").to_owned()
        } else {
            String::new()
        };
        let wo = WriteOpts {
            keep_status: true,
            ..WriteOpts::default()
        };
        let name = meta_str(&obj, "name").map(str::to_owned);
        match name.and_then(|n| self.get(res, &ns, &n)) {
            Some(cur) => self.update_inner(res, cur, obj, Part::Main, &wo, None),
            None => {
                if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
                    m.remove("resourceVersion");
                }
                self.create_inner(res, &ns, obj, &wo, None)
            }
        }
    }
}

/// What the real server does to every written object of a kind before storing it: a pod's
/// defaults; a custom resource's pruning and validation against its schema.
pub(super) fn admit(
    rt: &ResourceType,
    obj: &mut Value,
    old: Option<&Value>,
) -> Result<(), ApiError> {
    if rt.group.is_empty() && rt.plural == "pods" {
        defaults::default_pod(obj);
        let causes = defaults::pod_restart_rule_causes(obj);
        if !causes.is_empty() {
            let name = obj
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            return Err(ApiError::invalid_causes(rt, name, &causes));
        }
    }
    match &rt.schema {
        Some(schema) => schema.admit(obj, old).map_err(|causes| {
            let name = obj
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            ApiError::invalid_causes(rt, name, &causes)
        }),
        None => Ok(()),
    }
}

pub(super) fn ns_mismatch() -> ApiError {
    ApiError::bad_request(
        "the namespace of the provided object does not match the namespace sent on the request",
    )
}

/// A copy of `object` without its `spec`.
pub(super) fn without_spec(object: &Value) -> Value {
    match object {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| k.as_str() != "spec")
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Sets `to[field]` to `from[field]`, or removes it when `from` has none.
pub(super) fn copy_field(from: &Value, to: &mut Value, field: &str) {
    if let Some(o) = to.as_object_mut() {
        match from.get(field) {
            Some(v) => {
                o.insert(field.into(), v.clone());
            }
            None => {
                o.remove(field);
            }
        }
    }
}

pub(super) fn apply_conflict(
    rt: &ResourceType,
    name: &str,
    conflicts: &[(String, String)],
) -> ApiError {
    let list: Vec<String> = conflicts
        .iter()
        .map(|(m, p)| format!("conflict with \"{m}\": {}", p.replace('/', ".")))
        .collect();
    let n = list.len();
    let mut e = ApiError::conflict(rt, name, "");
    e.message = format!(
        "Apply failed with {n} conflict{}: {}",
        if n == 1 { "" } else { "s" },
        list.join("; ")
    );
    e
}

pub(super) fn name_mismatch(m: &Map<String, Value>, url_name: &str) -> ApiError {
    let given = m.get("name").and_then(Value::as_str).unwrap_or_default();
    ApiError::bad_request(format!(
        "the name of the object ({given}) does not match the name on the URL ({url_name})"
    ))
}

/// Sets `metadata.name` to the name in the URL; a different non-empty name in the body is a 400.
pub(super) fn set_name(obj: &mut Value, name: &str) -> Result<(), ApiError> {
    with_meta(obj, |m| {
        if m.get("name")
            .and_then(Value::as_str)
            .is_some_and(|n| !n.is_empty() && n != name)
        {
            return Err(name_mismatch(m, name));
        }
        m.insert("name".into(), json!(name));
        Ok(())
    })
}
