VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install test run bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

run: $(STAMP)
	$(VENV)/bin/yoke serve --app examples.orders:app

bench: $(STAMP)
	$(PY) bench/append.py
	$(PY) bench/http_api.py
	$(PY) bench/actors.py
	$(PY) bench/subscriptions.py

clean:
	rm -rf $(VENV) .yoke .pytest_cache
