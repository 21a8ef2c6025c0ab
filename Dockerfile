# crosstalk relay. Build: docker build -t crosstalk .
# The container listens on all interfaces, so the relay requires a token. Make one and keep it
# (clients send it as `Authorization: Bearer …`, or CROSSTALK_TOKEN for the CLI and bridge):
#   TOKEN=$(openssl rand -hex 32); echo "$TOKEN"
# Run:   docker run -d -p 8765:8765 -v crosstalk-data:/data -e CROSSTALK_TOKEN="$TOKEN" crosstalk
# tests/it/dockerfile.rs mirrors these steps (build command, runtime environment, entrypoint) and
# runs the binary with the image's exact environment and command plus this run line's -e.

FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
# The release profile ships a lean binary: no debug info (Cargo.toml; `--profile profiling` keeps it).
RUN cargo build --release --locked -p crosstalk

FROM debian:bookworm-slim
# CA certificates: `crosstalk mcp` and the command line in this image can reach https relays.
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
RUN useradd --system --uid 10001 --no-create-home --home-dir /data crosstalk \
    && mkdir -p /data && chown crosstalk:crosstalk /data
COPY --from=build /src/target/release/crosstalk /usr/local/bin/crosstalk
USER crosstalk
# Inside the container the relay must listen on all interfaces; publish the port with care.
ENV CROSSTALK_HOST=0.0.0.0 CROSSTALK_PORT=8765 CROSSTALK_DATA_DIR=/data RUST_LOG=info
VOLUME ["/data"]
EXPOSE 8765
# The relay handles SIGTERM itself: streams end, the store is flushed, exit within 2 s.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/crosstalk"]
CMD ["serve"]
