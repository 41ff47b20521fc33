//! The thin HTTP layer: routing Kubernetes paths, query parameters, counters, injected faults
//! and latency, discovery, and the JSON bodies of lists and watches.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::Shared;
use super::chaos;
use super::error::ApiError;
use super::faults::Verb;
use super::patch::PatchType;
use super::resources::{Registry, ResId, ResourceType};
use super::selector::{FieldSelector, LabelSelector};
use super::store::{DeleteOpts, Filter, ListQuery, Part, WatchFrom, WriteOpts, timestamp_in};
use super::watch::{self, Session};

/// Largest request body accepted (upstream's limit is 3 MiB).
const MAX_BODY: usize = 3 * 1024 * 1024;

/// Watch duration when the client gives no `timeoutSeconds` (upstream picks 30-60 minutes).
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new().fallback(handle).with_state(shared)
}

fn json_response(code: u16, body: impl Into<Body>) -> Response {
    let mut r = Response::new(body.into());
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

fn error_response(e: &ApiError) -> Response {
    let mut r = json_response(e.code, e.status_bytes());
    if let Some(secs) = e.retry_after
        && let Ok(v) = HeaderValue::from_str(&secs.to_string())
    {
        r.headers_mut().insert(header::RETRY_AFTER, v);
    }
    r
}

fn object_response(code: u16, json: &Bytes) -> Response {
    json_response(code, json.clone())
}

/// What a path addresses.
#[derive(Debug, PartialEq, Eq)]
enum Route {
    Version,
    /// `/api`
    CoreVersions,
    /// `/apis`
    Groups,
    /// `/apis/{group}`
    Group(String),
    /// `/api/v1`, `/apis/{group}/{version}`
    Resources(String, String),
    Resource(Target),
}

#[derive(Debug, PartialEq, Eq)]
struct Target {
    res: ResId,
    namespace: Option<String>,
    name: Option<String>,
    status: bool,
}

fn not_found_path() -> ApiError {
    ApiError::new(
        404,
        "NotFound",
        "the server could not find the requested resource",
    )
}

fn parse_path(reg: &Registry, path: &str) -> Result<Route, ApiError> {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let (group, version, rest) = match segs.as_slice() {
        ["version"] => return Ok(Route::Version),
        ["api"] => return Ok(Route::CoreVersions),
        ["apis"] => return Ok(Route::Groups),
        ["apis", g] => return Ok(Route::Group((*g).to_owned())),
        ["api", v] => return Ok(Route::Resources(String::new(), (*v).to_owned())),
        ["apis", g, v] => return Ok(Route::Resources((*g).to_owned(), (*v).to_owned())),
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Err(not_found_path()),
    };
    let namespaced = match rest {
        ["namespaces", ns, plural, tail @ ..] => reg
            .by_path(group, version, plural)
            .filter(|r| reg.get(*r).namespaced)
            .map(|r| (r, Some((*ns).to_owned()), tail)),
        _ => None,
    };
    let (res, namespace, tail) = match namespaced {
        Some(x) => x,
        None => {
            let [plural, tail @ ..] = rest else {
                return Err(not_found_path());
            };
            let res = reg
                .by_path(group, version, plural)
                .ok_or_else(not_found_path)?;
            if reg.get(res).namespaced && !tail.is_empty() {
                return Err(not_found_path());
            }
            (res, None, tail)
        }
    };
    let (name, status) = match tail {
        [] => (None, false),
        [name] => (Some((*name).to_owned()), false),
        [name, "status"] if reg.get(res).status_subresource => (Some((*name).to_owned()), true),
        _ => return Err(not_found_path()),
    };
    Ok(Route::Resource(Target {
        res,
        namespace,
        name,
        status,
    }))
}

/// The query parameters the server reads.
#[derive(Debug, Default)]
struct Params {
    watch: bool,
    resource_version: Option<String>,
    resource_version_match: Option<String>,
    label_selector: Option<String>,
    field_selector: Option<String>,
    limit: Option<usize>,
    continue_token: Option<String>,
    timeout_seconds: Option<u64>,
    allow_bookmarks: bool,
    send_initial_events: bool,
    /// `sendInitialEvents` was given at all (true or false): upstream's validation asks only
    /// whether it is set.
    send_initial_events_set: bool,
    field_manager: Option<String>,
    force: bool,
    dry_run: bool,
    grace_period_seconds: Option<i64>,
    propagation_policy: Option<String>,
}

fn parse_bool(key: &str, v: &str) -> Result<bool, ApiError> {
    match v {
        "" | "1" | "true" | "True" | "TRUE" | "t" | "T" => Ok(true),
        "0" | "false" | "False" | "FALSE" | "f" | "F" => Ok(false),
        _ => Err(ApiError::bad_request(format!(
            "invalid value {v:?} for {key}: expected a boolean"
        ))),
    }
}

fn parse_num<T: std::str::FromStr>(key: &str, v: &str) -> Result<T, ApiError> {
    v.parse()
        .map_err(|_| ApiError::bad_request(format!("invalid value {v:?} for {key}")))
}

impl Params {
    fn parse(uri: &axum::http::Uri) -> Result<Self, ApiError> {
        let Query(pairs) = Query::<Vec<(String, String)>>::try_from_uri(uri)
            .map_err(|e| ApiError::bad_request(format!("invalid query: {e}")))?;
        let mut p = Params::default();
        for (k, v) in pairs {
            match k.as_str() {
                "watch" => p.watch = parse_bool(&k, &v)?,
                "resourceVersion" => p.resource_version = Some(v).filter(|s| !s.is_empty()),
                "resourceVersionMatch" => {
                    p.resource_version_match = Some(v).filter(|s| !s.is_empty())
                }
                "labelSelector" => p.label_selector = Some(v),
                "fieldSelector" => p.field_selector = Some(v),
                "limit" => p.limit = Some(parse_num(&k, &v)?),
                "continue" => p.continue_token = Some(v).filter(|s| !s.is_empty()),
                "timeoutSeconds" => p.timeout_seconds = Some(parse_num(&k, &v)?),
                "allowWatchBookmarks" => p.allow_bookmarks = parse_bool(&k, &v)?,
                "sendInitialEvents" => {
                    p.send_initial_events = parse_bool(&k, &v)?;
                    p.send_initial_events_set = true;
                }
                "fieldManager" => p.field_manager = Some(v).filter(|s| !s.is_empty()),
                "force" => p.force = parse_bool(&k, &v)?,
                "dryRun" => p.dry_run = v == "All",
                "gracePeriodSeconds" => p.grace_period_seconds = Some(parse_num(&k, &v)?),
                "propagationPolicy" => p.propagation_policy = Some(v.to_string()),
                _ => {}
            }
        }
        Ok(p)
    }

    fn filter(&self, reg: &Registry, res: ResId, ns: Option<&str>) -> Result<Filter, ApiError> {
        let labels = match &self.label_selector {
            Some(s) => LabelSelector::parse(s)
                .map_err(|e| ApiError::bad_request(format!("unable to parse requirement: {e}")))?,
            None => LabelSelector::default(),
        };
        let fields = match &self.field_selector {
            Some(s) => FieldSelector::parse(s, reg.get(res)).map_err(ApiError::bad_request)?,
            None => FieldSelector::default(),
        };
        Ok(Filter {
            namespace: ns.map(str::to_owned),
            labels,
            fields,
        })
    }

    fn rv_number(&self) -> Result<Option<u64>, ApiError> {
        match self.resource_version.as_deref() {
            None | Some("0") => Ok(None),
            Some(v) => v.parse().map(Some).map_err(|_| {
                ApiError::bad_request(format!("invalid resourceVersion {v:?}: not a number"))
            }),
        }
    }

    fn write_opts(&self) -> WriteOpts {
        WriteOpts {
            dry_run: self.dry_run,
            field_manager: self.field_manager.clone(),
            force: self.force,
            keep_status: false,
        }
    }
}

async fn handle(State(sh): State<Arc<Shared>>, req: Request) -> Response {
    if sh.shutting_down() {
        return error_response(&ApiError::from_code(503));
    }
    let (parts, body) = req.into_parts();
    let route = match parse_path(&sh.registry, parts.uri.path()) {
        Ok(r) => r,
        Err(e) => return error_response(&e),
    };
    let t = match route {
        Route::Resource(t) => t,
        other => {
            return if parts.method == Method::GET {
                discovery(&sh.registry, &other, &parts.headers)
            } else {
                error_response(&ApiError::new(
                    405,
                    "MethodNotAllowed",
                    "method not allowed",
                ))
            };
        }
    };
    match resource(&sh, &parts, body, t).await {
        Ok(r) => r,
        Err(e) => error_response(&e),
    }
}

fn verb_of(method: &Method, t: &Target, watch: bool) -> Result<Verb, ApiError> {
    let collection = t.name.is_none();
    Ok(match (method.as_str(), collection) {
        ("GET", true) if watch => Verb::Watch,
        ("GET", true) => Verb::List,
        ("GET", false) => Verb::Get,
        ("POST", true) => Verb::Create,
        ("PUT", false) => Verb::Update,
        ("PATCH", false) => Verb::Patch,
        ("DELETE", false) if !t.status => Verb::Delete,
        ("DELETE", true) => Verb::DeleteCollection,
        _ => {
            return Err(ApiError::new(
                405,
                "MethodNotAllowed",
                format!(
                    "the server does not allow this method on the requested resource ({method})"
                ),
            ));
        }
    })
}

async fn resource(
    sh: &Arc<Shared>,
    parts: &axum::http::request::Parts,
    body: Body,
    t: Target,
) -> Result<Response, ApiError> {
    let params = Params::parse(&parts.uri)?;
    let verb = verb_of(&parts.method, &t, params.watch)?;
    let rt = sh.registry.get(t.res).clone();
    if rt.namespaced
        && t.namespace.is_none()
        && matches!(verb, Verb::Create | Verb::DeleteCollection)
    {
        return Err(ApiError::new(
            405,
            "MethodNotAllowed",
            format!(
                "{} can only be created or deleted within a namespace",
                rt.plural
            ),
        ));
    }
    let counted = if t.status {
        format!("{}/status", sh.registry.name(t.res))
    } else {
        sh.registry.name(t.res).to_owned()
    };
    sh.count(verb, &counted);
    let delay = sh.faults().latency(verb, &counted);
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    if let Some(e) = sh.faults().take(verb, &counted) {
        return Err(e);
    }
    let client = parts
        .headers
        .get(super::CLIENT_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let silent = sh.faults().take_silent(verb, &counted)
        || sh
            .faults()
            .client_silenced(client.as_deref(), verb, &counted);
    if silent {
        if verb == Verb::Watch {
            // The watch is accepted, then nothing ever comes: no event, no bookmark, no end.
            let never = futures::stream::pending::<Result<axum::body::Bytes, std::io::Error>>();
            return Ok(json_response(200, Body::from_stream(never)));
        }
        // Accepted and never answered: the client's own timeout is all that ends it.
        std::future::pending::<()>().await;
    }
    let plan = chaos_plan(sh, parts, verb, &counted, &t, &params);
    if !plan.delay.is_zero() {
        tokio::time::sleep(plan.delay).await;
    }
    if let Some(e) = plan.error {
        return Err(e);
    }
    let result = handle_verb(sh, parts, body, &t, &params, verb, plan.watch_cut).await;
    if plan.lose_response
        && result.is_ok()
        && let Some(chaos) = sh.chaos().as_mut()
    {
        chaos.lost_response();
        return Err(ApiError::new(
            500,
            "InternalError",
            "an error on the server (injected) has prevented the response from being sent; \
             the request was applied",
        ));
    }
    if result.is_ok()
        && matches!(
            verb,
            Verb::Create | Verb::Update | Verb::Patch | Verb::Delete | Verb::DeleteCollection
        )
    {
        sh.record_write(super::WriteRecord {
            client,
            verb,
            resource: counted,
            namespace: t.namespace.clone(),
            name: t.name.clone(),
            at: std::time::Instant::now(),
        });
    }
    result
}

/// Chaos mode's plan for this request: nothing when chaos is off or the client is exempt.
fn chaos_plan(
    sh: &Shared,
    parts: &axum::http::request::Parts,
    verb: Verb,
    counted: &str,
    t: &Target,
    params: &Params,
) -> chaos::Plan {
    let mut guard = sh.chaos();
    let Some(chaos) = guard.as_mut() else {
        return chaos::Plan::default();
    };
    if parts.headers.contains_key(chaos::EXEMPT_HEADER) {
        chaos.exempt();
        return chaos::Plan::default();
    }
    let opt = |s: &Option<String>| s.clone().unwrap_or_default();
    let (ns, name) = (opt(&t.namespace), opt(&t.name));
    let (labels, fields) = (opt(&params.label_selector), opt(&params.field_selector));
    chaos.plan(verb, &[counted, &ns, &name, &labels, &fields])
}

async fn handle_verb(
    sh: &Arc<Shared>,
    parts: &axum::http::request::Parts,
    body: Body,
    t: &Target,
    params: &Params,
    verb: Verb,
    watch_cut: Option<Duration>,
) -> Result<Response, ApiError> {
    let rt = sh.registry.get(t.res).clone();
    let body = axum::body::to_bytes(body, MAX_BODY)
        .await
        .map_err(|_| ApiError::new(413, "RequestEntityTooLarge", "the request is too large"))?;
    let ns = t.namespace.as_deref().unwrap_or_default();
    let name = t.name.as_deref().unwrap_or_default();
    let part = if t.status { Part::Status } else { Part::Main };
    match verb {
        Verb::Get => {
            let e = sh.store().get_or_404(t.res, ns, name)?;
            Ok(object_response(200, &e.json))
        }
        Verb::List => list(sh, t, params),
        Verb::Watch => watch(sh, t, params, watch_cut),
        Verb::Create => {
            let obj = parse_body(&body)?;
            let e = sh.store().create(t.res, ns, obj, &params.write_opts())?;
            Ok(object_response(201, &e.json))
        }
        Verb::Update => {
            let obj = parse_body(&body)?;
            let (e, created) =
                sh.store()
                    .update(t.res, ns, name, obj, part, &params.write_opts())?;
            Ok(object_response(if created { 201 } else { 200 }, &e.json))
        }
        Verb::Patch => {
            let ct = parts
                .headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            let ty = PatchType::from_content_type(ct).ok_or_else(|| {
                ApiError::new(
                    415,
                    "UnsupportedMediaType",
                    format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml; got {ct:?}"),
                )
            })?;
            let (e, created) =
                sh.store()
                    .patch(t.res, ns, name, ty, &body, part, &params.write_opts())?;
            Ok(object_response(if created { 201 } else { 200 }, &e.json))
        }
        Verb::Delete => {
            let d = delete_opts(params, &body)?;
            let (e, gone) = sh.store().delete(t.res, ns, name, &d)?;
            Ok(match deleted_answer(&rt, &e.value, gone) {
                Some(answer) => json_response(200, answer),
                None => object_response(200, &e.json),
            })
        }
        Verb::DeleteCollection => {
            let d = delete_opts(params, &body)?;
            let filter = params.filter(&sh.registry, t.res, t.namespace.as_deref())?;
            let mut store = sh.store();
            let page = store.list(
                t.res,
                &ListQuery {
                    filter,
                    ..ListQuery::default()
                },
            )?;
            let mut deleted = Vec::with_capacity(page.items.len());
            for item in &page.items {
                let meta = item.value.get("metadata");
                let text = |f: &str| {
                    meta.and_then(|m| m.get(f))
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                };
                match store.delete(t.res, text("namespace"), text("name"), &d) {
                    Ok((e, _)) => deleted.push(e),
                    Err(e) if e.code == 404 => {}
                    Err(e) => return Err(e),
                }
            }
            let rv = store.rv();
            drop(store);
            Ok(json_response(
                200,
                list_body(&rt.api_version(), &rt.list_kind(), rv, None, &deleted),
            ))
        }
    }
}

/// What the real server answers a DELETE with, when not the object as stored (200 either way):
/// for an object gone at once, a `Status` of `Success` for most kinds, and for a pod the object
/// with `deletionTimestamp` and a grace period of 0.
fn deleted_answer(rt: &ResourceType, last: &Value, gone: bool) -> Option<Bytes> {
    if !gone {
        return None;
    }
    if rt.delete_returns_object {
        if !(rt.group.is_empty() && rt.plural == "pods") {
            return None;
        }
        let mut pod = last.clone();
        if let Some(m) = pod.get_mut("metadata").and_then(Value::as_object_mut)
            && !m.contains_key("deletionTimestamp")
        {
            m.insert("deletionTimestamp".into(), json!(timestamp_in(0)));
            m.insert("deletionGracePeriodSeconds".into(), json!(0));
        }
        return serde_json::to_vec(&pod).ok().map(Bytes::from);
    }
    let text = |f: &str| last.pointer(f).and_then(Value::as_str).unwrap_or_default();
    let mut details = serde_json::Map::new();
    details.insert("name".into(), json!(text("/metadata/name")));
    if !rt.group.is_empty() {
        details.insert("group".into(), json!(rt.group));
    }
    details.insert("kind".into(), json!(rt.plural));
    details.insert("uid".into(), json!(text("/metadata/uid")));
    let status = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
        "details": details,
    });
    serde_json::to_vec(&status).ok().map(Bytes::from)
}

