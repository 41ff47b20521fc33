//! What admission reads of an AdmissionReview and its JobSet, decoded in one pass straight from the
//! request body (or from a [`Value`], for the offline commands): sparse (only the fields the rules
//! read), borrowed (strings point into the body unless they hold escapes) and lenient (a field of
//! an unexpected JSON type reads as absent, never as an error). Nothing here is ever serialized
//! back: the output is built from targeted patch operations only (docs/architecture.md, "Admission").
//!
//! # Same answers as a `Value`
//!
//! The rules used to read a `serde_json::Value` of the whole body; they must answer the same for
//! every body, including which bodies are not JSON and with which error. So:
//!
//! - every JSON value, read or skipped, goes through `deserialize_any` with a visitor that accepts
//!   every type, exactly like `Value`'s own `Deserialize`: serde_json then performs the same checks
//!   in the same order (string escapes and UTF-8, number range, the recursion limit) and reports the
//!   same first error at the same position. `IgnoredAny` would not: it skips strings and numbers
//!   without checking them and has no recursion limit;
//! - an object whose *first* key is serde_json's raw-value token is read as `Value` reads it (the
//!   crate's build has serde_json's `raw_value` feature): its value must be a string holding JSON,
//!   which is what the object stands for ([`raw_value`]);
//! - duplicate keys: the last one wins, as in a `Value` (every field is assigned on every
//!   occurrence);
//! - numbers read as `i64` exactly as `Value::as_i64` (a float never is one);
//! - a string is a `Str`: borrowed from the body without escapes, owned with them.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, Deserialize, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use crate::wire::agent_env;

/// A JSON string: borrowed from the input when it holds no escapes.
pub(crate) type Str<'a> = Cow<'a, str>;

/// serde_json's raw-value token: a `Value` reads an object whose first key is this as the JSON text
/// held by its value.
const RAW_VALUE_TOKEN: &str = "$serde_json::private::RawValue";

/// A view of one JSON value of the JSON type it expects. A value of another type is `None` (the
/// field reads as absent) after being consumed and checked like any other.
pub(crate) trait Shape<'de>: Sized {
    /// The JSON type this view reads, for messages ("an object").
    const EXPECTED: &'static str = "a value";
    fn from_i64(_: i64) -> Option<Self> {
        None
    }
    fn from_u64(_: u64) -> Option<Self> {
        None
    }
    /// A string that does not outlive the call (it held escapes).
    fn from_str(_: &str) -> Option<Self> {
        None
    }
    fn from_borrowed_str(s: &'de str) -> Option<Self> {
        Self::from_str(s)
    }
    fn from_seq<A: SeqAccess<'de>>(seq: A) -> Result<Option<Self>, A::Error> {
        skip_seq(seq).map(|()| None)
    }
    fn from_map<A: MapAccess<'de>>(mut map: A) -> Result<Option<Self>, A::Error> {
        Ok(walk_object::<Self, A>(&mut map, |_| 0, |_, _| Ok(()))?.unwrap_or(None))
    }
}

/// Reads a `T` leniently: `Lenient(None)` for a value of another JSON type. The `Deserialize` the views
/// are read through.
pub(crate) struct Lenient<T>(pub Option<T>);

impl<'de, T: Shape<'de>> Deserialize<'de> for Lenient<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer
            .deserialize_any(ShapeVisitor::<T>(PhantomData))
            .map(Lenient)
    }
}

impl<'de, T: Shape<'de>> Lenient<T> {
    /// Reads a view from an in-memory value (the offline commands' path). Never fails: every
    /// visitor accepts every JSON type.
    pub fn from_value(value: &'de Value) -> Option<T> {
        Lenient::<T>::deserialize(value).ok().and_then(|l| l.0)
    }
}

struct ShapeVisitor<T>(PhantomData<T>);

impl<'de, T: Shape<'de>> Visitor<'de> for ShapeVisitor<T> {
    type Value = Option<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any valid JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Option<T>, E> {
        Ok(None)
    }
    fn visit_i64<E>(self, v: i64) -> Result<Option<T>, E> {
        Ok(T::from_i64(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Option<T>, E> {
        Ok(T::from_u64(v))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Option<T>, E> {
        Ok(None)
    }
    fn visit_str<E>(self, v: &str) -> Result<Option<T>, E> {
        Ok(T::from_str(v))
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Option<T>, E> {
        Ok(T::from_borrowed_str(v))
    }
    fn visit_unit<E>(self) -> Result<Option<T>, E> {
        Ok(None)
    }
    fn visit_none<E>(self) -> Result<Option<T>, E> {
        Ok(None)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Option<T>, A::Error> {
        T::from_seq(seq)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Option<T>, A::Error> {
        T::from_map(map)
    }
}

/// Any JSON value, checked and dropped.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Skip;

impl Shape<'_> for Skip {}

fn skip_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
    while seq.next_element::<Lenient<Skip>>()?.is_some() {}
    Ok(())
}

/// The JSON type of a value that did not read as what a view expected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Null,
    Bool,
    Number,
    String,
    Array,
    Object,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Null => "null",
            Kind::Bool => "a boolean",
            Kind::Number => "a number",
            Kind::String => "a string",
            Kind::Array => "an array",
            Kind::Object => "an object",
        }
    }
}

/// A field of a view that is present but of another JSON type than the one the rules need: its
/// key, the type expected, the type found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WrongType {
    pub key: &'static str,
    pub expected: &'static str,
    pub found: Kind,
}

/// The fields of one object that could not be read (empty for almost every object).
pub(crate) type Wrong = Vec<WrongType>;

/// How many list elements a list keeps the position and type of when they are not what the
/// list holds (the first ones: they are reported, the rest counted).
const MAX_BAD_ELEMENTS: usize = 4;

/// Every list of one decoding keeps at most this many elements in all (a JobSet the rules can
/// judge has a few dozen); past it the elements are checked and dropped, and the decoding is
/// marked truncated ([`Budget`]). Bounds the memory of a body of many small elements.
pub(crate) const MAX_LIST_ELEMENTS: usize = 10_000;

thread_local! {
    /// The JSON type of the last raw-value object's content that did not read as its view: what
    /// [`Checked`] reports for it, as a `Value` of the same body would show it.
    static RAW_KIND: std::cell::Cell<Option<Kind>> = const { std::cell::Cell::new(None) };
    static ELEMENTS_LEFT: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
    static TRUNCATED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs one decoding under the element budget: returns its result and whether elements were
/// dropped. Decodings nest (the outer budget is restored).
pub(crate) fn with_budget<R>(f: impl FnOnce() -> R) -> (R, bool) {
    let outer = ELEMENTS_LEFT.with(|c| c.replace(Some(MAX_LIST_ELEMENTS)));
    let outer_truncated = TRUNCATED.with(|c| c.replace(false));
    let out = f();
    ELEMENTS_LEFT.with(|c| c.set(outer));
    let truncated = TRUNCATED.with(|c| c.replace(outer_truncated));
    (out, truncated)
}

/// Takes one element from the budget; `false` when it is spent (the element is dropped).
fn take_element() -> bool {
    ELEMENTS_LEFT.with(|c| match c.get() {
        None => true,
        Some(0) => {
            TRUNCATED.with(|t| t.set(true));
            false
        }
        Some(n) => {
            c.set(Some(n - 1));
            true
        }
    })
}

/// Reads a `T`, telling an absent value (`null`) from one of another JSON type.
pub(crate) struct Checked<T>(pub Result<Option<T>, Kind>);

impl<'de, T: Shape<'de>> Deserialize<'de> for Checked<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(CheckedVisitor::<T>(PhantomData))
    }
}

