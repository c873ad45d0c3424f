# converge: the first two targets are the quick start (see README.md).
GO       ?= go
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
LDFLAGS  := -X main.version=$(VERSION)
RUN_DIR  ?= $(CURDIR)/.run
SOCKET   := $(RUN_DIR)/csi.sock
# TEST_TIMEOUT bounds the test binaries of compat and chart (hack/test.sh
# sets it past its own bound of their step).
TEST_TIMEOUT ?= 5m

.PHONY: run test build deps unit vet vet-core vet-e2e sanity compat chart chart-docs manifests fuzz bench compare soak e2e conformance crossbuild release clean

# FUZZTIME bounds each fuzz target in make test. It is a count of runs, not
# a duration: with a duration, Go 1.26's fuzz coordinator can fail a target
# with a bare "context deadline exceeded" at the deadline (golang/go#75804).
# Run longer with e.g. make fuzz FUZZTIME=2000000x.
FUZZTIME ?= 5000x
FUZZ_TARGETS := pkg/contract:FuzzValidID pkg/host:FuzzBeneath pkg/state:FuzzScanLog \
	pkg/contract:FuzzCheckMountFlags pkg/contract/capability:FuzzParse pkg/contract:FuzzCheckMkfsOptions \
	pkg/contract:FuzzParseIOLimits pkg/devices:FuzzUnescapeOctal pkg/devices:FuzzReadMounts pkg/devices:FuzzPathsOpen \
	pkg/devices:FuzzParseV1Throttle pkg/devices:FuzzParseIOMax

## run: build and serve on a local socket with a local state directory
run: deps build
	@mkdir -p $(RUN_DIR)/pods
	@echo "converge: serving on unix://$(SOCKET) (state in $(RUN_DIR)); Ctrl-C stops, mounts stay."
	@echo "Call it, e.g. with csi-sanity from another shell:"
	@echo "  $(GO) run github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity --csi.endpoint=unix://$(SOCKET) \\"
	@echo "    --csi.mountdir=$(RUN_DIR)/pods/target --csi.stagingdir=$(RUN_DIR)/pods/staging --csi.testvolumesize=67108864"
	bin/csi-node --endpoint unix://$(SOCKET) --state-dir $(RUN_DIR)/state \
		--kubelet-dir $(RUN_DIR)/kubelet --allowed-path-prefix $(RUN_DIR)/pods -v 2

## test: install OS packages, then vet, unit tests, integration tests, csi-sanity, a short fuzz of each target, the real-kubelet suite and the upstream External Storage tests that run in parallel,
## as steps of hack/test.sh: each under a bound of its own, the e2e build (every tool the cluster runs, cached
## in ~/.cache/converge-e2e) beside the others; a table of each step's wall time at the end (docs/testing.md)
test:
	@RUN_DIR=$(RUN_DIR) GO=$(GO) ./hack/test.sh

## e2e: a single-node cluster (kubelet, apiserver, controller-manager, scheduler v1.37.2, etcd, containerd)
## on 127.0.0.1 with csi-node as its CSI driver, and real pods on it; then the Kubernetes storage
## suite's External Storage tests that need neither serial execution nor a disruption (STORAGE_SUITE=
## leaves them out). Its build step builds Kubernetes and the rest into the user's cache directory
## once; later runs bring the cluster up in seconds. The suite's JUnit report is
## $(RUN_DIR)/storage-junit.xml.
STORAGE_SUITE ?= parallel
e2e:
	@RUN_DIR=$(RUN_DIR) GO=$(GO) STORAGE_SUITE=$(STORAGE_SUITE) ./hack/test.sh e2e

## conformance: every applicable External Storage test of the Kubernetes v1.37.2 storage suite
## (test/e2e/storage: converge.yaml says what converge claims, skip.txt what cannot run here or
## what converge does not support, and why), [Serial] and [Disruptive] ones included, on the e2e cluster; the JUnit report is
## $(RUN_DIR)/storage-junit.xml.
conformance: deps
	@./hack/install-deps.sh e2e
	@mkdir -p $(RUN_DIR)
	cd test/e2e && $(GO) test -count=1 -v -timeout 180m -run 'TestConcurrent/TestExternalStorage' . \
		-args -storage-suite=all -storage-report=$(RUN_DIR)/storage-junit.xml

