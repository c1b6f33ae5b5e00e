# Set-up is two commands: `make demo` and `make test`; each creates or reuses the virtualenv .venv.
PYTHON ?= python3
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
INSTALLED := $(VENV)/.installed-$(shell cat setup.py | cksum | cut -d' ' -f1)
RUN := PATH=$(BIN):$$PATH OMP_NUM_THREADS=1

.PHONY: install demo test test-gpu clean-demo

install: $(INSTALLED)

# --no-cache-dir: the CUDA torch wheels are ~3 GB; caching them too doubled the disk a clean install needs.
$(INSTALLED): setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --no-cache-dir --upgrade pip
	$(BIN)/python -m pip install -q --no-cache-dir -e '.[dev]'
	rm -f $(VENV)/.installed-* && touch $@

demo: $(INSTALLED)  ## corpus -> tokenizer -> MDS -> train 2 processes, stop, autoresume (re-run: resumes)
	$(RUN) $(BIN)/python scripts/demo.py

test: $(INSTALLED)  ## the CPU suite (GPU tests are skipped without a GPU)
	$(RUN) $(BIN)/python -m pytest -q tests

test-gpu: $(INSTALLED)
	$(RUN) $(BIN)/python -m pytest -q -m gpu tests

clean-demo:
	rm -rf demo_run
