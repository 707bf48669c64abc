VENV ?= .venv
PY := $(VENV)/bin/python
# What `make run` needs (pip install -e .) and what `make test` needs on top
# (the dev extra); installing the second also satisfies the first.
RUN_STAMP := $(VENV)/.installed-run
DEV_STAMP := $(VENV)/.installed-dev
# pip -qq: errors only (pip's own warnings and notices would bury the one
# progress line).
PIP := $(PY) -m pip install -qq --disable-pip-version-check
# Every package at the version the suite last passed with (constraints.txt).
CONSTRAINTS := constraints.txt
# make run PORT=9000 (default: YOKE_PORT, else 8080)
PORT ?=

# The Durable Streams conformance suite, client and reference server (npm,
# pinned by tests/durable_streams/package-lock.json): npm ci again only when
# the lock file changes.
DS_DIR := tests/durable_streams
DS_STAMP := $(DS_DIR)/node_modules/.installed
# The TypeScript actors of examples/orders_node.py, compiled for the Node host
# (yoke/hosts/node) by the TypeScript compiler pinned in its package-lock.json.
NODE_EXAMPLE := examples/node
NODE_STAMP := $(NODE_EXAMPLE)/node_modules/.installed
NODE_BUILT := $(NODE_EXAMPLE)/dist/payments.js
# The OpenTelemetry API and a context manager for tests/tracing's Node actor
# (pinned by tests/tracing/node/package-lock.json).
TRACING_NODE := tests/tracing/node
TRACING_STAMP := $(TRACING_NODE)/node_modules/.installed

.PHONY: install test run bench clean chromium pgbouncer patroni podman npm constraints peers wheels image

$(PY):
	@echo "creating $(VENV) (Python virtual environment)…"
	@python3 -m venv $(VENV)

$(RUN_STAMP): pyproject.toml $(CONSTRAINTS) | $(PY)
	@echo "installing Yoke into $(VENV) (first run only)…"
	@$(PIP) -c $(CONSTRAINTS) -e .
	@touch $@

$(DEV_STAMP): pyproject.toml $(CONSTRAINTS) | $(PY)
	@echo "installing Yoke and its test dependencies into $(VENV) (first time only)…"
	@$(PIP) -c $(CONSTRAINTS) -e '.[dev]'
	@touch $@ $(RUN_STAMP)

install: $(DEV_STAMP)

# After a change to pyproject.toml's dependencies: the newest versions that
# satisfy it, in a scratch environment, written to constraints.txt (then run
# make test with them before committing).
constraints:
	@rm -rf /tmp/yoke-constraints-venv && python3 -m venv /tmp/yoke-constraints-venv
	@/tmp/yoke-constraints-venv/bin/python -m pip install -qq --disable-pip-version-check -e '.[dev]'
	@{ sed -n '1,3p' $(CONSTRAINTS); /tmp/yoke-constraints-venv/bin/python -m pip freeze --exclude-editable; } > $(CONSTRAINTS).new
	@mv $(CONSTRAINTS).new $(CONSTRAINTS) && rm -rf /tmp/yoke-constraints-venv
	@echo "constraints.txt: the newest versions pyproject.toml allows; run make test"

# Debian's chromium for tests/browser (Playwright drives it; it downloads no
# browser of its own). Quiet and instant when it is already there.
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
		echo "installing Debian's chromium for the browser tests (first time only)…"; \
		(apt-get -o DPkg::Lock::Timeout=600 update -qq && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq chromium) \
			>/tmp/yoke-chromium-install.log 2>&1 \
		|| { echo "error: could not install chromium, which tests/browser need (see /tmp/yoke-chromium-install.log)"; exit 1; }; }

# Debian's pgbouncer for tests/contract/test_pgbouncer.py (Yoke behind a
# real pooler, session and transaction mode). Quiet and instant when there.
pgbouncer:
	@test -x /usr/sbin/pgbouncer || command -v pgbouncer >/dev/null 2>&1 || { \
		echo "installing Debian's pgbouncer for the pooler tests (first time only)…"; \
		(apt-get -o DPkg::Lock::Timeout=600 update -qq && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq pgbouncer) \
			>/tmp/yoke-pgbouncer-install.log 2>&1 \
		|| { echo "error: could not install pgbouncer, which tests/contract/test_pgbouncer.py needs (see /tmp/yoke-pgbouncer-install.log)"; exit 1; }; }

# Debian's patroni and etcd-server for tests/ha (a real PostgreSQL cluster,
# a primary and a synchronous standby, failed over under load). Quiet and
# instant when there.
patroni:
	@{ test -x /usr/bin/patroni && test -x /usr/bin/etcd; } || { \
		echo "installing Debian's patroni and etcd-server for the failover tests (first time only)…"; \
		(apt-get -o DPkg::Lock::Timeout=600 update -qq && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq patroni etcd-server) \
			>/tmp/yoke-patroni-install.log 2>&1 \
		|| { echo "error: could not install patroni and etcd-server, which tests/ha needs (see /tmp/yoke-patroni-install.log)"; exit 1; }; }

# Debian's podman, runc and mmdebstrap for tests/production/test_container.py
# (Yoke's image, built on a base made from Debian's packages). Quiet and
# instant when there.
podman:
	@{ command -v podman && command -v runc && command -v mmdebstrap; } >/dev/null 2>&1 || { \
		echo "installing Debian's podman, runc and mmdebstrap for the container tests (first time only)…"; \
		(apt-get -o DPkg::Lock::Timeout=600 update -qq && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq podman runc mmdebstrap) \
			>/tmp/yoke-podman-install.log 2>&1 \
		|| { echo "error: could not install podman, which tests/production/test_container.py needs (see /tmp/yoke-podman-install.log)"; exit 1; }; }

