# One-command set-up: `make run` starts the app, `make test` runs every test.
# Both install this project into .venv through pyproject.toml (editable, so the checkout is what
# runs): requirements.txt = the app's extras, requirements-dev.txt = those plus the test extra.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP_RUN := $(VENV)/.installed-runtime
STAMP_DEV := $(VENV)/.installed-dev

.PHONY: install install-dev run test bench chromium sample-data clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(STAMP_RUN): requirements.txt pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -r requirements.txt
	touch $@

$(STAMP_DEV): requirements.txt requirements-dev.txt pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $(STAMP_RUN) $@

install: $(STAMP_RUN)

install-dev: $(STAMP_DEV)

# Debian's Chromium drives the browser tests; Playwright never downloads a browser.
chromium:
	@if [ ! -x /usr/bin/chromium ]; then \
		echo "Installing Debian's chromium for the browser tests"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null; \
	fi

run: $(STAMP_RUN)
	GATING_LOAD_SAMPLE_DATA=1 $(PY) -m streamlit run app.py --server.address localhost --server.port 8501

test: $(STAMP_DEV) chromium
	$(PY) -m pytest -ra tests

bench: $(STAMP_DEV)
	$(PY) bench/run_all.py

sample-data: $(STAMP_RUN)
	$(PY) -m gating_core.synthetic --out sample_data

clean:
	rm -rf $(VENV) .pytest_cache test-artifacts
