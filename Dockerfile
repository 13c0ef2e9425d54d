# syntax=docker/dockerfile:1
# One image with every sluice binary:
#   /usr/local/bin/sluice-rollout-weights, sluice-wave-gate, sluice-revert,
#   sluice-upgrade-revisions (the operators; the chart runs one per Deployment) and
#   /usr/local/bin/kubectl-sluice (the kubectl plugin, for `kubectl sluice bundle` in CI jobs).
#
#   docker build -t sluice:0.1.0 .
#
# The builder compiles the workspace once (release, Cargo.lock as committed); the runtime stage is
# Debian slim with only CA certificates (registries, Prometheus, Git over TLS) and git (revert
# branches and promotion changes are pushed with the git CLI), running as the numeric non-root
# user the chart's securityContext names (65532).

ARG RUST_VERSION=1.95
ARG DEBIAN_RELEASE=bookworm

FROM rust:${RUST_VERSION}-${DEBIAN_RELEASE} AS builder
# aws-lc-sys (the TLS provider of kube and reqwest) and vendored C sources build with cmake and clang.
RUN apt-get update \
 && apt-get install -y --no-install-recommends cmake clang \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY crates ./crates
COPY operators ./operators
# Every workspace member must be present for cargo to load the workspace; none of these is built
# into the image (no shipped binary depends on the test world).
COPY testing ./testing
COPY e2e/suite ./e2e/suite
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked \
      -p sluice-rollout-weights -p sluice-wave-gate -p sluice-revert -p sluice-upgrade-revisions \
      -p kubectl-sluice \
 && mkdir -p /out \
 && for bin in sluice-rollout-weights sluice-wave-gate sluice-revert sluice-upgrade-revisions kubectl-sluice; do \
      install -m 0755 "target/release/$bin" "/out/$bin"; \
    done

FROM debian:${DEBIAN_RELEASE}-slim AS runtime
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates git \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 65532 sluice \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin sluice
COPY --from=builder /out/ /usr/local/bin/
# The chart mounts an emptyDir at /tmp and keeps the root filesystem read-only.
ENV HOME=/tmp
USER 65532:65532
EXPOSE 8080
# No default operator: the chart names the binary (command) of each Deployment.
ENTRYPOINT ["/usr/local/bin/kubectl-sluice"]
CMD ["--help"]
