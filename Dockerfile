# llm-placement extender image. Two stages: build wheels (ours and every runtime dependency), then
# install them offline into a clean slim image, so no compiler, build backend or source tree ships.
# tests/deploy/test_dockerfile.py replays the `python -m pip` steps below in a clean venv.
# Needs BuildKit (the default builder since Docker 23) for the RUN --mount below: `docker build -t llm-placement:0.1.0 .`

# Pinned by tag (Python 3.11 line, Debian 13 slim): rebuilds get interpreter security fixes only
# when this line is bumped on purpose.
ARG PYTHON_IMAGE=python:3.11.14-slim-trixie

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
# Only what the wheel is built from; .dockerignore keeps the rest of the repository out.
COPY pyproject.toml README.md ./
COPY app ./app
# The project's wheel plus wheels of its runtime dependency closure (no dev extras), resolved once here.
RUN python -m pip wheel --no-cache-dir --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Offline install from the build stage's wheels only: the final image gets exactly the runtime
# dependencies the build stage resolved, and nothing is fetched twice.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m pip install --no-cache-dir --no-index --find-links /wheels /wheels/llm_placement-*.whl
# A numeric, non-root user: Kubernetes' runAsNonRoot can only verify a numeric UID. It matches the
# chart's podSecurityContext (65532, the conventional "nonroot" ID).
RUN groupadd --system --gid 65532 llmp \
    && useradd --system --uid 65532 --gid 65532 --home-dir /home/llmp --create-home --shell /usr/sbin/nologin llmp
USER 65532:65532
WORKDIR /home/llmp
# 8888: extender verbs, /healthz, /readyz, /explain; 9090: Prometheus /metrics.
EXPOSE 8888 9090
# Stdlib only (the slim image has no curl). The extender listens on 127.0.0.1 by default, which is
# also where this check runs. Kubernetes ignores HEALTHCHECK and uses the chart's probes instead.
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8888/healthz', timeout=4)"]
ENTRYPOINT ["llm-placement"]
CMD ["serve"]