struct CheckedVisitor<T>(PhantomData<T>);

fn found<T>(value: Option<T>, kind: Kind) -> Checked<T> {
    Checked(value.map(Some).ok_or(kind))
}

impl<'de, T: Shape<'de>> Visitor<'de> for CheckedVisitor<T> {
    type Value = Checked<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any valid JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Checked<T>, E> {
        Ok(Checked(Err(Kind::Bool)))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Checked<T>, E> {
        Ok(found(T::from_i64(v), Kind::Number))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Checked<T>, E> {
        Ok(found(T::from_u64(v), Kind::Number))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Checked<T>, E> {
        Ok(Checked(Err(Kind::Number)))
    }
    fn visit_str<E>(self, v: &str) -> Result<Checked<T>, E> {
        Ok(found(T::from_str(v), Kind::String))
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Checked<T>, E> {
        Ok(found(T::from_borrowed_str(v), Kind::String))
    }
    fn visit_unit<E>(self) -> Result<Checked<T>, E> {
        Ok(Checked(Ok(None)))
    }
    fn visit_none<E>(self) -> Result<Checked<T>, E> {
        Ok(Checked(Ok(None)))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Checked<T>, A::Error> {
        Ok(found(T::from_seq(seq)?, Kind::Array))
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Checked<T>, A::Error> {
        RAW_KIND.with(|k| k.set(None));
        let value = T::from_map(map)?;
        let kind = RAW_KIND.with(|k| k.take()).unwrap_or(Kind::Object);
        if value.is_none() && kind == Kind::Null {
            // A raw value holding `null`: absent, as `null` itself.
            return Ok(Checked(Ok(None)));
        }
        Ok(found(value, kind))
    }
}

/// Reads the value of the current key, recording it in `wrong` when it is present but not a `T`.
fn checked<'de, T: Shape<'de>, A: MapAccess<'de>>(
    map: &mut A,
    wrong: &mut Wrong,
    key: &'static str,
) -> Result<Option<T>, A::Error> {
    let Checked(value) = map.next_value::<Checked<T>>()?;
    // The last occurrence of a key wins, as in a `Value`.
    wrong.retain(|w| w.key != key);
    Ok(value.unwrap_or_else(|found| {
        wrong.push(WrongType {
            key,
            expected: T::EXPECTED,
            found,
        });
        None
    }))
}

/// Walks a JSON object: `field` numbers the keys the caller reads (0: not read), `value` reads the
/// value of such a key from the map; every other value is skipped. `Some(raw)` when the object is
/// a raw value (see [`raw_value`]): the caller's view of it, read from the JSON it holds.
pub(crate) fn walk_object<'de, T: Shape<'de>, A: MapAccess<'de>>(
    map: &mut A,
    field: fn(&str) -> u8,
    mut value: impl FnMut(u8, &mut A) -> Result<(), A::Error>,
) -> Result<Option<Option<T>>, A::Error> {
    let mut first = true;
    while let Some(key) = map.next_key_seed(KeySeed { field, first })? {
        match key {
            Key::RawValue => return raw_value::<T, A>(map).map(Some),
            Key::Field(0) => {
                map.next_value::<Lenient<Skip>>()?;
            }
            Key::Field(n) => value(n, map)?,
        }
        first = false;
    }
    // Not a raw value: what a raw value nested in one of its values left for its own reader is
    // not this object's type.
    RAW_KIND.with(|k| k.set(None));
    Ok(None)
}

enum Key {
    /// The first key is the raw-value token.
    RawValue,
    Field(u8),
}

struct KeySeed {
    field: fn(&str) -> u8,
    first: bool,
}

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Key;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Key, D::Error> {
        // As `Value` reads its keys.
        deserializer.deserialize_str(self)
    }
}

impl Visitor<'_> for KeySeed {
    type Value = Key;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string key")
    }
    fn visit_str<E>(self, key: &str) -> Result<Key, E> {
        Ok(if self.first && key == RAW_VALUE_TOKEN {
            Key::RawValue
        } else {
            Key::Field((self.field)(key))
        })
    }
}

/// An object whose first key is serde_json's raw-value token, read as `Value` reads it: its value
/// must be a string (else the error `Value` gives), which is parsed as JSON (its error wrapped as
/// `Value` wraps it), and the object stands for that JSON. The map is left after that first entry,
/// where serde_json expects its end.
///
/// The JSON is read straight into the view, never into a `Value` (a 3 MiB string of `0,0,...`
/// would be 1.5 million of them): through serde_json's reader for `io::Read`, which hands every
/// string over as transient (`visit_str`), so the view owns what it keeps and may outlive the
/// text; it checks what `from_str` checks, and reports the same errors at the same positions.
fn raw_value<'de, T: Shape<'de>, A: MapAccess<'de>>(map: &mut A) -> Result<Option<T>, A::Error> {
    let text = map.next_value_seed(RawText)?;
    let kind = match text
        .trim_start_matches([' ', '\t', '\n', '\r'])
        .as_bytes()
        .first()
    {
        Some(b'n') => Kind::Null,
        Some(b't' | b'f') => Kind::Bool,
        Some(b'"') => Kind::String,
        Some(b'[') => Kind::Array,
        Some(b'{') => Kind::Object,
        _ => Kind::Number,
    };
    let mut reader = serde_json::Deserializer::from_reader(text.as_bytes());
    let view = de::Deserializer::deserialize_any(&mut reader, ShapeVisitor::<T>(PhantomData))
        .and_then(|view| reader.end().map(|()| view))
        .map_err(de::Error::custom)?;
    // Set (or cleared) last: raw values nested in the JSON it holds set it while it was read.
    RAW_KIND.with(|k| k.set(view.is_none().then_some(kind)));
    Ok(view)
}

/// The string value of a raw-value object (serde_json's `BoxedFromString`).
struct RawText;

impl<'de> DeserializeSeed<'de> for RawText {
    type Value = String;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<String, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl Visitor<'_> for RawText {
    type Value = String;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The wording of serde_json's own visitor, which ends up in the error message.
        f.write_str("raw value")
    }
    fn visit_str<E>(self, s: &str) -> Result<String, E> {
        Ok(s.to_owned())
    }
    fn visit_string<E>(self, s: String) -> Result<String, E> {
        Ok(s)
    }
}

