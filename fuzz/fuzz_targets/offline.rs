//! Fuzz target `offline`: [`jobset_inplace_fuzz::offline`]. Under AFL++ (`--features afl`) it reads the
//! fuzzer's inputs; otherwise it replays the files (or directories) given as arguments, or stdin.
#![forbid(unsafe_code)]

#[cfg(feature = "afl")]
fn main() {
    afl::fuzz!(|data: &[u8]| jobset_inplace_fuzz::offline(data));
}

#[cfg(not(feature = "afl"))]
fn main() -> std::process::ExitCode {
    jobset_inplace_fuzz::replay(jobset_inplace_fuzz::offline)
}
