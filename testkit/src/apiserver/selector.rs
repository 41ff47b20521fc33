//! Label and field selectors, parsed as the Kubernetes API server parses them.

use std::collections::BTreeSet;

use serde_json::Value;

use super::resources::ResourceType;

/// One requirement of a label selector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LabelRequirement {
    /// `key`
    Exists(String),
    /// `!key`
    NotExists(String),
    /// `key=value`, `key==value`
    Eq(String, String),
    /// `key!=value` (also matches objects without the key)
    NotEq(String, String),
    /// `key in (a,b)`
    In(String, BTreeSet<String>),
    /// `key notin (a,b)` (also matches objects without the key)
    NotIn(String, BTreeSet<String>),
    /// `key>N`
    Gt(String, i64),
    /// `key<N`
    Lt(String, i64),
}

/// A parsed label selector: all requirements must hold; empty selects everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector(pub Vec<LabelRequirement>);

fn is_key_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/')
}

fn is_value_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

fn validate_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && !name.contains('/')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-')
    });
    if name_ok && prefix_ok {
        Ok(())
    } else {
        Err(format!("invalid label key {key:?}"))
    }
}

fn validate_value(value: &str) -> Result<(), String> {
    let ok = value.is_empty()
        || (value.len() <= 63
            && value.starts_with(|c: char| c.is_ascii_alphanumeric())
            && value.ends_with(|c: char| c.is_ascii_alphanumeric()));
    if ok {
        Ok(())
    } else {
        Err(format!("invalid label value {value:?}"))
    }
}

struct Lexer<'a> {
    s: &'a str,
    pos: usize,
}

impl<'a> Lexer<'a> {
    fn skip_ws(&mut self) {
        while self.peek().is_some_and(char::is_whitespace) {
            self.pos += 1;
        }
    }
    fn peek(&self) -> Option<char> {
        self.s[self.pos..].chars().next()
    }
    fn rest(&self) -> &'a str {
        &self.s[self.pos..]
    }
    fn eat(&mut self, token: &str) -> bool {
        if self.rest().starts_with(token) {
            self.pos += token.len();
            true
        } else {
            false
        }
    }
    fn take_while(&mut self, f: impl Fn(char) -> bool) -> &'a str {
        let start = self.pos;
        while self.peek().is_some_and(&f) {
            self.pos += self.peek().map_or(0, char::len_utf8);
        }
        &self.s[start..self.pos]
    }
    fn at_end_of_requirement(&mut self) -> bool {
        self.skip_ws();
        matches!(self.peek(), None | Some(','))
    }
}

