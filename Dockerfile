# syntax=docker/dockerfile:1
# Two images from one file (docker-compose.yml builds both; docs/deployment.md):
#   --target api     API + dashboard, scheduler, migrations, bootstrap: no TensorFlow
#   --target worker  a GPU host's worker: TensorFlow with its CUDA libraries (the driver
#                    comes from the host through the NVIDIA container runtime)
# Dependencies are installed from pyproject.toml alone, at the versions in constraints.txt
# (those the test suite passed with: scripts/lock.py), in layers of their own, before any
# code is copied: an edit to the code rebuilds a small wheel, not TensorFlow.

FROM python:3.11-slim AS base
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# The user towerq runs as. Artifacts and datasets usually live on NFS, where root is
# squashed: build with the uid/gid that owns the export (--build-arg UID=... GID=...).
ARG UID=1000
ARG GID=1000
RUN groupadd --gid "${GID}" towerq \
    && useradd --uid "${UID}" --gid "${GID}" --create-home --shell /usr/sbin/nologin towerq \
    && mkdir -p /data \
    && chown towerq:towerq /data
WORKDIR /app
COPY pyproject.toml constraints.txt ./
COPY scripts/requirements.py scripts/
ENV TOWERQ_VAR_DIR=/data/var \
    TOWERQ_DATA_DIR=/data/datasets \
    TOWERQ_ARTIFACTS_DIR=/data/artifacts \
    TOWERQ_MODELS_PATH=/data/models \
    TOWERQ_CODE_DIR=/data/code

FROM base AS build
COPY README.md ./
COPY service service
COPY towerq towerq
COPY worker worker
COPY migrations migrations
COPY web web
RUN pip wheel --no-deps --wheel-dir /wheels .

FROM base AS api
RUN python scripts/requirements.py server > /tmp/requirements.txt \
    && pip install -c constraints.txt -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt
COPY --from=build /wheels /wheels
RUN pip install --no-deps /wheels/*.whl && rm -rf /wheels
USER towerq
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 CMD ["towerq", "health", "api"]
CMD ["towerq", "api", "--host", "0.0.0.0", "--port", "8000"]

FROM base AS worker
# bubblewrap: the trainers' sandbox, where the container may create user namespaces
# (docs/deployment.md, "User code on the GPU hosts"); elsewhere the worker says it runs without.
RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap \
    && rm -rf /var/lib/apt/lists/*
RUN python scripts/requirements.py gpu notebook > /tmp/requirements.txt \
    && pip install -c constraints.txt -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt
COPY --from=build /wheels /wheels
RUN pip install --no-deps /wheels/*.whl && rm -rf /wheels
USER towerq
HEALTHCHECK --interval=10s --timeout=10s --start-period=60s --retries=3 CMD ["towerq", "health", "worker"]
CMD ["towerq", "worker"]
