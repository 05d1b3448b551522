# vtism: the two commands a user needs are `make demo` and `make test`; both install what they
# need first (scripts/install-deps.sh is idempotent).

SHELL := /bin/bash
CARGO ?= cargo
RELEASE_BIN := target/release/vtism

.PHONY: all deps deps-test deps-demo build build-release demo test test-rust test-c test-module \
	test-guest-e2e test-damon-e2e test-host-e2e test-testbed test-evaluation bakeoff test-bakeoff-smoke demo-engine lint \
	bench fuzz clean help deps-deb deb test-packaging

all: build

help:
	@echo "make demo   run vtism's main job (see README)"
	@echo "make test   run every test (what CI runs)"
	@echo "make bench  run the criterion benchmarks (figures go to docs/performance.md)"
	@echo "make bakeoff  vtism against the kernel's tiering and DAMON tiering (docs/bakeoff.md, 2-4 h)"
	@echo "make fuzz   fuzz the channel reader and the QMP replies (scripts/fuzz-*.sh)"

deps:
	@scripts/install-deps.sh base
deps-test:
	@scripts/install-deps.sh test
deps-demo:
	@scripts/install-deps.sh demo
deps-deb:
	@scripts/install-deps.sh deb

build: deps
	$(CARGO) build --workspace --all-targets

build-release: deps
	$(CARGO) build --release -p vtism

# The whole stack in an emulated DRAM+CXL host (see `vtism testbed --help`). Without KVM this
# takes a quarter of an hour or more on 2 cores: the nested guest boots in minutes under TCG in TCG.
demo: deps-demo build-release
	@echo "== vtism demo: vtismd, a guest with vtism_guest.ko and a GUPS workload, in an emulated"
	@echo "   host with two DRAM and two CXL nodes. Without KVM this takes a quarter of an hour or"
	@echo "   more (the nested guest boots in minutes under TCG inside TCG). Host THP as the kernel"
	@echo "   sets it, as on a stock host. Results: build/testbed/runs/."
	$(RELEASE_BIN) testbed --profile demo --host-thp default

# The engine alone on a synthetic guest through a real channel region (seconds).
demo-engine: build-release
	$(RELEASE_BIN) demo

test: deps-test lint test-rust test-evaluation test-c test-module test-e2e test-testbed
	@echo "make test: all passed"

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

test-rust:
	$(CARGO) test --workspace

# docs/evaluation.md still describes HEAD: vtism's cxl 1:4 rows rerun and compared (20 s).
test-evaluation: build-release
	scripts/check-evaluation.sh

test-c:
	$(MAKE) -C tests/c check
	python3 guest/tests/chanmon_vectors.py

# vtism_guest.ko against Debian's 6.1 and 6.12 headers (fetched by scripts/guest-kernels.sh).
test-module:
	$(MAKE) -C guest/module all-kernels

# Both guest trackers in TCG guests: the module on 6.1 and 6.12, then the DAMON agent on 6.12
# (run-e2e.sh runs run-damon-e2e.sh); precision/recall of the reported hot set and the rest.
test-guest-e2e:
	guest/tests/run-e2e.sh

# The module's e2e, the host e2e and the packaging test in turn, the DAMON agent's e2e beside them
# (it mostly waits on DAMON's aggregations): what make test runs of the suites above and below.
test-e2e: build-release deb
	scripts/e2e-suites.sh

# The DAMON agent's scenario alone.
test-damon-e2e:
	guest/tests/run-damon-e2e.sh

# The full stack in the emulated DRAM+CXL host, smaller sizes, asserting from sampled placement.
test-testbed: build-release
	$(RELEASE_BIN) testbed --profile test --check

# vtism against the kernel's own tiering (AutoNUMA, memory tiering) and DAMON tiering in the
# emulated host, same guest, same workloads; regenerates docs/bakeoff.md, docs/bakeoff/results.json
# and the plots. Takes two to four hours on 2 cores (docs/bakeoff.md says how long its run took).
bakeoff: deps-demo build-release
	$(RELEASE_BIN) bakeoff

# The bake-off's smoke version: gups-hotset under the kernel's tiering and vtism with the module.
test-bakeoff-smoke: build-release
	$(RELEASE_BIN) bakeoff --smoke --check

# vtismd in an emulated 3-node host managing nested QEMUs.
test-host-e2e:
	tests/host-e2e/run.sh

# The Debian packages, into build/deb/: vtismd (cargo-deb) and vtism-guest-dkms.
deb: deps-deb
	scripts/build-debs.sh

# Both packages installed with dpkg in an emulated Debian host (systemd, libvirt, dkms; its root
# filesystem is built under build/packaging/ and cached), vtismd managing a libvirt domain. make
# test runs it within test-e2e.
test-packaging: deb
	tests/packaging/run.sh

bench:
	$(CARGO) bench --workspace

fuzz:
	scripts/fuzz-channel.sh
	scripts/fuzz-qmp.sh

clean:
	$(CARGO) clean
	$(MAKE) -C tests/c clean || true
