# syntax=docker/dockerfile:1
#
# jobset-inplace: one static binary (webhook, reconciler, agent, certs, inject, check, review) on
# an empty base image. Build: docker build -t ghcr.io/jobset-inplace/jobset-inplace:0.1.0 .
# scripts/check-image.sh runs the builder stage's commands without Docker and checks the result.

FROM rust:1.95-bookworm AS builder

# musl-gcc for the C and assembly parts of ring (TLS and certificate crypto).
RUN apt-get update \
    && apt-get install -y --no-install-recommends musl-tools \
    && rm -rf /var/lib/apt/lists/*
RUN rustup target add x86_64-unknown-linux-musl

WORKDIR /src

# Dependencies first, in their own layer: the manifests with stub sources, so that a change to
# src/ does not rebuild them. The stub's own artifacts are removed so the real build redoes them
# (COPY keeps the sources' old modification times, which cargo would take for up to date).
# benches/ is there because Cargo.toml declares its targets (only the binary is built). The
# workspace's other member, the test kit (a dev-dependency, never built here), needs only its
# manifest and an empty library for cargo to load the workspace; that stub stays.
COPY Cargo.toml Cargo.lock ./
COPY testkit/Cargo.toml ./testkit/
COPY benches ./benches
RUN mkdir -p src testkit/src \
    && echo 'fn main() {}' > src/main.rs \
    && touch src/lib.rs testkit/src/lib.rs \
    && cargo build --release --locked --target x86_64-unknown-linux-musl --bin jobset-inplace \
    && rm -rf src \
        target/x86_64-unknown-linux-musl/release/.fingerprint/jobset-inplace-* \
        target/x86_64-unknown-linux-musl/release/deps/jobset_inplace-* \
        target/x86_64-unknown-linux-musl/release/deps/libjobset_inplace-* \
        target/x86_64-unknown-linux-musl/release/jobset-inplace

COPY src ./src
RUN cargo build --release --locked --target x86_64-unknown-linux-musl --bin jobset-inplace

FROM scratch

LABEL org.opencontainers.image.title="jobset-inplace" \
      org.opencontainers.image.description="Fast in-place group restarts for JobSets: admission webhook, epoch reconciler and agent sidecar in one binary" \
      org.opencontainers.image.licenses="Apache-2.0"

COPY --from=builder /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=builder /src/target/x86_64-unknown-linux-musl/release/jobset-inplace /jobset-inplace

# The numeric user the manifests run as (Pod Security `restricted`: runAsNonRoot).
USER 65532:65532
ENTRYPOINT ["/jobset-inplace"]