fn parse_body(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))
}

fn delete_opts(params: &Params, body: &[u8]) -> Result<DeleteOpts, ApiError> {
    let mut d = DeleteOpts {
        dry_run: params.dry_run,
        grace_period_seconds: params.grace_period_seconds,
        foreground: params.propagation_policy.as_deref() == Some("Foreground"),
        ..DeleteOpts::default()
    };
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(d);
    }
    let v = parse_body(body)?;
    if let Some(g) = v.get("gracePeriodSeconds").and_then(Value::as_i64) {
        d.grace_period_seconds = Some(g);
    }
    if let Some(p) = v.get("propagationPolicy").and_then(Value::as_str) {
        d.foreground = p == "Foreground";
    }
    if let Some(p) = v.get("preconditions") {
        d.precondition_uid = p.get("uid").and_then(Value::as_str).map(str::to_owned);
        d.precondition_rv = p
            .get("resourceVersion")
            .and_then(Value::as_str)
            .map(str::to_owned);
    }
    if let Some(dr) = v.get("dryRun").and_then(Value::as_array) {
        d.dry_run |= dr.iter().any(|x| x == "All");
    }
    Ok(d)
}

/// A list body, splicing the stored bytes of the items.
fn list_body(
    api_version: &str,
    list_kind: &str,
    rv: u64,
    continue_token: Option<&str>,
    items: &[Arc<super::store::Entry>],
) -> Vec<u8> {
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if let (Some(c), Some(m)) = (continue_token, metadata.as_object_mut()) {
        m.insert("continue".into(), json!(c));
    }
    let head = json!({"apiVersion": api_version, "kind": list_kind, "metadata": metadata});
    let head = serde_json::to_vec(&head).unwrap_or_default();
    let size: usize = items.iter().map(|e| e.json.len() + 1).sum();
    let mut out = Vec::with_capacity(head.len() + size + 16);
    // `{...}` becomes `{...,"items":[...]}`.
    out.extend_from_slice(&head[..head.len().saturating_sub(1)]);
    out.extend_from_slice(b",\"items\":[");
    for (i, e) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(&e.json);
    }
    out.extend_from_slice(b"]}");
    out
}