impl<'de> Shape<'de> for Str<'de> {
    const EXPECTED: &'static str = "a string";
    fn from_str(s: &str) -> Option<Self> {
        Some(Cow::Owned(s.to_owned()))
    }
    fn from_borrowed_str(s: &'de str) -> Option<Self> {
        Some(Cow::Borrowed(s))
    }
}

/// `Value::as_i64`: an integer in range; never a float.
impl Shape<'_> for i64 {
    const EXPECTED: &'static str = "an integer";
    fn from_i64(v: i64) -> Option<Self> {
        Some(v)
    }
    fn from_u64(v: u64) -> Option<Self> {
        i64::try_from(v).ok()
    }
}

/// An array, every element kept at its index (an element of another JSON type reads as
/// `T::default()`, whose fields are all absent, and is recorded in `.1`).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct List<T>(pub Vec<T>, pub BadElements);

/// The elements of a list that are not of the type it holds: the first few with their index and
/// type, and how many in all.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct BadElements {
    pub first: Vec<(usize, Kind)>,
    pub count: usize,
    /// A bit per element kept: set for those that are not of the list's type.
    mask: Vec<u64>,
}

impl BadElements {
    fn record(&mut self, index: usize, kind: Kind) {
        if self.first.len() < MAX_BAD_ELEMENTS {
            self.first.push((index, kind));
        }
        self.count += 1;
        if index < MAX_LIST_ELEMENTS {
            let word = index / 64;
            if self.mask.len() <= word {
                self.mask.resize(word + 1, 0);
            }
            self.mask[word] |= 1 << (index % 64);
        }
    }

    /// The element at `index` is not of the list's type (it reads as all absent).
    pub fn contains(&self, index: usize) -> bool {
        self.mask
            .get(index / 64)
            .is_some_and(|w| w & (1 << (index % 64)) != 0)
    }
}

impl<'de, T: Shape<'de> + Default> Shape<'de> for List<T> {
    const EXPECTED: &'static str = "an array";
    fn from_seq<A: SeqAccess<'de>>(mut seq: A) -> Result<Option<Self>, A::Error> {
        // serde_json gives no size hint: start with room for a few.
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(4).min(64));
        let mut bad = BadElements::default();
        let mut index = 0;
        while let Some(Checked(item)) = seq.next_element::<Checked<T>>()? {
            let item = match item {
                Ok(Some(item)) => Some(item),
                Ok(None) => {
                    bad.record(index, Kind::Null);
                    None
                }
                Err(kind) => {
                    bad.record(index, kind);
                    None
                }
            };
            index += 1;
            if take_element() {
                items.push(item.unwrap_or_default());
            }
        }
        Ok(Some(List(items, bad)))
    }
}

/// An array of integers: elements that are not `i64` are left out (`filter_map(Value::as_i64)`),
/// and recorded in `.1`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Ints(pub Vec<i64>, pub BadElements);

impl<'de> Shape<'de> for Ints {
    const EXPECTED: &'static str = "an array of integers";
    fn from_seq<A: SeqAccess<'de>>(mut seq: A) -> Result<Option<Self>, A::Error> {
        let mut items = Vec::new();
        let mut bad = BadElements::default();
        let mut index = 0;
        while let Some(Checked(item)) = seq.next_element::<Checked<i64>>()? {
            match item {
                Ok(Some(v)) => {
                    if take_element() {
                        items.push(v);
                    }
                }
                Ok(None) => bad.record(index, Kind::Null),
                Err(kind) => bad.record(index, kind),
            }
            index += 1;
        }
        Ok(Some(Ints(items, bad)))
    }
}

/// Reads the value of the current key leniently.
fn lenient<'de, T: Shape<'de>, A: MapAccess<'de>>(map: &mut A) -> Result<Option<T>, A::Error> {
    map.next_value::<Lenient<T>>().map(|l| l.0)
}

/// [`lenient`] as the common form of `object_view!` calls it.
fn lenient_in<'de, T: Shape<'de>, A: MapAccess<'de>>(
    map: &mut A,
    _: &mut Wrong,
    _: &'static str,
) -> Result<Option<T>, A::Error> {
    lenient(map)
}

/// A field the mutation must never write over: read as a `T` when it is one, else only known
/// to be there.
#[derive(Clone, Debug)]
pub(crate) enum Present<T> {
    Read(T),
    /// Present with another JSON type.
    Other,
}

/// Reads the value of the current key as a [`Present`] (`null` reads as absent).
fn present<'de, T: Shape<'de>, A: MapAccess<'de>>(
    map: &mut A,
    _: &mut Wrong,
    _: &'static str,
) -> Result<Option<Present<T>>, A::Error> {
    let Checked(value) = map.next_value::<Checked<T>>()?;
    Ok(match value {
        Ok(Some(v)) => Some(Present::Read(v)),
        Ok(None) => None,
        Err(_) => Some(Present::Other),
    })
}

/// Reads the value of the current key as a `Value` (present, whatever its type, `null` included).
fn any_value<'de, A: MapAccess<'de>>(
    map: &mut A,
    _: &mut Wrong,
    _: &'static str,
) -> Result<Option<Value>, A::Error> {
    map.next_value::<Value>().map(Some)
}

/// A view of a JSON object. Common form: `Name { "key" => field: reader, ... }`, each key read
/// into its field by `lenient` or `any_value`. General form: `fields` numbers the keys it reads
/// (from 1, 0 for the rest), `read` reads one.
macro_rules! object_view {
    ($name:ident { $($key:expr => $field:ident: $reader:ident),+ $(,)? }) => {
        object_view!(
            $name,
            |key| {
                let mut n = 0u8;
                $(
                    n += 1;
                    if key == $key {
                        return n;
                    }
                )+
                0
            },
            |v, field, map| {
                let mut n = 0u8;
                $(
                    n += 1;
                    if field == n {
                        v.$field = $reader(map, &mut v.wrong, $key)?;
                    }
                )+
            }
        );
    };
    ($name:ident, |$key:ident| $fields:expr, |$view:ident, $field:ident, $map:ident| $read:expr) => {
        impl<'de> Shape<'de> for $name<'de> {
            const EXPECTED: &'static str = "an object";
            fn from_map<A: MapAccess<'de>>(mut map: A) -> Result<Option<Self>, A::Error> {
                let mut $view = $name::default();
                let raw = walk_object::<Self, A>(
                    &mut map,
                    |$key| $fields,
                    |$field, $map| {
                        $read;
                        Ok(())
                    },
                )?;
                Ok(match raw {
                    Some(raw) => raw,
                    None => Some($view),
                })
            }
        }
    };
}

/// An AdmissionReview request body.
#[derive(Clone, Debug, Default)]
pub(crate) struct Review<'a> {
    /// Fields present with another JSON type than the rules need.
    pub wrong: Wrong,
    pub api_version: Option<Str<'a>>,
    pub kind: Option<Str<'a>>,
    pub request: Option<RequestView<'a>>,
}

object_view!(Review {
    "apiVersion" => api_version: lenient_in,
    "kind" => kind: lenient_in,
    "request" => request: lenient_in,
});

