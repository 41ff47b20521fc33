//! One finding of `doctor` and its preflight checks: which check, how it came out, what was
//! found and what to do. Below `doctor.rs` and the files of its checks (`preflight.rs`,
//! `kueue.rs`), which all make findings.

use serde::Serialize;

/// How one check came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Ok,
    /// Works today, needs attention soon (a certificate near expiry).
    Warn,
    Fail,
}

/// One line of the report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub check: String,
    pub verdict: Outcome,
    /// What was found, and why it passes or not.
    pub detail: String,
    /// What to do about a warning or a failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Finding {
    pub fn new(check: impl Into<String>, verdict: Outcome, detail: impl Into<String>) -> Self {
        Finding {
            check: check.into(),
            verdict,
            detail: detail.into(),
            fix: None,
        }
    }

    /// The same finding with what to do about it.
    pub fn fix(self, fix: impl Into<String>) -> Self {
        Finding {
            fix: Some(fix.into()),
            ..self
        }
    }

    /// `ok   webhook-configurations: ...`, and `     fix: ...` on a second line.
    pub fn render(&self) -> String {
        let tag = match self.verdict {
            Outcome::Ok => "ok  ",
            Outcome::Warn => "warn",
            Outcome::Fail => "FAIL",
        };
        match &self.fix {
            Some(fix) => format!("{tag} {}: {}\n     fix: {fix}", self.check, self.detail),
            None => format!("{tag} {}: {}", self.check, self.detail),
        }
    }
}
