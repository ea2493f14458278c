# jaxort developer targets. `make install` then `make test` on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PYTEST := $(PY) -m pytest

.PHONY: install test conformance bench demo fbs clean

install:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -e '.[test]'

test:
	$(PYTEST) -m "not slow" -p no:cacheprovider

conformance:
	$(PY) -m jaxort.conformance

bench:
	@for f in benchmarks/bench_*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

demo:
	$(PY) -m jaxort demo

fbs:
	rm -rf build/fbs
	$(VENV)/bin/flatc --python --python-typing --gen-all -o build/fbs fbs/checkpoint.fbs
	rm -f jaxort/_fbs/*.py jaxort/_fbs/*.pyi
	cp build/fbs/jaxort/_fbs/*.py build/fbs/jaxort/_fbs/*.pyi jaxort/_fbs/

clean:
	rm -rf build dist *.egg-info .pytest_cache .hypothesis