fn list(sh: &Arc<Shared>, t: &Target, params: &Params) -> Result<Response, ApiError> {
    let filter = params.filter(&sh.registry, t.res, t.namespace.as_deref())?;
    let exact = params.resource_version_match.as_deref() == Some("Exact");
    let rv = params.rv_number()?;
    if exact && rv.is_none() {
        return Err(ApiError::bad_request(
            "resourceVersionMatch=Exact requires a non-zero resourceVersion",
        ));
    }
    let q = ListQuery {
        filter,
        limit: params.limit,
        continue_token: params.continue_token.clone(),
        exact_rv: if exact { rv } else { None },
    };
    let page = sh.store().list(t.res, &q)?;
    let rt = sh.registry.get(t.res);
    Ok(json_response(
        200,
        list_body(
            &rt.api_version(),
            &rt.list_kind(),
            page.rv,
            page.continue_token.as_deref(),
            &page.items,
        ),
    ))
}

/// kube-apiserver's validation of a watch's options (k8s.io/apimachinery
/// `pkg/apis/meta/internalversion/validation/validation.go`, `validateWatchOptions`), with its
/// messages: `sendInitialEvents` needs `resourceVersionMatch=NotOlderThan` and the `WatchList`
/// feature gate; `resourceVersionMatch` on a watch needs `sendInitialEvents`.
fn validate_watch_options(params: &Params, watch_list: bool) -> Result<(), ApiError> {
    let mut errors = Vec::new();
    let not_older_than = params.resource_version_match.as_deref() == Some("NotOlderThan");
    if params.send_initial_events_set {
        if !not_older_than {
            errors.push(
                "resourceVersionMatch: Forbidden: sendInitialEvents requires setting \
                 resourceVersionMatch to NotOlderThan",
            );
        }
        if !watch_list {
            errors.push(
                "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless \
                 the WatchList feature gate is enabled",
            );
        }
    }
    if params.resource_version_match.is_some() {
        if !params.send_initial_events_set {
            errors.push(
                "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch \
                 unless sendInitialEvents is provided",
            );
        }
        if !not_older_than {
            errors.push(
                "resourceVersionMatch: Unsupported value: supported values: \"NotOlderThan\"",
            );
        }
    }
    if errors.is_empty() {
        return Ok(());
    }
    Err(ApiError::new(
        422,
        "Invalid",
        format!(
            "ListOptions.meta.k8s.io \"\" is invalid: [{}]",
            errors.join(", ")
        ),
    ))
}