# The container image's build context (Containerfile): Yoke's wheel and every
# dependency's, for this machine's Python (the image's must be the same
# version: `make image` checks the base's), so the image builds without a network.
WHEELS ?= build/wheels
wheels: $(DEV_STAMP)
	@rm -rf $(WHEELS) && mkdir -p $(WHEELS)
	@$(PY) -m build --outdir $(WHEELS) . >/dev/null  # the wheel from the sdist: nothing stale from build/
	@rm -f $(WHEELS)/*.tar.gz
	@$(PY) -m pip wheel -qq --disable-pip-version-check --wheel-dir $(WHEELS) -c $(CONSTRAINTS) "$$(ls $(WHEELS)/yoke-*.whl)[tracing]"

# make image [BASE=...] [IMAGE=yoke:latest]: Yoke's image, with podman (docker: the same arguments).
IMAGE ?= yoke:latest
image: wheels
	@want=$$($(PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])'); \
	have=$$(podman run --rm $(or $(BASE),docker.io/library/python:3.11-slim-bookworm) python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])'); \
	[ -n "$$have" ] || { echo "error: could not run python3 in the base image (BASE=$(BASE))"; exit 1; }; \
	[ "$$want" = "$$have" ] || { echo "error: the wheels are for Python $$want, the base has $$have: set BASE to a Python $$want image"; exit 1; }
	podman build $(if $(BASE),--build-arg BASE=$(BASE)) -t $(IMAGE) -f Containerfile $(WHEELS)

$(DS_STAMP): $(DS_DIR)/package-lock.json
	@echo "installing the Durable Streams npm packages into $(DS_DIR) (first time only)…"
	@cd $(DS_DIR) && npm ci --no-audit --no-fund --loglevel=error >/tmp/yoke-npm-ci.log 2>&1 \
		|| { echo "error: npm ci failed in $(DS_DIR) (see /tmp/yoke-npm-ci.log)"; exit 1; }
	@touch $@

$(NODE_STAMP): $(NODE_EXAMPLE)/package-lock.json
	@echo "installing the TypeScript compiler into $(NODE_EXAMPLE) (first time only)…"
	@cd $(NODE_EXAMPLE) && npm ci --no-audit --no-fund --loglevel=error >/tmp/yoke-npm-ci-node.log 2>&1 \
		|| { echo "error: npm ci failed in $(NODE_EXAMPLE) (see /tmp/yoke-npm-ci-node.log)"; exit 1; }
	@touch $@

$(NODE_BUILT): $(NODE_STAMP) $(wildcard $(NODE_EXAMPLE)/*.ts) $(NODE_EXAMPLE)/tsconfig.json yoke/hosts/node/yoke.d.ts
	@cd $(NODE_EXAMPLE) && node_modules/.bin/tsc -p .

$(TRACING_STAMP): $(TRACING_NODE)/package-lock.json
	@echo "installing the OpenTelemetry npm packages into $(TRACING_NODE) (first time only)…"
	@cd $(TRACING_NODE) && npm ci --no-audit --no-fund --loglevel=error >/tmp/yoke-npm-ci-tracing.log 2>&1 \
		|| { echo "error: npm ci failed in $(TRACING_NODE) (see /tmp/yoke-npm-ci-tracing.log)"; exit 1; }
	@touch $@

npm: $(DS_STAMP) $(NODE_BUILT) $(TRACING_STAMP)

# The peers bench/peers.py runs Yoke against: Restate's server (npm, pinned by
# bench/peers/package-lock.json) and its Python SDK with hypercorn
# (bench/peers/requirements.txt, into $(VENV)). Bench only: make test needs none.
PEERS_DIR := bench/peers
PEERS_STAMP := $(PEERS_DIR)/node_modules/.installed
$(PEERS_STAMP): $(PEERS_DIR)/package-lock.json $(PEERS_DIR)/requirements.txt | $(DEV_STAMP)
	@echo "installing Restate's server and Python SDK for bench/peers.py (first time only)…"
	@cd $(PEERS_DIR) && npm ci --no-audit --no-fund --loglevel=error >/tmp/yoke-npm-ci-peers.log 2>&1 \
		|| { echo "error: npm ci failed in $(PEERS_DIR) (see /tmp/yoke-npm-ci-peers.log)"; exit 1; }
	@$(PIP) -r $(PEERS_DIR)/requirements.txt
	@touch $@

peers: $(PEERS_STAMP)

# Three test processes (pytest-xdist), a test file each at a time: most of the
# suite's time is spent waiting on servers, fsync and timeouts, not on the CPU.
# Files are handed out in collection order, longest first (tests/conftest.py),
# not by their number of tests (xdist's default).
test: $(DEV_STAMP) chromium pgbouncer patroni podman npm
	$(PY) -m pytest -q -n 3 --dist loadfile --no-loadscope-reorder

run: $(RUN_STAMP)
	@$(VENV)/bin/yoke serve --app yoke.examples.orders:app $(if $(PORT),--port $(PORT))

bench: $(DEV_STAMP) npm peers
	$(PY) bench/append.py
	$(PY) bench/append_batches.py
	$(PY) bench/append_batches.py --protocol
	$(PY) bench/http_api.py
	$(PY) bench/actors.py
	$(PY) bench/subscriptions.py
	$(PY) bench/idle_subscriptions.py
	$(PY) bench/cli_startup.py
	$(PY) bench/durable_streams.py
	$(PY) bench/peers.py

clean:
	rm -rf $(VENV) .yoke .pytest_cache $(DS_DIR)/node_modules $(NODE_EXAMPLE)/node_modules $(NODE_EXAMPLE)/dist \
		$(PEERS_DIR)/node_modules $(TRACING_NODE)/node_modules
