//! The lenient JSON reader admission reads bodies with (docs/architecture.md, "Admission"):
//! a value is decoded into a [`Shape`] in one pass straight from the body (or from a [`Value`],
//! for the offline commands): sparse (only the fields a shape names), borrowed (strings point into
//! the body unless they hold escapes) and lenient (a field of an unexpected JSON type reads as
//! absent, never as an error), with list budgets and the [`Fixed`] values a body is compared with.
//! Nothing here knows what a JobSet is; the views are in `view.rs`. serde does the parsing; what
//! no serde derive does is answer exactly as a `Value` would for every body, which is why the
//! visitors are ours. The rules used to read a `serde_json::Value` of the whole body; they must answer the same for
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
pub(crate) fn take_element() -> bool {
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
pub(crate) fn checked<'de, T: Shape<'de>, A: MapAccess<'de>>(
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
    pub(crate) fn record(&mut self, index: usize, kind: Kind) {
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
pub(crate) fn lenient<'de, T: Shape<'de>, A: MapAccess<'de>>(
    map: &mut A,
) -> Result<Option<T>, A::Error> {
    map.next_value::<Lenient<T>>().map(|l| l.0)
}

/// [`lenient`] as the common form of `object_view!` calls it.
pub(crate) fn lenient_in<'de, T: Shape<'de>, A: MapAccess<'de>>(
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
pub(crate) fn present<'de, T: Shape<'de>, A: MapAccess<'de>>(
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
pub(crate) fn any_value<'de, A: MapAccess<'de>>(
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
        impl<'de> $crate::admission::lenient::Shape<'de> for $name<'de> {
            const EXPECTED: &'static str = "an object";
            fn from_map<A: serde::de::MapAccess<'de>>(mut map: A) -> Result<Option<Self>, A::Error> {
                let mut $view = $name::default();
                let raw = $crate::admission::lenient::walk_object::<Self, A>(
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
pub(crate) use object_view;

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

    pub(crate) fn fields(self) -> &'static [(&'static str, Fixed)] {
        match self {
            Fixed::Obj(fields) => fields,
            _ => &[],
        }
    }
}

/// Reads one JSON value and tells whether it equals a [`Fixed`] as `Value`s compare (`==`): the
/// same keys (the last of duplicates counts), the same elements in order, integers of the same
/// value (a float never equals one). Every part is read as a `Value` would read it (the same
/// checks, the same errors); nothing is kept. With a [`Find`], it also notes whether an object
/// key of that name occurs at any depth of the value.
#[derive(Clone, Copy)]
pub(crate) struct Equals<'f>(pub Fixed, pub Option<&'f Find>);

/// An object key looked for at any depth of a value [`Equals`] reads (for example a
/// `serviceAccountToken` source anywhere in a volume's `projected`).
#[derive(Debug)]
pub(crate) struct Find {
    pub key: &'static str,
    pub found: std::cell::Cell<bool>,
}

impl Equals<'_> {
    /// Reads a value nothing is expected of: it equals nothing, but a [`Find`] still looks in it.
    fn skip_element<'de, A: SeqAccess<'de>>(self, seq: &mut A) -> Result<Option<bool>, A::Error> {
        match self.1 {
            Some(_) => Ok(seq
                .next_element_seed(Equals(Fixed::Arr(&[]), self.1))?
                .map(|_| false)),
            None => Ok(seq.next_element::<Lenient<Skip>>()?.map(|_| false)),
        }
    }
}

impl<'de> DeserializeSeed<'de> for Equals<'_> {
    type Value = bool;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Equals<'_> {
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
        let items = match self.0 {
            Fixed::Arr(items) => Some(items),
            _ => None,
        };
        let mut equal = items.is_some();
        let mut index = 0;
        loop {
            let element = match items.and_then(|items| items.get(index)) {
                Some(item) => seq.next_element_seed(Equals(*item, self.1))?,
                None => self.skip_element(&mut seq)?,
            };
            let Some(element) = element else { break };
            equal &= element;
            index += 1;
        }
        Ok(equal && items.is_some_and(|items| index == items.len()))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        let fields = self.0.fields();
        let mut seen = FixedFields::new(fields.len());
        let mut first = true;
        while let Some((key, wanted)) = map.next_key_seed(FixedKey {
            fields,
            first,
            find: self.1.map(|f| f.key),
        })? {
            if wanted && let Some(find) = self.1 {
                find.found.set(true);
            }
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
                FixedKeyOf::Field(i) => {
                    seen.set(i, map.next_value_seed(Equals(fields[i].1, self.1))?);
                }
                FixedKeyOf::Other => {
                    if self.1.is_some() {
                        map.next_value_seed(Equals(Fixed::Arr(&[]), self.1))?;
                    } else {
                        map.next_value::<Lenient<Skip>>()?;
                    }
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
pub(crate) struct FixedFields {
    equal: Vec<Option<bool>>,
    /// A key the fixed object does not have.
    pub(crate) other: bool,
}

impl FixedFields {
    pub(crate) fn new(len: usize) -> Self {
        FixedFields {
            equal: vec![None; len],
            other: false,
        }
    }

    pub(crate) fn set(&mut self, i: usize, equal: bool) {
        if let Some(slot) = self.equal.get_mut(i) {
            *slot = Some(equal);
        }
    }

    pub(crate) fn all(&self) -> bool {
        !self.other && self.equal.iter().all(|e| *e == Some(true))
    }
}

enum FixedKeyOf {
    RawValue,
    Field(usize),
    Other,
}

/// A key of an object compared with a [`Fixed`] object: which of its fields it is, and whether
/// it is the key a [`Find`] looks for.
struct FixedKey {
    fields: &'static [(&'static str, Fixed)],
    first: bool,
    find: Option<&'static str>,
}

impl<'de> DeserializeSeed<'de> for FixedKey {
    type Value = (FixedKeyOf, bool);
    fn deserialize<D: Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<(FixedKeyOf, bool), D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl Visitor<'_> for FixedKey {
    type Value = (FixedKeyOf, bool);
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string key")
    }
    fn visit_str<E>(self, key: &str) -> Result<(FixedKeyOf, bool), E> {
        if self.first && key == RAW_VALUE_TOKEN {
            return Ok((FixedKeyOf::RawValue, false));
        }
        let wanted = self.find == Some(key);
        Ok((
            self.fields
                .iter()
                .position(|(k, _)| *k == key)
                .map_or(FixedKeyOf::Other, FixedKeyOf::Field),
            wanted,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