fn watch(
    sh: &Arc<Shared>,
    t: &Target,
    params: &Params,
    cut: Option<Duration>,
) -> Result<Response, ApiError> {
    let filter = params.filter(&sh.registry, t.res, t.namespace.as_deref())?;
    validate_watch_options(params, sh.watch_list())?;
    if params.send_initial_events && !params.allow_bookmarks {
        return Err(ApiError::new(
            422,
            "Invalid",
            "sendInitialEvents requires allowWatchBookmarks=true",
        ));
    }
    // A streaming list is served once the cache has caught up with the current revision (a
    // consistent read); a watch from no resourceVersion, from the cache as it is.
    let from = if params.send_initial_events {
        WatchFrom::Current
    } else {
        match (params.rv_number()?, sh.watch_cache_lag()) {
            (None, None) => WatchFrom::Current,
            (None, Some(at)) => WatchFrom::CacheAt(at),
            (Some(rv), _) => WatchFrom::After(rv),
        }
    };
    let rt = sh.registry.get(t.res);
    let started = sh.store().watch(t.res, filter, from);
    let start = match started {
        Ok(s) => s,
        // As upstream: a too-old resourceVersion is a 200 whose only event is an ERROR.
        Err(e) if e.code == 410 => return Ok(json_response(200, watch::error_line(&e))),
        Err(e) => return Err(e),
    };
    let timeout = match params.timeout_seconds {
        None | Some(0) => DEFAULT_WATCH_TIMEOUT,
        Some(s) => Duration::from_secs(s),
    };
    let period = sh.bookmark_period();
    let session = Session {
        shared: sh.clone(),
        res: t.res,
        id: start.id,
        initial: VecDeque::from(start.initial),
        rx: start.rx,
        initial_end: params.send_initial_events.then_some(start.rv),
        deadline: Instant::now() + timeout,
        cut_at: cut.map(|c| Instant::now() + c),
        bookmarks: params
            .allow_bookmarks
            .then(|| watch::bookmark_interval(period)),
        api_version: rt.api_version(),
        kind: rt.kind.to_string(),
        finished: false,
        bookmark_sent: std::cell::Cell::new(false),
    };
    Ok(json_response(200, session.into_body()))
}