impl LabelSelector {
    /// Parses `a=b,c!=d,e in (f,g),h notin (i),j,!k,l>3`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut lx = Lexer { s, pos: 0 };
        let mut reqs = Vec::new();
        lx.skip_ws();
        if lx.peek().is_none() {
            return Ok(LabelSelector(reqs));
        }
        loop {
            reqs.push(Self::requirement(&mut lx)?);
            lx.skip_ws();
            match lx.peek() {
                None => break,
                Some(',') => {
                    lx.pos += 1;
                }
                Some(c) => return Err(format!("unexpected {c:?} in label selector {s:?}")),
            }
        }
        Ok(LabelSelector(reqs))
    }

    fn requirement(lx: &mut Lexer<'_>) -> Result<LabelRequirement, String> {
        lx.skip_ws();
        if lx.eat("!") {
            lx.skip_ws();
            let key = lx.take_while(is_key_char).to_owned();
            validate_key(&key)?;
            if !lx.at_end_of_requirement() {
                return Err(format!("unexpected operator after !{key}"));
            }
            return Ok(LabelRequirement::NotExists(key));
        }
        let key = lx.take_while(is_key_char).to_owned();
        validate_key(&key)?;
        if lx.at_end_of_requirement() {
            return Ok(LabelRequirement::Exists(key));
        }
        let value = |lx: &mut Lexer<'_>| -> Result<String, String> {
            lx.skip_ws();
            let v = lx.take_while(is_value_char).to_owned();
            validate_value(&v)?;
            Ok(v)
        };
        if lx.eat("==") || lx.eat("=") {
            return Ok(LabelRequirement::Eq(key, value(lx)?));
        }
        if lx.eat("!=") {
            return Ok(LabelRequirement::NotEq(key, value(lx)?));
        }
        if lx.eat(">") || lx.eat("<") {
            let gt = lx.s[..lx.pos].ends_with('>');
            lx.skip_ws();
            let n = lx.take_while(|c| c.is_ascii_digit() || c == '-');
            let n: i64 = n
                .parse()
                .map_err(|_| format!("invalid integer {n:?} for {key}"))?;
            return Ok(if gt {
                LabelRequirement::Gt(key, n)
            } else {
                LabelRequirement::Lt(key, n)
            });
        }
        let word = lx.take_while(|c| c.is_ascii_alphabetic());
        let notin = match word {
            "in" => false,
            "notin" => true,
            other => return Err(format!("unknown operator {other:?} for key {key}")),
        };
        lx.skip_ws();
        if !lx.eat("(") {
            return Err(format!("expected '(' after {word}"));
        }
        let mut set = BTreeSet::new();
        loop {
            set.insert(value(lx)?);
            lx.skip_ws();
            if lx.eat(",") {
                continue;
            }
            if lx.eat(")") {
                break;
            }
            return Err(format!("expected ',' or ')' in the values of {key}"));
        }
        Ok(if notin {
            LabelRequirement::NotIn(key, set)
        } else {
            LabelRequirement::In(key, set)
        })
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether an object (its `metadata.labels`) satisfies every requirement.
    pub fn matches(&self, object: &Value) -> bool {
        if self.0.is_empty() {
            return true;
        }
        let labels = object.get("metadata").and_then(|m| m.get("labels"));
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            LabelRequirement::Exists(k) => get(k).is_some(),
            LabelRequirement::NotExists(k) => get(k).is_none(),
            LabelRequirement::Eq(k, v) => get(k) == Some(v.as_str()),
            LabelRequirement::NotEq(k, v) => get(k) != Some(v.as_str()),
            LabelRequirement::In(k, set) => get(k).is_some_and(|x| set.contains(x)),
            LabelRequirement::NotIn(k, set) => get(k).is_none_or(|x| !set.contains(x)),
            LabelRequirement::Gt(k, n) => get(k)
                .and_then(|x| x.parse::<i64>().ok())
                .is_some_and(|x| x > *n),
            LabelRequirement::Lt(k, n) => get(k)
                .and_then(|x| x.parse::<i64>().ok())
                .is_some_and(|x| x < *n),
        })
    }
}

/// One requirement of a field selector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldRequirement {
    /// Dotted path, e.g. `metadata.name`.
    pub field: String,
    pub negated: bool,
    pub value: String,
}

/// A parsed field selector (`metadata.name=x,status.phase!=Running`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSelector(pub Vec<FieldRequirement>);

/// Splits on unescaped `sep`, keeping escapes.
fn split_unescaped(s: &str, sep: char) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == sep {
            out.push(&s[start..i]);
            start = i + c.len_utf8();
        }
    }
    out.push(&s[start..]);
    out
}

fn unescape(s: &str) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some(e @ ('\\' | ',' | '=' | '!')) => out.push(e),
                other => return Err(format!("invalid escape sequence \\{other:?} in {s:?}")),
            }
        } else {
            out.push(c);
        }
    }
    Ok(out)
}

impl FieldSelector {
    /// Parses a field selector and checks every field is supported by `rt` (else an error, which
    /// the server answers with 400 as upstream does).
    pub fn parse(s: &str, rt: &ResourceType) -> Result<Self, String> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(FieldSelector(reqs));
        }
        for part in split_unescaped(s, ',') {
            let (field, negated, value) = if let Some(i) = find_op(part, "!=") {
                (&part[..i], true, &part[i + 2..])
            } else if let Some(i) = find_op(part, "==") {
                (&part[..i], false, &part[i + 2..])
            } else if let Some(i) = find_op(part, "=") {
                (&part[..i], false, &part[i + 1..])
            } else {
                return Err(format!("invalid selector: {part:?}; can't understand it"));
            };
            let field = field.trim();
            if !rt.supports_field(field) {
                return Err(format!(
                    "field label not supported: {field:?} (for {})",
                    rt.qualified()
                ));
            }
            reqs.push(FieldRequirement {
                field: field.to_owned(),
                negated,
                value: unescape(value.trim())?,
            });
        }
        Ok(FieldSelector(reqs))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The name a `metadata.name=` requirement pins, if any.
    pub fn name(&self) -> Option<&str> {
        self.0
            .iter()
            .find(|r| r.field == "metadata.name" && !r.negated)
            .map(|r| r.value.as_str())
    }

    /// Whether an object satisfies every requirement; a missing field reads as `""`.
    pub fn matches(&self, object: &Value) -> bool {
        self.0.iter().all(|r| {
            let mut v = Some(object);
            for seg in r.field.split('.') {
                v = v.and_then(|x| x.get(seg));
            }
            let actual = match v {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
            };
            (actual == r.value) != r.negated
        })
    }
}