/// `request` of an AdmissionReview.
#[derive(Clone, Debug, Default)]
pub(crate) struct RequestView<'a> {
    /// Fields present with another JSON type than the rules need.
    pub wrong: Wrong,
    pub uid: Option<Str<'a>>,
    pub operation: Option<Str<'a>>,
    pub kind: Option<GroupKind<'a>>,
    /// Present when it is an object.
    pub object: Option<JobSetView<'a>>,
    pub old_object: Option<JobSetView<'a>>,
}

object_view!(RequestView {
    "uid" => uid: lenient_in,
    "operation" => operation: lenient_in,
    "kind" => kind: lenient_in,
    "object" => object: lenient_in,
    "oldObject" => old_object: lenient_in,
});

/// `request.kind`.
#[derive(Clone, Debug, Default)]
pub(crate) struct GroupKind<'a> {
    /// Fields present with another JSON type than the rules need.
    pub wrong: Wrong,
    pub group: Option<Str<'a>>,
    pub kind: Option<Str<'a>>,
}

object_view!(GroupKind {
    "group" => group: lenient_in,
    "kind" => kind: lenient_in,
});

/// A JobSet: what validation and mutation read of it.
#[derive(Clone, Debug, Default)]
pub(crate) struct JobSetView<'a> {
    /// Lists of the body were cut at [`MAX_LIST_ELEMENTS`]: the view is not the whole object.
    pub truncated: bool,
    /// Fields present with another JSON type than the rules need.
    pub wrong: Wrong,
    pub metadata: Option<Meta<'a>>,
    pub spec: Option<JobSetSpec<'a>>,
}

object_view!(JobSetView {
    "metadata" => metadata: lenient_in,
    "spec" => spec: lenient_in,
});

impl<'a> JobSetView<'a> {
    /// The view of an in-memory JobSet (the default, all absent, for a non-object).
    pub fn from_value(value: &'a Value) -> Self {
        let (view, truncated) = with_budget(|| Lenient::<JobSetView<'a>>::from_value(value));
        let mut view = view.unwrap_or_default();
        view.truncated = truncated;
        view
    }

    fn failure_policy(&self) -> Option<&FailurePolicy<'a>> {
        self.spec.as_ref()?.failure_policy.as_ref()
    }

    /// `spec.failurePolicy.restartStrategy == InPlaceRestart`.
    pub fn in_place_restart(&self) -> bool {
        self.failure_policy()
            .and_then(|p| p.restart_strategy.as_deref())
            == Some(crate::protocol::IN_PLACE_RESTART)
    }

    pub fn max_restarts(&self) -> Option<i64> {
        self.failure_policy()?.max_restarts
    }

    pub fn replicated_jobs(&self) -> &[ReplicatedJob<'a>] {
        self.spec
            .as_ref()
            .and_then(|s| s.replicated_jobs.as_ref())
            .map_or(&[], |l| l.0.as_slice())
    }

    /// `metadata.annotations["jobset-inplace.dev/inject"]`, if a string.
    pub fn inject_annotation(&self) -> Option<&str> {
        self.metadata
            .as_ref()?
            .annotations
            .as_ref()?
            .inject
            .as_deref()
    }

    /// `metadata.name`, else `metadata.generateName`, else "".
    pub fn name(&self) -> &str {
        let meta = self.metadata.as_ref();
        meta.and_then(|m| m.name.as_deref())
            .or_else(|| meta.and_then(|m| m.generate_name.as_deref()))
            .unwrap_or("")
    }
}

/// `metadata` of a JobSet or of a pod template.
#[derive(Clone, Debug, Default)]
pub(crate) struct Meta<'a> {
    /// Fields present with another JSON type than the rules need.
    pub wrong: Wrong,
    pub name: Option<Str<'a>>,
    pub generate_name: Option<Str<'a>>,
    /// Present when it is an object.
    pub annotations: Option<Annotations<'a>>,
}

object_view!(Meta {
    "name" => name: checked,
    "generateName" => generate_name: lenient_in,
    "annotations" => annotations: checked,
});

/// The two annotations admission reads (their string values).
#[derive(Clone, Debug, Default)]
pub(crate) struct Annotations<'a> {
    /// Fields present with another JSON type than the rules need.
    pub wrong: Wrong,
    /// `jobset-inplace.dev/inject`
    pub inject: Option<Str<'a>>,
    /// `jobset-inplace.dev/injected`
    pub injected: Option<Str<'a>>,
}

object_view!(Annotations {
    super::INJECT_ANNOTATION => inject: lenient_in,
    super::INJECTED_ANNOTATION => injected: lenient_in,
});

/// `spec` of a JobSet.
#[derive(Clone, Debug, Default)]
pub(crate) struct JobSetSpec<'a> {
    /// Fields present with another JSON type than the rules need.
    pub wrong: Wrong,
    pub failure_policy: Option<FailurePolicy<'a>>,
    pub replicated_jobs: Option<List<ReplicatedJob<'a>>>,
}

object_view!(JobSetSpec {
    "failurePolicy" => failure_policy: lenient_in,
    "replicatedJobs" => replicated_jobs: checked,
});

/// `spec.failurePolicy`.
#[derive(Clone, Debug, Default)]
pub(crate) struct FailurePolicy<'a> {
    /// Fields present with another JSON type than the rules need.
    pub wrong: Wrong,
    pub restart_strategy: Option<Str<'a>>,
    pub max_restarts: Option<i64>,
}

object_view!(FailurePolicy {
    "restartStrategy" => restart_strategy: lenient_in,
    "maxRestarts" => max_restarts: lenient_in,
});

/// One `spec.replicatedJobs[i]`.
#[derive(Clone, Debug, Default)]
pub(crate) struct ReplicatedJob<'a> {
    /// `template.spec`, when `template` and it are objects.
    pub job_spec: Option<JobSpec<'a>>,
    /// `template` or `template.spec` present but not an object.
    pub wrong: Wrong,
}

object_view!(
    ReplicatedJob,
    |key| match key {
        "template" => 1,
        _ => 0,
    },
    |v, _field, map| {
        let template = checked::<JobTemplate<'de>, A>(map, &mut v.wrong, "template")?;
        v.job_spec = None;
        if let Some(t) = template {
            v.wrong.extend(t.wrong.into_iter().map(|w| WrongType {
                key: "template.spec",
                ..w
            }));
            v.job_spec = t.spec;
        }
    }
);

/// `template` of a replicatedJob (the Job template).
#[derive(Clone, Debug, Default)]
pub(crate) struct JobTemplate<'a> {
    pub spec: Option<JobSpec<'a>>,
    pub wrong: Wrong,
}

object_view!(
    JobTemplate,
    |key| match key {
        "spec" => 1,
        _ => 0,
    },
    |v, _field, map| v.spec = checked(map, &mut v.wrong, "spec")?
);

/// `template.spec` of a replicatedJob (the Job spec).
#[derive(Clone, Debug, Default)]
pub(crate) struct JobSpec<'a> {
    /// Present whatever its type (`null` included): shown as written in messages.
    pub backoff_limit: Option<Value>,
    pub pod_replacement_policy: Option<Value>,
    pub completions: Option<i64>,
    pub parallelism: Option<i64>,
    /// Present when it is an object.
    pub template: Option<PodTemplate<'a>>,
    pub wrong: Wrong,
}