// ---------------------------------------------------------------------------------------------
// Discovery
// ---------------------------------------------------------------------------------------------

fn wants_aggregated(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("as=APIGroupDiscoveryList"))
}

const VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

fn resource_list(reg: &Registry, group: &str, version: &str) -> Option<Value> {
    let mut resources = Vec::new();
    for t in reg
        .types()
        .iter()
        .filter(|t| t.group == group && t.version == version)
    {
        resources.push(json!({
            "name": t.plural, "singularName": t.singular, "namespaced": t.namespaced,
            "kind": t.kind, "verbs": VERBS,
        }));
        if t.status_subresource {
            resources.push(json!({
                "name": format!("{}/status", t.plural), "singularName": "", "namespaced": t.namespaced,
                "kind": t.kind, "verbs": ["get", "patch", "update"],
            }));
        }
    }
    if resources.is_empty() {
        return None;
    }
    let gv = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    )
}

fn api_group(group: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    json!({"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": vs,
           "preferredVersion": vs.first().cloned().unwrap_or(Value::Null)})
}

fn aggregated(reg: &Registry, core: bool) -> Value {
    let items: Vec<Value> = reg
        .group_versions()
        .into_iter()
        .filter(|(g, _)| g.is_empty() == core)
        .map(|(group, versions)| {
            let versions: Vec<Value> = versions
                .iter()
                .map(|v| {
                    let resources: Vec<Value> = reg
                        .types()
                        .iter()
                        .filter(|t| t.group == group && t.version == *v)
                        .map(|t| {
                            let kind =
                                json!({"group": t.group, "version": t.version, "kind": t.kind});
                            let subresources: Vec<Value> = if t.status_subresource {
                                vec![json!({"subresource": "status", "responseKind": kind,
                                            "verbs": ["get", "patch", "update"]})]
                            } else {
                                Vec::new()
                            };
                            json!({
                                "resource": t.plural, "responseKind": kind,
                                "scope": if t.namespaced { "Namespaced" } else { "Cluster" },
                                "singularResource": t.singular, "verbs": VERBS,
                                "subresources": subresources,
                            })
                        })
                        .collect();
                    json!({"version": v, "resources": resources, "freshness": "Current"})
                })
                .collect();
            json!({"metadata": {"name": group, "creationTimestamp": null}, "versions": versions})
        })
        .collect();
    json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2",
           "metadata": {}, "items": items})
}

