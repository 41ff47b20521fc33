//! The warnings of a validation (docs/architecture.md, "Admission"), and the clipping of every
//! message ([`clip`]): each warning clipped, at most [`MAX_WARNINGS`] of them; a warning said of
//! several replicatedJobs alike is said once, naming the first of them and how many in all.

use super::Validation;

/// At most this many warnings are reported; the rest are counted.
pub const MAX_WARNINGS: usize = 20;
/// A violation message or warning longer than this is cut (at a character boundary) and ends
/// with "…": messages quote values from the request.
pub const MAX_MESSAGE_BYTES: usize = 512;

/// `s` cut to at most [`MAX_MESSAGE_BYTES`] (at a character boundary, ending with "…").
pub(crate) fn clip(mut s: String) -> String {
    if s.len() > MAX_MESSAGE_BYTES {
        let mut end = MAX_MESSAGE_BYTES - '…'.len_utf8();
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push('…');
    }
    s
}

/// How many replicatedJobs a grouped warning names (the first ones; the rest are counted).
const MAX_GROUPED_JOBS: usize = 8;

/// A warning said of several replicatedJobs: where it is in the warnings, its text after
/// `spec.replicatedJobs[N]`, the first indices it applies to and how many in all.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct WarningGroup {
    at: usize,
    tail: String,
    first: Vec<usize>,
    count: usize,
}

/// `spec.replicatedJobs[N]rest` → (N, rest).
fn split_job_index(message: &str) -> Option<(usize, &str)> {
    let rest = message.strip_prefix("spec.replicatedJobs[")?;
    let end = rest.find(']')?;
    Some((rest[..end].parse().ok()?, &rest[end + 1..]))
}

/// Adds a warning; one that says of a replicatedJob what a kept one says of another is folded
/// into it (`spec.replicatedJobs[0, 1, 2 and 5 more]...`).
pub(crate) fn warning(out: &mut Validation, message: String) {
    let Some((index, tail)) = split_job_index(&message) else {
        return ungrouped_warning(out, message);
    };
    let tail = clip(tail.to_owned());
    if let Some(group) = out.groups.iter_mut().find(|g| g.tail == tail) {
        if group.first.len() < MAX_GROUPED_JOBS {
            group.first.push(index);
        }
        group.count += 1;
        return;
    }
    if out.warnings.len() >= MAX_WARNINGS {
        out.more_warnings += 1;
        return;
    }
    out.groups.push(WarningGroup {
        at: out.warnings.len(),
        tail,
        first: vec![index],
        count: 1,
    });
    // Written by `finish_groups`.
    out.warnings.push(String::new());
}

pub(crate) fn ungrouped_warning(out: &mut Validation, message: String) {
    if out.warnings.len() >= MAX_WARNINGS {
        out.more_warnings += 1;
        return;
    }
    out.warnings.push(clip(message));
}

/// Writes the grouped warnings.
pub(crate) fn finish_groups(out: &mut Validation) {
    for group in std::mem::take(&mut out.groups) {
        let mut jobs = group
            .first
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        if group.count > group.first.len() {
            jobs.push_str(&format!(" and {} more", group.count - group.first.len()));
        }
        if let Some(w) = out.warnings.get_mut(group.at) {
            *w = format!("spec.replicatedJobs[{jobs}]{}", group.tail);
        }
    }
}