object_view!(
    JobSpec,
    |key| match key {
        "backoffLimit" => 1,
        "podReplacementPolicy" => 2,
        "completions" => 3,
        "parallelism" => 4,
        "template" => 5,
        _ => 0,
    },
    |v, field, map| match field {
        1 => v.backoff_limit = any_value(map, &mut v.wrong, "backoffLimit")?,
        2 => v.pod_replacement_policy = any_value(map, &mut v.wrong, "podReplacementPolicy")?,
        3 => v.completions = checked(map, &mut v.wrong, "completions")?,
        4 => v.parallelism = checked(map, &mut v.wrong, "parallelism")?,
        _ => v.template = checked(map, &mut v.wrong, "template")?,
    }
);

/// The pod template of a Job.
#[derive(Clone, Debug, Default)]
pub(crate) struct PodTemplate<'a> {
    /// Fields present with another JSON type than the rules need.
    pub wrong: Wrong,
    /// Present when it is an object.
    pub metadata: Option<Meta<'a>>,
    /// Present when it is an object.
    pub spec: Option<PodSpec<'a>>,
}

object_view!(PodTemplate {
    "metadata" => metadata: checked,
    "spec" => spec: checked,
});

/// A pod spec.
#[derive(Clone, Debug, Default)]
pub(crate) struct PodSpec<'a> {
    /// Fields present with another JSON type than the rules need.
    pub wrong: Wrong,
    pub service_account_name: Option<Str<'a>>,
    pub service_account: Option<Str<'a>>,
    /// Present when it is an array.
    pub init_containers: Option<List<ContainerView<'a>>>,
    pub containers: Option<List<ContainerView<'a>>>,
    /// `automountServiceAccountToken`, whatever its type.
    pub automount_token: Option<Value>,
    /// Present when it is an array: its volumes' names, and which is the agent's token volume.
    pub volumes: Option<List<Volume<'a>>>,
    /// Present whatever its type; the names of its entries when it is an array.
    pub image_pull_secrets: Option<Present<List<Named<'a>>>>,
}

object_view!(PodSpec {
    "serviceAccountName" => service_account_name: checked,
    "serviceAccount" => service_account: checked,
    "initContainers" => init_containers: checked,
    "containers" => containers: checked,
    "automountServiceAccountToken" => automount_token: any_value,
    "volumes" => volumes: checked,
    "imagePullSecrets" => image_pull_secrets: present,
});

impl PodSpec<'_> {
    /// `serviceAccountName` or `serviceAccount` is a non-empty string.
    pub fn names_service_account(&self) -> bool {
        [&self.service_account_name, &self.service_account]
            .into_iter()
            .any(|s| s.as_deref().is_some_and(|s| !s.is_empty()))
    }
}

/// A container of a pod spec.
#[derive(Clone, Debug, Default)]
pub(crate) struct ContainerView<'a> {
    /// Fields present with another JSON type than the rules need.
    pub wrong: Wrong,
    pub name: Option<Str<'a>>,
    pub restart_policy: Option<Str<'a>>,
    /// Present when it is an array.
    pub restart_policy_rules: Option<List<RuleView<'a>>>,
    /// Present when it is an array.
    pub env: Option<EnvList<'a>>,
    /// Present when it is an object.
    pub startup_probe: Option<Probe<'a>>,
    pub ports: Option<List<Port<'a>>>,
    /// Present when it is an array: the volume names of its mounts.
    pub volume_mounts: Option<List<Named<'a>>>,
}

object_view!(ContainerView {
    "name" => name: checked,
    "restartPolicy" => restart_policy: checked,
    "restartPolicyRules" => restart_policy_rules: checked,
    "env" => env: checked,
    "startupProbe" => startup_probe: checked,
    "ports" => ports: checked,
    "volumeMounts" => volume_mounts: checked,
});

/// One `restartPolicyRules` entry.
#[derive(Clone, Debug, Default)]
pub(crate) struct RuleView<'a> {
    /// Fields present with another JSON type than the rules need.
    pub wrong: Wrong,
    pub action: Option<Str<'a>>,
    /// Present when it is an object.
    pub exit_codes: Option<ExitCodes<'a>>,
}

object_view!(RuleView {
    "action" => action: checked,
    "exitCodes" => exit_codes: checked,
});

/// `exitCodes` of a restart rule.
#[derive(Clone, Debug, Default)]
pub(crate) struct ExitCodes<'a> {
    /// Fields present with another JSON type than the rules need.
    pub wrong: Wrong,
    pub operator: Option<Str<'a>>,
    /// Present when it is an array; its integers.
    pub values: Option<Ints>,
}

object_view!(ExitCodes {
    "operator" => operator: checked,
    "values" => values: checked,
});

/// The env names the rules look up (the agent's contract): the only entries an [`EnvList`] keeps.
pub(crate) fn is_env_name_read(name: &str) -> bool {
    matches!(
        name,
        agent_env::NAMESPACE
            | agent_env::POD_NAME
            | agent_env::JOBSET_NAME
            | agent_env::RESTART_EXIT_CODE
            | agent_env::RESTART_EXIT_CODE_ALIAS
            | agent_env::PROTOCOL
            | agent_env::BARRIER_PORT
            | agent_env::BARRIER_PORT_ALIAS
            | agent_env::BARRIER_PATH
            | agent_env::BARRIER_PATH_ALIAS
            | agent_env::WORKER_COMMAND
    )
}

/// A container's `env` array: the entries whose name [`is_env_name_read`], with their index (a
/// container commonly has dozens of entries the rules never look at).
#[derive(Clone, Debug, Default)]
pub(crate) struct EnvList<'a> {
    pub read: Vec<(usize, EnvVar<'a>)>,
    /// Entries that are not objects, or whose `name` or `value` is not a string.
    pub bad: BadElements,
}

impl<'de> Shape<'de> for EnvList<'de> {
    const EXPECTED: &'static str = "an array";
    fn from_seq<A: SeqAccess<'de>>(mut seq: A) -> Result<Option<Self>, A::Error> {
        let mut read = Vec::new();
        let mut bad = BadElements::default();
        let mut index = 0;
        while let Some(Checked(entry)) = seq.next_element::<Checked<EnvVar<'de>>>()? {
            match entry {
                Ok(Some(entry)) => {
                    if let Some(w) = entry.wrong.first() {
                        bad.record(index, w.found);
                    }
                    if entry.name.as_deref().is_some_and(is_env_name_read) && take_element() {
                        read.push((index, entry));
                    }
                }
                Ok(None) => bad.record(index, Kind::Null),
                Err(kind) => bad.record(index, kind),
            }
            index += 1;
        }
        Ok(Some(EnvList { read, bad }))
    }
}

