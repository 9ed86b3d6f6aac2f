# vclmgr — the two commands: `make run` and `make test`. Everything they need is installed here.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000
# Every process the tests start (workers, servers, commands) would compile vclmgr's modules
# again if an environment forbids writing bytecode; the caches are ignored by git.
unexport PYTHONDONTWRITEBYTECODE
# Debian packages: build deps of libvirt-python, libvirt's test driver, Go + govmomi for
# VMware's vSphere simulator, Ganeti's htools (comparison peer) and RAPI client (drives /2/),
# Chromium (browser tests),
# a real libvirtd + QEMU with the tools that build the test guest (tools/guest-image) and
# cloud-init for its schema checker; systemd for systemd-analyze (tests/test_deploy.py);
# prometheus for promtool (checks /metrics);
# the OpenLDAP headers python-ldap builds against, and slapd + ldap-utils (LDAP sign-on tests);
# the topology test's machines (tests/integration/test_topology.py): network namespaces (iproute2),
# their own PostgreSQL 15 and Redis, haproxy in front of the web machines, curl for probes;
# xmlsec1, which pysaml2 runs to sign and check SAML messages (SAML sign-on);
# virt-xml-validate (libvirt-clients, in APT_REALVM) with the xmllint it runs (libxml2-utils): the
# GPU tests check domain and node-device XML against libvirt's own schemas; netcat-openbsd, the
# SSH path into a guest on the live-migration tests' segment (tests/twohosts.py).
APT_RUN := python3-venv python3-dev gcc pkg-config libvirt-dev libldap2-dev libsasl2-dev xmlsec1
APT_REALVM := qemu-system-x86 qemu-utils libvirt-daemon-system libvirt-clients dnsmasq-base \
  mtools syslinux syslinux-common cloud-init openssh-client netcat-openbsd
APT_TEST := $(APT_RUN) golang-go golang-github-vmware-govmomi-dev ganeti-htools-3.0 python3-ganeti-rapi chromium \
  systemd prometheus slapd ldap-utils iproute2 curl haproxy postgresql-15 redis-server libxml2-utils $(APT_REALVM)
PG_URL ?= postgres://postgres@127.0.0.1:5432/test
REDIS_TEST_URL ?= redis://127.0.0.1:6379/0
# Two workers more than cores: many tests wait (for a guest to boot, a worker to poll) rather than
# compute; with one more than cores the processes' CPU time was 80 % of what two cores give, with
# two more 94 % (make test 12:20 → 11:23). loadgroup: a module that shares a process or guests
# among its tests runs on one worker.
WORKERS ?= $(shell echo $$(( $$(nproc) + 2 )))
PYTEST_ARGS ?= -n $(WORKERS) --dist loadgroup
# Which tests each leg runs. `make test` runs everything on the embedded default. CI runs the
# heavy groups (real QEMU, Chromium, the schema fuzz: what they prove does not depend on the
# database) once, on the PostgreSQL + Redis leg (the production configuration).
SQLITE_MARKS := not topology and not postgres$(if $(CI), and not heavy)

.PHONY: vendor-novnc run run-kvm system-kvm test test-sqlite test-postgres check bench lint docs services system-run system-test install install-dev clean vcsim \
  guest-image

define apt_ensure
	@missing=$$(for p in $(1); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q "install ok installed" || echo $$p; done | xargs); \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "Installing system packages: $$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else \
	    echo "Missing system packages. Run:  sudo apt-get install -y $$missing"; exit 1; \
	  fi; \
	fi
endef

system-run:
	$(call apt_ensure,$(APT_RUN))

system-test:
	$(call apt_ensure,$(APT_TEST))

system-kvm:
	$(call apt_ensure,$(APT_RUN) $(APT_REALVM))

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# The project itself goes in editable (no copy, no network), for its console script `htools`.
$(VENV)/.run-installed: requirements.txt pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -r requirements.txt
	$(BIN)/pip install -q --no-deps --no-build-isolation -e .
	touch $@

$(VENV)/.dev-installed: requirements.txt requirements-dev.txt pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -r requirements-dev.txt
	$(BIN)/pip install -q --no-deps --no-build-isolation -e .
	touch $@ $(VENV)/.run-installed

install: system-run $(VENV)/.run-installed
install-dev: system-test $(VENV)/.dev-installed

