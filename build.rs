//! What `--version` says besides the package's version: the commit the binary was built from and
//! the build's date (issue 47). The commit: `JOBSET_INPLACE_COMMIT` when set (a build without
//! the repository), else `git rev-parse HEAD`, else `unknown`. (The image's build has no
//! build.rs in its context, .dockerignore: its binary says `unknown` for both.) The date (UTC, `YYYY-MM-DD`): `SOURCE_DATE_EPOCH` when set
//! (reproducible builds), else the day this script ran.

use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (out.status.success() && !text.is_empty()).then_some(text)
}

/// Days since 1970-01-01 as a proleptic Gregorian date (H. Hinnant's civil_from_days).
fn civil(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=JOBSET_INPLACE_COMMIT");
    println!("cargo:rerun-if-env-changed=SOURCE_DATE_EPOCH");
    let commit = match std::env::var("JOBSET_INPLACE_COMMIT") {
        Ok(commit) if !commit.trim().is_empty() => commit.trim().to_owned(),
        _ => match git(&["rev-parse", "HEAD"]) {
            Some(head) => {
                // A new commit or checkout runs this again: the files of HEAD and of its branch
                // (a packed branch has no file: then HEAD's alone).
                let mut files = vec![git(&["rev-parse", "--git-path", "HEAD"])];
                if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
                    files.push(git(&["rev-parse", "--git-path", &branch]));
                }
                for file in files.into_iter().flatten() {
                    if std::path::Path::new(&file).exists() {
                        println!("cargo:rerun-if-changed={file}");
                    }
                }
                head
            }
            None => "unknown".to_owned(),
        },
    };
    let seconds = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
        .or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .ok()
                .and_then(|d| i64::try_from(d.as_secs()).ok())
        })
        .unwrap_or(0);
    let (y, m, d) = civil(seconds.div_euclid(86_400));
    let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();
    println!(
        "cargo:rustc-env=JOBSET_INPLACE_VERSION={version} (commit {commit}, built {y:04}-{m:02}-{d:02})"
    );
}