/// Position of an unescaped operator token.
fn find_op(s: &str, op: &str) -> Option<usize> {
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' {
            i += 2;
            continue;
        }
        if s[i..].starts_with(op) {
            return Some(i);
        }
        i += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::resources::default_resources;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "n", "namespace": "ns", "labels": labels},
               "spec": {"nodeName": "node-1"}, "status": {"phase": "Running"}})
    }

    fn sel(s: &str) -> LabelSelector {
        LabelSelector::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn label_selector_forms() {
        let o = obj(json!({"app": "web", "tier": "front", "n": "5", "example.com/x": "y"}));
        let none = obj(json!(null));
        let cases: &[(&str, bool, bool)] = &[
            ("", true, true),
            ("app=web", true, false),
            ("app==web", true, false),
            ("app = web", true, false),
            ("app!=web", false, true),
            ("app!=db", true, true),
            ("app in (web,db)", true, false),
            ("app in ( db , cache )", false, false),
            ("app notin (db)", true, true),
            ("app notin (web)", false, true),
            ("app", true, false),
            ("!app", false, true),
            ("app,tier=front", true, false),
            ("app=web,tier=back", false, false),
            ("example.com/x=y", true, false),
            ("n>4", true, false),
            ("n<5", false, false),
            (
                "app=web,tier in (front,back),!missing,n notin (1)",
                true,
                false,
            ),
            ("app=", false, false),
        ];
        for (s, on_o, on_none) in cases {
            let ls = sel(s);
            assert_eq!(ls.matches(&o), *on_o, "{s} on labelled");
            assert_eq!(ls.matches(&none), *on_none, "{s} on unlabelled");
        }
    }

    #[test]
    fn bad_label_selectors_are_rejected() {
        for s in [
            "app=web,",
            "=x",
            "app in web",
            "app in (a",
            "app ~ b",
            "app=we b",
            "a b",
            "!a=b",
            "app=-x",
        ] {
            assert!(LabelSelector::parse(s).is_err(), "{s:?} should not parse");
        }
    }

    #[test]
    fn field_selectors() {
        let rts = default_resources();
        let pods = &rts[0];
        let o = obj(json!({}));
        let f = |s: &str| FieldSelector::parse(s, pods).expect(s);
        assert!(f("metadata.name=n").matches(&o));
        assert!(f("metadata.name==n,metadata.namespace=ns").matches(&o));
        assert!(!f("metadata.name!=n").matches(&o));
        assert!(f("spec.nodeName=node-1,status.phase!=Pending").matches(&o));
        assert!(f("status.podIP=").matches(&o));
        assert_eq!(f("metadata.name=n").name(), Some("n"));
        assert_eq!(f("metadata.name!=n").name(), None);
        assert!(FieldSelector::parse("spec.foo=bar", pods).is_err());
        assert!(FieldSelector::parse("metadata.name", pods).is_err());
        let by_plural = |plural: &str| {
            rts.iter()
                .find(|r| r.plural == plural)
                .expect("a default resource")
        };
        let leases = by_plural("leases");
        assert!(FieldSelector::parse("spec.nodeName=x", leases).is_err());
        let namespaces = by_plural("namespaces");
        assert!(FieldSelector::parse("metadata.namespace=x", namespaces).is_err());
        let esc = FieldSelector::parse(r"metadata.name=a\,b", pods).expect("escaped");
        assert_eq!(esc.0[0].value, "a,b");
    }
}