## bench: the benchmarks of docs/performance.md (real devices; about 12 minutes; not part of make test)
bench: deps
	@./hack/install-deps.sh bench
	$(GO) test -run '^$$' -bench 'BenchmarkPass' -benchtime 20x ./pkg/reconciler
	$(GO) test -run '^$$' -bench 'BenchmarkSnapshotCopy' -benchtime 5x ./pkg/devices
	$(GO) test -run '^$$' -bench 'BenchmarkObserveOwnDevices|BenchmarkObserveVolume' -benchtime 200x ./pkg/devices
	$(GO) test -run '^$$' -bench . -benchtime 1x -timeout 30m ./test/bench

## compare: issue 72's comparison on the e2e cluster (test/e2e/compare.go; a benchmark, not part of make test, which runs it
## at 3 pods as a smoke test): pods with an emptyDir, converge thin and thick, local-path-provisioner, COMPARE_N pods of each
## made at once, COMPARE_ROUNDS rounds alternating the ways (COMPARE_WAYS, all four by default), on one node, two or both
## (COMPARE_SPREAD), kube-controller-manager at its default API rate limit or COMPARE_KCM_QPS; the table and the
## breakdown of each way's time to Ready are in the
## output, the rounds and the summary in $(RUN_DIR)/compare.json (docs/performance.md)
COMPARE_N      ?= 1,30,100
COMPARE_ROUNDS ?= 5
COMPARE_SPREAD ?= one
COMPARE_WAYS   ?= emptydir,converge-thin,converge-thick,local-path
COMPARE_KCM_QPS ?= 0
compare: deps
	@./hack/install-deps.sh e2e
	@mkdir -p $(RUN_DIR)
	cd test/e2e && $(GO) test -count=1 -v -timeout 180m -run '^TestConcurrent$$/^TestCompare$$' . \
		-args -compare -compare-n=$(COMPARE_N) -compare-rounds=$(COMPARE_ROUNDS) -compare-spread=$(COMPARE_SPREAD) -compare-ways=$(COMPARE_WAYS) \
		-controller-manager-qps=$(COMPARE_KCM_QPS) \
		-compare-out=$(RUN_DIR)/compare.json

## soak: issue 71's soak on the e2e cluster (test/e2e/soak_test.go): claims of several kinds and groups of claims on two
## nodes written by pods that append checksummed records, made, grown, snapshotted (alone and as groups), restored, cloned
## and deleted while csi-node (its failpoint build), its sidecars, converge-controller, the kubelets and the API server are
## killed, stopped, restarted, failpoints armed, nodes rebooted and pools filled, for SOAK_FOR, at the times the seed
## SOAK_SEED draws (0: a random one, printed, which replays the soak; full: the seed whose 2-minute plan holds every kind
## of event; seeds joined by + run their plans at once; a comma-separated list runs one soak after another);
## then every acknowledged record is checked on its volume, the nodes' stores, pools and the API must agree, no alert of the
## chart may fire, and the cluster is taken down to nothing. The plan, history and alerts (and on a failure the nodes' logs
## and stores) are in $(RUN_DIR)/soak (docs/testing.md#the-soak)
SOAK_FOR  ?= 30m
SOAK_SEED ?= 0
soak: deps
	@./hack/install-deps.sh e2e
	@mkdir -p $(RUN_DIR)
	cd test/e2e && $(GO) test -count=1 -v -timeout 240m -run '^TestSoak$$' . \
		-args -invariants -soak=$(SOAK_FOR) -soak-seed=$(SOAK_SEED) -soak-out=$(RUN_DIR)/soak

## release: the files of a release of this checkout, of the version the chart says, in $(RUN_DIR)/release (made anew):
## for each platform of PLATFORMS (this machine's by default; another needs its emulator, see docs/releasing.md),
## csi-node's image (converge-controller inside) as an OCI archive named as deploy/ and the chart name it, an SBOM
## of each binary (CycloneDX), the packaged chart, and SHA256SUMS; .github/workflows/release.yml publishes them
PLATFORMS ?= $(shell $(GO) env GOOS)/$(shell $(GO) env GOARCH)
release: deps
	@./hack/install-deps.sh release
	rm -rf $(RUN_DIR)/release
	cd test/e2e && $(GO) run ./cmd/converge-release -repo $(CURDIR) -out $(RUN_DIR)/release -platforms $(PLATFORMS)