fn discovery(reg: &Registry, route: &Route, headers: &HeaderMap) -> Response {
    let body = match route {
        Route::Version => Some(json!({
            "major": "1", "minor": "35", "gitVersion": "v1.35.0-jobset-inplace-test",
            "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
            "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.25", "compiler": "gc",
            "platform": "linux/amd64",
        })),
        Route::CoreVersions if wants_aggregated(headers) => Some(aggregated(reg, true)),
        Route::Groups if wants_aggregated(headers) => Some(aggregated(reg, false)),
        Route::CoreVersions => Some(json!({
            "kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}],
        })),
        Route::Groups => {
            let groups: Vec<Value> = reg
                .group_versions()
                .into_iter()
                .filter(|(g, _)| !g.is_empty())
                .map(|(g, vs)| {
                    let mut v = api_group(&g, &vs);
                    if let Some(o) = v.as_object_mut() {
                        o.remove("kind");
                        o.remove("apiVersion");
                    }
                    v
                })
                .collect();
            Some(json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}))
        }
        Route::Group(g) => reg
            .group_versions()
            .into_iter()
            .find(|(x, _)| x == g)
            .map(|(g, vs)| api_group(&g, &vs)),
        Route::Resources(g, v) => resource_list(reg, g, v),
        Route::Resource(_) => None,
    };
    match body {
        Some(b) => json_response(200, serde_json::to_vec(&b).unwrap_or_default()),
        None => error_response(&not_found_path()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::resources::default_resources;

    #[test]
    fn paths() {
        let reg = Registry::new(default_resources());
        let pods = reg.resolve("pods").expect("pods");
        let nss = reg.resolve("namespaces").expect("namespaces");
        let js = reg.resolve("jobsets").expect("jobsets");
        let t = |res, ns: Option<&str>, name: Option<&str>, status| {
            Route::Resource(Target {
                res,
                namespace: ns.map(str::to_owned),
                name: name.map(str::to_owned),
                status,
            })
        };
        let p = |s: &str| parse_path(&reg, s);
        assert_eq!(p("/api/v1/pods"), Ok(t(pods, None, None, false)));
        assert_eq!(
            p("/api/v1/namespaces/a/pods"),
            Ok(t(pods, Some("a"), None, false))
        );
        assert_eq!(
            p("/api/v1/namespaces/a/pods/b"),
            Ok(t(pods, Some("a"), Some("b"), false))
        );
        assert_eq!(
            p("/api/v1/namespaces/a/pods/b/status"),
            Ok(t(pods, Some("a"), Some("b"), true))
        );
        assert_eq!(p("/api/v1/namespaces"), Ok(t(nss, None, None, false)));
        assert_eq!(
            p("/api/v1/namespaces/a"),
            Ok(t(nss, None, Some("a"), false))
        );
        assert_eq!(
            p("/api/v1/namespaces/a/status"),
            Ok(t(nss, None, Some("a"), true))
        );
        assert_eq!(
            p("/apis/jobset.x-k8s.io/v1alpha2/namespaces/x/jobsets/y/status"),
            Ok(t(js, Some("x"), Some("y"), true))
        );
        assert_eq!(
            p("/apis/jobset.x-k8s.io/v1alpha2/jobsets"),
            Ok(t(js, None, None, false))
        );
        assert_eq!(
            p("/api/v1"),
            Ok(Route::Resources(String::new(), "v1".into()))
        );
        assert_eq!(p("/apis"), Ok(Route::Groups));
        for bad in [
            "/",
            "/api/v1/pods/x",
            "/api/v1/configmaps",
            "/api/v1/namespaces/a/pods/b/log",
            "/api/v1/namespaces/a/serviceaccounts/b/status",
            "/apis/jobset.x-k8s.io/v1/jobsets",
        ] {
            assert_eq!(p(bad).map_err(|e| e.code), Err(404), "{bad}");
        }
    }

    #[test]
    fn params() {
        let uri: axum::http::Uri =
            "/api/v1/pods?watch=1&resourceVersion=10&labelSelector=a%20in%20(b%2Cc)&limit=5&allowWatchBookmarks=true&timeoutSeconds=3"
                .parse()
                .expect("uri");
        let p = Params::parse(&uri).expect("parses");
        assert!(p.watch && p.allow_bookmarks);
        assert_eq!(p.resource_version.as_deref(), Some("10"));
        assert_eq!(p.label_selector.as_deref(), Some("a in (b,c)"));
        assert_eq!((p.limit, p.timeout_seconds), (Some(5), Some(3)));
        for bad in ["/x?limit=a", "/x?watch=maybe", "/x?timeoutSeconds=-1"] {
            let uri: axum::http::Uri = bad.parse().expect("uri");
            assert_eq!(
                Params::parse(&uri).map(|_| ()).map_err(|e| e.code),
                Err(400),
                "{bad}"
            );
        }
    }

    #[test]
    fn list_bodies_are_valid_json() {
        let body = list_body("v1", "PodList", 7, Some("tok"), &[]);
        let v: Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(
            v["metadata"],
            json!({"resourceVersion": "7", "continue": "tok"})
        );
        assert_eq!(v["items"], json!([]));
    }
}
