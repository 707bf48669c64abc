VENV ?= .venv
PY := $(VENV)/bin/python
# What `make run` needs (pip install -e .) and what `make test` needs on top
# (the dev extra); installing the second also satisfies the first.
RUN_STAMP := $(VENV)/.installed-run
DEV_STAMP := $(VENV)/.installed-dev
# pip -qq: errors only (pip's own warnings and notices would bury the one
# progress line).
PIP := $(PY) -m pip install -qq --disable-pip-version-check
# make run PORT=9000 (default: YOKE_PORT, else 8080)
PORT ?=

.PHONY: install test run bench clean chromium

$(PY):
	@echo "creating $(VENV) (Python virtual environment)…"
	@python3 -m venv $(VENV)

$(RUN_STAMP): pyproject.toml | $(PY)
	@echo "installing Yoke into $(VENV) (first run only)…"
	@$(PIP) -e .
	@touch $@

$(DEV_STAMP): pyproject.toml | $(PY)
	@echo "installing Yoke and its test dependencies into $(VENV) (first time only)…"
	@$(PIP) -e '.[dev]'
	@touch $@ $(RUN_STAMP)

install: $(DEV_STAMP)

# Debian's chromium for tests/browser (Playwright drives it; it downloads no
# browser of its own). Quiet and instant when it is already there.
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
		echo "installing Debian's chromium for the browser tests (first time only)…"; \
		(apt-get -o DPkg::Lock::Timeout=600 update -qq && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq chromium) \
			>/tmp/yoke-chromium-install.log 2>&1 \
		|| { echo "error: could not install chromium, which tests/browser need (see /tmp/yoke-chromium-install.log)"; exit 1; }; }

# Three test processes (pytest-xdist), a test file each at a time: most of the
# suite's time is spent waiting on servers, fsync and timeouts, not on the CPU.
test: $(DEV_STAMP) chromium
	$(PY) -m pytest -q -n 3 --dist loadfile

run: $(RUN_STAMP)
	@$(VENV)/bin/yoke serve --app examples.orders:app $(if $(PORT),--port $(PORT))

bench: $(DEV_STAMP)
	$(PY) bench/append.py
	$(PY) bench/http_api.py
	$(PY) bench/actors.py
	$(PY) bench/subscriptions.py
	$(PY) bench/cli_startup.py

clean:
	rm -rf $(VENV) .yoke .pytest_cache
