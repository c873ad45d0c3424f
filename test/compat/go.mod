// Module compat is a CSI client of the oldest spec and csi-lib-utils
// releases converge supports (see doc.go); it never imports converge.
module github.com/converge-csi/converge/test/compat

go 1.26.0

require (
	github.com/container-storage-interface/spec v1.11.0
	github.com/kubernetes-csi/csi-lib-utils v0.20.0
	golang.org/x/sys v0.28.0
	google.golang.org/grpc v1.69.0
	google.golang.org/protobuf v1.36.0
)

require (
	golang.org/x/net v0.32.0 // indirect
	golang.org/x/text v0.21.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20241216192217-9240e9c98484 // indirect
)
