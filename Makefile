# dexagents: `make run` sets up and runs the platform; `make test` sets up and runs every check.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.requirements-installed

export LITELLM_LOCAL_MODEL_COST_MAP := True
export LITELLM_MODE := PRODUCTION
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: install peers chromium run test lint typecheck pytest bench bench-turn bench-long-session bench-large-session bench-transport bench-relay bench-rest bench-scale bench-first-rpc bench-peer-server chaos clean

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

# The page tests drive Debian's Chromium through Playwright, which cannot download browsers
# here: install the package when it is missing and apt-get can be used, else say what to do.
chromium:
	@[ -n "$$DEXAGENTS_CHROMIUM" ] || command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	    echo "Installing Debian's chromium package for the page tests"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  elif command -v apt-get >/dev/null 2>&1 && sudo -n true 2>/dev/null; then \
	    echo "Installing Debian's chromium package for the page tests"; \
	    sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else \
	    echo "Chromium is missing: install it (Debian: apt-get install chromium) or set DEXAGENTS_CHROMIUM to its path."; \
	    exit 1; \
	  fi; }

run: install
	$(PY) manage.py dev

lint: install
	$(VENV)/bin/ruff check .

typecheck: install
	$(VENV)/bin/mypy .

# Two test processes (pytest-xdist), each module kept on one of them (--dist loadfile: a
# module's stack serves all its tests): most e2e time is spent waiting on real processes.
# Modules are handed out longest first (tests/module_order.py), not by xdist's test count.
PYTEST_WORKERS ?= 2

pytest: install peers chromium
	$(VENV)/bin/pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder

test: lint typecheck pytest

bench: install
	$(PY) -m bench.turn
	$(PY) -m bench.transport
	$(PY) -m bench.engine
	$(PY) -m bench.engine --long-session
	$(PY) -m bench.relay
	$(PY) -m bench.steer
	$(PY) -m bench.rest
	$(PY) -m bench.scale
	$(PY) -m bench.first_rpc
	$(PY) -m bench.peer_server

# One agent turn (3 parallel tools) against LangGraph + SqliteSaver, with its cost breakdown,
# at the engine's default blob threshold (1024) and at 64 KiB side by side.
bench-turn: install
	$(PY) -m bench.turn

# What the turn's gRPC messages cost on their own, between two Python processes: a lower bound.
bench-transport: install
	$(PY) -m bench.transport

# A long session's snapshot read at 100, 2,000 and 20,000 messages, at the engine's default
# blob threshold (1024, the Dex server's) and at 64 KiB, flat or not (issue 26).
bench-long-session: install
	$(PY) -m bench.engine --long-session

# One session grown to 20,000 messages (about 200 MB of tool results) by real turns on the
# platform's processes: read times and memory as it grows, then approval, Steer and a result
# read whole (issue 26; tens of minutes, --quick: 2,000 messages).
bench-large-session: install
	$(PY) -m bench.large_session

# Websocket relay: 1 to 10,000 watchers of one session (memory, latency, engine reads), latency
# from a Stream write to the frame, and 200 sockets on one web process.
bench-relay: install
	$(PY) -m bench.relay

# REST: concurrent snapshot reads on one web process, before and after the async views, and on 2.
bench-rest: install
	$(PY) -m bench.rest

# 200 active sessions on 3 Dex workers: Steps per second, turn p50 / p99, errors.
bench-scale: install
	$(PY) -m bench.scale

# The first message POST after `manage.py dev` says ready against the next 10 (issue 13).
bench-first-rpc: install
	$(PY) -m bench.first_rpc

# Turns/s, p50 / p99 and CPU per turn at 1, 20 and 100 clients against the LangGraph Agent
# Server (issue 24); its own virtualenv is made under var/bench on first use (minutes).
bench-peer-server: install
	$(PY) -m bench.peer_server

# Chaos suite (not in CI): SIGKILL workers, the engine and the web under load, count what
# survived, write docs/reliability.md. The issue's figures by default (long); a small run:
# make chaos CHAOS_FLAGS=--quick
CHAOS_FLAGS ?=
chaos: install
	$(PY) -m bench.chaos $(CHAOS_FLAGS)

clean:
	rm -rf var .mypy_cache .ruff_cache .pytest_cache
