//! The name of one JobSet ([`Key`]): the key of every per-JobSet map in the reconciler (the
//! index, the work queue, the runtime's entries, the published epochs, the metrics' labels).

use std::fmt;

/// One JobSet, by namespace and name; shown as `namespace/name`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    pub namespace: String,
    pub name: String,
}

impl Key {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Key {
        Key {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::Key;

    #[test]
    fn shows_as_namespace_slash_name() {
        assert_eq!(Key::new("ns", "js").to_string(), "ns/js");
    }
}
