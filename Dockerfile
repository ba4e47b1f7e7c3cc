# Multi-stage build of the release binary on a slim Debian base (operations.md §8).
FROM rust:1-slim-bookworm AS build
# make: jemalloc (the binary's allocator) is built from source by tikv-jemalloc-sys.
RUN apt-get update \
 && apt-get install -y --no-install-recommends make \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY sql ./sql
COPY examples ./examples
RUN cargo build --release --locked --bin orca-relay

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /data --shell /usr/sbin/nologin orca \
 && mkdir -p /data && chown orca:orca /data
COPY --from=build /src/target/release/orca-relay /usr/local/bin/orca-relay
USER orca
ENV ORCA_RELAY_DATA_DIR=/data \
    ORCA_RELAY_LISTEN=0.0.0.0:8080 \
    RUST_LOG=info
VOLUME ["/data"]
EXPOSE 8080
ENTRYPOINT ["orca-relay", "serve"]
