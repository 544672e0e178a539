# streamsched: one image for workers (`run`), the schedule ticker (`schedule tick`), the outbox
# relay and one-shot jobs (`topics apply`, `acl apply`, `emit`). Built and run by compose.yaml and
# deploy/kubernetes/; checked without a Docker engine by tests/ops/test_deploy.py.
#
#   docker build -t streamsched:0.1.0 .
#   docker run --rm streamsched:0.1.0 --version

# Pinned: the same Python line the project is tested with.
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

# --- build: the streamsched wheel and the wheels of all its dependencies ------------------------
FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml setup.py MANIFEST.in README.md ./
COPY schemas ./schemas
COPY streamsched ./streamsched
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

# --- runtime: the wheel installed at build time, nothing fetched at start, not root -----------
FROM ${PYTHON_IMAGE} AS runtime
RUN groupadd --system --gid 10001 streamsched \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /app streamsched \
    && mkdir -p /app /data /var/lib/streamsched \
    && chown streamsched:streamsched /data /var/lib/streamsched
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels streamsched \
    && rm -rf /wheels
# The reference schedulers and topic definitions (compose.yaml runs them); your own image puts
# your app here instead (`streamsched run` imports MODULE:ATTR from the working directory).
WORKDIR /app
COPY consumers ./consumers
COPY topics ./topics
USER 10001:10001
ENV PYTHONUNBUFFERED=1 \
    STREAMSCHED_STATUS_HOST=0.0.0.0 \
    STREAMSCHED_STATUS_PORT=9464 \
    STREAMSCHED_LEDGER=/data/ledger.sqlite3 \
    STREAMSCHED_STORE_DIR=/var/lib/streamsched
# Claim stores (RocksDB per owned partition) live in /var/lib/streamsched: a cache of the state
# topic, so mounting a volume there (`-v stores:/var/lib/streamsched`; k8s: a volume claim per
# pod) only makes restarts warm; losing it costs a cold restore, never correctness. Not a VOLUME:
# one-shot commands (emit, topics apply) would each leave an anonymous volume behind.
EXPOSE 9464
# No HEALTHCHECK here: only a worker (`run`), a ticker or a relay started with --status-port serves
# /readyz, so an image-wide check would mark a relay or a one-shot command unhealthy. compose.yaml
# and deploy/kubernetes/ probe /readyz on exactly the services that serve it.
# Exec form: streamsched is PID 1 and receives SIGTERM itself (drain, commit, leave the group).
ENTRYPOINT ["streamsched"]
CMD ["--help"]
