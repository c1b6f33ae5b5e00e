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

# On the GPU machines, with their own torch and the carried wheels: make test-gpu TEST_PYTHON=python3
TEST_PYTHON ?= $(BIN)/python
TESTS ?= tests
test-gpu: $(if $(filter $(BIN)/python,$(TEST_PYTHON)),$(INSTALLED))  ## the tests marked gpu, on the GPUs present
	$(RUN) $(TEST_PYTHON) -m pytest -q -s -m gpu $(TESTS)

clean-demo:
	rm -rf demo_run
