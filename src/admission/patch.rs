//! The JSON Patch writer (docs/architecture.md, "Admission"): operations whose values are already
//! compact JSON text ([`Op`]), the JSON Pointers they address ([`Ptr`], escaped as RFC 6901 says),
//! and the patch document written byte for byte as `serde_json` writes a [`json_patch::Patch`].
//! Nothing here knows what a JobSet is.

use std::fmt::Write as _;

use json_patch::{AddOperation, PatchOperation, ReplaceOperation};
use jsonptr::PointerBuf;
use serde::Serialize;

/// One JSON Patch operation (`add`, or `replace` when `replace`), its value as compact JSON text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Op {
    pub replace: bool,
    /// A JSON Pointer, its tokens escaped (`/` in annotation keys is `~1`).
    pub path: String,
    pub value: String,
}

impl Op {
    /// The operation as `json_patch` models it.
    pub fn to_patch_operation(&self) -> PatchOperation {
        // Both parse: the path and the value were written by this module.
        let path = PointerBuf::parse(self.path.as_str()).unwrap_or_default();
        let value = serde_json::from_str(&self.value).unwrap_or_default();
        if self.replace {
            PatchOperation::Replace(ReplaceOperation { path, value })
        } else {
            PatchOperation::Add(AddOperation { path, value })
        }
    }
}

/// Writes operations as a JSON Patch document: the bytes `serde_json::to_vec` writes for the
/// `json_patch::Patch` of them.
pub(crate) fn write_patch(ops: &[Op], out: &mut Vec<u8>) {
    out.push(b'[');
    for (i, op) in ops.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(if op.replace {
            b"{\"op\":\"replace\",\"path\":"
        } else {
            b"{\"op\":\"add\",\"path\":"
        });
        write_json_str(&op.path, out);
        out.extend_from_slice(b",\"value\":");
        out.extend_from_slice(op.value.as_bytes());
        out.push(b'}');
    }
    out.push(b']');
}

/// A string as JSON, as serde_json writes it.
pub(crate) fn write_json_str(s: &str, out: &mut Vec<u8>) {
    // Writing into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

/// The JSON text of a serializable value.
pub(crate) fn to_json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

pub(crate) fn add(path: Ptr, value: String) -> Op {
    Op {
        replace: false,
        path: path.0,
        value,
    }
}

/// A JSON Pointer under construction; every token is escaped as RFC 6901 says (`~` is `~0`, `/`
/// is `~1`: an annotation key's `/` becomes `~1`).
#[derive(Clone, Debug)]
pub(crate) struct Ptr(pub(crate) String);

pub(crate) fn ptr(keys: &[&str]) -> Ptr {
    Ptr(String::with_capacity(96)).keys(keys)
}

impl Ptr {
    /// A copy with room for `extra` more bytes.
    fn with_room(&self, extra: usize) -> Ptr {
        let mut p = String::with_capacity(self.0.len() + extra);
        p.push_str(&self.0);
        Ptr(p)
    }
    fn push(&mut self, token: &str) {
        self.0.push('/');
        if !token.contains(['~', '/']) {
            self.0.push_str(token);
            return;
        }
        for c in token.chars() {
            match c {
                '~' => self.0.push_str("~0"),
                '/' => self.0.push_str("~1"),
                c => self.0.push(c),
            }
        }
    }
    pub(crate) fn key(&self, key: &str) -> Ptr {
        let mut p = self.with_room(key.len() + 8);
        p.push(key);
        p
    }
    pub(crate) fn keys(&self, keys: &[&str]) -> Ptr {
        let mut p = self.with_room(keys.iter().map(|k| k.len() + 8).sum());
        for k in keys {
            p.push(k);
        }
        p
    }
    pub(crate) fn idx(&self, index: usize) -> Ptr {
        let mut p = self.with_room(24);
        // Writing into a String cannot fail.
        let _ = write!(p.0, "/{index}");
        p
    }
}
