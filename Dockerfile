# Tidemark node image (docs/deploy.md, "Docker"):
#   docker build -t tidemark:0.1.0 .
#   docker run -d --name tidemark -p 127.0.0.1:7700:7700 -v tidemark-data:/var/lib/tidemark \
#     -v "$PWD/token:/run/secrets/tidemark-token:ro" tidemark:0.1.0
# The default command serves HTTP on every interface of the container and needs a bearer
# token: mount a file at /run/secrets/tidemark-token (first line = token; readable by uid 10001).

# -- build: the release binary, with the versions pinned by Cargo.lock.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin tidemark

# -- runtime: the binary alone on a slim Debian, as an unprivileged user.
FROM debian:bookworm-slim
RUN groupadd --system --gid 10001 tidemark \
    && useradd --system --uid 10001 --gid tidemark --home-dir /var/lib/tidemark \
       --shell /usr/sbin/nologin tidemark \
    && install -d -o tidemark -g tidemark -m 0700 /var/lib/tidemark
COPY --from=build /src/target/release/tidemark /usr/local/bin/tidemark
USER 10001:10001
WORKDIR /var/lib/tidemark
# 7700/tcp: HTTP API; 7701/udp: QUIC between cluster members.
EXPOSE 7700/tcp 7701/udp
VOLUME ["/var/lib/tidemark"]
# /healthz answers without the token; the image has no curl, so bash's /dev/tcp asks it.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
  CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/7700 && printf 'GET /healthz HTTP/1.0\\r\\nHost: localhost\\r\\n\\r\\n' >&3 && grep -q '\"ok\"' <&3"]
# SIGTERM (docker stop) drains: give it `docker stop -t 45` (http.shutdown_grace_ms is 30 s).
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/tidemark"]
CMD ["serve", "--data", "/var/lib/tidemark", "--http", "0.0.0.0:7700", "--token-file", "/run/secrets/tidemark-token"]
