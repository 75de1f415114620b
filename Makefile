# dexagents: `make run` sets up and runs the platform; `make test` sets up and runs every check.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.requirements-installed

export LITELLM_LOCAL_MODEL_COST_MAP := True
export LITELLM_MODE := PRODUCTION
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: install peers run test lint typecheck pytest bench bench-relay clean

$(STAMP): requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --requirement requirements.txt
	touch $(STAMP)

install: $(STAMP)

# Third-party MCP servers from npm that tests/mcp_registry runs as real subprocesses
# (exact versions in tests/peers/package-lock.json).
PEERS_STAMP := tests/peers/node_modules/.package-lock.json

$(PEERS_STAMP): tests/peers/package.json tests/peers/package-lock.json
	cd tests/peers && npm ci --no-audit --no-fund --loglevel=error

peers: $(PEERS_STAMP)

run: install
	$(PY) manage.py dev

lint: install
	$(VENV)/bin/ruff check .

typecheck: install
	$(VENV)/bin/mypy .

pytest: install peers
	$(VENV)/bin/pytest

test: lint typecheck pytest

bench: install
	$(PY) -m bench.engine
	$(PY) -m bench.relay

# Websocket relay: latency from a Stream write to the frame, and 200 sockets on one web process.
bench-relay: install
	$(PY) -m bench.relay

clean:
	rm -rf var .mypy_cache .ruff_cache .pytest_cache
