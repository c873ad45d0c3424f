// Package nodeserver serves the CSI Node service. A mutating RPC validates
// its request (InvalidArgument before any lookup), records the intent a
// named request transition of the state package makes (Volume.RequestStage
// and its kin) in one durable transaction, kicks the reconciler and waits
// until the reconciler reports the intent fulfilled, rolled back, or
// superseded, or until the request's deadline. It never touches a device
// or a mount, and decides no volume's condition: it reads the one the
// reconciler decided.
//
// Handlers return classified errors (classified.Error); the driver's
// interceptor turns them into gRPC codes (pkg/rpcerr), for every service
// alike.
package nodeserver