/// One `env` entry.
#[derive(Clone, Debug, Default)]
pub(crate) struct EnvVar<'a> {
    pub name: Option<Str<'a>>,
    pub value: Option<Str<'a>>,
    /// `valueFrom` is present (whatever its type).
    pub value_from: bool,
    pub wrong: Wrong,
}

object_view!(
    EnvVar,
    |key| match key {
        "name" => 1,
        "value" => 2,
        "valueFrom" => 3,
        _ => 0,
    },
    |v, field, map| match field {
        1 => v.name = checked(map, &mut v.wrong, "name")?,
        2 => v.value = checked(map, &mut v.wrong, "value")?,
        _ => {
            map.next_value::<Lenient<Skip>>()?;
            v.value_from = true;
        }
    }
);

/// `startupProbe` of a container.
#[derive(Clone, Debug, Default)]
pub(crate) struct Probe<'a> {
    /// Present whatever its type; its fields are read when it is an object.
    pub http_get: Option<HttpGet<'a>>,
    pub period_seconds: Option<i64>,
    pub failure_threshold: Option<i64>,
    pub wrong: Wrong,
}

object_view!(
    Probe,
    |key| match key {
        "httpGet" => 1,
        "periodSeconds" => 2,
        "failureThreshold" => 3,
        _ => 0,
    },
    |v, field, map| match field {
        1 => v.http_get = Some(checked(map, &mut v.wrong, "httpGet")?.unwrap_or_default()),
        2 => v.period_seconds = checked(map, &mut v.wrong, "periodSeconds")?,
        _ => v.failure_threshold = checked(map, &mut v.wrong, "failureThreshold")?,
    }
);

/// `startupProbe.httpGet`.
#[derive(Clone, Debug, Default)]
pub(crate) struct HttpGet<'a> {
    /// Fields present with another JSON type than the rules need.
    pub wrong: Wrong,
    /// Present whatever its type: a number, or a port name.
    pub port: Option<Value>,
    pub path: Option<Str<'a>>,
}

object_view!(HttpGet {
    "port" => port: any_value,
    "path" => path: checked,
});

/// An entry of a list keyed by `name` (`volumes`, `volumeMounts`, `imagePullSecrets`): its name.
#[derive(Clone, Debug, Default)]
pub(crate) struct Named<'a> {
    /// Fields present with another JSON type than the rules need.
    pub wrong: Wrong,
    pub name: Option<Str<'a>>,
}

object_view!(Named {
    "name" => name: checked,
});

impl<'a> List<Named<'a>> {
    /// Some entry is named `name`.
    pub fn has_name(&self, name: &str) -> bool {
        self.0.iter().any(|e| e.name.as_deref() == Some(name))
    }
}

/// A JSON value known when the program is written (strings, integers, arrays, objects): what a
/// value of a body is compared with ([`Equals`]) without being kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fixed {
    Str(&'static str),
    Int(i64),
    Arr(&'static [Fixed]),
    Obj(&'static [(&'static str, Fixed)]),
}

impl Fixed {
    /// The value as a `Value`.
    pub fn to_value(self) -> Value {
        match self {
            Fixed::Str(s) => Value::from(s),
            Fixed::Int(i) => Value::from(i),
            Fixed::Arr(items) => Value::Array(items.iter().map(|f| f.to_value()).collect()),
            Fixed::Obj(fields) => Value::Object(
                fields
                    .iter()
                    .map(|(k, f)| ((*k).to_owned(), f.to_value()))
                    .collect(),
            ),
        }
    }

    fn fields(self) -> &'static [(&'static str, Fixed)] {
        match self {
            Fixed::Obj(fields) => fields,
            _ => &[],
        }
    }
}

/// Reads one JSON value and tells whether it equals a [`Fixed`] as `Value`s compare (`==`): the
/// same keys (the last of duplicates counts), the same elements in order, integers of the same
/// value (a float never equals one). Every part is read as a `Value` would read it (the same
/// checks, the same errors); nothing is kept.
#[derive(Clone, Copy)]
pub(crate) struct Equals(pub Fixed);

impl<'de> DeserializeSeed<'de> for Equals {
    type Value = bool;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Equals {
    type Value = bool;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any valid JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_i64<E>(self, v: i64) -> Result<bool, E> {
        Ok(self.0 == Fixed::Int(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<bool, E> {
        Ok(i64::try_from(v).is_ok_and(|v| self.0 == Fixed::Int(v)))
    }
    fn visit_f64<E>(self, _: f64) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_str<E>(self, v: &str) -> Result<bool, E> {
        Ok(matches!(self.0, Fixed::Str(s) if s == v))
    }
    fn visit_unit<E>(self) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_none<E>(self) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        let Fixed::Arr(items) = self.0 else {
            return skip_seq(seq).map(|()| false);
        };
        let mut equal = true;
        let mut index = 0;
        loop {
            let element = match items.get(index) {
                Some(item) => seq.next_element_seed(Equals(*item))?,
                None => seq.next_element::<Lenient<Skip>>()?.map(|_| false),
            };
            let Some(element) = element else { break };
            equal &= element;
            index += 1;
        }
        Ok(equal && index == items.len())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        let fields = self.0.fields();
        let mut seen = FixedFields::new(fields.len());
        let mut first = true;
        while let Some(key) = map.next_key_seed(FixedKey { fields, first })? {
            match key {
                FixedKeyOf::RawValue => {
                    // As `raw_value` reads it for a view: the object stands for the JSON its
                    // string holds.
                    let text = map.next_value_seed(RawText)?;
                    let mut reader = serde_json::Deserializer::from_reader(text.as_bytes());
                    return self
                        .deserialize(&mut reader)
                        .and_then(|equal| reader.end().map(|()| equal))
                        .map_err(de::Error::custom);
                }
                FixedKeyOf::Field(i) => seen.set(i, map.next_value_seed(Equals(fields[i].1))?),
                FixedKeyOf::Other => {
                    map.next_value::<Lenient<Skip>>()?;
                    seen.other = true;
                }
            }
            first = false;
        }
        Ok(matches!(self.0, Fixed::Obj(_)) && seen.all())
    }
}

/// Which keys of a [`Fixed`] object an object of the body had, and whether they were equal (the
/// last occurrence counts, as in a `Value`).
struct FixedFields {
    equal: Vec<Option<bool>>,
    /// A key the fixed object does not have.
    other: bool,
}

impl FixedFields {
    fn new(len: usize) -> Self {
        FixedFields {
            equal: vec![None; len],
            other: false,
        }
    }

    fn set(&mut self, i: usize, equal: bool) {
        if let Some(slot) = self.equal.get_mut(i) {
            *slot = Some(equal);
        }
    }

    fn all(&self) -> bool {
        !self.other && self.equal.iter().all(|e| *e == Some(true))
    }
}

enum FixedKeyOf {
    RawValue,
    Field(usize),
    Other,
}

/// A key of an object compared with a [`Fixed`] object: which of its fields it is.
struct FixedKey {
    fields: &'static [(&'static str, Fixed)],
    first: bool,
}

impl<'de> DeserializeSeed<'de> for FixedKey {
    type Value = FixedKeyOf;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<FixedKeyOf, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl Visitor<'_> for FixedKey {
    type Value = FixedKeyOf;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string key")
    }
    fn visit_str<E>(self, key: &str) -> Result<FixedKeyOf, E> {
        if self.first && key == RAW_VALUE_TOKEN {
            return Ok(FixedKeyOf::RawValue);
        }
        Ok(self
            .fields
            .iter()
            .position(|(k, _)| *k == key)
            .map_or(FixedKeyOf::Other, FixedKeyOf::Field))
    }
}

