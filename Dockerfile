# OnePlus images. Multi-stage: uv builds a virtual environment with only what one package needs, and the runtime
# stage copies that environment alone (no uv, no sources, no build tools) and runs as an unprivileged user.
#
#   docker build --build-arg PACKAGE=oneplus-intake -t oneplus-intake .          one service (compose.yaml does this)
#   docker build -t oneplus-tools .                                               the CLI, the simulator, the benches
#
# PACKAGE is a workspace member: oneplus-intake, oneplus-topology-registry, oneplus-placement-solver,
# oneplus-preemption or oneplus-node-executor install that service and its libraries only; the default, oneplus,
# is everything (the simulator's matplotlib and pandas, OR-Tools for the benches), for a tools image.

FROM python:3.11-slim AS build
ENV UV_COMPILE_BYTECODE=1 UV_LINK_MODE=copy UV_PYTHON_DOWNLOADS=never
RUN pip install --no-cache-dir uv
WORKDIR /app
COPY pyproject.toml uv.lock README.md ./
COPY libs libs
COPY services services
COPY src src
ARG PACKAGE=oneplus
# --no-editable: the packages are copied into .venv, so the runtime stage needs no sources.
RUN uv sync --frozen --no-dev --no-editable --package "${PACKAGE}"

FROM python:3.11-slim AS runtime
RUN useradd --uid 10001 --user-group --create-home --home-dir /home/oneplus oneplus \
    && mkdir -p /var/lib/oneplus && chown oneplus:oneplus /var/lib/oneplus
COPY --from=build /app/.venv /app/.venv
ENV PATH="/app/.venv/bin:$PATH" \
    PYTHONUNBUFFERED=1 \
    ONEPLUS_HEALTH_DIR=/tmp/oneplus-health \
    ONEPLUS_STATE_DIR=/var/lib/oneplus
USER 10001:10001
WORKDIR /home/oneplus
# compose.yaml and deploy/k8s name the service's module (python -m oneplus_intake, ...); the probe is
# `python -m oneplus_bus.health <service>`.
CMD ["python", "-c", "print('give the service to run: python -m oneplus_intake | oneplus_topology_registry | oneplus_placement_solver | oneplus_preemption | oneplus_node_executor')"]
