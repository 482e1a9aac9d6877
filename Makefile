# warmfleet — two entry points on a fresh Debian machine:
#   make run    start the control plane (embedded NATS), containerd if needed, and one local agent
#   make test   install what the tests need, then run every test with the race detector

GO      ?= go
BIN     := bin
DATA    ?= .warmfleet
PKGS    := ./...

.PHONY: run test build quietbuild deps natscli vet fmt fuzz bench clean

# The stock nats CLI, for the README's examples and the e2e test that runs
# them (e2e.TestAcceptance_NatsCLIExamples). It is a Go module, so it comes
# from the Go module proxy like every other dependency.
NATS_CLI := github.com/nats-io/natscli/nats@v0.5.0

# go-nvml wraps every NVML entry point, and its nvml.h marks some of them
# deprecated, so compiling go-nvml prints about 29 -Wdeprecated-declarations
# warnings that are not ours to act on. cgo flags apply only to the package
# that states them (a #cgo line of ours never reaches go-nvml's C files), so
# the build of the one binary that links go-nvml, the GPU probe, gets
# CGO_CFLAGS with that one warning off; every other build keeps the
# compiler's defaults and all of its output.
PROBE        := ./cmd/warmfleet-gpu-probe
PROBE_CFLAGS := $(shell $(GO) env CGO_CFLAGS) -Wno-deprecated-declarations

build:
	$(GO) build -o $(BIN)/ $$($(GO) list ./cmd/... | grep -v '/cmd/warmfleet-gpu-probe$$')
	CGO_CFLAGS='$(PROBE_CFLAGS)' $(GO) build -o $(BIN)/ $(PROBE)

# quietbuild fails when building the probe as `build` does prints anything.
# A warm build cache replays no C compiler output, so a define of its own
# each time makes the probe's C (go-nvml's included) compile again.
quietbuild:
	@out=$$(CGO_CFLAGS='$(PROBE_CFLAGS) -DWARMFLEET_QUIETBUILD='$$(date +%s%N) $(GO) build -o /dev/null $(PROBE) 2>&1); \
	if [ -n "$$out" ]; then printf '%s\n' "$$out" >&2; echo "quietbuild: building $(PROBE) printed the above; the build must print nothing but errors" >&2; exit 1; fi

# deps installs the system packages the agent and the tests use: containerd,
# runc, a static busybox to build test images from (no registry is
# reachable from CI, so images are built locally), the CNI plugins and
# iptables that give Runs their bridge network (its masquerade rules), and
# docker-registry, the real registry tests push to and pull from on loopback.
deps:
	@missing=""; \
	for p in containerd runc busybox-static containernetworking-plugins iptables docker-registry; do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

# natscli installs the nats CLI with `go install` (into $(go env GOBIN), or
# $(go env GOPATH)/bin, where the test also looks) unless one is already on
# PATH or there.
natscli:
	@gobin="$$($(GO) env GOBIN)"; gopath="$$($(GO) env GOPATH)"; \
	if command -v nats >/dev/null 2>&1; then :; \
	elif [ -n "$$gobin" ] && [ -x "$$gobin/nats" ]; then :; \
	elif [ -z "$$gobin" ] && [ -x "$${gopath%%:*}/bin/nats" ]; then :; \
	else \
		echo "installing the nats CLI: $(GO) install $(NATS_CLI)"; \
		$(GO) install $(NATS_CLI); \
	fi

run: deps build
	./scripts/run-local.sh

# The packages that compile go-nvml's C get PROBE_CFLAGS too, so a cold
# cache's vet and test print no warning of go-nvml's either; every other
# package is vetted and tested with the compiler's defaults.
NVML_PKGS  := ./adapters/nvml/... $(PROBE)/...
PLAIN_PKGS  = $$($(GO) list $(PKGS) | grep -v -e '/adapters/nvml$$' -e '/cmd/warmfleet-gpu-probe$$')
# SERIAL_DIRS are the packages whose tests start a containerd, a registry
# or a bridge, or build a binary: found from the calls, so none is missed.
SERIAL_DIRS = $$(grep -rlE --include='*_test.go' '(StartContainerd|StartRegistry|NewBridge|BuildCommand|BuildGPUProbe)\(' . | xargs -n1 dirname | sort -u)

test: deps natscli quietbuild
	CGO_CFLAGS='$(PROBE_CFLAGS)' $(GO) vet $(NVML_PKGS)
	$(GO) vet $(PLAIN_PKGS)
	@test -z "$$(gofmt -l . | tee /dev/stderr)" || (echo "gofmt: files above need formatting" && exit 1)
	CGO_CFLAGS='$(PROBE_CFLAGS)' $(GO) test -race -p 1 -timeout 5m $(NVML_PKGS)
	# Two packages at a time (-p 2, compiling too), except the suites that
	# start containerd daemons, registries, bridges and network namespaces
	# or build binaries: on a 2-core machine two of those at once starve
	# each other's timing, so they run one at a time, last.
	@serial="$$($(GO) list $(SERIAL_DIRS))"; \
	echo "go test -race -p 2: every package but these, then -p 1:" $$serial; \
	$(GO) test -race -p 2 -timeout 20m $$(echo "$(PLAIN_PKGS)" | tr ' ' '\n' | grep -vxF "$$serial") && \
	$(GO) test -race -p 1 -timeout 30m $$serial

fuzz:
	./scripts/fuzz.sh 30s

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

clean:
	rm -rf $(BIN) $(DATA)
