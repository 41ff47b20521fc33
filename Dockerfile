# syntax=docker/dockerfile:1
#
# jobset-inplace: one static binary (webhook, reconciler, agent, certs, inject, check, review) on
# an empty base image, for linux/amd64 and linux/arm64. Build:
#   docker buildx build --platform linux/amd64,linux/arm64 \
#     -t ghcr.io/jobset-inplace/jobset-inplace:0.1.0 .
# The builder runs on the build machine's platform and cross-compiles for TARGETARCH (amd64 ->
# x86_64-unknown-linux-musl, arm64 -> aarch64-unknown-linux-musl): no emulated compiler. The
# build machine must be amd64 (its musl-gcc and Debian's aarch64 cross gcc are the C compilers).
# scripts/check-image.sh runs the builder stage's commands without Docker, for both
# architectures, and checks the results (the arm64 one under qemu-user).

# The builder image pinned by digest (the tag's multi-platform index as resolved on Docker Hub): a
# tag can be moved to other content, a digest cannot. To update: `docker buildx imagetools inspect
# rust:1.95-bookworm` (the first "Digest:"), then rebuild and run scripts/check-image.sh.
FROM --platform=$BUILDPLATFORM rust:1.95-bookworm@sha256:6258907abe69656e41cd992e0b705cdcfabcbbe3db374f92ed2d47121282d4a1 AS builder
# Set by BuildKit from --platform; a plain `docker build` leaves it empty, which means amd64.
ARG TARGETARCH

# C compilers for the C and assembly parts of ring (TLS and certificate crypto): musl-gcc for
# x86_64, the Debian aarch64 cross gcc for aarch64 (Rust's musl targets bring their own musl
# libc and start files, so the gcc only compiles ring and drives the link). Each package pinned
# to its exact version (bookworm's; musl-tools pins musl-dev by its own dependency): a rebuild
# installs the same compilers, or fails. To update: `apt-cache policy NAME` in the builder
# image, then rebuild and run scripts/check-image.sh (which checks this machine has the same).
RUN apt-get update \
    && apt-get install -y --no-install-recommends musl-tools=1.2.3-1 musl-dev=1.2.3-1 gcc-aarch64-linux-gnu=4:12.2.0-3 libc6-dev-arm64-cross=2.36-8cross1 \
    && rm -rf /var/lib/apt/lists/*
ENV CC_aarch64_unknown_linux_musl=aarch64-linux-gnu-gcc
ENV CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER=aarch64-linux-gnu-gcc

WORKDIR /src

# The Rust target of TARGETARCH, in .target for the steps below.
RUN case "${TARGETARCH:-amd64}" in \
        amd64) echo x86_64-unknown-linux-musl ;; \
        arm64) echo aarch64-unknown-linux-musl ;; \
        *) echo "unsupported TARGETARCH: $TARGETARCH" >&2; exit 1 ;; \
    esac > .target \
    && rustup target add "$(cat .target)"

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
    && cargo build --release --locked --target "$(cat .target)" --bin jobset-inplace \
    && rm -rf src \
        target/"$(cat .target)"/release/.fingerprint/jobset-inplace-* \
        target/"$(cat .target)"/release/deps/jobset_inplace-* \
        target/"$(cat .target)"/release/deps/libjobset_inplace-* \
        target/"$(cat .target)"/release/jobset-inplace

COPY src ./src
# The binary lands in out/ whatever the architecture, so the final stage names one path.
RUN cargo build --release --locked --target "$(cat .target)" --bin jobset-inplace \
    && mkdir -p out \
    && cp target/"$(cat .target)"/release/jobset-inplace out/jobset-inplace

FROM scratch

LABEL org.opencontainers.image.title="jobset-inplace" \
      org.opencontainers.image.description="Fast in-place group restarts for JobSets: admission webhook, epoch reconciler and agent sidecar in one binary" \
      org.opencontainers.image.licenses="Apache-2.0"

COPY --from=builder /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=builder /src/out/jobset-inplace /jobset-inplace

# The numeric user the manifests run as (Pod Security `restricted`: runAsNonRoot).
USER 65532:65532
ENTRYPOINT ["/jobset-inplace"]