run: install
	DEBUG=$${DEBUG:-1} $(BIN)/python manage.py relabel_jobs
	DEBUG=$${DEBUG:-1} $(BIN)/python manage.py migrate --no-input -v 0
	DEBUG=$${DEBUG:-1} $(BIN)/python manage.py demo
	DEBUG=$${DEBUG:-1} exec $(BIN)/python manage.py serve --host $(HOST) --port $(PORT)

# `make run` plus a real VM host: this machine's own private libvirtd (root; no other libvirtd
# running) and the test guest image, registered as kvm-local and debian-guest (kvm_demo).
run-kvm: install system-kvm
	@$(PYTHON) tools/guest-image/build.py >/dev/null
	DEBUG=$${DEBUG:-1} $(BIN)/python manage.py relabel_jobs
	DEBUG=$${DEBUG:-1} $(BIN)/python manage.py migrate --no-input -v 0
	DEBUG=$${DEBUG:-1} $(BIN)/python manage.py demo
	DEBUG=$${DEBUG:-1} exec $(BIN)/python manage.py kvm_demo --host $(HOST) --port $(PORT)

lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	DEBUG=1 $(BIN)/python manage.py makemigrations --check --dry-run -v 1

# The manual (docs/, mkdocs.yml) into site/: --strict fails on a page missing from the nav, a
# broken link or anchor. Material's own notice about its successor is silenced.
docs: install-dev
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -q

# PostgreSQL and Redis run already on developer and CI machines; start them if they stopped.
services:
	@pg_isready -q -h 127.0.0.1 -p 5432 || pg_ctlcluster --skip-systemctl-redirect $$(ls /etc/postgresql) main start
	@redis-cli -h 127.0.0.1 ping >/dev/null 2>&1 || redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 \
	  --save "" --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log

# VMware's vSphere simulator, built once from Debian's govmomi and cached under var/tools.
vcsim: system-test
	@sh tools/vcsim/build.sh >/dev/null

# The test guest (Debian kernel, busybox, dropbear, qemu-guest-agent; apt-get download, no
# compiler), built once and cached under var/tools by a hash of its inputs.
guest-image: system-test
	@$(PYTHON) tools/guest-image/build.py >/dev/null

# The topology test (marker topology) brings its own PostgreSQL: it runs on the second leg only.
test-sqlite: install-dev vcsim guest-image
	DEBUG=1 DATABASE_URL= REDIS_URL= $(BIN)/pytest -m "$(SQLITE_MARKS)" $(PYTEST_ARGS)

# The inner loop: lint, then every test that starts no real process (tests/conftest.py marks
# the others slow), on an in-memory SQLite database (the few tests of concurrent writers need a
# file: marker file_db).
check: lint
	DEBUG=1 DATABASE_URL= REDIS_URL= VCLMGR_TEST_DB=memory $(BIN)/pytest \
	  -m "not slow and not file_db and not topology and not postgres" $(PYTEST_ARGS)

test-postgres: install-dev services vcsim guest-image
	DEBUG=1 DATABASE_URL=$(PG_URL) REDIS_URL=$(REDIS_TEST_URL) $(BIN)/pytest $(PYTEST_ARGS)

# The set-up steps build at once (the Python install, VMware's simulator and the test guest
# need nothing of each other), then lint and the docs, then the legs.
test:
	$(MAKE) --no-print-directory -j3 --output-sync=target lint docs vcsim guest-image
	$(MAKE) --no-print-directory test-sqlite
	@if [ -n "$$CI" ] || [ "$$TEST_POSTGRES" = 1 ]; then \
	  echo "== second leg: PostgreSQL + Redis =="; $(MAKE) --no-print-directory test-postgres; fi

bench: install-dev guest-image
	DEBUG=1 $(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) var

# noVNC (the web console's VNC client), vendored under static/ from its npm package: run by hand
# to upgrade it (never at run or test time; the files are committed). NOVNC=<version>.
NOVNC ?= 1.7.0
vendor-novnc:
	rm -rf static/vendor/novnc-$(NOVNC) && mkdir -p static/vendor/novnc-$(NOVNC)
	cd static/vendor/novnc-$(NOVNC) && npm pack --silent @novnc/novnc@$(NOVNC) >/dev/null && \
	  tar xzf novnc-novnc-$(NOVNC).tgz --strip-components=1 package/core package/vendor package/LICENSE.txt \
	    package/AUTHORS package/docs && mv docs/LICENSE.* . && rm -rf docs novnc-novnc-$(NOVNC).tgz