/// An entry of a pod spec's `volumes`: its name, and whether it is, as JSON, exactly the volume
/// the injection adds for the agent's token ([`super::mutate::TOKEN_VOLUME_JSON`]).
#[derive(Clone, Debug, Default)]
pub(crate) struct Volume<'a> {
    /// Fields present with another JSON type than the rules need.
    pub wrong: Wrong,
    pub name: Option<Str<'a>>,
    pub is_token_volume: bool,
}

/// Numbers the keys of a volume by the token volume's fields (from 1; any other key is
/// `u8::MAX`, read and remembered).
fn token_volume_key(key: &str) -> u8 {
    super::mutate::TOKEN_VOLUME_JSON
        .fields()
        .iter()
        .position(|(k, _)| *k == key)
        .and_then(|i| u8::try_from(i + 1).ok())
        .unwrap_or(u8::MAX)
}

impl<'de> Shape<'de> for Volume<'de> {
    const EXPECTED: &'static str = "an object";
    fn from_map<A: MapAccess<'de>>(mut map: A) -> Result<Option<Self>, A::Error> {
        let fields = super::mutate::TOKEN_VOLUME_JSON.fields();
        let mut v = Volume::default();
        let mut seen = FixedFields::new(fields.len());
        let raw = walk_object::<Self, A>(&mut map, token_volume_key, |n, map| {
            let i = usize::from(n).wrapping_sub(1);
            match fields.get(i) {
                Some(("name", expected)) => {
                    v.name = checked(map, &mut v.wrong, "name")?;
                    let equal = matches!((&v.name, expected), (Some(n), Fixed::Str(e)) if n == e);
                    seen.set(i, equal);
                }
                Some((_, expected)) => seen.set(i, map.next_value_seed(Equals(*expected))?),
                None => {
                    map.next_value::<Lenient<Skip>>()?;
                    seen.other = true;
                }
            }
            Ok(())
        })?;
        Ok(match raw {
            Some(raw) => raw,
            None => {
                v.is_token_volume = seen.all();
                Some(v)
            }
        })
    }
}

impl<'a> List<Volume<'a>> {
    /// Some entry is the injection's token volume, exactly.
    pub fn has_token_volume(&self) -> bool {
        self.0.iter().any(|v| v.is_token_volume)
    }

    /// The indices of the entries named as the injection's token volume that are not it.
    pub fn foreign_token_volumes(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.iter().enumerate().filter_map(|(i, v)| {
            (v.name.as_deref() == Some(super::mutate::TOKEN_VOLUME) && !v.is_token_volume)
                .then_some(i)
        })
    }
}

/// One `ports` entry of a container.
#[derive(Clone, Debug, Default)]
pub(crate) struct Port<'a> {
    /// Fields present with another JSON type than the rules need.
    pub wrong: Wrong,
    pub name: Option<Str<'a>>,
    pub container_port: Option<i64>,
}

object_view!(Port {
    "name" => name: checked,
    "containerPort" => container_port: checked,
});

/// Decodes an AdmissionReview body. `Ok(None)` for JSON that is not an object; `Err` exactly when
/// `serde_json::from_slice::<Value>(body)` fails, with its error.
pub(crate) fn parse_review(body: &[u8]) -> Result<Option<Review<'_>>, serde_json::Error> {
    let (review, truncated) = with_budget(|| match std::str::from_utf8(body) {
        // Valid UTF-8 text: serde_json's `str` reader checks the same as its slice reader, without
        // checking each string's UTF-8 again.
        Ok(text) => serde_json::from_str::<Lenient<Review<'_>>>(text).map(|l| l.0),
        Err(_) => serde_json::from_slice::<Lenient<Review<'_>>>(body).map(|l| l.0),
    });
    let mut review = review?;
    if truncated && let Some(request) = review.as_mut().and_then(|r| r.request.as_mut()) {
        for object in [&mut request.object, &mut request.old_object]
            .into_iter()
            .flatten()
        {
            object.truncated = true;
        }
    }
    Ok(review)
}

/// `spec.replicatedJobs` of `request.object` and `request.oldObject` as written in a body (each
/// present only when every level is an object and `replicatedJobs` an array, else empty).
#[derive(Debug, Default)]
pub(crate) struct RawJobs<'a> {
    pub object: Vec<&'a RawValue>,
    pub old_object: Vec<&'a RawValue>,
}

/// Reads [`RawJobs`] from a body that [`parse_review`] accepted. `None` where the text of the jobs
/// is not in the body (an enclosing object is a raw-value object: its JSON is in a string).
pub(crate) fn raw_jobs(body: &[u8]) -> Option<RawJobs<'_>> {
    let text = std::str::from_utf8(body).ok()?;
    let (review, _) = with_budget(|| serde_json::from_str::<Lenient<RawReview<'_>>>(text));
    let review = review.ok()?.0?;
    fn jobs(o: Option<RawJobSet<'_>>) -> Vec<&RawValue> {
        o.and_then(|o| o.spec)
            .and_then(|s| s.replicated_jobs)
            .map(|l| l.0)
            .unwrap_or_default()
    }
    let request = review.request.unwrap_or_default();
    Some(RawJobs {
        object: jobs(request.object),
        old_object: jobs(request.old_object),
    })
}

use serde_json::value::RawValue;

/// The length of `request.object` as written in a body that [`parse_review`] accepted; `None`
/// where it is not in the body's text (no such object, or inside a raw-value object's string).
pub(crate) fn object_len(body: &[u8]) -> Option<usize> {
    #[derive(Default)]
    struct Review<'a> {
        request: Option<Request<'a>>,
    }
    object_view!(
        Review,
        |key| match key {
            "request" => 1,
            _ => 0,
        },
        |v, _field, map| v.request = lenient(map)?
    );
    #[derive(Default)]
    struct Request<'a> {
        object: Option<&'a RawValue>,
    }
    object_view!(
        Request,
        |key| match key {
            "object" => 1,
            _ => 0,
        },
        |v, _field, map| v.object = Some(map.next_value()?)
    );
    let text = std::str::from_utf8(body).ok()?;
    let review = serde_json::from_str::<Lenient<Review<'_>>>(text).ok()?.0?;
    Some(review.request?.object?.get().len())
}

#[derive(Default)]
struct RawReview<'a> {
    request: Option<RawRequest<'a>>,
}

object_view!(
    RawReview,
    |key| match key {
        "request" => 1,
        _ => 0,
    },
    |v, _field, map| v.request = lenient(map)?
);

#[derive(Default)]
struct RawRequest<'a> {
    object: Option<RawJobSet<'a>>,
    old_object: Option<RawJobSet<'a>>,
}

