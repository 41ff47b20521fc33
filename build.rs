//! What `--version` says besides the package's version: the commit the binary was built from and
//! the build's date (issue 47). The commit: `JOBSET_INPLACE_COMMIT` when set (a build without
//! the repository), else `git rev-parse HEAD`, else `unknown`. (The image's build has no
//! build.rs in its context, .dockerignore: its binary says `unknown` for both.) The date (UTC, `YYYY-MM-DD`): `SOURCE_DATE_EPOCH` when set
//! (reproducible builds), else the day this script ran.

use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (out.status.success() && !text.is_empty()).then_some(text)
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
    // The day, from humantime's RFC 3339 rendering (the crate the product parses durations with).
    let built = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map_or_else(SystemTime::now, |s| UNIX_EPOCH + Duration::from_secs(s));
    let day: String = humantime::format_rfc3339_seconds(built)
        .to_string()
        .chars()
        .take(10)
        .collect();
    let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();
    println!("cargo:rustc-env=JOBSET_INPLACE_VERSION={version} (commit {commit}, built {day})");
}
