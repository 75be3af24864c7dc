# loopwright serving an agent on Aegra instances (the reference agent, installed beside the
# runtime, unless LOOPWRIGHT_AGENT names another installed in the image). compose.yaml starts a
# deployment of it: `docker compose up`.
FROM python:3.13-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY graph graph
COPY nodes nodes
COPY tools tools
COPY checkpoints checkpoints
COPY loopwright loopwright
COPY refunds refunds
# Two distributions: the runtime, and the reference agent the deployment serves.
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . ./refunds

FROM python:3.13-slim
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir "$(ls /wheels/loopwright-*.whl)[aegra]" /wheels/loopwright_refunds-*.whl \
    && rm -rf /wheels \
    && useradd --create-home --uid 10001 loopwright
USER loopwright
WORKDIR /home/loopwright
# Owned by the user, so that a volume mounted there (compose.yaml's) is the user's too.
RUN mkdir -p services identities .loopwright
ENV PYTHONUNBUFFERED=1 \
    LOOPWRIGHT_HOME=/home/loopwright/.loopwright
EXPOSE 2031
# Ready when the instance answers its readiness route (Aegra's /ready, unauthenticated).
HEALTHCHECK --interval=5s --timeout=3s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:2031/ready', timeout=2)"]
# SIGTERM stops the instance gracefully: each run in flight stops at its next step boundary and
# is handed back to the queue for another instance (docs/operating.md, "Upgrading").
STOPSIGNAL SIGTERM
CMD ["loopwright", "serve", "--engine", "aegra", "--instances", "1", "--host", "0.0.0.0", "--port", "2031"]