object_view!(
    RawRequest,
    |key| match key {
        "object" => 1,
        "oldObject" => 2,
        _ => 0,
    },
    |v, field, map| match field {
        1 => v.object = lenient(map)?,
        _ => v.old_object = lenient(map)?,
    }
);

#[derive(Default)]
struct RawJobSet<'a> {
    spec: Option<RawSpec<'a>>,
}

object_view!(
    RawJobSet,
    |key| match key {
        "spec" => 1,
        _ => 0,
    },
    |v, _field, map| v.spec = lenient(map)?
);

#[derive(Default)]
struct RawSpec<'a> {
    replicated_jobs: Option<RawList<'a>>,
}

object_view!(
    RawSpec,
    |key| match key {
        "replicatedJobs" => 1,
        _ => 0,
    },
    |v, _field, map| v.replicated_jobs = lenient(map)?
);

/// An array's elements as written. Only in a body's text: read from anything else (a raw-value
/// object's JSON), it fails, and so does [`raw_jobs`].
struct RawList<'a>(Vec<&'a RawValue>);

impl<'de> Shape<'de> for RawList<'de> {
    fn from_seq<A: SeqAccess<'de>>(mut seq: A) -> Result<Option<Self>, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<&'de RawValue>()? {
            if take_element() {
                items.push(item);
            }
        }
        Ok(Some(RawList(items)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::mutate::{TOKEN_VOLUME_JSON, token_volume};

    /// A volume read from its text and from the `Value` of that text: the same answer, and the
    /// same as `Value`'s `==` with the token volume (or the same error).
    fn read_both(text: &str) -> Result<bool, String> {
        let from_bytes = serde_json::from_str::<Lenient<Volume<'_>>>(text)
            .map(|v| v.0.is_some_and(|v| v.is_token_volume))
            .map_err(|e| e.to_string());
        let value = serde_json::from_str::<Value>(text).map_err(|e| e.to_string());
        let from_value = value
            .as_ref()
            .map(|v| Lenient::<Volume<'_>>::from_value(v).is_some_and(|v| v.is_token_volume));
        assert_eq!(from_bytes, from_value.map_err(Clone::clone), "{text}");
        if let Ok(v) = &value {
            assert_eq!(from_value, Ok(*v == token_volume()), "{text}");
        }
        from_bytes
    }

    /// A value of the wrong type is reported as the type `Value` sees, also when a raw value is
    /// nested in it (it used to report the nested raw value's type).
    #[test]
    fn a_raw_value_nested_in_a_wrong_type_does_not_change_the_type_reported() {
        let raw5 = "{\"$serde_json::private::RawValue\":\"5\"}";
        for (text, want) in [
            (format!("{{\"a\":{raw5}}}"), Kind::Object),
            (format!("{{\"a\":[{raw5}],\"b\":1}}"), Kind::Object),
            (format!("[{{\"a\":{raw5}}}]"), Kind::Array),
            (raw5.to_owned(), Kind::Number),
            (
                format!(
                    "{{\"$serde_json::private::RawValue\":{}}}",
                    Value::from(format!("{{\"a\":{raw5}}}"))
                ),
                Kind::Object,
            ),
        ] {
            let from_bytes = serde_json::from_str::<Checked<Str<'_>>>(&text)
                .expect("json")
                .0;
            let value: Value = serde_json::from_str(&text).expect("json");
            let from_value = Checked::<Str<'_>>::deserialize(&value).expect("value").0;
            assert_eq!(from_bytes, Err(want), "{text}");
            assert_eq!(from_value, Err(want), "{text}");
        }
    }

    #[test]
    fn the_token_volume_is_recognised_exactly_as_a_value_compares() {
        assert_eq!(TOKEN_VOLUME_JSON.to_value(), token_volume());
        let exact = token_volume().to_string();
        assert_eq!(read_both(&exact), Ok(true));
        // Keys in another order, and escapes in a key and a value: still it.
        let reordered = exact
            .replacen("\"name\":\"jobset-inplace-agent-token\",", "", 1)
            .replacen(
                '{',
                "{\"n\\u0061me\":\"jobset-inplace-agent-tok\\u0065n\",",
                1,
            );
        assert_ne!(reordered, exact);
        assert_eq!(read_both(&reordered), Ok(true));
        let raw = |inner: &str| {
            format!(
                "{{\"$serde_json::private::RawValue\":{}}}",
                Value::from(inner)
            )
        };
        let projected = token_volume()["projected"].to_string();
        let sources = token_volume()["projected"]["sources"].to_string();
        for (text, want) in [
            // A raw-value object stands for the JSON it holds, at any depth.
            (raw(&exact), Ok(true)),
            (
                format!(
                    "{{\"name\":\"jobset-inplace-agent-token\",\"projected\":{}}}",
                    raw(&projected)
                ),
                Ok(true),
            ),
            (exact.replacen(&sources, &raw(&sources), 1), Ok(true)),
            (
                format!(
                    "{{\"name\":\"jobset-inplace-agent-token\",\"projected\":{}}}",
                    raw("[1]")
                ),
                Ok(false),
            ),
            // The last of duplicate keys counts.
            (exact.replacen('{', "{\"projected\":{},", 1), Ok(true)),
            (
                format!("{},\"projected\":{{}}}}", &exact[..exact.len() - 1]),
                Ok(false),
            ),
            // A float is not an integer; one more element, key or source is not it.
            (exact.replacen("420", "420.0", 1), Ok(false)),
            (exact.replacen("3607", "3607.0", 1), Ok(false)),
            (
                exact.replacen("\"token\"}", "\"token\",\"audience\":\"x\"}", 1),
                Ok(false),
            ),
            (
                exact.replacen("\"ca.crt\"}]", "\"ca.crt\"},{}]", 1),
                Ok(false),
            ),
            (
                format!("{},\"emptyDir\":{{}}}}", &exact[..exact.len() - 1]),
                Ok(false),
            ),
            (
                exact.replacen("\"token\"}", "\"token\"},\"emptyDir\":{}", 1),
                Ok(false),
            ),
            (
                "{\"name\":\"jobset-inplace-agent-token\"}".to_owned(),
                Ok(false),
            ),
            (
                "{\"name\":\"jobset-inplace-agent-token\",\"emptyDir\":{}}".to_owned(),
                Ok(false),
            ),
            ("{\"name\":5}".to_owned(), Ok(false)),
        ] {
            assert_eq!(read_both(&text), want, "{text}");
        }
        // Broken raw values: the error a `Value` gives.
        for text in [
            format!("{{\"name\":\"x\",\"projected\":{}}}", raw("{")),
            format!(
                "{{\"name\":\"x\",\"projected\":{}}}",
                "{\"$serde_json::private::RawValue\":5}"
            ),
            format!(
                "{{\"name\":\"x\",\"projected\":{{\"sources\":{}}}}}",
                raw("[1] 2")
            ),
        ] {
            assert!(read_both(&text).is_err(), "{text}");
        }
    }
}
