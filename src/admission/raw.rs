//! The raw text of a review's JobSets (docs/architecture.md, "Admission"): the replicatedJobs of
//! `request.object` and `request.oldObject` as written, for the UPDATE ratchet to compare without
//! decoding them, and the length of `request.object` as written.

use serde::de::SeqAccess;
use serde_json::value::RawValue;

use super::lenient::*;

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
