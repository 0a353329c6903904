# syntax=docker/dockerfile:1
# Build:  docker build -t tidemark:latest .
# Run:    see docs/deploy.md
FROM rust:1-bookworm AS builder
WORKDIR /src
# The whole workspace (Cargo.toml names benches, examples and tests by path;
# .dockerignore keeps target/ and .git/ out).
COPY . .
RUN cargo build --release --locked --bin tidemark \
 && install -m 0755 target/release/tidemark /usr/local/bin/tidemark

FROM debian:bookworm-slim
# The binary links only libc, libm and libgcc_s (all in the base image).
RUN groupadd --system --gid 10001 tidemark \
 && useradd --system --uid 10001 --gid tidemark --home-dir /var/lib/tidemark \
      --no-create-home --shell /usr/sbin/nologin tidemark \
 && install -d -o tidemark -g tidemark -m 0700 /var/lib/tidemark
COPY --from=builder /usr/local/bin/tidemark /usr/local/bin/tidemark
USER 10001:10001
WORKDIR /var/lib/tidemark
EXPOSE 7700/tcp 7701/udp
VOLUME /var/lib/tidemark
ENTRYPOINT ["tidemark"]
# A single node with HTTP on every interface (so a published port reaches it).
# Give it a token (-e TIDEMARK_TOKEN=... or --token-file): without one it logs a
# warning and anyone who can reach the port can read and write. The peer port
# stays on loopback here: clustering needs --tls DIR, --peer-listen 0.0.0.0:7701
# and --advertise IP:7701 (see docs/deploy.md).
CMD ["serve", "--data", "/var/lib/tidemark", "--http", "0.0.0.0:7700"]
