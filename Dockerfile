# Multi-stage build of the release binary on a slim Debian base.
#
#   docker build -t orca-relay .
#   docker run -p 8080:8080 -v orca-data:/data \
#     -e ORCA_RELAY_PUBLIC_URL=https://relay.example.org orca-relay
#
# The runtime stage runs as uid 10001 (user `orca`). A named volume is prepared for it; a bind
# mount (-v /srv/orca:/data) must be writable by uid 10001 first: `chown -R 10001:10001 /srv/orca`.
#
# Base images are pinned by version; bump them together with the toolchain in CI.
ARG RUST_IMAGE=rust:1.95-slim-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-20251117-slim

FROM ${RUST_IMAGE} AS build
# make: jemalloc (the binary's allocator) is built from source by tikv-jemalloc-sys.
RUN apt-get update \
 && apt-get install -y --no-install-recommends make \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Dependency-cache layer: build every dependency against empty crate roots, so a change in src/
# rebuilds only this crate. (examples/, tests/ and fuzz/ are not needed for the binary.)
COPY Cargo.toml Cargo.lock ./
RUN mkdir src \
 && echo 'fn main() {}' > src/main.rs \
 && : > src/lib.rs \
 && cargo build --release --locked --bin orca-relay \
 && rm -rf src target/release/orca-relay* target/release/deps/orca_relay-* \
      target/release/deps/liborca_relay-* target/release/.fingerprint/orca-relay-*
COPY src ./src
COPY sql ./sql
RUN cargo build --release --locked --bin orca-relay

# The image that runs.
FROM ${RUNTIME_IMAGE} AS runtime
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --user-group --home-dir /data --shell /usr/sbin/nologin orca \
 && mkdir -p /data && chown orca:orca /data
COPY --from=build /src/target/release/orca-relay /usr/local/bin/orca-relay
USER 10001:10001
ENV ORCA_RELAY_DATA_DIR=/data \
    ORCA_RELAY_LISTEN=0.0.0.0:8080 \
    RUST_LOG=info
VOLUME ["/data"]
EXPOSE 8080
# GET /ready on this container's own listener (ORCA_RELAY_LISTEN, and https with the
# certificate's name when built-in TLS is on); exit 0 only on 200.
HEALTHCHECK --interval=15s --timeout=6s --start-period=20s --retries=3 \
  CMD ["orca-relay", "health", "--timeout", "5"]
# SIGTERM drains (docker stop); give it the grace: docker stop -t 40 / stop_grace_period: 40s.
STOPSIGNAL SIGTERM
ENTRYPOINT ["orca-relay", "serve"]
