# converge csi-node image: the node plugin, and converge-controller (the
# cluster-side controller, run by deploy/controller.yaml with this image),
# for linux/amd64 and linux/arm64. For this machine's platform:
#   docker build -t <registry>/csi-node:<tag> --build-arg VERSION=<tag> .
# For both, as one multi-arch image pushed to the registry (a buildx builder
# of the docker-container driver, or Docker's containerd image store):
#   docker buildx build --platform linux/amd64,linux/arm64 -t <registry>/csi-node:<tag> --build-arg VERSION=<tag> --push .
# The binaries are cross-compiled, but the final stage's RUN apt-get runs
# as the target platform: for the one that is not the builder's own,
# BuildKit runs it under QEMU, which needs the kernel's binfmt handlers
# ("exec format error" without them). Install them once per boot:
#   docker run --privileged --rm tonistiigi/binfmt --install arm64
# (--install amd64 on an arm64 machine; docker/setup-qemu-action in CI).
# test/dockerfile builds the binaries for both platforms as the build stage
# does and checks them.

# Build stage: static binaries, built as an unprivileged user on the
# builder's own platform and cross-compiled for the target's (no emulation
# here; the final stage's RUN is emulated, see above).
FROM --platform=$BUILDPLATFORM golang:1.26-bookworm AS build
RUN useradd --create-home --uid 10001 builder
USER builder
WORKDIR /home/builder/src
COPY --chown=builder go.mod go.sum ./
RUN go mod download
COPY --chown=builder cmd ./cmd
COPY --chown=builder pkg ./pkg
# Declared after the module download, which is the same for every target.
ARG TARGETOS TARGETARCH
ARG VERSION=v0.2.0-dev
# grpcnotrace: converge never turns on gRPC's tracing, and without the tag
# gRPC links golang.org/x/net/trace and with it text/template, whose
# method lookups keep every exported method of every type alive:
# converge-controller, which links gRPC only through the CSI types of
# pkg/contract, would be 60 MB rather than 32.
RUN GOOS=${TARGETOS} GOARCH=${TARGETARCH} CGO_ENABLED=0 go build -trimpath -tags grpcnotrace -ldflags "-s -w -X main.version=${VERSION}" -o /home/builder/csi-node ./cmd/csi-node
RUN GOOS=${TARGETOS} GOARCH=${TARGETARCH} CGO_ENABLED=0 go build -trimpath -tags grpcnotrace -ldflags "-s -w -X main.version=${VERSION}" -o /home/builder/converge-controller ./cmd/converge-controller

# Final stage: the binary and exactly the OS tools it executes (mount-utils
# runs mount, umount, blkid, blockdev, fsck, mkfs.* and the resize tools;
# converge runs e2fsck and resize2fs). test/image checks this list against
# the code. Its base is the target platform's, and its RUN runs as that
# platform (under QEMU when it is not the builder's).
FROM debian:bookworm-slim
ARG VERSION=v0.2.0-dev
LABEL org.opencontainers.image.title="converge csi-node" \
      org.opencontainers.image.description="CSI node plugin with a kubelet-style reconciler: loop-device volumes, node-local" \
      org.opencontainers.image.source="https://github.com/converge-csi/converge" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"
RUN apt-get update \
 && apt-get install -y --no-install-recommends e2fsprogs xfsprogs btrfs-progs util-linux mount \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /home/builder/csi-node /usr/local/bin/csi-node
COPY --from=build /home/builder/converge-controller /usr/local/bin/converge-controller
# csi-node needs root (privileged in the DaemonSet): it attaches loop
# devices and mounts.
ENTRYPOINT ["/usr/local/bin/csi-node"]
