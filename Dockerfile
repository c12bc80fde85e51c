# One image for every towerq process (api, scheduler, worker). EXTRA=gpu installs the CUDA
# build of TensorFlow for GPU workers; the default CPU build suits the API and scheduler.
FROM python:3.11-slim
ARG EXTRA=cpu
WORKDIR /app
COPY pyproject.toml README.md ./
COPY service service
COPY worker worker
COPY migrations migrations
COPY web web
RUN pip install --no-cache-dir -e ".[${EXTRA}]"
ENV TOWERQ_VAR_DIR=/data/var TOWERQ_DATA_DIR=/data/datasets TOWERQ_ARTIFACTS_DIR=/data/artifacts TOWERQ_MODELS_PATH=/data/models
EXPOSE 8000
CMD ["towerq", "api", "--host", "0.0.0.0"]