## crossbuild: the Dockerfile's build stage for every platform of its multi-arch build, linux/arm64 too
## (test/dockerfile; make test builds this machine's platform alone: a cold arm64 build takes minutes)
crossbuild:
	CONVERGE_CROSSBUILD=1 $(GO) test -count=1 -timeout 30m -run 'TestBuildStageBuildsEachPlatform' -v ./test/dockerfile

## compat: every RPC of csi-node with default flags (and a 5% pool guard) through a client built as the oldest peers it
## supports are (CSI spec v1.11.0, csi-lib-utils v0.20.0: csi-provisioner v5.2, csi-resizer v1.13);
## test/compat is a module of its own
compat:
	cd test/compat && $(GO) test -count=1 -timeout $(TEST_TIMEOUT) ./...

## chart: the Helm chart (charts/converge) without a cluster, through the Helm SDK (in the e2e module,
## the only one that may import it): its lint, its schema, the values it honours, and deploy/ as
## make manifests generates it from the chart (test/e2e/chart)
chart:
	cd test/e2e && $(GO) vet ./chart && $(GO) test -count=1 -timeout $(TEST_TIMEOUT) ./chart

## manifests: generate deploy/'s object files from the Helm chart, the one source of what converge installs
## (test/e2e/cmd/converge-manifests): the base with every component off, each component's objects and its
## patches of the base's; deploy/'s kustomization.yaml files are written by hand and must list exactly the
## generated files beside them. make chart fails while deploy/ is not what this generates
manifests:
	cd test/e2e && $(GO) run ./cmd/converge-manifests -repo $(CURDIR)

## chart-docs: generate charts/converge/README.md from its values.yaml's "# --" comments and README.md.gotmpl
## with helm-docs; make chart fails while the README is not what this generates (test/e2e/chart reads
## HELM_DOCS and HELM_DOCS_ARGS from here, each on one line, and runs this recipe's command). go run pkg@version
## asks the proxy for the module's latest version (its deprecation) even with the pinned one in the module cache:
## the cache as the first proxy, then GOPROXY's ("|": after any error), lets it run offline
HELM_DOCS      := github.com/norwoodj/helm-docs/cmd/helm-docs@v1.14.2
HELM_DOCS_ARGS := --chart-search-root=charts/converge --template-files=README.md.gotmpl --sort-values-order=file --log-level=warning
chart-docs:
	GOPROXY="file://$$($(GO) env GOMODCACHE)/cache/download|$$($(GO) env GOPROXY)" $(GO) run $(HELM_DOCS) $(HELM_DOCS_ARGS)

## fuzz: run every fuzz target for FUZZTIME; crashers land in the package's testdata/fuzz
fuzz:
	@for t in $(FUZZ_TARGETS); do \
		echo "fuzz $${t#*:} ($(FUZZTIME))"; \
		$(GO) test -run '^$$' -fuzz "^$${t#*:}\$$" -fuzztime $(FUZZTIME) ./$${t%%:*} >$(RUN_DIR).fuzz.log 2>&1 || \
			{ cat $(RUN_DIR).fuzz.log; exit 1; }; \
	done; rm -f $(RUN_DIR).fuzz.log

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/csi-node ./cmd/csi-node

deps:
	@./hack/install-deps.sh

# ACTIONLINT checks the workflows in .github/workflows (and their run:
# scripts, with shellcheck, which hack/install-deps.sh installs); the
# module cache goes first as the proxy so that it runs offline (chart-docs).
ACTIONLINT := github.com/rhysd/actionlint/cmd/actionlint@v1.7.12

## vet: gofmt and go vet of every module, actionlint of the workflows. hack/test.sh splits it by what each lane compiles anyway (two
## processes compiling the same packages at once each do all the work): vet-core in the Go lane,
## vet-e2e after the e2e build, the chart package (the Helm SDK) with make chart.
vet: vet-core vet-e2e
	cd test/e2e && $(GO) vet ./chart

vet-core:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }
	$(GO) vet ./...
	cd test/compat && $(GO) vet ./...
	GOPROXY="file://$$($(GO) env GOMODCACHE)/cache/download|$$($(GO) env GOPROXY)" $(GO) run $(ACTIONLINT) -no-color

vet-e2e:
	cd test/e2e && $(GO) vet $$($(GO) list ./... | grep -v '/test/e2e/chart$$')

unit:
	$(GO) test -count=1 -tags lockorder ./pkg/...

sanity: deps
	$(GO) test -count=1 -v ./test/sanity/

clean:
	rm -rf bin $(RUN_DIR)
